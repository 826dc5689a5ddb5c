# Archived, not part of the package (measured slower than the Triton kernel it would replace:
# benchmarks/RESULTS.md, "fourteenth run"). To run it again: copy this file to
# torch_paged_attn/lowering/triton/, test_decode_sm90_fp8.py to tests/, and `git apply
# benchmarks/results/gpu-2026-11-27g/restore.diff` (the planner's hook and SM90_FP8_DECODE switch, the shared
# combine launcher, the benchmark contender torch_paged_attn[gluon-decode], the test helpers' fp8 options).
"""Paged-attention decode over an fp8 (e4m3 / e5m2) K/V cache on Hopper (sm_90), in Gluon: TMA page
loads, each landed tile converted to fp16 by one warpgroup (K in registers, V in shared memory),
both products on wgmma taken transposed.

Computes what ``paged_attention._attention_kernel`` computes (causal or full attention of each
query token over its sequence's keys in a block-table cache; the cache's ``k_scale`` in the scores
and ``v_scale`` on the output) for the calls it takes (``declines``): decode-planned calls (not
batch-invariant) of bf16/fp16 queries over fp8 caches of one dtype, head size 64 or 128 (K and V
alike), at most 16 query heads a kv head, block sizes that are powers of two >= 8, caches with a
``[rows, W]`` view (``_sm90.row_layout``), no window, chunk, softcap, ALiBi or sinks.

Why. The Triton kernel runs fp8 decode at 84.8-88.2 % of copy on an H100 (B64 x 4096, Hq 32, Hkv 8,
D 128; ``benchmarks/RESULTS.md``): with 16 query rows a program its dots are ``mma.sync``, whose
operands come from registers, and the fp8 value tile cannot be loaded transposed into them, so it
goes through shared memory twice (``cp.async``, then converted and stored as fp16 for
``ldmatrix``), and two programs of 4 warps an SM spend their time on shared-memory and
fixed-latency stalls (Nsight Compute: 31.8 and 26 % of the samples). Here, as in ``mla_sm90_fp8``
(MLA's fp8 cache at 91 % of copy), a program computes ``S^T = K Q^T`` (M = the tile's 64 keys, N =
16 query rows, K = the head size; A the K tile converted in registers, B the queries) and
``O^T += V^T P^T`` (M = 64 value columns a wgmma, K = the 64 keys; A the converted V tile read
transposed from shared memory, B = P^T stored to shared memory): no padded rows, no register
operand to transpose, and ``STAGES`` tiles stay in flight while the warpgroup converts and
multiplies.

Measured slower than the Triton kernel (H100, 2026-11-27, B64 x 4096 Hq 32 Hkv 8 D 128 e4m3):
276.2-279.3 us = 64.8-66.6 % of copy in ``benchmarks/paged_attention.py``'s graph replays (the
Triton kernel 209.2-209.7 us), 280.7-287.2 us eager wherever its inputs were allocated (the Triton
kernel 210.7-214.5; ``logs/call8/place.txt``), and by Nsight Compute 278.6 us with all 537.5 MB read
from DRAM at 57.9 % of its peak (the Triton kernel 214.1 us, 75.3 %; ``logs/call8/ncu-place.txt``).
Cause: instructions. Its loop issues 1105 SASS instructions a warp for each 64-key tile (about 380
of them the uniform-datapath address work of the tile's 16 TMA boxes and the wgmma descriptors, 28
barriers); the Triton kernel's fp8 loop is 1104 for 128 keys (its bf16 one 959, at 100 % of copy). Three programs of 4 warps an SM issuing
1105 instructions per 16 KiB tile would need every issue slot to keep up with the DRAM.

Program: one query token (``mla_sm90_narrow._program`` with one token a program: its sequence by
binary search over ``query_start_loc``, the padding tokens past ``query_start_loc[-1]`` with no
keys) x one kv head (grid axis 0, the fastest: the programs resident at once read the neighbouring
heads of the same pages) x one split (axis 2). Row ``r < GROUP`` of the program's products is
query head ``kv_head * GROUP + r``; rows past the group read zero queries and are not written.
Causal: the token's keys up to its position (``_program``'s key range). Split-KV: program (token,
head, split) covers keys ``[split * split_tokens, + split_tokens)`` and writes its normalised
partial output and log2 LSE (0 and -inf for no keys) into the workspace that
``paged_attention._combine_kernel`` merges (``v_scale`` applied there), as the Triton kernel's
partials.

Loads: each cache seen as the 2-D ``[rows, W]`` tensor (``[NB * BS, Hkv * D]`` when contiguous; a
kv head's slot ``s`` of block ``b`` at row ``b * block_rows + head * head_rows + s``, column
``head * head_cols``), one TMA box of ``min(BS, 64)`` rows x 64 columns (64 bytes, the 64-byte
swizzle) a page and 64-column chunk, for K and V, onto the stage's ``ready`` barrier; the tile's
block ids are loaded before the wait for its stage. A block id outside ``[0, NB)`` or a page past
the sequence points the copy past the view's last row, where TMA reads zeros, and the scores of
those keys are masked. Value rows past the sequence's end are zeroed in the conversion (the cache
there may hold anything, and 0 * NaN is NaN).

fp16 products: fp8 values are fp16 values (one conversion instruction); bf16 queries are scaled by
a power of two into fp16's range (``mla_sm90_narrow._query_unit``, undone in the scores' scale).
Row sums are kept per key slot and reduced across the warps once, after the key loop
(``mla_sm90_fp8``'s measurement). One warpgroup a program (no producer warp: Triton 3.6's warp
specialisation pads the program to two warpgroups and raises the consumer's registers to 256 with
``setmaxnreg``, one program an SM); the warpgroup issues tile ``j + STAGES``'s copies once tile
``j`` is converted, their block ids loaded before the wait for tile ``j``.

K goes to registers in the wgmma operand layout and is converted there (the A operand of ``S^T``),
so only V takes an fp16 tile. Shared memory (D 128): ``STAGES`` fp8 stages of K and V (16 KiB a
stage), the fp16 V tile (16 KiB), Q (4 KiB), P (2 KiB): 70 KiB at three stages, so three programs
share an SM (each chunk its own allocation, ``mla_sm90._rings9``'s reason); 157 registers a thread
(sm_90 SASS). Registers: O^T is two [64, 16] float32 blocks,
16 a thread.

Layouts: query/out ``[T, Hq, D]`` (head dimension contiguous), caches ``[NB, BS, Hkv, D]`` (any
``_sm90.row_layout`` view); partials ``[T, S, Hq, D]`` and ``[T, S, Hq]`` float32. Bytes moved:
``sum_b kv_b * Hkv * 2D`` (each program reads its head's keys once) + ``T * Hq * 2D * q_bytes``
(+ the partials, written and read once).

Runs only on a CUDA device of compute capability 9.0 with the Gluon of a tested Triton
(``_sm90.unavailable``); the Triton kernel runs every call this one declines. Under tracing it
runs behind the private opaque op ``paged_attn::_decode_sm90_fp8`` (its TMA descriptors are
encoded on the host, which ``wrap_triton`` does not launch); its grid comes from shapes only, so
capture and replay hold.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from . import _sm90
from . import mla_sm90_narrow as narrow
from . import paged_attention as pa
from ._launch import launcher, same_as

try:  # Gluon ships with Triton >= 3.5; without it this kernel declines every call
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from ._sm90 import thread_barrier, tma_load
    from .mla_sm90 import _block_id, _signal_dependents, _wait_prerequisites
    from .mla_sm90_narrow import _convert, _empty_state, _program, _query_unit, _softmax_scaled, _write
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

TILE_N = 64  # keys a tile: wgmma's M
ROWS = 16  # query heads a program (wgmma's N): a kv head's group, padded
PROGRAMS_PER_SM = 3  # resident programs an SM (70 KiB of shared memory each at three stages)
# fp8 K/V tiles of 64 keys in flight a program: 48 KiB at head size 128, so three programs fit an
# SM (each with its 16 KiB fp16 V tile, 4 KiB of queries and 2 of P).
STAGE_BYTES = 3 * 64 * 128 * 2


def stages(head_size: int) -> int:
    """Tiles in flight a program: ``STAGE_BYTES`` of fp8 K and V (3 at head size 128, 6 at 64)."""
    return STAGE_BYTES // (TILE_N * head_size * 2)


def declines(query: Tensor, key_cache: Tensor, value_cache: Tensor, *, scale: float, window_left: int,
             window_right: int, softcap: float, alibi_slopes: Tensor | None, sinks: Tensor | None,
             attention_chunk_size: int) -> str | None:
    """Why this kernel does not take a decode-planned call (None: it takes it). Static facts only:
    device, dtypes, sizes, strides, the options."""
    reason = _sm90.unavailable(query)
    if reason:
        return reason
    if key_cache.dtype not in pa._FP8 or value_cache.dtype != key_cache.dtype:
        return "an fp8 cache (K and V of one dtype) only"
    if query.dtype not in (torch.bfloat16, torch.float16):
        return "bf16/fp16 queries only"
    head_size, head_size_v = query.shape[2], value_cache.shape[3]
    if head_size != head_size_v or head_size not in (64, 128):
        return "head sizes 64 and 128 (K and V alike) only"
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    if num_heads // num_kv_heads > ROWS:
        return f"at most {ROWS} query heads a kv head"
    if query.shape[0] > pa._MAX_GRID_Y:
        return f"at most {pa._MAX_GRID_Y} query tokens (grid axis 1)"
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
    return None


if gluon is not None:
    _TILE = gl.constexpr(TILE_N)
    _ROWS = gl.constexpr(ROWS)
    _LOG2E = gl.constexpr(narrow.LOG2E)
    # the warpgroup's [64 keys, 16 rows] accumulators (S^T and each 64-column block of O^T), their
    # columns (the query rows) and rows (the tile's keys)
    _ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16]))
    _COL = gl.constexpr(gl.SliceLayout(0, _ACC))
    _KEY = gl.constexpr(gl.SliceLayout(1, _ACC))
    # K as the A operand of S^T from registers (each fp8 chunk loaded in the wgmma operand layout
    # and converted there)
    _A_OPERAND = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_ACC, k_width=2))

    @gluon.jit
    def _rings(N: gl.constexpr, DEPTH: gl.constexpr, ROWS: gl.constexpr, dtype: gl.constexpr,
               layout: gl.constexpr):
        """``N`` (1 or 2) chunk buffers of ``DEPTH`` [ROWS, 64] tiles, one allocation each
        (``mla_sm90._rings9``: Triton's barrier analysis tells shared memory apart by allocation)."""
        r = (gl.allocate_shared_memory(dtype, [DEPTH, ROWS, 64], layout), )
        if N > 1:
            r = r + (gl.allocate_shared_memory(dtype, [DEPTH, ROWS, 64], layout), )
        return r

    @gluon.jit
    def _tile_blocks(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """The block ids of the pages of the tile from ``key0`` (one a ``BOX`` keys; -1 past the
        sequence's pages), loaded ahead of the copies that use them."""
        blks = ()
        for i in gl.static_range(_TILE // BOX):
            blks = blks + (_block_id(key0 + i * BOX, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE), )
        return blks

    @gluon.jit
    def _issue(k_desc, v_desc, ks, vs, ready, st, key0, blks, num_blocks, k_row0, k_col, k_block_rows, k_end_row,
               v_row0, v_col, v_block_rows, v_end_row, DCH: gl.constexpr, BLOCK_SIZE: gl.constexpr,
               BOX: gl.constexpr):
        """The tile from ``key0`` (its pages' block ids ``blks``) into stage ``st`` of K and V: one TMA
        box of ``BOX`` rows x 64 columns a page and chunk of each cache, completing on the stage's
        ``ready`` barrier; a block id outside ``[0, NB)`` points the copy at the view's end row."""
        bar = ready.index(st)
        mbarrier.expect(bar, 2 * _TILE * 64 * DCH * k_desc.dtype.primitive_bitwidth // 8)
        for i in gl.static_range(_TILE // BOX):
            blk = blks[i]
            ok = (blk >= 0) & (blk < num_blocks)
            slot = (key0 + i * BOX) % BLOCK_SIZE
            k_row = gl.where(ok, blk * k_block_rows + k_row0 + slot, k_end_row)
            v_row = gl.where(ok, blk * v_block_rows + v_row0 + slot, v_end_row)
            for c in gl.static_range(DCH):
                tma_load(k_desc, [k_row, k_col + c * 64], bar, ks[c].index(st).slice(i * BOX, BOX))
                tma_load(v_desc, [v_row, v_col + c * 64], bar, vs[c].index(st).slice(i * BOX, BOX))

    @gluon.jit
    def _queries(query_ptr, stride_q_head, GROUP: gl.constexpr, DCH: gl.constexpr):
        """The program's queries as ``DCH`` [ROWS, 64] tiles in registers, all loads issued before
        any is used: row r is query head r of the group (``query_ptr`` at the token's first head of
        it); rows past the group read 0."""
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r_io = gl.arange(0, _ROWS, layout=gl.SliceLayout(1, io_layout))
        rows = gl.expand_dims(r_io * stride_q_head, 1)
        ok = gl.expand_dims(r_io < GROUP, 1)
        offs_c = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout)), 0)
        chunks = (gl.load(query_ptr + rows + offs_c, mask=ok, other=0.0), )
        if DCH > 1:
            chunks = chunks + (gl.load(query_ptr + rows + offs_c + 64, mask=ok, other=0.0), )
        return chunks

    @gluon.jit
    def _values(o0, o1, cv, z, p_smem, DCH: gl.constexpr):
        """``O^T += V^T P^T`` over the ``DCH`` 64-column chunks of the fp16 V tile ``cv``, waited for."""
        o0 = warpgroup_mma(cv[0].index(z).permute((1, 0)), p_smem, o0, is_async=True)
        if DCH > 1:
            o1 = warpgroup_mma(cv[1].index(z).permute((1, 0)), p_smem, o1, is_async=True)
            o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
        else:
            o0 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, ))
        return o0, o1

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _decode_fp8_kernel(
        query_ptr,  # [T, Hq, D]
        k_desc, v_desc,  # TMA descriptors of the fp8 caches as [rows, W], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, Hq, D] or partials [T, S, Hq, D] float32; [T, Hq] or [T, S, Hq] float32
        k_scale_ptr, v_scale_ptr,  # [] or [1] float32
        scale,
        num_tokens, num_seqs, num_blocks, max_blocks, split_tokens,
        k_block_rows, k_head_rows, k_head_cols, k_end_row,  # the caches' [rows, W] views (_sm90.row_layout)
        v_block_rows, v_head_rows, v_head_cols, v_end_row,
        stride_q_tok, stride_q_head, stride_bt_seq, stride_bt_block, stride_sl, stride_qsl,
        stride_o_tok, stride_o_split, stride_o_head, stride_lse_tok, stride_lse_split, stride_lse_head,
        GROUP: gl.constexpr, HEAD_SIZE: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
        STAGES: gl.constexpr, CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr,
        USE_PDL: gl.constexpr,
    ):
        DCH: gl.constexpr = HEAD_SIZE // 64
        if USE_PDL:  # launched with programmatic dependent launch: nothing is read before this
            _wait_prerequisites()
        kv_head = gl.program_id(0)
        pid_q = gl.program_id(1)
        split = gl.program_id(2)
        head0 = (kv_head * GROUP).to(gl.int64)
        query_ptr += pid_q.to(gl.int64) * stride_q_tok + head0 * stride_q_head
        out_ptr += split.to(gl.int64) * stride_o_split + head0 * stride_o_head
        lse_ptr += split.to(gl.int64) * stride_lse_split + head0 * stride_lse_head
        seq, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip = _program(
            pid_q, split, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, num_tokens, num_seqs, max_blocks,
            split_tokens, stride_bt_seq, stride_sl, stride_qsl, 1, BLOCK_SIZE, CAUSAL)
        k_row0, k_col = kv_head * k_head_rows, kv_head * k_head_cols
        v_row0, v_col = kv_head * v_head_rows, kv_head * v_head_cols

        f16_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
        k_dtype: gl.constexpr = k_desc.dtype
        k_layout: gl.constexpr = k_desc.layout
        v_dtype: gl.constexpr = v_desc.dtype
        v_layout: gl.constexpr = v_desc.layout
        ks = _rings(DCH, STAGES, _TILE, k_dtype, k_layout)
        vs = _rings(DCH, STAGES, _TILE, v_dtype, v_layout)
        cv = _rings(DCH, 1, _TILE, gl.float16, f16_layout)
        qs = _rings(DCH, 1, _ROWS, gl.float16, f16_layout)
        p_smem = gl.allocate_shared_memory(gl.float16, [_TILE, _ROWS], p_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        fence_async_shared()

        # -- the queries' loads, then the first tiles' copies, then Q to shared memory as fp16 --
        chunks = _queries(query_ptr, stride_q_head, GROUP, DCH)
        for i in gl.static_range(STAGES):
            if n_tiles > i:
                key0 = key_lo + i * _TILE
                _issue(k_desc, v_desc, ks, vs, ready, i, key0,
                       _tile_blocks(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE, BOX), num_blocks,
                       k_row0, k_col, k_block_rows, k_end_row, v_row0, v_col, v_block_rows, v_end_row, DCH,
                       BLOCK_SIZE, BOX)
        qk_scale = scale * _LOG2E * gl.load(k_scale_ptr)
        q_unit = 1.0
        if query_ptr.dtype.element_ty == gl.bfloat16:
            q_unit = _query_unit(chunks, DCH)
            qk_scale = qk_scale * q_unit
        for c in gl.static_range(DCH):
            qs[c].index(0).store((chunks[c].to(gl.float32) / q_unit).to(gl.float16))
        fence_async_shared()
        thread_barrier()

        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(_ROWS, _ACC)
        l_k = o0  # the row sums per key slot, reduced across the warps once, after the loop
        for j in range(n_tiles):
            # buffer index the compiler cannot fold (j < 2**30): the wgmma descriptors are then
            # formed where they are used, not hoisted out of the loop (as mla_sm90's)
            z = j >> 30
            st = j % STAGES
            key0 = key_lo + j * _TILE
            # this tile's block ids (its masks) and those of tile j + STAGES, which this stage takes
            # next, loaded before the wait
            keys = key0 + gl.arange(0, _TILE, layout=_KEY)
            blk = _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
            key2 = key0 + STAGES * _TILE
            blks2 = _tile_blocks(key2, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE, BOX)
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            # K to registers as fp16 (the A operand of S^T), V to its fp16 tile (value rows past the
            # sequence zeroed); the stage then takes tile j + STAGES
            k0 = ks[0].index(st).load(_A_OPERAND).to(gl.float16)
            if DCH > 1:
                k1 = ks[1].index(st).load(_A_OPERAND).to(gl.float16)
            _convert(vs, st, cv, kv_end - key0, DCH, 4)
            fence_async_shared()
            thread_barrier()
            if j + STAGES < n_tiles:
                _issue(k_desc, v_desc, ks, vs, ready, st, key2, blks2, num_blocks, k_row0, k_col, k_block_rows,
                       k_end_row, v_row0, v_col, v_block_rows, v_end_row, DCH, BLOCK_SIZE, BOX)
            # S^T = K Q^T: [64 keys, 16 rows]
            s = warpgroup_mma(k0, qs[0].index(z).permute((1, 0)), gl.zeros([_TILE, _ROWS], gl.float32, _ACC),
                              is_async=True)
            if DCH > 1:
                s = warpgroup_mma(k1, qs[1].index(z).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            # scaled, then masked: keys past kv_end or on pages with an id outside [0, NB)
            visible = gl.expand_dims((blk >= 0) & (blk < num_blocks) & (keys < kv_end), 1)
            p, alpha, m_new = _softmax_scaled(s, visible, m_i, qk_scale)
            m_i = m_new
            a = gl.expand_dims(alpha, 0)
            l_k = l_k * a + p
            o0, o1 = o0 * a, o1 * a
            p_smem.store(p.to(gl.float16))
            fence_async_shared()
            thread_barrier()
            # O^T += V^T P^T, one wgmma a 64-column chunk
            o0, o1 = _values(o0, o1, cv, z, p_smem, DCH)

        if USE_PDL:  # the key loop is done: the kernel after it (a split call's combine) may launch
            _signal_dependents()
        l_i = gl.sum(l_k, 0)
        # -- epilogue: O / l (times v_scale on the output itself; partials leave it to the combine
        # kernel) and lse = (m + log2 l) * LSE_UNIT; row r is head r of the group --
        r_c = gl.arange(0, _ROWS, layout=_COL)
        _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, gl.load(v_scale_ptr), r_c, r_c // GROUP,
               q_start, q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, GROUP, 1,
               _ROWS, DCH, LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, 4)


def _launcher(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
              query_start_loc: Tensor, so: tuple, sl: tuple, num_splits: int, lse_unit: float, has_lse: bool,
              scale: float, causal: bool, split_tokens: int, pdl: bool):
    """The kernel's ``_launch.launcher`` for calls of these shapes and strides, writing into an
    ``out`` / ``lse`` of strides ``so`` / ``sl`` (token, split, head; ``mla_sm90._out_strides``)
    with ``num_splits`` splits of ``split_tokens`` keys and ``lse_unit`` (``LN2``: the natural-log
    LSE; 1: log2 partials), launched with programmatic dependent launch when ``pdl``: every
    argument but the tensors fixed, the caches' TMA descriptors encoded once per cache address
    (``_sm90.descriptor_spec``). ``go(query, query_ptr=, k_desc=key_cache, v_desc=value_cache,
    block_table_ptr=, seq_lens_ptr=, query_start_loc_ptr=, out_ptr=, lse_ptr=, k_scale_ptr=,
    v_scale_ptr=)`` (``lse_ptr=out`` without an LSE)."""
    num_tokens, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs, max_blocks = block_table.shape
    box = min(block_size, TILE_N)
    k_rows, v_rows = _sm90.row_layout(key_cache), _sm90.row_layout(value_cache)
    return launcher(
        _decode_fp8_kernel, (num_kv_heads, num_tokens, num_splits),
        k_desc=_sm90.descriptor_spec(key_cache, box), v_desc=_sm90.descriptor_spec(value_cache, box),
        **({} if has_lse else {"lse_ptr": same_as("out_ptr")}),
        scale=float(scale), num_tokens=num_tokens, num_seqs=num_seqs, num_blocks=num_blocks, max_blocks=max_blocks,
        split_tokens=split_tokens,
        k_block_rows=k_rows[0], k_head_rows=k_rows[1], k_head_cols=k_rows[2], k_end_row=_sm90.view_rows(key_cache),
        v_block_rows=v_rows[0], v_head_rows=v_rows[1], v_head_cols=v_rows[2], v_end_row=_sm90.view_rows(value_cache),
        stride_q_tok=query.stride(0), stride_q_head=query.stride(1), stride_bt_seq=block_table.stride(0),
        stride_bt_block=block_table.stride(1), stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0),
        stride_o_tok=so[0], stride_o_split=so[1], stride_o_head=so[2],
        stride_lse_tok=sl[0], stride_lse_split=sl[1], stride_lse_head=sl[2],
        GROUP=num_heads // num_kv_heads, HEAD_SIZE=head_size, BLOCK_SIZE=block_size, BOX=box,
        STAGES=stages(head_size), CAUSAL=bool(causal), HAS_LSE=has_lse, LSE_UNIT=lse_unit,
        num_warps=4, **pa.pdl_options(pdl),
    )


