"""Paged attention for prefill-like calls on Hopper (sm_90): wgmma-sized tiles, no split-KV.

Computes what ``paged_attention._attention_kernel`` computes (FlashAttention-2's online softmax,
Dao 2023, over K/V tiles gathered through the block table) for calls with many query tokens,
written for the Hopper tensor cores: 128 query rows a program in two warpgroups (8 warps), so
each ``tl.dot`` is an asynchronous wgmma with its K/V operand staged in shared memory by cp.async
(``num_stages`` deep); the key loop runs in three phases, masked tiles below the first key every
row sees (windows, chunks), unmasked inner tiles, masked tiles past the last such key (the causal
diagonal, the sequence end), so inner tiles carry no position arithmetic (nor block-id checks: one
pass over their ids proves them in range first); the softmax is in base 2
with the scale applied in the same FMA that subtracts the running maximum (Triton's fused-
attention tutorial). Rows are ``BLOCK_Q`` tokens x ``HEADS`` query heads of one kv head (the GQA
group packed, K/V loaded once for it) or ``BLOCK_Q = BLOCK_M`` tokens of one head (``HEADS == 1``).
Grid: axis 0 kv head x head group, axis 1 query block in reverse (long causal blocks first, short
ones in the tail); slots, padding rows, block-table lookup and layouts as in ``paged_attention``.

Bytes moved, at most: ``sum_b cdiv(q_len_b, BLOCK_Q) * seq_len_b * Hkv * NUM_HEAD_GROUPS * (D + Dv) *
cache_bytes`` of K/V (through L2) + ``T * Hq * (D + Dv) * q_bytes``; FLOPs ``4 * D`` per visible
(query, key) pair and head (``D == Dv``); the id pass reads ``cdiv(seq_len, BS)`` int32 per program.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import paged_attention as pa
# the @triton.jit helpers by name, not through ``pa``: Inductor copies a kernel's source with the
# globals it names, and a module attribute (``pa._dot``) is not one of them
from .paged_attention import (  # by their own names: Inductor re-emits helpers under __name__
    _MAX_GRID_Y, _NO_LIMIT, _abs_max, _dot, _floor_div, _fp8_to_fp16, _fp16_exponent, _load_block_ids,
    _load_rows, _position_mask,
)
from ._launch import cdiv, next_power_of_2
from ._softmax import LOG2E, merged_to_output

# Tiles, per compute capability (major) and padded head size (max of D and Dv, a power of two):
# (BLOCK_M rows, TILE_N keys per iteration, num_warps, num_stages, PACK_HEADS: rows are tokens x
# the query heads of one kv head, else tokens of one head; LAZY_RESCALE: FlashAttention-4's
# conditional rescaling of the accumulator). Head sizes above 128 and other architectures run
# ``paged_attention._attention_kernel``.
# H100, 2026-11-23, bf16, Hq 32 / Hkv 8, D 128, block 16 (tune.py attn_prefill / attn_chunked,
# results/tune-NVIDIA-H100-80GB-HBM3-2026-11-23-e-prefill.txt), prefill 4 x 2048 causal / chunked
# 4 x 512 on 4096 keys, us: (128, 64, 8, 3, packed, eager) 455 / 394 = 302 TFLOP/s on prefill;
# 4 stages 451 / 375; 2 stages 459 / 464; one-head rows 469 / 392; lazy rescaling 500 / 442;
# (64, 64, 4, 2) 503 / 497; TILE_N 32 591 / 555. The shared kernel's best tile: 561 / 517.
# The 3-stage tile stays until the 4-stage one has been through the GPU tests (it was only timed).
# sm_90, Triton 3.6 (``benchmarks/sass_report.py``, results/sass-sm90-triton3.6-2026-11-23-
# prefill*.txt): this tile 232 registers, no stack, 452 SASS instructions a 64-key inner tile
# against 828 in the shared kernel; TILE_N 128 spills (D <= 64 takes the D 128 tile). With the
# slots and block indices of a tile taken from its aligned start (``_tile``, ``_load_block_ids``'s ALIGNED):
# 405 instructions a tile, 227 registers; H100, 2026-11-24, graph replays (results/gpu-2026-11-24/
# pa-slots.txt): prefill 450.1 -> 402.8 us (341 TFLOP/s), chunked 386.3 -> 341.5 us.
_CONFIGS = {
    9: {
        16: (128, 64, 8, 3, True, False),
        32: (128, 64, 8, 3, True, False),
        64: (128, 64, 8, 3, True, False),
        128: (128, 64, 8, 3, True, False),
    },
}


# Calls ``prefill_sm90`` takes (sm_90, bf16/fp16, head size 64/128, no window/chunk/softcap/ALiBi/
# sinks/fp8) run that Gluon kernel instead of ``_prefill_kernel`` when this is True. H100,
# 2026-11-24, graph replays: prefill 4 x 2048 412.5 -> 328.8 us, chunked 4 x 512 on 4096 350.9 ->
# 284.7 us (results/gpu-2026-11-24b/gluon-sweep-persistent.txt).
SM90_GLUON = True


def _capability(device: torch.device) -> tuple[int, int] | None:
    """The device's compute capability, None off CUDA (tests and ``sass_report`` replace this)."""
    if device.type != "cuda" or pa._interpreting():
        return None
    return torch.cuda.get_device_capability(device)


