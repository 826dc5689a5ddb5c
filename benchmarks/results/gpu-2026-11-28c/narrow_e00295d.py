"""MLA decode on Hopper (sm_90) in Gluon for narrow row groups (query tokens x heads <= 32 rows:
16-head models, speculative tokens), the products taken transposed so that the 64-key tile fills
wgmma's 64-row M dimension and the few query rows its N.

Computes what ``mla._mla_kernel`` computes (absorbed MLA decode: every head attends to the rows
``[c | k_pe]`` of a paged latent cache, the latent ``c`` is the value too) for the calls it takes
(``declines``): bf16/fp16 queries and a cache of the same dtype or fp8 (e4m3 / e5m2), latent a
multiple of 64 up to 512, rope 64, ``BLOCK_Q`` query tokens x ``H`` heads <= 32 rows a program,
block sizes that are powers of two >= 8, a cache TMA can read (``_sm90.cache_declines``, strided
views included). fp8 calls of at most 16 rows run ``mla_sm90_fp8`` instead (``mla.SM90_FP8``).

Why transposed. With 16 rows a program, ``S = Q K^T`` on wgmma pads the rows to 64 (its M is 64
per warpgroup): four times the tensor-core work and the A operand re-read for nothing. Here a
program computes ``S^T = K Q^T`` (M = the tile's 64 keys, N = the ROWS query rows, K = the 576
columns; A the latent tile in shared memory, B the queries, both K-major) and ``O^T += V^T P^T``
(M = 64 latent columns a wgmma, eight of them, K = the 64 keys; A the latent tile read transposed
from shared memory, B = P^T stored to shared memory). No row is padded; the softmax runs down the
columns (a cross-warp reduction over the keys).

Loads: the cache seen as the 2-D ``[NB * BS, L + R]`` tensor, one TMA box of ``min(BS, 64)`` rows
x 64 columns a page and chunk (128-byte swizzle, the wgmma operand layout); a block id outside
``[0, NB)`` (or a page past the sequence) points the copy past the last row, where TMA fills
zeros, and the scores of those keys are masked. Two stages of 64 keys x 576 columns (144 KiB):
tile ``j + 2`` is issued as soon as the products of tile ``j`` are done, so a tile is in flight
while one is multiplied. The kernel is bound by the cache's bytes (a tile's products
take ~0.4 us of tensor-core time against ~3 us for its 72 KiB at one SM's share of the DRAM
bandwidth). Value rows past the sequence end in the last tile are zeroed in shared memory before
``P V`` (the cache there may hold anything, and 0 * NaN is NaN).

fp8 caches: the products run in fp16 (fp8 values are fp16 values; bf16 queries are scaled by a
power of two into fp16's range, ``_query_unit``), the cache's scale in the scores and the
output. Each landed stage is converted into one fp16 operand tile in shared memory (value rows
past the sequence zeroed there) and refilled at once, so the 36 KiB fp8 stages go three deep
(``stages``). H100, 2026-11-26, graph replays: 2 tokens B64 x 4096 H16 on e4m3 125.4-126.8 us
(137.1-139.2 before the chunk buffers above; the Triton kernel 198.4,
gpu-2026-11-26d/logs/probe-3.txt); one warpgroup's chain of conversion, products and softmax
bounds it (``mla_sm90_fp8``'s docstring has the profile).

Grid: (query block, 1, split). ``BLOCK_Q`` 1: program t is token t; more: the query blocks of
each sequence as ``paged_attention._attention_kernel`` numbers them (``T // BLOCK_Q + B + 1``
programs, those past the sequences' blocks exit; the padding rows past ``query_start_loc[-1]``
form a pseudo-sequence without keys). Split-KV (``mla_sm90.launch`` with 4-D ``out``): program (block, split)
covers keys ``[split * split_tokens, + split_tokens)`` and writes its normalised partial output
and log2 LSE (0 and -inf for no keys) for ``mla``'s combine kernel. The last split of each query
block merging them itself instead (a counter a block) measured slower on every split shape but 2
tokens B64 x 4096 H16 (0.8 % faster there; H100, benchmarks/RESULTS.md, eleventh run).

Fold (``FOLD``, bf16/fp16 caches, unsplit, with an LSE; ``mla._fold`` plans it where the default
plan splits two ways): two CTAs a query block, launched as a pair (``_cluster``: CTA ``2k + r``
is rank r of block k). Rank 0 takes the first ``ceil(n / 2)`` of the block's n tiles, rank 1
the rest; rank 1 writes its normalised output and log2 LSE into ``out`` / ``lse`` (its rows
only, after both CTAs have read their queries: ``out`` may be the queries), then arrives on rank
0's barrier (a release at cluster scope, ``fence.acq_rel.cluster`` before it); rank 0 waits,
reads them back (L2) and merges them into its own state before its epilogue. No partials, no
combine kernel: 2 tokens B64 x 4096 H16 113.7-114.7 us against 115.8-116.3 for FlashInfer in
the same runs (H100, 2026-11-28, benchmarks/RESULTS.md, twenty-second run). A binary the rewrite
did not reach (``_cluster.cluster_pair`` 0) runs every tile on rank 0 and returns rank 1 at once.

Buffers: each 64-column chunk of the stages, of the fp16 operand tile and of Q is its own
allocation (``mla_sm90._rings9``). Triton's barrier analysis tells shared memory apart by
allocation only: into one buffer each chunk's store waited at a barrier for the chunk before it,
which in the prologue made each of the nine query chunks' global loads wait for the previous
chunk's store (sm_90 SASS: load, store, barrier, nine times; now nine loads in flight at once).

H100, 2026-11-26 (benchmarks/RESULTS.md, "fourth run"), CUDA-graph replays: B128 x 4096 H16 207.4
us (97.8 % of copy; FlashInfer 209.2, the Triton kernel 220.2), B32 x 8192 H16 110.9 (FlashInfer
111.9), 2 tokens B64 x 4096 H16 119.0 (FlashInfer 115.7). The query chunks' own allocations took
1.5-2.0, 1.5-2.1 and 2.1 us off these (probe against main 0ff2888 in one process,
gpu-2026-11-26d/logs/probe-3.txt; the stages' own allocations alone changed none of them,
probe-2.txt: their copies keep the barrier Triton's TMA lowering puts before each). Nsight Compute
(second run): the 32-row programs' two warpgroups each read the tile for their own products and
meet at every cross-warp reduction's barrier, and with two stages about one tile is in flight per
SM.

Layouts: q_latent/out ``[T, H, L]``, q_rope ``[T, H, R]`` (last stride 1), kv_cache ``[NB, BS, L +
R]`` (any ``_sm90.row_layout`` view); partials ``[T, S, H, L]`` in the query's dtype
(``mla._NARROW_PARTIALS_IN_QUERY_DTYPE``) and ``[T, S, H]`` float32. Shared
memory: ``2 x 64 x (L + R) x 2`` (stages) + ``ROWS x (L + R) x 2`` (Q) + ``64 x ROWS x 2`` (P)
bytes: 164 KiB at 576 columns and 16 rows, one program an SM; fp8: ``STAGES x 64 x (L + R)`` + the
fp16 tile ``64 x (L + R) x 2`` + Q + P (220 KiB at 32 rows, three stages); below latent 512 each
unused chunk buffer is a 1 KiB stand-in (``mla_sm90._ring``). Bytes moved: ``sum_b kv_b * (L +
R) * cache_bytes`` (each program reads its keys once) + ``T * H * (2L + R) * q_bytes`` (+ the
partials, written and read once; a fold's rank 1 state, ``T * H * (L * q_bytes + 4)``, likewise).
"""

