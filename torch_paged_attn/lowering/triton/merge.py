"""Triton kernel of ``merge_attn_states``: the exact 2-way merge of attention results over
disjoint key sets through their log-sum-exps (the state merge of FlashDecoding / cascade
attention), per row r = (token, head)::

    lp, ls = prefix_lse[r], suffix_lse[r]          # +inf is read as -inf: an empty part
    # a NaN lp or ls makes out[r] and lse[r] NaN
    m = max(lp, ls) (0 if both are -inf);  wp, ws = exp(lp - m), exp(ls - m)
    out[r] = (wp * prefix_out[r] + ws * suffix_out[r]) / (wp + ws)   # 0 when both are empty
    lse[r] = m + log(wp + ws)                                          # -inf when both are empty

An empty part's output row is never loaded (its masked load moves no bytes), so NaN or garbage
there cannot leak. Grid: axis 0 = tiles of BLOCK_R rows of the row space [T * H], from shapes.
Layouts: outputs ``[T, H, D]`` (last dim contiguous), LSEs ``[T, H]`` float32, any strides.
Bytes moved: 2 reads and 1 write of ``T * H * D`` elements, plus 3 x ``T * H`` float32 LSEs.

``merge_attn_states_n``: the same for N stacked parts ``outs [N, T, H, D]``, ``lses [N, T, H]``
(decode context parallelism: one part per rank). Same grid; per row, pass 1 takes
``m = max_i lses[i]`` over the parts, pass 2 sums ``exp(lses[i] - m) * outs[i]`` in part order
0..N-1 (a fixed order: the same bits for any grid or rank), then divides by the summed weights.
Bytes: N reads and 1 write of ``T * H * D`` elements, 2N reads (both passes) + 1 write of
``T * H`` float32 LSEs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from torch import Tensor

from ._launch import cdiv, launcher, next_power_of_2, same_as

_FLOAT = (torch.bfloat16, torch.float16, torch.float32)

# Elements per program and operand (BLOCK_R * next_pow2(D)). 8192 tokens x 32 heads x 128, bf16,
# H200 (copy 4110 GB/s), CUDA-graph replay, 2026-11: 1024 x 4 warps 50.9 us = 98 % of copy;
# 2048 x 4: 94 %; 4096 x 4: 95 %; 1024 x 8: 66 %.
_TILE_ELEMENTS = 1024
_NUM_WARPS = 4


def supports(op: str, facts: dict) -> str | None:
    if facts.get("dtype") not in _FLOAT:
        return f"{op}: the Triton kernel handles bf16/fp16/fp32 outputs, not {facts.get('dtype')}"
    return None


@triton.jit
def _merge_attn_states_kernel(
    prefix_out_ptr,  # [T, H, D]
    prefix_lse_ptr,  # [T, H] float32
    suffix_out_ptr,  # [T, H, D]
    suffix_lse_ptr,  # [T, H] float32
    out_ptr,  # [T, H, D]
    lse_ptr,  # [T, H] float32, None when not asked for
    num_rows,  # T * H
    stride_po_token,
    stride_po_head,
    stride_pl_token,
    stride_pl_head,
    stride_so_token,
    stride_so_head,
    stride_sl_token,
    stride_sl_head,
    stride_out_token,
    stride_out_head,
    stride_lse_token,
    stride_lse_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    """Axis 0: tiles of BLOCK_R rows (row = token * H + head)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    token = rows // NUM_HEADS
    head = rows % NUM_HEADS
    row_ok = rows < num_rows
    # -- weights of the two parts --
    lp = tl.load(prefix_lse_ptr + token * stride_pl_token + head * stride_pl_head, mask=row_ok)
    ls = tl.load(suffix_lse_ptr + token * stride_sl_token + head * stride_sl_head, mask=row_ok)
    nan = (lp != lp) | (ls != ls)  # a NaN lse in either part: NaN out and lse for the row
    lp = tl.where(lp == float("inf"), float("-inf"), lp.to(tl.float32))
    ls = tl.where(ls == float("inf"), float("-inf"), ls.to(tl.float32))
    m = tl.maximum(lp, ls)
    m = tl.where(m == float("-inf"), 0.0, m)
    wp = tl.exp(lp - m)  # [BLOCK_R]; 0 exactly for an empty part
    ws = tl.exp(ls - m)
    denom = wp + ws
    safe = tl.where(denom > 0, denom, 1.0)
    cp = wp / safe
    cs = ws / safe
    # -- load only the non-empty parts' rows, merge, store --
    cols = tl.arange(0, BLOCK_D)
    col_ok = (cols < HEAD_SIZE)[None, :]
    use_p = (row_ok & (wp > 0))[:, None] & col_ok
    use_s = (row_ok & (ws > 0))[:, None] & col_ok
    po = prefix_out_ptr + (token * stride_po_token + head * stride_po_head)[:, None] + cols[None, :]
    so = suffix_out_ptr + (token * stride_so_token + head * stride_so_head)[:, None] + cols[None, :]
    p = tl.load(po, mask=use_p, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
    s = tl.load(so, mask=use_s, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_D]
    merged = tl.where(use_p, p * cp[:, None], 0.0) + tl.where(use_s, s * cs[:, None], 0.0)
    merged = tl.where(nan[:, None], float("nan"), merged)
    dst = (token * stride_out_token + head * stride_out_head)[:, None] + cols[None, :]
    tl.store(out_ptr + dst, merged.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok)
    if HAS_LSE:
        lse = tl.where(nan, float("nan"), tl.where(denom > 0, m + tl.log(safe), float("-inf")))
        tl.store(lse_ptr + token * stride_lse_token + head * stride_lse_head, lse, mask=row_ok)


def _tiles(head_size: int, num_rows: int) -> tuple[int, int, tuple[int]]:
    """``(BLOCK_D, BLOCK_R, grid)``: rows of ``head_size`` padded to a power of two, as many rows a
    program as fill ``_TILE_ELEMENTS``."""
    block_d = next_power_of_2(head_size)
    block_r = max(1, _TILE_ELEMENTS // block_d)
    return block_d, block_r, (cdiv(num_rows, block_r),)


def merge_attn_states(
    prefix_out: Tensor,
    prefix_lse: Tensor,
    suffix_out: Tensor,
    suffix_lse: Tensor,
    out: Tensor,
    lse: Tensor | None,
) -> None:
    """Merge two partial attention results ``[T, H, D]`` with LSEs ``[T, H]`` into ``out`` (and
    ``lse`` when given). An LSE of -inf or +inf marks an empty part, whose output is not read."""
    args = (prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)
    prepare_merge_attn_states(*args)(*args, {})


def prepare_merge_attn_states(
    prefix_out: Tensor,
    prefix_lse: Tensor,
    suffix_out: Tensor,
    suffix_lse: Tensor,
    out: Tensor,
    lse: Tensor | None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(prefix_out, prefix_lse,
    suffix_out, suffix_lse, out, lse, options)``."""
    num_tokens, num_heads, head_size = prefix_out.shape
    num_rows = num_tokens * num_heads
    if num_rows == 0:
        return _nothing
    block_d, block_r, grid = _tiles(head_size, num_rows)
    spo, spl, sso, ssl, so = prefix_out.stride(), prefix_lse.stride(), suffix_out.stride(), suffix_lse.stride(), out.stride()
    merge = launcher(
        _merge_attn_states_kernel,
        grid,
        **({} if lse is not None else {"lse_ptr": same_as(None)}),  # ``run`` passes None then
        num_rows=num_rows,
        stride_po_token=spo[0],
        stride_po_head=spo[1],
        stride_pl_token=spl[0],
        stride_pl_head=spl[1],
        stride_so_token=sso[0],
        stride_so_head=sso[1],
        stride_sl_token=ssl[0],
        stride_sl_head=ssl[1],
        stride_out_token=so[0],
        stride_out_head=so[1],
        stride_lse_token=lse.stride(0) if lse is not None else 0,
        stride_lse_head=lse.stride(1) if lse is not None else 0,
        NUM_HEADS=num_heads,
        HEAD_SIZE=head_size,
        BLOCK_D=block_d,
        BLOCK_R=block_r,
        HAS_LSE=lse is not None,
        num_warps=_NUM_WARPS,
    )

    def run(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse, options):
        merge(
            out,
            prefix_out_ptr=prefix_out,
            prefix_lse_ptr=prefix_lse,
            suffix_out_ptr=suffix_out,
            suffix_lse_ptr=suffix_lse,
            out_ptr=out,
            lse_ptr=lse,
        )

    return run


def _nothing(*args) -> None:
    return None


@triton.jit
def _merge_attn_states_n_kernel(
    outs_ptr,  # [N, T, H, D]
    lses_ptr,  # [N, T, H] float32
    out_ptr,  # [T, H, D]
    lse_ptr,  # [T, H] float32, None when not asked for
    num_parts,  # N, a runtime loop bound: no recompile per world size
    num_rows,  # T * H
    stride_os_part,
    stride_os_token,
    stride_os_head,
    stride_ls_part,
    stride_ls_token,
    stride_ls_head,
    stride_out_token,
    stride_out_head,
    stride_lse_token,
    stride_lse_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    """Axis 0: tiles of BLOCK_R rows (row = token * H + head); a loop over the N parts."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    token = rows // NUM_HEADS
    head = rows % NUM_HEADS
    row_ok = rows < num_rows
    lse_off = token * stride_ls_token + head * stride_ls_head  # [BLOCK_R]
    out_off = (token * stride_os_token + head * stride_os_head)[:, None]  # [BLOCK_R, 1]
    cols = tl.arange(0, BLOCK_D)
    col_ok = (cols < HEAD_SIZE)[None, :]
    # -- pass 1: the largest LSE of each row over its non-empty parts --
    # part i sits at pointer + i * stride: walking pointers keep the offsets 64-bit
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    nan = tl.zeros([BLOCK_R], dtype=tl.int1)  # a NaN lse in any part: NaN out and lse for the row
    lse_part_ptr = lses_ptr + lse_off
    for _ in range(0, num_parts):
        lp = tl.load(lse_part_ptr, mask=row_ok, other=float("-inf"))
        nan = nan | (lp != lp)
        lp = tl.where(lp == float("inf"), float("-inf"), lp.to(tl.float32))
        m = tl.maximum(m, lp)
        lse_part_ptr += stride_ls_part
    m = tl.where(m == float("-inf"), 0.0, m)
    # -- pass 2: weighted sum in part order; an empty part's row is never loaded --
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    denom = tl.zeros([BLOCK_R], dtype=tl.float32)
    lse_part_ptr = lses_ptr + lse_off
    out_part_ptr = outs_ptr + out_off + cols[None, :]
    for _ in range(0, num_parts):
        lp = tl.load(lse_part_ptr, mask=row_ok, other=float("-inf"))
        lp = tl.where(lp == float("inf"), float("-inf"), lp.to(tl.float32))
        w = tl.exp(lp - m)  # [BLOCK_R]; 0 exactly for an empty part
        use = (row_ok & (w > 0))[:, None] & col_ok
        o = tl.load(out_part_ptr, mask=use, other=0.0)  # [BLOCK_R, BLOCK_D]
        acc += tl.where(use, o.to(tl.float32) * w[:, None], 0.0)
        denom += w
        lse_part_ptr += stride_ls_part
        out_part_ptr += stride_os_part
    # -- normalise, store --
    safe = tl.where(denom > 0, denom, 1.0)
    merged = tl.where(nan[:, None], float("nan"), acc / safe[:, None])
    dst = (token * stride_out_token + head * stride_out_head)[:, None] + cols[None, :]
    tl.store(out_ptr + dst, merged.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok)
    if HAS_LSE:
        lse = tl.where(nan, float("nan"), tl.where(denom > 0, m + tl.log(safe), float("-inf")))
        tl.store(lse_ptr + token * stride_lse_token + head * stride_lse_head, lse, mask=row_ok)


def merge_attn_states_n(outs: Tensor, lses: Tensor, out: Tensor, lse: Tensor | None) -> None:
    """Merge N partial attention results ``outs [N, T, H, D]`` with LSEs ``lses [N, T, H]`` into
    ``out [T, H, D]`` (and ``lse [T, H]`` when given). An LSE of -inf or +inf marks an empty part."""
    args = (outs, lses, out, lse)
    prepare_merge_attn_states_n(*args)(*args, {})


def prepare_merge_attn_states_n(outs: Tensor, lses: Tensor, out: Tensor, lse: Tensor | None) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(outs, lses, out, lse,
    options)``."""
    num_parts, num_tokens, num_heads, head_size = outs.shape
    num_rows = num_tokens * num_heads
    if num_rows == 0:
        return _nothing
    # the 2-way merge's tiles: N parts stream through one accumulator tile per program
    block_d, block_r, grid = _tiles(head_size, num_rows)
    sos, sls, so = outs.stride(), lses.stride(), out.stride()
    merge = launcher(
        _merge_attn_states_n_kernel,
        grid,
        **({} if lse is not None else {"lse_ptr": same_as(None)}),  # ``run`` passes None then
        num_parts=num_parts,
        num_rows=num_rows,
        stride_os_part=sos[0],
        stride_os_token=sos[1],
        stride_os_head=sos[2],
        stride_ls_part=sls[0],
        stride_ls_token=sls[1],
        stride_ls_head=sls[2],
        stride_out_token=so[0],
        stride_out_head=so[1],
        stride_lse_token=lse.stride(0) if lse is not None else 0,
        stride_lse_head=lse.stride(1) if lse is not None else 0,
        NUM_HEADS=num_heads,
        HEAD_SIZE=head_size,
        BLOCK_D=block_d,
        BLOCK_R=block_r,
        HAS_LSE=lse is not None,
        num_warps=_NUM_WARPS,
    )

    def run(outs, lses, out, lse, options):
        merge(out, outs_ptr=outs, lses_ptr=lses, out_ptr=out, lse_ptr=lse)

    return run
