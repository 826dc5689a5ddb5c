"""Paged attention in Triton: one kernel for any mix of decode and prefill tokens, split-KV optional.

Algorithm: FlashAttention-2's online softmax (Dao 2023) over K/V tiles gathered through the block
table; with split-KV ("flash-decoding") each program covers one range of key positions and a
second kernel merges the partial (out, lse) states through their LSEs, in split order (its grid:
token, head block, value-column block).
Grid of ``_attention_kernel``: axis 0 query block (``T // BLOCK_Q + B + 1`` slots; program ``i``
belongs to the sequence ``b`` whose slots ``qsl[b] // BLOCK_Q + b ..`` contain it, found by binary
search; slots past a sequence's tokens exit, the last ones zero the padding rows), axis 1 kv head
(x head group when Hq/Hkv > 64), axis 2 kv split; decode swaps axes 0 and 1 (``_DECODE_GRID``:
the programs resident at once then read neighbouring heads of the same pages). The M dimension
of each ``tl.dot`` is ``BLOCK_Q`` tokens x the query heads of one kv head, so every K/V tile is
loaded once for them all; the fp8 decode tile computes its scores as one such dot a warp, over the
warp's share of the tile's keys (``SCORE_WARPS``, ``_FP8_DECODE_BATCHED_SCORES``).
Layouts: query/out ``[T, Hq, D]``, caches ``[NB, BS, Hkv, D]`` (any strides, last one 1).
Block-table lookup, per tile of ``TILE_N`` key positions ``j`` (ids fetched one tile ahead)::

    for j in range(start, start + TILE_N):
        block = block_table[b, j // BS]                # masked: j >= seq_len, block outside [0, NB)
        k[j] = key_cache[block, j % BS, kv_head, :]    # int64 offsets; masked loads give 0, not NaN
Tiles outside all rows' causal/window/chunk ranges are skipped, tiles inside all of them unmasked.

Bytes moved: ``sum_b seq_len_b * Hkv * (D + Dv) * cache_bytes`` (K/V read once per kv head and
query block) + ``T * Hq * (D + Dv) * q_bytes``; split-KV adds ``T * S * Hq * (Dv + 1) * 8``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from ... import _config
from ._launch import cdiv, contiguous_strides, launcher, next_power_of_2, same_as
from ._softmax import LOG2E, merge_partial, merged_to_output, softmax_step, state_to_partial

try:  # grid dependency control (sm_90+; Triton >= 3.4): see _PDL
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the installed Triton
    gdc_launch_dependents = gdc_wait = None

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# Tile configurations, keyed by the padded head size (max of D and Dv, a power of two):
# (BLOCK_M rows = query tokens x heads of one kv head, TILE_N keys per iteration, num_warps,
# num_stages, programs resident per SM). Decode runs when every sequence has one query token
# (max_query_len == 1), and always in batch-invariant mode, whose results must not depend on the
# batch's query lengths.
# Decode, measured on an H200 (copy 4.27 TB/s), bf16, block 16, D 128, 2026-11, % of copy:
# TILE_N 128 / 2 stages: B64x4096 99.9, MHA B32x2048 99.8, B256x1024 94.4 (233 registers, 72 KiB
# shared: 2 programs per SM). Before masks were skipped on inner tiles, TILE_N 128 / 2 stages gave
# 94.9, 95.4, 89.9; TILE_N 64 / 3 stages 90.6, 89.0, 84.3; TILE_N 32 / 3 stages 76.2, 90.1, 87.3;
# 8 warps 62.7, 63.2, 62.0. D 64 (and unmeasured 16/32): TILE_N 256 91.8 vs 128 73.4 (B64x4096).
# D 256: 101.0. fp8 e4m3 B64x4096: 62.6 % (TILE_N 256: 49.1), before the values were converted in
# their load layout (``_fp8_to_fp16``: 255 -> 168 registers on sm_90; not yet measured).
# Prefill-like calls on compute capability 9.x with D, Dv <= 128 run ``prefill.py``'s kernel (its
# own table); this one keeps the rest (other GPUs, D 256, fp32, forced splits, few query blocks).
# Prefill, 4 x 2048 causal / 4 x 512 on 4096 keys, TFLOP/s: (128, 64, 8 warps, 3 stages) 246 / 292,
# 2 stages 239 / 250, (128, 32, 4, 3) 194 / 253, (64, 64, 4, 3) 197 / 226, TILE_N 128: 170 / 230.
_DECODE_CONFIGS = {
    16: (16, 256, 4, 2, 2),
    32: (16, 256, 4, 2, 2),
    64: (16, 256, 4, 2, 2),
    128: (16, 128, 4, 2, 2),
    256: (16, 64, 4, 2, 2),  # the same 64 KiB of K and V per tile as D 128
}
# The slots and block indices of a tile taken from its aligned start (as ``prefill._tile`` does)
# cut this loop from 958 to 752 SASS instructions a tile and 228 to 168 registers (sm_90, Triton
# 3.6), but ran slower on an H100 (2026-11-24, graph replays, results/gpu-2026-11-24/pa-slots.txt):
# B64 x 4096 374.8 against 361.2 us, B8 x 8192 Hq64 102.1 against 97.9, fp8 216.2 against 213.2
# (a third program fits an SM at 168 registers, and B64's 512 programs then run 1.3 waves of 396
# slots instead of 1.9 of 264); B1 x 32768 58.1 against 58.5. So decode keeps the per-key form.
# fp8 caches (decode, D 128): the 1-byte tiles fit a third stage. H100, 2026-11-23, B64 x 4096
# e4m3 (tune.py attn_fp8, two runs), % of copy on the bytes moved: (16, 128, 4, 3, 4) 88.2,
# (16, 128, 4, 3, 3) 85.8 / 84.6, (16, 128, 4, 3, 2) 85.6, the bf16 tile (16, 128, 4, 2, 2) 67.3,
# 4 stages 56.5, 8 warps 74.1, TILE_N 256 74.6, TILE_N 64 58.7-67.7.
_FP8_DECODE_CONFIGS = {
    128: (16, 128, 4, 3, 4),
}
# The scores' dot of the fp8 decode tile batched over the warps (``SCORE_WARPS``, ``_score_warps``):
# each warp multiplies the 16 query rows by its own TILE_N / 4 keys, the query tile broadcast to
# the four. Triton then keeps the query operand in registers across the key loop, where the one
# 16 x TILE_N dot (warps along the keys, each needing the whole query tile) reloads it from shared
# memory every tile: sm_90 SASS of B64 x 4096 e4m3 (Triton 3.6, benchmarks/sass_report.py), 38
# LDS.64 and 237 register moves a 128-key tile, 1104 instructions against 1033, 104 KiB of shared
# memory against 100; Nsight Compute put 27 % of the warps' stall samples on those moves and loads
# (results/gpu-2026-11-27h/logs/call4). H100, 2026-11-27, CUDA-graph replays alternated
# (results/gpu-2026-11-27h/logs/call6, probe_qb_shapes.py), one dot -> batched, us: e4m3 B64 x 4096
# 208.4 -> 200.6 (87.6 -> 91.0 % of copy), B256 x 1024 229.8 -> 224.3, B8 x 8192 Hq64 65.7 -> 65.0,
# B1 x 32768 43.7 -> 43.5. The bf16 tiles gain nothing (B64 x 4096 358.2 -> 357.4, B1 x 32768 54.2
# -> 54.9, MHA B32 x 2048 355.9 -> 357.6): one dot there (_DECODE_BATCHED_SCORES).
_FP8_DECODE_BATCHED_SCORES = True
_DECODE_BATCHED_SCORES = False
_PREFILL_CONFIGS = {
    16: (128, 64, 8, 3, 1),
    32: (128, 64, 8, 3, 1),
    64: (128, 64, 8, 3, 1),
    128: (128, 64, 8, 3, 1),
    256: (64, 32, 8, 2, 1),
}
# Decode's grid order: "queries" (query blocks on axis 0, the fastest) or "heads" (kv heads x
# head groups on axis 0, where the query blocks fit axis 1: the programs resident at once read
# the neighbouring heads of the same slots, one contiguous run of the cache row, where "queries"
# has them read one head of many sequences). H100, 2026-11-26, CUDA-graph replays in one process,
# the two orders alternated five rounds (benchmarks/results/gpu-2026-11-26h/logs/probe-grid-2.txt),
# p50 us queries -> heads: MHA B32 x 2048 360.7-361.0 -> 355.2-355.3, fp8 B64 x 4096 207.4-208.1
# -> 204.5-205.6, B64 x 4096 360.0-360.1 -> 358.5-358.6, B1 x 32768 54.1-54.8 -> 54.8; three
# rounds (probe-grid.txt): B256 x 1024 365.0-365.1 -> 363.8-364.0, B8 x 8192 Hq64 97.6-97.9 ->
# 97.6-97.8. The same bits either way (each program's work is unchanged).
_DECODE_GRID = "heads"
_MAX_GRID_Y = 65535  # CUDA's limit on grid axes 1 and 2 (mla and prefill plan by it too)
# Query heads one program holds; a larger group is spread over several programs (loading K/V
# once per program), which bounds the accumulator at 64 x 256 floats.
_MAX_HEADS_PER_PROGRAM = 64
# Split-KV fills the resident program slots once (B1 x 32768, Hkv 8: 264 slots / 8 = 33 -> 32
# splits of 1024 keys, 69.1 % of copy; measured before inner-tile masks were skipped: 32 splits
# 49.9 %, 16 splits 40.9 %, 64 splits 31.3 %), never with fewer than this many tiles a split.
_MIN_SPLIT_TILES = 2
# Batch-invariant mode splits every sequence at multiples of this many key positions. H200,
# 2026-11-22, % of copy (default mode in brackets): B64 x 4096 at 1024 / 2048 / 4096: 94.9 /
# 98.7 / 100.3 (102.5); B8 x 8192 Hq64: 83.6 / 89.6 / 63.8 (89.0). 2048 costs at most ~4 %.
_INVARIANT_SPLIT_TOKENS = 2048
# ... and a sequence longer than _INVARIANT_LONG_FROM keys at multiples of this many: a rule of
# the sequence's own length, so still independent of the batch. Long sequences come in small
# batches; B1 x 32768 with 2048-key splits ran 16 splits x 8 kv heads, half the resident program
# slots (55.2 % of copy against 70.5 % in the default mode, which picks 1024 there).
_INVARIANT_LONG_SPLIT_TOKENS = 1024
_INVARIANT_LONG_FROM = 16384
# Largest split-KV workspace (partial outputs and LSEs, float32); larger calls combine their
# splits inside each program instead (same algebra, same bits, no workspace).
_WORKSPACE_BYTES = 256 * 2**20
# Partial states the combine kernel merges as a group: a sequence's splits in order, padded with
# empty partials to a multiple of it (an empty partial leaves the merge state's bits unchanged,
# so the attention kernel's in-program merge, which merges only the splits its key loop
# reaches, gives the same bits).
_MERGE_GROUP = 4
# The combine kernel's blocking (``_combine_blocking``). A program merges one token's
# [BLOCK_H, DV_BLOCK] slab of the output (BLOCK_H heads, DV_BLOCK of the padded value columns),
# loading LOAD_SPLITS partials of it an iteration, one iteration ahead of their merges. Calls
# whose whole-row programs cover the SMs (many tokens) keep the blocking they had: rows of
# _COMBINE_TILE // Dv heads, 4 floats a thread, 4 partials an iteration. Fewer tokens halve
# BLOCK_H, then DV_BLOCK (down to _COMBINE_MIN_DV_BLOCK), until the programs cover the SMs, with
# a warp per 32 floats of the slab (8 at most) and _COMBINE_FEW_LOAD_SPLITS partials an
# iteration: a program's time is its chain of loads and merges over the splits, not its share
# of the bytes. Why: on an H100 (Nsight Compute, one warm launch, caches flushed, 2026-11-23)
# the combine of B1 x 32768 (Hq 32, D 128, 32 splits) ran 8 programs of 4 heads, 15.65 us for
# 0.54 MB (occupancy 6 %) beside 54.2 us of attention, and MLA B1 x 32768 H128 (latent 512, 64
# splits) 128 programs of one head, 24.4 us for 16.8 MB (20 % of DRAM throughput) beside 48.4 us.
# H100, 2026-11-24 (tune.py combine_b1 / combine_mla_b1, the whole op in graph replays;
# results/tune-NVIDIA-H100-80GB-HBM3-2026-11-24-combine.txt): B1 x 32768 attention, 128 programs
# of [1, 32] (1 warp), 16 partials an iteration: 55.05 us against 62.84 with whole rows (8
# programs; 4, 8 partials: 55.46, 55.30); MLA B1 x 32768 H128: whole rows (128 programs of one
# head, one iteration ahead) 51.33 us against 53.87 for 256 programs of [1, 256]. So whole rows
# wherever they cover half the SMs. sm_90, Triton 3.6: 128 and 153 registers, no spills; at most
# 206 (a [2, 128] slab with sinks and lse; 233 with 2 floats a thread); whole rows, 4 partials: 56-66.
_COMBINE_TILE = 512
_COMBINE_MIN_DV_BLOCK = 32
_COMBINE_FEW_LOAD_SPLITS = 16
# Partials an iteration of whole-row programs that cover half the SMs but not all of them (MLA B1
# x 32768 H128: 128 programs of one head over 64 splits; with 4 partials an iteration, 16
# iterations, each a memory latency, took 8.3 us of the op's 41.1 in eager calls, torch.profiler,
# H100, 2026-11-26, results/gpu-2026-11-26e/logs/kernels.txt). tune.py combine_mla_rows, graph
# replays of the op, same day (logs/tune-combine.txt): 4 partials 42.39 us, 8 40.70, 16 40.39;
# the combine 6.3 us at 16 (logs/kernels-2.txt). 238 registers at 16, no spills (sm_90 SASS).
_COMBINE_ROW_LOAD_SPLITS = 16
_COMBINE_MIN_PROGRAMS: int | None = None  # programs to cover; None: the SM count (tests set it)
# Programmatic dependent launch of the combine kernel (compute capability >= 9, CUDA launches
# on the cached path, ``_launch.without_pdl``): the split-KV attention kernel signals once its
# key loop is done that its dependents may launch (griddepcontrol.launch_dependents); the combine
# kernel's programs are then launched while the attention kernel ends and wait (griddepcontrol.
# wait: every program of the attention kernel finished, its writes visible) before they read a
# partial, taking the second launch off the op's critical path. Under tracing (Inductor,
# AOTInductor, wrap_triton) both kernels run without it. H100, CUDA-graph replays, us, off /
# signal at the start of the kernel / after the key loop (tune.py pdl_*, two runs of 2026-11-26,
# results/gpu-2026-11-26/tune-pdl.txt, tune-pdl-2.txt; the signal at the start since removed):
# decode B1 x 32768 55.03, 55.01 / 61.45, 61.41 / 54.26; B8 x 8192 Hq64 98.13, 98.04 / 96.91,
# 97.10 / 97.84; MLA B128 x 4096 H16 222.67, 224.05 / 221.87, 221.22 / 222.48; MLA B32 x 8192 H16
# 117.83, 117.95 / 117.19, 117.98 / 116.27. At the start it cost B1 12 % (not profiled: the
# combine kernel's 128 programs then sat resident beside the attention kernel's 256 for its whole
# run); after the key loop it gains 0.2-1.4 % on each shape. The narrow Gluon MLA kernels
# (mla_sm90_narrow, mla_sm90_fp8) signal after their key loops too (B32 x 8192 H16: 112.82 with,
# 113.44 off); the wide one does not, so its combine kernel launches without PDL (B1 x 32768 H128:
# 43.10 off, 43.68 with PDL and no signal; signalling after the key loop of its left warpgroup
# 49.28 / 48.67 against 43.18 / 43.21 off, gpu-2026-11-26c/logs/pdl-probe.txt).
_PDL = True
# Split size meaning "no split": one range covers every key position (sequences < 2^28 keys).
_NO_SPLIT = 2**28
# A position bound no mask reaches (positions stay below 2^28).
_NO_LIMIT = tl.constexpr(2**29)


def _interpreting() -> bool:  # read per call, as Triton reads it per launch
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interpreted() -> bool:
    """True when triton.jit produced interpreter functions (TRITON_INTERPRET=1 when the kernels
    were defined): no environment read on the launch path."""
    return not isinstance(_attention_kernel, triton.runtime.jit.JITFunction)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def use_pdl(device: torch.device) -> bool:
    """Whether a kernel that follows another on ``device`` may be launched with programmatic
    dependent launch (``_PDL``): compiled kernels on a CUDA device of compute capability >= 9."""
    return (_PDL and device.type == "cuda" and gdc_wait is not None and not _interpreted()
            and torch.cuda.get_device_capability(device)[0] >= 9)


def pdl_options(pdl: bool) -> dict:
    """The launch arguments for ``pdl`` (``use_pdl``) of a kernel that takes programmatic dependent
    launch (the combine kernel, the narrow MLA kernels). Every launch passes USE_PDL (no default in
    the kernels' signatures: ``wrap_triton`` wants every parameter given)."""
    return {"USE_PDL": True, "launch_pdl": True} if pdl else {"USE_PDL": False}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # the interpreter runs programs one after another
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


def supports(op: str, facts: dict) -> str | None:
    """None when the Triton kernel runs this call, else why it cannot (the reference runs it)."""
    if op != "paged_attention":
        return f"the Triton paged_attention module has no kernel for {op}"
    for name in ("head_size", "head_size_v"):
        size = facts.get(name, 0)
        if size % 8 != 0 or not 8 <= size <= 256:
            return f"{name} {size} is not a multiple of 8 in [8, 256]"
    if facts.get("cache_dtype") in _FP8 and facts.get("device") == "cuda" and not _interpreting():
        if torch.cuda.get_device_capability() < (8, 9):
            return "fp8 caches need compute capability 8.9 or newer in Triton"
    return None


@triton.jit
def _floor_div(a, c):
    """Python's ``a // c`` for ``c > 0`` and any sign of ``a`` (Triton's ``//`` truncates)."""
    q = a // c
    return tl.where(a - q * c < 0, q - 1, q)


@triton.jit
def _position_mask(visible, offs_n, pos, chunk_row, window_left, window_right, chunk_size,
                   CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr):
    """``visible`` [len(pos), len(offs_n)] and each position rule that is on: key position
    ``offs_n[j]`` visible to the row at position ``pos[i]`` (causal, window, the chunk starting at
    ``chunk_row[i]``). The caller's ``visible`` holds ``offs_n < pos + _NO_LIMIT`` (its shape)."""
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= pos[:, None])
    if USE_WINDOW:
        visible = visible & (offs_n[None, :] >= pos[:, None] - window_left)
        visible = visible & (offs_n[None, :] <= pos[:, None] + window_right)
    if USE_CHUNK:
        visible = visible & (offs_n[None, :] >= chunk_row[:, None])
        visible = visible & (offs_n[None, :] < chunk_row[:, None] + chunk_size)
    return visible