from __future__ import annotations

from torch import Tensor

from ._launch import next_power_of_2
from .mla_sm90 import gluon_mla_declines
from .paged_attention import pdl_options

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from ._cluster import cluster_fence, cluster_pair, cluster_sync, install
    from ._sm90 import thread_barrier, tma_load
    from .mla_sm90 import (
        _block_id, _block_row, _finite, _page_row, _rings9, _signal_dependents, _token_sequence, _wait_prerequisites,
    )
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

LOG2E = 1.4426950408889634
TILE_N = 64  # keys a tile: wgmma's M
MAX_ROWS = 32  # query tokens x heads a program (wgmma's N)
SMEM_BYTES = 232448  # an sm_90 program's shared memory (227 KiB)
# left for the compiler's own (barriers, alignment; its scratch buffers overlap dead ones): fp8 at
# 32 rows, three stages, took 536 bytes beyond the kernel's buffers (225816 in all, sm_90 SASS)
SMEM_SPARE = 1024


def num_warps(rows: int) -> int:
    """One warpgroup for 16 rows; two for 32, each the same keys and half the rows (O^T takes
    ``4 * rows`` registers a thread in one warpgroup: 128 at 32 rows, which spilled, 255 registers
    and a 64-byte stack, sm_90 SASS). H100, 2 tokens B64 x 4096 H16, graph replays: 125.5 us with
    one warpgroup, 123.4 with two (with the coalesced epilogue and PDL, landed in the same step;
    gpu-2026-11-26b/logs/probe-mla-*.txt)."""
    return 4 if rows <= 16 else 8


