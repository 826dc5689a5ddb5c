"""How much the H16 MLA rows lose to the SMs their grids leave idle: the package's MLA decode on
batches around the benchmark's (B64 x 4096 with two splits and B128 unsplit make 128 programs of
one an SM on the H100's 132 SMs; B66 and B132 make 132), timed as ``mla_probe.compare`` times it,
one variant. Each line's time per byte (``mla_decode.copy_bytes``) against the 128-program shape's
says whether the four idle SMs cost time: the same time per byte, no; 128/132 of it, fully.

    python3 probe_fill.py   # PROBE_ROUNDS=2, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402


def main():
    by = {s.name: s for s in P.md.SHAPES}
    m, one = by["mtp2_B64_ctx4096_H16"], by["B128_ctx4096_H16"]
    shapes = [replace(m, name=f"mtp2_B{b}_ctx4096_H16", batch=b) for b in (60, 64, 66, 128, 132)]
    shapes += [replace(one, name=f"B{b}_ctx4096_H16", batch=b) for b in (60, 64, 66, 128, 132)]
    P.compare(shapes, {"main": lambda: None}, 2, lambda plan: f"splits {P.splits(plan)}")


if __name__ == "__main__":
    main()
