"""Absorbed multi-head latent attention (DeepSeek-V2 MLA) decode in Triton, split-KV optional.

FlashAttention-2's online softmax over a paged latent cache, W_UK absorbed into the query (as
FlashMLA and vLLM compute it): every head attends to the same row ``[c | k_pe]`` (latent L + rope
R) and the latent is the value too, so one load of a row serves both products. The latent is
tiled in two halves of ``L_PAD / 2`` columns (256 of 512): three score dots (latent halves, rope;
formed as ``_CONFIGS``' SCORES says), and two [M, L/2] accumulators for P @ c, each dot N = 256
wide (the widest Hopper wgmma)::

    s = scale * (q_lo @ c_lo^T + q_hi @ c_hi^T + q_rope @ k_pe^T)     [M, TILE_N]
    acc_lo += softmax_step(s) @ c_lo;   acc_hi += ... @ c_hi          [M, L/2] each
M = BLOCK_Q query tokens x HEADS heads (one head group, <= 64 heads; 128 heads form two groups,
each reading the rows), so a cache tile is loaded once per sequence, split and head group for all
of them. Split-KV partials are merged by ``paged_attention``'s combine kernel, in split order.
Grid: axis 0 query block (``T // BLOCK_Q + B + 1`` slots, as ``paged_attention``), axis 1 head
group, axis 2 kv split (``_CONFIGS``' GRID "heads": axes 0 and 1 swapped). Layouts: q_latent/out
``[T, H, L]``, q_rope ``[T, H, R]``, kv_cache ``[NB, BS, L + R]`` (any strides, last one 1).
Block-table lookup per key position j::

    row = kv_cache[block_table[b, j // BS], j % BS]    # masked: j >= seq_len, block outside [0, NB)
(one table entry per tile where TILE_N divides BS: block 64, the DeepSeek layout).
Bytes moved: ``sum_b seq_len_b * G * (L + R) * cache_bytes`` (G head groups) + ``T * H * (2L + R)
* q_bytes``; split-KV adds ``T * S * H * (L + 1) * 8``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from ... import _config
from ._launch import cdiv, launcher, next_power_of_2, same_as
from ._softmax import LOG2E, merge_partial, merged_to_output, softmax_step, state_to_partial
from .paged_attention import (
    _INVARIANT_SPLIT_TOKENS,
    _MAX_GRID_Y,
    _MERGE_GROUP,
    _NO_LIMIT,
    _NO_SPLIT,
    _Workspace,
    _abs_max,
    _busy_q_blocks,
    _combine_blocking,
    _combine_kernel,
    _dot,
    _fp16_exponent,
    _fp8_to_fp16,
    _interpreted,
    _interpreting,
    _load_block_ids,
    _load_rows,
    _pad,
    _plan_splits,
    _tokens_per_seq,
    gdc_launch_dependents,
    pdl_options,
    use_pdl,
)

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_QUERY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The narrow Gluon kernels' split-KV partial outputs (``mla_sm90_narrow``, ``_pair``, ``_fp8``) in the
# query's dtype (bf16 / fp16) instead of float32: half the bytes written and read back by the combine
# kernel (merged in float32 there). H100, CUDA-graph replays, us, float32 / query dtype (three
# rounds, benchmarks/results/gpu-2026-11-27i/logs/call4/partials.txt): 2 tokens B64 x 4096 H16 (2
# splits) 119.2-119.4 / 117.0-117.2, 2 tokens B32 x 8192 (4) 115.8-116.2 / 114.1-114.6, 1 token
# B32 x 8192 (4) 109.3-109.9 / 108.4-109.0, B16 x 8192 (8) 59.4-59.5 / 58.3-58.7, 4 tokens B32 x 4096
# (pair, 2) 73.7-73.8 / 72.4-72.6; max error against a float32 gather-einsum 2.9e-3 / 4.6e-3 of the
# largest output (bf16's unit roundoff 3.9e-3). The wide kernel keeps float32: B1 x 32768 H128 (64
# splits) measured 38.1-38.2 / 39.9-40.1.
_NARROW_PARTIALS_IN_QUERY_DTYPE = True
# The combine kernel's largest slab a program (heads x padded latent columns,
# ``paged_attention._combine_blocking``'s ``tile``) after the narrow Gluon kernels' splits: up to 4
# heads of latent 512 a program where that still leaves one for every SM, one head a program
# (``paged_attention._COMBINE_TILE``) elsewhere and after the other kernels' splits (the wide
# kernel's float32 partials: not measured). Where one head a program made 2048 programs (2 tokens
# B64 x 4096 H16), the combine merged for 4.0 us after its wait for the attention kernel returned,
# against 2.0-2.2 with 512 programs of 4 heads (H100, %globaltimer stamps in both kernels,
# benchmarks/results/gpu-2026-11-27l/logs/call5, logs/call6/probe-boundary2048.txt). H100,
# CUDA-graph replays, three rounds, us, one / two / four heads a program
# (logs/call6/probe-combine.txt): 2 tokens B64 x 4096 H16 117.1-117.3 / 116.1-116.4 / 115.7-115.8; 1
# token B64 x 4096 109.7-110.1 / 109.0-109.1 / 109.0-109.1; 2 tokens B32 x 8192 114.5-114.6 /
# 113.8-114.2 / 114.0-114.2; 4 tokens B32 x 4096 (pair) 72.0-72.4 / 70.9-71.2 / 70.8-71.2; 1 token
# B32 x 8192 (32 tokens: two heads a program here) 108.5-109.0 / 108.3-108.8 / 108.3-109.0. B16 x
# 8192 (16 tokens: one head a program here, as before) took 58.8-59.4 where its programs fell below
# the SM count and took the few-rows blocking, against 58.4-58.7. The package's rule against one
# head a program, another machine (logs/call7/probe-combine-pkg.txt): 2 tokens B64 x 4096 115.6 /
# 116.9-117.2, 4 tokens B32 x 4096 70.7-71.6 / 72.1-72.9, 1 token B64 x 4096 109.5-109.8 /
# 110.0-110.3, the rest within 0.2 us. Eight and 16 heads a program (logs/call11/probe-heads8.txt):
# 2 tokens B64 x 4096 115.4-115.5 at four, 115.9-116.1 at eight, 115.9-116.2 at 16; 4 tokens B32 x
# 4096 70.2-71.7 / 70.6-72.2 / 70.7-72.1. Four heads with 8 or 2 warps instead of 4
# (logs/call12/probe-warps.txt): 2 tokens B64 x 4096 115.5-115.8 with 4, 116.0-116.4 with 8,
# 115.9-116.2 with 2.
_COMBINE_TILE = 2048

# Tile configurations by BLOCK_M (query tokens x heads a program holds): (TILE_N keys per
# iteration, num_warps, num_stages, programs resident per SM, which sets the split-KV count).
# Measured on an H200 (copy 4178 GB/s, 2026-11-22, ``benchmarks/tune.py``), latent 512 + rope 64,
# block 64, % of copy on the cache bytes:
# BLOCK_M 16 (H16, B128 x 4096): (64, 4, 2, 2) 86.7, (32, 4, 3, 2) 84.6, (64, 4, 2, 4) 82.8,
#   (64, 4, 3, 2) 73.7, (128, 8, 2, 2) 72.1, (64, 8, 2, 2) 60.5, (64, 4, 2, 1) 51.3 (no split:
#   one program per SM cannot keep enough loads in flight).
# BLOCK_M 64 (H128, B64 x 4096; scores "rows", below): (64, 8, 2, 1) 20.7, (32, 8, 3, 1) 17.3, (64, 8, 1, 1) 16.0,
#   (32, 8, 2, 1) 15.0, (32, 8, 2, 2) 14.5, (16, 8, 3, 1) 11.2, (32, 4, 2, 1) 7.5.
# BLOCK_M 32 (H32, or H16 with 2 speculative tokens), MTP B64 x 4096 H16, H100 (copy 2959-2974
#   GB/s, 2026-11-23): (32, 4, 3, 2) 69.7 / 68.0, (16, 4, 4, 2) 63.7, (32, 4, 2, 2) 63.0 / 62.0,
#   (64, 4, 2, 2) 61.5, (64, 8, 2, 1) 59.2, (32, 4, 3, 3) 56.9, (32, 4, 4, 2) 50.2, (32, 8, 2, 1)
#   38.8 / 38.4 (the earlier entry). Not profiled yet: the gap to the H16 tile's 86.7 % (H200) is
#   unexplained; the two [32, 256] float32 accumulators alone take 128 registers a thread at 4 warps.
# BLOCK_M 16 on B32 x 8192 H16, same H100 run: (64, 4, 2, 2) 84.8, (32, 4, 3, 2) 84.3, (64, 4, 2,
#   4) 77.2; more splits (4-8 programs per SM) only add partial-state traffic.
# The fifth entry, SCORES, how the three score dots (latent halves, rope) are formed:
# "rows": rows x keys ([BLOCK_M, TILE_N]), chained through one accumulator. For a dot whose
#   result reaches another dot, Triton 3.6 puts every warp along M (mma.sync: when M >= N; wgmma:
#   always), so a [32, 32] tile on 4 warps or a [64, TILE_N] tile on 8 warps (two warpgroups of
#   64 rows each) is computed twice.
# "keys": keys x rows ([TILE_N, BLOCK_M]), transposed after: the score dots take the value dots'
#   warps ([1, 4]). MTP B64 x 4096 H16, sm_90, Triton 3.6 (benchmarks/sass_report.py): 208 -> 136
#   mma.sync, 3200 -> 2960 instructions per program, the same 255 registers, 8-byte stack and
#   shared memory. Not yet timed on a GPU. With wgmma (H128) it spills (24 -> 208-byte stack).
# "split": rows x keys, three dots from zero, each scaled, then summed (the scaling keeps Triton
#   from folding the sums back into a chain). With the causal mask's branch between the scores
#   and the P @ c dots, no score dot reaches another dot, and on wgmma the two warpgroups split
#   the keys (warps [4, 2]) instead of both computing all of them. H128 B64 x 4096, sm_90,
#   Triton 3.6 (results/sass-sm90-triton3.6-2026-11-23-d-mla): 76 -> 44 wgmma per 64 keys, the
#   [64, 64] score tile's layout conversion gone, stack 24 -> 0 bytes (B1 x 32768, split-KV:
#   72 -> 48). Not yet timed on a GPU. On mma.sync tiles (H16, MTP, fp8) it gains nothing (the
#   same mma.sync count, more registers), so they keep "rows" / "keys". Non-causal calls have no
#   branch there: every score dot stays chained and "split" only adds registers (H128: 80 wgmma
#   either way, 136- against 80-byte stack), so they run "rows". A mask branch taken only by
#   tiles with an invalid key (a reduction of the key mask) parts them too, but spills (causal:
#   0 -> 224-byte stack).
# The sixth entry, GRID, which grid axis CUDA's block scheduler runs fastest (axis 0):
# "queries": the query block; the programs of one (sequence, split) for two head groups are
#   T // BLOCK_Q + B + 1 launches apart. "heads": the head group, so they launch adjacent and
#   stream the same latent pages at once, the second read able to come from L2. H128 B64 x 4096:
#   the cache is 302 MB, 604 MB if read twice from DRAM (203 us at 2976 GB/s); "queries" ran 251
#   us on an H100 (results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-23.txt). There the 128 busy
#   programs (one per SM) start in the first wave in either order, the empty slots returning at
#   once: the order only aligns their starts. Where the query blocks would not fit grid axis 1
#   (_MAX_GRID_Y) the planner keeps "queries" (the same bits). "heads" is a candidate for
#   BLOCK_M 64 (tune.py mla_h128, mla_b1_h128), not yet timed on a GPU. sm_90, Triton 3.6
#   (results/sass-sm90-triton3.6-2026-11-24-mla-grid-order): the same registers, stack, shared
#   memory and wgmma count as "queries" for every H128 candidate; instructions +0 to +16.
_CONFIGS = {
    16: (64, 4, 2, 2, "rows", "queries"),
    32: (32, 4, 3, 2, "keys", "queries"),
    64: (64, 8, 2, 1, "split", "queries"),
}
# fp8 caches (bf16 queries, fp16 dots), BLOCK_M 16, B128 x 4096 H16, H200, before the latent tiles
# were converted in their load layout (``_fp8_to_fp16``): (32, 4, 3, 4) 26.5 % of copy, (64, 4, 2,
# 2) 21.9, (64, 4, 2, 4) 21.4, (128, 8, 2, 2) 20.9, (64, 4, 2, 1) 11.7, (128, 4, 2, 2) 2.0 (spills);
# the values were then read from shared memory a byte at a time (128 LDS.U8 a tile, 255 registers,
# 56-byte stack on sm_90). Converted in place, the fp16 tile is staged in shared memory: (32, 4, 3)
# needs 118 KiB (one program per SM where 4 were planned), (32, 4, 2) 100 KiB and 224 registers,
# two programs per SM. H100, 2026-11-24 (tune.py mla_fp8, copy 2920-2968 GB/s, two runs;
# results/tune-NVIDIA-H100-80GB-HBM3-2026-11-24-mla-fp8*.txt), % of copy on the bytes moved:
# SCORES "keys", one stage: (64, 4, 1, 2) 51.3 / 52.0 (198.4 / 198.9 us), (64, 4, 1, 4) 49.0 /
# 49.8, (128, 8, 1, 1) 43.0, (64, 4, 2, 1) 40.4 / 41.1, (64, 4, 1, 1) 29.9 / 30.5; "rows": the
# previous entry (32, 4, 2, 2) 38.7 / 39.6, (64, 4, 2, 1) 36.2. With the latent tile as the first
# operand of the score dots and no cp.async stage, the tile is loaded to registers, converted once
# and staged in shared memory as fp16 for both products (sm_90, Triton 3.6: 19 SASS instructions
# a key against 29, 86 KiB shared memory, 255 registers, 8-byte stack). ncu of the previous entry:
# 26 % of warps stalled on shared-memory results (short scoreboard), 17 % on MIO throttle, tensor
# pipe 11.7 % active (results/gpu-2026-11-24).
_FP8_CONFIGS = {**_CONFIGS, 16: (64, 4, 1, 2, "keys", "queries")}
# Calls ``mla_sm90`` takes (sm_90, bf16/fp16 caches, 64-head groups, a contiguous cache; not in
# batch-invariant mode) whose block tables cover at least _GLUON_MIN_KEYS keys run that Gluon
# kernel, split like this one's (one program an SM; at multiples of its pair of tiles). H100,
# CUDA-graph replays, us (Triton -> Gluon, the paired-tile schedule;
# benchmarks/results/gpu-2026-11-24d/logs/seesaw-probe-v1.txt): B64 x 4096 H128 253.0 -> 152.6,
# B1 x 32768 H128 51.4 -> 43.1, B8 x 8192 H128 76.9 -> 56.4, B64 x 4096 H64 152.8 -> 133.8,
# B64 x 1024 H128 72.0 -> 54.1, B64 x 512 H128 42.7 -> 38.8, 2 tokens B64 x 4096 H128 488.3 ->
# 315.4; but B64 x 256 H128 24.9 -> 28.2 with the kernel before it (gpu-2026-11-24c/
# mla-probe-split2.txt: a program's fixed cost, 72 KiB of queries into shared memory, four tiles
# to amortise it), hence the floor, where the two lines crossed (about 400 keys).
SM90_GLUON = True
_GLUON_MIN_KEYS = 512
# Calls of at most 32 query rows a program (tokens x heads: 16-head models, speculative tokens)
# that ``mla_sm90_narrow`` takes run it, under the same conditions (sm_90, bf16/fp16 queries over
# a cache of their dtype or fp8, not batch-invariant, tables of at least _GLUON_MIN_KEYS keys): its products transposed, the 64-key
# tile as wgmma's M, one program an SM, split like the wide one. H100, 2026-11-26, CUDA-graph
# replays, us, against this module's kernel in the same run (benchmarks/results/
# mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-26-b.txt): B128 x 4096 H16 209.3 / 220.1, B32 x 8192
# H16 112.7 / 115.2, 2 tokens B64 x 4096 H16 120.8 / 130.3 (one program a sequence's 2 tokens;
# one a token measured 121.6 and 129.0 against 123.3 and 121.8 in two runs, gpu-2026-11-26b/logs).
SM90_NARROW = True
# fp8 caches of at most 16 query rows a program that the narrow kernel takes run ``mla_sm90_fp8``
# (two warpgroups on alternate tiles, a producer warp); with 32 rows, the narrow kernel's own fp8
# path (one tile at a time). H100, 2026-11-26, graph replays, us, e4m3 (benchmarks/results/
# gpu-2026-11-26c/logs/fp8-probe-2.txt): B128 x 4096 H16 125.6 (the narrow kernel's path 187.3,
# this module's kernel 200.3), B32 x 8192 H16 74.3 (100.3, 107.2), 2 tokens B64 x 4096 H16 on the
# narrow path 137.0 (198.4).
SM90_FP8 = True
# Narrow-kernel calls over bf16/fp16 caches that the default plan splits exactly two ways run as
# pairs of CTAs instead (``mla_sm90_narrow``'s fold, ``_cluster``): rank 0 a query block's first
# half of the keys, rank 1 the rest, rank 1's state stored into rank 0's shared memory before a
# remote mbarrier arrive, rank 0 merging it; no partials, no combine kernel. With 32 rows a
# program only where the pairs cover at least _FOLD_MIN_COVER of the SMs. H100, 2026-11-28,
# CUDA-graph replays, us, three rounds, split with the combine kernel / fold
# (benchmarks/results/gpu-2026-11-28b/logs/call3-4, probe_cluster.py): 2 tokens H16 (32 rows) B64 x
# 4096 116.2-117.9 / 115.0-115.3, B64 x 8192 217.1-217.6 / 213.7-213.9, B60 x 4096 110.4-110.8 /
# 108.8-109.3, but B56 103.8-105.1 / 104.9-107.1 and B48 100.9-101.1 / 106.1-106.2; 1 token
# (16 rows) B64 x 4096 110.1-110.5 / 110.0-110.2, B60 106.2-106.7 / 105.5-105.7, B56 100.3-101.0 /
# 99.8-99.9, B48 86.8-87.1 / 85.7-86.0. (Those folds handed rank 1's state over through out / lse;
# the shared-memory handover measured 0.2-0.4 us faster at B64 x 4096: gpu-2026-11-28c, call 10.)
SM90_FOLD = True
_FOLD_MIN_COVER = 0.9
# Narrow-kernel calls of 17-32 query rows a program over bf16/fp16 caches (speculative tokens at
# 16 heads, 17-32 heads) run ``mla_sm90_pair`` (each tile's scores by one warpgroup for all rows,
# the values split by latent columns) instead of the narrow kernel's two warpgroups on the same
# tile where it measured faster (``_pair``): block sizes under 64 (the narrow kernel's
# consumers issue a tile's TMA boxes themselves, one page a box, where the pair kernel has a
# producer warp), one token a program (17-32 heads), or a sequence's tokens over several programs
# (which read the same pages, all but the first mostly from L2); the narrow kernel keeps a
# sequence's 2-4 tokens in one program on pages of 64 or more keys. H100, 2026-11-26, CUDA-graph
# replays, us, pair / narrow (benchmarks/results/gpu-2026-11-26g/logs/probe-pair-2.txt, two rounds
# each): 2 tokens H16 block 16 B64 x 4096 121.3 / 137.4; 4 tokens H16 B32 x 4096 (2 programs a
# sequence) 74.7 / 99.6; 1 token H32 B64 x 4096 119.3 / 120.5; block 64, 2 tokens a program: H16
# B64 x 4096 122.0 / 119.5, B32 x 8192 117.9 / 116.9, B128 x 4096 216.3 / 215.6, B24 x 4096 55.2 /
# 55.3, H12 B32 x 4096 67.0 / 64.9.
SM90_PAIR = True
# Speculative tokens on the narrow kernels: a program holds a sequence's query tokens in up to 32
# rows, or in up to 16 (at 16 heads one token a program; the programs of a sequence's tokens read
# the same pages, all but the first mostly from L2) on fp8 caches (``mla_sm90_fp8`` takes 16 rows,
# the narrow kernel's own fp8 path 32) and, on bf16/fp16 caches, where the 32-row programs would
# split at least _SHORT_SPLITS ways (short splits: their combine and fixed costs outweigh the
# second read) and at most _MAX_READERS programs read a page. H100, 2026-11-26, CUDA-graph
# replays, us, 32-row / 16-row programs (benchmarks/results/gpu-2026-11-26f/logs/probe-q1*.txt):
# e4m3, 2 tokens H16: B64 x 4096 126.1 / 102.5, B128 x 4096 229.9 / 205.6, B32 x 8192 123.2 /
# 105.9, B16 x 4096 41.6 / 34.7, B1 x 32768 34.6 / 25.0; 4 tokens B32 x 4096 125.5 / 101.7, B8 x
# 4096 H8 28.4 / 22.7. bf16, 2 tokens H16 (32-row splits): B1 x 32768 (128) 32.4 / 26.3, B8 x
# 4096 (16) 27.6 / 25.1, B12 (11) 35.1 / 32.9, B16 (8) 41.8 / 39.4, B16 x 8192 (8) 66.7 / 67.3,
# B20 (6) 49.2 / 48.3, B24 (5) 55.3 / 65.5, B32 x 8192 (4) 117.1 / 122.6, B64 x 4096 (2) 119.2 /
# 121.7; 3 tokens B8 (3 readers) 32.2 / 30.9; 4 tokens B8 x 4096 (4 readers) 33.8 / 36.2, B4 x
# 16384 54.5 / 63.1; 4 tokens B8 x 4096 H8 (2 readers) 26.7 / 24.6. Not at block sizes under 64,
# where the 32-row programs run ``mla_sm90_pair`` and the narrow kernel's 16-row ones issue their
# page-sized boxes themselves: H100, 2026-11-26, block 16, 2 tokens H16, 16-row narrow / 32-row
# pair programs (gpu-2026-11-26g/logs/probe-rule16.txt, two rounds): B16 x 8192 99.3-99.9 /
# 67.4-67.6, B16 x 4096 54.4-54.7 / 41.7-42.4, B4 x 16384 54.8-54.9 / 42.3, B8 x 4096 31.1 /
# 27.7-27.8, B1 x 32768 32.4 / 33.0-33.2.
_SHORT_SPLITS = 8
_MAX_READERS = 3
# Heads one program holds (the M dimension of the dots is at most 64 rows).
_MAX_HEADS_PER_PROGRAM = 64
_MAX_BLOCK_M = 64


def supports(op: str, facts: dict) -> str | None:
    """None when the Triton kernel runs this call, else why it cannot (the reference runs it)."""
    if op != "mla_decode":
        return f"the Triton mla module has no kernel for {op}"
    if facts.get("dtype") not in _QUERY_DTYPES:
        return f"query dtype {facts.get('dtype')} is not bf16/fp16/fp32"
    for name, low, top in (("latent", 32, 1024), ("rope", 16, 256)):
        size = facts.get(name, 0)
        if size % 16 != 0 or not low <= size <= top:
            return f"{name} {size} is not a multiple of 16 in [{low}, {top}]"
    if facts.get("block_size", 0) % 8 != 0:
        return f"block_size {facts.get('block_size')} is not a multiple of 8"
    if facts.get("cache_dtype") in _FP8 and facts.get("device") == "cuda" and not _interpreting():
        if torch.cuda.get_device_capability() < (8, 9):
            return "fp8 caches need compute capability 8.9 or newer in Triton"
    return None


@triton.jit
def _rescale(m_old, m_new):
    """The factor ``softmax_step`` rescales its accumulator by, for a second accumulator."""
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return tl.exp2(m_old - m_ref)


@triton.jit
def _load_page_id(block_row_ptr, stride_bt_block, start, seq_len, max_blocks, BLOCK_SIZE: tl.constexpr):
    """Cache block (page) of key position ``start``, int32; -1 past ``seq_len`` or the table."""
    start = start + tl.zeros([], tl.int32)  # a tensor also where the loop gives a Python int
    block_idx = start // BLOCK_SIZE
    return tl.load(block_row_ptr + block_idx * stride_bt_block, mask=(start < seq_len) & (block_idx < max_blocks),
                   other=-1)


@triton.jit(do_not_specialize=["num_tokens", "num_seqs", "max_blocks", "split_tokens", "num_splits"])
def _mla_kernel(
    q_latent_ptr, q_rope_ptr,  # [T, H, L], [T, H, R]
    kv_cache_ptr,  # [NB, BS, L + R]
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,  # [B, MB], [B], [B + 1] int32
    out_ptr, lse_ptr,  # [T, H, L]; [T, H] float32 (HAS_LSE)
    kv_scale_ptr,  # [] or [1] float32 (IS_FP8)
    part_out_ptr, part_lse_ptr,  # [T, S, H, L], [T, S, H] float32, lse in log2 (WRITE_PARTIAL)
    scale, unit,  # float; 1.0 (_fp8_to_fp16)
    split_tokens, num_splits, num_tokens, num_seqs, num_blocks, max_blocks,
    stride_ql_tok, stride_ql_head,
    stride_qr_tok, stride_qr_head,
    stride_kv_block, stride_kv_slot,
    stride_bt_seq, stride_bt_block,
    stride_sl, stride_qsl,
    stride_o_tok, stride_o_head,
    stride_lse_tok, stride_lse_head,
    stride_po_tok, stride_po_split, stride_po_head,
    stride_pl_tok, stride_pl_split,
    NUM_HEADS: tl.constexpr, HEADS: tl.constexpr,  # all heads; heads of one program
    LATENT: tl.constexpr, ROPE: tl.constexpr, L_HALF: tl.constexpr, R_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
    CAUSAL: tl.constexpr, IS_FP8: tl.constexpr, HAS_LSE: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    MERGE_GROUP: tl.constexpr,  # splits the combine kernel loads at once
    ONE_SPLIT: tl.constexpr,  # at most one split, merged in the program (no workspace)
    SCORES: tl.constexpr,  # "rows": rows x keys, chained; "keys": keys x rows, transposed; "split"
    HEAD_GROUP_FASTEST: tl.constexpr,  # grid (head group, query block, split), else (query block, head group, split)
    USE_PDL: tl.constexpr,  # the combine kernel may launch once the key loop is done (paged_attention._PDL)
):
    tl.static_assert(BLOCK_M >= 16 and TILE_N >= 16 and L_HALF >= 16 and R_PAD >= 16)
    tl.static_assert(L_HALF < LATENT and LATENT <= 2 * L_HALF)  # the first half is all latent
    tl.static_assert(BLOCK_Q * HEADS <= BLOCK_M and BLOCK_Q >= 1)
    tl.static_assert(SCORES == "rows" or SCORES == "keys" or SCORES == "split")
    scale = tl.cast(scale, tl.float32)
    if HEAD_GROUP_FASTEST:
        head_group = tl.program_id(0)
        pid_q = tl.program_id(1)
    else:
        pid_q = tl.program_id(0)
        head_group = tl.program_id(1)
    pid_s = tl.program_id(2)

    # -- which sequence, which of its query blocks; slots past the last sequence own the padding
    #    rows (a pseudo-sequence with no keys) --
    # The search of ``_find_sequence``, written out: a store address derived from the result of
    # a function that takes a pointer makes Inductor's kernel analysis count that pointer as
    # written, and query_start_loc would be cloned and copied back around every launch (and
    # CUDA graphs skipped for mutating an input).
    lo = tl.zeros([], dtype=tl.int32)
    hi = num_seqs + 1
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    seq = tl.maximum(lo - 1, 0)
    is_seq = seq < num_seqs
    if WRITE_PARTIAL:
        if seq >= num_seqs:
            return  # the combine kernel writes the padding rows
    q_start = tl.load(query_start_loc_ptr + seq * stride_qsl)
    q_end = tl.load(query_start_loc_ptr + (seq + 1) * stride_qsl, mask=is_seq, other=0)
    q_end = tl.where(is_seq, q_end, num_tokens)
    seq_len = tl.load(seq_lens_ptr + seq * stride_sl, mask=is_seq, other=0)
    q_len = q_end - q_start
    q_block_start = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if (q_block_start < 0) | (q_block_start >= q_len):
        return
    context = seq_len - q_len

    # -- rows: query token (row // HEADS) x head (row % HEADS) of this head group --
    offs_m = tl.arange(0, BLOCK_M)
    local = q_block_start + offs_m // HEADS
    head = head_group * HEADS + offs_m % HEADS
    tok = q_start + local
    row_ok = (offs_m // HEADS < BLOCK_Q) & (head < NUM_HEADS) & (local < q_len)
    row_ok = row_ok & (tok >= 0) & (tok < num_tokens)
    pos = context + local  # [BLOCK_M] absolute position of each row's token
    offs_h = tl.arange(0, L_HALF)  # columns of one latent half
    offs_r = tl.arange(0, R_PAD)
    hi_ok = offs_h < LATENT - L_HALF  # second-half columns inside the latent

    # -- load the queries once: latent halves [BLOCK_M, L_HALF] x 2, rope [BLOCK_M, R_PAD] --
    ql_rows = tok.to(tl.int64) * stride_ql_tok + head * stride_ql_head
    q_lo = _load_rows(q_latent_ptr, ql_rows, offs_h, row_ok, L_HALF, L_HALF)
    q_hi = _load_rows(q_latent_ptr + L_HALF, ql_rows, offs_h, row_ok, LATENT - L_HALF, L_HALF)
    qr_rows = tok.to(tl.int64) * stride_qr_tok + head * stride_qr_head
    q_rope = _load_rows(q_rope_ptr, qr_rows, offs_r, row_ok, ROPE, R_PAD)
    qk_scale = scale * LOG2E
    kv_scale = 1.0
    if IS_FP8:  # the row's one scale multiplies the scores and, through the values, the output
        kv_scale = tl.load(kv_scale_ptr)
        qk_scale = qk_scale * kv_scale
        if q_lo.dtype == tl.bfloat16:  # dots in fp16, fp8's one-instruction conversion target
            q_unit = _fp16_exponent(tl.maximum(tl.maximum(_abs_max(q_lo), _abs_max(q_hi)), _abs_max(q_rope)))
            q_lo = (q_lo.to(tl.float32) / q_unit).to(tl.float16)
            q_hi = (q_hi.to(tl.float32) / q_unit).to(tl.float16)
            q_rope = (q_rope.to(tl.float32) / q_unit).to(tl.float16)
            qk_scale = qk_scale * q_unit

    # -- keys this query block can see: [0, kv_hi); every row sees [0, full_hi) unmasked --
    p_first = context + q_block_start
    p_last = context + tl.minimum(q_block_start + BLOCK_Q, q_len) - 1
    kv_hi = tl.minimum(seq_len, max_blocks * BLOCK_SIZE)
    full_hi = p_first + _NO_LIMIT
    if CAUSAL:
        kv_hi = tl.minimum(kv_hi, p_last + 1)
        full_hi = tl.minimum(full_hi, p_first + 1)

    # -- splits: this program's one (WRITE_PARTIAL) or all of the sequence's, merged in order --
    seq_splits = tl.minimum((tl.maximum(seq_len, 0) + split_tokens - 1) // split_tokens, num_splits)
    if WRITE_PARTIAL:
        if pid_s >= seq_splits:
            return  # the combine kernel reads only the splits below seq_splits
        split_first = pid_s
        split_end = pid_s + 1
    else:  # as many (empty) splits past the end as the combine kernel merges, for the same bits
        split_first = 0
        split_end = (seq_splits + MERGE_GROUP - 1) // MERGE_GROUP * MERGE_GROUP
    merged_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    merged_l = tl.zeros([BLOCK_M], tl.float32)
    merged_lo = tl.zeros([BLOCK_M, L_HALF], tl.float32)
    merged_hi = tl.zeros([BLOCK_M, L_HALF], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_lo = tl.zeros([BLOCK_M, L_HALF], tl.float32)
    acc_hi = tl.zeros([BLOCK_M, L_HALF], tl.float32)
    bt_row = block_table_ptr + seq * stride_bt_seq
    # A tile inside one page reads one block id and addresses its rows from one base: sm_90,
    # Triton 3.6 (sass_report), instructions per loop iteration B64 x 4096 H128 1638 -> 982,
    # B128 x 4096 H16 1363 -> 779 (per-key block ids and 64-bit row addresses gone). Not timed.
    PAGE_TILE: tl.constexpr = BLOCK_SIZE % TILE_N == 0

    # ONE_SPLIT (at most one split, no workspace): the running state goes to the epilogue after
    # the loop, so the merge state is not live across it (B64 x 4096 H128, sm_90, Triton 3.6:
    # 784-byte stack and 326 local loads with it live; benchmarks/sass_report.py)
    for split in range(split_first, split_end):
        if not ONE_SPLIT:
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc_lo = tl.zeros([BLOCK_M, L_HALF], tl.float32)
            acc_hi = tl.zeros([BLOCK_M, L_HALF], tl.float32)
        lo = split * split_tokens
        hi = tl.minimum(kv_hi, (split + 1) * split_tokens)
        # Block ids one tile ahead: the row addresses depend on them. A tile inside one page
        # (PAGE_TILE: TILE_N divides BLOCK_SIZE, block 64 for DeepSeek) takes one id and one
        # base address; its rows are a fixed offset pattern from there.
        if PAGE_TILE:
            next_page = _load_page_id(bt_row, stride_bt_block, lo, seq_len, max_blocks, BLOCK_SIZE)
        else:
            next_block = _load_block_ids(bt_row, stride_bt_block, lo, seq_len, max_blocks, BLOCK_SIZE, TILE_N)
        for start in range(lo, hi, TILE_N):
            # -- block-table lookup: the tile's page, or [TILE_N] blocks --
            offs_n = start + tl.arange(0, TILE_N)
            if PAGE_TILE:
                page = next_page
                next_page = _load_page_id(bt_row, stride_bt_block, start + TILE_N, seq_len, max_blocks, BLOCK_SIZE)
                page_ok = (page >= 0) & (page < num_blocks)  # -1: past the sequence or the table
                # a select, not &: Triton's interpreter types (bool scalar & bool vector) as int
                key_ok = tl.where(page_ok, offs_n < seq_len, False)
                page = tl.where(page_ok, page, 0).to(tl.int64)
                slot = tl.zeros([], tl.int64) + start % BLOCK_SIZE  # int64 before the product
                tile_ptr = kv_cache_ptr + (page * stride_kv_block + slot * stride_kv_slot)
                rows = tl.arange(0, TILE_N).to(tl.int64) * stride_kv_slot
            else:
                block = next_block
                next_block = _load_block_ids(bt_row, stride_bt_block, start + TILE_N, seq_len, max_blocks,
                                             BLOCK_SIZE, TILE_N)
                key_ok = (block >= 0) & (block < num_blocks)  # -1: past the sequence or the table
                block = tl.where(key_ok, block, 0).to(tl.int64)
                tile_ptr = kv_cache_ptr
                rows = block * stride_kv_block + (offs_n % BLOCK_SIZE) * stride_kv_slot

            # -- load the cache rows: latent halves [TILE_N, L_HALF] x 2 (key part and value),
            #    rope [TILE_N, R_PAD] --
            c_lo = _load_rows(tile_ptr, rows, offs_h, key_ok, L_HALF, L_HALF)
            c_hi = _load_rows(tile_ptr + L_HALF, rows, offs_h, key_ok, LATENT - L_HALF, L_HALF)
            k_pe = _load_rows(tile_ptr + LATENT, rows, offs_r, key_ok, ROPE, R_PAD)
            if IS_FP8:  # exact: fp8 values are fp16 values; the scale is in qk_scale and the epilogue
                c_lo, c_hi = _fp8_to_fp16(c_lo, unit), _fp8_to_fp16(c_hi, unit)  # the values too
                k_pe = k_pe.to(tl.float16)
            c_lo, c_hi, k_pe = c_lo.to(q_lo.dtype), c_hi.to(q_lo.dtype), k_pe.to(q_lo.dtype)

            # -- scores (log2 domain): [BLOCK_M, TILE_N] --
            if SCORES == "keys":
                s = _dot(c_lo, tl.trans(q_lo), None, DOT_PRECISION, DOT_UPCAST)
                s = _dot(c_hi, tl.trans(q_hi), s, DOT_PRECISION, DOT_UPCAST)
                s = tl.trans(_dot(k_pe, tl.trans(q_rope), s, DOT_PRECISION, DOT_UPCAST)) * qk_scale
            elif SCORES == "split":
                s_lo = _dot(q_lo, tl.trans(c_lo), None, DOT_PRECISION, DOT_UPCAST)
                s_hi = _dot(q_hi, tl.trans(c_hi), None, DOT_PRECISION, DOT_UPCAST)
                s_pe = _dot(q_rope, tl.trans(k_pe), None, DOT_PRECISION, DOT_UPCAST)
                s = (s_lo * qk_scale + s_hi * qk_scale) + s_pe * qk_scale
            else:
                s = _dot(q_lo, tl.trans(c_lo), None, DOT_PRECISION, DOT_UPCAST)
                s = _dot(q_hi, tl.trans(c_hi), s, DOT_PRECISION, DOT_UPCAST)
                s = _dot(q_rope, tl.trans(k_pe), s, DOT_PRECISION, DOT_UPCAST) * qk_scale
            if CAUSAL:  # position masks only on tiles some row of the block sees in part
                if start + TILE_N > full_hi:
                    s = tl.where(offs_n[None, :] <= pos[:, None], s, float("-inf"))
            s = tl.where(key_ok[None, :], s, float("-inf"))

            # -- online softmax (the second half rescaled by the same factor); acc += P @ c --
            m_new, l_i, acc_lo, p = softmax_step(m_i, l_i, acc_lo, s)
            acc_hi = acc_hi * _rescale(m_i, m_new)[:, None]
            m_i = m_new
            p = p.to(q_lo.dtype)
            acc_lo = _dot(p, c_lo, acc_lo, DOT_PRECISION, DOT_UPCAST)
            acc_hi = _dot(p, c_hi, acc_hi, DOT_PRECISION, DOT_UPCAST)

        if USE_PDL:  # the key loop is done (paged_attention._PDL)
            gdc_launch_dependents()
        # -- this split's partial state: store it, or merge it into the running result --
        if not ONE_SPLIT:
            out_lo, part_lse = state_to_partial(m_i, l_i, acc_lo)
            out_hi, _ = state_to_partial(m_i, l_i, acc_hi)
            if WRITE_PARTIAL:
                po_rows = tok.to(tl.int64) * stride_po_tok + split * stride_po_split + head * stride_po_head
                po = part_out_ptr + po_rows[:, None]
                tl.store(po + offs_h[None, :], out_lo, mask=row_ok[:, None])
                tl.store(po + L_HALF + offs_h[None, :], out_hi, mask=row_ok[:, None] & hi_ok[None, :])
                pl_rows = tok.to(tl.int64) * stride_pl_tok + split * stride_pl_split + head
                tl.store(part_lse_ptr + pl_rows, part_lse, mask=row_ok)
            else:  # both halves merge with the weights of the state before this split
                _, _, merged_hi = merge_partial(merged_m, merged_l, merged_hi, part_lse, out_hi)
                merged_m, merged_l, merged_lo = merge_partial(merged_m, merged_l, merged_lo, part_lse, out_lo)

    if ONE_SPLIT:  # the same operations as one merged split (no split ran: the empty state)
        out_lo, part_lse = state_to_partial(m_i, l_i, acc_lo)
        out_hi, _ = state_to_partial(m_i, l_i, acc_hi)
        _, _, merged_hi = merge_partial(merged_m, merged_l, merged_hi, part_lse, out_hi)
        merged_m, merged_l, merged_lo = merge_partial(merged_m, merged_l, merged_lo, part_lse, out_lo)
    if not WRITE_PARTIAL:
        # -- epilogue: out [BLOCK_M, L] in two halves and lse [BLOCK_M], natural log --
        out_lo, lse = merged_to_output(merged_m, merged_l, merged_lo, kv_scale)
        out_hi, _ = merged_to_output(merged_m, merged_l, merged_hi, kv_scale)
        o = out_ptr + (tok.to(tl.int64) * stride_o_tok + head * stride_o_head)[:, None]
        tl.store(o + offs_h[None, :], out_lo.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.store(o + L_HALF + offs_h[None, :], out_hi.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & hi_ok[None, :])
        if HAS_LSE:
            tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_tok + head * stride_lse_head, lse, mask=row_ok)


def mla_decode(
    q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    **options,
) -> None:
    """MLA decode into ``out`` [T, H, L] and ``lse`` [T, H] (natural log, or None); semantics of
    ``lowering.reference.mla_decode``. Inputs were validated by the op. Options as
    ``prepare_mla_decode``."""
    args = (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse)
    prepare_mla_decode(*args, **options)(*args, options)


def prepare_mla_decode(
    q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    *,
    scale: float, causal: bool, kv_scale: Tensor | None,
    max_query_len: int = -1, split_tokens: int | None = None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(q_latent, q_rope,
    kv_cache, block_table, seq_lens, query_start_loc, out, lse, options)``, reading the tensor
    ``options["kv_scale"]``; everything else is decided here, from shapes only.

    ``max_query_len`` (a hint; -1: unknown) sizes the query block: 1 for plain decode, 2-4 for
    speculative tokens. ``split_tokens`` (tests, tuning) forces split-KV at multiples of that many
    key positions (rounded up to the tile).
    """
    num_tokens, num_heads, latent = q_latent.shape
    rope = q_rope.shape[2]
    num_blocks, block_size, _ = kv_cache.shape
    num_seqs, max_blocks = block_table.shape
    if num_tokens == 0 or num_heads == 0:
        return _nothing
    num_head_groups = cdiv(num_heads, _MAX_HEADS_PER_PROGRAM)
    heads = cdiv(num_heads, num_head_groups)
    invariant = _config.is_batch_invariant()
    if SM90_GLUON and not invariant and max_blocks * block_size >= _GLUON_MIN_KEYS:
        from . import mla_sm90, mla_sm90_narrow, mla_sm90_pair

        narrow_q = _narrow_query_block(q_latent, q_rope, kv_cache, heads, num_tokens, num_seqs, max_query_len,
                                       max_blocks * block_size)
        pair = False
        if mla_sm90.declines(q_latent, q_rope, kv_cache) is None:
            # one program a token and 64-head group; splits at multiples of its pair of tiles
            gluon = (0, num_tokens * num_head_groups, mla_sm90.SPLIT_KEYS)
        elif SM90_NARROW and mla_sm90_narrow.declines(q_latent, q_rope, kv_cache, narrow_q) is None:
            pair = _pair(q_latent, q_rope, kv_cache, narrow_q, num_tokens, num_seqs, max_query_len)
            gluon = (narrow_q, _busy_q_blocks(num_tokens, num_seqs, narrow_q, max_query_len),
                     mla_sm90_pair.SPLIT_KEYS if pair else mla_sm90_narrow.TILE_N)
        else:
            gluon = None
        if gluon is not None:
            block_q, programs, split_multiple = gluon
            forced = split_tokens is not None
            # split like the Triton kernel (one program per SM: 164-230 KB of shared memory each)
            split_tokens, num_splits, write_partial = _plan_splits(
                q_latent.device, programs, 1, max_blocks * block_size, split_multiple,
                num_tokens * num_heads * (latent + 1) * 4, split_tokens,
            )
            call = (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse)
            # The narrow kernels launch with programmatic dependent launch, split or not (their first
            # instruction waits for the kernels ahead of them, so that their launch and start overlap
            # those kernels' end), and signal after their key loops; the wide one does neither.
            # H100, CUDA-graph replays of back-to-back calls, us, without / with (three rounds,
            # benchmarks/results/gpu-2026-11-27d/logs/probe-pdl-2.txt): H16, 2 tokens B64 x 4096
            # 119.6-119.9 / 119.0-119.4, B32 x 8192 116.2-116.8 / 115.9-116.1, B128 x 4096 (unsplit)
            # 215.7-215.8 / 215.1-215.5, B8 x 4096 24.7-24.8 / 23.9-24.0; 1 token B64 x 4096
            # 112.3-112.4 / 111.7-111.8, B32 x 8192 111.1-111.7 / 110.5-111.0, B128 x 4096 208.5-209.6
            # / 207.7-208.0, B16 x 8192 60.9-61.2 / 60.4-60.6; the pair kernel, 4 tokens B32 x 4096
            # 74.0-74.1 / 73.3-73.6; the fp8 kernel, B128 x 4096 112.9-113.4 / 112.2-112.5, B8 x 4096
            # 17.2-17.6 / 17.0. The wide kernel signalling after its key loop: B1 x 32768 H128 49.3 /
            # 48.7 us against 43.2 without PDL, B4 x 16384 58.4 / 58.0 (gpu-2026-11-26c/logs/pdl-probe.txt).
            pdl = block_q > 0 and use_pdl(q_latent.device)
            fold = not forced and _fold(kv_cache, heads, block_q, programs, pair, num_splits)
            if num_splits == 1 or fold:
                return mla_sm90.prepare(scale=scale, causal=causal, split_tokens=_NO_SPLIT, call=call, block_q=block_q,
                                        pdl=pdl, pair=pair, fold=fold)
            if write_partial:
                narrow_partials = block_q > 0 and _NARROW_PARTIALS_IN_QUERY_DTYPE
                workspace = _Workspace(True, num_tokens, num_splits, num_heads, latent, q_latent.device,
                                       q_latent.dtype if narrow_partials else torch.float32)
                return mla_sm90.prepare(
                    scale=scale, causal=causal, split_tokens=split_tokens, call=call, workspace=workspace,
                    combine=_combine(workspace, split_tokens, num_splits, num_tokens, num_seqs, num_heads, latent,
                                     kv_cache.dtype in _FP8, seq_lens, query_start_loc, out, lse, pdl=pdl,
                                     all_splits=block_q > 0, tile=_COMBINE_TILE if block_q > 0 else 0),
                    block_q=block_q, pdl=pdl, pair=pair,
                )
    if invariant and split_tokens is None:
        split_tokens = _INVARIANT_SPLIT_TOKENS
    # Query tokens a program holds (always 1 in batch-invariant mode), next to the heads in
    # _MAX_BLOCK_M rows
    block_q = 1 if invariant else _query_block(heads, num_tokens, num_seqs, max_query_len, _MAX_BLOCK_M)
    block_m = max(16, next_power_of_2(heads * block_q))
    block_q = block_m // heads if block_q > 1 else 1
    is_fp8 = kv_cache.dtype in _FP8
    tile_n, num_warps, num_stages, programs_per_sm, scores, order = (_FP8_CONFIGS if is_fp8 else _CONFIGS)[block_m]
    if order not in ("queries", "heads"):
        raise ValueError(f"mla._CONFIGS[{block_m}]: GRID {order!r} is not 'queries' or 'heads'")
    if scores == "split" and not causal:  # no mask branch to part the dots (_CONFIGS): chained is cheaper
        scores = "rows"
    num_q_blocks = num_tokens // block_q + num_seqs + 1
    busy_q_blocks = _busy_q_blocks(num_tokens, num_seqs, block_q, max_query_len)
    split_tokens, num_splits, write_partial = _plan_splits(
        q_latent.device, busy_q_blocks * num_head_groups, programs_per_sm,
        max_blocks * block_size, tile_n, num_tokens * num_heads * (latent + 1) * 4, split_tokens,
    )
    device, has_lse = q_latent.device, lse is not None
    workspace = _Workspace(write_partial, num_tokens, num_splits, num_heads, latent, device)
    pdl = write_partial and use_pdl(device)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    sql, sqr, skv, sbt, so = q_latent.stride(), q_rope.stride(), kv_cache.stride(), block_table.stride(), out.stride()
    ssl, sqsl = seq_lens.stride(0), query_start_loc.stride(0)
    po_strides, pl_strides = workspace.po_strides, workspace.pl_strides
    # head group on axis 0 only where the query blocks fit axis 1 (the same results either way)
    head_group_fastest = order == "heads" and num_q_blocks <= _MAX_GRID_Y
    grid = (num_q_blocks, num_head_groups, num_splits if write_partial else 1)
    if head_group_fastest:
        grid = (num_head_groups, num_q_blocks, grid[2])
    # the stand-ins ``run`` passes for absent tensors (the launcher reads them off their targets)
    stand_ins = {
        name: same_as(target)
        for name, target, absent in (
            ("kv_scale_ptr", "q_latent_ptr", not is_fp8), ("lse_ptr", "out_ptr", not has_lse),
            ("part_out_ptr", "out_ptr", not write_partial), ("part_lse_ptr", "out_ptr", not write_partial),
        )
        if absent
    }
    # every launch argument but the tensors, decided once for all calls of this signature
    attention = launcher(
        _mla_kernel, grid, **stand_ins,
        scale=float(scale), unit=1.0,
        split_tokens=split_tokens, num_splits=num_splits, num_tokens=num_tokens, num_seqs=num_seqs,
        num_blocks=num_blocks, max_blocks=max_blocks,
        stride_ql_tok=sql[0], stride_ql_head=sql[1],
        stride_qr_tok=sqr[0], stride_qr_head=sqr[1],
        stride_kv_block=skv[0], stride_kv_slot=skv[1],
        stride_bt_seq=sbt[0], stride_bt_block=sbt[1],
        stride_sl=ssl, stride_qsl=sqsl,
        stride_o_tok=so[0], stride_o_head=so[1],
        stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        stride_po_tok=po_strides[0], stride_po_split=po_strides[1], stride_po_head=po_strides[2],
        stride_pl_tok=pl_strides[0], stride_pl_split=pl_strides[1],
        NUM_HEADS=num_heads, HEADS=heads,
        LATENT=latent, ROPE=rope, L_HALF=_pad(latent) // 2, R_PAD=_pad(rope),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n,
        CAUSAL=bool(causal), IS_FP8=is_fp8, HAS_LSE=lse is not None, WRITE_PARTIAL=write_partial,
        DOT_PRECISION="ieee" if q_latent.dtype == torch.float32 else "tf32",
        DOT_UPCAST=q_latent.dtype == torch.bfloat16 and _interpreted(),
        MERGE_GROUP=1 if split_tokens == _NO_SPLIT else _MERGE_GROUP,
        ONE_SPLIT=split_tokens == _NO_SPLIT and not write_partial,
        SCORES=scores, HEAD_GROUP_FASTEST=head_group_fastest, USE_PDL=pdl,
        num_warps=num_warps, num_stages=num_stages,
    )
    combine = _combine(workspace, split_tokens, num_splits, num_tokens, num_seqs, num_heads, latent, is_fp8,
                       seq_lens, query_start_loc, out, lse, pdl=pdl)

    def run(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        part_out, part_lse = workspace.tensors(out) if write_partial else (out, out)
        lse_t = lse if has_lse else out
        kv_scale = options["kv_scale"] if is_fp8 else q_latent
        attention(
            q_latent, q_latent_ptr=q_latent, q_rope_ptr=q_rope, kv_cache_ptr=kv_cache,
            block_table_ptr=block_table, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
            out_ptr=out, lse_ptr=lse_t, kv_scale_ptr=kv_scale, part_out_ptr=part_out, part_lse_ptr=part_lse,
        )
        if write_partial:
            combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse, kv_scale)

    return run


