"""Where mla._narrow_query_block puts speculative tokens in 16-row programs (32-row programs would
split at least 8 ways), measured before against the narrow kernel's 32-row programs: does that
still hold where 32-row programs now run mla_sm90_pair (block sizes under 64)? The plan as it is
(``rule``) against 32-row programs forced (``rows32``: ``_SHORT_SPLITS`` out of reach), one
process. CUDA-graph replays (p50 us; benchmarks/_harness.py), each output checked against a
float32 gather-einsum first.

    python3 probe_rule16.py   # PROBE_ROUNDS=2
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

_SHORT = tmla._SHORT_SPLITS


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    m0 = replace({s.name: s for s in md.SHAPES}["mtp2_B64_ctx4096_H16"], block_size=16)
    shapes = [replace(m0, name="mtp2_B16_ctx4096_bs16", batch=16),
              replace(m0, name="mtp2_B8_ctx4096_bs16", batch=8),
              replace(m0, name="mtp2_B1_ctx32768_bs16", batch=1, seq_len=32768),
              replace(m0, name="mtp2_B4_ctx16384_bs16", batch=4, seq_len=16384),
              replace(m0, name="mtp2_B16_ctx8192_bs16", batch=16, seq_len=8192),
              replace(m0, name="mtp2_B24_ctx4096_bs16", batch=24)]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name in ("rule", "rows32"):
                tmla._SHORT_SPLITS = _SHORT if name == "rule" else 1 << 30
                wide._LAUNCHERS.clear()
                lowering._CHOICES.clear()

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
                pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
                print(f"{s.name:24s} round {rnd} {name:6s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    tmla._SHORT_SPLITS = _SHORT


if __name__ == "__main__":
    main()
