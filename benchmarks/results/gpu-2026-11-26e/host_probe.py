"""Where the host time of an eager ``paged_attention`` call goes on a GPU host: the pieces of
its repeated-call path timed alone, the way ``benchmarks/overhead.py`` times whole calls ("host":
perf_counter over 100 calls issued behind a sleep kernel, nothing waiting on the device; "events":
CUDA events around 1000 back-to-back calls), then cProfile of 3000 calls. logs/host-probe.txt and
host-probe-2.txt come from the probe before its ``lse.new()`` and ``torch.empty(0, device=)``
pieces (logs/host-probe-3.txt has them).

    python3 host_probe.py
"""
import cProfile
import io
import math
import os
import pstats
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import overhead as O  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402


def main():
    device = torch.device("cuda")
    dt, Hq, Hkv, D, BS = torch.bfloat16, 32, 8, 128, 16
    q = torch.randn(1, Hq, D, device=device, dtype=dt)
    kc, vc = (torch.randn(2, BS, Hkv, D, device=device, dtype=dt) for _ in range(2))
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    table, lens, qsl = i32([0]), i32(BS), i32(0, 1)
    out, lse = torch.empty(1, Hq, D, device=device, dtype=dt), torch.empty(1, Hq, device=device)
    lse0 = torch.empty(0, device=device)
    scale = 1.0 / math.sqrt(D)
    null = O.null_kernel(cached=True)
    pieces = {
        "null kernel, cached launch": null,
        "q.new_empty(1, 32, 128)": lambda: q.new_empty(1, Hq, D),
        "lse.new_empty(0)": lambda: lse0.new_empty(0),
        "lse.new()": lambda: lse0.new(),
        "torch.empty(0, device=)": lambda: torch.empty(0, device=device),
        "both allocations": lambda: (q.new_empty(1, Hq, D), lse0.new_empty(0)),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "paged_attention_out": lambda: tpa.paged_attention_out(q, kc, vc, table, lens, qsl, out, lse, scale=scale,
                                                               max_query_len=1),
        "paged_attention": lambda: tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1),
        "paged_attention, return_lse": lambda: tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale,
                                                                   max_query_len=1, return_lse=True),
        "paged_attention, result kept": None,
    }
    kept = []

    def keep():
        kept.append(tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1))
        if len(kept) > 4:
            kept.pop(0)
    pieces["paged_attention, result kept"] = keep
    print(f"{'piece':36s} {'call us':>8s} {'host us':>8s} {'events us':>9s} {'wall us':>8s}")
    for rnd in range(2):
        for name, fn in pieces.items():
            r = O.measure(fn, device, 1000, 5)
            print(f"{name:36s} {r['call_us']:8.1f} {r['host_us']:8.1f} {r['events_us']:9.1f} {r['wall_us']:8.1f}",
                  flush=True)
    prof = cProfile.Profile()
    fn = pieces["paged_attention"]
    prof.enable()
    for _ in range(3000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


if __name__ == "__main__":
    main()
