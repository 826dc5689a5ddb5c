"""MLA decode on Hopper (sm_90) in Gluon for 64-head groups: the latent tile loaded once by TMA,
both wgmma products split between two warpgroups without doing either twice, split-KV for
small batches.

Computes what ``mla._mla_kernel`` computes (absorbed MLA decode: every head attends to the rows
``[c | k_pe]`` of a paged latent cache, the latent ``c`` is the value too) for the calls it takes
(``declines`` says which): bf16/fp16 queries and cache, latent 512 and rope 64 (any latent that
is a multiple of 128 and rope 64), 64 heads a program (``H`` a multiple of 64), block sizes that
are powers of two >= 8, a contiguous cache, no fp8; ``mla.prepare_mla_decode`` also keeps it off
batch-invariant mode and tables under ``mla._GLUON_MIN_KEYS`` keys, and plans its splits.

The split of the work follows FlashMLA's reasoning (the [64, 512] float32 accumulator does not
fit one warpgroup beside the scores): of each 64-key tile, warpgroup w computes the scores of keys
``[32 w, 32 w + 32)`` over all 576 columns (``S_w = Q [c | k_pe]_w^T``, Q from shared memory) and
accumulates output columns ``[256 w, 256 w + 256)`` of all 64 keys (``O_w += P c[:, cols_w]``).
The two exchange through shared memory, per tile: their row maxima (so both use one running max),
then their halves of P (bf16, 4 KiB each); each keeps its own partial row sum, added at the end.
So each warpgroup issues 9 score wgmmas of N = 32 and 8 value wgmmas of K = 32, N = 64 a tile,
and neither the latent tile nor any product is computed twice. A producer warp issues the TMA
copies (one box of ``min(BS, 64)`` rows x 64 columns a copy; a block id outside ``[0, NB)`` or a
page past the sequence reads zeros from past the cache's last row), ``STAGES`` tiles ahead.

One tile at a time: scores, softmax, values, then the stage goes back to the producer. Issuing
tile j + 1's scores before tile j's values (FlashAttention-3's order) kept two stages busy, so
the producer could load tile j + 2 only once tile j's values were done: the consumers waited on
TMA (Nsight Compute, B64 x 4096 H128: 21 % of warp samples at the consumers' waits for loaded
tiles) and the kernel took 234-247 us; one tile at a time, 169-173 us; tile j's values issued
before tile j + 1's scores (the stage released after the values, the softmax alone on the
critical path), 180-183 (H100, CUDA-graph replays; benchmarks/results/gpu-2026-11-24c/).

Split-KV (``launch`` with 4-D ``out``): program (token, head group, split) covers keys
``[split * split_tokens, +split_tokens)`` (a multiple of the tile) and writes the normalised
partial output and its log2 LSE (0 and -inf for no keys) for ``mla``'s combine kernel.

Layouts: q_latent/out ``[T, H, L]``, q_rope ``[T, H, R]`` (any strides, last one 1), kv_cache
``[NB, BS, L + R]`` contiguous (a 2-D ``[NB * BS, L + R]`` TMA view); partials ``[T, S, H, L]``
and ``[T, S, H]`` float32. Grid: (token, head group, split), one program an item. Shared memory:
Q ``64 x (L + R) x 2`` + ``STAGES x 64 x (L + R) x 2`` + P ``64 x 64 x 2`` bytes (216 KiB + 8 KiB
at 576 columns and 2 stages): one program an SM. Bytes moved: ``sum_t seq_len_t * G * (L + R) *
cache_bytes`` (G head groups; the second group's reads mostly from L2) + ``T * H * (2L + R) *
q_bytes`` (+ ``T * S * H * (L + 1) * 8`` for the partials, written and read once).

Where the time goes (B64 x 4096 H128, 172 us, FlashInfer 136 us; Nsight Compute, one launch):
each tile's chain of scores (N = 32 wgmmas read 3 KiB of shared memory per 16 tensor cycles:
bound by shared-memory bandwidth, not the tensor cores), two barrier exchanges and the values
leaves the tensor pipe about 44 % busy and 0.47 warps eligible per scheduler; overlapping one
tile's softmax with the other's products (FlashMLA's two tiles per pair, one per warpgroup, N =
64 scores) is what would close it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _sm90
from ._launch import launch as kernel_launch

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
TILE_N = 64  # keys a tile (32 each warpgroup's scores)
HEADS = 64  # rows a program
STAGES = 2  # latent tiles in flight (72 KiB each at 576 columns; the most that fit beside Q)
NUM_WARPS = 4  # the first consumer warpgroup; the second and the producer warp are added
# The second consumer warpgroup's registers. H100, B64 x 4096 H128, CUDA-graph replays: 172.6 us at
# 224, 174.9 at 208 (mla-probe-split2.txt); sm_90 SASS (Triton 3.6): 9 spill instructions (scalars,
# outside the tile loop) at 224, 27 at 208.
REGS_CONSUMER = 224
REGS_PRODUCER = 24


def declines(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor) -> str | None:
    """Why this kernel does not take the call (None: it takes it). Static facts only."""
    reason = _sm90.unavailable(q_latent)
    if reason:
        return reason
    if q_latent.dtype not in (torch.bfloat16, torch.float16) or q_rope.dtype != q_latent.dtype \
            or kv_cache.dtype != q_latent.dtype:
        return "dtype: bf16/fp16 queries and cache of the same dtype only"
    latent, rope = q_latent.shape[2], q_rope.shape[2]
    if latent % 128 or rope != 64 or latent + rope > 576:
        return "latent a multiple of 128 up to 512, rope 64"
    num_heads = q_latent.shape[1]
    if num_heads % HEADS:
        return "heads: a multiple of 64"
    reason = _sm90.cache_declines((kv_cache,))
    if reason:
        return reason
    if q_latent.stride(2) != 1 or q_rope.stride(2) != 1:
        return "queries: contiguous last dimension"
    return None


if gluon is not None:
    _TILE = gl.constexpr(TILE_N)
    _ROWS = gl.constexpr(HEADS)
    _LOG2E = gl.constexpr(LOG2E)
    _LN2 = gl.constexpr(LN2)
    REGS_PRODUCER = gl.constexpr(REGS_PRODUCER)

    @gluon.jit
    def _page_row(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE: gl.constexpr):
        """The cache row holding key ``key0``; past the last row (TMA reads zeros there) for a page
        past ``num_pages`` or an id outside ``[0, num_blocks)``."""
        page = key0 // BLOCK_SIZE
        blk = gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)
        ok = (blk >= 0) & (blk < num_blocks)
        return gl.where(ok, blk * BLOCK_SIZE + key0 % BLOCK_SIZE, num_blocks * BLOCK_SIZE)

    @gluon.jit
    def _producer(kv_desc, kv_smem, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
                  STAGES: gl.constexpr):
        """One warp: the latent tiles, ``STAGES`` ahead, each stage refilled once both warpgroups
        released it."""
        PAGES: gl.constexpr = _TILE // BOX
        nbytes: gl.constexpr = _TILE * 64 * 2 * CHUNKS
        for j in range(n_tiles):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(stage), nbytes)
            for i in gl.static_range(PAGES):
                row = _page_row(key_lo + j * _TILE + i * BOX, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE)
                for c in gl.static_range(CHUNKS):
                    tma.async_copy_global_to_shared(kv_desc, [row, c * 64], ready.index(stage),
                                                    kv_smem.index(stage * CHUNKS + c).slice(i * BOX, BOX))

    @gluon.jit
    def _scores(q_smem, kv_smem, stage, wg: gl.constexpr, s_layout: gl.constexpr, CHUNKS: gl.constexpr):
        """Issue ``S_w`` [64, 32] of the tile in ``stage``: warpgroup ``wg``'s 32 keys over all
        ``64 CHUNKS`` columns (asynchronous; the caller waits)."""
        s = gl.zeros([_ROWS, 32], gl.float32, s_layout)
        for c in gl.static_range(CHUNKS):
            s = warpgroup_mma(q_smem.index(c), kv_smem.index(stage * CHUNKS + c).slice(wg * 32, 32).permute((1, 0)),
                              s, use_acc=c > 0, is_async=True)
        return s

    @gluon.jit
    def _softmax(s, t, m_i, l_i, wg: gl.constexpr, mx_smem, mx_bar, seq_row_ptr, stride_bt_block, num_pages,
                 num_blocks, key_lo, kv_hi, pos, qk_scale, s_layout: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                 CAUSAL: gl.constexpr):
        """Tile ``t``'s scores ``s`` (this warpgroup's keys) masked, the tile's row maxima exchanged
        so both warpgroups share one running max; returns ``(p, m_new, l_new, alpha)``, ``l`` this
        warpgroup's partial row sum."""
        keys = key_lo + t * _TILE + wg * 32 + gl.arange(0, 32, layout=gl.SliceLayout(0, s_layout))
        page = keys // BLOCK_SIZE
        blk = gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)
        key_ok = (blk >= 0) & (blk < num_blocks) & (keys < kv_hi)
        if CAUSAL:
            key_ok = key_ok & (keys <= pos)
        s = gl.where(gl.expand_dims(key_ok, 0), s, float("-inf"))
        m_w = gl.max(s, 1) * qk_scale
        mx_smem.index(wg).store(m_w)
        mbarrier.arrive(mx_bar.index(0))
        mbarrier.wait(mx_bar.index(0), t & 1)
        m_other = mx_smem.index(1 - wg).load(gl.SliceLayout(1, s_layout))
        m_new = gl.maximum(m_i, gl.maximum(m_w, m_other))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: p = 0, not NaN
        alpha = gl.exp2(m_i - m_ref)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref, 1))
        l_new = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_new, alpha

    @gluon.jit
    def _publish(p, t, wg: gl.constexpr, p_smem, p_free, p_bar, kv_smem, key_lo, kv_hi, n_tiles, CHUNKS: gl.constexpr,
                 STAGES: gl.constexpr):
        """This warpgroup's half of tile ``t``'s P into shared memory once both finished the last
        P @ V; on the last tile, its half of the value rows past ``kv_hi`` zeroed (the cache may
        hold NaN there; 0 * NaN is NaN); then both wait for both."""
        mbarrier.wait(p_free.index(0), (t & 1) ^ 1)
        p_smem.index(wg).store(p.to(p_smem.dtype))
        tail = kv_hi - key_lo - t * _TILE
        if (t == n_tiles - 1) & (tail < _TILE):
            zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
            zrows = wg * 32 + gl.arange(0, 32, layout=gl.SliceLayout(1, zl))
            stage = t % STAGES
            for c in gl.static_range(CHUNKS - 1):
                buf = kv_smem.index(stage * CHUNKS + c).slice(wg * 32, 32)
                v = buf.load(zl)
                buf.store(gl.where(gl.expand_dims(zrows < tail, 1), v, gl.zeros_like(v)))
        fence_async_shared()
        mbarrier.arrive(p_bar.index(0))
        mbarrier.wait(p_bar.index(0), t & 1)

    @gluon.jit
    def _values(o0, o1, o2, o3, alpha, p_smem, kv_smem, stage, wg: gl.constexpr, orow_layout: gl.constexpr,
                CHUNKS: gl.constexpr, VCH: gl.constexpr):
        """Rescale this warpgroup's output columns by ``alpha`` and issue ``O_w += P c[:, cols_w]``
        of the tile in ``stage``: P [64, 64] from shared memory in two K = 32 halves (one from each
        warpgroup), ``2 VCH`` asynchronous wgmma groups."""
        a = gl.expand_dims(gl.convert_layout(alpha, orow_layout), 1)
        o0 = o0 * a
        o1 = o1 * a
        o2 = o2 * a
        o3 = o3 * a
        base = stage * CHUNKS + wg * VCH
        for half in gl.static_range(2):
            ph = p_smem.index(half)
            o0 = warpgroup_mma(ph, kv_smem.index(base).slice(half * 32, 32), o0, is_async=True)
            if VCH > 1:
                o1 = warpgroup_mma(ph, kv_smem.index(base + 1).slice(half * 32, 32), o1, is_async=True)
            if VCH > 2:
                o2 = warpgroup_mma(ph, kv_smem.index(base + 2).slice(half * 32, 32), o2, is_async=True)
            if VCH > 3:
                o3 = warpgroup_mma(ph, kv_smem.index(base + 3).slice(half * 32, 32), o3, is_async=True)
        return o0, o1, o2, o3

    @gluon.jit
    def _consumer(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, q_smem, kv_smem, p_smem, mx_smem,
                  l_smem, ready, empty, q_bar, mx_bar, p_bar, p_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, key_lo, n_tiles, kv_hi, pos, scale, tok, head0,
                  stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head,
                  stride_lse_tok, stride_lse_head,
                  LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr):
        """Warpgroup ``wg``: scores of keys ``[32 wg, 32 wg + 32)`` of each tile, output columns
        ``[LATENT / 2 * wg, ...)`` of all its keys."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1  # the latent's 64-column chunks and the rope
        VCH: gl.constexpr = LATENT // 128  # value chunks of this warpgroup
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 32, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 64, 16])
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])

        # -- Q [64 heads, L + R] into shared memory: this warpgroup's share of the chunks --
        offs_h = head0 + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, io_layout))
        offs_c = gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout))
        ql_rows = gl.expand_dims(tok.to(gl.int64) * stride_ql_tok + offs_h * stride_ql_head, 1)
        qr_rows = gl.expand_dims(tok.to(gl.int64) * stride_qr_tok + offs_h * stride_qr_head, 1)
        for c in gl.static_range(CHUNKS):
            if c % 2 == wg:
                if c < CHUNKS - 1:
                    q = gl.load(q_latent_ptr + ql_rows + gl.expand_dims(offs_c + c * 64, 0))
                else:
                    q = gl.load(q_rope_ptr + qr_rows + gl.expand_dims(offs_c, 0))
                q_smem.index(c).store(q)
        fence_async_shared()
        mbarrier.arrive(q_bar.index(0))
        mbarrier.wait(q_bar.index(0), 0)

        qk_scale = scale * _LOG2E
        m_i = gl.full([_ROWS], float("-inf"), gl.float32, row_layout)
        l_i = gl.zeros([_ROWS], gl.float32, row_layout)
        o0 = gl.zeros([_ROWS, 64], gl.float32, o_layout)
        o1 = gl.zeros([_ROWS, 64], gl.float32, o_layout)
        o2 = gl.zeros([_ROWS, 64], gl.float32, o_layout)
        o3 = gl.zeros([_ROWS, 64], gl.float32, o_layout)
        # one tile at a time: its stage is released as soon as its values are done, so the
        # producer loads tile j + 1 (and the next) during all of tile j
        for j in range(n_tiles):
            stage = j % STAGES
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            s = _scores(q_smem, kv_smem, stage, wg, s_layout, CHUNKS)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            p, m_i, l_i, alpha = _softmax(s, j, m_i, l_i, wg, mx_smem, mx_bar, seq_row_ptr, stride_bt_block,
                                          num_pages, num_blocks, key_lo, kv_hi, pos, qk_scale, s_layout,
                                          BLOCK_SIZE, CAUSAL)
            _publish(p, j, wg, p_smem, p_free, p_bar, kv_smem, key_lo, kv_hi, n_tiles, CHUNKS, STAGES)
            o0, o1, o2, o3 = _values(o0, o1, o2, o3, alpha, p_smem, kv_smem, stage, wg, orow_layout, CHUNKS,
                                     VCH)
            o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
            mbarrier.arrive(p_free.index(0))
            mbarrier.arrive(empty.index(stage))

        # -- epilogue: l = l_0 + l_1 (both add in that order), out = O / l, lse = (m + log2 l) ln 2 --
        l_smem.index(wg).store(l_i)
        mbarrier.arrive(l_bar.index(0))
        mbarrier.wait(l_bar.index(0), 0)
        l_tot = l_smem.index(0).load(row_layout) + l_smem.index(1).load(row_layout)
        has_keys = l_tot != 0.0
        inv_l = gl.convert_layout(gl.where(has_keys, 1.0 / gl.where(has_keys, l_tot, 1.0), 0.0), orow_layout)
        orows = head0 + gl.arange(0, _ROWS, layout=orow_layout)
        ocol = gl.arange(0, 64, layout=gl.SliceLayout(0, o_layout))
        o_rows = gl.expand_dims(tok.to(gl.int64) * stride_o_tok + orows * stride_o_head, 1)
        o_mask = gl.expand_dims(orows >= 0, 1)  # every row, padding tokens' too (0 and -inf: no tiles)
        col0 = wg * (LATENT // 2)
        odt: gl.constexpr = out_ptr.dtype.element_ty
        scale_rows = gl.expand_dims(inv_l, 1)
        gl.store(out_ptr + o_rows + gl.expand_dims(col0 + ocol, 0), (o0 * scale_rows).to(odt), mask=o_mask)
        if VCH > 1:
            gl.store(out_ptr + o_rows + gl.expand_dims(col0 + 64 + ocol, 0), (o1 * scale_rows).to(odt), mask=o_mask)
        if VCH > 2:
            gl.store(out_ptr + o_rows + gl.expand_dims(col0 + 128 + ocol, 0), (o2 * scale_rows).to(odt), mask=o_mask)
        if VCH > 3:
            gl.store(out_ptr + o_rows + gl.expand_dims(col0 + 192 + ocol, 0), (o3 * scale_rows).to(odt), mask=o_mask)
        if HAS_LSE:
            if wg == 0:
                lse = gl.where(has_keys, (m_i + gl.log2(gl.where(has_keys, l_tot, 1.0))) * LSE_UNIT, float("-inf"))
                mrows = head0 + gl.arange(0, _ROWS, layout=row_layout)
                gl.store(lse_ptr + tok.to(gl.int64) * stride_lse_tok + mrows * stride_lse_head, lse)

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _mla_sm90_kernel(
        q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
        kv_desc,  # TMA descriptor of the cache as [NB * BS, L + R], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, H, L] or partials [T, S, H, L] float32; [T, H] or [T, S, H] float32
        scale,
        num_tokens, num_seqs, num_blocks, max_blocks, split_tokens,
        stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_bt_seq, stride_bt_block,
        stride_sl, stride_qsl, stride_o_tok, stride_o_split, stride_o_head,
        stride_lse_tok, stride_lse_split, stride_lse_head,
        LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    ):
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        dtype: gl.constexpr = q_latent_ptr.dtype.element_ty
        tok = gl.program_id(0)
        head0 = gl.program_id(1) * _ROWS
        split = gl.program_id(2)  # keys [split * split_tokens, + split_tokens), a multiple of the tile
        out_ptr += split.to(gl.int64) * stride_o_split
        lse_ptr += split.to(gl.int64) * stride_lse_split
        # -- the token's sequence: the last b with query_start_loc[b] <= tok --
        lo_s = tok * 0
        hi_s = num_seqs - 1
        while lo_s < hi_s:
            mid = (lo_s + hi_s + 1) // 2
            below = gl.load(query_start_loc_ptr + mid * stride_qsl) <= tok
            lo_s = gl.where(below, mid, lo_s)
            hi_s = gl.where(below, hi_s, mid - 1)
        seq = lo_s
        has_seq = seq < num_seqs
        q_end = gl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=has_seq, other=0)
        tok_ok = tok < q_end  # padding tokens past query_start_loc[-1]: no keys (0 and -inf)
        seq_len = gl.where(tok_ok, gl.load(seq_lens_ptr + seq * stride_sl, mask=has_seq, other=0), 0)
        pos = seq_len - (q_end - tok)  # the token's position (causal: keys <= pos)
        kv_hi = gl.minimum(seq_len, max_blocks * BLOCK_SIZE)
        if CAUSAL:
            kv_hi = gl.minimum(kv_hi, pos + 1)
        kv_hi = gl.maximum(kv_hi, 0)
        key_lo = split * split_tokens
        n_tiles = (gl.maximum(gl.minimum(kv_hi, key_lo + split_tokens) - key_lo, 0) + _TILE - 1) // _TILE
        num_pages = gl.minimum((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE, max_blocks)
        seq_row_ptr = block_table_ptr + seq.to(gl.int64) * stride_bt_seq

        smem_layout: gl.constexpr = kv_desc.layout
        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        q_smem = gl.allocate_shared_memory(dtype, [CHUNKS, _ROWS, 64], q_layout)
        kv_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, _TILE, 64], smem_layout)
        p_smem = gl.allocate_shared_memory(dtype, [2, _ROWS, 32], p_layout)
        mx_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mx_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        l_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        mbarrier.init(q_bar.index(0), count=2)
        mbarrier.init(mx_bar.index(0), count=2)
        mbarrier.init(p_bar.index(0), count=2)
        mbarrier.init(p_free.index(0), count=2)
        mbarrier.init(l_bar.index(0), count=2)
        fence_async_shared()

        gl.warp_specialize([
            (_consumer, (0, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, q_smem, kv_smem, p_smem, mx_smem, l_smem,
                         ready, empty, q_bar, mx_bar, p_bar, p_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
                         num_blocks, key_lo, n_tiles, kv_hi, pos, scale, tok, head0, stride_ql_tok, stride_ql_head,
                         stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, LATENT, BLOCK_SIZE, STAGES, CAUSAL, HAS_LSE, LSE_UNIT)),
            (_consumer, (1, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, q_smem, kv_smem, p_smem, mx_smem, l_smem,
                         ready, empty, q_bar, mx_bar, p_bar, p_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
                         num_blocks, key_lo, n_tiles, kv_hi, pos, scale, tok, head0, stride_ql_tok, stride_ql_head,
                         stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, LATENT, BLOCK_SIZE, STAGES, CAUSAL, HAS_LSE, LSE_UNIT)),
            (_producer, (kv_desc, kv_smem, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                         num_blocks, CHUNKS, BLOCK_SIZE, BOX, STAGES)),
        ], [4, 1], [CONSUMER_REGS, REGS_PRODUCER])


def launch(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
           query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
           split_tokens: int) -> None:
    """One launch: grid (tokens, head groups of 64, splits). ``out`` [T, H, L] and ``lse`` [T, H]
    (natural log; may be None) take the attention itself; 4-D ``out`` [T, S, H, L] and 3-D ``lse``
    [T, S, H] (float32) take the partial state of each split of ``split_tokens`` keys (a multiple
    of the tile; ``out`` normalised, ``lse`` in log2) for ``mla``'s combine kernel. Through the
    package's cached launcher (``_launch.launch``): ``kernel[grid]`` binds and specialises every
    argument per call, about 100 us of host time for this kernel (H100 host, Triton 3.6,
    benchmarks/results/gpu-2026-11-24c/eager-probe.txt)."""
    num_tokens, num_heads, latent = q_latent.shape
    num_blocks, block_size, _ = kv_cache.shape
    num_seqs, max_blocks = block_table.shape
    if out.dim() == 4:
        num_splits = out.shape[1]
        so, sl, lse_unit = out.stride()[:3], lse.stride(), 1.0
    else:
        num_splits, lse_unit = 1, LN2
        so = (out.stride(0), 0, out.stride(1))
        sl = (lse.stride(0), 0, lse.stride(1)) if lse is not None else (0, 0, 0)
    kernel_launch(_mla_sm90_kernel, (num_tokens, num_heads // HEADS, num_splits), q_latent)(
        q_latent_ptr=q_latent, q_rope_ptr=q_rope, kv_desc=_sm90.descriptor(kv_cache, min(block_size, TILE_N)), block_table_ptr=block_table,
        seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
        lse_ptr=lse if lse is not None else out, scale=float(scale), num_tokens=num_tokens, num_seqs=num_seqs,
        num_blocks=num_blocks, max_blocks=max_blocks, split_tokens=split_tokens,
        stride_ql_tok=q_latent.stride(0), stride_ql_head=q_latent.stride(1), stride_qr_tok=q_rope.stride(0),
        stride_qr_head=q_rope.stride(1), stride_bt_seq=block_table.stride(0), stride_bt_block=block_table.stride(1),
        stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0), stride_o_tok=so[0],
        stride_o_split=so[1], stride_o_head=so[2], stride_lse_tok=sl[0], stride_lse_split=sl[1],
        stride_lse_head=sl[2], LATENT=latent, BLOCK_SIZE=block_size, BOX=min(block_size, TILE_N), STAGES=STAGES,
        CAUSAL=bool(causal), HAS_LSE=lse is not None, LSE_UNIT=lse_unit, CONSUMER_REGS=REGS_CONSUMER,
        num_warps=NUM_WARPS,
    )


@torch.library.custom_op("paged_attn::_mla_sm90", mutates_args=("out", "lse"))
def _mla_sm90(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
              query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
              split_tokens: int) -> None:
    """This kernel into ``out`` and, when given, ``lse`` (``launch``): an opaque op, so that
    Inductor, tracing the public op's body, sees one extern call (a Gluon kernel with a TMA
    descriptor is not one ``wrap_triton`` launches)."""
    if q_latent.shape[0] == 0:
        return
    launch(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, split_tokens)


@_mla_sm90.register_fake
def _(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, split_tokens):
    return None


def prepare(*, scale: float, causal: bool, split_tokens: int, workspace=None, combine=None):
    """The runner of this kernel (``mla.prepare_mla_decode`` documents the runner). With a
    ``workspace`` (``paged_attention._Workspace``), the keys are split at multiples of
    ``split_tokens`` into its partials and ``combine(part_out, part_lse, seq_lens,
    query_start_loc, out, lse)`` merges them; otherwise ``split_tokens`` covers every key."""
    from .. import plain_eager

    scale, causal = float(scale), bool(causal)

    def attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse):
        if plain_eager(q_latent):  # the op's body directly: nothing traces
            launch(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal,
                   split_tokens)
        else:
            torch.ops.paged_attn._mla_sm90(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc,
                                           out, lse, scale, causal, split_tokens)

    def run(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        if workspace is None:
            attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse)
            return
        part_out, part_lse = workspace.tensors(out)
        attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, part_out, part_lse)
        combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse)

    return run
