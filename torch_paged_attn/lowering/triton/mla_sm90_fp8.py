"""MLA decode on Hopper (sm_90) in Gluon over an fp8 cache, for programs of at most 16 query rows
(query tokens x heads: 16-head models): two consumer warpgroups on alternate 64-key tiles and a
producer warp.

Computes what ``mla._mla_kernel`` computes on an fp8 (e4m3 / e5m2) cache with bf16 or fp16
queries, for the calls ``mla_sm90_narrow`` takes with at most 16 rows a program (``declines``),
with that kernel's transposed products: ``S^T = K Q^T`` (M = the tile's 64 keys, N = the 16 rows)
and ``O^T += V^T P^T``, in fp16 (fp8 values are fp16 values; bf16 queries are scaled by a power
of two into fp16's range, ``mla_sm90_narrow._query_unit``), the cache's scale in the scores and
the output.

Why two warpgroups. The narrow kernel's fp8 path runs each tile through one warpgroup (the tile
converted to fp16 in shared memory, both products, the softmax between them) and is bound by that
chain's latency: H100, fp8 B128 x 4096 H16, 188.8 us = 53.7 % of copy against 96.7 % for the
same kernel on bf16, Nsight Compute (gpu-2026-11-26c/logs): shared-memory wavefronts 46 % of
peak, the tensor pipe 11 %, stalls on shared-memory results 20 %, fixed latencies 26 %, 2400
wavefronts a tile (the conversion ~860, the products' operands ~1360) against the ~2900 cycles a
tile took, and the wait for the tile's data 2 % of the samples. Here tile ``2i + w`` goes to
warpgroup ``w``: each converts its tile into its own fp16 buffer and multiplies it while the
other does the same with the next tile, so two of these chains overlap. The products' partial
states ``(m, l, O)`` merge once, after the key loop. H100, 2026-11-26, graph replays
(gpu-2026-11-26c/logs/fp8-probe-2.txt): fp8 B128 x 4096 H16 125.6 us = 81.0 % of copy (the
narrow kernel 187.3, the Triton kernel 200.3), B32 x 8192 74.3 us (100.3, 107.2). Nsight
Compute there (logs/stalls-mla_sm90_fp8-*.txt): shared-memory wavefronts 69 % of peak, DRAM 60 %
at its clocks, the consumers' waits for data 0.5 % of the samples: the two chains now contend for
shared memory. Measured and not kept: the scores' K from registers instead of the fp16 buffer,
each chunk loaded in the wgmma operand layout (2-byte loads) and stored from there for P V, 136.7
us against 125.4 (logs/probe-fp8-v5.txt); the same with 16-byte loads, the columns read in a
permuted order that makes the loaded registers the operand layout (the queries stored in that
order, the output put back; 512 fewer shared-memory wavefronts a tile, no 2-byte loads),
126.1-127.7 against 124.7 (logs/probe-fp8-v6.txt): less shared-memory traffic does not shorten a
warpgroup's chain, whose steps wait on each other.

What did shorten it: barriers Triton's barrier analysis had put in, which tells shared memory
apart by allocation only (sm_90 SASS). Into one fp16 buffer, each of a tile's eight converted
chunks waited at a barrier of the warpgroup for the chunk before it; with one allocation a chunk
(``mla_sm90._rings8`` / ``_rings9``, the stages likewise) none does. The row sums are kept
per key slot and reduced across the warps once, after the loop (one reduction and its barriers a
tile less). And the query scale (``_query_unit``) is one reduction instead of one per chunk: the
nine per-chunk reductions, each two barriers, made the prologue's nine query loads wait for each
other. H100, 2026-11-26, graph replays, against main 0ff2888 in the same process
(gpu-2026-11-26d/logs/probe*.txt): fp8 B128 x 4096 H16 125.4 -> 124.7 (the chunk buffers) ->
123.8 (and the row sums) -> 118.0-118.3 us (and the stage buffers and the query scale, measured
together) = 85.7-86.6 % of copy; B32 x 8192 74.3 -> 66.7 us.

Shared memory (latent 512, 16 rows): two fp8 stages of 64 keys x 576 (72 KiB; stage ``w`` holds
warpgroup ``w``'s tiles, refilled by the producer as soon as its tile is converted), two fp16
latent tiles of 64 x 512 (128 KiB; one allocation a chunk), Q in fp16 (18 KiB; one allocation a
chunk too), two P tiles (4 KiB): 222 KiB of the 227.

No room for an fp16 rope chunk: the rope columns of ``S^T`` take their A operand from registers
(the fp8 chunk loaded in the wgmma operand layout and converted there; its rows past the
sequence hold anything: their scores are masked).

Q's chunks in their own allocations let the left warpgroup issue its nine query loads, then the
stores, then one barrier, where one buffer made it load, store and wait nine times: fp8 B128 x
4096 H16 118.3 -> 116.0-116.1 us, B32 x 8192 66.7-66.8 -> 65.8-65.9 (H100, graph replays, two
rounds, results/gpu-2026-11-26e/logs/probe.txt). The left warpgroup loads the queries once, for
their unit and their stores, and hands the unit to the right one: 115.8-115.9 and 65.4-65.7
(logs/probe-3.txt). Measured and not kept: this schedule for 32 rows over a bf16 cache (each
warpgroup a whole tile at N = 32, the stage its operand, no conversion), 125.9 us on 2 tokens
B64 x 4096 H16 against the narrow kernel's 119.0 (commit 86e8123, logs/probe-mtp.txt).

Loads: the producer warp issues one TMA box of ``min(BS, 64)`` rows x 64 columns a page and chunk
(``mla_sm90_narrow._issue``: a block id outside ``[0, NB)`` or a page past the sequence points past
the last row, where TMA reads zeros; those keys' scores are masked), waiting for the stage's
``empty`` barrier; where a page holds the tile (block sizes >= 64) its block id is loaded before
that wait, off the path from the stage's release to its refill (it was loaded after: H100, graph
replays, three rounds against the kernel before in one process, results/gpu-2026-11-27/logs/
probe-fp8.txt: fp8 B128 x 4096 H16 115.3-115.9 -> 112.1-112.3 us, about 88 -> 90 % of copy; 2
tokens B64 x 4096, B1 x 32768 and block size 16 within the rounds' spread). Value rows past the
sequence's end are zeroed in the conversion.

Grid: ``mla_sm90_narrow``'s (query blocks, 1, splits), split-KV through the combine kernel the
same way (each program's normalised partial and log2 LSE; the cache's scale applied there).

Layouts: q_latent/out ``[T, H, L]``, q_rope ``[T, H, R]`` (last stride 1), kv_cache ``[NB, BS, L +
R]`` fp8 (any ``_sm90.row_layout`` view); partials ``[T, S, H, L]`` and ``[T, S, H]`` float32. Bytes
moved: ``sum_b kv_b * (L + R)`` (each program reads its keys once) + ``T * H * (2L + R) *
q_bytes`` (+ the partials, written and read once).
"""