def config(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, scale: float,
           forced_split: bool, max_query_len: int) -> tuple | None:
    """This kernel's tile for a prefill-like call, None where ``paged_attention._attention_kernel``
    runs it instead: forced split-KV, float32 queries (wgmma multiplies them in tf32 only), head
    sizes above 128, scales <= 0 (the running maximum is taken before scaling), devices without a
    table, calls whose hint ``max_query_len`` leaves fewer than 64 rows a program, calls with more
    query slots than grid axis 1 holds, and calls with fewer query blocks than SMs (the shared
    kernel splits their keys)."""
    if forced_split or query.dtype == torch.float32 or not scale > 0:
        return None
    capability = _capability(query.device)
    table = _CONFIGS.get(capability[0]) if capability is not None else None
    d_pad = max(pa._tile_pads(query.shape[2], value_cache.shape[3]))
    tile = None if table is None else table.get(d_pad)
    if tile is None:
        return None
    num_tokens, num_heads = query.shape[:2]
    group = num_heads // key_cache.shape[2]
    if declines(tile, query.shape[2], value_cache.shape[3], key_cache.shape[1], group, max_query_len):
        return None
    block_m, block_q, _, num_head_groups = _rows(tile, group, max_query_len)
    if num_tokens // block_q + block_table.shape[0] + 1 > _MAX_GRID_Y:  # query slots on grid axis 1
        return None
    busy = pa._busy_q_blocks(num_tokens, block_table.shape[0], block_q, max_query_len)
    return tile if busy * key_cache.shape[2] * num_head_groups >= pa._num_sms(query.device) else None


def declines(tile: tuple, head_size: int, head_size_v: int, block_size: int, group: int,
             max_query_len: int) -> str | None:
    """Why this kernel does not take a call of these sizes with ``tile`` (None: it does): a
    ``max_query_len`` hint (speculative decoding) that leaves fewer rows a program than wgmma's
    64. Every head size up to 128, block size and GQA group runs here."""
    if _rows(tile, group, max_query_len)[0] < min(tile[0], 64):
        return "short queries: rows below wgmma's 64"
    return None