def _go(go, query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
        query_start_loc: Tensor, out: Tensor, lse: Tensor | None, k_scale: Tensor, v_scale: Tensor) -> None:
    """``go`` (a ``_launcher``) on these tensors."""
    go(query, query_ptr=query, k_desc=key_cache, v_desc=value_cache, block_table_ptr=block_table,
       seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
       lse_ptr=lse if lse is not None else out, k_scale_ptr=k_scale, v_scale_ptr=v_scale)


_LAUNCHERS: dict[tuple, object] = {}


@torch.library.custom_op("paged_attn::_decode_sm90_fp8", mutates_args=("out", "lse"))
def _decode_sm90_fp8(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                     query_start_loc: Tensor, out: Tensor, lse: Tensor | None, k_scale: Tensor, v_scale: Tensor,
                     scale: float, causal: bool, split_tokens: int) -> None:
    """This kernel into ``out`` [T, Hq, D] and, when given, ``lse`` [T, Hq] (natural log), or
    into split partials (4-D ``out`` [T, S, Hq, D], 3-D ``lse`` [T, S, Hq], float32, log2) at
    multiples of ``split_tokens`` keys: an opaque op, so that Inductor, tracing the public op's
    body, sees one extern call (a Gluon kernel with TMA descriptors is not one ``wrap_triton``
    launches). The launcher of these shapes and strides is kept in ``_LAUNCHERS``."""
    if query.shape[0] == 0:
        return
    from .mla_sm90 import _out_strides

    so, sl, num_splits, lse_unit = _out_strides(out, lse)
    key = (query.shape, query.stride(), key_cache.shape, key_cache.stride(), key_cache.dtype, value_cache.shape,
           value_cache.stride(), block_table.shape, block_table.stride(), seq_lens.stride(0),
           query_start_loc.stride(0), so, sl, num_splits, lse_unit, lse is not None, query.device, float(scale),
           bool(causal), split_tokens)
    go = _sm90.kept_launcher(_LAUNCHERS, key, lambda: _launcher(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, so, sl, num_splits, lse_unit,
        lse is not None, scale, causal, split_tokens, False))
    _go(go, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, k_scale, v_scale)


