"""MLA decode on Hopper (sm_90) in Gluon for 32-row programs over a bf16/fp16 cache (speculative
tokens: 2 query tokens x 16 heads), ``mla_sm90``'s paired-tile schedule with
``mla_sm90_narrow``'s transposed products: each tile's scores computed once, by one warpgroup,
for all 32 rows.

Computes what ``mla._mla_kernel`` computes (absorbed MLA decode: every head attends to the rows
``[c | k_pe]`` of a paged latent cache, the latent ``c`` is the value too) for the calls it takes
(``declines``): bf16/fp16 queries over a cache of their dtype, latent a multiple of 128 up to 512,
rope 64, ``BLOCK_Q`` query tokens x ``H`` heads in 17-32 rows a program, block sizes that are
powers of two >= 8, a cache TMA reads (``_sm90.cache_declines``, strided views included).

Why. ``mla_sm90_narrow`` gives a 32-row program two warpgroups that take the same tile, each for
its own 16 rows: each reads the whole tile from shared memory as the A operand of both products
(``S^T = K Q^T`` and ``O^T += V^T P^T``, N = 16), so a tile's operands cross shared memory twice,
and the scores, softmax and values of a tile run one after the other. H100 / H200, 2026-11-26
(benchmarks/results/gpu-2026-11-26g/logs/probe-wide64.txt, probe-parts.txt): 2 tokens B64 x 4096
H16 takes 119.0 / 101.4 us against 112.6 / 81.2 for one token (16-row programs, one warpgroup)
on the same bytes: the 32-row programs are bound by their own work a tile, not by the cache's
bytes; refilling a stage in parts as its readers finish changed nothing (probe-parts.txt).

What it measured (H100, CUDA-graph replays, against the narrow kernel in one process,
logs/probe-pair-2.txt; ``mla._pair`` plans it where it was faster): 4 tokens B32 x 4096 H16 (two
programs a sequence, the second reading from L2) 74.7 us against 99.6, 2 tokens B64 x 4096 H16 at
block size 16 121.3 against 137.4 (its producer warp issues the page-sized boxes the narrow
kernel's consumers issue themselves), 1 token H32 B64 x 4096 119.3 against 120.5; but 2 tokens
in one program at block size 64, 122.0 against 119.5 (B64 x 4096 H16), 117.9 against 116.9 (B32 x
8192): there both kernels are near the copy rate on the H100 and the narrow kernel's one tile at
a time frees its stages sooner. Both warpgroups on one tile, the scores split by columns between
them and added through shared memory (each tile's operands read once), measured slower than both
kernels (125.2 us there, 100.4 at 4 tokens B32; benchmarks/RESULTS.md, eleventh run).

Schedule: the 64-key tiles go in pairs, tile 2i in stage 0 and 2i + 1 in stage 1. The left
warpgroup computes ``S_0^T`` of tile 2i, the right one ``S_1^T`` of tile 2i + 1, each N = 32 over
all 576 columns (the tile read once); the output ``O^T`` [L, 32] is split by latent columns, the
left warpgroup holding ``[0, L / 2)`` (its four [64, 32] float32 blocks: 64 registers a thread),
the right one ``[L / 2, L)``, and each multiplies both tiles' values for its half. With one
running max ``m`` (the same in both):

- left: ``m_0 = max(m, colmax S_0)``, ``P_0 = exp(S_0 - m_0)`` to shared memory (with ``m_0``),
  ``O_L = O_L s_0 + V_0L^T P_0`` (``s_0 = exp(m - m_0)``);
- right: its scores ``S_1`` (as soon as tile 2i + 1 lands), then once ``P_0`` is there ``O_R = O_R s_0 + V_0R^T
  P_0``, ``m_1 = max(m_0, colmax S_1)``, ``P_1 = exp(S_1 - m_1)`` to shared memory (with ``m_1``),
  ``O_R = O_R s_1 + V_1R^T P_1`` (``s_1 = exp(m_0 - m_1)``);
- left: ``O_L = O_L s_1 + V_1L^T P_1``.

So both warpgroups' scores run side by side, and the right one's values of tile 2i beside the
left one's. Each keeps its own partial row sum (the left ``(l s_0 + sum P_0) s_1``, the right ``l
s_0 s_1 + sum P_1``), added at the end. A producer warp issues the TMA copies (``mla_sm90._load``: one box of ``min(BS, 64)`` rows x 64
columns a page and chunk; a block id outside ``[0, NB)`` or a page past the sequence reads zeros
from past the cache's last row, and those keys' scores are masked). Each stage has three chunk
groups (the left value chunks, the right ones, the rope), each with a ready and an empty barrier,
refilled as soon as its last reader is done, in that order: stage 0's rope (after ``S_0``), its
left chunks (after ``V_0L``), its right chunks (after ``V_0R``), stage 1's rope (after ``S_1``), its
right chunks (after ``V_1R``), its left chunks (after ``V_1L``). A pair's odd tile past the last key
is masked like any key past the end (its value rows zeroed); ``mla`` plans splits at multiples of
a pair (``SPLIT_KEYS``). Value rows past the sequence's end are zeroed in shared memory by the
warpgroup that computes the tile's scores, before its ``P`` is published (the cache may hold NaN
there, and 0 * NaN is NaN).

Grid, rows and outputs: ``mla_sm90_narrow``'s (query blocks of ``BLOCK_Q`` tokens, 1, splits; row r
is token r // H of the block, head r % H; split-KV writes each program's normalised partial and
log2 LSE for ``mla``'s combine kernel).

Layouts: q_latent/out ``[T, H, L]``, q_rope ``[T, H, R]`` (last stride 1), kv_cache ``[NB, BS, L +
R]`` (any ``_sm90.row_layout`` view); partials ``[T, S, H, L]`` and ``[T, S, H]`` float32. Shared
memory: two stages ``2 x 64 x (L + R) x 2`` + Q ``32 x (L + R) x 2`` + ``P_0``, ``P_1`` ``2 x 64 x 32
x 2`` bytes (188 KiB at 576 columns; 205 KiB with the compiler's scratch, sm_90 SASS): one
program an SM. Bytes moved: ``sum_b kv_b * (L + R) * 2``
(each program reads its keys once) + ``T * H * (2L + R) * q_bytes`` (+ the partials, written and
read once).
"""

