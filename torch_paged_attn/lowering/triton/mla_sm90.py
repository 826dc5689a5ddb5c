"""MLA decode on Hopper (sm_90) in Gluon for 64-head groups: the latent tile loaded once by TMA,
both wgmma products split between two warpgroups without doing either twice, tiles taken in pairs
so that one warpgroup's softmax runs beside the other's products, split-KV for small batches.

Computes what ``mla._mla_kernel`` computes (absorbed MLA decode: every head attends to the rows
``[c | k_pe]`` of a paged latent cache, the latent ``c`` is the value too) for the calls it takes
(``declines`` says which): bf16/fp16 queries and cache, latent 512 and rope 64 (latent 128 or
256 too: half the latent is one wgmma's N, a power of two), 64 heads a program (``H`` a multiple
of 64), block sizes that are powers of two >= 8, a contiguous cache, no fp8;
``mla.prepare_mla_decode`` also keeps it off batch-invariant mode and tables under
``mla._GLUON_MIN_KEYS`` keys, and plans its splits.

Schedule (FlashMLA's "seesaw"): the [64, 512] float32 output does not fit one warpgroup beside
the scores, so the left warpgroup holds output columns ``[0, L / 2)`` and the right one ``[L / 2,
L)``. The 64-key tiles go in pairs: the left one computes ``S_0 = Q K_0^T`` of tile 2i, the right
one ``S_1`` of tile 2i + 1 (each N = 64 over all 576 columns, Q from shared memory), and with one
running max ``m`` shared through shared memory:

- left: ``m_0 = max(m, rowmax S_0)`` published;
- right: ``m_1 = max(m_0, rowmax S_1)`` published, ``P_1 = exp(S_1 - m_1)`` into shared memory,
  ``O_R = O_R exp(m - m_1) + P_1 V_1R``;
- left, once ``m_1`` is published: ``P_0 = exp(S_0 - m_1)`` into shared memory (tile 2i's rope
  chunk, which only its scores read), ``O_L = O_L exp(m - m_1) + P_0 V_0L`` (P_0 from registers),
  then ``O_L += P_1 V_1L``; right: ``O_R += P_0 V_0R``.

Each warpgroup keeps its own partial row sum (the left ``l exp(m - m_1) + sum P_0``, the right ``l
exp(m - m_1) + sum P_1``), added at the end. A producer warp issues the TMA copies (one box of
``min(BS, 64)`` rows x 64 columns a copy; a block id outside ``[0, NB)`` or a page past the
sequence reads zeros from past the cache's last row); at two or more head groups it first asks
L2 for the pair's two pages, one bulk prefetch a tile (``PREFETCH_MIN_GROUPS``). Tile 2i lives in
stage 0 and 2i + 1 in stage 1; each stage has three chunk groups (left value chunks, right value
chunks, rope) with a ready and an empty barrier each, and a group is refilled for the next pair as soon as its last
reader is done with it, in that order: stage 1's rope (after the right's scores), stage 1's right
chunks (after ``P_1 V_1R``), stage 0's left chunks (after ``P_0 V_0L``), stage 0's right chunks
and rope (after ``P_0 V_0R``), stage 1's left chunks (after ``P_1 V_1L``); each warpgroup's scores
take its tile's chunks in the order they arrive. A pair's odd tile past the last key (an odd
number of tiles) is masked out like any key past the end.

H100, B64 x 4096 H128, CUDA-graph replays (benchmarks/results/gpu-2026-11-24d/): 152.6 us (479
TFLOP/s) against 170.1 for the kernel before it (one tile at a time, each warpgroup the scores of
32 keys, N = 32 wgmmas bound by shared-memory bandwidth). Nsight Compute of this kernel: the
consumers' largest waits are for the two groups freed last in a pair (stage 0's right chunks,
freed by the right's ``P_0 V_0R``, which the left's next scores need; stage 1's left chunks,
freed by the left's ``P_1 V_1L``, which the right's need): 12 % of their warp samples, with 216
KiB of the 227 in two stages and Q, no room for a third. One barrier per 64-column chunk (158.2
us) and the consumers issuing the copies themselves without a producer warp (155.6) measured no
better; the stage indices are computed from the loop counter (``i >> 30``, always 0) so that the
compiler forms the wgmma descriptors where they are used instead of hoisting 30 of them out of the
loop and spilling them (393 spill instructions otherwise). Q lives in one shared-memory allocation
a 64-column chunk (``_rings9``): in one buffer, Triton's barrier analysis put a warpgroup barrier
between the chunks' stores, and the prologue issued its query loads eight, then four at a time
with barriers between (sm_90 SASS); now all of a warpgroup's query loads (16 a thread in the right
one, which stores four chunks; 20 in the left, five), then its stores, then one barrier. H100,
graph replays, against the kernel before it (results/gpu-2026-11-26e/logs/probe.txt): B1 x 32768
H128 43.0-43.4 -> 41.7 us (each split program covers eight tiles, four pairs, so its
prologue weighs), B64 x 4096 H128 152.7-153.5 -> 152.0 (a second round 159.2: the spread of that
run). Each tile's page is looked up before the wait that needs it: the producer's (a one-page
chunk group's row) before the group's ``empty`` wait, and the consumers' at block sizes >= 64 as
the tile's one block id, loaded before the scores are waited for (``_page_ok``), where each
warpgroup loaded all 64 keys' ids between the scores and the softmax. H100, graph replays in one
process against the kernel before it, three rounds, the clocks falling through the run
(results/gpu-2026-11-26h/logs/probe-page.txt): B64 x 4096 H128 141.0 / 142.9 / 146.6 against
151.2 / 160.1 / 164.1 us, B8 x 8192 H128 54.3-54.6 against 56.7-57.1, B1 x 32768 H128 38.4-38.6
against 39.6-39.9; block size 16 (unchanged path) and mla_sm90_pair at block 64 (its producer
uses ``_load``) within the rounds' spread.

The left warpgroup waits for ``m_1`` before its softmax, so that P_0 is relative to the max the
right one multiplies it by and O_L is rescaled once a pair (it computed P_0 against ``m_0``,
rescaled O_L by ``s_0`` before ``P_0 V_0L`` and by ``s_1`` after, and stored ``P_0 s_1``): H100,
graph replays in one process, six rounds over two runs against the kernel before it
(results/gpu-2026-11-27/logs/probe-rescale*.txt): B1 x 32768 H128 37.4-38.1 against 38.4-38.9 us,
B8 x 8192 H128 53.9-55.3 against 54.0-55.9, block size 16 161.4-171.2 against 163.2-171.7, B64 x
4096 H128 138.0-148.6 against 140.4-149.0 (the same within the rounds' spread); sm_90 SASS 432
lines shorter, without the ten spill stores of the prologue. Issuing ``P_1 V_1L`` behind ``P_0
V_0L`` without a wait between (B64 x 4096 H128 149.8-155.5) and each warpgroup taking its two value
products in the other order (the group freed last in a stage then freed by the warpgroup whose next
scores take it last; 143.1-150.9) measured slower. The producer loads stage 1's right chunks before
stage 0's left ones: the left warpgroup's ``P_0 V_0L`` now waits for the right one's max, so the
right one frees its chunks first, and in the old order the producer sat at the left chunks' wait
while the right's next scores waited for theirs. H100, graph replays, six rounds in one process
(logs/probe-rescale-4.txt): B64 x 4096 H128 137.3-146.1 against 140.0-151.5 us, faster in each
round (in probe-rescale-3.txt's three rounds 144.0-146.3 against 139.3-152.8), B8 x 8192 H128
53.9-54.9 against 54.0-54.7; Nsight Compute, one launch at its locked clocks: 158.3 us against
164.8 (logs/ncu-wide-one_prod-*, ncu-wide-one-*), the tensor pipe active 63.6 % of the cycles
against 61.1; the right warpgroup waits for tile data 19.5 % of its samples (13.6 % for stage 1's
left chunks, freed last, by the left's ``P_1 V_1L``), the left one 5.6 %. The right warpgroup
rescales its output and its sum by the same one exp2 (``exp2(m - m_1)``; it multiplied
``exp2(m - m_0)`` by ``exp2(m_0 - m_1)``): sm_90 SASS 16 lines and two ``MUFU.EX2`` shorter; H100,
graph replays in one process against the kernel before, twelve rounds over two runs
(results/gpu-2026-11-27b/logs/probe-right*.txt): B8 x 8192 H128 53.4-55.7 against 53.9-54.4 us
(faster in 10 of 12), B64 x 4096 H128 138.1-149.8 against 143.9-149.9 (within the rounds'
spread); six rounds: B1 x 32768 H128 37.9-38.2 against 38.0-38.2. Each value product is one
wgmma of N = L / 2 (``_values``: a warpgroup's output one [64, L / 2] accumulator, its value chunks,
which lie side by side, ``_slot``, read as one operand), where it was four of N = 64, each reading P
again: sm_90 SASS 88 wgmmas against 136, the loop 519 instructions against 589. H100,
graph replays in one process against the kernel before, five rounds (results/gpu-2026-11-27m/
logs/call2/probe-n256.txt): block size 16, B64 x 4096 H128 148.5-150.8 against 164.7-174.7 us;
block size 64 within the rounds' spread (B64 x 4096 H128 135.3-144.8 against 136.1-146.2, B1 x
32768 37.9-38.3 against 37.9-38.2), B8 x 8192 53.9-54.4 against 53.5-53.9. With the grid's head
groups first at block sizes >= 64 too (``HEADS_FIRST``), against main 66aefd2's kernel, five rounds on
another machine (logs/call3/probe-final.txt): B64 x 4096 H128 135.2-139.1 against 136.3-144.5 us,
block size 16 149.1-153.9 against 162.2-176.1, block size 32 (B32 x 4096) 92.0-94.4 against
93.1-94.9; B8 x 8192 54.4-55.0 against 53.2-53.9 (2 % slower; not profiled), B1 x 32768 and B32 x
4096 H64 within 0.4. The same with the chunk order of ``_slot`` (call 18, a third machine): B64 x
4096 H128 134.6-141.1 against 145.0-160.0, block size 16 150.1-161.0 against 158.2-170.9, block size
32 92.6-93.5 against 93.6-94.2, B8 x 8192 53.8-54.5 against 53.1-53.6, B32 x 4096 H64 77.1-77.4
against 76.8-77.0, B1 x 32768 within 0.4.

Split-KV (``launch`` with 4-D ``out``): program (token, head group, split) covers keys
``[split * split_tokens, +split_tokens)`` (a multiple of the tile; ``mla`` plans multiples of a
pair, ``SPLIT_KEYS``) and writes the normalised partial output and its log2 LSE (0 and -inf for
no keys) for ``mla``'s combine kernel.

Layouts: q_latent/out ``[T, H, L]``, q_rope ``[T, H, R]`` (any strides, last one 1), kv_cache
``[NB, BS, L + R]`` contiguous (a 2-D ``[NB * BS, L + R]`` TMA view); partials ``[T, S, H, L]``
and ``[T, S, H]`` float32. Grid: (token x head group, 1, split) at block sizes >= 64, the head
groups of a token side by side (``HEADS_FIRST``), else (token, head group, split); one program an
item. Shared memory: Q ``64 x (L + R) x 2`` + ``2 x 64 x (L + R) x 2`` + P_1 ``64 x 64 x 2``
bytes (216 KiB + 8 KiB at 576 columns): one program an SM; the two stages' [64, 64] chunks lie in
this order: stage 0's latent chunks, stage 1's, then both rope chunks (``_slot``). Bytes moved:
``sum_t seq_len_t * G * (L + R) * cache_bytes`` (G head groups; the second group's reads mostly
from L2; the L2 prefetch asks for the same pages earlier, its DRAM bytes not measured) + ``T * H *
(2L + R) * q_bytes`` (+ ``T * S * H * (L + 1) * 8`` for the partials, written and read once).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _sm90
from ._launch import launcher, same_as
from .paged_attention import _FP8

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
    )

    from ._sm90 import tma_load
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
TILE_N = 64  # keys a tile (one warpgroup's scores)
HEADS = 64  # rows a program
SPLIT_KEYS = 2 * TILE_N  # splits at multiples of a pair of tiles (a split's last pair is then whole)
NUM_WARPS = 4  # the left warpgroup; the right one and the producer warp are added
# The right warpgroup's registers (the left one gets 256). H100, B64 x 4096 H128, CUDA-graph
# replays: 156.6 us at 224, 156.7 at 240 (gpu-2026-11-24d/logs/seesaw-probe-v1.txt); sm_90 SASS
# (Triton 3.6): no spill in the right one's loop at 224, one spill pair in the left one's tail
# zeroing branch. With one value wgmma a product (B64 x 4096 H128, four rounds,
# gpu-2026-11-27m/logs/call13): 135.4-139.0 at 224, 135.8-141.8 at 240, 135.9-142.5 at 208 (a
# spill pair there); B8 x 8192 54.5-55.0 at each.
REGS_CONSUMER = 224
REGS_PRODUCER = 24
# Pages of a whole tile or more (block sizes >= 64): the grid puts a token's head groups next to
# each other (axis 0 is token * groups + group), so that the programs reading the same pages start
# together and their copies of each page meet in L2 at about the same time; block sizes under 64
# keep the head groups on axis 1 (``num_tokens`` programs apart), where the second reader of a page
# finds it already in L2. H100, CUDA-graph replays, us, heads first / tokens first
# (benchmarks/results/gpu-2026-11-27m/logs/call1 and call2, 4-5 rounds, alternated): B64 x 4096 H128
# 134.9-140.1 / 136.1-146.2 (call 2; call 1: 135.2-136.6 with one round of 148.7 / 136.2-137.5),
# B66 x 4096 139.9-144.7 / 144.0-149.0, B60 132.9-138.1 / 136.1-137.4; B1 x 32768 and B8 x 8192 within
# 0.3; block size 16 (call 2, with the single value wgmma) 150.6-162.9 / 148.5-150.8. Nsight Compute,
# 8 launches each at B64 x 4096 (call 1): 310 MB read from DRAM either way (one read of the cache),
# the L2 hit rate of reads 0.5 % heads first (both readers miss together) against 35.7 %.
HEADS_FIRST = True
# Where the heads make at least this many 64-head groups (the programs of a token's groups reading
# the same pages) and pages hold whole tiles, the producer asks L2 for a pair's two pages (one bulk
# prefetch a tile, ``_prefetch``) before it loads the pair's chunk groups: the groups it loads last,
# each once the consumers free its buffer, then find their tile in L2. H100, CUDA-graph replays,
# us, with / without (benchmarks/results/gpu-2026-11-28/logs/call2-call4, three rounds each, two
# machines): B64 x 4096 H128 131.2-133.5 / 134.4-141.0 (call 4), 131.4-136.6 / 134.4-146.9 (calls
# 2-3), B8 x 8192 H128 51.7-52.7 / 53.6-55.1, B1 x 32768 H128 35.3-36.1 / 37.9-38.5, B16 x 4096 H256
# 76.7-78.4 / 79.1-80.1; one group, B32 x 4096 H64, 78.9-80.2 / 75.8-76.6 (hence the bound). Measured
# and not kept (the variants in that folder's mla_sm90_variants.py): the pages of the pair one or two
# pairs ahead (B64 x 4096 H128 149-154 and, with PDL, 195-199 against 135-138, call 1), each group's program
# one tile of the pair (between the two: 132.4-140.7, H64 76.8-77.2), the segments of the groups
# loaded last by ``prefetch.global.L2`` from the producer warp's lanes (139.4-150.2), and the wide
# kernel launched with programmatic dependent launch (with the prefetch 138.4-142.4 against
# 131.5-136.6, call 3). As landed, against no prefetch (call 8): B64 x 4096 H128 131.3-131.6 / 135.3-136.5.
PREFETCH_MIN_GROUPS = 2


def declines(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor) -> str | None:
    """Why this kernel does not take the call (None: it takes it). Static facts only."""
    latent, rope = q_latent.shape[2], q_rope.shape[2]
    if latent not in (128, 256, 512) or rope != 64:
        shape = "latent 128, 256 or 512 (half of it one wgmma's N: a power of two), rope 64"
    else:
        shape = "heads: a multiple of 64" if q_latent.shape[1] % HEADS else None
    return gluon_mla_declines(q_latent, q_rope, kv_cache, False, shape)


def gluon_mla_declines(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, fp8: bool, shape: str | None) -> str | None:
    """What every Gluon MLA kernel asks of a call, in this order: a device and Triton it runs on,
    bf16/fp16 queries over a cache of their dtype (or fp8 where ``fp8``), the kernel's own shape
    rules (``shape``: why they fail, None where they hold), a cache TMA reads
    (``_sm90.cache_declines``, strided views included) and queries with a contiguous last
    dimension. None: the kernel takes the call."""
    reason = _sm90.unavailable(q_latent)
    if reason:
        return reason
    caches = (q_latent.dtype, *_FP8) if fp8 else (q_latent.dtype,)
    if q_latent.dtype not in (torch.bfloat16, torch.float16) or q_rope.dtype != q_latent.dtype \
            or kv_cache.dtype not in caches:
        return "dtype: bf16/fp16 queries over a cache of their dtype" + (" or fp8" if fp8 else "")
    if shape:
        return shape
    reason = _sm90.cache_declines((kv_cache,), strided=True)
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
    # barrier index of a stage's chunk group: stage * 3 + group
    _A = gl.constexpr(0)  # the left value chunks (output columns [0, L / 2))
    _B = gl.constexpr(1)  # the right value chunks
    _R = gl.constexpr(2)  # the rope chunk (then, in stage 0, the left warpgroup's P for the right one)
    # a warpgroup's [64, 64] wgmma accumulators (scores and each 64-column block of O), their rows,
    # and P as the A operand of P @ V from registers
    _ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
    _ROW = gl.constexpr(gl.SliceLayout(1, _ACC))

    @gluon.jit
    def _ring(c: gl.constexpr, N: gl.constexpr, DEPTH: gl.constexpr, ROWS: gl.constexpr, dtype: gl.constexpr,
              layout: gl.constexpr):
        """Chunk ``c``'s buffer of ``DEPTH`` [ROWS, 64] tiles ([1, 8, 64], unused, for ``c >= N``)."""
        D: gl.constexpr = DEPTH if c < N else 1
        R: gl.constexpr = ROWS if c < N else 8
        return gl.allocate_shared_memory(dtype, [D, R, 64], layout)

    @gluon.jit
    def _rings8(N: gl.constexpr, DEPTH: gl.constexpr, ROWS: gl.constexpr, dtype: gl.constexpr, layout: gl.constexpr):
        """Eight chunk buffers (``_ring``), one allocation each: latent chunks."""
        return (_ring(0, N, DEPTH, ROWS, dtype, layout), _ring(1, N, DEPTH, ROWS, dtype, layout),
                _ring(2, N, DEPTH, ROWS, dtype, layout), _ring(3, N, DEPTH, ROWS, dtype, layout),
                _ring(4, N, DEPTH, ROWS, dtype, layout), _ring(5, N, DEPTH, ROWS, dtype, layout),
                _ring(6, N, DEPTH, ROWS, dtype, layout), _ring(7, N, DEPTH, ROWS, dtype, layout))

    @gluon.jit
    def _rings9(N: gl.constexpr, DEPTH: gl.constexpr, ROWS: gl.constexpr, dtype: gl.constexpr, layout: gl.constexpr):
        """Nine chunk buffers (``_ring``), one allocation each: the latent chunks (``_rings8``) and
        the rope one (chunk ``N - 1``). Why one allocation a chunk: Triton's barrier analysis tells
        shared memory apart by allocation only, so into one buffer every chunk's store waited at a
        barrier for the chunk before it (sm_90 SASS): eight barriers a tile in the fp8 conversion,
        and in the prologue each of the nine query chunks' global load issued only after the
        previous chunk's store and barrier (nine load latencies in a row)."""
        return _rings8(N, DEPTH, ROWS, dtype, layout) + (_ring(8, N, DEPTH, ROWS, dtype, layout), )

    @gluon.jit
    def _wait_prerequisites():
        """A kernel launched with programmatic dependent launch (``launch_pdl``): wait until the
        kernels ahead of it in the stream have finished and their writes are visible, before it
        reads anything (without the launch attribute the instruction returns at once)."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _signal_dependents():
        """The key loop is done: the kernel launched after this one with programmatic dependent
        launch (the combine kernel; ``paged_attention._PDL``) may start."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _token_sequence(tok, query_start_loc_ptr, stride_qsl, num_seqs):
        """The sequence of token ``tok``: the last ``b`` with ``query_start_loc[b] <= tok`` (the
        last sequence for a padding token past ``query_start_loc[-1]``)."""
        lo = tok * 0
        hi = num_seqs - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            below = gl.load(query_start_loc_ptr + mid * stride_qsl) <= tok
            lo = gl.where(below, mid, lo)
            hi = gl.where(below, hi, mid - 1)
        return lo

    @gluon.jit
    def _block_row(blk, key0, num_blocks, block_rows, BLOCK_SIZE: gl.constexpr):
        """The row of the cache's ``[rows, W]`` view (``_sm90.descriptor_spec``) holding key ``key0``
        of block ``blk``; past the view's last row (TMA reads zeros there) for an id outside ``[0,
        num_blocks)`` (-1: a page past the sequence)."""
        ok = (blk >= 0) & (blk < num_blocks)
        return gl.where(ok, blk * block_rows + key0 % BLOCK_SIZE, (num_blocks - 1) * block_rows + BLOCK_SIZE)

    @gluon.jit
    def _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE: gl.constexpr):
        """The block id of the page holding each of ``keys`` (a key or a vector of them) in the
        block-table row ``seq_row_ptr``; -1 for a page past the row's ``num_pages``."""
        page = keys // BLOCK_SIZE
        return gl.load(seq_row_ptr + page * stride_bt_block, mask=page < num_pages, other=-1)

    @gluon.jit
    def _page_row(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows, BLOCK_SIZE: gl.constexpr):
        """``_block_row`` of key ``key0`` of the sequence whose block-table row is ``seq_row_ptr``."""
        blk = _block_id(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
        return _block_row(blk, key0, num_blocks, block_rows, BLOCK_SIZE)

    @gluon.jit
    def _slot(stage, c: gl.constexpr, CHUNKS: gl.constexpr, ROPE_LAST: gl.constexpr):
        """The index of chunk ``c`` of ``stage`` in a two-stage ``[2 CHUNKS, rows, 64]`` buffer: the
        stages one after the other, or (``ROPE_LAST``) both stages' latent chunks first, then the
        two rope chunks, so that each stage's value halves are runs of whole slabs
        (``_wide_view``)."""
        if ROPE_LAST:
            if c == CHUNKS - 1:
                return 2 * (CHUNKS - 1) + stage
            else:
                return stage * (CHUNKS - 1) + c
        else:
            return stage * CHUNKS + c

    @gluon.jit
    def _load(kv_desc, kv_smem, ready, empty, slot: gl.constexpr, e, c0: gl.constexpr, n: gl.constexpr, key0,
              seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows, CHUNKS: gl.constexpr,
              BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, ROPE_LAST: gl.constexpr = False):
        """Once the consumers freed chunk group ``slot`` (``stage * 3 + group``; its ``empty``
        barrier, phase ``e``), its chunks ``[c0, c0 + n)`` of the 64-key tile from ``key0`` (placed
        as ``_slot`` says): one TMA box of ``BOX`` rows x 64 columns a page and chunk, completing on
        its ``ready`` barrier."""
        stage: gl.constexpr = slot // 3
        if BOX == _TILE:  # one page: its row looked up before the wait, off the refill's path
            row = _page_row(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows, BLOCK_SIZE)
        mbarrier.wait(empty.index(slot), e)
        bar = ready.index(slot)
        mbarrier.expect(bar, _TILE * 64 * 2 * n)
        for i in gl.static_range(_TILE // BOX):
            if BOX < _TILE:
                row = _page_row(key0 + i * BOX, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                                BLOCK_SIZE)
            for c in gl.static_range(n):
                tma_load(kv_desc, [row, (c0 + c) * 64], bar,
                         kv_smem.index(_slot(stage, c0 + c, CHUNKS, ROPE_LAST)).slice(i * BOX, BOX))

    @gluon.jit
    def _prefetch(kv_ptr, key0, kv_end, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                  CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr):
        """Ask L2 for the 64-key tile from ``key0`` (block sizes >= 64 and rows of ``CHUNKS * 64``
        elements one after another: the tile is one run of bytes) with one bulk prefetch, issued by
        one lane (the compiler makes it one uniform instruction a warp); nothing for a key at or
        past ``kv_end`` or a block id outside ``[0, num_blocks)``. A hint: no barrier, no result.
        Its size field counts 16-byte units in 16 bits (sm_90 SASS), which a tile's 72 KiB fits."""
        blk = _block_id(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
        ok = (blk >= 0) & (blk < num_blocks) & (key0 < kv_end)
        row = gl.where(ok, blk * block_rows + key0 % BLOCK_SIZE, 0)
        src = kv_ptr + row.to(gl.int64) * (CHUNKS * 64)
        size: gl.constexpr = _TILE * CHUNKS * 64 * kv_ptr.dtype.element_ty.primitive_bitwidth // 8
        gl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .b32 l; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; setp.ne.and.u32 q, $2, 0, p; "
            f"@q cp.async.bulk.prefetch.L2.global [$1], {size}; mov.u32 $0, 0; }}",
            "=r,l,r", [src, ok.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _producer(kv_desc, kv_ptr, kv_smem, ready, empty, key_lo, n_pairs, kv_end, seq_row_ptr, stride_bt_block,
                  num_pages, num_blocks, block_rows, CHUNKS: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                  BOX: gl.constexpr, PREFETCH: gl.constexpr):
        """One warp: the two tiles of each pair (tile 2i in stage 0, 2i + 1 in stage 1), each chunk
        group loaded as soon as the consumers free it, in the order they free them: tile 2i + 1's
        rope (after the right warpgroup's scores), tile 2i + 1's right chunks (the right one's own
        values), tile 2i's left chunks (the left one's own values, which wait for the right one's
        max), tile 2i's right chunks and rope (the right one's values of tile 2i, with P_0 in that
        rope chunk), tile 2i + 1's left chunks (the left one's values of tile 2i + 1). With
        ``PREFETCH``, the pair's two tiles asked of L2 first (``_prefetch``; ``PREFETCH_MIN_GROUPS``)."""
        VCH: gl.constexpr = (CHUNKS - 1) // 2
        for i in range(n_pairs):
            e = (i & 1) ^ 1
            k0 = key_lo + 2 * i * _TILE
            k1 = k0 + _TILE
            if PREFETCH:
                _prefetch(kv_ptr, k0, kv_end, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                          CHUNKS, BLOCK_SIZE)
                _prefetch(kv_ptr, k1, kv_end, seq_row_ptr, stride_bt_block, num_pages, num_blocks, block_rows,
                          CHUNKS, BLOCK_SIZE)
            _load(kv_desc, kv_smem, ready, empty, 3 + _R, e, 2 * VCH, 1, k1, seq_row_ptr, stride_bt_block,
                  num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)
            _load(kv_desc, kv_smem, ready, empty, 3 + _B, e, VCH, VCH, k1, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)
            _load(kv_desc, kv_smem, ready, empty, _A, e, 0, VCH, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)
            _load(kv_desc, kv_smem, ready, empty, _B, e, VCH, VCH, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)
            _load(kv_desc, kv_smem, ready, empty, _R, e, 2 * VCH, 1, k0, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)
            _load(kv_desc, kv_smem, ready, empty, 3 + _A, e, 0, VCH, k1, seq_row_ptr, stride_bt_block, num_pages,
                  num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, True)

    @gluon.jit
    def _scores(s, qs, kv_smem, ready, ph, stage, c0: gl.constexpr, n: gl.constexpr, CHUNKS: gl.constexpr, z):
        """Once ``ready`` (phase ``ph``) says they are loaded, issue ``S += Q[:, chunks] K[:,
        chunks]^T`` over chunks ``[c0, c0 + n)`` of the tile in ``stage`` (asynchronous; N = 64; Q's
        chunks in the rings ``qs``)."""
        mbarrier.wait(ready, ph)
        for c in gl.static_range(n):
            s = warpgroup_mma(qs[c0 + c].index(z), kv_smem.index(_slot(stage, c0 + c, CHUNKS, True)).permute((1, 0)), s,
                              is_async=True)
        return s

    @gluon.jit
    def _page_ok(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE: gl.constexpr):
        """Where a page holds the tile from ``key0`` (block sizes >= 64): whether its id is in ``[0,
        num_blocks)``, loaded before the tile's scores are waited for (an L2 round trip otherwise
        between the scores and the softmax); else True (``_masked`` loads each key's)."""
        if BLOCK_SIZE >= _TILE:
            blk = _block_id(key0, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
            return (blk >= 0) & (blk < num_blocks)
        else:
            return True

    @gluon.jit
    def _masked(s, key0, page_ok, seq_row_ptr, stride_bt_block, num_pages, num_blocks, kv_end,
                BLOCK_SIZE: gl.constexpr):
        """Scores of keys past ``kv_end`` or on pages with an id outside ``[0, num_blocks)`` to -inf
        (``page_ok``: ``_page_ok`` of the tile)."""
        keys = key0 + gl.arange(0, _TILE, layout=gl.SliceLayout(0, _ACC))
        if BLOCK_SIZE >= _TILE:
            key_ok = page_ok & (keys < kv_end)
        else:
            blk = _block_id(keys, seq_row_ptr, stride_bt_block, num_pages, BLOCK_SIZE)
            key_ok = (blk >= 0) & (blk < num_blocks) & (keys < kv_end)
        return gl.where(gl.expand_dims(key_ok, 0), s, float("-inf"))

    @gluon.jit
    def _finite(m):
        """A running max to subtract: 0 where no key is visible yet (-inf), so p = 0, not NaN."""
        return gl.where(m == float("-inf"), 0.0, m)

    @gluon.jit
    def _zero_rows(kv_smem, base, tail, VCH: gl.constexpr, WARPS: gl.constexpr):
        """Value rows ``>= tail`` of a stage's ``VCH`` latent chunks from chunk ``base`` to zero (the
        cache may hold NaN past a sequence's last key, and 0 * NaN is NaN), by ``WARPS`` warps; the
        caller fences before a wgmma reads them."""
        if tail < _TILE:
            zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
            rows = gl.expand_dims(gl.arange(0, _TILE, layout=gl.SliceLayout(1, zl)), 1)
            for c in gl.static_range(VCH):
                buf = kv_smem.index(base + c)
                v = buf.load(zl)
                buf.store(gl.where(rows < tail, v, gl.zeros_like(v)))

    # ``reinterpret`` is ``_reinterpret`` before Triton 3.7
    if hasattr(gl.shared_memory_descriptor, "reinterpret"):
        @gluon.jit
        def _wide_view(kv_smem, VCH: gl.constexpr):
            """``kv_smem``'s first ``4 VCH`` [64, 64] chunks as four [64, 64 VCH] operands."""
            return kv_smem.reinterpret(kv_smem.dtype, [4, _TILE, VCH * 64], kv_smem.layout)
    else:
        @gluon.jit
        def _wide_view(kv_smem, VCH: gl.constexpr):
            """``kv_smem``'s first ``4 VCH`` [64, 64] chunks as four [64, 64 VCH] operands."""
            return kv_smem._reinterpret(kv_smem.dtype, [4, _TILE, VCH * 64], kv_smem.layout)

    @gluon.jit
    def _values(o, p, kv_smem, stage, c0: gl.constexpr, VCH: gl.constexpr):
        """Issue ``O += P V`` over this warpgroup's value chunks ``[c0, c0 + VCH)`` of the tile in
        ``stage`` as one wgmma of N = 64 VCH; ``p`` [64, 64] from registers (a dot operand) or
        shared memory. The chunks lie side by side in ``kv_smem`` (``_slot``, rope last; each [64,
        64] with the 128-byte swizzle), which is the layout of one [64, 64 VCH] operand of that
        swizzle: each of its 64-column slabs is 64 rows of 128 bytes, the slabs one after another."""
        return warpgroup_mma(p, _wide_view(kv_smem, VCH).index(2 * stage + c0 // VCH), o, is_async=True)

    @gluon.jit
    def _start(q_latent_ptr, q_rope_ptr, qs, q_bar, wg: gl.constexpr, tok, head0, stride_ql_tok,
               stride_ql_head, stride_qr_tok, stride_qr_head, LATENT: gl.constexpr):
        """Q [64 heads, L + R] into shared memory (the rings ``qs``, one allocation a chunk, so that
        no chunk's store waits at a barrier for another's), each warpgroup half of the chunks, both
        waiting for both; returns this warpgroup's empty state ``(m, l, O)``, O [64, L / 2]."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
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
                qs[c].index(0).store(q)
        fence_async_shared()
        mbarrier.arrive(q_bar.index(0))
        mbarrier.wait(q_bar.index(0), 0)
        # O: one wgmma of N = L / 2 a key step (``_values``)
        acc: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, LATENT // 2, 16])
        return (gl.full([_ROWS], float("-inf"), gl.float32, _ROW), gl.zeros([_ROWS], gl.float32, _ROW),
                gl.zeros([_ROWS, LATENT // 2], gl.float32, acc))

    @gluon.jit
    def _by_row(x, o):
        """A row vector of the scores' layout as a [64, 1] factor of ``o``'s (the same rows a
        thread: a wgmma accumulator's rows do not depend on its N)."""
        return gl.expand_dims(gl.convert_layout(x, gl.SliceLayout(1, o.type.layout)), 1)

    @gluon.jit
    def _epilogue(wg: gl.constexpr, o, m_i, l_i, l_smem, l_bar, out_ptr, lse_ptr, tok, head0,
                  stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, LATENT: gl.constexpr,
                  HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr):
        """l = l_0 + l_1 (both add in that order), this warpgroup's columns of O / l, and (the left
        one) lse = (m + log2 l) * LSE_UNIT."""
        l_smem.index(wg).store(l_i)
        mbarrier.arrive(l_bar.index(0))
        mbarrier.wait(l_bar.index(0), 0)
        l_tot = l_smem.index(0).load(_ROW) + l_smem.index(1).load(_ROW)
        has_keys = l_tot != 0.0
        inv_l = _by_row(gl.where(has_keys, 1.0 / gl.where(has_keys, l_tot, 1.0), 0.0), o)
        acc: gl.constexpr = o.type.layout
        orows = head0 + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, acc))
        ocol = wg * (LATENT // 2) + gl.arange(0, LATENT // 2, layout=gl.SliceLayout(0, acc))
        o_rows = gl.expand_dims(tok.to(gl.int64) * stride_o_tok + orows * stride_o_head, 1)
        gl.store(out_ptr + o_rows + gl.expand_dims(ocol, 0), (o * inv_l).to(out_ptr.dtype.element_ty))
        if HAS_LSE:
            if wg == 0:
                lse = gl.where(has_keys, (m_i + gl.log2(gl.where(has_keys, l_tot, 1.0))) * LSE_UNIT, float("-inf"))
                lrows = head0 + gl.arange(0, _ROWS, layout=_ROW)
                gl.store(lse_ptr + tok.to(gl.int64) * stride_lse_tok + lrows * stride_lse_head, lse)

    @gluon.jit
    def _left(q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p1_smem, m_smem, l_smem, ready, empty,
              q_bar, m0_bar, m1_bar, p0_full, p1_full, p1_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
              num_blocks, key_lo, n_pairs, kv_end, scale, tok, head0, stride_ql_tok, stride_ql_head, stride_qr_tok,
              stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head,
              LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr):
        """The left warpgroup: scores of tile 2i (stage 0), output columns ``[0, L / 2)``."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        VCH: gl.constexpr = LATENT // 128
        dtype: gl.constexpr = kv_smem.dtype
        m_i, l_i, o = _start(q_latent_ptr, q_rope_ptr, qs, q_bar, 0, tok, head0, stride_ql_tok, stride_ql_head,
                             stride_qr_tok, stride_qr_head, LATENT)
        p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o.type.layout, k_width=2)
        qk_scale = scale * _LOG2E
        for i in range(n_pairs):
            ph = i & 1
            # stage indices the compiler cannot fold (i < 2**30): the wgmma descriptors are then
            # formed where they are used, not hoisted out of the loop (which spills them)
            z = i >> 30
            st0 = z
            st1 = z + 1
            key0 = key_lo + 2 * i * _TILE
            page_ok = _page_ok(key0, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE)
            # S_0 = Q K_0^T: the left chunks (loaded first), the right ones, the rope
            s = gl.zeros([_ROWS, _TILE], gl.float32, _ACC)
            s = _scores(s, qs, kv_smem, ready.index(_A), ph, st0, 0, VCH, CHUNKS, z)
            s = _scores(s, qs, kv_smem, ready.index(_B), ph, st0, VCH, VCH, CHUNKS, z)
            s = _scores(s, qs, kv_smem, ready.index(_R), ph, st0, 2 * VCH, 1, CHUNKS, z)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            s = _masked(s, key0, page_ok, seq_row_ptr, stride_bt_block, num_pages, num_blocks, kv_end, BLOCK_SIZE)
            m_new0 = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            m_smem.index(0).store(m_new0)
            mbarrier.arrive(m0_bar.index(0))
            # the right warpgroup's max of tile 2i + 1 (m_1 >= m_0): P_0 relative to it, which is what
            # the right one multiplies too, and O_L rescaled once a pair
            mbarrier.wait(m1_bar.index(0), ph)
            m_new1 = m_smem.index(1).load(_ROW)
            m_ref1 = _finite(m_new1)
            a = gl.exp2(m_i - m_ref1)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref1, 1))
            l_i = l_i * a + gl.sum(p, 1)
            pt = p.to(dtype)
            kv_smem.index(_slot(st0, 2 * VCH, CHUNKS, True)).store(pt)  # P_0 for the right one, in tile 2i's rope chunk
            _zero_rows(kv_smem, st0 * (CHUNKS - 1), kv_end - key0, CHUNKS - 1, 4)
            fence_async_shared()
            mbarrier.arrive(p0_full.index(0))
            o = o * _by_row(a, o)
            o = _values(o, gl.convert_layout(pt, p_operand), kv_smem, st0, 0, VCH)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(empty.index(_A))
            # O_L += P_1 V_1L, P_1 from the right warpgroup
            mbarrier.wait(p1_full.index(0), ph)
            o = _values(o, p1_smem, kv_smem, st1, 0, VCH)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(p1_free.index(0))
            mbarrier.arrive(empty.index(3 + _A))
            m_i = m_new1
        _epilogue(0, o, m_i, l_i, l_smem, l_bar, out_ptr, lse_ptr, tok, head0, stride_o_tok,
                  stride_o_head, stride_lse_tok, stride_lse_head, LATENT, HAS_LSE, LSE_UNIT)

    @gluon.jit
    def _right(q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p1_smem, m_smem, l_smem, ready, empty,
               q_bar, m0_bar, m1_bar, p0_full, p1_full, p1_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
               num_blocks, key_lo, n_pairs, kv_end, scale, tok, head0, stride_ql_tok, stride_ql_head, stride_qr_tok,
               stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head,
               LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr):
        """The right warpgroup: scores of tile 2i + 1 (stage 1), output columns ``[L / 2, L)``."""
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        VCH: gl.constexpr = LATENT // 128
        dtype: gl.constexpr = kv_smem.dtype
        m_i, l_i, o = _start(q_latent_ptr, q_rope_ptr, qs, q_bar, 1, tok, head0, stride_ql_tok, stride_ql_head,
                             stride_qr_tok, stride_qr_head, LATENT)
        p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o.type.layout, k_width=2)
        qk_scale = scale * _LOG2E
        for i in range(n_pairs):
            ph = i & 1
            z = i >> 30  # as in _left
            st0 = z
            st1 = z + 1
            key1 = key_lo + (2 * i + 1) * _TILE
            page_ok = _page_ok(key1, seq_row_ptr, stride_bt_block, num_pages, num_blocks, BLOCK_SIZE)
            # S_1 = Q K_1^T: the rope (loaded first), the right chunks, the left ones
            s = gl.zeros([_ROWS, _TILE], gl.float32, _ACC)
            s = _scores(s, qs, kv_smem, ready.index(3 + _R), ph, st1, 2 * VCH, 1, CHUNKS, z)
            s = _scores(s, qs, kv_smem, ready.index(3 + _B), ph, st1, VCH, VCH, CHUNKS, z)
            s = _scores(s, qs, kv_smem, ready.index(3 + _A), ph, st1, 0, VCH, CHUNKS, z)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(empty.index(3 + _R))
            s = _masked(s, key1, page_ok, seq_row_ptr, stride_bt_block, num_pages, num_blocks, kv_end, BLOCK_SIZE)
            mbarrier.wait(m0_bar.index(0), ph)
            m_new0 = m_smem.index(0).load(_ROW)
            m_new1 = gl.maximum(m_new0, gl.max(s, 1) * qk_scale)
            m_smem.index(1).store(m_new1)
            mbarrier.arrive(m1_bar.index(0))
            m_ref1 = _finite(m_new1)
            a = gl.exp2(m_i - m_ref1)  # the left warpgroup's rescale of the pair, the same value
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_ref1, 1))
            l_i = l_i * a + gl.sum(p, 1)
            _zero_rows(kv_smem, st1 * (CHUNKS - 1), kv_end - key1, CHUNKS - 1, 4)
            fence_async_shared()
            o = o * _by_row(a, o)
            pt = p.to(dtype)
            o = _values(o, gl.convert_layout(pt, p_operand), kv_smem, st1, VCH, VCH)
            # P_1 for the left warpgroup, once it is done with the last one
            mbarrier.wait(p1_free.index(0), ph ^ 1)
            p1_smem.store(pt)
            fence_async_shared()
            mbarrier.arrive(p1_full.index(0))
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(empty.index(3 + _B))
            # O_R += P_0 V_0R, P_0 (rescaled to this max) from the left warpgroup, in stage 0's rope chunk
            mbarrier.wait(p0_full.index(0), ph)
            o = _values(o, kv_smem.index(_slot(st0, 2 * VCH, CHUNKS, True)), kv_smem, st0, VCH, VCH)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(empty.index(_B))
            mbarrier.arrive(empty.index(_R))
            m_i = m_new1
        _epilogue(1, o, m_i, l_i, l_smem, l_bar, out_ptr, lse_ptr, tok, head0, stride_o_tok,
                  stride_o_head, stride_lse_tok, stride_lse_head, LATENT, HAS_LSE, LSE_UNIT)

    @gluon.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens"])
    def _mla_sm90_kernel(
        q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
        kv_desc,  # TMA descriptor of the cache as [NB * BS, L + R], boxes [BOX, 64]
        kv_ptr,  # the cache itself (the view's row 0), for the L2 prefetch
        block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
        out_ptr, lse_ptr,  # [T, H, L] or partials [T, S, H, L] float32 (this kernel's); [T, H] or [T, S, H] float32
        scale,
        num_tokens, num_seqs, num_blocks, max_blocks, split_tokens,
        block_rows,  # rows of the cache's [rows, L + R] view from one block to the next (_sm90.block_rows)
        stride_ql_tok, stride_ql_head, stride_qr_tok, stride_qr_head, stride_bt_seq, stride_bt_block,
        stride_sl, stride_qsl, stride_o_tok, stride_o_split, stride_o_head,
        stride_lse_tok, stride_lse_split, stride_lse_head,
        LATENT: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_LSE: gl.constexpr, LSE_UNIT: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        HEAD_GROUPS: gl.constexpr,  # > 0: the grid's axis 0 is token * HEAD_GROUPS + head group (``_launcher``)
        PREFETCH: gl.constexpr,  # the producer's L2 prefetch of each pair (``_producer``, ``PREFETCH_MIN_GROUPS``)
    ):
        CHUNKS: gl.constexpr = LATENT // 64 + 1
        dtype: gl.constexpr = q_latent_ptr.dtype.element_ty
        if HEAD_GROUPS > 0:
            tok = gl.program_id(0) // HEAD_GROUPS
            head0 = gl.program_id(0) % HEAD_GROUPS * _ROWS
        else:
            tok = gl.program_id(0)
            head0 = gl.program_id(1) * _ROWS
        split = gl.program_id(2)  # keys [split * split_tokens, + split_tokens), a multiple of the tile
        out_ptr += split.to(gl.int64) * stride_o_split
        lse_ptr += split.to(gl.int64) * stride_lse_split
        seq = _token_sequence(tok, query_start_loc_ptr, stride_qsl, num_seqs)
        has_seq = seq < num_seqs
        q_end = gl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=has_seq, other=0)
        tok_ok = tok < q_end  # padding tokens past query_start_loc[-1]: no keys (0 and -inf)
        seq_len = gl.where(tok_ok, gl.load(seq_lens_ptr + seq * stride_sl, mask=has_seq, other=0), 0)
        pos = seq_len - (q_end - tok)  # the token's position (causal: keys <= pos)
        kv_hi = gl.minimum(seq_len, max_blocks * BLOCK_SIZE)
        if CAUSAL:
            kv_hi = gl.minimum(kv_hi, pos + 1)
        key_lo = split * split_tokens
        kv_end = gl.maximum(gl.minimum(kv_hi, key_lo + split_tokens), key_lo)  # this program's keys end here
        n_pairs = (kv_end - key_lo + 2 * _TILE - 1) // (2 * _TILE)
        num_pages = gl.minimum((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE, max_blocks)
        seq_row_ptr = block_table_ptr + seq.to(gl.int64) * stride_bt_seq

        smem_layout: gl.constexpr = kv_desc.layout
        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        qs = _rings9(CHUNKS, 1, _ROWS, dtype, q_layout)
        kv_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, _TILE, 64], smem_layout)
        p1_smem = gl.allocate_shared_memory(dtype, [_ROWS, _TILE], q_layout)
        m_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, _ROWS], vec_layout)
        ready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        m0_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        m1_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p0_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p1_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p1_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        l_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(6):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        mbarrier.init(q_bar.index(0), count=2)
        mbarrier.init(m0_bar.index(0), count=1)
        mbarrier.init(m1_bar.index(0), count=1)
        mbarrier.init(p0_full.index(0), count=1)
        mbarrier.init(p1_full.index(0), count=1)
        mbarrier.init(p1_free.index(0), count=1)
        mbarrier.init(l_bar.index(0), count=2)
        fence_async_shared()

        gl.warp_specialize([
            (_left, (q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p1_smem, m_smem, l_smem, ready, empty,
                   q_bar, m0_bar, m1_bar, p0_full, p1_full, p1_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
                   num_blocks, key_lo, n_pairs, kv_end, scale, tok, head0, stride_ql_tok, stride_ql_head, stride_qr_tok,
                   stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, LATENT, BLOCK_SIZE,
                   HAS_LSE, LSE_UNIT)),
            (_right, (q_latent_ptr, q_rope_ptr, out_ptr, lse_ptr, qs, kv_smem, p1_smem, m_smem, l_smem, ready, empty,
                   q_bar, m0_bar, m1_bar, p0_full, p1_full, p1_free, l_bar, seq_row_ptr, stride_bt_block, num_pages,
                   num_blocks, key_lo, n_pairs, kv_end, scale, tok, head0, stride_ql_tok, stride_ql_head, stride_qr_tok,
                   stride_qr_head, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, LATENT, BLOCK_SIZE,
                   HAS_LSE, LSE_UNIT)),
            (_producer, (kv_desc, kv_ptr, kv_smem, ready, empty, key_lo, n_pairs, kv_end, seq_row_ptr, stride_bt_block,
                         num_pages, num_blocks, block_rows, CHUNKS, BLOCK_SIZE, BOX, PREFETCH)),
        ], [4, 1], [CONSUMER_REGS, REGS_PRODUCER])


def launch(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
           query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
           split_tokens: int, block_q: int = 0, kv_scale: Tensor | None = None, pair: bool = False,
           fold: bool = False) -> None:
    """One launch: grid (tokens, head groups of 64, splits), or with ``block_q`` >= 1 the narrow
    kernel's (``mla_sm90_narrow``: ``block_q`` query tokens x all heads a program; ``kv_scale``
    the scale of an fp8 cache; ``pair``: ``mla_sm90_pair`` instead, which must take the call;
    ``fold``: the narrow kernel's pairs of CTAs, each a half of the keys, which need ``lse``).
    ``out`` [T, H, L] and ``lse`` [T, H] (natural log; may be None) take the attention itself;
    4-D ``out`` [T, S, H, L] and 3-D ``lse`` [T, S, H] (float32) take the partial state of each split of
    ``split_tokens`` keys (a multiple of the tile; ``out`` normalised, ``lse`` in log2) for
    ``mla``'s combine kernel. The launcher of these shapes and strides (``_launcher``) is kept in
    ``_LAUNCHERS``; ``prepare``'s runner holds its own."""
    so, sl, num_splits, lse_unit = _out_strides(out, lse)
    key = (q_latent.shape, q_latent.stride(), q_rope.shape, q_rope.stride(), kv_cache.shape, kv_cache.dtype,
           block_table.shape, block_table.stride(), seq_lens.stride(0), query_start_loc.stride(0), so, sl,
           num_splits, lse_unit, lse is not None, float(scale), bool(causal), split_tokens, block_q, pair, fold)
    go = _sm90.kept_launcher(_LAUNCHERS, key, lambda: _launcher(
        q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, so, sl, num_splits, lse_unit,
        lse is not None, scale, causal, split_tokens, block_q, pair=pair, fold=fold))
    _go(go, block_q, q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, kv_scale)


def _go(go, block_q: int, q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
        query_start_loc: Tensor, out: Tensor, lse: Tensor | None, kv_scale: Tensor | None) -> None:
    """``go`` (a ``_launcher``) on these tensors: the narrow kernel (``block_q`` >= 1) takes the
    fp8 scale too (the queries stand in for it on other caches)."""
    if block_q:
        go(q_latent, q_latent_ptr=q_latent, q_rope_ptr=q_rope, kv_desc=kv_cache, block_table_ptr=block_table,
           seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
           lse_ptr=lse if lse is not None else out, kv_scale_ptr=kv_scale if kv_scale is not None else q_latent)
    else:
        go(q_latent, q_latent_ptr=q_latent, q_rope_ptr=q_rope, kv_desc=kv_cache, kv_ptr=kv_cache,
           block_table_ptr=block_table, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc, out_ptr=out,
           lse_ptr=lse if lse is not None else out)


_LAUNCHERS: dict[tuple, object] = {}


def _out_strides(out: Tensor, lse: Tensor | None) -> tuple[tuple, tuple, int, float]:
    """(out's strides (token, split, head), lse's, splits, LSE_UNIT) of a launch into ``out`` and
    ``lse``: partials (4-D ``out``) keep the log2 LSE, the attention itself the natural log."""
    if out.dim() == 4:
        return out.stride()[:3], lse.stride(), out.shape[1], 1.0
    sl = (lse.stride(0), 0, lse.stride(1)) if lse is not None else (0, 0, 0)
    return (out.stride(0), 0, out.stride(1)), sl, 1, LN2


def _launcher(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
              query_start_loc: Tensor, so: tuple, sl: tuple, num_splits: int, lse_unit: float, has_lse: bool,
              scale: float, causal: bool, split_tokens: int, block_q: int = 0, pdl: bool = False, pair: bool = False,
              fold: bool = False):
    """The kernel's ``_launch.launcher`` for calls of these shapes and strides (``block_q`` >= 1:
    the narrow kernel's, with its ``mla_sm90_narrow.constants``, or ``mla_sm90_fp8``'s where
    ``mla.SM90_FP8`` and it takes the call, or with ``pair`` ``mla_sm90_pair``'s, launched with
    programmatic dependent launch when ``pdl``; ``fold``: the narrow kernel's pairs of CTAs, unsplit
    and with an LSE), writing into an ``out`` / ``lse`` of strides
    ``so`` / ``sl`` (token, split, head) as ``_out_strides`` gives them, with its ``num_splits`` and ``lse_unit``:
    every argument but the tensors fixed, the cache's TMA descriptor encoded once per cache address
    (``_sm90.descriptor_spec``). ``go(q_latent, q_latent_ptr=, q_rope_ptr=, kv_desc=kv_cache,
    block_table_ptr=, seq_lens_ptr=, query_start_loc_ptr=, out_ptr=, lse_ptr=)`` (``lse_ptr=out``
    without an LSE)."""
    num_tokens, num_heads, latent = q_latent.shape
    num_blocks, block_size, _ = kv_cache.shape
    num_seqs, max_blocks = block_table.shape
    box = min(block_size, TILE_N)
    if block_q:
        from . import mla, mla_sm90_fp8, mla_sm90_pair
        from . import mla_sm90_narrow as narrow

        grid = (narrow.grid_blocks(num_tokens, num_seqs, block_q, fold), 1, num_splits)
        fp8 = kv_cache.dtype in _FP8
        if fold and (pair or fp8 or num_splits != 1 or not has_lse):
            raise ValueError("the narrow kernel's fold is unsplit, with an LSE, over a bf16/fp16 cache, and not "
                             "mla_sm90_pair's")
        if mla.SM90_FP8 and mla_sm90_fp8.declines(q_latent, kv_cache, block_q) is None:
            kernel, own = mla_sm90_fp8._mla_fp8_kernel, mla_sm90_fp8.constants(num_heads, block_q, pdl)
        elif pair:
            reason = mla_sm90_pair.declines(q_latent, q_rope, kv_cache, block_q)
            if reason:  # (mla._pair plans it only where it takes the call)
                raise ValueError(f"mla_sm90_pair does not take this call: {reason}")
            kernel, own = mla_sm90_pair._mla_pair_kernel, mla_sm90_pair.constants(num_heads, block_q, pdl)
        else:
            kernel, own = narrow._mla_narrow_kernel, narrow.constants(num_heads, block_q, pdl, latent, fp8, fold)
        if not fp8:
            own["kv_scale_ptr"] = same_as("q_latent_ptr")
    else:
        kernel, groups = _mla_sm90_kernel, num_heads // HEADS
        first = groups if box == TILE_N and HEADS_FIRST else 0
        grid = (num_tokens * groups, 1, num_splits) if first else (num_tokens, groups, num_splits)
        # (a whole tile a page, its rows one after another: one run of bytes)
        prefetch = (box == TILE_N and groups >= PREFETCH_MIN_GROUPS and kv_cache.stride(1) == kv_cache.shape[2])
        own = dict(CONSUMER_REGS=REGS_CONSUMER, num_warps=NUM_WARPS, HEAD_GROUPS=first, PREFETCH=prefetch)
    return launcher(
        kernel, grid,
        kv_desc=_sm90.descriptor_spec(kv_cache, box), **({} if has_lse else {"lse_ptr": same_as("out_ptr")}),
        scale=float(scale), num_tokens=num_tokens, num_seqs=num_seqs,
        num_blocks=num_blocks, max_blocks=max_blocks, split_tokens=split_tokens, block_rows=_sm90.block_rows(kv_cache),
        stride_ql_tok=q_latent.stride(0), stride_ql_head=q_latent.stride(1), stride_qr_tok=q_rope.stride(0),
        stride_qr_head=q_rope.stride(1), stride_bt_seq=block_table.stride(0), stride_bt_block=block_table.stride(1),
        stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0), stride_o_tok=so[0],
        stride_o_split=so[1], stride_o_head=so[2], stride_lse_tok=sl[0], stride_lse_split=sl[1],
        stride_lse_head=sl[2], LATENT=latent, BLOCK_SIZE=block_size, BOX=box,
        CAUSAL=bool(causal), HAS_LSE=has_lse, LSE_UNIT=lse_unit, **own,
    )


@torch.library.custom_op("paged_attn::_mla_sm90", mutates_args=("out", "lse"))
def _mla_sm90(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
              query_start_loc: Tensor, out: Tensor, lse: Tensor | None, scale: float, causal: bool,
              split_tokens: int, block_q: int, kv_scale: Tensor | None, pair: bool, fold: bool) -> None:
    """This kernel (``block_q`` >= 1: the narrow one, ``kv_scale`` an fp8 cache's scale; ``pair``:
    ``mla_sm90_pair``; ``fold``: the narrow one's pairs of CTAs) into ``out`` and, when given,
    ``lse`` (``launch``): an opaque op, so that
    Inductor, tracing the public op's body, sees one extern call (a Gluon kernel with a TMA
    descriptor is not one ``wrap_triton`` launches)."""
    if q_latent.shape[0] == 0:
        return
    launch(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, split_tokens,
           block_q, kv_scale, pair, fold)


@_mla_sm90.register_fake
def _(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, scale, causal, split_tokens,
      block_q, kv_scale, pair, fold):
    return None


def prepare(*, scale: float, causal: bool, split_tokens: int, call: tuple, workspace=None, combine=None,
            block_q: int = 0, pdl: bool = False, pair: bool = False, fold: bool = False):
    """The runner of this kernel (``block_q`` >= 1: ``mla_sm90_narrow``'s, with ``pair``
    ``mla_sm90_pair``'s, ``block_q`` query tokens a program, launched with programmatic dependent
    launch when ``pdl``: ``paged_attention.pdl_options``; ``fold``: the narrow kernel's pairs of
    CTAs, each a half of the keys, merged by rank 0, with an LSE of its own where the call passes
    none) for calls shaped like ``call``
    (``q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse``;
    ``mla.prepare_mla_decode`` documents the runner). With a ``workspace``
    (``paged_attention._Workspace``), the keys are split at multiples of ``split_tokens`` into its
    partials and ``combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse,
    kv_scale)`` merges them (``kv_scale``: an fp8 cache's, else None); otherwise ``split_tokens``
    covers every key. Every launch argument but the tensors is fixed here (``_launcher``): a plain
    eager call passes the tensors alone. B1 x 32768 keys, 128 heads (split 132 ways, with the
    combine), package host code with no-op binaries (``benchmarks/overhead.py --null-launch
    --device cpu``, 2-core CPU, 2026-11-26): 24.8 us a call before (keyword arguments and a
    ``TensorDescriptor`` per call), 11.7 us after (the no-op binaries leave out Triton's launcher:
    the GPU host also saves its per-launch descriptor encoding, ~42 us of the 100 measured there
    with Triton 3.6)."""
    from .. import plain_eager

    scale, causal = float(scale), bool(causal)
    q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse = call
    # the fold's binaries are compiled and tested with an LSE (rank 1 once handed its own over
    # through it; it now goes through shared memory, so a call without one could drop this)
    fold_lse = fold and lse is None
    if fold_lse:
        lse = torch.empty(out.shape[:2], dtype=torch.float32, device="meta")
    if workspace is None:
        so, sl, num_splits, lse_unit = _out_strides(out, lse)
        has_lse = lse is not None
    else:  # the partials [T, S, H, L] and [T, S, H], contiguous
        so, sl, num_splits, lse_unit = workspace.po_strides, (*workspace.pl_strides, 1), workspace.shapes[0][1], 1.0
        has_lse = True
    go = _launcher(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, so, sl, num_splits, lse_unit,
                   has_lse, scale, causal, split_tokens, block_q, pdl, pair, fold)
    fp8 = kv_cache.dtype in _FP8  # (the narrow kernels' fp8 caches)

    def attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, kv_scale):
        if plain_eager(q_latent):  # the op's body directly: nothing traces
            _go(go, block_q, q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, kv_scale)
        else:
            torch.ops.paged_attn._mla_sm90(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc,
                                           out, lse, scale, causal, split_tokens, block_q, kv_scale, pair, fold)

    def run(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        kv_scale = options["kv_scale"] if fp8 else None
        if fold_lse:
            lse = torch.empty(out.shape[:2], dtype=torch.float32, device=out.device)
        if workspace is None:
            attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, kv_scale)
            return
        part_out, part_lse = workspace.tensors(out)
        attend(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, part_out, part_lse, kv_scale)
        combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse, kv_scale)

    return run
