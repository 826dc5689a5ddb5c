"""One eager call of ``mla_decode`` on each of the shapes that tell the 2-token row's cost apart,
for Nsight Compute (``run.sh ncu-mtp``): 2 tokens B64 x 4096 H16 (the table's row: 32-row narrow
programs, two splits, then the combine kernel), 2 tokens B128 x 4096 H16 (the same programs
unsplit, one wave of 128), and 1 token B64 x 4096 H16 (16-row programs, two splits). Each output
is checked against a float32 gather-einsum; with PROBE_TIME=1 each is also timed in CUDA-graph
replays (p50 us; benchmarks/_harness.py).

    python3 probe_mtp.py   # PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402


def main():
    device = torch.device("cuda")
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B128_ctx4096_H16", batch=128), by["B128_ctx4096_H16"],
              replace(by["B128_ctx4096_H16"], name="B64_ctx4096_H16", batch=64)]
    for s in P.selected(shapes, "PROBE_SHAPES"):
        x = P.md.make_inputs(s, device, 0)
        want = P.md.gather_einsum_call(s, x, torch.float32)
        run = P.runner(s, x, device)
        got = run().float()
        torch.cuda.synchronize()
        err = ((got - want).abs().max() / want.abs().max()).item()
        line = f"{s.name:24s} max rel err {err:.2e}"
        if os.environ.get("PROBE_TIME"):
            t = P.H.bench([run], device, use_graph=True)
            line += f"  graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
