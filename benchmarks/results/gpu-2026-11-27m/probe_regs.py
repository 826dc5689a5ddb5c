"""The wide MLA kernel (the package's) with its right warpgroup's registers (``REGS_CONSUMER``,
224) at 208, 224 and 240, as ``mla_probe.compare`` times them (the module's constant set before
each variant's launchers are built).

    python3 probe_regs.py   # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402


def regs(n):
    return lambda: setattr(mla_sm90, "REGS_CONSUMER", n)


def main():
    own = mla_sm90.REGS_CONSUMER
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192)]
    P.compare(shapes, {"r224": regs(224), "r240": regs(240), "r208": regs(208)}, 4, lambda p: f"splits {P.splits(p)}")
    regs(own)()


if __name__ == "__main__":
    main()
