"""The wide Gluon MLA kernel's combine launched with programmatic dependent launch (the kernel now
signals after its key loop) against without, CUDA-graph replays (p50 us; benchmarks/_harness.py),
two rounds in one process:

    python3 pdl_probe.py

128-head shapes that split (B1 x 32768, B4 x 16384) and the 16-head B32 x 8192 (narrow kernel)."""
import os
import sys
from dataclasses import replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402


def main():
    device = torch.device("cuda")
    by_name = {s.name: s for s in md.SHAPES}
    b1 = by_name["B1_ctx32768_H128"]
    shapes = [b1, replace(b1, name="B4_ctx16384_H128", batch=4, seq_len=16384), by_name["B32_ctx8192_H16"]]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        for rnd in range(2):
            for pdl in (True, False):
                tpa._PDL = pdl
                lowering._CHOICES.clear()

                def make(x):
                    out = torch.empty_like(x.q_latent)
                    lse = torch.empty(x.q_latent.shape[:2], device=device)
                    return lambda: tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True,
                                                   kv_scale=None)

                t = H.bench([make(x) for x in copies], device, use_graph=True)
                print(f"{s.name:20s} round {rnd} pdl={pdl!s:5s} {t.p50_us:8.2f} us", flush=True)
        tpa._PDL = True


if __name__ == "__main__":
    main()