from __future__ import annotations

from torch import Tensor

from . import mla_sm90_narrow as narrow
from .paged_attention import _FP8, pdl_options

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from ._sm90 import thread_barrier
    from .mla_sm90 import _block_id, _finite, _rings8, _rings9, _signal_dependents, _wait_prerequisites
    from .mla_sm90_narrow import (
        _convert, _empty_state, _program, _query_chunks, _query_unit, _refill, _softmax_scaled, _tile_block, _values,
        _write,
    )
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

ROWS = 16  # query tokens x heads a program (wgmma's N)
REGS_CONSUMER = 224  # each consumer warpgroup's registers a thread (setmaxnreg)
REGS_PRODUCER = 24


if gluon is not None:
    _TILE = gl.constexpr(narrow.TILE_N)
    _REGS_PRODUCER = gl.constexpr(REGS_PRODUCER)
    _ROWS = gl.constexpr(ROWS)
    _LOG2E = gl.constexpr(narrow.LOG2E)
    # a warpgroup's [64 keys, 16 rows] accumulators (S^T and each 64-column block of O^T), their
    # columns (the rows of the query) and keys, and the rope chunk as the A operand of S^T
    _ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16]))
    _COL = gl.constexpr(gl.SliceLayout(0, _ACC))
    _KEY = gl.constexpr(gl.SliceLayout(1, _ACC))
    _A_OPERAND = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_ACC, k_width=2))
    # the right warpgroup's O^T blocks [64, 16] float32 for the left one, and the row statistics
    _PLAIN2 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    _PLAIN1 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))

    @gluon.jit
    def _producer(kv_desc, kvs, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """One warp: tile j into stage ``j % 2`` once its warpgroup has converted tile ``j - 2``; where
        a page holds the tile (``BOX`` 64), its block id loaded before that wait, off the refill's
        path."""
        for j in range(n_tiles):
            st = j % 2
            key0 = key_lo + j * _TILE
            blk = _tile_block(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE, BOX)
            mbarrier.wait(empty.index(st), ((j // 2) & 1) ^ 1)
            _refill(kv_desc, kvs, ready, st, key0, blk, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
                    block_rows, CHUNKS, BLOCK_SIZE, BOX)

    @gluon.jit
    def _consumer(wg: gl.constexpr, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kv_scale_ptr, kvs, cv_own,
                  cv_park, qs, p_smem, ml_smem, ready, empty, q_bar, done_bar, scale, q_start, q_block_start, q_len,
                  context, key_lo, kv_end, n_tiles, num_pages, num_blocks, seq_row_ptr, stride_bt_block,
                  stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head,
                  stride_lse_tok, stride_lse_head, HEADS: gl.constexpr, BLOCK_Q: gl.constexpr,
                  LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr,
                  LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr):
        """Warpgroup ``wg``: tiles ``2i + wg``; then the right one hands its state to the left one,
        which merges both and writes the output."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        VCH: gl.constexpr = LATENT // 64
        # -- Q [16, L + R] as fp16 (scaled into its range): the left warpgroup loads it once, takes
        # its unit, stores it and hands the unit to the right one through ml_smem[0] (each row's
        # slot holds it; the right one's state goes there only after its key loop) --
        kv_scale = gl.load(kv_scale_ptr)
        qk_scale = scale * _LOG2E * kv_scale
        BF16: gl.constexpr = q_latent_ptr.dtype.element_ty == gl.bfloat16
        if wg == 0:
            chunks = _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_block_start, q_len, stride_ql_tok,
                                   stride_ql_head, stride_qr_tok, stride_qr_head, HEADS, BLOCK_Q, _ROWS, CHUNKS, 4)
            q_unit = 1.0
            if BF16:
                q_unit = _query_unit(chunks, CHUNKS)
                ml_smem.index(0).store(gl.full([_ROWS], q_unit, gl.float32, _COL))
            for c in gl.static_range(CHUNKS):
                qs[c].index(0).store((chunks[c].to(gl.float32) / q_unit).to(gl.float16))
            fence_async_shared()
            thread_barrier()
            mbarrier.arrive(q_bar.index(0))
        mbarrier.wait(q_bar.index(0), 0)
        if BF16:
            if wg == 0:
                qk_scale = qk_scale * q_unit
            else:
                qk_scale = qk_scale * gl.max(ml_smem.index(0).load(_COL), 0)

        r_c = gl.arange(0, _ROWS, layout=_COL)
        t_c = r_c // HEADS
        pos_c = context + q_block_start + t_c  # each row's position (causal: keys <= pos)
        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(_ROWS, _ACC)
        l_k = o0  # the row sums per key slot, reduced across the warps once, after the loop
        for i in range((n_tiles + 1 - wg) // 2):
            # stage and buffer indices the compiler cannot fold (i < 2**30): the wgmma descriptors
            # are then formed where they are used, not hoisted out of the loop (as mla_sm90's)
            z = i >> 30
            st = z + wg
            key0 = key_lo + (2 * i + wg) * _TILE
            keys = key0 + gl.arange(0, _TILE, layout=_KEY)
            blk = _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
            mbarrier.wait(ready.index(st), i & 1)
            # the rope chunk to registers, the latent chunks to this warpgroup's fp16 buffer; the
            # stage is then free for the producer
            rope = kvs[VCH].index(st).load(_A_OPERAND).to(gl.float16)
            _convert(kvs, st, cv_own, kv_end - key0, VCH, 4)
            fence_async_shared()
            thread_barrier()
            mbarrier.arrive(empty.index(st))
            # S^T = K Q^T: [64 keys, 16 rows]
            s = gl.zeros([_TILE, _ROWS], gl.float32, _ACC)
            for c in gl.static_range(VCH):
                s = warpgroup_mma(cv_own[c].index(z), qs[c].index(z).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma(rope, qs[VCH].index(z).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            # scaled, then masked (a NaN or zero scale leaves masked keys at -inf): keys past kv_end
            # or on pages with an id outside [0, NB), and (causal) keys after a row's position
            visible = gl.expand_dims((blk >= 0) & (blk < num_blocks) & (keys < kv_end), 1)
            if CAUSAL and BLOCK_Q > 1:
                visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(pos_c, 0))
            p, alpha, m_new = _softmax_scaled(s, visible, m_i, qk_scale)
            m_i = m_new
            a = gl.expand_dims(alpha, 0)
            l_k = l_k * a + p
            o0, o1, o2, o3, o4, o5, o6, o7 = o0 * a, o1 * a, o2 * a, o3 * a, o4 * a, o5 * a, o6 * a, o7 * a
            p_smem.index(wg).store(p.to(gl.float16))
            fence_async_shared()
            thread_barrier()
            # O^T += V^T P^T, one wgmma group per 64 latent columns
            o0, o1, o2, o3, o4, o5, o6, o7 = _values(o0, o1, o2, o3, o4, o5, o6, o7, cv_own, z, p_smem.index(wg),
                                                     VCH)

        l_i = gl.sum(l_k, 0)
        # -- the right warpgroup's state to the left one, through its own (now idle) fp16 buffers:
        # one float32 [64, 16] block of O^T in each --
        if wg == 1:
            ml_smem.index(0).store(m_i)
            ml_smem.index(1).store(l_i)
            _park(cv_park, o0, o1, o2, o3, o4, o5, o6, o7, VCH)
            thread_barrier()
            mbarrier.arrive(done_bar.index(0))
        else:
            if USE_PDL:  # the key loops are done: the kernel after it (a split call's combine) may launch
                _signal_dependents()
            mbarrier.wait(done_bar.index(0), 0)
            m_1 = ml_smem.index(0).load(_COL)
            l_1 = ml_smem.index(1).load(_COL)
            m = gl.maximum(m_i, m_1)
            m_ref = _finite(m)
            a0 = gl.exp2(m_i - m_ref)
            a1 = gl.exp2(m_1 - m_ref)
            l_i = l_i * a0 + l_1 * a1
            m_i = m
            b0 = gl.expand_dims(a0, 0)
            b1 = gl.expand_dims(a1, 0)
            o0 = _merged(o0, b0, cv_park, 0, b1, VCH)
            o1 = _merged(o1, b0, cv_park, 1, b1, VCH)
            o2 = _merged(o2, b0, cv_park, 2, b1, VCH)
            o3 = _merged(o3, b0, cv_park, 3, b1, VCH)
            o4 = _merged(o4, b0, cv_park, 4, b1, VCH)
            o5 = _merged(o5, b0, cv_park, 5, b1, VCH)
            o6 = _merged(o6, b0, cv_park, 6, b1, VCH)
            o7 = _merged(o7, b0, cv_park, 7, b1, VCH)
            # -- epilogue: O / l (times the scale: the output itself) and lse = (m + log2 l) * LSE_UNIT --
            _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, kv_scale, r_c, t_c, q_start,
                   q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q,
                   _ROWS, VCH, LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, 4)

    @gluon.jit
    def _block(cvs, c: gl.constexpr):
        """Latent chunk ``c``'s fp16 buffer as one float32 [64, 16] block (the right warpgroup's O^T)."""
        return cvs[c]._reinterpret(gl.float32, [2, _TILE, _ROWS], _PLAIN2).index(0)

    @gluon.jit
    def _park(cvs, o0, o1, o2, o3, o4, o5, o6, o7, VCH: gl.constexpr):
        """The right warpgroup's O^T blocks (those the latent has) into its chunk buffers ``cvs``."""
        _block(cvs, 0).store(o0)
        if VCH > 1:
            _block(cvs, 1).store(o1)
        if VCH > 2:
            _block(cvs, 2).store(o2)
        if VCH > 3:
            _block(cvs, 3).store(o3)
        if VCH > 4:
            _block(cvs, 4).store(o4)
        if VCH > 5:
            _block(cvs, 5).store(o5)
        if VCH > 6:
            _block(cvs, 6).store(o6)
        if VCH > 7:
            _block(cvs, 7).store(o7)

    @gluon.jit
    def _merged(o, b0, cvs, c: gl.constexpr, b1, VCH: gl.constexpr):
        """``o * b0 + O_1[c] * b1``: block ``c`` of both warpgroups' O^T, each rescaled to the merged max."""
        if c < VCH:
            o = o * b0 + _block(cvs, c).load(_ACC) * b1
        return o

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _mla_fp8_kernel(
        q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
        kv_desc,  # TMA descriptor of the fp8 cache as [rows, L + R], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, H, L] or partials [T, S, H, L] (the query's dtype); [T, H] or [T, S, H] float32
        kv_scale_ptr,  # [] or [1] float32
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
        VCH: gl.constexpr = LATENT // 64
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

        f16_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
        kv_dtype: gl.constexpr = kv_desc.dtype
        kv_layout: gl.constexpr = kv_desc.layout
        kvs = _rings9(CHUNKS, 2, _TILE, kv_dtype, kv_layout)
        cv0 = _rings8(VCH, 1, _TILE, gl.float16, f16_layout)
        cv1 = _rings8(VCH, 1, _TILE, gl.float16, f16_layout)
        qs = _rings9(CHUNKS, 1, _ROWS, gl.float16, f16_layout)
        p_smem = gl.allocate_shared_memory(gl.float16, [2, _TILE, _ROWS], p_layout)
        ml_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], _PLAIN1)
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        done_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        mbarrier.init(q_bar.index(0), count=1)
        mbarrier.init(done_bar.index(0), count=1)
        fence_async_shared()

        gl.warp_specialize([
            (_consumer, (0, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kv_scale_ptr, kvs, cv0, cv1, qs,
                         p_smem, ml_smem, ready, empty, q_bar, done_bar, scale, q_start, q_block_start, q_len, context,
                         key_lo, kv_end, n_tiles, num_pages, num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok,
                         stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
            (_consumer, (1, q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, kv_scale_ptr, kvs, cv1, cv1, qs,
                         p_smem, ml_smem, ready, empty, q_bar, done_bar, scale, q_start, q_block_start, q_len, context,
                         key_lo, kv_end, n_tiles, num_pages, num_blocks, seq_row_ptr, stride_bt_block, stride_ql_tok,
                         stride_ql_head, stride_qr_tok, stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok,
                         stride_lse_head, HEADS, BLOCK_Q, LATENT, BLOCK_SIZE, CAUSAL, HAS_LSE, LSE_UNIT, USE_PDL)),
            (_producer, (kv_desc, kvs, ready, empty, key_lo, n_tiles, seq_row_ptr, stride_bt_block, num_pages,
                         num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)),
        ], [4, 1], [CONSUMER_REGS, _REGS_PRODUCER])


def constants(num_heads: int, block_q: int, pdl: bool) -> dict:
    """This kernel's own launch constants (``mla_sm90._launcher`` gives the shared ones); ``pdl``:
    launched with programmatic dependent launch (``paged_attention.pdl_options``, as the narrow
    kernel)."""
    return dict(HEADS=num_heads, BLOCK_Q=block_q, CONSUMER_REGS=REGS_CONSUMER, num_warps=4,
                **pdl_options(pdl))


# Shared memory beyond the kernel's own buffers: the epilogue's layout change of float32
# partials (64 x 16 x 4 bytes), the row statistics and barriers. Latent 512, split (float32
# partials): 231872 bytes in all, sm_90 SASS, against 227328 for the buffers.
_SCRATCH = 64 * ROWS * 4 + 512


def smem_fits(latent: int) -> bool:
    """Two fp8 stages, two fp16 latent buffers, Q, two P tiles and ``_SCRATCH`` within an sm_90
    program's shared memory."""
    chunks = latent // 64 + 1
    vch = latent // 64
    unused = 2 * (9 - chunks) + 2 * (8 - vch)  # the rings' [1, 8, 64] stand-ins past the latent (1 KiB a piece, aligned)
    need = 2 * chunks * 64 * 64 + 2 * vch * 64 * 64 * 2 + unused * 1024 + chunks * ROWS * 64 * 2 + 2 * 64 * ROWS * 2
    return need + _SCRATCH <= narrow.SMEM_BYTES


def declines(q_latent: Tensor, kv_cache: Tensor, block_q: int) -> str | None:
    """Why this kernel does not take a call the narrow kernel takes (None: it takes it)."""
    if kv_cache.dtype not in _FP8:
        return "an fp8 cache only"
    if narrow.rows(q_latent.shape[1], block_q) != ROWS:
        return f"rows: query tokens x heads at most {ROWS} a program"
    if not smem_fits(q_latent.shape[2]):
        return "shared memory"
    return None
