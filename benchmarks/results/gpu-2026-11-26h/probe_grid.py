"""The attention kernel's decode grid in two orders, one process: "queries" (query blocks on
axis 0, as shipped) against "heads" (kv heads x head groups on axis 0: the programs resident at
once read neighbouring heads of the same pages). Every decode shape of
``benchmarks/paged_attention.py``, CUDA-graph replays (p50 us; benchmarks/_harness.py), the two
orders alternated for PROBE_ROUNDS rounds; each output checked against the benchmark's fp32
gather reference on two sequences first.

    python3 probe_grid.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import paged_attention as pab  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa_kernel  # noqa: E402


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in pab.SHAPES if s.kind == "decode" and (not wanted or s.name in wanted.split(","))]
    for s in shapes:
        nbytes, _ = pab.attention_bytes(s)
        copies = [pab.paged_inputs(s, device, i) for i in range(H.rotations(nbytes, device))]
        seqs = [0, s.batch - 1]
        want = pab.reference_rows(s, copies[0], seqs)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "3"))):
            for order in ("queries", "heads"):
                tpa_kernel._DECODE_GRID = order
                lowering._CHOICES.clear()
                c = pab.ours(s, copies)
                got = c.fns[0]().float()
                err = max(((got[i * s.q_len:(i + 1) * s.q_len] - want[i]).abs().max() / want[i].abs().max()).item()
                          for i in seqs)
                t = H.bench(c.fns, device, use_graph=True)
                pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
                print(f"{s.name:26s} round {rnd} {order:7s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    tpa_kernel._DECODE_GRID = "queries"


if __name__ == "__main__":
    main()