@triton.jit
def _find_sequence(query_start_loc_ptr, stride_qsl, num_seqs, target, BLOCK_Q: tl.constexpr):
    """Largest ``b`` in ``[0, num_seqs]`` with ``qsl[b] // BLOCK_Q + b <= target`` (``num_seqs``: past
    the last sequence); ``BLOCK_Q == 0`` searches ``qsl[b] <= target``, the sequence of a token."""
    lo = tl.zeros([], dtype=tl.int32)
    hi = num_seqs + 1
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid * stride_qsl)
        if BLOCK_Q > 0:
            key = start // BLOCK_Q + mid
        else:
            key = start
        if key <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_block_ids(block_row_ptr, stride_bt_block, start, seq_len, max_blocks, BLOCK_SIZE: tl.constexpr,
                    TILE_N: tl.constexpr, ALIGNED: tl.constexpr = False):
    """Cache block of key positions ``start .. start + TILE_N - 1``: [TILE_N] int32, -1 for
    positions past ``seq_len`` or past the block table (those are never read). ``ALIGNED``: the
    caller's ``start`` is a multiple of ``TILE_N`` and at least 0, so where ``BLOCK_SIZE``
    divides ``TILE_N`` the block index is one scalar division plus a constant pattern instead of
    a signed division per key (the prefill kernel; decode keeps the per-key form, see
    ``_DECODE_CONFIGS``)."""
    offs_n = start + tl.arange(0, TILE_N)
    if ALIGNED and TILE_N % BLOCK_SIZE == 0:
        block_idx = start // BLOCK_SIZE + tl.arange(0, TILE_N) // BLOCK_SIZE
    else:
        block_idx = offs_n // BLOCK_SIZE
    in_seq = (offs_n < seq_len) & (block_idx < max_blocks)
    return tl.load(block_row_ptr + block_idx * stride_bt_block, mask=in_seq, other=-1)


