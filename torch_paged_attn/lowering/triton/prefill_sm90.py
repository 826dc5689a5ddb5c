"""Paged attention for prefill-like calls on Hopper (sm_90), written in Gluon: TMA page loads,
asynchronous wgmma, the softmax of one key tile beside the P @ V of the one before.

Computes what ``prefill._prefill_kernel`` computes (causal or full attention of many query tokens
over a block-table K/V cache, FlashAttention-2's online softmax in base 2) for the calls it takes
(``declines`` says which): bf16/fp16 queries and caches of the same dtype, head sizes 64 or 128 (K and V the
same), block sizes that are powers of two >= 8, caches ``[NB, BS, Hkv, D]`` that have a ``[rows, W]``
view (``_sm90.row_layout``: contiguous, a layer of a cross-layer buffer, K or V unbound from
``[NB, 2, ...]``, the HND view; each as it comes, so a strided cache gives the contiguous one's
bits, DESIGN.md section 2), no window, chunk, softcap, ALiBi, sinks or fp8. What it changes is how a tile is fed
and scheduled, which Triton's automatic pipeliner does not let the other kernel choose:

- **Loads.** K and V pages come in through tensor-memory-access copies (TMA): each cache seen as
  a 2-D ``[rows, W]`` tensor (``[NB * BS, Hkv * D]`` when contiguous; a kv head's slot ``s`` of
  block ``b`` at row ``b * block_rows + head * head_rows + s``, column ``head * head_cols``), one
  box of ``min(BS, 64)`` rows x 64 columns a copy, issued by
  one thread into a 64-key x 64-column stage of shared memory (128-byte swizzle, the wgmma operand
  layout; head size 128 is two such column halves). No thread computes a gathered row address;
  a block id outside ``[0, NB)`` (and a page past the sequence) points the copy past the tensor's
  last row, where TMA fills zeros, and the scores mask those keys. ``STAGES`` tiles in flight,
  each K and V stage signalled by its own mbarrier (expected bytes).
- **Schedule.** FlashAttention-3's intra-warpgroup pipelining (Shah et al. 2024): in iteration j
  the scores of tile j (``S = Q K_j^T``) and the product of tile j - 1 (``O += P_{j-1} V_{j-1}``)
  are issued back to back as asynchronous wgmma; the softmax of tile j runs while the tensor cores
  work on ``P_{j-1} V_{j-1}``; then ``O`` is rescaled. Q stays in shared memory (wgmma's A from
  shared memory), P goes from registers.
- **Rows and order.** 128 rows a work item in two consumer warpgroups (64 rows each, their own
  partitions, 4 warps each; the producer a third, one warp): ``BLOCK_Q`` tokens x the ``HEADS``
  query heads of one kv head (the GQA group packed, K/V loaded once for it), as in ``prefill``.
  Persistent: one program an SM, each running its work items (query block x kv head group,
  ``_work``) in a zigzag order, the producer loading the next item's pages while the consumers
  finish one; the barrier phases run on across items.

Tiles whose 64 keys every row sees (and whose block ids one pass over the block table proves in
range) run without position or id masks; the first tile, the causal diagonal and the sequence end
run masked. V rows past the sequence end in the last tile are zeroed in shared memory before its
P @ V (the cache there may hold anything, and 0 * NaN is NaN).

Bytes moved, at most: ``sum_b cdiv(q_len_b, BLOCK_Q) * kv_b * Hkv * NUM_HEAD_GROUPS * (D + Dv) *
cache_bytes`` of K/V through L2 (``kv_b`` the keys a query block sees) + ``T * Hq * (D + Dv) *
q_bytes`` + the LSE; FLOPs ``4 * D`` per visible (query, key) pair and head. Shared memory:
``128 * D * 2`` (Q) + ``STAGES * 2 * 64 * D * 2`` bytes (K, V).

Runs only on a CUDA device of compute capability 9.0 (Gluon kernels have no interpreter); the
Triton kernel in ``prefill`` runs every call this one declines. Under tracing it runs behind the
private opaque op ``paged_attn::_prefill_sm90`` (its TMA descriptors are built per call on the
host, which ``wrap_triton`` does not launch); the grid is the SM count, so capture and replay hold.
H100, 2026-11-24: prefill 4 x 2048 causal 325.4 us (423 TFLOP/s, 0.86x FlashAttention-4, 1.02x
FlashInfer), chunked 4 x 512 on 4096 287.8 us (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from . import _sm90
from . import paged_attention as pa
from ._launch import launcher, same_as
from ._softmax import LN2, LOG2E

try:  # Gluon ships with Triton >= 3.5; without it this kernel declines every call
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from ._sm90 import thread_barrier, tma_load
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

TILE_N = 64  # keys a tile; also the column width of one shared-memory half (128 bytes of bf16)
BLOCK_M = 128  # rows a program: two consumer warpgroups of 64
NUM_WARPS = 4  # the kernel's own warps: the first consumer warpgroup; the second and the producer warp are added
REGS_CONSUMER = 232  # registers a thread of the second consumer warpgroup (setmaxnreg; swept below)
REGS_PRODUCER = 24  # the producer warp: scalar block-table loads and TMA issues only
# K/V tiles in flight and the second consumer warpgroup's registers. H100, 2026-11-24, graph
# replays, prefill 4 x 2048 / chunked 4 x 512 on 4096, us (the Triton prefill kernel 412.5 / 350.9):
# persistent, zigzag order (results/gpu-2026-11-24b/gluon-sweep-persistent.txt): 2 stages 335.8 /
# 292.7, 3 stages 328.8 / 284.7, 4 stages 331.3 / 288.5 (232 registers; 240 within 1.2 %);
# FlashAttention-3's ping-pong of the two consumer warpgroups (each waiting for the other's wgmma
# issue through an mbarrier) 347.5 / 299.2 at 3 stages, slower, not kept. Before: one program a
# work item 356.4 / 294.3 at 2 stages (gluon-sweep.txt); persistent in round-robin order 361.4 /
# 283.2 at 3 (gluon-sweep-roundrobin.txt): its low programs took the long items of every round.
STAGES = 3


def declines(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_m: int, *, scale: float,
             window_left: int, window_right: int, softcap: float, alibi_slopes: Tensor | None,
             sinks: Tensor | None, attention_chunk_size: int) -> str | None:
    """Why this kernel does not take a call that ``prefill`` plans with ``block_m`` rows a program
    (None: it takes it). Static facts only: device, dtypes, sizes, strides, the options."""
    reason = _sm90.unavailable(query)
    if reason:
        return reason
    if query.dtype not in (torch.bfloat16, torch.float16) or key_cache.dtype != query.dtype \
            or value_cache.dtype != query.dtype:
        return "dtype: bf16/fp16 queries and caches of the same dtype only"
    head_size, head_size_v = query.shape[2], value_cache.shape[3]
    if head_size != head_size_v or head_size not in (64, 128):
        return "head sizes 64 and 128 (K and V alike) only"
    reason = _sm90.cache_declines((key_cache, value_cache), strided=True)
    if reason:
        return reason
    if query.stride(2) != 1:
        return "query: contiguous head dimension only"
    if (window_left >= 0 or window_right >= 0 or attention_chunk_size > 0 or softcap > 0
            or alibi_slopes is not None or sinks is not None):
        return "window, chunk, softcap, ALiBi and sinks run in the Triton kernel"
    if not scale > 0:
        return "scale: > 0 only"
    if block_m != BLOCK_M:
        return "rows: 128 a program (two warpgroups) only"
    return None


if gluon is not None:
    _TILE = gl.constexpr(TILE_N)
    REGS_PRODUCER = gl.constexpr(REGS_PRODUCER)

    @gluon.jit
    def _load_tile(desc, ready, empty, smem, stage, phase, start, col, row0, seq_row_ptr, stride_bt_block, num_pages,
                   num_blocks, block_rows, end_row, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, DH: gl.constexpr):
        """Once ``empty`` (the stage's release by both consumers) reaches ``phase``: TMA copies of the
        keys ``[start, start + TILE_N)`` of one cache (K or V) into ``stage``, one box of ``BOX``
        rows a page and 64-column half, signalled on ``ready`` (expected bytes); the kv head's
        slots start at row ``row0`` of each block and column ``col`` (``_sm90.row_layout``)."""
        PAGES: gl.constexpr = _TILE // BOX
        mbarrier.wait(empty.index(stage), phase)
        mbarrier.expect(ready.index(stage), BOX * 64 * 2 * PAGES * DH)
        for i in gl.static_range(PAGES):
            row = _page_row(start + i * BOX, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows, row0,
                            end_row, BLOCK_SIZE)
            for h in gl.static_range(DH):
                tma_load(desc, [row, col + h * 64], ready.index(stage), smem.index(stage * DH + h).slice(i * BOX, BOX))

    @gluon.jit
    def _page_row(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows, row0, end_row,
                  BLOCK_SIZE: gl.constexpr):
        """The row of the cache's ``[rows, W]`` view (``_sm90.descriptor_spec``) holding key
        ``key0`` of the kv head whose slots start at row ``row0`` of a block; ``end_row``, past the
        view (TMA reads zeros there), for a page past ``num_pages`` or an id outside ``[0,
        num_blocks)``."""
        page = key0 // BLOCK_SIZE
        blk = gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)
        ok = (blk >= 0) & (blk < num_blocks)
        return gl.where(ok, blk * block_rows + row0 + key0 % BLOCK_SIZE, end_row)

    @gluon.jit
    def _work(r, num_work, query_start_loc_ptr, seq_lens_ptr, block_table_ptr, stride_qsl, stride_sl, stride_bt_seq,
              num_seqs, num_tokens, max_blocks, num_q_blocks, kv_groups,
              NUM_HEAD_GROUPS: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr):
        """This program's work item of round ``r``: item ``w = r G + p`` in even rounds, ``r G + G -
        1 - p`` in odd ones (program p of G; items come longest first within each sequence, so the
        zigzag evens out the programs' sums, where plain round robin gave the low programs the long
        items of every round): query block ``num_q_blocks - 1 - w // kv_groups`` of kv head x head
        group ``w % kv_groups``; its sequence (``prefill._prefill_kernel``'s search), the keys it
        sees, ``[0, kv_hi)``, in ``n_tiles`` tiles, the first ``n_full`` of them seen by every row.
        ``valid`` false (and no tiles) for an empty query slot or ``w >= num_work``."""
        pid = gl.program_id(0)
        num_programs = gl.num_programs(0)
        w = r * num_programs + gl.where(r % 2 == 0, pid, num_programs - 1 - pid)
        in_range = w < num_work
        w = gl.minimum(w, num_work - 1)
        kv_group = w % kv_groups
        pid_q = num_q_blocks - 1 - w // kv_groups
        lo_s = w * 0
        hi_s = num_seqs + 1
        while lo_s < hi_s:
            mid = (lo_s + hi_s) // 2
            below = gl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
            lo_s = gl.where(below, mid + 1, lo_s)
            hi_s = gl.where(below, hi_s, mid)
        seq = gl.maximum(lo_s - 1, 0)
        is_seq = seq < num_seqs
        q_start = gl.load(query_start_loc_ptr + seq * stride_qsl)
        q_end = gl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=is_seq, other=0)
        q_end = gl.where(is_seq, q_end, num_tokens)
        seq_len = gl.load(seq_lens_ptr + seq * stride_sl, mask=is_seq, other=0)
        q_len = q_end - q_start
        q_block_start = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q
        valid = (q_block_start >= 0) & (q_block_start < q_len) & in_range
        context = seq_len - q_len
        p_first = context + q_block_start
        p_last = context + gl.minimum(q_block_start + BLOCK_Q, q_len) - 1
        kv_hi = gl.minimum(seq_len, max_blocks * BLOCK_SIZE)
        full_hi = kv_hi
        if CAUSAL:
            kv_hi = gl.minimum(kv_hi, p_last + 1)
            full_hi = gl.minimum(full_hi, p_first + 1)
        n_tiles = gl.where(valid, (gl.maximum(kv_hi, 0) + _TILE - 1) // _TILE, 0)
        n_full = gl.minimum(gl.maximum(full_hi, 0) // _TILE, n_tiles)
        # pages of the sequence within its block-table row (a seq_len past the row's capacity, a bad
        # value, reads nothing beyond the row)
        num_pages = gl.minimum((gl.maximum(seq_len, 0) + BLOCK_SIZE - 1) // BLOCK_SIZE, max_blocks)
        seq_row_ptr = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        return (valid, kv_group // NUM_HEAD_GROUPS, kv_group % NUM_HEAD_GROUPS, q_start, q_len, q_block_start,
                context, seq_len, kv_hi, n_tiles, n_full, num_pages, seq_row_ptr)

    @gluon.jit
    def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                  query_start_loc_ptr, seq_lens_ptr, block_table_ptr, stride_qsl, stride_sl, stride_bt_seq,
                  stride_bt_block, num_seqs, num_tokens, num_blocks, max_blocks, num_q_blocks, kv_groups, num_work,
                  k_block_rows, k_head_rows, k_head_cols, k_end_row, v_block_rows, v_head_rows, v_head_cols, v_end_row,
                  NUM_HEAD_GROUPS: gl.constexpr, BLOCK_Q: gl.constexpr, HEAD_SIZE: gl.constexpr,
                  BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """One warp: the K and V pages of every tile of every work item of this program, ``STAGES``
        tiles ahead of the consumers (into the next item while they finish one), each stage
        refilled once both consumer warpgroups released it. A page past the sequence's or with an
        id outside ``[0, num_blocks)`` is copied from past the cache's last row: zeros."""
        DH: gl.constexpr = HEAD_SIZE // 64
        it = gl.program_id(0) * 0  # tiles loaded so far: the stage and barrier phase of the next
        for r in range(0, (num_work + gl.num_programs(0) - 1) // gl.num_programs(0)):
            (valid, kv_head, head_group, q_start, q_len, q_block_start, context, seq_len, kv_hi, n_tiles, n_full,
             num_pages, seq_row_ptr) = _work(r, num_work, query_start_loc_ptr, seq_lens_ptr, block_table_ptr,
                                             stride_qsl, stride_sl, stride_bt_seq, num_seqs, num_tokens, max_blocks,
                                             num_q_blocks, kv_groups, NUM_HEAD_GROUPS, BLOCK_Q, BLOCK_SIZE, CAUSAL)
            k_col, k_row0 = kv_head * k_head_cols, kv_head * k_head_rows
            v_col, v_row0 = kv_head * v_head_cols, kv_head * v_head_rows
            for j in range(n_tiles):
                g = it + j
                stage = g % STAGES
                phase = ((g // STAGES) & 1) ^ 1  # a fresh barrier's "previous" phase is complete
                _load_tile(k_desc, k_ready, k_empty, k_smem, stage, phase, j * _TILE, k_col, k_row0, seq_row_ptr,
                           stride_bt_block, num_pages, num_blocks, k_block_rows, k_end_row, BLOCK_SIZE, BOX, DH)
                _load_tile(v_desc, v_ready, v_empty, v_smem, stage, phase, j * _TILE, v_col, v_row0, seq_row_ptr,
                           stride_bt_block, num_pages, num_blocks, v_block_rows, v_end_row, BLOCK_SIZE, BOX, DH)
            it += n_tiles

    @gluon.jit
    def _scores(q_smem, wg: gl.constexpr, k_smem, stage, s_layout: gl.constexpr, DH: gl.constexpr):
        """Issue ``S = Q K^T`` of the tile in ``stage`` for warpgroup ``wg``'s rows (asynchronous;
        the caller waits): [64, TILE_N]."""
        s = gl.zeros([64, _TILE], gl.float32, s_layout)
        s = warpgroup_mma(q_smem.index(wg * DH), k_smem.index(stage * DH).permute((1, 0)), s, use_acc=False,
                          is_async=True)
        for h in gl.static_range(1, DH):
            s = warpgroup_mma(q_smem.index(wg * DH + h), k_smem.index(stage * DH + h).permute((1, 0)), s,
                              is_async=True)
        return s

    @gluon.jit
    def _softmax(s, m_i, l_i, start, kv_hi, pos, seq_row_ptr, stride_bt_block, num_pages, num_blocks, qk_scale,
                 s_layout: gl.constexpr, BLOCK_SIZE: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr):
        """Fold scores ``s`` of the tile at ``start`` into ``(m_i, l_i)`` (log2 domain): returns
        ``(p, m_new, l_new, alpha)``, ``alpha`` the accumulator's rescale. ``MASKED``: hide keys at
        or past ``kv_hi``, with a bad block id, or (``CAUSAL``) past a row's position."""
        if MASKED:
            offs_n = start + gl.arange(0, _TILE, layout=gl.SliceLayout(0, s_layout))
            page = offs_n // BLOCK_SIZE
            blk = gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)
            key_ok = (blk >= 0) & (blk < num_blocks) & (offs_n < kv_hi)
            if CAUSAL:
                visible = gl.expand_dims(key_ok, 0) & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(pos, 1))
                s = gl.where(visible, s, float("-inf"))
            else:
                s = gl.where(gl.expand_dims(key_ok, 0), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
        alpha = gl.exp2(m_i - m_ref)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref, 1))
        l_new = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_new, alpha

    @gluon.jit
    def _step(g, j, q_smem, wg: gl.constexpr, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
              p, m_i, l_i, o0, o1, kv_hi, pos, seq_row_ptr, stride_bt_block, num_pages, num_blocks, qk_scale,
              s_layout: gl.constexpr, p_layout: gl.constexpr, BLOCK_SIZE: gl.constexpr,
              DH: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr):
        """Tile ``j >= 1`` of a work item (``g``: of the program): the scores of tile j and P @ V of
        tile j - 1 in flight together, the softmax of tile j beside the latter; each stage released
        as soon as its wgmma is done."""
        stage = g % STAGES
        prev = (g - 1) % STAGES
        mbarrier.wait(k_ready.index(stage), (g // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((g - 1) // STAGES) & 1)
        s = _scores(q_smem, wg, k_smem, stage, s_layout, DH)
        o0 = warpgroup_mma(p, v_smem.index(prev * DH), o0, is_async=True)
        if DH == 2:
            o1 = warpgroup_mma(p, v_smem.index(prev * DH + 1), o1, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=DH, deps=(s, ))
        mbarrier.arrive(k_empty.index(stage))
        p_new, m_i, l_i, alpha = _softmax(s, m_i, l_i, j * _TILE, kv_hi, pos, seq_row_ptr, stride_bt_block,
                                          num_pages, num_blocks, qk_scale, s_layout, BLOCK_SIZE, MASKED, CAUSAL)
        if DH == 2:
            o0, o1, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, p))
            o1 = o1 * gl.expand_dims(alpha, 1)
        else:
            o0, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, p))
        mbarrier.arrive(v_empty.index(prev))
        o0 = o0 * gl.expand_dims(alpha, 1)
        p = gl.convert_layout(p_new.to(q_smem.dtype), p_layout)
        return p, m_i, l_i, o0, o1

    @gluon.jit
    def _consumer(wg: gl.constexpr, query_ptr, out_ptr, lse_ptr, q_smem_all, k_smem, v_smem, k_ready, v_ready, k_empty,
                  v_empty, tail_bar, query_start_loc_ptr, seq_lens_ptr, block_table_ptr, scale,
                  stride_q_tok, stride_q_head, stride_bt_seq, stride_bt_block, stride_sl, stride_qsl,
                  stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head,
                  num_seqs, num_tokens, num_blocks, max_blocks, num_q_blocks, kv_groups, num_work,
                  GROUP: gl.constexpr, HEADS: gl.constexpr, NUM_HEAD_GROUPS: gl.constexpr,
                  BLOCK_Q: gl.constexpr, HEAD_SIZE: gl.constexpr, BLOCK_SIZE: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr):
        """One warpgroup: rows ``[64 wg, 64 wg + 64)`` of each work item's 128, over its tiles."""
        DH: gl.constexpr = HEAD_SIZE // 64
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, _TILE, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        dtype: gl.constexpr = query_ptr.dtype.element_ty
        qk_scale = scale * LOG2E
        offs_m = wg * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, io_layout))
        offs_c = gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout))
        srow = wg * 64 + gl.arange(0, 64, layout=row_layout)
        ocol = gl.arange(0, 64, layout=col_layout)
        it = gl.program_id(0) * 0  # tiles consumed so far: the stage and barrier phase of the next
        tails = gl.program_id(0) * 0  # uses of tail_bar so far: its phase
        for r in range(0, (num_work + gl.num_programs(0) - 1) // gl.num_programs(0)):
            (valid, kv_head, head_group, q_start, q_len, q_block_start, context, seq_len, kv_hi, n_tiles, n_full,
             num_pages, seq_row_ptr) = _work(r, num_work, query_start_loc_ptr, seq_lens_ptr, block_table_ptr,
                                             stride_qsl, stride_sl, stride_bt_seq, num_seqs, num_tokens, max_blocks,
                                             num_q_blocks, kv_groups, NUM_HEAD_GROUPS, BLOCK_Q, BLOCK_SIZE, CAUSAL)
            # unmasked tiles skip the block-id checks: one pass over their ids proves them in range
            bad = gl.zeros([128], gl.int32, ids_layout)
            full_pages = (n_full * _TILE + BLOCK_SIZE - 1) // BLOCK_SIZE
            for p0 in range(0, full_pages, 128):
                pages = p0 + gl.arange(0, 128, layout=ids_layout)
                ids = gl.load(seq_row_ptr + pages * stride_bt_block, mask=pages < full_pages, other=0)
                bad += ((ids < 0) | (ids >= num_blocks)).to(gl.int32)
            n_full = gl.where(gl.sum(bad, 0) > 0, 0, n_full)

            # -- Q rows: query token (row // HEADS) x query head (row % HEADS) of this kv head --
            local = q_block_start + offs_m // HEADS
            head = kv_head * GROUP + head_group * HEADS + offs_m % HEADS
            row_ok = (offs_m // HEADS < BLOCK_Q) & (head_group * HEADS + offs_m % HEADS < GROUP) & (local < q_len)
            tok = q_start + local
            row_ok = row_ok & (tok >= 0) & (tok < num_tokens) & valid
            q_rows = gl.expand_dims(tok.to(gl.int64) * stride_q_tok + head * stride_q_head, 1)
            for h in gl.static_range(DH):
                q = gl.load(query_ptr + q_rows + gl.expand_dims(offs_c + h * 64, 0),
                            mask=gl.expand_dims(row_ok, 1), other=0.0)
                q_smem_all.index(wg * DH + h).store(q)
            fence_async_shared()
            thread_barrier()

            pos = context + q_block_start + srow // HEADS  # a row's position (rows past BLOCK_Q: not stored)
            m_i = gl.full([64], float("-inf"), gl.float32, row_layout)
            l_i = gl.zeros([64], gl.float32, row_layout)
            o0 = gl.zeros([64, 64], gl.float32, s_layout)
            o1 = gl.zeros([64, 64], gl.float32, s_layout)
            if n_tiles > 0:
                # tile 0, masked: its scores alone
                stage = it % STAGES
                mbarrier.wait(k_ready.index(stage), (it // STAGES) & 1)
                s = _scores(q_smem_all, wg, k_smem, stage, s_layout, DH)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
                mbarrier.arrive(k_empty.index(stage))
                p, m_i, l_i, alpha = _softmax(s, m_i, l_i, 0, kv_hi, pos, seq_row_ptr, stride_bt_block, num_pages,
                                              num_blocks, qk_scale, s_layout, BLOCK_SIZE, True, CAUSAL)
                p = gl.convert_layout(p.to(dtype), p_layout)
                # tiles 1 .. n_full - 1 unmasked, the rest masked
                for j in range(1, n_full):
                    p, m_i, l_i, o0, o1 = _step(it + j, j, q_smem_all, wg, k_smem, v_smem, k_ready, v_ready, k_empty,
                                                v_empty, p, m_i, l_i, o0, o1, kv_hi, pos, seq_row_ptr, stride_bt_block,
                                                num_pages, num_blocks, qk_scale, s_layout, p_layout, BLOCK_SIZE, DH,
                                                STAGES, False, CAUSAL)
                for j in range(gl.maximum(n_full, 1), n_tiles):
                    p, m_i, l_i, o0, o1 = _step(it + j, j, q_smem_all, wg, k_smem, v_smem, k_ready, v_ready, k_empty,
                                                v_empty, p, m_i, l_i, o0, o1, kv_hi, pos, seq_row_ptr, stride_bt_block,
                                                num_pages, num_blocks, qk_scale, s_layout, p_layout, BLOCK_SIZE, DH,
                                                STAGES, True, CAUSAL)
                # P @ V of the last tile; its V rows past the sequence end zeroed first, half by each
                # warpgroup, both waiting for both (the cache there may hold NaN; 0 * NaN is NaN)
                g = it + n_tiles - 1
                stage = g % STAGES
                mbarrier.wait(v_ready.index(stage), (g // STAGES) & 1)
                tail = seq_len - (n_tiles - 1) * _TILE
                if tail < _TILE:
                    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
                    zrows = wg * 32 + gl.arange(0, 32, layout=gl.SliceLayout(1, zl))
                    for h in gl.static_range(DH):
                        buf = v_smem.index(stage * DH + h).slice(wg * 32, 32)
                        v = buf.load(zl)
                        buf.store(gl.where(gl.expand_dims(zrows < tail, 1), v, gl.zeros_like(v)))
                    fence_async_shared()
                    thread_barrier()
                    mbarrier.arrive(tail_bar.index(0))
                    mbarrier.wait(tail_bar.index(0), tails & 1)
                    tails += 1
                o0 = warpgroup_mma(p, v_smem.index(stage * DH), o0, is_async=True)
                if DH == 2:
                    o1 = warpgroup_mma(p, v_smem.index(stage * DH + 1), o1, is_async=True)
                    o0, o1, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, p))
                else:
                    o0, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, p))
                mbarrier.arrive(v_empty.index(stage))
            it += n_tiles

            # -- epilogue: out = O / l, lse = (m + log2 l) * ln 2; rows without keys 0 and -inf --
            has_keys = l_i != 0.0
            inv_l = gl.where(has_keys, 1.0 / gl.where(has_keys, l_i, 1.0), 0.0)
            o_local = q_block_start + srow // HEADS
            o_head_in_group = head_group * HEADS + srow % HEADS
            o_tok = q_start + o_local
            o_ok = (srow // HEADS < BLOCK_Q) & (o_head_in_group < GROUP) & (o_local < q_len)
            o_ok = o_ok & (o_tok >= 0) & (o_tok < num_tokens) & valid
            o_head = kv_head * GROUP + o_head_in_group
            o_rows = gl.expand_dims(o_tok.to(gl.int64) * stride_o_tok + o_head * stride_o_head, 1)
            o_mask = gl.expand_dims(o_ok, 1)
            gl.store(out_ptr + o_rows + gl.expand_dims(ocol, 0),
                     (o0 * gl.expand_dims(inv_l, 1)).to(out_ptr.dtype.element_ty), mask=o_mask)
            if DH == 2:
                gl.store(out_ptr + o_rows + gl.expand_dims(ocol + 64, 0),
                         (o1 * gl.expand_dims(inv_l, 1)).to(out_ptr.dtype.element_ty), mask=o_mask)
            if HAS_LSE:
                lse = gl.where(has_keys, (m_i + gl.log2(gl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
                gl.store(lse_ptr + o_tok.to(gl.int64) * stride_lse_tok + o_head * stride_lse_head, lse, mask=o_ok)

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "num_q_blocks", "num_work"])
    def _prefill_sm90_kernel(
        query_ptr,  # [T, Hq, D]
        k_desc, v_desc,  # TMA descriptors of the caches as [NB * BS, Hkv * D], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, Hq, D]; [T, Hq] float32 (HAS_LSE)
        scale,  # float > 0
        num_tokens, num_seqs, num_blocks, max_blocks, num_q_blocks, kv_groups, num_work,
        # each cache's [rows, W] view (_sm90.row_layout): rows a block, rows and columns a kv head, past-the-end row
        k_block_rows, k_head_rows, k_head_cols, k_end_row, v_block_rows, v_head_rows, v_head_cols, v_end_row,
        stride_q_tok, stride_q_head, stride_bt_seq, stride_bt_block, stride_sl, stride_qsl,
        stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head,
        GROUP: gl.constexpr, HEADS: gl.constexpr, NUM_HEAD_GROUPS: gl.constexpr, BLOCK_Q: gl.constexpr,
        HEAD_SIZE: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    ):
        """Persistent: program p runs work items p, p + G, ... (G programs, at most one an SM;
        ``_work``), its producer loading ahead across items."""
        DH: gl.constexpr = HEAD_SIZE // 64
        dtype: gl.constexpr = query_ptr.dtype.element_ty
        smem_layout: gl.constexpr = k_desc.layout  # 128-byte swizzle: rows of 64 bf16/fp16
        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(dtype, [2 * DH, 64, 64], q_layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES * DH, _TILE, 64], smem_layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES * DH, _TILE, 64], smem_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        tail_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # one arrival from each consumer warpgroup
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.init(tail_bar.index(0), count=2)
        fence_async_shared()

        # the two consumers' arguments written out: a tuple built as ``(0, ) + args`` reaches the
        # partition with its warpgroup index as a tensor, which Gluon's constexpr slicing refuses
        gl.warp_specialize([
            (_consumer, (0, query_ptr, out_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                         tail_bar, query_start_loc_ptr, seq_lens_ptr, block_table_ptr, scale, stride_q_tok,
                         stride_q_head, stride_bt_seq, stride_bt_block, stride_sl, stride_qsl, stride_o_tok,
                         stride_o_head, stride_lse_tok, stride_lse_head, num_seqs, num_tokens, num_blocks, max_blocks,
                         num_q_blocks, kv_groups, num_work, GROUP, HEADS, NUM_HEAD_GROUPS, BLOCK_Q,
                         HEAD_SIZE, BLOCK_SIZE, STAGES, CAUSAL, HAS_LSE)),
            (_consumer, (1, query_ptr, out_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                         tail_bar, query_start_loc_ptr, seq_lens_ptr, block_table_ptr, scale, stride_q_tok,
                         stride_q_head, stride_bt_seq, stride_bt_block, stride_sl, stride_qsl, stride_o_tok,
                         stride_o_head, stride_lse_tok, stride_lse_head, num_seqs, num_tokens, num_blocks, max_blocks,
                         num_q_blocks, kv_groups, num_work, GROUP, HEADS, NUM_HEAD_GROUPS, BLOCK_Q,
                         HEAD_SIZE, BLOCK_SIZE, STAGES, CAUSAL, HAS_LSE)),
            (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, query_start_loc_ptr,
                         seq_lens_ptr, block_table_ptr, stride_qsl, stride_sl, stride_bt_seq, stride_bt_block,
                         num_seqs, num_tokens, num_blocks, max_blocks, num_q_blocks, kv_groups, num_work,
                         k_block_rows, k_head_rows, k_head_cols, k_end_row, v_block_rows, v_head_rows, v_head_cols,
                         v_end_row, NUM_HEAD_GROUPS, BLOCK_Q, HEAD_SIZE, BLOCK_SIZE, BOX, STAGES, CAUSAL)),
        ], [4, 1], [CONSUMER_REGS, REGS_PRODUCER])
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_ready.index(i))
            mbarrier.invalidate(v_ready.index(i))
            mbarrier.invalidate(k_empty.index(i))
            mbarrier.invalidate(v_empty.index(i))
        mbarrier.invalidate(tail_bar.index(0))


def _launch(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
            query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
            rows: tuple[int, int, int, int]) -> None:
    """One launch of the kernel (``rows``: ``prefill._rows`` of the call, BLOCK_M 128), through
    the launcher of these shapes and strides (``_launcher``, kept in ``_LAUNCHERS``)."""
    key = (query.shape, query.stride(), key_cache.shape, key_cache.dtype, value_cache.dtype, block_table.shape,
           block_table.stride(), seq_lens.stride(0), query_start_loc.stride(0), out.stride(),
           None if lse is None else lse.stride(), query.device, float(scale), bool(causal), rows)
    go = _sm90.kept_launcher(_LAUNCHERS, key, lambda: _launcher(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, rows))
    go(query, query_ptr=query, k_desc=key_cache, v_desc=value_cache, block_table_ptr=block_table,
       seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
       lse_ptr=lse if lse is not None else out)


_LAUNCHERS: dict[tuple, object] = {}


def _launcher(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
              query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
              rows: tuple[int, int, int, int]):
    """The kernel's ``_launch.launcher`` for calls shaped like this one: every argument but the
    tensors fixed, the caches' TMA descriptors encoded once per cache address
    (``_sm90.descriptor_spec``). ``go(query, query_ptr=, k_desc=key_cache, v_desc=value_cache,
    block_table_ptr=, seq_lens_ptr=, query_start_loc_ptr=, out_ptr=, lse_ptr=)`` (``lse_ptr=out``
    without an LSE)."""
    num_tokens, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs, max_blocks = block_table.shape
    _, block_q, heads, num_head_groups = rows
    num_q_blocks = num_tokens // block_q + num_seqs + 1
    box = min(block_size, TILE_N)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    kv_groups = num_kv_heads * num_head_groups
    num_work = kv_groups * num_q_blocks
    grid = (min(num_work, pa._num_sms(query.device)),)
    k_rows, v_rows = _sm90.row_layout(key_cache), _sm90.row_layout(value_cache)
    return launcher(
        _prefill_sm90_kernel, grid,
        k_desc=_sm90.descriptor_spec(key_cache, box), v_desc=_sm90.descriptor_spec(value_cache, box),
        **({} if lse is not None else {"lse_ptr": same_as("out_ptr")}),
        scale=float(scale), num_tokens=num_tokens, num_seqs=num_seqs, num_blocks=num_blocks, max_blocks=max_blocks,
        num_q_blocks=num_q_blocks, kv_groups=kv_groups, num_work=num_work,
        k_block_rows=k_rows[0], k_head_rows=k_rows[1], k_head_cols=k_rows[2], k_end_row=_sm90.view_rows(key_cache),
        v_block_rows=v_rows[0], v_head_rows=v_rows[1], v_head_cols=v_rows[2], v_end_row=_sm90.view_rows(value_cache),
        stride_q_tok=query.stride(0),
        stride_q_head=query.stride(1), stride_bt_seq=block_table.stride(0), stride_bt_block=block_table.stride(1),
        stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0), stride_o_tok=out.stride(0),
        stride_o_head=out.stride(1), stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        GROUP=num_heads // num_kv_heads, HEADS=heads, NUM_HEAD_GROUPS=num_head_groups, BLOCK_Q=block_q,
        HEAD_SIZE=head_size, BLOCK_SIZE=block_size, BOX=box, STAGES=STAGES,
        CAUSAL=bool(causal), HAS_LSE=lse is not None, CONSUMER_REGS=REGS_CONSUMER,
        num_warps=NUM_WARPS,
    )