def _rows(tile: tuple, group: int, max_query_len: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_Q, HEADS, NUM_HEAD_GROUPS)`` of ``tile`` for ``group`` query heads per kv
    head: the GQA group packed into the rows (split over programs above 64 heads), or one head."""
    block_m, pack_heads = tile[0], tile[4]
    if pack_heads:
        num_head_groups = cdiv(group, pa._MAX_HEADS_PER_PROGRAM)
        heads = cdiv(group, num_head_groups)
    else:
        num_head_groups, heads = group, 1
    if max_query_len > 0:  # short queries (speculative decoding): fewer empty rows
        block_m = min(block_m, pa._pad(max_query_len * heads))
    block_m = max(block_m, next_power_of_2(heads))
    return block_m, block_m // heads, heads, num_head_groups


@triton.jit
def _load_tile_rows(base_ptr, rows, offs, row_ok, SIZE: tl.constexpr, PAD: tl.constexpr, MASKED: tl.constexpr):
    """``paged_attention._load_rows``; unmasked rows (``MASKED`` False) load with no predicate
    where the head size needs no padding."""
    if MASKED or SIZE != PAD:
        return _load_rows(base_ptr, rows, offs, row_ok, SIZE, PAD)
    return tl.load(base_ptr + rows[:, None] + offs[None, :])


@triton.jit
def _ids_in_range(seq_row_ptr, stride_bt_block, first, end, num_blocks, PAGES: tl.constexpr):
    """True when the block ids ``block_table[b, first:end]`` all lie in ``[0, num_blocks)``."""
    bad = tl.zeros([PAGES], tl.int32)
    for p0 in range(first, end, PAGES):
        pages = p0 + tl.arange(0, PAGES)
        ids = tl.load(seq_row_ptr + pages * stride_bt_block, mask=pages < end, other=0)
        bad += ((ids < 0) | (ids >= num_blocks)).to(tl.int32)
    return tl.sum(bad, 0) == 0


@triton.jit
def _tile(q, m_i, l_i, acc, start, block, num_blocks, kv_head,
          key_cache_ptr, value_cache_ptr, stride_kc_block, stride_kc_slot, stride_kc_head,
          stride_vc_block, stride_vc_slot, stride_vc_head,
          qk_scale, softcap, window_left, window_right, chunk_size, chunk_row, pos, slopes, unit,
          offs_d, offs_dv,
          HEAD_SIZE: tl.constexpr, HEAD_SIZE_V: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
          BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MASKED: tl.constexpr,
          CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr,
          USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr, IS_FP8: tl.constexpr,
          DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, LAZY_RESCALE: tl.constexpr):
    """Fold the ``TILE_N`` keys from ``start`` into the running state ``(m_i, l_i, acc)`` (log2);
    ``block``: the tile's cache blocks (``_load_block_ids``). ``MASKED``: apply the position
    masks (causal / window / chunk) and the block-id checks; unmasked tiles lie inside every
    row's range with ids the program checked up front, so they carry neither."""
    # -- block ids: [TILE_N]; -1 and ids outside [0, NB) hide their keys --
    offs_n = start + tl.arange(0, TILE_N)
    if TILE_N % BLOCK_SIZE == 0:  # start is a multiple of TILE_N: the same slots every tile
        slot = tl.arange(0, TILE_N) % BLOCK_SIZE
    else:
        slot = offs_n % BLOCK_SIZE
    if MASKED:
        key_ok = (block >= 0) & (block < num_blocks)
        block = tl.where(key_ok, block, 0)
    else:
        key_ok = offs_n >= 0  # all true, for the padded head sizes' loads
    block = block.to(tl.int64)

    # -- load K tile: [TILE_N, D_PAD]; scores [BLOCK_M, TILE_N], unscaled --
    k_rows = block * stride_kc_block + slot * stride_kc_slot + kv_head * stride_kc_head
    k = _load_tile_rows(key_cache_ptr, k_rows, offs_d, key_ok, HEAD_SIZE, D_PAD, MASKED)
    if IS_FP8:  # exact: fp8 values are fp16 values; the scale is in qk_scale
        k = k.to(tl.float16)
    s = _dot(q, tl.trans(k.to(q.dtype)), None, DOT_PRECISION, DOT_UPCAST)
    if USE_SOFTCAP or USE_ALIBI:  # scale first, then the transforms; qk_scale is 1 after them
        s = s * qk_scale
        if USE_SOFTCAP:  # softcap * tanh(s / softcap), overflow-free as in paged_attention
            x = s / softcap
            e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))
            t = (1.0 - e) / (1.0 + e)
            s = softcap * tl.where(x < 0, -t, t)
        if USE_ALIBI:
            s = s + slopes[:, None] * (offs_n[None, :] - pos[:, None]).to(tl.float32)
        s = s * LOG2E
    # -- masks: key validity always, positions on edge tiles only --
    if MASKED:
        visible = _position_mask(key_ok[None, :] & (offs_n[None, :] < pos[:, None] + _NO_LIMIT), offs_n, pos,
                                 chunk_row, window_left, window_right, chunk_size, CAUSAL, USE_WINDOW, USE_CHUNK)
        s = tl.where(visible, s, float("-inf"))

    # -- online softmax, base 2: p = 2^(s * qk_scale - m), one FMA a score --
    if USE_SOFTCAP or USE_ALIBI:
        score_scale = 1.0
    else:
        score_scale = qk_scale
    m_tile = tl.max(s, 1) * score_scale  # score_scale > 0: the max commutes with it
    if LAZY_RESCALE:
        # FlashAttention-4's lazy rescaling: the reference max m_i moves (and acc, l with it)
        # only when some row's max grows past it by more than 8 (log2 of 256); p stays <= 2^8.
        # One branch for the whole program: a row vote, not a per-row select.
        if tl.max((m_tile > m_i + 8.0).to(tl.int32), 0) > 0:
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)  # no visible key yet: p = 0, not NaN
        p = tl.exp2(s * score_scale - m_ref[:, None])
        l_i = l_i + tl.sum(p, 1)
    else:
        m_new = tl.maximum(m_i, m_tile)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s * score_scale - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new

    # -- load V tile: [TILE_N, DV_PAD]; acc += P @ V --
    v_rows = block * stride_vc_block + slot * stride_vc_slot + kv_head * stride_vc_head
    v = _load_tile_rows(value_cache_ptr, v_rows, offs_dv, key_ok, HEAD_SIZE_V, DV_PAD, MASKED)
    if IS_FP8:
        v = _fp8_to_fp16(v, unit)
    acc = _dot(p.to(q.dtype), v.to(q.dtype), acc, DOT_PRECISION, DOT_UPCAST)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "num_q_blocks"])
