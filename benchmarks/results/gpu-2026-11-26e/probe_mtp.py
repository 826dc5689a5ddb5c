"""2 query tokens a sequence of 16 heads (32 rows a program) on the two kernels that can take
them: the narrow kernel (``mla.SM90_PAIRED`` off: two warpgroups on the same tile, 16 rows each)
and ``mla_sm90_fp8``'s schedule (on: two warpgroups on alternate tiles, 32 rows each, a producer
warp). CUDA-graph replays (p50 us; benchmarks/_harness.py), one process, each output checked
against a float32 gather-einsum first.

    python3 probe_mtp.py        # PROBE_ROUNDS=2

Runs on the tree of commit 86e8123, which had ``mla.SM90_PAIRED`` (reverted after this probe:
logs/probe-mtp.txt).
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


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by_name = {s.name: s for s in md.SHAPES}
    m0 = by_name["mtp2_B64_ctx4096_H16"]
    shapes = [m0, replace(m0, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m0, name="mtp2_B128_ctx4096_H16", batch=128)]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name, paired in (("narrow", False), ("paired", True)):
                tmla.SM90_PAIRED = paired
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
                print(f"{s.name:26s} round {rnd} {name:6s} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    tmla.SM90_PAIRED = True


if __name__ == "__main__":
    main()