def stages(num_rows: int, latent: int, fp8: bool) -> int:
    """Tiles of 64 keys in flight: two of bf16/fp16 (a third does not fit beside the queries), as
    many fp8 ones as fit beside the fp16 operand tile they are converted to (three: 108 KiB + 72
    KiB + 18-36 KiB of queries)."""
    if not fp8:
        return 2
    chunks = latent // 64 + 1
    unused = 3 * (9 - chunks) * 1024  # the stage, fp16-tile and Q rings' [1, 8, 64] stand-ins past the latent
    fixed = chunks * TILE_N * 64 * 2 + chunks * num_rows * 64 * 2 + TILE_N * num_rows * 2 + unused + SMEM_SPARE
    return max(2, min(4, (SMEM_BYTES - fixed) // (chunks * TILE_N * 64)))


def rows(num_heads: int, block_q: int) -> int:
    """The N of a program's products: ``block_q`` tokens x ``num_heads`` heads, a power of two >= 16."""
    return max(16, next_power_of_2(num_heads * block_q))


def declines(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_q: int) -> str | None:
    """Why this kernel does not take the call with ``block_q`` query tokens a program (None: it
    takes it). Static facts only."""
    latent, rope = q_latent.shape[2], q_rope.shape[2]
    if latent % 64 or latent > 512 or rope != 64:
        shape = "latent a multiple of 64 up to 512, rope 64"
    elif q_latent.shape[1] * block_q > MAX_ROWS:
        shape = f"rows: query tokens x heads at most {MAX_ROWS} a program"
    else:
        shape = None
    return gluon_mla_declines(q_latent, q_rope, kv_cache, True, shape)


if gluon is not None:
    install()  # the fold's pairs of CTAs: _cluster.rewrite on every compile of this process
    _TILE = gl.constexpr(TILE_N)
    _LOG2E = gl.constexpr(LOG2E)
    # Programs of at most this many rows issue their query loads before their first tiles' copies,
    # the others after. Timed from inside (%globaltimer, H100, gpu-2026-11-27e/logs/probe-timeline.txt),
    # a program's queries reached shared memory 5-8 us after it started, behind its first two
    # tiles (its first tile's wait then took 0.03-0.3 us). CUDA-graph replays, us, this (16) /
    # copies first everywhere (0) / queries first everywhere (32) (probe_qfirst.py,
    # logs/probe-qfirst-2.txt, three rounds): 16 rows (1 token H16) B64 x 4096 110.8-111.2 /
    # 111.6-111.7 / 110.6-111.0, B32 x 8192 109.3-109.6 / 109.9-110.1 / 109.3-109.5, B128 x 4096
    # 205.7-206.0 / 207.4-207.5 / 205.5-206.3, B16 x 8192 59.4-59.6 / 60.6-60.9 / 59.4-59.6, 2
    # tokens B8 x 4096 (a token a program) 22.4-22.8 / 23.6-24.0 / 22.6-22.8; 32 rows (2 tokens
    # H16, two warpgroups) B64 x 4096 119.3-119.6 / 119.3-119.5 / 120.3-120.6, B32 x 8192
    # 116.4-116.5 / 116.3-116.5 / 117.3-117.9, B128 x 4096 215.1-215.4 / 215.2-215.5 / 214.8-215.0
    # (why the split 32-row programs lose was not profiled).
    _QUERIES_FIRST = gl.constexpr(16)

    @gluon.jit
    def _issue(kv_desc, kvs, ready, stage, key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
               CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """The 64-key tile from ``key0`` into ``stage`` of the chunk rings ``kvs`` (``_rings9``): one
        TMA box of ``BOX`` rows x 64 columns a page and chunk, completing on the stage's ``ready``
        barrier."""
        bar = ready.index(stage)
        mbarrier.expect(bar, _TILE * 64 * CHUNKS * kv_desc.dtype.primitive_bitwidth // 8)
        for i in gl.static_range(_TILE // BOX):
            row = _page_row(key0 + i * BOX, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                            BLOCK_SIZE)
            for c in gl.static_range(CHUNKS):
                tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage).slice(i * BOX, BOX))

    @gluon.jit
    def _issue_page(kv_desc, kvs, ready, stage, key0, blk, num_blocks, block_rows, CHUNKS: gl.constexpr,
                    BLOCK_SIZE: gl.constexpr):
        """``_issue`` for a tile within one page (block size >= 64) whose block id ``blk`` (-1:
        none) was loaded earlier."""
        row = _block_row(blk, key0, num_blocks, block_rows, BLOCK_SIZE)
        bar = ready.index(stage)
        mbarrier.expect(bar, _TILE * 64 * CHUNKS * kv_desc.dtype.primitive_bitwidth // 8)
        for c in gl.static_range(CHUNKS):
            tma_load(kv_desc, [row, c * 64], bar, kvs[c].index(stage))

    @gluon.jit
    def _tile_block(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """The ``blk`` ``_refill`` takes for the tile from ``key0``, to be loaded before the wait that
        frees its stage: its page's block id where one page holds it (``BOX`` 64), else 0
        (``_refill`` then looks each page up itself)."""
        if BOX == _TILE:
            return _block_id(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
        else:
            return 0

    @gluon.jit
    def _refill(kv_desc, kvs, ready, stage, key0, blk, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
                block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr):
        """The tile from ``key0`` into ``stage``: ``_issue_page`` with its block id ``blk`` loaded
        earlier where a page holds the tile (``BOX`` 64), else ``_issue``."""
        if BOX == _TILE:
            _issue_page(kv_desc, kvs, ready, stage, key0, blk, num_blocks, block_rows, CHUNKS, BLOCK_SIZE)
        else:
            _issue(kv_desc, kvs, ready, stage, key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks,
                   block_rows, CHUNKS, BLOCK_SIZE, BOX)

    @gluon.jit
    def _convert(kvs, stage, cvs, tail, N: gl.constexpr, WARPS: gl.constexpr):
        """Chunks ``[0, N)`` of an fp8 tile (``stage`` of the rings ``kvs``) as fp16 (exact) into
        the operand buffers ``cvs`` (depth 1), rows ``>= tail`` zero (the cache may hold NaN past a
        sequence's last key, and 0 * NaN is NaN): each thread 16 bytes of a row in, 32 out; the
        caller fences before a wgmma reads them."""
        cl: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])
        if tail < _TILE:
            rows = gl.expand_dims(gl.arange(0, _TILE, layout=gl.SliceLayout(1, cl)), 1)
            for c in gl.static_range(N):
                v = kvs[c].index(stage).load(cl).to(gl.float16)
                cvs[c].index(0).store(gl.where(rows < tail, v, gl.zeros_like(v)))
        else:
            for c in gl.static_range(N):
                cvs[c].index(0).store(kvs[c].index(stage).load(cl).to(gl.float16))

    @gluon.jit
    def _zero_rows(kvs, stage, tail, VCH: gl.constexpr, WARPS: gl.constexpr):
        """Value rows ``>= tail`` of the tile in ``stage`` of the rings ``kvs``, latent chunks, to
        zero (the cache may hold NaN past a sequence's last key, and 0 * NaN is NaN); the caller
        fences before a wgmma reads them."""
        if tail < _TILE:
            zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
            rows = gl.expand_dims(gl.arange(0, _TILE, layout=gl.SliceLayout(1, zl)), 1)
            for c in gl.static_range(VCH):
                buf = kvs[c].index(stage)
                v = buf.load(zl)
                buf.store(gl.where(rows < tail, v, gl.zeros_like(v)))

    @gluon.jit
    def _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_block_start, q_len, stride_ql_tok, stride_ql_head,
                      stride_qr_tok, stride_qr_head, HEADS: gl.constexpr, BLOCK_Q: gl.constexpr, ROWS: gl.constexpr,
                      CHUNKS: gl.constexpr, WARPS: gl.constexpr):
        """The program's queries as ``CHUNKS`` [ROWS, 64] tiles in registers (the latent chunks,
        then the rope), all loads issued before any is used, by ``WARPS`` warps: row r is token r //
        HEADS of the program's block, head r % HEADS; rows past the block or the sequence read 0."""
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
        r_io = gl.arange(0, ROWS, layout=gl.SliceLayout(1, io_layout))
        t_io = r_io // HEADS
        ok_io = gl.expand_dims((t_io < BLOCK_Q) & (q_block_start + t_io < q_len), 1)
        tok_io = (q_start + q_block_start + t_io).to(gl.int64)
        ql_rows = gl.expand_dims(tok_io * stride_ql_tok + (r_io % HEADS) * stride_ql_head, 1)
        qr_rows = gl.expand_dims(tok_io * stride_qr_tok + (r_io % HEADS) * stride_qr_head, 1)
        offs_c = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, io_layout)), 0)
        chunks = ()
        for c in gl.static_range(CHUNKS - 1):
            chunks = chunks + (gl.load(q_latent_ptr + ql_rows + offs_c + c * 64, mask=ok_io, other=0.0), )
        return chunks + (gl.load(q_rope_ptr + qr_rows + offs_c, mask=ok_io, other=0.0), )

    @gluon.jit
    def _query_unit(chunks, CHUNKS: gl.constexpr):
        """The power of two ``2^e`` that brings the largest element of the query ``chunks``
        (``_query_chunks``) into [2^14, 2^15) (``paged_attention._fp16_exponent``; 1 for 0): bf16
        queries over ``2^e`` are fp16, the type fp8 converts to in one instruction, exact above
        fp16's normal floor (2^-28 of the largest, far below bf16's 2^-8 precision)."""
        # element-wise over the chunks, then one reduction (one per chunk put two barriers of the
        # warpgroup in each of nine steps of the prologue: sm_90 SASS)
        amax = gl.abs(chunks[0].to(gl.float32))
        for c in gl.static_range(1, CHUNKS):
            amax = gl.maximum(amax, gl.abs(chunks[c].to(gl.float32)))
        amax = gl.max(gl.max(amax, 1), 0)
        e = gl.where(amax > 0, gl.floor(gl.log2(amax)) - 14.0, 0.0)
        return gl.exp2(gl.minimum(gl.maximum(e, -100.0), 100.0))

    @gluon.jit
    def _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start, q_block_start,
               q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS: gl.constexpr,
               BLOCK_Q: gl.constexpr, ROWS: gl.constexpr, VCH: gl.constexpr, SCALED: gl.constexpr,
               HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, WARPS: gl.constexpr):
        """The epilogue of a program's state ``(m, l, O^T)``: O^T's blocks over l (times
        ``out_scale`` when ``SCALED``: an fp8 cache's scale, on the output itself; partials leave it
        to the combine kernel) to ``out``, and lse = (m + log2 l) * LSE_UNIT; query row ``r_c``
        (token ``t_c = r_c // HEADS`` of the program's block, head ``r_c % HEADS``); by ``WARPS``
        warps."""
        has_keys = l_i != 0.0
        inv_l = gl.where(has_keys, 1.0 / gl.where(has_keys, l_i, 1.0), 0.0)
        if SCALED:
            inv_l = inv_l * out_scale
        inv_l = gl.expand_dims(inv_l, 0)
        row_ok = (t_c < BLOCK_Q) & (q_block_start + t_c < q_len)
        tok_c = (q_start + q_block_start + t_c).to(gl.int64)
        st_layout: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, WARPS], [0, 1])
        r_s = gl.arange(0, ROWS, layout=gl.SliceLayout(0, st_layout))
        t_s = r_s // HEADS
        o_cols = gl.expand_dims((q_start + q_block_start + t_s).to(gl.int64) * stride_o_tok
                                + (r_s % HEADS) * stride_o_head, 0)
        o_ok = gl.expand_dims((t_s < BLOCK_Q) & (q_block_start + t_s < q_len), 0)
        _store(out_ptr, o0, 0, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o1, 1, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o2, 2, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o3, 3, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o4, 4, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o5, 5, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o6, 6, inv_l, o_cols, o_ok, VCH, st_layout)
        _store(out_ptr, o7, 7, inv_l, o_cols, o_ok, VCH, st_layout)
        if HAS_LSE:
            lse = gl.where(has_keys, (m_i + gl.log2(gl.where(has_keys, l_i, 1.0))) * LSE_UNIT, float("-inf"))
            gl.store(lse_ptr + tok_c * stride_lse_tok + (r_c % HEADS) * stride_lse_head, lse, mask=row_ok)

    @gluon.jit
    def _part(c: gl.constexpr, out_ptr, cols, ok, VCH: gl.constexpr, acc_layout: gl.constexpr):
        """Latent chunk ``c`` of a fold's rank 1 normalised O^T, read from ``out`` in the
        accumulator's layout (``cols``: the rows' offsets; a chunk past the latent repeats one)."""
        i = gl.arange(0, _TILE, layout=gl.SliceLayout(1, acc_layout)) + (c % VCH) * 64
        return gl.load(out_ptr + cols + gl.expand_dims(i, 1), mask=ok, other=0.0)

    @gluon.jit
    def _fold(o, c: gl.constexpr, a, w, part, VCH: gl.constexpr):
        """Latent chunk ``c`` of rank 0's O^T scaled by ``a``, plus rank 1's ``part`` times ``w``."""
        if c < VCH:
            o = o * a + part.to(gl.float32) * w
        return o

    @gluon.jit
    def _merge_pair(out_ptr, lse_ptr, m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7, r_c, t_c, q_start, q_block_start,
                    q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS: gl.constexpr,
                    BLOCK_Q: gl.constexpr, VCH: gl.constexpr, acc_layout: gl.constexpr):
        """A fold's rank 0 state ``(m, l, O^T)`` merged with rank 1's, which ``out`` (normalised O)
        and ``lse`` (log2) hold for the block's rows: ``(m, l, O^T)`` of both halves' keys."""
        row_ok = (t_c < BLOCK_Q) & (q_block_start + t_c < q_len)
        tok_c = (q_start + q_block_start + t_c).to(gl.int64)
        lse1 = gl.load(lse_ptr + tok_c * stride_lse_tok + (r_c % HEADS) * stride_lse_head, mask=row_ok,
                       other=float("-inf"))
        cols = gl.expand_dims(tok_c * stride_o_tok + (r_c % HEADS) * stride_o_head, 0)
        ok = gl.expand_dims(row_ok, 0)
        # every load issued before any is used (in probe_cluster.py's fold, each chunk's load beside
        # its use compiled to as many sm_90 instructions: the compiler hoists them either way)
        p0 = _part(0, out_ptr, cols, ok, VCH, acc_layout)
        p1 = _part(1, out_ptr, cols, ok, VCH, acc_layout)
        p2 = _part(2, out_ptr, cols, ok, VCH, acc_layout)
        p3 = _part(3, out_ptr, cols, ok, VCH, acc_layout)
        p4 = _part(4, out_ptr, cols, ok, VCH, acc_layout)
        p5 = _part(5, out_ptr, cols, ok, VCH, acc_layout)
        p6 = _part(6, out_ptr, cols, ok, VCH, acc_layout)
        p7 = _part(7, out_ptr, cols, ok, VCH, acc_layout)
        m_new = gl.maximum(m_i, lse1)
        m_ref = _finite(m_new)
        a = gl.exp2(m_i - m_ref)
        w = gl.exp2(lse1 - m_ref)  # rank 1's l, scaled
        l_new = l_i * a + w
        a = gl.expand_dims(a, 0)
        w = gl.expand_dims(w, 0)
        return (m_new, l_new, _fold(o0, 0, a, w, p0, VCH), _fold(o1, 1, a, w, p1, VCH), _fold(o2, 2, a, w, p2, VCH),
                _fold(o3, 3, a, w, p3, VCH), _fold(o4, 4, a, w, p4, VCH), _fold(o5, 5, a, w, p5, VCH),
                _fold(o6, 6, a, w, p6, VCH), _fold(o7, 7, a, w, p7, VCH))

    @gluon.jit
    def _program(pid_q, split, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, num_tokens, num_seqs, max_blocks,
                 split_tokens, stride_bt_seq, stride_sl, stride_qsl, BLOCK_Q: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                 CAUSAL: gl.constexpr):
        """What program ``(pid_q, split)`` covers (grid as ``grid_blocks``): ``(seq, q_start,
        q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip)`` -- its
        sequence, the sequence's first token, the program's first token within it, the sequence's
        query length, its keys before the first query token, the keys ``[key_lo, kv_end)`` it
        attends to in ``n_tiles`` tiles, the sequence's pages and block-table row, and whether it
        has no query block (``BLOCK_Q`` > 1: numbers past its sequence's blocks; it exits)."""
        # the program's sequence and its first token (q_block_start, within the sequence)
        if BLOCK_Q == 1:  # token pid_q
            seq = _token_sequence(pid_q, query_start_loc_ptr, stride_qsl, num_seqs)
            q_start = gl.load(query_start_loc_ptr + seq * stride_qsl)
            q_end = gl.load(query_start_loc_ptr + (seq + 1) * stride_qsl)
            # padding tokens past query_start_loc[-1]: no keys (0 and -inf)
            seq_len = gl.where(pid_q < q_end, gl.load(seq_lens_ptr + seq * stride_sl), 0)
            q_end = gl.maximum(q_end, pid_q + 1)
        else:  # the query blocks of paged_attention._attention_kernel
            lo = pid_q * 0
            hi = num_seqs + 1
            while lo < hi:
                mid = (lo + hi) // 2
                below = gl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
                lo = gl.where(below, mid + 1, lo)
                hi = gl.where(below, hi, mid)
            seq = gl.maximum(lo - 1, 0)
            is_seq = seq < num_seqs  # else the padding rows' pseudo-sequence: no keys
            q_start = gl.load(query_start_loc_ptr + seq * stride_qsl)
            q_end = gl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=is_seq, other=0)
            q_end = gl.where(is_seq, q_end, num_tokens)
            seq_len = gl.load(seq_lens_ptr + seq * stride_sl, mask=is_seq, other=0)
        q_len = q_end - q_start
        q_block_start = pid_q - q_start
        skip = False
        if BLOCK_Q > 1:
            q_block_start = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q
            skip = (q_block_start < 0) | (q_block_start >= q_len)
        context = seq_len - q_len
        p_last = context + gl.minimum(q_block_start + BLOCK_Q, q_len) - 1
        kv_hi = gl.minimum(seq_len, max_blocks * BLOCK_SIZE)
        if CAUSAL:
            kv_hi = gl.minimum(kv_hi, p_last + 1)
        key_lo = split * split_tokens  # a multiple of the tile
        kv_end = gl.maximum(gl.minimum(kv_hi, key_lo + split_tokens), key_lo)
        n_tiles = (kv_end - key_lo + _TILE - 1) // _TILE
        num_pages = gl.minimum((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE, max_blocks)
        seq_row_ptr = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        return seq, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip

    @gluon.jit
    def _pv(o, ops, stage, c: gl.constexpr, p_smem, VCH: gl.constexpr):
        """Issue ``O^T[c] += V^T[c] P^T`` for latent chunk ``c`` (when the latent has it) from
        ``stage`` of the chunk buffers ``ops``."""
        if c < VCH:
            o = warpgroup_mma(ops[c].index(stage).permute((1, 0)), p_smem, o, is_async=True)
        return o

    @gluon.jit
    def _empty_state(ROWS: gl.constexpr, acc_layout: gl.constexpr):
        """A program's state before its first key: ``(m, l, O^T's eight [64, ROWS] blocks)``."""
        o = gl.zeros([_TILE, ROWS], gl.float32, acc_layout)
        col: gl.constexpr = gl.SliceLayout(0, acc_layout)
        return gl.full([ROWS], float("-inf"), gl.float32, col), gl.zeros([ROWS], gl.float32, col), o, o, o, o, o, o, o, o

    @gluon.jit
    def _values(o0, o1, o2, o3, o4, o5, o6, o7, ops, stage, p_smem, VCH: gl.constexpr):
        """``O^T += V^T P^T`` over the latent chunks of the tile in ``stage`` of the chunk
        buffers ``ops`` (one wgmma group per 64 columns), waited for."""
        o0 = _pv(o0, ops, stage, 0, p_smem, VCH)
        o1 = _pv(o1, ops, stage, 1, p_smem, VCH)
        o2 = _pv(o2, ops, stage, 2, p_smem, VCH)
        o3 = _pv(o3, ops, stage, 3, p_smem, VCH)
        o4 = _pv(o4, ops, stage, 4, p_smem, VCH)
        o5 = _pv(o5, ops, stage, 5, p_smem, VCH)
        o6 = _pv(o6, ops, stage, 6, p_smem, VCH)
        o7 = _pv(o7, ops, stage, 7, p_smem, VCH)
        return warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3, o4, o5, o6, o7))

    @gluon.jit
    def _softmax_scaled(s, visible, m_i, qk_scale):
        """One tile of the online softmax down the columns of ``S^T`` with the scores scaled before
        the mask (an fp8 cache: a NaN or zero scale then leaves masked keys at -inf): ``(P^T,
        alpha, m_new)``."""
        s = gl.where(visible, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        m_ref = _finite(m_new)
        return gl.exp2(s - gl.expand_dims(m_ref, 0)), gl.exp2(m_i - m_ref), m_new

    @gluon.jit
    def _store(out_ptr, o, c: gl.constexpr, inv_l, o_cols, o_ok, VCH: gl.constexpr, layout: gl.constexpr):
        """Latent chunk ``c`` of O^T (64 columns x the rows), divided by l, to ``out`` through
        ``layout`` (each thread 4 consecutive columns of one row: 16-byte stores of float32
        partials, where the accumulator's layout spreads a row's columns over 8 lanes)."""
        if c < VCH:
            v = gl.convert_layout((o * inv_l).to(out_ptr.dtype.element_ty), layout)
            i = gl.arange(0, _TILE, layout=gl.SliceLayout(1, layout)) + c * 64
            gl.store(out_ptr + o_cols + gl.expand_dims(i, 1), v, mask=o_ok)

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _mla_narrow_kernel(
        q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
        kv_desc,  # TMA descriptor of the cache as [NB * BS, L + R], boxes [BOX, 64]
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, H, L] or partials [T, S, H, L] (the query's dtype); [T, H] or [T, S, H] float32
        kv_scale_ptr,  # [] or [1] float32 (an fp8 cache)
        scale,
        num_tokens, num_seqs, num_blocks, max_blocks, split_tokens,
        block_rows,  # rows of the cache's [rows, L + R] view from one block to the next (_sm90.block_rows)
        stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_bt_seq, stride_bt_block,
        stride_sl, stride_qsl, stride_o_tok, stride_o_split, stride_o_head,
        stride_lse_tok, stride_lse_split, stride_lse_head,
        HEADS: gl.constexpr, BLOCK_Q: gl.constexpr, ROWS: gl.constexpr,
        LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, USE_PDL: gl.constexpr,
        WARPS: gl.constexpr, STAGES: gl.constexpr, FOLD: gl.constexpr,
    ):
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        VCH: gl.constexpr = LATENT // 64
        # an fp8 cache: each stage converted to fp16 in shared memory once it lands, the products in
        # fp16 (the queries scaled into its range), the scale in the scores and the output
        IS_FP8: gl.constexpr = kv_desc.dtype.primitive_bitwidth == 8
        dtype: gl.constexpr = gl.float16 if IS_FP8 else q_latent_ptr.dtype.element_ty
        # WARPS / 4 warpgroups, each the same 64 keys and its own ROWS * 4 / WARPS of the rows
        WG: gl.constexpr = WARPS // 4
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                             instr_shape=[16, ROWS // WG, 16])
        col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)  # [ROWS]: one query row each
        key_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)  # [64]: the tile's keys
        if USE_PDL:  # launched with programmatic dependent launch: nothing is read before this
            _wait_prerequisites()
        if FOLD:  # a pair of CTAs a query block (_cluster): CTA 2k + r is rank r of block k
            pid_q = gl.program_id(0) // 2
        else:
            pid_q = gl.program_id(0)
        split = gl.program_id(2)
        out_ptr += split.to(gl.int64) * stride_o_split
        lse_ptr += split.to(gl.int64) * stride_lse_split

        seq, q_start, q_block_start, q_len, context, key_lo, kv_end, n_tiles, num_pages, seq_row_ptr, skip = _program(
            pid_q, split, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, num_tokens, num_seqs, max_blocks,
            split_tokens, stride_bt_seq, stride_sl, stride_qsl, BLOCK_Q, BLOCK_SIZE, CAUSAL)
        if skip:
            return
        if FOLD:
            # rank 0 the first half of the tiles, rank 1 the rest; rank 0 alone all of them where
            # the binary was not rewritten into pairs (_cluster)
            paired = cluster_pair(pid_q)
            rank = gl.program_id(0) % 2
            if (rank == 1) & (paired == 0):
                return
            half = gl.where(paired != 0, (n_tiles + 1) // 2, n_tiles)
            key_lo = key_lo + rank * half * _TILE
            n_tiles = gl.where(rank == 0, half, n_tiles - half)

        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        P_SWIZZLE: gl.constexpr = ROWS * 2 if ROWS * 2 <= 128 else 128
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=P_SWIZZLE, element_bitwidth=16, rank=2)
        kv_dtype: gl.constexpr = kv_desc.dtype
        kv_layout: gl.constexpr = kv_desc.layout
        kvs = _rings9(CHUNKS, STAGES, _TILE, kv_dtype, kv_layout)
        if IS_FP8:  # the fp16 operand tile
            cvs = _rings9(CHUNKS, 1, _TILE, dtype, q_layout)
        qs = _rings9(CHUNKS, 1, ROWS, dtype, q_layout)
        p_smem = gl.allocate_shared_memory(dtype, [_TILE, ROWS], p_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        if FOLD:  # rank 1's arrival: its state is in out and lse
            done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            mbarrier.init(done.index(0), count=1)
        fence_async_shared()
        # -- Q [ROWS, L + R] into shared memory: row r is token r // HEADS, head r % HEADS; its loads
        # go out before the first tiles' copies or after them (_QUERIES_FIRST) --
        if ROWS <= _QUERIES_FIRST:
            chunks = _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_block_start, q_len, stride_ql_tok,
                                   stride_ql_head, stride_qr_tok, stride_qr_head, HEADS, BLOCK_Q, ROWS, CHUNKS, WARPS)
        for i in gl.static_range(STAGES):
            if n_tiles > i:
                _issue(kv_desc, kvs, ready, i, key_lo + i * _TILE, seq_row_ptr, stride_bt_block, num_pages,
                       num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
        if ROWS > _QUERIES_FIRST:
            chunks = _query_chunks(q_latent_ptr, q_rope_ptr, q_start, q_block_start, q_len, stride_ql_tok,
                                   stride_ql_head, stride_qr_tok, stride_qr_head, HEADS, BLOCK_Q, ROWS, CHUNKS, WARPS)
        qk_scale = scale * _LOG2E
        if IS_FP8:
            kv_scale = gl.load(kv_scale_ptr)
            qk_scale = qk_scale * kv_scale
            q_unit = 1.0
            if q_latent_ptr.dtype.element_ty == gl.bfloat16:
                q_unit = _query_unit(chunks, CHUNKS)
                qk_scale = qk_scale * q_unit
        for c in gl.static_range(CHUNKS):
            q = chunks[c]
            if IS_FP8:
                q = (q.to(gl.float32) / q_unit).to(dtype)
            qs[c].index(0).store(q)
        fence_async_shared()
        thread_barrier()
        if FOLD:  # (after the queries' loads: rank 1 writes its state where out may be the queries)
            cluster_sync(pid_q)

        # -- the query rows as the products' columns --
        r_c = gl.arange(0, ROWS, layout=col_layout)
        t_c = r_c // HEADS
        pos_c = context + q_block_start + t_c  # each row's position (causal: keys <= pos)
        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(ROWS, acc_layout)
        for j in range(n_tiles):
            st = j % STAGES
            key0 = key_lo + j * _TILE
            # keys past kv_end or on pages with an id outside [0, NB): their block ids are loaded
            # before the tile is waited for (an L2 round trip otherwise between scores and softmax)
            keys = key0 + gl.arange(0, _TILE, layout=key_layout)
            blk = _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
            # and the block id of tile j + STAGES, which this stage takes next
            blk2 = _tile_block(key0 + STAGES * _TILE, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE, BOX)
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            if IS_FP8:  # the stage to fp16, then free for tile j + STAGES at once
                ops = cvs
                # 0, but not to the compiler (as mla_sm90's loops): with a constant base every wgmma
                # descriptor of the buffer is loop-invariant, and the 26 hoisted descriptors spilled
                # (255 registers, a 200-byte stack; 204 and none so, sm_90 SASS)
                obase = j >> 30
                _convert(kvs, st, cvs, kv_end - key0, CHUNKS, WARPS)
                fence_async_shared()
                thread_barrier()
                if j + STAGES < n_tiles:
                    _refill(kv_desc, kvs, ready, st, key0 + STAGES * _TILE, blk2, seq_row_ptr, stride_bt_block,
                            num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)
            else:
                ops = kvs
                obase = st
            # S^T = K Q^T over the 576 columns: [64 keys, ROWS]
            s = gl.zeros([_TILE, ROWS], gl.float32, acc_layout)
            for c in gl.static_range(CHUNKS):
                s = warpgroup_mma(ops[c].index(obase), qs[c].index(0).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            # masked: those keys, and (causal) keys after a row's position
            visible = gl.expand_dims((blk >= 0) & (blk < num_blocks) & (keys < kv_end), 1)
            if CAUSAL and BLOCK_Q > 1:
                visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(pos_c, 0))
            if IS_FP8:
                p, alpha, m_new = _softmax_scaled(s, visible, m_i, qk_scale)
            else:
                s = gl.where(visible, s, float("-inf"))
                # online softmax down the columns
                m_new = gl.maximum(m_i, gl.max(s, 0) * qk_scale)
                m_ref = _finite(m_new)
                alpha = gl.exp2(m_i - m_ref)
                p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref, 0))
            l_i = l_i * alpha + gl.sum(p, 0)
            m_i = m_new
            a = gl.expand_dims(alpha, 0)
            o0, o1, o2, o3, o4, o5, o6, o7 = o0 * a, o1 * a, o2 * a, o3 * a, o4 * a, o5 * a, o6 * a, o7 * a
            if not IS_FP8:  # (the conversion zeroed them)
                _zero_rows(kvs, st, kv_end - key0, VCH, WARPS)
            p_smem.store(p.to(dtype))
            fence_async_shared()
            thread_barrier()
            # O^T += V^T P^T, one wgmma group per 64 latent columns
            o0, o1, o2, o3, o4, o5, o6, o7 = _values(o0, o1, o2, o3, o4, o5, o6, o7, ops, obase, p_smem, VCH)
            # tile j's products are done: its stage takes tile j + 2 (Triton's barrier analysis
            # puts a CTA barrier before the copies: every warp's products have read the stage)
            if not IS_FP8:
                if j + STAGES < n_tiles:
                    _refill(kv_desc, kvs, ready, st, key0 + STAGES * _TILE, blk2, seq_row_ptr, stride_bt_block,
                            num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX)

        if USE_PDL:  # the key loop is done: the kernel after it (a split call's combine) may launch
            _signal_dependents()

        # -- a fold: rank 1's state to out / lse (log2), then rank 0's arrival; rank 0 merges it --
        if FOLD:
            if rank == 1:
                _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, 1.0, r_c, t_c, q_start,
                       q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS,
                       BLOCK_Q, ROWS, VCH, False, True, 1.0, WARPS)
                cluster_fence(pid_q)
                thread_barrier()
                mbarrier.arrive(done.index(0))  # rank 0's barrier (_cluster.rewrite)
                return
            if paired != 0:
                mbarrier.wait(done.index(0), 0)
                cluster_fence(pid_q)
                m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _merge_pair(
                    out_ptr, lse_ptr, m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7, r_c, t_c, q_start, q_block_start,
                    q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, VCH,
                    acc_layout)
                thread_barrier()  # every thread has read rank 1's rows before any is overwritten

        # -- epilogue: O / l and lse = (m + log2 l) * LSE_UNIT, row r to (token, head) --
        if IS_FP8:
            out_scale = kv_scale
        else:
            out_scale = 1.0
        _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, out_scale, r_c, t_c, q_start, q_block_start,
               q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, ROWS, VCH,
               IS_FP8 and LSE_UNIT != 1.0, HAS_LSE, LSE_UNIT, WARPS)

