"""``mla_sm90_ksplit`` (the two warpgroups on one tile at a time, the scores split by columns
between them and added through shared memory, the values by latent columns) against the narrow
kernel as planned and ``mla_sm90_pair`` forced, on 32-row programs (2 tokens x 16 heads, 4 x 8),
timed as ``mla_probe.compare`` times them. "pair" and "ksplit" run through the package's planning
with ``mla._pair`` answering yes wherever the pair kernel takes the call, "ksplit" with the pair
kernel swapped for ``mla_sm90_ksplit``'s (``ksplit_plugin.load``).

    python3 probe_ksplit.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,..., PROBE_VARIANTS=narrow,pair,ksplit
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
import ksplit_plugin  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_pair  # noqa: E402


def main():
    tmla = P.tmla
    pair_kernel = mla_sm90_pair._mla_pair_kernel
    ksplit_kernel = ksplit_plugin.load()._mla_ksplit_kernel
    planned_pair = tmla._pair

    def forced(ql, qr, kv, block_q, *args):
        return mla_sm90_pair.declines(ql, qr, kv, block_q) is None

    def use(plan_pair, kernel):
        def switch():
            tmla._pair = plan_pair
            mla_sm90_pair._mla_pair_kernel = kernel
        return switch

    variants = {"narrow": use(planned_pair, pair_kernel), "pair": use(forced, pair_kernel),
                "ksplit": use(forced, ksplit_kernel)}
    wanted = os.environ.get("PROBE_VARIANTS")
    variants = {k: v for k, v in variants.items() if not wanted or k in wanted.split(",")}
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128), by["mtp4_B32_ctx4096_H16"],
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16),
              replace(m, name="mtp2_B8_ctx4000_H16", batch=8, seq_len=4000)]
    P.compare(shapes, variants, 3, lambda p: f"block_q {p.get('block_q')} pair {p.get('pair')} splits {P.splits(p)}")
    use(planned_pair, pair_kernel)()


if __name__ == "__main__":
    main()