@triton.jit
def _load_rows(base_ptr, rows, offs, row_ok, SIZE: tl.constexpr, PAD: tl.constexpr):
    """``base[rows[i] + j]`` for ``j < SIZE``: [len(rows), PAD], 0 where masked. Without padding
    the mask is per row only, so the loads stay 16-byte vectors."""
    if SIZE == PAD:
        return tl.load(base_ptr + rows[:, None] + offs[None, :], mask=row_ok[:, None], other=0.0)
    return tl.load(base_ptr + rows[:, None] + offs[None, :], mask=row_ok[:, None] & (offs < SIZE)[None, :], other=0.0)


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b``; ``UPCAST`` multiplies in float32, for the CPU interpreter (Triton 3.9), whose
    bf16 ``tl.dot`` returns garbage of order 1e10."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _abs_max(x):
    """max |x| over a 2-D tile, float32."""
    return tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0)


@triton.jit
def _fp16_exponent(amax):
    """Power of two ``2^e`` that brings ``amax`` into [2^14, 2^15) (1 for 0).

    bf16 and fp16 share no fast conversion, but fp8 converts to fp16 in one instruction: a bf16
    query tile times ``2^-e`` is an fp16 tile, exact for every element above fp16's normal range
    floor (2^-28 of the tile's largest, far below bf16's 2^-8 precision), so an fp8 cache runs its
    dots in fp16 and the scores are multiplied back by ``2^e``."""
    e = tl.where(amax > 0, tl.floor(tl.log2(amax)) - 14.0, 0.0)
    return tl.exp2(tl.minimum(tl.maximum(e, -100.0), 100.0))


@triton.jit
def _fp8_to_fp16(x, unit):
    """An fp8 value tile as fp16 (exact), converted in the layout it was loaded in.

    ``unit`` is 1.0 from a kernel argument: multiplying by it changes no bit, but the compiler
    cannot see through it, so Triton does not move the conversion below the change to the dot's
    operand layout (it hoists that change through plain elementwise code up to the load). Moved,
    the conversion reads the fp8 tile from shared memory one byte per instruction where the
    operand is key-major, as the values of ``P @ V`` are (ldmatrix has no 8-bit transpose on
    sm_90); here the fp16 tile goes through shared memory in 16-byte stores and transposing
    ldmatrix. Decode B64 x 4096 on sm_90, Triton 3.6 (``benchmarks/sass_report.py``): 128
    ``LDS.U8`` and 255 registers with an 88-byte stack a 128 x 128 tile, against none and 168
    registers, for 64 ``HMUL2``."""
    return x.to(tl.float16) * tl.cast(unit, tl.float16)


@triton.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens", "long_split_tokens",
                              "long_from", "num_splits"])
