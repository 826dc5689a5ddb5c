"""fp8 decode B64 x 4096: the scores of each warp's 32 keys by a batched dot over the warps (4: the
query tile then stays in registers, where the 16 x 128 dot reloads it from shared memory every tile)
against one dot (1) (``_variants.compare``). Call 5 ran it with the switch then named ``_QB``; the
package's is ``_FP8_DECODE_BATCHED_SCORES``, which this sets.

    python3 probe_qb.py
"""

from _variants import FP8_B64, compare, copy_bandwidth, pa, shape


def apply(warps) -> None:
    pa._FP8_DECODE_BATCHED_SCORES = warps == 4


compare("4", shape(FP8_B64), copy_bandwidth(), 4, 1, apply)