from __future__ import annotations

from torch import Tensor

from . import mla_sm90_narrow as narrow
from .mla_sm90 import gluon_mla_declines
from .paged_attention import pdl_options

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from .mla_sm90 import _block_id, _finite, _load, _rings9, _signal_dependents, _wait_prerequisites, _zero_rows
    from .mla_sm90_narrow import _program, _write
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

ROWS = 32  # query tokens x heads a program (wgmma's N)
MIN_ROWS = 17  # fewer rows run the narrow kernel's one warpgroup
SPLIT_KEYS = 2 * narrow.TILE_N  # splits at multiples of a pair of tiles
REGS_CONSUMER = 224  # each consumer warpgroup's registers a thread (setmaxnreg)
# the producer warp's registers: at block size 8 (eight boxes a chunk group, each its own page
# row) it spills (60 stores, sm_90 SASS, Triton 3.6); from 16 up it does not
REGS_PRODUCER = 24
# The right warpgroup computes the scores of tile 2i + 1 as soon as it lands, before its values
# of tile 2i (which wait for the left one's P_0). H100, graph replays, us, against after them
# (benchmarks/results/gpu-2026-11-26g/logs/probe-pair-2.txt, "pair" / "pair0", on the tree of
# f9a5e8a, which had the other order as a switch): 2 tokens H16 B64 x 4096 122.0 / 123.2, B128
# 216.3 / 219.7, 4 tokens B32 74.7 / 76.0, block 16 121.3 / 123.1.


