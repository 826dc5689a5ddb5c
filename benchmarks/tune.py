"""Sweeps the Triton kernels' tile tables on the benchmark shapes: retuning for a new GPU.

    python benchmarks/tune.py [--sweeps mla_h16,attn_fp8] [--out DIR]
    python benchmarks/tune.py --device cpu --tiny         # smoke run, interpreter-free check

Each sweep takes one shape of ``benchmarks/paged_attention.py`` or ``benchmarks/mla_decode.py``
and one entry of a kernel's configuration table (``_DECODE_CONFIGS`` / ``_PREFILL_CONFIGS`` of the
paged attention kernel, ``_CONFIGS`` of the Hopper prefill kernel or of the MLA kernel, the
batch-invariant split size, or the combine kernel's blocking constants), replaces the entry by
each candidate in turn, and times the public op exactly as the benchmarks do (CUDA-graph replay,
median) against the copy bandwidth measured in the same run. A candidate the compiler refuses
(shared memory, registers) prints its error instead of a time. The table is sorted fastest
first; the tables in the kernel modules record the winners with their numbers. JSON rows go to
``<out>/tune-<gpu>-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import _harness as H  # noqa: E402
import mla_decode as mla_bench  # noqa: E402
import paged_attention as attn_bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as mla_kernel  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as attn_kernel  # noqa: E402
from torch_paged_attn.lowering.triton import prefill as prefill_kernel  # noqa: E402


@dataclass(frozen=True)
class Sweep:
    """Candidates for ``table[key]`` (``table`` None: the batch-invariant split size) on a shape."""

    shape: str
    table: dict | None
    key: int
    candidates: tuple
    batch_invariant: bool = False
    hopper_prefill: bool = True  # False: the Hopper prefill kernel off (the shared kernel's prefill tiles)
    # module constants of paged_attention.py that each candidate (a tuple of their values) sets,
    # instead of a table entry
    attributes: tuple[str, ...] = ()


_ATTN_DECODE = attn_kernel._DECODE_CONFIGS  # (BLOCK_M, TILE_N, warps, stages, programs per SM)
_ATTN_PREFILL = attn_kernel._PREFILL_CONFIGS
# The Hopper prefill kernel's sm_90 tiles (BLOCK_M, TILE_N, warps, stages, PACK_HEADS, LAZY_RESCALE):
# packed GQA rows and one-head rows, eager and lazy rescaling; prefill and chunked prefill (D 128)
# sweep the same tiles. TILE_N 128 is left out: it spills on sm_90 (144-176 B of stack, Triton 3.6);
# TILE_N 32 runs lazy only: eager, Triton 3.6's ptxas crashed on it (SIGSEGV, sass_report, 2026-11-23).
# (64, 64, 4, 2): 241 registers and 80 KiB a program, so two programs (one warpgroup each) share an
# SM and one's softmax can overlap the other's wgmma; the two warpgroups of an 8-warp program meet
# at two barriers a tile.
_HOPPER_PREFILL = prefill_kernel._CONFIGS[9]
_HOPPER_TILES = tuple((*tile, lazy) for lazy in (False, True) for tile in (
    (128, 64, 8, 3, True), (128, 64, 8, 2, True), (128, 64, 8, 4, True), (128, 64, 8, 3, False),
    (128, 64, 8, 2, False), (64, 64, 4, 3, True), (64, 64, 4, 2, True))) + ((128, 32, 8, 4, True, True),)
# TILE_N 128 after the tile's slots and block ids came from its aligned start (2026-11-24, sass_report):
# the unmasked loop is 655 instructions per 128 keys (405 per 64 at TILE_N 64) with one spill
# instruction; the masked (diagonal) loop spills 70; and the 4-stage TILE_N 64 tile beside the default.
# H100, 2026-11-24 (results/tune-NVIDIA-H100-80GB-HBM3-2026-11-24-prefill-wide.txt), prefill / chunked
# us: (128, 64, 8, 3) 415.1 / 349.1, 4 stages 418.6 / 342.9, (128, 128, 8, 2) 514.9 / 449.4, lazy
# 497.8 / 416.2: TILE_N 128 stays out of the table.
_HOPPER_TILES_WIDE = ((128, 64, 8, 3, True, False), (128, 128, 8, 2, True, False), (128, 128, 8, 2, True, True),
                      (128, 64, 8, 4, True, False), (128, 128, 8, 2, False, False))
# the shared kernel's prefill tiles (other architectures, D 256, fp32), run with the Hopper kernel off
_PREFILL_TILES = (
    (128, 64, 8, 3, 1), (128, 64, 8, 2, 1), (128, 128, 8, 2, 1), (128, 128, 8, 3, 1), (128, 32, 8, 4, 1),
    (128, 64, 4, 3, 1), (64, 64, 4, 3, 2), (64, 128, 4, 2, 2))
_MLA = mla_kernel._CONFIGS  # BLOCK_M -> (TILE_N, warps, stages, programs per SM, SCORES, GRID)


def _scores(form: str, tiles: tuple, grid: str = "queries") -> tuple:
    """MLA candidates: each (TILE_N, warps, stages, programs per SM) tile with the score form
    SCORES ("rows", "keys" or "split") and the grid order GRID ("queries": query block on grid
    axis 0, "heads": head group there; ``mla._CONFIGS``)."""
    return tuple((*tile, form, grid) for tile in tiles)

# The combine kernel of few-token calls (paged_attention._combine_blocking): (programs to cover,
# partials loaded an iteration). (1, 16) is the blocking of many tokens (whole rows of 512 // Dv
# heads, 4 partials an iteration: the kernel's schedule before few-token blocking, with its loads
# one iteration ahead); None covers the SM count (the default); 264 and 528: 2 and 4 programs an
# SM where the value columns still split (MLA).
_COMBINE_ATTRIBUTES = ("_COMBINE_MIN_PROGRAMS", "_COMBINE_FEW_LOAD_SPLITS")
_COMBINE = ((1, 16), (None, 4), (None, 8), (None, 16), (264, 16), (528, 16))
_PDL = ((True,), (False,))

SWEEPS = {
    "attn_fp8": Sweep("decode_fp8_B64_ctx4096", attn_kernel._FP8_DECODE_CONFIGS, 128, (
        (16, 128, 4, 2, 2), (16, 128, 4, 3, 2), (16, 128, 4, 2, 3), (16, 128, 4, 3, 3), (16, 256, 4, 2, 2),
        (16, 64, 4, 3, 2), (16, 64, 4, 4, 2), (16, 64, 4, 3, 4), (16, 128, 8, 2, 2), (16, 256, 8, 2, 2),
        (16, 128, 4, 2, 1), (16, 128, 4, 3, 4), (16, 256, 4, 3, 2), (16, 32, 4, 6, 4),
        # one stage: tiles loaded to registers (LDG), converted there, no cp.async staging
        (16, 128, 4, 1, 2), (16, 128, 4, 1, 4), (16, 64, 4, 1, 4), (16, 256, 4, 1, 2),
        # 8 warps and a third or fourth stage
        (16, 128, 8, 3, 2), (16, 128, 8, 3, 1), (16, 128, 8, 4, 1), (16, 128, 4, 4, 2), (16, 256, 8, 3, 1))),
    # the fp8 tile with its scores batched over the warps (the default since the fifteenth run): the
    # candidates that keep 16 keys or more a warp, and 8 warps (16 keys a warp). Not yet run whole;
    # results/gpu-2026-11-27h/probe_tiles.py measured three of them against the first, all slower
    "attn_fp8_batched": Sweep("decode_fp8_B64_ctx4096", attn_kernel._FP8_DECODE_CONFIGS, 128, (
        (16, 128, 4, 3, 4), (16, 128, 8, 3, 2), (16, 128, 8, 2, 2), (16, 256, 4, 2, 2), (16, 256, 8, 2, 2),
        (16, 256, 8, 3, 1), (16, 64, 4, 3, 4), (16, 128, 4, 2, 2))),
    "attn_b1": Sweep("decode_B1_ctx32768", _ATTN_DECODE, 128, (
        (16, 128, 4, 2, 2), (16, 128, 4, 2, 1), (16, 128, 4, 2, 3), (16, 128, 4, 2, 4), (16, 64, 4, 3, 2),
        (16, 64, 4, 3, 4), (16, 128, 4, 3, 2), (16, 256, 4, 2, 2))),
    # the D 128 decode tile on the MHA and B64 shapes (one entry serves every decode shape)
    "attn_mha": Sweep("decode_mha_B32_ctx2048", _ATTN_DECODE, 128, (
        (16, 128, 4, 2, 2), (16, 128, 4, 3, 2), (16, 256, 4, 2, 2), (16, 128, 4, 2, 3), (16, 64, 4, 3, 4),
        (16, 128, 4, 2, 1), (16, 64, 4, 2, 4))),
    "attn_b64": Sweep("decode_B64_ctx4096", _ATTN_DECODE, 128, (
        (16, 128, 4, 2, 2), (16, 128, 4, 3, 2), (16, 256, 4, 2, 2), (16, 128, 4, 2, 3), (16, 64, 4, 3, 4))),
    "attn_prefill": Sweep("prefill_B4_q2048", _HOPPER_PREFILL, 128, _HOPPER_TILES),
    "attn_chunked": Sweep("chunked_prefill_B4_q512_ctx4096", _HOPPER_PREFILL, 128, _HOPPER_TILES),
    "attn_prefill_wide": Sweep("prefill_B4_q2048", _HOPPER_PREFILL, 128, _HOPPER_TILES_WIDE),
    "attn_chunked_wide": Sweep("chunked_prefill_B4_q512_ctx4096", _HOPPER_PREFILL, 128, _HOPPER_TILES_WIDE),
    "attn_prefill_shared": Sweep("prefill_B4_q2048", _ATTN_PREFILL, 128, _PREFILL_TILES, hopper_prefill=False),
    "attn_chunked_shared": Sweep("chunked_prefill_B4_q512_ctx4096", _ATTN_PREFILL, 128, _PREFILL_TILES,
                                 hopper_prefill=False),
    "invariant_B64": Sweep("decode_B64_ctx4096", None, 0, (1024, 2048, 4096), batch_invariant=True),
    "invariant_B8": Sweep("decode_B8_ctx8192_Hq64", None, 0, (1024, 2048, 4096), batch_invariant=True),
    "mla_h16": Sweep("B128_ctx4096_H16", _MLA, 16, _scores("rows", (
        (64, 4, 2, 1), (64, 4, 2, 2), (64, 4, 2, 4), (64, 4, 3, 2), (32, 4, 3, 2), (32, 4, 4, 2),
        (32, 4, 2, 4), (64, 8, 2, 2), (128, 8, 2, 2), (32, 8, 3, 2), (64, 4, 1, 4), (16, 4, 4, 4)))),
    "mla_mtp": Sweep("mtp2_B64_ctx4096_H16", _MLA, 32, _scores("keys", (
        (32, 4, 3, 2), (32, 4, 4, 2), (32, 4, 2, 2), (32, 4, 3, 3), (16, 4, 3, 2))) + _scores("rows", (
        (32, 4, 3, 2), (32, 4, 4, 2), (16, 4, 3, 2), (16, 4, 4, 2), (32, 4, 3, 3), (64, 4, 3, 2),
        (32, 4, 3, 1), (16, 4, 3, 3), (32, 4, 2, 2), (64, 4, 2, 2), (32, 8, 2, 1))) + _scores("split", (
        (64, 8, 2, 1), (64, 8, 2, 2))) + _scores("keys", ((32, 8, 3, 2), (32, 8, 3, 1), (64, 4, 1, 2), (32, 4, 1, 2),
        (64, 4, 2, 2), (64, 8, 1, 2)))),
    "mla_b32": Sweep("B32_ctx8192_H16", _MLA, 16, _scores("rows", (
        (64, 4, 2, 2), (64, 4, 2, 4), (32, 4, 3, 2), (32, 4, 3, 4), (32, 4, 2, 4), (64, 4, 3, 4),
        (64, 4, 2, 8), (32, 4, 2, 8), (64, 8, 2, 4)))),
    # the H16 tile's split count on both memory-bound H16 shapes (programs per SM 1, 2, 4: B128 x
    # 4096 unsplit, 2, 4 splits; B32 x 8192 4, 8, 16) and a third stage
    "mla_h16_splits": Sweep("B128_ctx4096_H16", _MLA, 16, _scores("rows", (
        (64, 4, 2, 2), (64, 4, 2, 1), (64, 4, 2, 4), (64, 4, 3, 2), (32, 4, 3, 1)))),
    "mla_b32_splits": Sweep("B32_ctx8192_H16", _MLA, 16, _scores("rows", (
        (64, 4, 2, 2), (64, 4, 2, 1), (64, 4, 3, 1), (64, 4, 3, 2), (32, 4, 3, 1)))),
    # H128 (two head groups): the best tiles in both grid orders, GRID "heads" launching the two
    # head groups of a sequence adjacent (mla._CONFIGS)
    "mla_h128": Sweep("B64_ctx4096_H128", _MLA, 64, _scores("split", (
        (64, 8, 2, 1), (32, 8, 3, 1), (32, 8, 2, 1), (32, 8, 4, 1), (16, 8, 4, 1), (64, 8, 1, 1))) + _scores(
        "rows", ((64, 8, 2, 1), (32, 8, 3, 1))) + _scores("split", ((64, 8, 2, 1), (32, 8, 3, 1)), "heads") + _scores(
        "rows", ((64, 8, 2, 1),), "heads")),
    # B1 x 32768 H128: the split-KV count follows programs per SM (1: 64 splits x 2 head groups)
    "mla_b1_h128": Sweep("B1_ctx32768_H128", _MLA, 64, _scores("split", (
        (64, 8, 2, 1), (64, 8, 2, 2), (32, 8, 3, 1), (32, 8, 3, 2), (32, 8, 2, 2), (16, 8, 4, 2))) + _scores(
        "rows", ((64, 8, 2, 1),)) + _scores("split", ((64, 8, 2, 1), (64, 8, 2, 2)), "heads")),
    "combine_b1": Sweep("decode_B1_ctx32768", None, 0, _COMBINE, attributes=_COMBINE_ATTRIBUTES),
    # programmatic dependent launch of the combine kernel (paged_attention._PDL) on and off, on
    # the split-KV shapes of both kernels
    "pdl_b1": Sweep("decode_B1_ctx32768", None, 0, _PDL, attributes=("_PDL",)),
    "pdl_b8": Sweep("decode_B8_ctx8192_Hq64", None, 0, _PDL, attributes=("_PDL",)),
    "pdl_mla_b1": Sweep("B1_ctx32768_H128", None, 0, _PDL, attributes=("_PDL",)),
    "pdl_mla_h16": Sweep("B128_ctx4096_H16", None, 0, _PDL, attributes=("_PDL",)),
    "pdl_mla_b32": Sweep("B32_ctx8192_H16", None, 0, _PDL, attributes=("_PDL",)),
    "combine_mla_b1": Sweep("B1_ctx32768_H128", None, 0, _COMBINE, attributes=_COMBINE_ATTRIBUTES),
    # partials an iteration of whole-row combine programs that do not cover the SMs
    "combine_mla_rows": Sweep("B1_ctx32768_H128", None, 0, ((4,), (8,), (16,)),
                              attributes=("_COMBINE_ROW_LOAD_SPLITS",)),
    # fp8 H16: "keys" makes the latent tile the first operand of the score dots, converted in the
    # registers it is loaded to (sm_90, Triton 3.6: per key, 12-20 SASS instructions a thread at
    # TILE_N 64 against 29 for the "rows" tile (32, 4, 2, 2), no byte-wide shared loads)
    "mla_fp8": Sweep("fp8_B128_ctx4096_H16", mla_kernel._FP8_CONFIGS, 16, _scores("rows", (
        (32, 4, 2, 2), (32, 4, 2, 4), (64, 4, 2, 1), (64, 4, 2, 2), (32, 4, 3, 1), (16, 4, 3, 4))) + _scores("keys", (
        (64, 4, 1, 2), (64, 4, 1, 1), (64, 4, 1, 4), (64, 4, 2, 1), (64, 8, 2, 1), (64, 8, 1, 2), (64, 8, 1, 1),
        (32, 4, 2, 2), (32, 4, 3, 2), (16, 4, 3, 2), (64, 4, 1, 3), (128, 4, 1, 2), (128, 8, 1, 2), (128, 8, 1, 1),
        (32, 4, 1, 2), (32, 4, 1, 4)))),
}


@contextlib.contextmanager
def _candidate(sweep: Sweep, value) -> Iterator[None]:
    """The sweep's table entry (or the invariant split size) set to ``value`` inside the block,
    with the ops' remembered plans dropped on entry and exit (a plan keeps the tiles it was made
    with: ``lowering.plan``)."""
    lowering._CHOICES.clear()
    hopper = dict(prefill_kernel._CONFIGS)
    if not sweep.hopper_prefill:
        prefill_kernel._CONFIGS.clear()
    try:
        with _set(sweep, value):
            yield
    finally:
        prefill_kernel._CONFIGS.update(hopper)
        lowering._CHOICES.clear()


@contextlib.contextmanager
def _set(sweep: Sweep, value) -> Iterator[None]:
    if sweep.attributes:
        old = [getattr(attn_kernel, name) for name in sweep.attributes]
        for name, v in zip(sweep.attributes, value):
            setattr(attn_kernel, name, v)
        try:
            yield
        finally:
            for name, v in zip(sweep.attributes, old):
                setattr(attn_kernel, name, v)
        return
    if sweep.table is None:
        old = attn_kernel._INVARIANT_SPLIT_TOKENS
        attn_kernel._INVARIANT_SPLIT_TOKENS = value
        try:
            with tpa.batch_invariant(True):
                yield
        finally:
            attn_kernel._INVARIANT_SPLIT_TOKENS = old
        return
    old = sweep.table[sweep.key]
    sweep.table[sweep.key] = value
    try:
        yield
    finally:
        sweep.table[sweep.key] = old


def _call(name: str, device: torch.device, tiny: bool) -> tuple[Callable[[], object], int, str]:
    """``(fn, bytes, formula)``: the public op on the named benchmark shape."""
    for s in attn_bench.SHAPES:
        if s.name == name:
            s = attn_bench.tiny(s) if tiny else s
            b = attn_bench.paged_inputs(s, device, seed=0)
            contender = attn_bench.ours(s, [b])
            return contender.fns[0], *attn_bench.attention_bytes(s)
    for s in mla_bench.SHAPES:
        if s.name == name:
            s = mla_bench.tiny(s) if tiny else s
            x = mla_bench.make_inputs(s, device, seed=0)
            contender = mla_bench.ours(s, [x], device)
            return contender.fns[0], *mla_bench.cache_bytes(s)
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", default=",".join(SWEEPS), help=f"comma-separated, of: {', '.join(SWEEPS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small stand-in shapes (smoke runs)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    device = H.resolve_device(args.device)
    copy_gbps, _ = H.copy_bandwidth(device, quick=True)
    H.progress(f"copy bandwidth {copy_gbps:.0f} GB/s")
    rows: list[H.Row] = []
    for name in args.sweeps.split(","):
        sweep = SWEEPS[name]
        fn, nbytes, formula = _call(sweep.shape, device, args.tiny)
        results = []
        for value in sweep.candidates:
            label = f"{name} {value}"
            H.progress(f"  {label}")
            with _candidate(sweep, value):
                try:
                    timing = H.bench([fn], device, quick=True)
                except Exception as e:  # noqa: BLE001 - a refused configuration is a result
                    rows.append(H.Row(sweep.shape, label, "bf16", status="n/a", reason=attn_bench._reason(e)))
                    results.append((math.inf, label, attn_bench._reason(e)))
                    continue
            gbps = nbytes / (timing.p50_us * 1e-6) / H.GB
            rows.append(H.Row(sweep.shape, label, "bf16", p50_us=timing.p50_us, p20_us=timing.p20_us,
                              p80_us=timing.p80_us, bytes=nbytes, bytes_formula=formula, gbps=gbps,
                              pct_copy=100 * gbps / copy_gbps))
            results.append((timing.p50_us, label, f"{100 * gbps / copy_gbps:5.1f} % copy"))
        print(f"\n{name}: {sweep.shape} (copy {copy_gbps:.0f} GB/s)")
        for us, label, note in sorted(results):
            print(f"  {label:<50} {us:9.2f} us  {note}")
    meta = dict(H.device_info(device), copy_gbps=copy_gbps, args=vars(args))
    path = H.json_path("tune", meta, args.out)
    H.write_json(path, "tune", rows, meta)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
