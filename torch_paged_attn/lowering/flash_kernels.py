"""Two small Triton kernels around a FlashAttention call (lowering/flash.py): what FlashAttention
leaves to the contract, with no pass over its output. FA4 writing into ``out`` with no LSE asked
for (the common call) costs one launch beside FlashAttention's: ``before_call``.

``before_call``: grid (num_seqs + cdiv(T, BLOCK_T),) with ZERO_PADDING, else (num_seqs,).
Programs ``b < num_seqs`` guard the lengths: program ``b`` reads the used part of table row ``b``
(``cdiv(seq_lens[b], BS)`` entries, in chunks of ``BLOCK_PAGES``) and writes ``seq_lens[b]``, or 0
when an entry there is outside ``[0, NB)``: such a sequence attends to no key, and FlashAttention
(which reads only the used part of a row: ``flash_attn/cute/paged_kv.py``) never reads a block in
its place. Program ``num_seqs + i`` zeroes the padding rows (``t >= query_start_loc[-1]``, which
FlashAttention never writes) among rows ``[i * BLOCK_T, (i + 1) * BLOCK_T)``. As the Python loop::

    for b in range(num_seqs):
        used = block_table[b, : cdiv(seq_lens[b], BS)]
        guarded[b] = 0 if ((used < 0) | (used >= NB)).any() else seq_lens[b]
    out[query_start_loc[-1]:] = 0                                  # ZERO_PADDING

``after_call``: grid (cdiv(T, BLOCK_T),); launched only when it has work. HAS_LSE:
``lse[t, h] = src[h, t]`` (FA's head-major ``[H, T]``; ``SRC_TOKEN_MAJOR`` for ``[T, H]``), ``+inf``
(FA2's empty row) -> ``-inf``, padding rows ``-inf``. ZERO_PADDING: padding rows of ``out`` to 0,
for a call whose output went through FlashAttention's own buffer and a copy over all of ``out``.

Bytes: the used table entries (4 B each) + 8 B per sequence, 4 B per program, the padding rows of
``out``, and with an LSE 8 B per (row, head); the real rows of ``out`` are never touched. Not yet
timed on a GPU (the form before this one, a guard launch before the call and a padding / LSE
launch after it, cost FA4 B8 x 8192 Hq64 decode 131.3 us against 124.7 us called directly in
CUDA-graph replays, H100, 2026-11-23).
"""

from __future__ import annotations

import triton
import triton.language as tl

# A table row's used part in chunks of this many entries (decode at 32768 keys, BS 16: 2048
# entries, 4 chunks). Not yet timed on a GPU.
BLOCK_PAGES = 512
# Rows per padding / LSE program: padding rows in [BLOCK_T, BLOCK_D] tiles per head, the LSE in
# [BLOCK_T, BLOCK_H] tiles. A program with no padding row (and no LSE) reads 4 bytes and ends.
# Not yet timed on a GPU.
BLOCK_T = 16


