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

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402


def main():
    device = torch.device("cuda")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B128_ctx4096_H16", batch=128), by["B128_ctx4096_H16"],
              replace(by["B128_ctx4096_H16"], name="B64_ctx4096_H16", batch=64)]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        x = md.make_inputs(s, device, 0)
        want = md.gather_einsum_call(s, x, torch.float32)
        out = torch.empty_like(x.q_latent)
        lse = torch.empty(x.q_latent.shape[:2], device=device)

        def run():
            tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                            max_query_len=s.q_len)
            return out
        got = run().float()
        torch.cuda.synchronize()
        err = ((got - want).abs().max() / want.abs().max()).item()
        line = f"{s.name:24s} max rel err {err:.2e}"
        if os.environ.get("PROBE_TIME"):
            t = H.bench([run], device, use_graph=True)
            line += f"  graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
