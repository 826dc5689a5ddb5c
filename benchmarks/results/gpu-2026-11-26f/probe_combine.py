"""The combine kernel's blocking after the narrow Gluon MLA kernel's split-KV (2 query tokens
B64 x 4096 H16: 128 tokens x 16 heads x 2 splits of 512 columns; B32 x 8192 H16: 32 x 16 x 4),
whole-op CUDA-graph replays (p50 us), one process, each output checked against a float32
gather-einsum: ``mla._combine_blocking`` replaced by each candidate ``(BLOCK_H, DV_BLOCK,
LOAD_SPLITS, num_warps)``, with programmatic dependent launch on (default) and off.

    python3 probe_combine.py     # PROBE_ROUNDS=2
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
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90 as wide  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402

_BLOCKING = tmla._combine_blocking
# (BLOCK_H, DV_BLOCK, LOAD_SPLITS, num_warps); None: the default
CANDIDATES = (None, (1, 512, 4, 2), (1, 512, 4, 8), (2, 512, 4, 4), (2, 512, 4, 8), (4, 512, 4, 8),
              (8, 512, 4, 8), (16, 512, 4, 8), (1, 256, 4, 2), (1, 128, 4, 1))


def blocking(candidate):
    if candidate is None:
        return _BLOCKING
    block_h, dv_block, load_splits, warps = candidate

    def fixed(num_tokens, num_heads, dv_pad, num_splits, device):
        grid = (num_tokens, -(-num_heads // block_h), dv_pad // dv_block)
        return grid, dict(BLOCK_H=block_h, DV_BLOCK=dv_block, LOAD_SPLITS=load_splits, num_warps=warps)
    return fixed


def main():
    device = torch.device("cuda")
    by_name = {s.name: s for s in md.SHAPES}
    m0 = by_name["mtp2_B64_ctx4096_H16"]
    shapes = [m0, by_name["B32_ctx8192_H16"]]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for pdl in (True, False):
                for cand in CANDIDATES if pdl else (None,):
                    tmla._combine_blocking = blocking(cand)
                    tpa._PDL = pdl
                    wide._LAUNCHERS.clear()
                    lowering._CHOICES.clear()

                    def make(x):
                        out = torch.empty_like(x.q_latent)
                        lse = torch.empty(x.q_latent.shape[:2], device=device)
                        plan = tmla.prepare_mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True,
                                                       kv_scale=x.kv_scale, max_query_len=s.q_len)
                        opts = {"kv_scale": x.kv_scale}

                        def run():
                            plan(*x.args(), out, lse, opts)
                            return out
                        return run

                    fns = [make(x) for x in copies]
                    got = fns[0]().float()
                    err = ((got - want).abs().max() / want.abs().max()).item()
                    t = H.bench(fns, device, use_graph=True)
                    name = f"{'pdl' if pdl else 'no-pdl'} {cand or 'default'}"
                    print(f"{s.name:22s} round {rnd} {name:28s} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                          f"  max rel err {err:.2e}", flush=True)
    tmla._combine_blocking = _BLOCKING
    tpa._PDL = True


if __name__ == "__main__":
    main()
