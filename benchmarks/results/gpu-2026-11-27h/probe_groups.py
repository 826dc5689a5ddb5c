"""Decode with key groups (``KEY_GROUPS``: one softmax state a warp) against the one-state loop, the
same Triton kernel otherwise (``_variants.compare``).

    python3 probe_groups.py [SHAPE...]   (default: the first six of _variants.SHAPES, call 1's)

Needs the key groups, which are not in the package: key_groups.diff, written against main bd9efba
(``git apply key_groups.diff`` there; the kernel and its tests).
"""

import sys

from _variants import SHAPES, compare, copy_bandwidth, pa


def apply(groups) -> None:
    pa._FP8_DECODE_KEY_GROUPS = pa._DECODE_KEY_GROUPS = groups


gbps = copy_bandwidth()
for name in sys.argv[1:] or list(SHAPES)[:6]:
    compare(name, SHAPES[name], gbps, 4, 1, apply, names=("groups", "one state"))
