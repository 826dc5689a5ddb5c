"""Graph replays (p50 us; benchmarks/_harness.py) of ``mla_decode`` on the shapes whose programs
take ``BLOCK_Q`` > 1 query tokens, each output checked against a float32 gather-einsum: one
process per tree, ``run.sh qblocks`` alternating the tree's narrow, pair and fp8 kernel modules
(main a27bacb's: the query blocks numbered as the attention kernel numbers them) with the same
after ``qblocks.patch`` (a sequence's first block numbered by its sequence, a block's splits
consecutive in launch order: ``_program_ids``, ``_program``).

    python3 probe_qblocks.py LABEL   # PROBE_SHAPES=name,...
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
    label = sys.argv[1]
    device = torch.device("cuda")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, by["mtp4_B32_ctx4096_H16"], replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16)]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)

        def make(x):
            out = torch.empty_like(x.q_latent)
            lse = torch.empty(x.q_latent.shape[:2], device=device)

            def run():
                tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                                max_query_len=s.q_len)
                return out
            return run

        fns = [make(x) for x in copies]
        got = fns[0]().float()
        err = ((got - want).abs().max() / want.abs().max()).item()
        t = H.bench(fns, device, use_graph=True)
        print(f"{s.name:28s} {label:6s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})  max rel err {err:.2e}",
              flush=True)


if __name__ == "__main__":
    main()
