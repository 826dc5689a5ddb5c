"""A probe variant of the narrow Gluon MLA kernel for 32 query rows over a bf16/fp16 cache: the
two warpgroups in their own ``warp_specialize`` partitions, each every tile and its own 16 rows
(token ``wg`` of a 2-token block of 16 heads), beside a producer warp that issues the TMA copies;
no barrier spans the two warpgroups (each its own queries, its own softmax, its own output), and
a stage is refilled once both have multiplied it (its ``empty`` barrier counts two). Launched
in place of ``mla_sm90_narrow._mla_narrow_kernel`` by ``probe_rows.py`` (same arguments; four
warps a partition)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from torch_paged_attn.lowering.triton._sm90 import thread_barrier
from torch_paged_attn.lowering.triton.mla_sm90 import _rings9, _signal_dependents
from torch_paged_attn.lowering.triton.mla_sm90_narrow import (
    _empty_state, _issue, _program, _softmax_scaled, _values, _write, _zero_rows,
)

_TILE = gl.constexpr(64)
_LOG2E = gl.constexpr(1.4426950408889634)
_WG_ROWS = gl.constexpr(16)


@gluon.jit
def _producer(kv_desc, kvs, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
    """One warp: tile j into stage ``j % 2`` once both warpgroups are done with tile ``j - 2``."""
    for j in range(n_tiles):
        st = j % 2
        mbarrier.wait(empty.index(st), ((j // 2) & 1) ^ 1)
        _issue(kv_desc, kvs, ready, st, key_lo + j * _TILE, seq_row_ptr, stride_bt_block, num_pages,
               num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)


@gluon.jit
def _consumer(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kvs, qs, p_smem, ready, empty,
              scale, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, num_blocks,
              seq_row_ptr, stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head,
              stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS: gl.constexpr,
              BLOCK_Q: gl.constexpr, LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr,
              HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr):
    """Warpgroup ``wg``: rows ``[16 wg, 16 wg + 16)`` of the program's 32, over every tile."""
    CHUNKS: gl.constexpr = LATENT // 64 + 1
    VCH: gl.constexpr = LATENT // 64
    acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    col: gl.constexpr = gl.SliceLayout(0, acc)
    key_layout: gl.constexpr = gl.SliceLayout(1, acc)
    qdt: gl.constexpr = qs[0].dtype
    # this warpgroup's 16 rows start SHIFT tokens into the block (HEADS divides 16)
    gl.static_assert(16 % HEADS == 0)
    SHIFT: gl.constexpr = wg * 16 // HEADS
    io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    r_io = gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, io_layout))
    t_io = r_io // HEADS + SHIFT
    ok_io = gl.expand_dims((t_io < BLOCK_Q) & (q_block_start + t_io < q_len), 1)
    tok_io = (q_start + q_block_start + t_io).to(gl.int64)
    ql_rows = gl.expand_dims(tok_io * stride_ql_tok + (r_io % HEADS) * stride_ql_head, 1)
    qr_rows = gl.expand_dims(tok_io * stride_qr_tok + (r_io % HEADS) * stride_qr_head, 1)
    offs_c = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout)), 0)
    qk_scale = scale * _LOG2E
    for c in gl.static_range(CHUNKS):
        if c < CHUNKS - 1:
            q = gl.load(q_latent_ptr + ql_rows + offs_c + c * 64, mask=ok_io, other=0.0)
        else:
            q = gl.load(q_rope_ptr + qr_rows + offs_c, mask=ok_io, other=0.0)
        qs[c].index(0).store(q)
    fence_async_shared()
    thread_barrier()

    r_c = gl.arange(0, _WG_ROWS, layout=col)
    t_c = r_c // HEADS
    pos_c = context + q_block_start + SHIFT + t_c
    m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(_WG_ROWS, acc)
    l_k = o0
    for j in range(n_tiles):
        z = j >> 30
        st = z + (j % 2)
        key0 = key_lo + j * _TILE
        keys = key0 + gl.arange(0, _TILE, layout=key_layout)
        page = keys // BLOCK_SIZE
        blk = gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)
        mbarrier.wait(ready.index(st), (j // 2) & 1)
        s = gl.zeros([_TILE, _WG_ROWS], gl.float32, acc)
        for c in gl.static_range(CHUNKS):
            s = warpgroup_mma(kvs[c].index(st), qs[c].index(z).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        visible = gl.expand_dims((blk >= 0) & (blk < num_blocks) & (keys < kv_end), 1)
        if CAUSAL and BLOCK_Q > 1:
            visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(pos_c, 0))
        p, alpha, m_new = _softmax_scaled(s, visible, m_i, qk_scale)
        m_i = m_new
        a = gl.expand_dims(alpha, 0)
        l_k = l_k * a + p
        o0, o1, o2, o3, o4, o5, o6, o7 = o0 * a, o1 * a, o2 * a, o3 * a, o4 * a, o5 * a, o6 * a, o7 * a
        # value rows past the end to zero: each warpgroup its own copy of the check, the same stores
        # (both write zeros to the same rows; neither reads them before its own fence)
        _zero_rows(kvs, st, kv_end - key0, VCH, 4)
        p_smem.index(wg).store(p.to(qdt))
        fence_async_shared()
        thread_barrier()
        o0, o1, o2, o3, o4, o5, o6, o7 = _values(o0, o1, o2, o3, o4, o5, o6, o7, kvs, st, p_smem.index(wg), VCH)
        mbarrier.arrive(empty.index(st))
    if USE_PDL:
        _signal_dependents()
    l_i = gl.sum(l_k, 0)
    _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, 1.0, r_c, t_c, q_start, q_block_start + SHIFT,
           q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q - SHIFT, _WG_ROWS, VCH,
           False, HAS_LSE, LSE_UNIT, 4)


@gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
def _mla_rows_kernel(
    q_latent_ptr, q_rope_ptr, kv_desc, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr, lse_ptr,
    kv_scale_ptr, scale, num_tokens, num_seqs, num_blocks, max_blocks, split_tokens, block_rows,
    stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_bt_seq, stride_bt_block,
    stride_sl, stride_qsl, stride_o_tok, stride_o_split, stride_o_head,
    stride_lse_tok, stride_lse_split, stride_lse_head,
    HEADS: gl.constexpr, BLOCK_Q: gl.constexpr, ROWS: gl.constexpr,
    LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr,
    WARPS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    CHUNKS: gl.constexpr = LATENT // 64 + 1
    pid_q = gl.program_id(0)
    split = gl.program_id(2)
    out_ptr += split.to(gl.int64) * stride_o_split
    lse_ptr += split.to(gl.int64) * stride_lse_split
    seq, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip = _program(
        pid_q, split, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, num_tokens, num_seqs, max_blocks,
        split_tokens, stride_bt_seq, stride_sl, stride_qsl, BLOCK_Q, BLOCK_SIZE, CAUSAL)
    if skip:
        return
    q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
    kv_dtype: gl.constexpr = kv_desc.dtype
    kv_layout: gl.constexpr = kv_desc.layout
    dtype: gl.constexpr = q_latent_ptr.dtype.element_ty
    kvs = _rings9(CHUNKS, 2, _TILE, kv_dtype, kv_layout)
    qs0 = _rings9(CHUNKS, 1, _WG_ROWS, dtype, q_layout)
    qs1 = _rings9(CHUNKS, 1, _WG_ROWS, dtype, q_layout)
    p_smem = gl.allocate_shared_memory(dtype, [2, _TILE, _WG_ROWS], p_layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (0, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kvs, qs0, p_smem, ready, empty, scale, q_start,
                     q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, num_blocks, seq_row_ptr,
                     stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok,
                     stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL,
                     HAS_LSE, LSE_UNIT, USE_PDL)),
        (_consumer, (1, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kvs, qs1, p_smem, ready, empty, scale, q_start,
                     q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, num_blocks, seq_row_ptr,
                     stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok,
                     stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL,
                     HAS_LSE, LSE_UNIT, USE_PDL)),
        (_producer, (kv_desc, kvs, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                     num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)),
    ], [4, 1], [CONSUMER_REGS, 24])
