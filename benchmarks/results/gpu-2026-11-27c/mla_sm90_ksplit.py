"""A variant of ``mla_sm90_pair`` for 32-row programs, measured by ``probe_ksplit.py``: one tile at a
time, both warpgroups on it, each tile's operands read from shared memory once.

The left warpgroup computes the partial scores ``S_L^T = K[:, L-chunks] Q[:, L-chunks]^T`` over the
latent chunks ``[0, L / 128)`` and the rope chunk, the right one ``S_R^T`` over ``[L / 128, L /
64)`` (each N = 32, all rows); each stores its [64, 32] float32 partial to shared memory and adds
the other's (``S_L + S_R`` in both, so both hold the same scores bit for bit), and both run the
same softmax. Each then multiplies its own latent chunks' values (``O^T[half] += V[half]^T P^T``,
N = 32) with its own copy of ``P^T`` in shared memory. So a chunk group has one reader: the left
value chunks and the rope the left warpgroup, the right value chunks the right one, and a group
is refilled (by the producer warp, ``mla_sm90._load``) as soon as its reader is done with it: the
rope after the left one's scores, each value group after its values. The two warpgroups meet
once a tile, at the partial scores' exchange (one buffer each, written once both read the last
tile's). Two stages of 64 keys x 576 columns, Q, two P^T and the two exchange buffers: 144 + 36 +
8 + 16 KiB.

Grid, rows, splits and outputs: ``mla_sm90_narrow``'s, with ``mla_sm90_pair``'s argument list
(bf16/fp16 caches of the query's dtype, latent a multiple of 128 up to 512, rope 64, 17-32 rows).

Measured slower than the kernels it would replace (H100, 2026-11-27, logs/probe-ksplit.txt): 2
tokens B64 x 4096 H16 125.1-125.3 us against the narrow kernel's 119.2-119.5, 4 tokens B32 x 4096
100.3-100.5 against the pair kernel's 74.6-74.7; kept here as what was measured
(benchmarks/RESULTS.md, eleventh run), not in the package.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma_wait

from .mla_sm90 import _finite, _load, _rings9, _signal_dependents, _zero_rows
from .mla_sm90_narrow import _program, _write
from .mla_sm90_pair import _ACC, _COL, _A, _B, _R, _ROWS, _TILE, _start, _scores, _softmax, _values, _visible
from .mla_sm90_pair import REGS_PRODUCER  # the same register split as the pair kernel

_LOG2E = gl.constexpr(1.4426950408889634)
_REGS_PRODUCER = gl.constexpr(REGS_PRODUCER)


@gluon.jit
def _producer(kv_desc, kv_smem, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
              block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
    """One warp: tile j into stage j % 2, its rope, left and right chunk groups each loaded as soon
    as its one reader freed it."""
    HALF: gl.constexpr = (CHUNKS - 1) // 2
    for j in range(n_tiles // 2):
        e = (j & 1) ^ 1
        k0 = key_lo + 2 * j * _TILE
        _load(kv_desc, kv_smem, ready, empty, _R, e, 2 * HALF, 1, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, _A, e, 0, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, _B, e, HALF, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        k1 = k0 + _TILE
        _load(kv_desc, kv_smem, ready, empty, 3 + _R, e, 2 * HALF, 1, k1, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, 3 + _A, e, 0, HALF, k1, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, 3 + _B, e, HALF, HALF, k1, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
    if n_tiles % 2 == 1:  # the last, odd tile in stage 0
        j = n_tiles // 2
        e = (j & 1) ^ 1
        k0 = key_lo + 2 * j * _TILE
        _load(kv_desc, kv_smem, ready, empty, _R, e, 2 * HALF, 1, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, _A, e, 0, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        _load(kv_desc, kv_smem, ready, empty, _B, e, HALF, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)


@gluon.jit
def _tile(wg: gl.constexpr, j, key0, kv_end, pos_c, m_i, l_i, o0, o1, o2, o3, qk_scale, qs, kv_smem, p_smem, s_smem,
          ready, empty, s_full, s_read, seq_row_ptr, stride_bt_block, num_pages, num_blocks, STAGE: gl.constexpr,
          CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_Q: gl.constexpr):
    """Tile ``j`` (in stage ``STAGE`` = j % 2) for warpgroup ``wg``: its partial scores, the
    exchange, the softmax and its half of the values. Returns ``(m_i, l_i, o0, o1, o2, o3)``."""
    HALF: gl.constexpr = (CHUNKS - 1) // 2
    z = j >> 30  # 0, but not to the compiler (as in mla_sm90's loops)
    st = z + STAGE
    ph = (j >> 1) & 1
    visible = _visible(key0, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE, CAUSAL,
                       BLOCK_Q)
    s = gl.zeros([_TILE, _ROWS], gl.float32, _ACC)
    if wg == 0:
        s = _scores(s, qs, kv_smem, ready.index(STAGE * 3 + _R), ph, st, 2 * HALF, 1, CHUNKS, z)
        s = _scores(s, qs, kv_smem, ready.index(STAGE * 3 + _A), ph, st, 0, HALF, CHUNKS, z)
    else:
        s = _scores(s, qs, kv_smem, ready.index(STAGE * 3 + _B), ph, st, HALF, HALF, CHUNKS, z)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    if wg == 0:
        mbarrier.arrive(empty.index(STAGE * 3 + _R))  # the rope: only the left scores read it
    # the exchange: S = S_L + S_R in both (once both read the last tile's partials)
    mbarrier.wait(s_read.index(0), (j & 1) ^ 1)
    s_smem.index(wg).store(s)
    mbarrier.arrive(s_full.index(0))
    mbarrier.wait(s_full.index(0), j & 1)
    if wg == 0:
        s = s + s_smem.index(1).load(_ACC)
    else:
        s = s_smem.index(0).load(_ACC) + s
    mbarrier.arrive(s_read.index(0))
    m_new, p = _softmax(s, visible, m_i, qk_scale)
    a = gl.exp2(m_i - _finite(m_new))
    l_i = l_i * a + gl.sum(p, 0)
    base = st * CHUNKS + wg * HALF  # this warpgroup's value chunks of the stage
    _zero_rows(kv_smem, base, kv_end - key0, HALF, 4)
    p_smem.index(wg).store(p.to(p_smem.dtype))
    fence_async_shared()
    o0, o1, o2, o3 = _values(o0, o1, o2, o3, gl.expand_dims(a, 0), p_smem.index(wg), kv_smem, base, HALF)
    if wg == 0:
        mbarrier.arrive(empty.index(STAGE * 3 + _A))
    else:
        mbarrier.arrive(empty.index(STAGE * 3 + _B))
    return m_new, l_i, o0, o1, o2, o3


@gluon.jit
def _consumer(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, s_smem, ready, empty,
              q_bar, s_full, s_read, scale, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages,
              num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head,
              stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS: gl.constexpr,
              BLOCK_Q: gl.constexpr, LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr,
              HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr):
    """Warpgroup ``wg`` (0: left, 1: right) over every tile (``_tile``), then its half of the
    output (the left one the LSE too)."""
    CHUNKS: gl.constexpr = LATENT // 64 + 1
    HALF: gl.constexpr = LATENT // 128
    _start(wg, q_latent_ptr, q_rope_ptr, qs, q_bar, q_start, q_block_start, q_len, stride_ql_tok, stride_ql_head,
           stride_qr_tok, stride_qr_head, HEADS, BLOCK_Q, CHUNKS)
    qk_scale = scale * _LOG2E
    pos_c = context + q_block_start + gl.arange(0, _ROWS, layout=_COL) // HEADS
    m_i = gl.full([_ROWS], float("-inf"), gl.float32, _COL)
    l_i = gl.zeros([_ROWS], gl.float32, _COL)
    o0 = gl.zeros([_TILE, _ROWS], gl.float32, _ACC)
    o1 = o0
    o2 = o0
    o3 = o0
    for i in range(n_tiles // 2):
        key0 = key_lo + 2 * i * _TILE
        m_i, l_i, o0, o1, o2, o3 = _tile(wg, 2 * i, key0, kv_end, pos_c, m_i, l_i, o0, o1, o2, o3, qk_scale, qs,
                                         kv_smem, p_smem, s_smem, ready, empty, s_full, s_read, seq_row_ptr,
                                         stride_bt_block, num_pages, num_blocks, 0, CHUNKS, BLOCK_SIZE, CAUSAL,
                                         BLOCK_Q)
        m_i, l_i, o0, o1, o2, o3 = _tile(wg, 2 * i + 1, key0 + _TILE, kv_end, pos_c, m_i, l_i, o0, o1, o2, o3,
                                         qk_scale, qs, kv_smem, p_smem, s_smem, ready, empty, s_full, s_read,
                                         seq_row_ptr, stride_bt_block, num_pages, num_blocks, 1, CHUNKS, BLOCK_SIZE,
                                         CAUSAL, BLOCK_Q)
    if n_tiles % 2 == 1:
        j = n_tiles - 1
        m_i, l_i, o0, o1, o2, o3 = _tile(wg, j, key_lo + j * _TILE, kv_end, pos_c, m_i, l_i, o0, o1, o2, o3,
                                         qk_scale, qs, kv_smem, p_smem, s_smem, ready, empty, s_full, s_read,
                                         seq_row_ptr, stride_bt_block, num_pages, num_blocks, 0, CHUNKS, BLOCK_SIZE,
                                         CAUSAL, BLOCK_Q)
    if USE_PDL:  # the key loop is done: the combine kernel may launch (paged_attention._PDL)
        if wg == 0:
            _signal_dependents()
    r_c = gl.arange(0, _ROWS, layout=_COL)
    _write(out_ptr + wg * HALF * 64, lse_ptr, o0, o1, o2, o3, o0, o0, o0, o0, m_i, l_i, 1.0, r_c, r_c // HEADS,
           q_start, q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS,
           BLOCK_Q, _ROWS, HALF, False, HAS_LSE and wg == 0, LSE_UNIT, 4)


@gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
def _mla_ksplit_kernel(
    q_latent_ptr, q_rope_ptr, kv_desc, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr, lse_ptr,
    kv_scale_ptr, scale, num_tokens, num_seqs, num_blocks, max_blocks, split_tokens, block_rows,
    stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_bt_seq, stride_bt_block,
    stride_sl, stride_qsl, stride_o_tok, stride_o_split, stride_o_head,
    stride_lse_tok, stride_lse_split, stride_lse_head,
    HEADS: gl.constexpr, BLOCK_Q: gl.constexpr,
    LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):
    CHUNKS: gl.constexpr = LATENT // 64 + 1
    dtype: gl.constexpr = q_latent_ptr.dtype.element_ty
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
    p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    s_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    qs = _rings9(CHUNKS, 1, _ROWS, dtype, q_layout)
    kv_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, _TILE, 64], kv_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [2, _TILE, _ROWS], p_layout)
    s_smem = gl.allocate_shared_memory(gl.float32, [2, _TILE, _ROWS], s_layout)
    ready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    s_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    s_read = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(6):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(s_full.index(0), count=2)
    mbarrier.init(s_read.index(0), count=2)
    mbarrier.init(q_bar.index(0), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, s_smem, ready, empty, q_bar,
                     s_full, s_read, scale, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages,
                     num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok,
                     stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q,
                     LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
        (_consumer, (1, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, s_smem, ready, empty, q_bar,
                     s_full, s_read, scale, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages,
                     num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok, stride_ql_head, stride_qr_tok,
                     stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q,
                     LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
        (_producer, (kv_desc, kv_smem, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                     num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)),
    ], [4, 1], [CONSUMER_REGS, _REGS_PRODUCER])