def _attention_kernel(
    query_ptr,  # [T, Hq, D]
    key_cache_ptr, value_cache_ptr,  # [NB, BS, Hkv, D], [NB, BS, Hkv, Dv]
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
    out_ptr, lse_ptr,  # [T, Hq, Dv]; [T, Hq] float32 (HAS_LSE)
    alibi_slopes_ptr, sinks_ptr,  # [Hq] float32 (USE_ALIBI); [Hq] (HAS_SINKS)
    k_scale_ptr, v_scale_ptr,  # [] or [1] float32 (IS_FP8)
    part_out_ptr, part_lse_ptr,  # [T, S, Hq, Dv], [T, S, Hq] float32, lse in log2 (WRITE_PARTIAL)
    scale, softcap, window_left, window_right, chunk_size,  # float, float, int, int, int
    unit,  # 1.0 (_fp8_to_fp16)
    split_tokens, long_split_tokens, long_from,  # split size; sequences longer than long_from: the second
    num_splits, num_tokens, num_seqs, num_blocks, max_blocks,
    stride_q_tok, stride_q_head,
    stride_kc_block, stride_kc_slot, stride_kc_head,
    stride_vc_block, stride_vc_slot, stride_vc_head,
    stride_bt_seq, stride_bt_block,
    stride_sl, stride_qsl,
    stride_o_tok, stride_o_head,
    stride_lse_tok, stride_lse_head,
    stride_po_tok, stride_po_split, stride_po_head,
    stride_pl_tok, stride_pl_split,
    GROUP: tl.constexpr, HEADS: tl.constexpr, NUM_HEAD_GROUPS: tl.constexpr,  # heads per kv head / program
    HEAD_SIZE: tl.constexpr, HEAD_SIZE_V: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr,
    IS_FP8: tl.constexpr, HAS_LSE: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    ONE_SPLIT: tl.constexpr,  # at most one split, merged in the program (no workspace)
    USE_PDL: tl.constexpr,  # the combine kernel may launch once the key loop is done (_PDL)
    HEADS_FASTEST: tl.constexpr,  # grid (kv head x head group, query block, split) (_DECODE_GRID)
    SCORE_WARPS: tl.constexpr,  # the scores' dot batched over this many warps (1: one dot; _score_warps)
):
    tl.static_assert(BLOCK_M >= 16 and TILE_N >= 16 and D_PAD >= 16 and DV_PAD >= 16)
    tl.static_assert(BLOCK_Q * HEADS <= BLOCK_M and BLOCK_Q >= 1)
    scale = tl.cast(scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    pid_q = tl.program_id(1) if HEADS_FASTEST else tl.program_id(0)
    pid_h = tl.program_id(0) if HEADS_FASTEST else tl.program_id(1)
    kv_head = pid_h // NUM_HEAD_GROUPS
    head_group = pid_h % NUM_HEAD_GROUPS
    pid_s = tl.program_id(2)

    # -- which sequence, which of its query blocks; slots past the last sequence own the padding
    #    rows (a pseudo-sequence with no keys and no sink) --
    # The search of ``_find_sequence``, written out: a store address derived from the result of
    # a function that takes a pointer makes Inductor's kernel analysis count that pointer as
    # written, and query_start_loc would be cloned and copied back around every launch (and
    # CUDA graphs skipped for mutating an input).
    lo = tl.zeros([], dtype=tl.int32)
    hi = num_seqs + 1
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    seq = tl.maximum(lo - 1, 0)
    is_seq = seq < num_seqs
    if WRITE_PARTIAL:
        if seq >= num_seqs:
            return  # the combine kernel writes the padding rows
    q_start = tl.load(query_start_loc_ptr + seq * stride_qsl)
    q_end = tl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=is_seq, other=0)
    q_end = tl.where(is_seq, q_end, num_tokens)
    seq_len = tl.load(seq_lens_ptr + seq * stride_sl, mask=is_seq, other=0)
    q_len = q_end - q_start
    q_block_start = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if (q_block_start < 0) | (q_block_start >= q_len):
        return
    context = seq_len - q_len

    # -- rows: query token (row // HEADS) x query head (row % HEADS) of this kv head --
    offs_m = tl.arange(0, BLOCK_M)
    local = q_block_start + offs_m // HEADS
    head_in_group = head_group * HEADS + offs_m % HEADS
    head = kv_head * GROUP + head_in_group
    tok = q_start + local
    row_ok = (offs_m // HEADS < BLOCK_Q) & (head_in_group < GROUP) & (local < q_len)
    row_ok = row_ok & (tok >= 0) & (tok < num_tokens)
    pos = context + local  # [BLOCK_M] absolute position of each row's token
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    dv_ok = offs_dv < HEAD_SIZE_V

    # -- load Q once: [BLOCK_M, D_PAD] --
    q_rows = tok.to(tl.int64) * stride_q_tok + head * stride_q_head
    q = _load_rows(query_ptr, q_rows, offs_d, row_ok, HEAD_SIZE, D_PAD)
    qk_scale = scale
    v_scale = 1.0
    if IS_FP8:  # fold the per-tensor scales into the score scale and the output
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
        if q.dtype == tl.bfloat16:  # dots in fp16, fp8's one-instruction conversion target
            q_unit = _fp16_exponent(_abs_max(q))
            if SCORE_WARPS > 1 and not DOT_UPCAST:
                # The same tile (a power of two times bf16 is exact in bf16), loaded again: Triton
                # moves the query operand's layout change up to a load only through casts and
                # bf16 arithmetic, not through the float32 division or an operand ``_abs_max`` reads,
                # and would otherwise keep the operand in shared memory (see SCORE_WARPS).
                q = _load_rows(query_ptr, q_rows, offs_d, row_ok, HEAD_SIZE, D_PAD)
                q = (q * tl.cast(1.0 / q_unit, tl.bfloat16)).to(tl.float16)
            else:  # (the interpreter's bf16 arithmetic is wrong: DOT_UPCAST)
                q = (q.to(tl.float32) / q_unit).to(tl.float16)
            qk_scale = qk_scale * q_unit
    if not (USE_SOFTCAP or USE_ALIBI):
        qk_scale = qk_scale * LOG2E
    if USE_ALIBI:
        slopes = tl.load(alibi_slopes_ptr + head, mask=row_ok, other=0.0)

    # -- keys this query block can see: [kv_lo, kv_hi) --
    p_first = context + q_block_start
    p_last = context + tl.minimum(q_block_start + BLOCK_Q, q_len) - 1
    kv_lo = 0
    kv_hi = tl.minimum(seq_len, max_blocks * BLOCK_SIZE)
    if CAUSAL:
        kv_hi = tl.minimum(kv_hi, p_last + 1)
    if USE_WINDOW:
        kv_lo = tl.maximum(kv_lo, p_first - window_left)
        kv_hi = tl.minimum(kv_hi, p_last + window_right + 1)
    chunk_row = pos  # (read only where USE_CHUNK)
    if USE_CHUNK:
        chunk_first = _floor_div(p_first, chunk_size) * chunk_size
        kv_lo = tl.maximum(kv_lo, chunk_first)
        kv_hi = tl.minimum(kv_hi, (_floor_div(p_last, chunk_size) + 1) * chunk_size)
        chunk_row = _floor_div(pos, chunk_size) * chunk_size  # [BLOCK_M] first key of each row's chunk
    # -- keys every row of the block sees by position: [full_lo, full_hi), no mask needed --
    full_lo = 0
    full_hi = p_first + _NO_LIMIT
    if CAUSAL:
        full_hi = tl.minimum(full_hi, p_first + 1)
    if USE_WINDOW:
        full_lo = tl.maximum(full_lo, p_last - window_left)
        full_hi = tl.minimum(full_hi, p_first + window_right + 1)
    if USE_CHUNK:
        full_lo = tl.maximum(full_lo, _floor_div(p_last, chunk_size) * chunk_size)
        full_hi = tl.minimum(full_hi, chunk_first + chunk_size)

    # -- splits: this program's one (WRITE_PARTIAL) or all of the sequence's, merged in order --
    split_tokens = tl.where(seq_len > long_from, long_split_tokens, split_tokens)
    if WRITE_PARTIAL:
        seq_splits = tl.minimum((tl.maximum(seq_len, 0) + split_tokens - 1) // split_tokens, num_splits)
        if pid_s >= seq_splits:
            return  # the combine kernel reads only the splits below seq_splits
        lo = tl.maximum(kv_lo, pid_s * split_tokens) // TILE_N * TILE_N
        hi = tl.minimum(kv_hi, (pid_s + 1) * split_tokens)
    else:
        lo = kv_lo // TILE_N * TILE_N
        hi = kv_hi
    merged_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    merged_l = tl.zeros([BLOCK_M], tl.float32)
    merged_acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    if HAS_SINKS and not WRITE_PARTIAL:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=float("-inf")).to(tl.float32)
        sink = tl.where(is_seq, sink, float("-inf"))  # padding rows: 0 and -inf, no sink
        merged_m, merged_l, merged_acc = merge_partial(
            merged_m, merged_l, merged_acc, sink * LOG2E, tl.zeros([BLOCK_M, DV_PAD], tl.float32)
        )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)

    # One key loop over [lo, hi). A program that merges several splits itself (neither
    # WRITE_PARTIAL nor ONE_SPLIT) folds each split's partial into the merge state at the
    # split's end, inside the loop, and starts the next split from the empty state: the
    # operations and order of one loop per split (splits end at multiples of the tile; a split
    # without keys merges as a no-op: an empty partial leaves the state's bits unchanged),
    # without restarting the loads' pipeline and the block-id prefetch at every split. H100,
    # 2026-11-26, fp8 B64 x 4096 in batch-invariant mode (two splits a program), graph / eager
    # over the default mode: one loop per split +5.3 % / +4.1 %, one loop -0.4 % / -0.2 %
    # (benchmarks/results/gpu-2026-11-26f/logs/bench/ and bench-attn2/, paged_attention.txt).
    boundary = (lo // split_tokens + 1) * split_tokens  # the end of the split holding lo
    # Block ids are fetched one tile ahead: the K/V addresses depend on them, and a load
    # issued in the same iteration would add a second memory latency to every tile.
    next_block = _load_block_ids(block_table_ptr + seq * stride_bt_seq, stride_bt_block, lo, seq_len,
                                 max_blocks, BLOCK_SIZE, TILE_N)
    if SCORE_WARPS > 1:  # the query tile once per warp: [SCORE_WARPS, BLOCK_M, D_PAD]
        q_w = tl.broadcast_to(q[None, :, :], [SCORE_WARPS, BLOCK_M, D_PAD])
    for start in range(lo, hi, TILE_N):
        if not WRITE_PARTIAL and not ONE_SPLIT:
            if start >= boundary:  # the first tile of the next split
                part_out, part_lse = state_to_partial(m_i, l_i, acc)
                merged_m, merged_l, merged_acc = merge_partial(merged_m, merged_l, merged_acc, part_lse, part_out)
                m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_M], tl.float32)
                acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
                boundary += split_tokens
        # -- block-table lookup: [TILE_N] --
        offs_n = start + tl.arange(0, TILE_N)
        block = next_block
        next_block = _load_block_ids(block_table_ptr + seq * stride_bt_seq, stride_bt_block, start + TILE_N,
                                     seq_len, max_blocks, BLOCK_SIZE, TILE_N)
        key_ok = (block >= 0) & (block < num_blocks)  # -1: past the sequence or the table
        block = tl.where(key_ok, block, 0).to(tl.int64)
        slot = offs_n % BLOCK_SIZE

        # -- load K tile: [TILE_N, D_PAD] --
        k_rows = block * stride_kc_block + slot * stride_kc_slot + kv_head * stride_kc_head
        k = _load_rows(key_cache_ptr, k_rows, offs_d, key_ok, HEAD_SIZE, D_PAD)
        if IS_FP8:  # exact: fp8 values are fp16 values; the scale is in qk_scale
            k = k.to(tl.float16)
        k = k.to(q.dtype)  # fp32 queries: exact too

        # -- scores: scale, softcap, ALiBi, mask (log2 domain): [BLOCK_M, TILE_N] --
        if SCORE_WARPS > 1:  # warp w: the keys w * KEYS .. (w + 1) * KEYS - 1, KEYS = TILE_N / SCORE_WARPS
            k_w = tl.reshape(k, [SCORE_WARPS, TILE_N // SCORE_WARPS, D_PAD])
            s_w = _dot(q_w, tl.trans(k_w, (0, 2, 1)), None, DOT_PRECISION, DOT_UPCAST)
            s = tl.reshape(tl.permute(s_w, (1, 0, 2)), [BLOCK_M, TILE_N]) * qk_scale
        else:
            s = _dot(q, tl.trans(k), None, DOT_PRECISION, DOT_UPCAST) * qk_scale
        if USE_SOFTCAP:
            # softcap * tanh(s / softcap), tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) in
            # (0, 1]: no overflow for any score.
            x = s / softcap
            e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))
            t = (1.0 - e) / (1.0 + e)
            s = softcap * tl.where(x < 0, -t, t)
        if USE_ALIBI:
            s = s + slopes[:, None] * (offs_n[None, :] - pos[:, None]).to(tl.float32)
        if USE_SOFTCAP or USE_ALIBI:
            s = s * LOG2E
        if CAUSAL or USE_WINDOW or USE_CHUNK:
            # Position masks only where some row of the block sees part of the tile; rows
            # outside the block's tokens (never stored) see every key and stay finite.
            if (start < full_lo) | (start + TILE_N > full_hi):
                visible = _position_mask(offs_n[None, :] < pos[:, None] + _NO_LIMIT, offs_n, pos, chunk_row,
                                         window_left, window_right, chunk_size, CAUSAL, USE_WINDOW, USE_CHUNK)
                s = tl.where(visible, s, float("-inf"))
        s = tl.where(key_ok[None, :], s, float("-inf"))

        # -- online softmax --
        m_i, l_i, acc, p = softmax_step(m_i, l_i, acc, s)

        # -- load V tile: [TILE_N, DV_PAD]; acc += P @ V --
        v_rows = block * stride_vc_block + slot * stride_vc_slot + kv_head * stride_vc_head
        v = _load_rows(value_cache_ptr, v_rows, offs_dv, key_ok, HEAD_SIZE_V, DV_PAD)
        if IS_FP8:
            v = _fp8_to_fp16(v, unit)
        acc = _dot(p.to(q.dtype), v.to(q.dtype), acc, DOT_PRECISION, DOT_UPCAST)

    if USE_PDL:  # the key loop is done (_PDL)
        gdc_launch_dependents()
    # -- the (last) split's partial state: store it, or merge it into the running result --
    part_out, part_lse = state_to_partial(m_i, l_i, acc)
    if WRITE_PARTIAL:
        po_rows = tok.to(tl.int64) * stride_po_tok + pid_s * stride_po_split + head * stride_po_head
        tl.store(part_out_ptr + po_rows[:, None] + offs_dv[None, :], part_out, mask=row_ok[:, None] & dv_ok[None, :])
        pl_rows = tok.to(tl.int64) * stride_pl_tok + pid_s * stride_pl_split + head
        tl.store(part_lse_ptr + pl_rows, part_lse, mask=row_ok)
    else:
        merged_m, merged_l, merged_acc = merge_partial(merged_m, merged_l, merged_acc, part_lse, part_out)
    if not WRITE_PARTIAL:
        # -- epilogue: out [BLOCK_M, DV_PAD] and lse [BLOCK_M], natural log --
        out, lse = merged_to_output(merged_m, merged_l, merged_acc, v_scale)
        o_rows = tok.to(tl.int64) * stride_o_tok + head * stride_o_head
        tl.store(out_ptr + o_rows[:, None] + offs_dv[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dv_ok[None, :])
        if HAS_LSE:
            tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_tok + head * stride_lse_head, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_tokens", "num_seqs", "split_tokens", "long_split_tokens", "long_from",
                              "num_splits"])
