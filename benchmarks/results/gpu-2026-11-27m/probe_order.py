"""The MLA kernels' grid orders (which programs the hardware hands out next to each other), as
``mla_probe.compare`` times them (CUDA-graph replays, each output checked against a float32
gather-einsum):

- the wide kernel (``mla_sm90``, 64 heads a program): the package's grid (tokens, head groups,
  splits), where the two head-group programs of a token, which read the same pages (the second
  mostly from L2), are ``num_tokens`` programs apart, against (head groups, tokens, splits), where
  they are neighbours;
- the narrow kernel (``mla_sm90_narrow``): the package's (query blocks, 1, splits) against
  (splits, query blocks, 1), a query block's splits neighbours.

Variant modules are the package's source with the replacements below (asserted found once).

    python3 probe_order.py            # PROBE_ROUNDS, PROBE_SHAPES as mla_probe says
    PROBE_DRAM=1 python3 probe_order.py   # 8 eager calls a variant of B64 x 4096 H128, nothing
                                          # timed (for ncu's per-launch DRAM bytes)

Its replacements are of main 66aefd2's source (call 1 ran on that tree).
"""
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90, mla_sm90_narrow  # noqa: E402

_HEADS_FIRST = (
    ("        tok = gl.program_id(0)\n        head0 = gl.program_id(1) * _ROWS\n",
     "        tok = gl.program_id(1)\n        head0 = gl.program_id(0) * _ROWS\n"),
    ("kernel, grid = _mla_sm90_kernel, (num_tokens, num_heads // HEADS, num_splits)",
     "kernel, grid = _mla_sm90_kernel, (num_heads // HEADS, num_tokens, num_splits)"),
)
_SPLITS_FIRST_GRID = (
    ("grid = (narrow.grid_blocks(num_tokens, num_seqs, block_q), 1, num_splits)",
     "grid = (num_splits, narrow.grid_blocks(num_tokens, num_seqs, block_q), 1)"),
)
_SPLITS_FIRST_PIDS = (
    ("        pid_q = gl.program_id(0)\n        split = gl.program_id(2)\n",
     "        pid_q = gl.program_id(1)\n        split = gl.program_id(0)\n"),
)


def both(wide, narrow):
    def switch():
        P.swap("mla_sm90_narrow", narrow)()
        P.swap("mla_sm90", wide)()
    return switch


def main():
    heads = P.module_from_source("mla_sm90_heads", P.replaced(mla_sm90, _HEADS_FIRST))
    grid_s = P.module_from_source("mla_sm90_splits", P.replaced(mla_sm90, _SPLITS_FIRST_GRID))
    narrow_s = P.module_from_source("mla_sm90_narrow_splits", P.replaced(mla_sm90_narrow, _SPLITS_FIRST_PIDS))
    package = both(mla_sm90, mla_sm90_narrow)
    by = {s.name: s for s in P.md.SHAPES}
    named = {s.name: s for s in P.narrow_shapes()}
    h = by["B64_ctx4096_H128"]
    wide = [h, replace(h, name="B66_ctx4096_H128", batch=66), replace(h, name="B60_ctx4096_H128", batch=60),
            replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192), by["B1_ctx32768_H128"]]
    narrow = [named["mtp2_B64_ctx4096_H16"], named["B64_ctx4096_H16"], named["mtp2_B32_ctx8192_H16"]]
    if os.environ.get("PROBE_DRAM"):
        device = torch.device("cuda")
        copies = P.md.input_copies(h, device)
        for name, use in {"tokens": package, "heads": both(heads, mla_sm90_narrow)}.items():
            use()
            P.pkg.mla_sm90._LAUNCHERS.clear()
            P.lowering._CHOICES.clear()
            fns = [P.runner(h, x, device) for x in copies]
            for i in range(8):
                fns[i % len(fns)]()
            torch.cuda.synchronize()
            print(f"{name}: 8 calls", flush=True)
        package()
        return
    describe = lambda p: f"splits {P.splits(p)}"  # noqa: E731
    P.compare(wide, {"tokens": package, "heads": both(heads, mla_sm90_narrow)}, 4, describe)
    P.compare(narrow, {"blocks": package, "splits": both(grid_s, narrow_s)}, 3, describe)
    package()


if __name__ == "__main__":
    main()
