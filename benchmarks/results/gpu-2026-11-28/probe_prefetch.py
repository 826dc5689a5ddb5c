"""The wide MLA kernel's producer asking L2 for the pages of the pair ``PREFETCH_AHEAD`` pairs
ahead of the one it loads (``_prefetch``: one bulk prefetch a tile; ``PREFETCH_MODE`` 2: the
segments of the chunk groups loaded last, by ``prefetch.global.L2`` from the producer warp's
lanes; 3: one tile of the pair, the head groups' programs alternating), and the kernel launched
with programmatic dependent launch (``PDL``), as ``mla_probe.compare`` times them (CUDA-graph
replays of back-to-back calls, alternated round by round, each output checked against a float32
gather-einsum). The variants are switches of ``mla_sm90_variants.py`` (the package's kernel file
as it stood during these calls), swapped in for the package's ``mla_sm90``.

Calls 1 and 3 ran with ``mla.py`` planning the wide kernel's launch with programmatic dependent
launch where ``mla_sm90.PDL`` said so (``pdl = (block_q > 0 or mla_sm90.PDL) and
use_pdl(q_latent.device)``, its combine kernel still without); with main's ``mla.py`` the ``PDL``
switch does nothing. ``PROBE_FINAL=1``: the package's kernel as it landed (the prefetch where
``PREFETCH_MIN_GROUPS`` says) against the variants' file without any prefetch.

    python3 probe_prefetch.py   # call 1; PROBE_LINES=1 call 2, PROBE_PDL0=1 call 3, PROBE_HALF=1 call 4
                                # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402

mla_sm90 = P.module_from_file("mla_sm90", os.path.join(HERE, "mla_sm90_variants.py"))


def variant(ahead, pdl, mode=1):
    def use():
        P.swap("mla_sm90", mla_sm90)()
        mla_sm90.PREFETCH_AHEAD, mla_sm90.PDL, mla_sm90.PREFETCH_MODE = ahead, pdl, mode
    return use


def main():
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, by["B1_ctx32768_H128"], replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192),
              replace(h, name="B32_ctx4096_H64", batch=32, num_heads=64),
              replace(h, name="B64_ctx4096_H128_bs16", block_size=16)]
    if os.environ.get("PROBE_FINAL"):
        from torch_paged_attn.lowering.triton import mla_sm90 as package
        shapes = shapes + [replace(h, name="B16_ctx4096_H256", batch=16, num_heads=256)]
        variants = {"package": P.swap("mla_sm90", package), "none": variant(None, False)}
        P.compare(shapes, variants, 3, lambda p: f"splits {P.splits(p)}")
        P.swap("mla_sm90", package)()
    elif os.environ.get("PROBE_HALF"):  # call 4: one tile a pair, the head groups' programs alternating
        shapes = shapes[:4] + [replace(h, name="B16_ctx4096_H256", batch=16, num_heads=256)]
        variants = {"none": variant(None, False), "bulk0": variant(0, False), "half0": variant(0, False, 3)}
        P.compare(shapes, variants, 3, lambda p: f"splits {P.splits(p)}")
    elif os.environ.get("PROBE_PDL0"):  # call 3: the bulk prefetch of the pair being loaded, with and without PDL
        variants = {"none": variant(None, False), "bulk0": variant(0, False), "bulk0+pdl": variant(0, True),
                    "pdl": variant(None, True)}
        P.compare(shapes[:4], variants, 3, lambda p: f"splits {P.splits(p)}")
    elif os.environ.get("PROBE_LINES"):  # call 2: the late groups' lines (PREFETCH_MODE 2), no PDL
        variants = {"none": variant(None, False), "bulk0": variant(0, False), "lines0": variant(0, False, 2),
                    "lines1": variant(1, False, 2)}
        P.compare(shapes[:4], variants, 3, lambda p: f"splits {P.splits(p)}")
    else:  # call 1
        variants = {"pf1+pdl": variant(1, True), "none": variant(None, False), "pdl": variant(None, True),
                    "pf1": variant(1, False), "pf0+pdl": variant(0, True), "pf2+pdl": variant(2, True)}
        P.compare(shapes, variants, 4, lambda p: f"splits {P.splits(p)}")


if __name__ == "__main__":
    main()