def declines(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_q: int) -> str | None:
    """Why this kernel does not take the call with ``block_q`` query tokens a program (None: it
    takes it). Static facts only."""
    latent, rope = q_latent.shape[2], q_rope.shape[2]
    rows = q_latent.shape[1] * block_q
    if latent % 128 or latent > 512 or rope != 64:
        shape = "latent a multiple of 128 up to 512, rope 64"
    elif not MIN_ROWS <= rows <= ROWS:
        shape = f"rows: query tokens x heads {MIN_ROWS}-{ROWS} a program"
    else:
        shape = None
    return gluon_mla_declines(q_latent, q_rope, kv_cache, False, shape)


if gluon is not None:
    _TILE = gl.constexpr(narrow.TILE_N)
    _ROWS = gl.constexpr(ROWS)
    _LOG2E = gl.constexpr(narrow.LOG2E)
    _REGS_PRODUCER = gl.constexpr(REGS_PRODUCER)
    # barrier index of a stage's chunk group: stage * 3 + group
    _A = gl.constexpr(0)  # the left value chunks (output columns [0, L / 2))
    _B = gl.constexpr(1)  # the right value chunks
    _R = gl.constexpr(2)  # the rope chunk
    # a warpgroup's [64, 32] wgmma accumulators (S^T, and each 64-column block of O^T), their
    # columns (the query rows) and rows (the tile's keys)
    _ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 16]))
    _COL = gl.constexpr(gl.SliceLayout(0, _ACC))
    _KEY = gl.constexpr(gl.SliceLayout(1, _ACC))

    @gluon.jit
    def _producer(kv_desc, kv_smem, ready, empty, key_lo, n_pairs, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """One warp: the two tiles of each pair (tile 2i in stage 0, 2i + 1 in stage 1), each chunk
        group loaded as soon as the consumers free it, in the order they free them."""
        HALF: gl.constexpr = (CHUNKS - 1) // 2
        for i in range(n_pairs):
            e = (i & 1) ^ 1
            k0 = key_lo + 2 * i * _TILE
            k1 = k0 + _TILE
            _load(kv_desc, kv_smem, ready, empty, _R, e, 2 * HALF, 1, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            _load(kv_desc, kv_smem, ready, empty, _A, e, 0, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            _load(kv_desc, kv_smem, ready, empty, _B, e, HALF, HALF, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            _load(kv_desc, kv_smem, ready, empty, 3 + _R, e, 2 * HALF, 1, k1, seq_row_ptr, stride_bt_block,
                  num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            _load(kv_desc, kv_smem, ready, empty, 3 + _B, e, HALF, HALF, k1, seq_row_ptr, stride_bt_block,
                  num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            _load(kv_desc, kv_smem, ready, empty, 3 + _A, e, 0, HALF, k1, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)

    @gluon.jit
    def _scores(s, qs, kv_smem, ready, ph, stage, c0: gl.constexpr, n: gl.constexpr, CHUNKS: gl.constexpr, z):
        """Once ``ready`` (phase ``ph``) says they are loaded, issue ``S^T += K[:, chunks] Q[:,
        chunks]^T`` over chunks ``[c0, c0 + n)`` of the tile in ``stage`` (asynchronous; M = the 64
        keys, N = the 32 rows)."""
        mbarrier.wait(ready, ph)
        for c in gl.static_range(n):
            s = warpgroup_mma(kv_smem.index(stage * CHUNKS + c0 + c), qs[c0 + c].index(z).permute((1, 0)), s,
                              is_async=True)
        return s

    @gluon.jit
    def _tile_scores(qs, kv_smem, ready, ph, stage, STAGE: gl.constexpr, first: gl.constexpr, CHUNKS: gl.constexpr,
                     z):
        """``S^T`` of the tile in ``stage`` (``STAGE`` to the compiler: its barriers are
        ``ready[STAGE * 3 + group]``), the chunk groups taken in the order the producer loads them
        (the rope chunk, then value group ``first``, then the other), waited for."""
        HALF: gl.constexpr = (CHUNKS - 1) // 2
        g0: gl.constexpr = STAGE * 3
        s = gl.zeros([_TILE, _ROWS], gl.float32, _ACC)
        s = _scores(s, qs, kv_smem, ready.index(g0 + _R), ph, stage, 2 * HALF, 1, CHUNKS, z)
        s = _scores(s, qs, kv_smem, ready.index(g0 + first), ph, stage, first * HALF, HALF, CHUNKS, z)
        s = _scores(s, qs, kv_smem, ready.index(g0 + 1 - first), ph, stage, (1 - first) * HALF, HALF, CHUNKS, z)
        return warpgroup_mma_wait(num_outstanding=0, deps=(s, ))

    @gluon.jit
    def _visible(key0, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE: gl.constexpr,
                 CAUSAL: gl.constexpr, BLOCK_Q: gl.constexpr):
        """[64 keys, 1 or 32 rows]: the keys from ``key0`` before ``kv_end``, on pages with an id in ``[0,
        NB)`` and (causal) at or before the row's position (the block ids are loaded here, before the
        tile is waited for: an L2 round trip otherwise between the scores and the softmax)."""
        keys = key0 + gl.arange(0, _TILE, layout=_KEY)
        blk = _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
        visible = gl.expand_dims((blk >= 0) & (blk < num_blocks) & (keys < kv_end), 1)
        if CAUSAL and BLOCK_Q > 1:
            visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(pos_c, 0))
        return visible

    @gluon.jit
    def _softmax(s, visible, m_ref_old, qk_scale):
        """Scores not ``visible`` to -inf; ``(m_new, P^T)`` with ``m_new = max(m_ref_old, colmax
        S^T)`` (log2 domain) and ``P^T = exp2(S^T - m_new)`` (0 where m_new is -inf)."""
        s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_ref_old, gl.max(s, 0) * qk_scale)
        return m_new, gl.exp2(s * qk_scale - gl.expand_dims(_finite(m_new), 0))

    @gluon.jit
    def _pv(o, kv_smem, base, c: gl.constexpr, p_smem, HALF: gl.constexpr):
        """Issue ``O^T[c] += V^T[base + c] P^T`` (when the half has chunk ``c``)."""
        if c < HALF:
            o = warpgroup_mma(kv_smem.index(base + c).permute((1, 0)), p_smem, o, is_async=True)
        return o

    @gluon.jit
    def _values(o0, o1, o2, o3, a, p_smem, kv_smem, base, HALF: gl.constexpr):
        """``O^T = O^T * a + V^T P^T`` over this warpgroup's ``HALF`` value chunks from chunk
        ``base`` of the stages, waited for."""
        o0, o1, o2, o3 = o0 * a, o1 * a, o2 * a, o3 * a
        o0 = _pv(o0, kv_smem, base, 0, p_smem, HALF)
        o1 = _pv(o1, kv_smem, base, 1, p_smem, HALF)
        o2 = _pv(o2, kv_smem, base, 2, p_smem, HALF)
        o3 = _pv(o3, kv_smem, base, 3, p_smem, HALF)
        return warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))

    @gluon.jit
    def _start(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, qs, q_bar, q_start, q_block_start, q_len, stride_ql_tok,
               stride_ql_head, stride_qr_tok, stride_qr_head, HEADS: gl.constexpr, BLOCK_Q: gl.constexpr,
               CHUNKS: gl.constexpr):
        """Q [32 rows, L + R] into shared memory (the rings ``qs``; row r is token r // HEADS of the
        block, head r % HEADS; rows past the block or the sequence 0), each warpgroup alternate
        chunks, all its loads before its stores, both waiting for both."""
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r_io = gl.arange(0, _ROWS, layout=gl.SliceLayout(1, io_layout))
        t_io = r_io // HEADS
        ok = gl.expand_dims((t_io < BLOCK_Q) & (q_block_start + t_io < q_len), 1)
        tok = (q_start + q_block_start + t_io).to(gl.int64)
        ql_rows = gl.expand_dims(tok * stride_ql_tok + (r_io % HEADS) * stride_ql_head, 1)
        qr_rows = gl.expand_dims(tok * stride_qr_tok + (r_io % HEADS) * stride_qr_head, 1)
        offs_c = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout)), 0)
        chunks = ()
        for c in gl.static_range(CHUNKS):
            if c % 2 == wg:
                if c < CHUNKS - 1:
                    chunks = chunks + (gl.load(q_latent_ptr + ql_rows + offs_c + c * 64, mask=ok, other=0.0), )
                else:
                    chunks = chunks + (gl.load(q_rope_ptr + qr_rows + offs_c, mask=ok, other=0.0), )
        for c in gl.static_range(CHUNKS):
            if c % 2 == wg:
                qs[c].index(0).store(chunks[c // 2])
        fence_async_shared()
        mbarrier.arrive(q_bar.index(0))
        mbarrier.wait(q_bar.index(0), 0)

    @gluon.jit
    def _epilogue(wg: gl.constexpr, o0, o1, o2, o3, m_i, l_i, l_smem, l_bar, out_ptr, lse_ptr, q_start, q_block_start,
                  q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS: gl.constexpr,
                  BLOCK_Q: gl.constexpr, HALF: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr):
        """l = l_0 + l_1 (both add in that order), then ``mla_sm90_narrow._write``: this warpgroup's
        chunks of O^T / l to ``out``, and (the left one) lse = (m + log2 l) * LSE_UNIT."""
        l_smem.index(wg).store(l_i)
        mbarrier.arrive(l_bar.index(0))
        mbarrier.wait(l_bar.index(0), 0)
        l_tot = l_smem.index(0).load(_COL) + l_smem.index(1).load(_COL)
        r_c = gl.arange(0, _ROWS, layout=_COL)
        # this warpgroup's latent columns from wg * L / 2 (HALF chunks; the last four blocks unused)
        _write(out_ptr + wg * HALF * 64, lse_ptr, o0, o1, o2, o3, o0, o0, o0, o0, m_i, l_tot, 1.0, r_c, r_c // HEADS,
               q_start, q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS,
               BLOCK_Q, _ROWS, HALF, False, HAS_LSE and wg == 0, LSE_UNIT, 4)

    @gluon.jit
    def _tile(key0, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks, qs, kv_smem, ready, empty, ph,
              stage, STAGE: gl.constexpr, first: gl.constexpr, CHUNKS: gl.constexpr, z, BLOCK_SIZE: gl.constexpr,
              CAUSAL: gl.constexpr, BLOCK_Q: gl.constexpr):
        """``(visible, S^T)`` of the tile from ``key0`` in ``stage`` (``_visible``, ``_tile_scores``);
        the stage's rope chunk, which only the scores read, is then free."""
        visible = _visible(key0, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE,
                           CAUSAL, BLOCK_Q)
        s = _tile_scores(qs, kv_smem, ready, ph, stage, STAGE, first, CHUNKS, z)
        mbarrier.arrive(empty.index(STAGE * 3 + _R))
        return visible, s

    @gluon.jit
    def _publish(p, m, p_smem, m_smem, p_full, p_free, t: gl.constexpr, ph):
        """``P_t`` and ``m_t`` for the other warpgroup, once it is done with the last ``P_t``."""
        mbarrier.wait(p_free.index(t), ph ^ 1)
        p_smem.index(t).store(p.to(p_smem.dtype))
        m_smem.index(t).store(m)
        fence_async_shared()
        mbarrier.arrive(p_full.index(t))

    @gluon.jit
    def _take(t: gl.constexpr, ph, m_prev, l_i, o0, o1, o2, o3, p_smem, m_smem, p_full, p_free, kv_smem,
              chunk0, HALF: gl.constexpr):
        """The other warpgroup's ``P_t`` and ``m_t`` (once published): this warpgroup's state
        rescaled from ``m_prev`` to ``m_t`` and ``O^T += V_t^T P_t`` over its ``HALF`` value chunks
        from ``chunk0``; ``P_t`` freed. Returns ``(m_t, l_i, o0, o1, o2, o3)``."""
        mbarrier.wait(p_full.index(t), ph)
        m_t = m_smem.index(t).load(_COL)
        a = gl.exp2(m_prev - _finite(m_t))
        l_i = l_i * a
        o0, o1, o2, o3 = _values(o0, o1, o2, o3, gl.expand_dims(a, 0), p_smem.index(t), kv_smem, chunk0, HALF)
        mbarrier.arrive(p_free.index(t))
        return m_t, l_i, o0, o1, o2, o3

    @gluon.jit
    def _consumer(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, m_smem, l_smem,
                  ready, empty, q_bar, p_full, p_free, l_bar, scale, q_start, q_block_start, q_len, context, key_lo,
                  kv_end, n_pairs, num_pages, num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok,
                  stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                  stride_lse_head, HEADS: gl.constexpr, BLOCK_Q: gl.constexpr, LATENT: gl.constexpr,
                  BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr,
                  USE_PDL: gl.constexpr):
        """Warpgroup ``wg`` (0: left, 1: right): the scores of tile ``2i + wg`` and value chunks
        ``[wg * L / 128, (wg + 1) * L / 128)`` of both tiles of each pair."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        HALF: gl.constexpr = LATENT // 128
        _start(wg, q_latent_ptr, q_rope_ptr, qs, q_bar, q_start, q_block_start, q_len, stride_ql_tok, stride_ql_head,
               stride_qr_tok, stride_qr_head, HEADS, BLOCK_Q, CHUNKS)
        qk_scale = scale * _LOG2E
        pos_c = context + q_block_start + gl.arange(0, _ROWS, layout=_COL) // HEADS  # each row's position
        m_i = gl.full([_ROWS], float("-inf"), gl.float32, _COL)
        l_i = gl.zeros([_ROWS], gl.float32, _COL)
        o0 = gl.zeros([_TILE, _ROWS], gl.float32, _ACC)
        o1 = o0
        o2 = o0
        o3 = o0
        base = wg * HALF  # this warpgroup's value chunks within a stage
        for i in range(n_pairs):
            ph = i & 1
            # stage indices the compiler cannot fold (i < 2**30), as in mla_sm90's loops
            z = i >> 30
            st0 = z
            st1 = z + 1
            key0 = key_lo + 2 * i * _TILE
            if wg == 0:
                # S_0^T of tile 2i
                visible, s = _tile(key0, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks, qs,
                                   kv_smem, ready, empty, ph, st0, 0, _A, CHUNKS, z, BLOCK_SIZE, CAUSAL, BLOCK_Q)
                m0, p = _softmax(s, visible, m_i, qk_scale)
                a0 = gl.exp2(m_i - _finite(m0))
                l_i = l_i * a0 + gl.sum(p, 0)
                _zero_rows(kv_smem, st0 * CHUNKS, kv_end - key0, CHUNKS - 1, 4)
                _publish(p, m0, p_smem, m_smem, p_full, p_free, 0, ph)
                o0, o1, o2, o3 = _values(o0, o1, o2, o3, gl.expand_dims(a0, 0), p_smem.index(0), kv_smem,
                                         st0 * CHUNKS + base, HALF)
                mbarrier.arrive(empty.index(_A))
                # P_1 and m_1 from the right warpgroup
                m_i, l_i, o0, o1, o2, o3 = _take(1, ph, m0, l_i, o0, o1, o2, o3, p_smem, m_smem, p_full, p_free,
                                                 kv_smem, st1 * CHUNKS + base, HALF)
                mbarrier.arrive(empty.index(3 + _A))
            else:
                # S_1^T of tile 2i + 1 as soon as it lands
                visible, s = _tile(key0 + _TILE, kv_end, pos_c, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
                                   qs, kv_smem, ready, empty, ph, st1, 1, _B, CHUNKS, z, BLOCK_SIZE, CAUSAL, BLOCK_Q)
                # the values of tile 2i with P_0 (relative to m_0) from the left warpgroup
                m0, l_i, o0, o1, o2, o3 = _take(0, ph, m_i, l_i, o0, o1, o2, o3, p_smem, m_smem, p_full, p_free,
                                                kv_smem, st0 * CHUNKS + base, HALF)
                mbarrier.arrive(empty.index(_B))
                m1, p = _softmax(s, visible, m0, qk_scale)
                a1 = gl.exp2(m0 - _finite(m1))
                l_i = l_i * a1 + gl.sum(p, 0)
                _zero_rows(kv_smem, st1 * CHUNKS, kv_end - key0 - _TILE, CHUNKS - 1, 4)
                _publish(p, m1, p_smem, m_smem, p_full, p_free, 1, ph)
                o0, o1, o2, o3 = _values(o0, o1, o2, o3, gl.expand_dims(a1, 0), p_smem.index(1), kv_smem,
                                         st1 * CHUNKS + base, HALF)
                mbarrier.arrive(empty.index(3 + _B))
                m_i = m1
        if USE_PDL:  # the key loop is done: the kernel after it (a split call's combine) may launch
            if wg == 0:
                _signal_dependents()
        _epilogue(wg, o0, o1, o2, o3, m_i, l_i, l_smem, l_bar, out_ptr, lse_ptr, q_start, q_block_start, q_len,
                  stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, HALF, HAS_LSE,
                  LSE_UNIT)

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _mla_pair_kernel(
        q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
        kv_desc,  # TMA descriptor of the cache as [rows, L + R], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, H, L] or partials [T, S, H, L] (the query's dtype); [T, H] or [T, S, H] float32
        kv_scale_ptr,  # unused (the narrow kernels' argument list)
        scale,
        num_tokens, num_seqs, num_blocks, max_blocks, split_tokens,
        block_rows,  # rows of the cache's [rows, L + R] view from one block to the next (_sm90.block_rows)
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
        if USE_PDL:  # launched with programmatic dependent launch: nothing is read before this
            _wait_prerequisites()
        pid_q = gl.program_id(0)
        split = gl.program_id(2)
        out_ptr += split.to(gl.int64) * stride_o_split
        lse_ptr += split.to(gl.int64) * stride_lse_split
        seq, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip = _program(
            pid_q, split, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, num_tokens, num_seqs, max_blocks,
            split_tokens, stride_bt_seq, stride_sl, stride_qsl, BLOCK_Q, BLOCK_SIZE, CAUSAL)
        if skip:
            return
        n_pairs = (n_tiles + 1) // 2

        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        qs = _rings9(CHUNKS, 1, _ROWS, dtype, q_layout)
        kv_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, _TILE, 64], kv_desc.layout)
        p_smem = gl.allocate_shared_memory(dtype, [2, _TILE, _ROWS], p_layout)
        m_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        ready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        l_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(6):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(p_full.index(i), count=1)
            mbarrier.init(p_free.index(i), count=1)
        mbarrier.init(q_bar.index(0), count=2)
        mbarrier.init(l_bar.index(0), count=2)
        fence_async_shared()

        gl.warp_specialize([
            (_consumer, (0, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, m_smem, l_smem, ready,
                         empty, q_bar, p_full, p_free, l_bar, scale, q_start, q_block_start, q_len, context, key_lo,
                         kv_end, n_pairs, num_pages, num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok,
                         stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
            (_consumer, (1, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p_smem, m_smem, l_smem, ready,
                         empty, q_bar, p_full, p_free, l_bar, scale, q_start, q_block_start, q_len, context, key_lo,
                         kv_end, n_pairs, num_pages, num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok,
                         stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
            (_producer, (kv_desc, kv_smem, ready, empty, key_lo, n_pairs, seq_row_ptr, stride_bt_block, num_pages,
                         num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)),
        ], [4, 1], [CONSUMER_REGS, _REGS_PRODUCER])


def constants(num_heads: int, block_q: int, pdl: bool) -> dict:
    """This kernel's own launch constants (``mla_sm90._launcher`` gives the shared ones); ``pdl``:
    launched with programmatic dependent launch (``paged_attention.pdl_options``, as the narrow
    kernel)."""
    return dict(HEADS=num_heads, BLOCK_Q=block_q, CONSUMER_REGS=REGS_CONSUMER, num_warps=4,
                **pdl_options(pdl))
