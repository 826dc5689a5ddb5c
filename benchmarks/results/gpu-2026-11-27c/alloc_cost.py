"""What ``paged_attention``'s two output allocations cost on the host, against the rest of its
eager call: each allocation alone, both, and ``paged_attention_out`` with and without them, on
``overhead.py``'s one-token decode inputs, measured by ``overhead.measure`` (perf_counter of a
call with the GPU idle, perf_counter of 100 calls behind a sleep kernel, CUDA events over
``--calls`` calls; medians of 5 repetitions).

    python3 alloc_cost.py [--calls 1000]
"""
import argparse
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import overhead  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    device = torch.device("cuda")
    q, kc, vc, table, lens, qsl = overhead._decode_inputs(device)
    scale = 1.0 / math.sqrt(q.shape[2])
    lse_like = torch.empty(0, device=device)
    shape = tuple(q.shape)

    def out_op(out, lse):
        tpa.paged_attention_out(q, kc, vc, table, lens, qsl, out, lse, scale=scale, max_query_len=1)

    def allocating_out_op():  # paged_attention's allocations, then the _out op's call
        out, _ = q.new_empty(*shape), lse_like.new_empty(0)
        out_op(out, None)

    out = q.new_empty(*shape)
    rows = {
        "out = query.new_empty(*size)": lambda: q.new_empty(*shape),
        "torch.empty(size, dtype, device)": lambda: torch.empty(shape, dtype=q.dtype, device=device),
        "lse = lse_like.new_empty(0)": lambda: lse_like.new_empty(0),
        "both allocations": lambda: (q.new_empty(*shape), lse_like.new_empty(0)),
        "paged_attention": lambda: tpa.paged_attention(q, kc, vc, table, lens, qsl, scale=scale, max_query_len=1),
        "paged_attention_out (no lse)": lambda: out_op(out, None),
        "both allocations + paged_attention_out (no lse)": allocating_out_op,
        "null kernel, cached launch": overhead.null_kernel(cached=True),
    }
    print(f"{'row':52s} {'call us':>9s} {'host us':>9s} {'events us':>10s}")
    for name, fn in rows.items():
        r = overhead.measure(fn, device, args.calls, 5)
        print(f"{name:52s} {r['call_us']:9.1f} {r['host_us']:9.1f} {r['events_us']:10.1f}", flush=True)


if __name__ == "__main__":
    main()
