"""fp8 decode B64 x 4096 (512 programs: 1.94 waves of the 264 resident slots) unsplit, as planned,
against the same call split in 2 and 4 (1024 / 2048 programs through the workspace and the combine
kernel, which PDL launches behind the attention kernel): does a finer grid shorten the last wave's
tail more than the combine costs? (``_variants.compare``)

    python3 probe_split.py
"""

from _variants import FP8_B64, compare, copy_bandwidth, pa, shape

real_plan = pa._plan_splits
forced = [None]


def plan(device, programs_per_split, programs_per_sm, capacity, tile_n, partial_bytes, split_tokens):
    return real_plan(device, programs_per_split, programs_per_sm, capacity, tile_n, partial_bytes,
                     forced[0] if split_tokens is None else split_tokens)


def apply(split) -> None:
    forced[0] = split


pa._plan_splits = plan
gbps = copy_bandwidth()
for split in (2048, 1024):
    compare(f"split {split}", shape(FP8_B64), gbps, split, None, apply, names=("split", "unsplit"))
