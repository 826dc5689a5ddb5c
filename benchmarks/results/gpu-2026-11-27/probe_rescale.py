"""The wide MLA kernel's left warpgroup four ways: the package's ``mla_sm90`` with ``left.patch``
applied (main 2aa1788's module with a probe switch; ``run.sh probe-rescale`` applies the patch for
the run and takes it off after) loaded once for each value of ``PAGED_ATTN_PROBE_MLA_LEFT``:

- 0, "two" (main 2aa1788): P_0 relative to the left one's own max, O_L rescaled twice a pair;
- 1, "one": the left one waits for the right one's max of tile 2i + 1 before its softmax of tile
  2i, so that P_0 is relative to that max (what the right one multiplies) and O_L is rescaled once
  a pair;
- 2, "one_ovl": 1 with P_1 V_1L issued behind P_0 V_0L without a wait between them;
- 3, "swap": 1 with each warpgroup's two value products in the other order (the left one's P_1
  V_1L first, the right one's P_0 V_0R first), so that the chunk group of a stage freed last is
  freed by the warpgroup whose next scores take it last (the left one's scores take stage 0's right
  chunks, rope, then left chunks; the right one's stage 1's rope, left chunks, then right chunks),
  the producer loading in the new order of the frees;
- 4, "one_prod": 1 with the producer loading stage 1's right chunks before stage 0's left ones
  (the order 1 frees them in: its left warpgroup's P_0 V_0L waits for the right one's max).

Timed as ``mla_probe.compare`` times them.

    python3 probe_rescale.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,..., PROBE_VARIANTS=two,...
    PROBE_NCU=1: one eager call of each variant and shape, nothing timed (for ncu)
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402

# the switch value of each variant (left.patch's PAGED_ATTN_PROBE_MLA_LEFT)
SWITCH = {"two": "0", "one": "1", "one_ovl": "2", "swap": "3", "one_prod": "4"}


def _load(name: str):
    assert "PAGED_ATTN_PROBE_MLA_LEFT" in open(mla_sm90.__file__).read(), "left.patch is not applied"
    os.environ["PAGED_ATTN_PROBE_MLA_LEFT"] = SWITCH[name]
    return P.module_from_file(f"mla_sm90_{name}", mla_sm90.__file__)


def main():
    picked = os.environ.get("PROBE_VARIANTS")
    variants = {k: P.swap("mla_sm90", _load(k)) for k in SWITCH if not picked or k in picked.split(",")}
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, by["B1_ctx32768_H128"], replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192),
              replace(h, name="B64_ctx4096_H128_bs16", block_size=16)]
    P.compare(shapes, variants, 3)
    P.swap("mla_sm90", mla_sm90)()


if __name__ == "__main__":
    main()