@_decode_sm90_fp8.register_fake
def _(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, k_scale, v_scale, scale,
      causal, split_tokens):
    return None


def prepare(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
            query_start_loc: Tensor, out: Tensor, lse: Tensor | None, *, scale: float, causal: bool,
            split_tokens: int | None) -> Callable[..., None] | None:
    """The runner of this kernel for calls shaped like this one (``paged_attention.
    prepare_paged_attention`` documents the runner), or None where its splits would not fit the
    workspace (the Triton kernel then merges them in its programs). Split-KV as the Triton
    kernel plans it (``paged_attention._plan_splits``: until the programs, a token x kv head
    each, fill the resident slots once; ``split_tokens`` given, at its multiples), the partials
    merged by ``paged_attention._combine_kernel``. Every launch argument but the tensors is
    fixed here."""
    from .. import plain_eager
    from .mla_sm90 import _out_strides

    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    capacity = block_table.shape[1] * key_cache.shape[1]
    split_tokens, num_splits, write_partial = pa._plan_splits(
        query.device, num_tokens * num_kv_heads, PROGRAMS_PER_SM, capacity, TILE_N,
        num_tokens * num_heads * (head_size + 1) * 4, split_tokens)
    if num_splits > 1 and not write_partial:
        return None
    scale, causal = float(scale), bool(causal)
    has_lse = lse is not None
    workspace = pa._Workspace(write_partial, num_tokens, num_splits, num_heads, head_size, query.device)
    pdl = write_partial and pa.use_pdl(query.device)
    if write_partial:  # the partials [T, S, Hq, D] and [T, S, Hq], contiguous
        so, sl, lse_unit = workspace.po_strides, (*workspace.pl_strides, 1), 1.0
        combine = pa.combine_launcher(query, seq_lens, query_start_loc, out, lse, workspace, num_splits, split_tokens,
                                      split_tokens, pa._NO_SPLIT, head_size, False, True, pdl)
    else:
        so, sl, _, lse_unit = _out_strides(out, lse)
    go = _launcher(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, so, sl, num_splits,
                   lse_unit, has_lse or write_partial, scale, causal, split_tokens, pdl)

    def attend(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, k_scale, v_scale):
        if plain_eager(query):  # the op's body directly: nothing traces
            _go(go, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, k_scale, v_scale)
        else:
            torch.ops.paged_attn._decode_sm90_fp8(query, key_cache, value_cache, block_table, seq_lens,
                                                  query_start_loc, out, lse, k_scale, v_scale, scale, causal,
                                                  split_tokens)

    def run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        k_scale, v_scale = options["k_scale"], options["v_scale"]
        if not write_partial:
            attend(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, k_scale, v_scale)
            return
        part_out, part_lse = workspace.tensors(out)
        attend(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, part_out, part_lse, k_scale,
               v_scale)
        combine(query, part_out_ptr=part_out, part_lse_ptr=part_lse, seq_lens_ptr=seq_lens,
                query_start_loc_ptr=query_start_loc, sinks_ptr=query, v_scale_ptr=v_scale, out_ptr=out,
                lse_ptr=lse if has_lse else out)

    return run
