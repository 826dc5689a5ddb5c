"""``mla_decode`` on the shapes whose programs take ``BLOCK_Q`` > 1 query tokens, timed as
``mla_probe.compare`` times one variant (the package as it stands): one process per tree,
``run.sh qblocks`` alternating the tree's narrow, pair and fp8 kernel modules (main a27bacb's: the
query blocks numbered as the attention kernel numbers them) with the same after ``qblocks.patch``
(a sequence's first block numbered by its sequence, a block's splits consecutive in launch order:
``_program_ids``, ``_program``).

    python3 probe_qblocks.py LABEL   # PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402


def main():
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, by["mtp4_B32_ctx4096_H16"], replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16)]
    P.compare(shapes, {sys.argv[1]: lambda: None}, 1)


if __name__ == "__main__":
    main()
