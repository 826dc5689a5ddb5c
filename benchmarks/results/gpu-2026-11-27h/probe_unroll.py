"""fp8 decode B64 x 4096: the key loop unrolled (``tl.range(..., loop_unroll_factor=UNROLL)``) with
smaller tiles or fewer stages, against the planned tile (16, 128, 4 warps, 3 stages)
(``_variants.compare``). Candidates (tile, unroll) from sm_90 SASS of main bd9efba with the unroll
(registers / shared memory / instructions a 128 keys): (16, 128, 4, 2) x 2: 190 / 104 KiB / 1061;
(16, 64, 4, 3) x 2: 186 / 55 KiB / 1352; (16, 32, 4, 3) x 4: 154 / 46 KiB / 1615 (three programs an
SM); (16, 64, 4, 2) x 2: 185 / 55 KiB / 1415; the planned tile 166 / 104 KiB / 1104.

    python3 probe_unroll.py

Needs the ``UNROLL`` switch, which is not in the package: call 3 ran it on main bd9efba with the
change unroll.diff makes (unroll.diff itself is written against this run's final tree, where the
fp8 tile's scores are batched over the warps).
"""

from _variants import FP8_B64, compare, copy_bandwidth, pa, shape

PLANNED = ((16, 128, 4, 3, 4), 1)
CANDIDATES = [((16, 128, 4, 2, 4), 2), ((16, 64, 4, 3, 4), 2), ((16, 32, 4, 3, 4), 4), ((16, 64, 4, 2, 4), 2)]


def apply(setting) -> None:
    pa._FP8_DECODE_CONFIGS[128], pa._UNROLL = setting


gbps = copy_bandwidth()
for cfg in CANDIDATES:
    compare(str(cfg), shape(FP8_B64), gbps, cfg, PLANNED, apply)
