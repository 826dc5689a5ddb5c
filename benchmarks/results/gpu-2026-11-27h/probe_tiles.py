"""fp8 decode B64 x 4096 with batched scores (the package's default): other tiles against the planned
(16, 128, 4 warps, 3 stages) (``_variants.compare``). sm_90 SASS of the candidates (registers / shared
memory / instructions a warp a tile; ``sass_report.py --sweeps attn_fp8_batched``): (16, 128, 8, 3):
128 / 100 KiB / 658; (16, 128, 8, 2): 128 / 68 KiB / 645; (16, 64, 4, 3): 180 / 50 KiB / 636; the
planned 206 / 100 KiB / 1033.

    python3 probe_tiles.py
"""

from _variants import FP8_B64, compare, copy_bandwidth, pa, shape

PLANNED = (16, 128, 4, 3, 4)
CANDIDATES = [(16, 128, 8, 3, 2), (16, 128, 8, 2, 2), (16, 64, 4, 3, 4)]


def apply(setting) -> None:
    pa._FP8_DECODE_CONFIGS[128] = setting


gbps = copy_bandwidth()
for cfg in CANDIDATES:
    compare(str(cfg), shape(FP8_B64), gbps, cfg, PLANNED, apply)