@torch.library.custom_op("paged_attn::_prefill_sm90", mutates_args=("out", "lse"))
def _prefill_sm90(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                  query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
                  block_q: int, heads: int, num_head_groups: int) -> None:
    """This kernel over a paged cache into ``out`` and, when given, ``lse``: an opaque op, so that
    Inductor, tracing the public op's body, sees one extern call (a Gluon kernel with TMA
    descriptors is not one ``wrap_triton`` launches)."""
    if query.shape[0] == 0:
        return
    _launch(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal,
            (BLOCK_M, block_q, heads, num_head_groups))


@_prefill_sm90.register_fake
def _(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, block_q,
      heads, num_head_groups):
    return None


def prepare(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
            query_start_loc: Tensor, out: Tensor, lse: Tensor | None, *, scale: float, causal: bool,
            rows: tuple[int, int, int, int]) -> Callable[..., None]:
    """The runner of this kernel for calls shaped like this one (``paged_attention.
    prepare_paged_attention`` documents the runner); ``rows`` from ``prefill._rows``. Every launch
    argument but the tensors is fixed here (``_launcher``)."""
    from .. import plain_eager

    _, block_q, heads, num_head_groups = rows
    scale, causal = float(scale), bool(causal)
    go = _launcher(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal,
                   rows)
    has_lse = lse is not None

    def run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        if plain_eager(query):  # the op's body directly: nothing traces
            go(query, query_ptr=query, k_desc=key_cache, v_desc=value_cache, block_table_ptr=block_table,
               seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
               lse_ptr=lse if has_lse else out)
        else:
            torch.ops.paged_attn._prefill_sm90(query, key_cache, value_cache, block_table, seq_lens,
                                               query_start_loc, out, lse, scale, causal, block_q, heads,
                                               num_head_groups)

    return run
