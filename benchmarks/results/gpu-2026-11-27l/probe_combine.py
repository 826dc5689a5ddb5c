"""The combine kernel's blocking for the narrow MLA kernels' split calls: whole-row programs of
``paged_attention._COMBINE_TILE // 512`` heads (the package: 512, one head a program, 2048
programs for 2 tokens B64 x 4096 H16), against 2 and 4 heads a program (1024, 2048), as
``mla_probe.compare`` times the package's MLA decode (CUDA-graph replays of back-to-back calls,
each output checked against a float32 gather-einsum). The blocking changes which program merges
an element, never how (``_combine_blocking``): the bits are the same.

    python3 probe_combine.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...

With ``PROBE_PACKAGE=1``, the package's own rule (``mla._COMBINE_TILE``: up to four heads a program
where the programs still cover the SMs) against one head a program everywhere (the tile at 512).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention  # noqa: E402


def main():
    def tile(n):
        return lambda: setattr(paged_attention, "_COMBINE_TILE", n)

    named = {s.name: s for s in P.narrow_shapes()}
    by = {s.name: s for s in P.md.SHAPES}
    shapes = [named["mtp2_B64_ctx4096_H16"], named["B64_ctx4096_H16"], named["mtp2_B32_ctx8192_H16"],
              named["B32_ctx8192_H16"], named["B16_ctx8192_H16"], by["mtp4_B32_ctx4096_H16"]]
    describe = lambda p: f"block_q {p.get('block_q')} splits {P.splits(p)} pair {p.get('pair')}"  # noqa: E731
    if os.environ.get("PROBE_PACKAGE"):
        own = P.tmla._COMBINE_TILE

        def mla_tile(n):
            return lambda: setattr(P.tmla, "_COMBINE_TILE", n)

        P.compare(shapes, {"package": mla_tile(own), "one-head": mla_tile(512)}, 3, describe)
        mla_tile(own)()
        return
    package = paged_attention._COMBINE_TILE
    P.compare(shapes, {"tile512": tile(512), "tile1024": tile(1024), "tile2048": tile(2048)}, 3, describe)
    tile(package)()


if __name__ == "__main__":
    main()