@triton.jit
def _zero_padding_rows(
    out_ptr,
    rows,  # [BLOCK_T] row indices
    num_tokens,
    last,  # query_start_loc[-1]: rows >= last are padding
    stride_o_tok,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pad = (rows < num_tokens) & (rows >= last)
    zero = tl.zeros((BLOCK_T, BLOCK_D), dtype=out_ptr.dtype.element_ty)
    for h in range(NUM_HEADS):
        for d0 in range(0, HEAD_SIZE_V, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            dst = out_ptr + rows.to(tl.int64)[:, None] * stride_o_tok + h * stride_o_head + cols[None, :]
            tl.store(dst, zero, mask=pad[:, None] & (cols < HEAD_SIZE_V)[None, :])


@triton.jit
def before_call_kernel(
    block_table_ptr,  # [B, MB] int32
    seq_lens_ptr,  # [B] int32
    guarded_ptr,  # [B] int32, written
    out_ptr,  # [T, H, Dv], padding rows written (ZERO_PADDING)
    query_start_loc_ptr,  # [B + 1] int32
    num_seqs,
    num_tokens,
    num_blocks,
    stride_bt_seq,
    stride_bt_block,
    stride_sl,
    stride_qsl,
    stride_o_tok,
    stride_o_head,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ZERO_PADDING: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < num_seqs:
        # -- guard one sequence's length against the ids in the used part of its table row --
        seq_len = tl.load(seq_lens_ptr + pid * stride_sl)
        pages = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        bad = 0
        for start in range(0, pages, BLOCK_PAGES):
            offs = start + tl.arange(0, BLOCK_PAGES)
            row = block_table_ptr + pid.to(tl.int64) * stride_bt_seq
            ids = tl.load(row + offs.to(tl.int64) * stride_bt_block, mask=offs < pages, other=0)
            bad += tl.sum(((ids < 0) | (ids >= num_blocks)).to(tl.int32), axis=0)
        tl.store(guarded_ptr + pid, tl.where(bad > 0, 0, seq_len))
    else:
        if ZERO_PADDING:
            # -- padding rows among this program's BLOCK_T rows: zeros --
            first = (pid - num_seqs) * BLOCK_T
            last = tl.load(query_start_loc_ptr + num_seqs * stride_qsl)
            if first + BLOCK_T > last:
                rows = first + tl.arange(0, BLOCK_T)
                _zero_padding_rows(out_ptr, rows, num_tokens, last, stride_o_tok, stride_o_head, NUM_HEADS,
                                   HEAD_SIZE_V, BLOCK_T, BLOCK_D)


@triton.jit
def after_call_kernel(
    out_ptr,  # [T, H, Dv], padding rows written (ZERO_PADDING)
    lse_ptr,  # [T, H] float32, written (HAS_LSE; else None)
    src_ptr,  # FA's LSE: [H, T] or [T, H] (SRC_TOKEN_MAJOR), float32, contiguous (HAS_LSE; else None)
    query_start_loc_ptr,  # [B + 1] int32
    num_seqs,
    num_tokens,
    stride_qsl,
    stride_o_tok,
    stride_o_head,
    stride_lse_tok,
    stride_lse_head,
    stride_src_a,  # stride of src's first dimension
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LSE: tl.constexpr,
    ZERO_PADDING: tl.constexpr,
    SRC_TOKEN_MAJOR: tl.constexpr,
):
    pid = tl.program_id(0)
    last = tl.load(query_start_loc_ptr + num_seqs * stride_qsl)  # rows >= last are padding
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    if HAS_LSE:
        # -- the LSE, token-major, padding -inf --
        in_range = rows < num_tokens
        valid = rows < last
        for h0 in range(0, NUM_HEADS, BLOCK_H):
            heads = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
            m = in_range[:, None] & (heads < NUM_HEADS)[None, :]
            if SRC_TOKEN_MAJOR:
                src = src_ptr + rows.to(tl.int64)[:, None] * stride_src_a + heads[None, :]
            else:
                src = src_ptr + heads.to(tl.int64)[None, :] * stride_src_a + rows[:, None]
            x = tl.load(src, mask=m & valid[:, None], other=float("-inf"))  # [BLOCK_T, BLOCK_H]
            x = tl.where(x == float("inf"), float("-inf"), x)
            dst = lse_ptr + rows.to(tl.int64)[:, None] * stride_lse_tok + heads[None, :] * stride_lse_head
            tl.store(dst, x, mask=m)
    if ZERO_PADDING:
        if pid * BLOCK_T + BLOCK_T > last:
            # -- padding rows of out: zeros (real rows are FlashAttention's, not touched) --
            _zero_padding_rows(out_ptr, rows, num_tokens, last, stride_o_tok, stride_o_head, NUM_HEADS,
                               HEAD_SIZE_V, BLOCK_T, BLOCK_D)