def _combine_kernel(
    part_out_ptr, part_lse_ptr,  # [T, S, Hq, Dv] float32 (MLA's narrow kernels: bf16/fp16); [T, S, Hq] float32,
    # lse in log2
    seq_lens_ptr, query_start_loc_ptr,  # [B], [B + 1] int32
    sinks_ptr, v_scale_ptr,  # [Hq] (HAS_SINKS); [] or [1] float32 (IS_FP8)
    out_ptr, lse_ptr,  # [T, Hq, Dv]; [T, Hq] float32 (HAS_LSE)
    split_tokens, long_split_tokens, long_from,  # as in _attention_kernel
    num_splits, num_tokens, num_seqs, num_heads,
    stride_sl, stride_qsl,
    stride_po_tok, stride_po_split, stride_po_head,
    stride_pl_tok, stride_pl_split,
    stride_o_tok, stride_o_head,
    stride_lse_tok, stride_lse_head,
    HEAD_SIZE_V: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_H: tl.constexpr, DV_BLOCK: tl.constexpr,
    HAS_SINKS: tl.constexpr, IS_FP8: tl.constexpr, HAS_LSE: tl.constexpr, MERGE_GROUP: tl.constexpr,
    LOAD_SPLITS: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched before the attention kernel finished (_PDL)
    ALL_SPLITS: tl.constexpr,  # every token's num_splits partials were written (empty ones -inf, 0)
):
    """Merge the ``seq_splits`` partial states of one token, for ``BLOCK_H`` heads and ``DV_BLOCK``
    value columns, in split order. Grid: axis 0 token, axis 1 head block, axis 2 column block
    (``_combine_blocking``). Every program of a head recomputes its merge weights from the same
    lse values, so an element's arithmetic does not depend on the blocking; the lse is stored by
    column block 0. Rows past ``qsl[-1]`` get 0 and -inf."""
    tok = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    column_block = tl.program_id(2)
    head_ok = heads < num_heads
    offs_dv = column_block * DV_BLOCK + tl.arange(0, DV_BLOCK)
    mask = head_ok[:, None] & (offs_dv[None, :] < HEAD_SIZE_V)
    tl.static_assert(DV_PAD % DV_BLOCK == 0)
    if ALL_SPLITS:  # no lookup (a chain of dependent loads): merging an empty partial changes no bit
        is_seq = tok < tl.load(query_start_loc_ptr + num_seqs * stride_qsl)
        seq_splits = num_splits
    else:
        # qsl[0] == 0, so only a malformed table gives -1 here; such rows read a valid split index
        seq = tl.maximum(_find_sequence(query_start_loc_ptr, stride_qsl, num_seqs, tok, 0), 0)
        is_seq = seq < num_seqs
        seq_len = tl.load(seq_lens_ptr + seq * stride_sl, mask=is_seq, other=0)
        split_tokens = tl.where(seq_len > long_from, long_split_tokens, split_tokens)
        seq_splits = tl.minimum((tl.maximum(seq_len, 0) + split_tokens - 1) // split_tokens, num_splits)
    v_scale = 1.0
    if IS_FP8:
        v_scale = tl.load(v_scale_ptr)

    merged_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    merged_l = tl.zeros([BLOCK_H], tl.float32)
    merged_acc = tl.zeros([BLOCK_H, DV_BLOCK], tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=head_ok, other=float("-inf")).to(tl.float32)
        sink = tl.where(is_seq, sink, float("-inf"))  # padding rows: 0 and -inf, no sink
        merged_m, merged_l, merged_acc = merge_partial(
            merged_m, merged_l, merged_acc, sink * LOG2E, tl.zeros([BLOCK_H, DV_BLOCK], tl.float32)
        )
    po_base = part_out_ptr + tok.to(tl.int64) * stride_po_tok + heads[:, None] * stride_po_head + offs_dv[None, :]
    pl_base = part_lse_ptr + tok.to(tl.int64) * stride_pl_tok + heads
    # LOAD_SPLITS partials loaded per iteration, one iteration before they are merged (the first
    # ones before the loop), so they are in flight while the previous ones merge. Merging
    # partials in the iteration that loads them waited two memory latencies per iteration on
    # sm_90: ptxas issued the partial outputs' loads after the exp2 of their lse (Triton 3.6
    # SASS of B1 x 32768). Merges go in whole groups of MERGE_GROUP, in split order, splits past
    # seq_splits as empty partials, exactly as the attention kernel merges them; loads past
    # seq_splits are masked (no memory traffic).
    tl.static_assert(MERGE_GROUP == 4 and LOAD_SPLITS % MERGE_GROUP == 0)
    if USE_PDL:  # everything above reads the call's inputs; the partials are the attention kernel's
        gdc_wait()
    parts = _load_partials(pl_base, po_base, seq_splits, stride_pl_split, stride_po_split, head_ok, mask,
                           LOAD_SPLITS)
    for split in range(0, seq_splits, LOAD_SPLITS):
        # -- the next LOAD_SPLITS partials' loads, then these ones' merges --
        upcoming = _load_partials(
            pl_base + (split + LOAD_SPLITS) * stride_pl_split, po_base + (split + LOAD_SPLITS) * stride_po_split,
            seq_splits - split - LOAD_SPLITS, stride_pl_split, stride_po_split, head_ok, mask, LOAD_SPLITS)
        for group in tl.static_range(0, LOAD_SPLITS, MERGE_GROUP):
            if split + group < seq_splits:
                for k in tl.static_range(group, group + MERGE_GROUP):
                    merged_m, merged_l, merged_acc = merge_partial(
                        merged_m, merged_l, merged_acc, parts[2 * k], parts[2 * k + 1])
        parts = upcoming

    out, lse = merged_to_output(merged_m, merged_l, merged_acc, v_scale)
    o_ptrs = out_ptr + tok.to(tl.int64) * stride_o_tok + heads[:, None] * stride_o_head + offs_dv[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    if HAS_LSE:
        if column_block == 0:  # the same lse in every column block: one stores it
            tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_tok + heads * stride_lse_head, lse, mask=head_ok)


@triton.jit
def _load_partials(pl_ptr, po_ptr, left, stride_pl_split, stride_po_split, head_ok, mask, COUNT: tl.constexpr):
    """The ``COUNT`` partial states from the split at ``pl_ptr`` / ``po_ptr`` on, each as
    ``_load_partial``: the tuple ``(lse0, out0, lse1, out1, ..)``, empty past the ``left`` splits
    that remain."""
    parts = ()
    for k in tl.static_range(COUNT):
        parts = parts + _load_partial(pl_ptr, po_ptr, k, left, stride_pl_split, stride_po_split, head_ok, mask)
    return parts


@triton.jit
def _load_partial(pl_ptr, po_ptr, k, left, stride_pl_split, stride_po_split, head_ok, mask):
    """Partial state ``k`` splits on of ``[BLOCK_H]`` heads: ``(lse [BLOCK_H], out [BLOCK_H, DV_BLOCK])``;
    an empty one (-inf, 0) when only ``left <= k`` splits remain."""
    in_range = (tl.zeros_like(head_ok.to(tl.int32)) + k) < left
    part_lse = tl.load(pl_ptr + k * stride_pl_split, mask=head_ok & in_range, other=float("-inf"))
    part_out = tl.load(po_ptr + k * stride_po_split, mask=mask & in_range[:, None], other=0.0).to(tl.float32)
    return part_lse, part_out


def _pad(size: int) -> int:
    return max(16, next_power_of_2(size))


def _combine_blocking(num_tokens: int, num_heads: int, dv_pad: int, num_splits: int,
                      device: torch.device, tile: int = 0) -> tuple[tuple[int, int, int], dict]:
    """``(grid, constants)`` of the combine kernel for ``num_tokens`` tokens of ``num_heads``
    heads whose value columns are padded to ``dv_pad`` (a power of two), ``num_splits`` splits:
    ``BLOCK_H``, ``DV_BLOCK``, ``LOAD_SPLITS`` and ``num_warps``, from shapes only (see
    ``_COMBINE_TILE``). A ``tile`` above ``_COMBINE_TILE`` (MLA's ``mla._COMBINE_TILE``) lets
    whole-row programs take up to ``tile // dv_pad`` heads, as many as still leave a program for
    every SM. The blocking decides which program computes an element and when its partials are
    loaded, never how it is computed: every blocking gives the same bits."""
    block_h = max(1, min(next_power_of_2(num_heads), _COMBINE_TILE // dv_pad))
    dv_block = dv_pad
    want = _COMBINE_MIN_PROGRAMS if _COMBINE_MIN_PROGRAMS is not None else _num_sms(device)
    wide = min(next_power_of_2(num_heads), tile // dv_pad)
    while wide > block_h and num_tokens * cdiv(num_heads, wide) < want:
        wide //= 2
    block_h = max(block_h, wide)
    rows = num_tokens * cdiv(num_heads, block_h)
    if 2 * rows >= want:  # whole rows cover half the SMs: 4 floats a thread
        grid = (num_tokens, cdiv(num_heads, block_h), 1)
        # fewer rows than SMs: each program's chain of loads is the time, so more of them in flight
        load_splits = _MERGE_GROUP if rows >= want else min(_COMBINE_ROW_LOAD_SPLITS,
                                                            cdiv(num_splits, _MERGE_GROUP) * _MERGE_GROUP)
        return grid, dict(BLOCK_H=block_h, DV_BLOCK=dv_block, LOAD_SPLITS=load_splits,
                          num_warps=max(1, min(4, block_h * dv_block // 128)))
    while block_h > 1 and num_tokens * cdiv(num_heads, block_h) < want:
        block_h //= 2
    while dv_block > _COMBINE_MIN_DV_BLOCK and num_tokens * cdiv(num_heads, block_h) * (dv_pad // dv_block) < want:
        dv_block //= 2
    grid = (num_tokens, cdiv(num_heads, block_h), dv_pad // dv_block)
    load_splits = min(_COMBINE_FEW_LOAD_SPLITS, cdiv(num_splits, _MERGE_GROUP) * _MERGE_GROUP)
    return grid, dict(BLOCK_H=block_h, DV_BLOCK=dv_block, LOAD_SPLITS=load_splits,
                      num_warps=max(1, min(8, block_h * dv_block // 32)))  # 1 float a thread up to 256


def _tile_pads(head_size: int, head_size_v: int) -> tuple[int, int]:
    """``(D_PAD, DV_PAD)``, the K and V tile widths of the attention kernels: each head size padded
    to a power of two, except that when both need padding to different widths both tiles take
    the wider one. A workaround, not yet verified on a GPU: Triton 3.6's ptxas (12.8.93; 12.9
    assembles the same PTX correctly) builds, on sm_90, the wgmma descriptors of k-steps 1..3 of
    the P @ V dot from uniform registers that no instruction writes when the K tile
    [TILE_N, 64] (128-byte swizzle) and the V tile [TILE_N, 32] (64-byte swizzle, the same shared
    buffer) are both loaded masked (D 40, Dv 24). Those k-steps read whatever shared memory the
    stale registers point at (the Q tile, in the model that reproduces the H100's errors: rows
    with more than 16 keys off by ~1, LSE exact; benchmarks/results/gpu-tests-2026-11-23-d/
    d40-cause.md). With equal widths the SASS reads no unwritten uniform register
    (``benchmarks/sass_uniform_check.py``); padded columns are masked loads (no memory traffic),
    at the price of a wider P @ V for such head-size pairs."""
    d_pad, dv_pad = _pad(head_size), _pad(head_size_v)
    if d_pad != dv_pad and d_pad != head_size and dv_pad != head_size_v:
        d_pad = dv_pad = max(d_pad, dv_pad)
    return d_pad, dv_pad


def _tokens_per_seq(num_tokens: int, num_seqs: int, max_query_len: int) -> int:
    """Query tokens a sequence is planned for: the hint ``max_query_len`` (> 0), else the mean,
    rounded up (a shape: exact for uniform speculative batches)."""
    return max_query_len if max_query_len > 0 else cdiv(num_tokens, max(num_seqs, 1))


def _busy_q_blocks(num_tokens: int, num_seqs: int, block_q: int, max_query_len: int) -> int:
    """Query blocks that hold a token (of ``num_tokens // block_q + num_seqs + 1`` launched), for
    the split-KV plan only (the grid always covers the worst case). A sequence of q tokens fills
    ``cdiv(q, block_q)`` blocks: at most ``(num_tokens + num_seqs * (block_q - 1)) // block_q``
    in all, and ``num_seqs * cdiv(max_query_len, block_q)`` with the hint (> 0). Without a hint,
    the count of a batch of equal query lengths (exact for uniform speculative batches; a batch of
    unequal lengths then gets more splits than it needs, never fewer slots than programs)."""
    upper = min(num_tokens, (num_tokens + num_seqs * (block_q - 1)) // block_q)
    return min(upper, num_seqs * cdiv(_tokens_per_seq(num_tokens, num_seqs, max_query_len), block_q))


def _plan_splits(
    device: torch.device, programs_per_split: int, programs_per_sm: int, capacity: int, tile_n: int,
    partial_bytes_per_split: int, split_tokens: int | None,
) -> tuple[int, int, bool]:
    """``(split_tokens, num_splits, write_partial)`` from shapes only.

    ``split_tokens`` given (batch-invariant mode, tests): split at its multiples. Otherwise split
    until the programs fill the GPU's resident slots once, not below ``_MIN_SPLIT_TILES`` tiles
    a split. Splits go through the workspace unless it would exceed ``_WORKSPACE_BYTES``; then
    each program merges its sequence's splits itself.
    """
    if split_tokens is None:
        slots = _num_sms(device) * programs_per_sm
        splits = min(slots // max(programs_per_split, 1), cdiv(capacity, _MIN_SPLIT_TILES * tile_n))
        splits = min(splits, _WORKSPACE_BYTES // max(partial_bytes_per_split, 1))
        if splits <= 1:
            return _NO_SPLIT, 1, False
        split_tokens = cdiv(capacity, splits)
    split_tokens = cdiv(split_tokens, tile_n) * tile_n
    num_splits = max(cdiv(capacity, split_tokens), 1)
    write_partial = num_splits * partial_bytes_per_split <= _WORKSPACE_BYTES
    return split_tokens, num_splits, write_partial


def _fills_slots(programs: int, device: torch.device, programs_per_sm: int) -> bool:
    """Whether ``programs`` unsplit programs fill the device's resident program slots, so the
    default split planning (``_plan_splits``) would not split them."""
    return _num_sms(device) * programs_per_sm // max(programs, 1) <= 1


class _Workspace:
    """The split-KV workspace of a plan: partial outputs ``[T, S, Hq, Dv]`` (``out_dtype``: float32,
    or the query's dtype for MLA's narrow kernels) and their LSEs ``[T, S, Hq]`` (float32, log2),
    allocated per call by ``tensors`` (two stand-ins, never
    dereferenced, when the plan writes no partials); ``po_strides`` / ``pl_strides`` are the
    strides the kernels take (zeros without a workspace)."""

    def __init__(self, write_partial: bool, num_tokens: int, num_splits: int, num_heads: int, head_size_v: int,
                 device: torch.device, out_dtype: torch.dtype = torch.float32):
        self.shapes = None
        self.po_strides, self.pl_strides = (0, 0, 0), (0, 0)
        self.device, self.out_dtype = device, out_dtype
        if write_partial:
            self.shapes = (num_tokens, num_splits, num_heads, head_size_v), (num_tokens, num_splits, num_heads)
            self.po_strides = contiguous_strides(*self.shapes[0])[:3]
            self.pl_strides = contiguous_strides(*self.shapes[1])[:2]

    def tensors(self, stand_in: Tensor) -> tuple[Tensor, Tensor]:
        if self.shapes is None:
            return stand_in, stand_in
        return (torch.empty(self.shapes[0], dtype=self.out_dtype, device=self.device),
                torch.empty(self.shapes[1], dtype=torch.float32, device=self.device))


def paged_attention(
    query: Tensor, key_cache: Tensor, value_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    **options,
) -> None:
    """Paged attention into ``out`` [T, Hq, Dv] and ``lse`` [T, Hq] (natural log, or None);
    semantics of ``lowering.reference.attention``. Inputs were validated by the op. Options as
    ``prepare_paged_attention``."""
    args = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse)
    prepare_paged_attention(*args, **options)(*args, options)


def prepare_paged_attention(
    query: Tensor, key_cache: Tensor, value_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    *,
    scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
    alibi_slopes: Tensor | None, sinks: Tensor | None, k_scale: Tensor | None, v_scale: Tensor | None,
    attention_chunk_size: int, max_query_len: int = -1, split_tokens: int | None = None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(query, key_cache,
    value_cache, block_table, seq_lens, query_start_loc, out, lse, options)`` with the tensors of
    a call of the same shapes, strides, dtypes, devices and option values, and its options dict
    (whose tensors, ``alibi_slopes``, ``sinks``, ``k_scale``, ``v_scale``, it reads). The tile
    configuration, split plan, grids and every launch argument but the tensors are decided here,
    from shapes only.

    ``split_tokens`` (tests, tuning) forces split-KV at multiples of that many key positions
    (rounded up to the tile), as batch-invariant mode does with its fixed size.
    """
    num_tokens, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    head_size_v = value_cache.shape[3]
    num_seqs, max_blocks = block_table.shape
    if num_tokens == 0 or num_heads == 0:
        return _nothing
    group = num_heads // num_kv_heads
    num_head_groups = cdiv(group, _MAX_HEADS_PER_PROGRAM)
    heads = cdiv(group, num_head_groups)
    invariant = _config.is_batch_invariant()
    forced_split = split_tokens
    if invariant and split_tokens is None:
        split_tokens = _INVARIANT_SPLIT_TOKENS
    decode = invariant or max_query_len == 1 or (max_query_len < 0 and num_tokens <= num_seqs)
    if not decode:  # prefill-like: the Hopper prefill kernel where its table has a tile
        from . import prefill  # imports this module

        tile = prefill.config(query, key_cache, value_cache, block_table, scale, forced_split is not None,
                              max_query_len)
        if tile is not None:
            return prefill.prepare(
                query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, tile,
                scale=scale, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
                alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk_size=attention_chunk_size,
                max_query_len=max_query_len,
            )
    d_pad, dv_pad = _tile_pads(head_size, head_size_v)
    fp8_tile = decode and key_cache.dtype in _FP8 and max(d_pad, dv_pad) in _FP8_DECODE_CONFIGS
    configs = _FP8_DECODE_CONFIGS if fp8_tile else _DECODE_CONFIGS if decode else _PREFILL_CONFIGS
    block_m, tile_n, num_warps, num_stages, programs_per_sm = configs[max(d_pad, dv_pad)]
    if not decode and max_query_len > 0:  # short queries (speculative decoding): fewer empty rows
        block_m = min(block_m, _pad(max_query_len * heads))
    block_m = max(block_m, next_power_of_2(heads))
    block_q = block_m // heads
    num_q_blocks = num_tokens // block_q + num_seqs + 1
    busy_q_blocks = _busy_q_blocks(num_tokens, num_seqs, block_q, max_query_len)
    capacity, partial_bytes = max_blocks * block_size, num_tokens * num_heads * (head_size_v + 1) * 4
    split_tokens, num_splits, write_partial = _plan_splits(
        query.device, busy_q_blocks * num_kv_heads * num_head_groups, programs_per_sm, capacity, tile_n,
        partial_bytes, split_tokens,
    )
    long_split_tokens, long_from = split_tokens, _NO_SPLIT  # one split size for every sequence
    if invariant and forced_split is None and capacity > _INVARIANT_LONG_FROM:
        long_split_tokens, long_from = cdiv(_INVARIANT_LONG_SPLIT_TOKENS, tile_n) * tile_n, _INVARIANT_LONG_FROM
        num_splits = cdiv(capacity, long_split_tokens)
        write_partial = num_splits * partial_bytes <= _WORKSPACE_BYTES
    if invariant and write_partial and _fills_slots(busy_q_blocks * num_kv_heads * num_head_groups, query.device,
                                                    programs_per_sm):
        # Batch-invariant mode splits every sequence at fixed key positions; where the default mode
        # would not split (the unsplit programs fill the resident slots), each program merges its
        # own splits in order instead of writing partials for the combine kernel: the same grid
        # as the default mode, the same bits (test_merge_paths_bitwise), no workspace round trip
        # and no second launch. H100, 2026-11-23, fp8 B64 x 4096: batch-invariant +5.4 % over
        # the default through the workspace; this way, in one key loop (_attention_kernel),
        # -0.4 % (2026-11-26).
        write_partial = False
    is_fp8 = key_cache.dtype in _FP8
    has_lse = lse is not None
    device = query.device
    workspace = _Workspace(write_partial, num_tokens, num_splits, num_heads, head_size_v, device)
    pdl = write_partial and use_pdl(device)
    unbounded = 1 << 29  # a window side of -1 reaches every position below 2^28
    lse_strides = lse.stride() if has_lse else (0, 0)
    sq, skc, svc, sbt, so = query.stride(), key_cache.stride(), value_cache.stride(), block_table.stride(), out.stride()
    ssl, sqsl = seq_lens.stride(0), query_start_loc.stride(0)
    grid = (num_q_blocks, num_kv_heads * num_head_groups, num_splits if write_partial else 1)
    heads_fastest = decode and _DECODE_GRID == "heads" and num_q_blocks <= _MAX_GRID_Y
    if heads_fastest:
        grid = (grid[1], grid[0], grid[2])
    po_strides, pl_strides = workspace.po_strides, workspace.pl_strides
    # the stand-ins ``run`` passes for absent tensors (the launcher reads them off their targets)
    stand_ins = {
        name: same_as(target)
        for name, target, absent in (
            ("alibi_slopes_ptr", "query_ptr", alibi_slopes is None), ("sinks_ptr", "query_ptr", sinks is None),
            ("k_scale_ptr", "query_ptr", not is_fp8), ("v_scale_ptr", "query_ptr", not is_fp8),
            ("lse_ptr", "out_ptr", not has_lse), ("part_out_ptr", "out_ptr", not write_partial),
            ("part_lse_ptr", "out_ptr", not write_partial),
        )
        if absent
    }
    # every launch argument but the tensors, decided once for all calls of this signature
    attention = launcher(
        _attention_kernel, grid, **stand_ins,
        scale=float(scale), softcap=float(softcap), unit=1.0,
        # a window side or chunk of 2^29 or more is the same as 2^29 (positions < 2^28): int32
        # arithmetic on positions plus these stays below 2^30
        window_left=window_left if 0 <= window_left < unbounded else unbounded,
        window_right=window_right if 0 <= window_right < unbounded else unbounded,
        chunk_size=min(max(attention_chunk_size, 1), unbounded),
        split_tokens=split_tokens, long_split_tokens=long_split_tokens, long_from=long_from,
        num_splits=num_splits, num_tokens=num_tokens, num_seqs=num_seqs,
        num_blocks=num_blocks, max_blocks=max_blocks,
        stride_q_tok=sq[0], stride_q_head=sq[1],
        stride_kc_block=skc[0], stride_kc_slot=skc[1], stride_kc_head=skc[2],
        stride_vc_block=svc[0], stride_vc_slot=svc[1], stride_vc_head=svc[2],
        stride_bt_seq=sbt[0], stride_bt_block=sbt[1],
        stride_sl=ssl, stride_qsl=sqsl,
        stride_o_tok=so[0], stride_o_head=so[1],
        stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        stride_po_tok=po_strides[0], stride_po_split=po_strides[1], stride_po_head=po_strides[2],
        stride_pl_tok=pl_strides[0], stride_pl_split=pl_strides[1],
        GROUP=group, HEADS=heads, NUM_HEAD_GROUPS=num_head_groups,
        HEAD_SIZE=head_size, HEAD_SIZE_V=head_size_v, D_PAD=d_pad, DV_PAD=dv_pad,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n,
        CAUSAL=bool(causal), USE_WINDOW=window_left >= 0 or window_right >= 0, USE_CHUNK=attention_chunk_size > 0,
        USE_SOFTCAP=softcap > 0, USE_ALIBI=alibi_slopes is not None, HAS_SINKS=sinks is not None,
        IS_FP8=is_fp8, HAS_LSE=has_lse, WRITE_PARTIAL=write_partial,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        DOT_UPCAST=query.dtype == torch.bfloat16 and _interpreted(),
        ONE_SPLIT=split_tokens == _NO_SPLIT and not write_partial, USE_PDL=pdl,
        HEADS_FASTEST=heads_fastest,
        SCORE_WARPS=_score_warps(decode, fp8_tile, block_m, tile_n, num_warps),
        num_warps=num_warps, num_stages=num_stages,
    )
    combine_grid, blocking = _combine_blocking(num_tokens, num_heads, dv_pad, num_splits, device)
    combine = launcher(
        _combine_kernel, combine_grid,
        **{k: v for k, v in stand_ins.items() if k == "lse_ptr"},
        split_tokens=split_tokens, long_split_tokens=long_split_tokens, long_from=long_from,
        num_splits=num_splits, num_tokens=num_tokens, num_seqs=num_seqs,
        num_heads=num_heads,
        stride_sl=ssl, stride_qsl=sqsl,
        stride_po_tok=po_strides[0], stride_po_split=po_strides[1], stride_po_head=po_strides[2],
        stride_pl_tok=pl_strides[0], stride_pl_split=pl_strides[1],
        stride_o_tok=so[0], stride_o_head=so[1],
        stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        HEAD_SIZE_V=head_size_v, DV_PAD=dv_pad,
        HAS_SINKS=sinks is not None, IS_FP8=is_fp8, HAS_LSE=has_lse, MERGE_GROUP=_MERGE_GROUP, ALL_SPLITS=False,
        **blocking,
        **pdl_options(pdl),
    )

    def run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        part_out, part_lse = workspace.tensors(out) if write_partial else (out, out)
        lse_t = lse if has_lse else out
        sinks = options["sinks"]
        sinks = sinks if sinks is not None else query
        alibi_slopes = options["alibi_slopes"]
        v_scale = options["v_scale"] if is_fp8 else query
        attention(
            query, query_ptr=query, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
            block_table_ptr=block_table, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
            out_ptr=out, lse_ptr=lse_t,
            alibi_slopes_ptr=alibi_slopes if alibi_slopes is not None else query, sinks_ptr=sinks,
            k_scale_ptr=options["k_scale"] if is_fp8 else query, v_scale_ptr=v_scale,
            part_out_ptr=part_out, part_lse_ptr=part_lse,
        )
        if not write_partial:
            return
        combine(
            query, part_out_ptr=part_out, part_lse_ptr=part_lse, seq_lens_ptr=seq_lens,
            query_start_loc_ptr=query_start_loc, sinks_ptr=sinks, v_scale_ptr=v_scale, out_ptr=out, lse_ptr=lse_t,
        )

    def pin(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse=None):
        """``fire(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out)``, or
        with ``lse`` given ``fire(..., out, lse)`` (a plan whose lse is the caller's), for later
        calls of this plan whose tensors match these in type, dtype, device, sizes and strides
        (the caller guarantees it: ``lowering.eager_planned``'s check), with no optional tensor
        (alibi slopes, sinks, fp8 scales) and a plain eager call (``plain_eager``): ``run``'s one
        launch as one call of the launcher's ``pin`` (``_launch``), True when it launched; False
        (nothing launched: call ``run``) where the cached launch does not apply to that call. None
        where this plan has no such launch (split through the workspace, optional tensors, an lse
        given or not as the plan has it, or a launcher without ``pin``) or its launcher has not yet
        launched these tensors' dtypes, 16-byte aligned, on the current device. The native form's
        ``fire.new`` (out allocated) belongs to the pin without lse, whose last tensor is out."""
        if write_partial or getattr(attention, "pinned", None) != (_PINNED if lse is None else _PINNED_LSE):
            return None
        tensors = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out)
        return attention.pin(query, *tensors) if lse is None else attention.pin(query, *tensors, lse)

    run.pin = pin
    return run


# The tensors of a plan's one launch that ``run.pin`` takes, in the kernel's order: every other
# pointer parameter of _attention_kernel is a stand-in (``same_as``) for one of them.
_PINNED = ("query_ptr", "key_cache_ptr", "value_cache_ptr", "block_table_ptr", "seq_lens_ptr",
           "query_start_loc_ptr", "out_ptr")
_PINNED_LSE = (*_PINNED, "lse_ptr")  # a plan with the caller's lse (``paged_attention_out``'s)


def _score_warps(decode: bool, fp8_tile: bool, block_m: int, tile_n: int, num_warps: int) -> int:
    """``SCORE_WARPS`` of a tile: its warps where the scores' dot is batched over them
    (``_FP8_DECODE_BATCHED_SCORES`` for the fp8 decode tile, ``_DECODE_BATCHED_SCORES`` for the
    others), on 16-row tiles whose warps keep 16 keys or more each (a dot's minimum); else 1."""
    batched = _FP8_DECODE_BATCHED_SCORES if fp8_tile else _DECODE_BATCHED_SCORES
    if decode and batched and block_m == 16 and tile_n % num_warps == 0 and tile_n // num_warps >= 16:
        return num_warps
    return 1


def _nothing(*args) -> None:
    return None
