"""The wide MLA kernel (``mla_sm90``) with each value product one wgmma of N = L / 2 (the
package's tree: a warpgroup's output one [64, L / 2] accumulator, the value chunks read as one
[64, L / 2] operand), against main 66aefd2's four wgmmas of N = 64 a key step (``mla_sm90_main.py``,
that commit's file), each also with the head groups first in the grid (``probe_order.py``'s
replacements), as ``mla_probe.compare`` times them.

    python3 probe_n256.py   # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says

It ran on the tree of call 2 (``run.sh``); its heads-first replacements are of that source.
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402
from probe_order import _HEADS_FIRST  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402


def main():
    main_mod = P.module_from_file("mla_sm90_main", os.path.join(HERE, "mla_sm90_main.py"))
    variants = {
        "n256": P.swap("mla_sm90", mla_sm90),
        "main": P.swap("mla_sm90", main_mod),
        "n256h": P.swap("mla_sm90", P.module_from_source("mla_sm90_n256h", P.replaced(mla_sm90, _HEADS_FIRST))),
        "mainh": P.swap("mla_sm90", P.module_from_source("mla_sm90_mainh", P.replaced(main_mod, _HEADS_FIRST))),
    }
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, by["B1_ctx32768_H128"], replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192),
              replace(h, name="B64_ctx4096_H128_bs16", block_size=16)]
    P.compare(shapes, variants, 5, lambda p: f"splits {P.splits(p)}")
    P.swap("mla_sm90", mla_sm90)()


if __name__ == "__main__":
    main()
