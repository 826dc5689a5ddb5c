"""Decode with the scores' dot batched over the warps (QB4, the query tile kept in registers) against
one 16-row dot (QB1), bf16 and fp8 caches, the benchmark's decode shapes and fp8 variants
(``_variants.compare``). Call 6 ran it with the switches then named ``_QB`` and ``_QB_BF16``; the
package's are ``_FP8_DECODE_BATCHED_SCORES`` and ``_DECODE_BATCHED_SCORES``, which this sets.

    python3 probe_qb_shapes.py [SHAPE...]   (default: every shape of _variants.SHAPES)
"""

import sys

from _variants import SHAPES, compare, copy_bandwidth, pa


def apply(warps) -> None:
    pa._FP8_DECODE_BATCHED_SCORES = pa._DECODE_BATCHED_SCORES = warps == 4


gbps = copy_bandwidth()
for name in sys.argv[1:] or list(SHAPES):
    compare(name, SHAPES[name], gbps, 4, 1, apply, names=("QB4", "QB1"))