def _query_block(heads: int, num_tokens: int, num_seqs: int, max_query_len: int, max_rows: int) -> int:
    """Query tokens a program holds: 1 for decode, else the hint or, without one, the mean tokens
    per sequence (a shape: exact for uniform speculative batches), rounded up to a power of two,
    as far as they fit next to ``heads`` heads in ``max_rows`` rows (at least 1)."""
    per_seq = _tokens_per_seq(num_tokens, num_seqs, max_query_len)
    if per_seq <= 1:
        return 1
    return max(1, min(next_power_of_2(per_seq), max_rows // next_power_of_2(heads)))


def _pair(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, block_q: int, num_tokens: int, num_seqs: int,
          max_query_len: int) -> bool:
    """Whether the narrow kernel's programs of ``block_q`` query tokens run ``mla_sm90_pair``
    (the comment above ``SM90_PAIR``), from shapes only."""
    from . import mla_sm90_narrow, mla_sm90_pair

    if not SM90_PAIR or mla_sm90_pair.declines(q_latent, q_rope, kv_cache, block_q) is not None:
        return False
    per_seq = _tokens_per_seq(num_tokens, num_seqs, max_query_len)
    return kv_cache.shape[1] < mla_sm90_narrow.TILE_N or block_q == 1 or cdiv(per_seq, block_q) > 1


def _fold(kv_cache: Tensor, heads: int, block_q: int, programs: int, pair: bool, num_splits: int) -> bool:
    """Whether a narrow-kernel call that the default plan splits ``num_splits`` ways runs as pairs
    of CTAs (the comment above ``SM90_FOLD``), from shapes only (``programs``: its busy query
    blocks)."""
    from . import mla_sm90_narrow
    from .paged_attention import _num_sms  # (read when called, as _plan_splits reads it: one SM count)

    if not SM90_FOLD or num_splits != 2 or block_q < 1 or pair or kv_cache.dtype in _FP8:
        return False
    rows = mla_sm90_narrow.rows(heads, block_q)
    return rows <= 16 or 2 * programs >= _FOLD_MIN_COVER * _num_sms(kv_cache.device)


def _narrow_query_block(q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor, heads: int, num_tokens: int,
                        num_seqs: int, max_query_len: int, capacity: int) -> int:
    """Query tokens a narrow-kernel program holds (``mla_sm90_narrow``, ``mla_sm90_fp8``): as
    ``_query_block`` in 32 rows, or in 16 where the comment above ``_SHORT_SPLITS`` says, from
    shapes only (``capacity``: the block table's keys)."""
    from . import mla_sm90_fp8, mla_sm90_narrow

    block_q = _query_block(heads, num_tokens, num_seqs, max_query_len, mla_sm90_narrow.MAX_ROWS)
    block_16 = _query_block(heads, num_tokens, num_seqs, max_query_len, mla_sm90_fp8.ROWS)
    if block_16 == block_q:
        return block_q
    if kv_cache.dtype in _FP8:
        return block_16 if SM90_FP8 and mla_sm90_fp8.declines(q_latent, kv_cache, block_16) is None else block_q
    if kv_cache.shape[1] < mla_sm90_narrow.TILE_N and _pair(q_latent, q_rope, kv_cache, block_q, num_tokens, num_seqs,
                                                            max_query_len):
        return block_q  # mla_sm90_pair's 32-row programs (the comment above _SHORT_SPLITS)
    per_seq = _tokens_per_seq(num_tokens, num_seqs, max_query_len)
    programs = _busy_q_blocks(num_tokens, num_seqs, block_q, max_query_len)
    _, splits, _ = _plan_splits(q_latent.device, programs, 1, capacity, mla_sm90_narrow.TILE_N,
                                num_tokens * q_latent.shape[1] * (q_latent.shape[2] + 1) * 4, None)
    return block_16 if splits >= _SHORT_SPLITS and cdiv(per_seq, block_16) <= _MAX_READERS else block_q


def _combine(workspace: _Workspace, split_tokens: int, num_splits: int, num_tokens: int, num_seqs: int,
             num_heads: int, latent: int, is_fp8: bool, seq_lens: Tensor, query_start_loc: Tensor, out: Tensor,
             lse: Tensor | None, pdl: bool, all_splits: bool = False, tile: int = 0):
    """The combine kernel's launch for the partials in ``workspace`` (splits of ``split_tokens``
    keys): ``combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse,
    kv_scale=None)`` merges them into ``out`` and ``lse`` (None: not stored); ``pdl``: launched
    with programmatic dependent launch (``paged_attention.use_pdl``; the kernel before it signals);
    ``all_splits``: every token's splits were all written (the narrow Gluon kernel), so each token
    merges all of them without looking its sequence up; ``tile``: the largest slab a program
    (``paged_attention._combine_blocking``; the narrow kernels' calls pass ``_COMBINE_TILE``)."""
    device, has_lse = out.device, lse is not None
    po_strides, pl_strides = workspace.po_strides, workspace.pl_strides
    so, lse_strides = out.stride(), lse.stride() if has_lse else (0, 0)
    l_pad = _pad(latent)
    combine_grid, blocking = _combine_blocking(num_tokens, num_heads, l_pad, num_splits, device, tile)
    launch = launcher(
        _combine_kernel, combine_grid,
        split_tokens=split_tokens, long_split_tokens=split_tokens, long_from=_NO_SPLIT,
        num_splits=num_splits, num_tokens=num_tokens, num_seqs=num_seqs,
        num_heads=num_heads,
        stride_sl=seq_lens.stride(0), stride_qsl=query_start_loc.stride(0),
        stride_po_tok=po_strides[0], stride_po_split=po_strides[1], stride_po_head=po_strides[2],
        stride_pl_tok=pl_strides[0], stride_pl_split=pl_strides[1],
        stride_o_tok=so[0], stride_o_head=so[1],
        stride_lse_tok=lse_strides[0], stride_lse_head=lse_strides[1],
        HEAD_SIZE_V=latent, DV_PAD=l_pad,
        HAS_SINKS=False, IS_FP8=is_fp8, HAS_LSE=has_lse, MERGE_GROUP=_MERGE_GROUP, ALL_SPLITS=all_splits,
        **blocking,
        **pdl_options(pdl),
    )

    def combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse, kv_scale=None):
        launch(
            q_latent, part_out_ptr=part_out, part_lse_ptr=part_lse, seq_lens_ptr=seq_lens,
            query_start_loc_ptr=query_start_loc, sinks_ptr=q_latent,
            v_scale_ptr=kv_scale if kv_scale is not None else q_latent,
            out_ptr=out, lse_ptr=lse if has_lse else out,
        )

    return combine


def _nothing(*args) -> None:
    return None
