"""The wide MLA kernel as the package has it (one value wgmma of N = L / 2, a token's head groups
side by side in the grid at block sizes >= 64) against main 66aefd2's (``mla_sm90_main.py``), as
``mla_probe.compare`` times them (CUDA-graph replays, alternated round by round, each output
checked against a float32 gather-einsum).

    python3 probe_final.py   # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says
"""
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402


def main():
    main_mod = P.module_from_file("mla_sm90_main", os.path.join(HERE, "mla_sm90_main.py"))
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, replace(h, name="B64_ctx4096_H128_bs16", block_size=16),
              replace(h, name="B32_ctx4096_H128_bs32", batch=32, block_size=32),
              replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192), by["B1_ctx32768_H128"],
              replace(h, name="B32_ctx4096_H64", batch=32, num_heads=64)]
    P.compare(shapes, {"package": P.swap("mla_sm90", mla_sm90), "main": P.swap("mla_sm90", main_mod)}, 5,
              lambda p: f"splits {P.splits(p)}")
    P.swap("mla_sm90", mla_sm90)()


if __name__ == "__main__":
    main()