def grid_blocks(num_tokens: int, num_seqs: int, block_q: int, fold: bool = False) -> int:
    """Programs along grid axis 0 (query blocks): one a token for ``block_q`` 1, else
    ``_attention_kernel``'s numbering (``T // block_q + B + 1``); two a block for ``fold``."""
    blocks = num_tokens if block_q == 1 else num_tokens // block_q + num_seqs + 1
    return 2 * blocks if fold else blocks


def constants(num_heads: int, block_q: int, pdl: bool, latent: int, fp8: bool, fold: bool = False) -> dict:
    """This kernel's own launch constants (``mla_sm90._launcher`` gives the rest, as to the wide
    kernel) for ``block_q`` query tokens a program; ``pdl``: launched with programmatic dependent
    launch (``paged_attention.pdl_options``: the kernel's first instruction waits for the kernels
    ahead of it, and it signals after its key loop); ``fp8``: an fp8 cache; ``fold``: a pair of
    CTAs a query block (bf16/fp16 caches, checked by ``mla_sm90._launcher``; the grid of
    ``grid_blocks(..., fold=True)``)."""
    n = rows(num_heads, block_q)
    return dict(HEADS=num_heads, BLOCK_Q=block_q, ROWS=n, WARPS=num_warps(n), STAGES=stages(n, latent, fp8),
                FOLD=fold, num_warps=num_warps(n), **pdl_options(pdl))
