"""Why an eager chunked-prefill call runs longer than its CUDA-graph replay (issue 17's eager row).

    python3 eager_probe.py [SHAPE ...]

For each shape of benchmarks/paged_attention.py (default: chunked prefill and prefill) and the
`triton` backend (the Gluon prefill kernel), CUDA-event times of one call, p50 of 30 over the
rotated input copies, in four settings:
  graph      CUDA-graph replays (the benchmark's graph figure)
  eager      L2 flushed (256 MiB memset) before each call, host issuing as it goes (the
             benchmark's eager figure)
  queued     the same, but every call queued behind a long sleep kernel first, so the host is
             never behind the GPU: eager minus queued is the host's share
  no-flush   eager without the memset
the host time of one call (perf_counter over 20 calls issued behind a sleep kernel), where that
time goes (cProfile, 20 calls), and the kernels one call launches (torch.profiler).
"""
import cProfile
import pstats
import time
import math
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import paged_attention as pa  # noqa: E402


def times(fns, flush, queued=False, n=30, every=None):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    if queued:
        torch.cuda._sleep(200_000_000)  # ~0.1 s: every call below is queued before the GPU reaches it
    for i in range(n):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    got = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    if every is not None:
        every.extend(got)
    return statistics.median(got)


def main():
    names = sys.argv[1:] or ["chunked_prefill_B4_q512_ctx4096", "prefill_B4_q2048"]
    device = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    for s in pa.SHAPES:
        if s.name not in names:
            continue
        per = sum(t.numel() * t.element_size() for t in pa.paged_inputs(s, device, 0).args())
        copies = [pa.paged_inputs(s, device, i) for i in range(H.rotations(per, device))]
        c = pa.ours(s, copies)
        for f in c.fns:
            f()
        g = H.bench(c.fns, device, use_graph=True).p50_us
        every = []
        row = dict(graph=g, eager=times(c.fns, flush, every=every), queued=times(c.fns, flush, queued=True),
                   no_flush=times(c.fns, None))
        print("eager, each call in order:", " ".join(f"{x:.0f}" for x in every))
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        for i in range(20):
            c.fns[i % len(c.fns)]()
        row["host"] = (time.perf_counter() - t0) * 1e6 / 20
        print(f"{s.name}: " + "  ".join(f"{k} {v:.1f}" for k, v in row.items()) + f"  ({c.note})")
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(20):
            c.fns[i % len(c.fns)]()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                flush.zero_()
                c.fns[i % len(c.fns)]()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