def _prefill_kernel(
    query_ptr,  # [T, Hq, D]
    key_cache_ptr, value_cache_ptr,  # [NB, BS, Hkv, D], [NB, BS, Hkv, Dv]
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
    out_ptr, lse_ptr,  # [T, Hq, Dv]; [T, Hq] float32 (HAS_LSE)
    alibi_slopes_ptr, sinks_ptr,  # [Hq] float32 (USE_ALIBI); [Hq] (HAS_SINKS)
    k_scale_ptr, v_scale_ptr,  # [] or [1] float32 (IS_FP8)
    scale, softcap, window_left, window_right, chunk_size,  # float > 0, float, int, int, int
    unit,  # 1.0 (paged_attention._fp8_to_fp16)
    num_tokens, num_seqs, num_blocks, max_blocks, num_q_blocks,
    stride_q_tok, stride_q_head,
    stride_kc_block, stride_kc_slot, stride_kc_head,
    stride_vc_block, stride_vc_slot, stride_vc_head,
    stride_bt_seq, stride_bt_block,
    stride_sl, stride_qsl,
    stride_o_tok, stride_o_head,
    stride_lse_tok, stride_lse_head,
    GROUP: tl.constexpr, HEADS: tl.constexpr, NUM_HEAD_GROUPS: tl.constexpr,  # heads per kv head / program
    HEAD_SIZE: tl.constexpr, HEAD_SIZE_V: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
    CAUSAL: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr, HAS_SINKS: tl.constexpr,
    IS_FP8: tl.constexpr, HAS_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, LAZY_RESCALE: tl.constexpr,
):
    tl.static_assert(BLOCK_M >= 16 and TILE_N >= 16 and D_PAD >= 16 and DV_PAD >= 16)
    tl.static_assert(BLOCK_Q * HEADS <= BLOCK_M and BLOCK_Q >= 1)
    scale = tl.cast(scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    # heads vary fastest, query slots from the last: all heads of a sequence's longest causal
    # blocks start first, its shortest end the launch
    pid_q = num_q_blocks - 1 - tl.program_id(1)
    kv_head = tl.program_id(0) // NUM_HEAD_GROUPS
    head_group = tl.program_id(0) % NUM_HEAD_GROUPS

    # -- which sequence, which of its query blocks (the search of paged_attention, inline for
    #    the same reason: Inductor's analysis must not see query_start_loc as written) --
    lo = tl.zeros([], dtype=tl.int32)
    hi = num_seqs + 1
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    seq = tl.maximum(lo - 1, 0)
    is_seq = seq < num_seqs
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

    # -- load Q once: [BLOCK_M, D_PAD] --
    q = _load_rows(query_ptr, tok.to(tl.int64) * stride_q_tok + head * stride_q_head, offs_d, row_ok,
                   HEAD_SIZE, D_PAD)
    qk_scale = scale
    v_scale = 1.0
    if IS_FP8:  # per-tensor scales into the score scale and the output; dots in fp16
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
        if q.dtype == tl.bfloat16:
            q_unit = _fp16_exponent(_abs_max(q))
            q = (q.to(tl.float32) / q_unit).to(tl.float16)
            qk_scale = qk_scale * q_unit
    if not (USE_SOFTCAP or USE_ALIBI):
        qk_scale = qk_scale * LOG2E
    slopes = tl.zeros([BLOCK_M], tl.float32)
    if USE_ALIBI:
        slopes = tl.load(alibi_slopes_ptr + head, mask=row_ok, other=0.0)

    # -- keys this block can see, [kv_lo, kv_hi), and those every row sees, [full_lo, full_hi) --
    p_first = context + q_block_start
    p_last = context + tl.minimum(q_block_start + BLOCK_Q, q_len) - 1
    kv_lo = 0
    kv_hi = tl.minimum(seq_len, max_blocks * BLOCK_SIZE)
    full_lo = 0
    full_hi = kv_hi
    chunk_row = pos
    if CAUSAL:
        kv_hi = tl.minimum(kv_hi, p_last + 1)
        full_hi = tl.minimum(full_hi, p_first + 1)
    if USE_WINDOW:
        kv_lo = tl.maximum(kv_lo, p_first - window_left)
        kv_hi = tl.minimum(kv_hi, p_last + window_right + 1)
        full_lo = tl.maximum(full_lo, p_last - window_left)
        full_hi = tl.minimum(full_hi, p_first + window_right + 1)
    if USE_CHUNK:
        chunk_first = _floor_div(p_first, chunk_size) * chunk_size
        kv_lo = tl.maximum(kv_lo, chunk_first)
        kv_hi = tl.minimum(kv_hi, (_floor_div(p_last, chunk_size) + 1) * chunk_size)
        full_lo = tl.maximum(full_lo, _floor_div(p_last, chunk_size) * chunk_size)
        full_hi = tl.minimum(full_hi, chunk_first + chunk_size)
        chunk_row = _floor_div(pos, chunk_size) * chunk_size  # [BLOCK_M] first key of each row's chunk
    # three phases of whole tiles: [lo, mid_lo) masked, [mid_lo, mid_hi) unmasked, [mid_hi, kv_hi) masked
    lo = kv_lo // TILE_N * TILE_N
    hi_tiles = tl.maximum(_cdiv_tiles(kv_hi, TILE_N) * TILE_N, lo)
    mid_lo = tl.minimum(tl.maximum(_cdiv_tiles(full_lo, TILE_N) * TILE_N, lo), hi_tiles)
    mid_hi = tl.minimum(tl.maximum(tl.minimum(full_hi, kv_hi) // TILE_N * TILE_N, mid_lo), hi_tiles)
    seq_row_ptr = block_table_ptr + seq * stride_bt_seq
    # Unmasked tiles skip the block-id checks: one pass over their ids here (cdiv(n, BS) int32,
    # from L2; K/V read n * (D + Dv) elements) proves them in range, else they run masked.
    if not _ids_in_range(seq_row_ptr, stride_bt_block, mid_lo // BLOCK_SIZE,
                         (mid_hi + BLOCK_SIZE - 1) // BLOCK_SIZE, num_blocks, 128):
        mid_hi = mid_lo

    # -- running state; a sink is a key of logit ``sink`` and value 0 --
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=float("-inf")).to(tl.float32)
        sink = tl.where(is_seq, sink, float("-inf"))  # padding rows: 0 and -inf, no sink
        m_i = sink * LOG2E
        l_i = tl.where(sink > float("-inf"), 1.0, 0.0)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    # Block ids are fetched one tile ahead, as in paged_attention: the K/V addresses depend on
    # them, and Triton pipelines a load in the same iteration as cp.async with a full wait (num 0)
    # at the top of every iteration, which leaves no load in flight across the dots.
    # The three phases, unrolled at compile time: [lo, mid_lo) and [mid_hi, kv_hi) masked, [mid_lo,
    # mid_hi) unmasked (MASKED is a constant of each copy of the loop).
    for phase in tl.static_range(3):
        if phase == 0:
            first, end = lo, mid_lo
        elif phase == 1:
            first, end = mid_lo, mid_hi
        else:
            first, end = mid_hi, kv_hi
        # every phase starts at a multiple of TILE_N: the aligned block indices
        block = _load_block_ids(seq_row_ptr, stride_bt_block, first, seq_len, max_blocks, BLOCK_SIZE, TILE_N, True)
        for start in range(first, end, TILE_N):
            next_block = _load_block_ids(seq_row_ptr, stride_bt_block, start + TILE_N, seq_len, max_blocks,
                                         BLOCK_SIZE, TILE_N, True)
            m_i, l_i, acc = _tile(
                q, m_i, l_i, acc, start, block, num_blocks, kv_head,
                key_cache_ptr, value_cache_ptr, stride_kc_block, stride_kc_slot, stride_kc_head,
                stride_vc_block, stride_vc_slot, stride_vc_head, qk_scale, softcap, window_left, window_right,
                chunk_size, chunk_row, pos, slopes, unit, offs_d, offs_dv, HEAD_SIZE, HEAD_SIZE_V, D_PAD,
                DV_PAD, BLOCK_SIZE, TILE_N, phase != 1, CAUSAL, USE_WINDOW, USE_CHUNK, USE_SOFTCAP, USE_ALIBI,
                IS_FP8, DOT_PRECISION, DOT_UPCAST, LAZY_RESCALE)
            block = next_block

    # -- epilogue: out [BLOCK_M, DV_PAD] = acc / l * v_scale, lse [BLOCK_M] natural log --
    out, lse = merged_to_output(m_i, l_i, acc, v_scale)
    o_rows = tok.to(tl.int64) * stride_o_tok + head * stride_o_head
    tl.store(out_ptr + o_rows[:, None] + offs_dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv < HEAD_SIZE_V)[None, :])
    if HAS_LSE:
        tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_tok + head * stride_lse_head, lse, mask=row_ok)


@triton.jit
def _cdiv_tiles(x, TILE: tl.constexpr):
    """``ceil(x / TILE)`` for ``x >= 0`` (and 0 for ``x <= 0``)."""
    return (tl.maximum(x, 0) + TILE - 1) // TILE


def prepare(
    query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
    query_start_loc: Tensor, out: Tensor, lse: Tensor | None, tile: tuple, *,
    scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
    alibi_slopes: Tensor | None, sinks: Tensor | None, attention_chunk_size: int, max_query_len: int,
) -> Callable[..., None]:
    """The runner of this kernel for calls shaped like this one, with ``tile`` from ``config``
    (``paged_attention.prepare_paged_attention`` documents the runner)."""
    num_tokens, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    head_size_v = value_cache.shape[3]
    num_seqs, max_blocks = block_table.shape
    group = num_heads // num_kv_heads
    _, tile_n, num_warps, num_stages, _, lazy_rescale = tile
    block_m, block_q, heads, num_head_groups = _rows(tile, group, max_query_len)
    if SM90_GLUON:
        from . import prefill_sm90

        if prefill_sm90.declines(query, key_cache, value_cache, block_m, scale=scale, window_left=window_left,
                                 window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                                 sinks=sinks, attention_chunk_size=attention_chunk_size) is None:
            return prefill_sm90.prepare(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out,
                                        lse, scale=scale, causal=causal, rows=(block_m, block_q, heads,
                                                                               num_head_groups))
    # K and V tiles of one width when both head sizes pad (D 40 / Dv 24 -> 64 / 64): a workaround for
    # Triton 3.6's ptxas, whose P @ V wgmma descriptors otherwise read unwritten uniform registers
    # (``paged_attention._tile_pads``); not yet verified on a GPU
    d_pad, dv_pad = pa._tile_pads(head_size, head_size_v)
    num_q_blocks = num_tokens // block_q + num_seqs + 1
    is_fp8 = key_cache.dtype in pa._FP8
    has_lse = lse is not None
    unbounded = 1 << 29  # a window side of -1 reaches every position below 2^28
    lse_strides = lse.stride() if has_lse else (0, 0)
    sq, skc, svc, sbt, so = query.stride(), key_cache.stride(), value_cache.stride(), block_table.stride(), out.stride()
    attention = pa.launcher(
        _prefill_kernel, (num_kv_heads * num_head_groups, num_q_blocks),
        scale=float(scale), softcap=float(softcap), unit=1.0,
        # as in the shared kernel: a window side or chunk of 2^29 or more is the same as 2^29
        # (positions < 2^28), so int32 arithmetic on positions plus these stays below 2^30
        window_left=window_left if 0 <= window_left < unbounded else unbounded,
        window_right=window_right if 0 <= window_right < unbounded else unbounded,
        chunk_size=min(max(attention_chunk_size, 1), unbounded),
        num_tokens=num_tokens, num_seqs=num_seqs, num_blocks=num_blocks, max_blocks=max_blocks,
        num_q_blocks=num_q_blocks,
        stride_q_tok=sq[0], stride_q_head=sq[1],
        stride_kc_block=skc[0], stride_kc_slot=skc[1], stride_kc_head=skc[2],
        stride_vc_block=svc[0], stride_vc_slot=svc[1], stride_vc_head=svc[2],
        stride_bt_seq=sbt[0], stride_bt_block=sbt[1],
        stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0),
        stride_o_tok=so[0], stride_o_head=so[1],
        stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        GROUP=group, HEADS=heads, NUM_HEAD_GROUPS=num_head_groups,
        HEAD_SIZE=head_size, HEAD_SIZE_V=head_size_v, D_PAD=d_pad, DV_PAD=dv_pad,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n,
        CAUSAL=bool(causal), USE_WINDOW=window_left >= 0 or window_right >= 0, USE_CHUNK=attention_chunk_size > 0,
        USE_SOFTCAP=softcap > 0, USE_ALIBI=alibi_slopes is not None, HAS_SINKS=sinks is not None,
        IS_FP8=is_fp8, HAS_LSE=has_lse, DOT_PRECISION="tf32",
        DOT_UPCAST=query.dtype == torch.bfloat16 and pa._interpreted(), LAZY_RESCALE=lazy_rescale,
        num_warps=num_warps, num_stages=num_stages,
    )

    def run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        alibi_slopes, sinks = options["alibi_slopes"], options["sinks"]
        attention(
            query, query_ptr=query, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
            block_table_ptr=block_table, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
            out_ptr=out, lse_ptr=lse if has_lse else out,
            alibi_slopes_ptr=alibi_slopes if alibi_slopes is not None else query,
            sinks_ptr=sinks if sinks is not None else query,
            k_scale_ptr=options["k_scale"] if is_fp8 else query, v_scale_ptr=options["v_scale"] if is_fp8 else query,
        )

    return run
