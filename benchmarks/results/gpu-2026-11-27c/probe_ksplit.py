"""``mla_sm90_ksplit`` (the two warpgroups on one tile at a time, the scores split by columns
between them and added through shared memory, the values by latent columns) against the narrow
kernel as planned and ``mla_sm90_pair`` forced, on 32-row programs (2 tokens x 16 heads, 4 x 8).
The variants run through the package's planning with ``mla._pair`` answering yes wherever the
pair kernel takes the call ("pair", "ksplit"; "ksplit" with the pair kernel swapped for
``mla_sm90_ksplit``'s, ``ksplit_plugin.load``). One process, CUDA-graph replays (p50 us;
benchmarks/_harness.py), alternated for PROBE_ROUNDS rounds, each output checked against a float32
gather-einsum (after a run into a NaN-filled output).

    python3 probe_ksplit.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,..., PROBE_VARIANTS=narrow,pair,ksplit
"""
import os
import sys
from dataclasses import replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [HERE, BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import ksplit_plugin  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90, mla_sm90_pair  # noqa: E402


def main():
    device = torch.device("cuda")
    pair_kernel = mla_sm90_pair._mla_pair_kernel
    ksplit_kernel = ksplit_plugin.load()._mla_ksplit_kernel
    mla_sm90_pair._mla_pair_kernel = pair_kernel
    planned_pair = tmla._pair

    def forced(ql, qr, kv, block_q, *args):
        return mla_sm90_pair.declines(ql, qr, kv, block_q) is None

    variants = {"narrow": (planned_pair, pair_kernel), "pair": (forced, pair_kernel), "ksplit": (forced, ksplit_kernel)}
    wanted = os.environ.get("PROBE_VARIANTS")
    variants = {k: v for k, v in variants.items() if not wanted or k in wanted.split(",")}
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128), by["mtp4_B32_ctx4096_H16"],
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16),
              replace(m, name="mtp2_B8_ctx4000_H16", batch=8, seq_len=4000)]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "3"))):
            for name, (plan_pair, kernel) in variants.items():
                tmla._pair = plan_pair
                mla_sm90_pair._mla_pair_kernel = kernel
                mla_sm90._LAUNCHERS.clear()
                lowering._CHOICES.clear()
                plans = []
                prepare = mla_sm90.prepare
                mla_sm90.prepare = lambda **k: plans.append(k) or prepare(**k)

                def make(x):
                    out = torch.empty_like(x.q_latent)
                    lse = torch.empty(x.q_latent.shape[:2], device=device)

                    def run():
                        tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                                        max_query_len=s.q_len)
                        return out
                    return run

                fns = [make(x) for x in copies]
                fns[0]().fill_(float("nan"))
                got = fns[0]().float()
                mla_sm90.prepare = prepare
                err = ((got - want).abs().max() / want.abs().max()).item()
                p = plans[-1] if plans else {}
                what = (f"block_q {p.get('block_q')} pair {p.get('pair')} splits "
                        f"{p['workspace'].shapes[0][1] if p.get('workspace') else 1}")
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:6s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}  {what}", flush=True)
    tmla._pair = planned_pair
    mla_sm90_pair._mla_pair_kernel = pair_kernel


if __name__ == "__main__":
    main()
