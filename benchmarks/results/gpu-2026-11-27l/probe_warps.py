"""The narrow kernels' combine at four heads a program (the package) with 4 warps against 8 and 2
(``mla._combine_blocking`` wrapped), as ``mla_probe.compare`` times the MLA decode.

    python3 probe_warps.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402

own = P.tmla._combine_blocking


def warps(n):
    def blocking(*args):
        grid, constants = own(*args)
        if constants["BLOCK_H"] == 4 and constants["DV_BLOCK"] == 512:
            constants = dict(constants, num_warps=n)
        return grid, constants
    return lambda: setattr(P.tmla, "_combine_blocking", blocking)


by = {s.name: s for s in P.md.SHAPES}
named = {s.name: s for s in P.narrow_shapes()}
P.compare([named["mtp2_B64_ctx4096_H16"], by["mtp4_B32_ctx4096_H16"]], {"w4": warps(4), "w8": warps(8), "w2": warps(2)},
          3, lambda p: f"splits {P.splits(p)}")
P.tmla._combine_blocking = own
