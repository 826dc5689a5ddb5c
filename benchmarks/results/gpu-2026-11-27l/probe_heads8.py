"""The narrow kernels' combine with up to 4 heads a program (``mla._COMBINE_TILE`` 2048, the
package), 8 (4096) and 16 (8192), as ``mla_probe.compare`` times the MLA decode (CUDA-graph replays,
each output checked against a float32 gather-einsum).

    python3 probe_heads8.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402

by = {s.name: s for s in P.md.SHAPES}
named = {s.name: s for s in P.narrow_shapes()}
shapes = [named["mtp2_B64_ctx4096_H16"], named["B64_ctx4096_H16"], by["mtp4_B32_ctx4096_H16"]]


def tile(n):
    return lambda: setattr(P.tmla, "_COMBINE_TILE", n)


own = P.tmla._COMBINE_TILE
P.compare(shapes, {"heads4": tile(2048), "heads8": tile(4096), "heads16": tile(8192)}, 3,
          lambda p: f"splits {P.splits(p)}")
tile(own)()
