"""Two small Triton kernels around a FlashAttention call (lowering/flash.py), so that the call
costs two launches and no pass over its output: FlashAttention writes ``out`` in place, these
write what it leaves to the contract.

``guard_seq_lens``: grid (num_seqs,). Program ``b`` reads the used part of table row ``b``
(``cdiv(seq_lens[b], BS)`` entries, in chunks of ``BLOCK_PAGES``) and writes ``seq_lens[b]``, or 0
when an entry there is outside ``[0, NB)``: such a sequence attends to no key, and FlashAttention
(which reads only the used part of a row: ``flash_attn/cute/paged_kv.py``) never reads a block in
its place. As the Python loop::

    for b in range(num_seqs):
        used = block_table[b, : cdiv(seq_lens[b], BS)]
        guarded[b] = 0 if ((used < 0) | (used >= NB)).any() else seq_lens[b]

Bytes: the used table entries (4 B each) + 8 B per sequence.

``finish_rows``: grid (cdiv(T, BLOCK_T),). Rows ``t >= query_start_loc[-1]`` (padding, which
FlashAttention does not write) get ``out[t] = 0`` and ``lse[t] = -inf``; a program whose rows are
all below that reads one int and, with an LSE, copies it: ``lse[t, h] = src[h, t]`` (FA's
head-major ``[H, T]``; ``SRC_TOKEN_MAJOR`` for ``[T, H]``), ``+inf`` (FA2's empty row) -> ``-inf``.
Bytes: 4 + (with an LSE) 8 per (row, head) + the padding rows of ``out``; the output's real rows
are never touched. Not yet timed on a GPU (both are one launch; the torch formulation they
replace was about ten launches and, with the output copy, a read and a write of ``out``).
"""

from __future__ import annotations

import triton
import triton.language as tl

# A table row's used part in chunks of this many entries (decode at 32768 keys, BS 16: 2048
# entries, 4 chunks). Not yet timed on a GPU.
BLOCK_PAGES = 512
# Rows per program of finish_rows; heads and head size in one [BLOCK_H, BLOCK_D] tile loop.
BLOCK_T = 16


@triton.jit
def guard_seq_lens_kernel(
    block_table_ptr,  # [B, MB] int32
    seq_lens_ptr,  # [B] int32
    guarded_ptr,  # [B] int32, written
    stride_bt_seq,
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
):
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + b)
    pages = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    bad = 0
    for start in range(0, pages, BLOCK_PAGES):
        # -- one chunk of the used part of the row --
        offs = start + tl.arange(0, BLOCK_PAGES)
        ids = tl.load(block_table_ptr + b.to(tl.int64) * stride_bt_seq + offs, mask=offs < pages, other=0)
        bad += tl.sum(((ids < 0) | (ids >= num_blocks)).to(tl.int32), axis=0)
    tl.store(guarded_ptr + b, tl.where(bad > 0, 0, seq_len))


@triton.jit
def finish_rows_kernel(
    out_ptr,  # [T, H, Dv], padding rows written
    lse_ptr,  # [T, H] float32, written (HAS_LSE)
    src_ptr,  # FA's LSE: [H, T] or [T, H] (SRC_TOKEN_MAJOR), float32
    query_start_loc_ptr,  # [B + 1] int32
    num_seqs,
    num_tokens,
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
    SRC_TOKEN_MAJOR: tl.constexpr,
):
    pid = tl.program_id(0)
    last = tl.load(query_start_loc_ptr + num_seqs)  # rows >= last are padding
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    in_range = rows < num_tokens
    valid = rows < last
    if HAS_LSE:
        # -- the LSE, token-major, padding -inf --
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
    if pid * BLOCK_T + BLOCK_T > last:
        # -- padding rows of out: zeros (real rows are FlashAttention's, not touched) --
        pad = in_range & ~valid
        zero = tl.zeros((BLOCK_T, BLOCK_D), dtype=out_ptr.dtype.element_ty)
        for h in range(NUM_HEADS):
            for d0 in range(0, HEAD_SIZE_V, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                dst = out_ptr + rows.to(tl.int64)[:, None] * stride_o_tok + h * stride_o_head + cols[None, :]
                tl.store(dst, zero, mask=pad[:, None] & (cols < HEAD_SIZE_V)[None, :])
