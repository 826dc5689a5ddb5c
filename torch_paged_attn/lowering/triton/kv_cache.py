"""Triton KV-cache kernels: write new tokens into a paged cache, read cached tokens back out.

Copies through an index, at the memory limit: a program moves BLOCK_R rows (token x kv head).

``_cache_write_kernel`` (``reshape_and_cache``, ``concat_and_cache_mla``), for each token t::

    s = slot_mapping[t]
    if 0 <= s < NB * BS:                    # negative: padding; past the cache: dropped
        key_cache[s // BS, s % BS] = q(key[t]); value_cache[s // BS, s % BS] = q(value[t])

``_gather_cache_kernel`` (``gather_cache``), for each row n < cu_seq_lens[-1] of out::

    i = the sequence with cu_seq_lens[i] <= n < cu_seq_lens[i + 1]   # binary search in-kernel
    p = seq_starts[i] + n - cu_seq_lens[i]
    out[n] = dq(kv_cache[block_table[i, p // BS], p % BS])           # 0 for a bad block id

Grid: axis 0 = tiles of BLOCK_R rows (``T' * Hkv`` rows written, ``N * H`` rows gathered), from
shapes only. Bytes moved: the rows read plus the rows written (fp8: one byte per cache element).
q = saturate(x / scale) to fp8, rounded to nearest even; dq = stored * scale (fp8 caches only).
Cache offsets are 64-bit; caches may be any strided view whose last dimension is contiguous.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from torch import Tensor

from ._launch import cdiv, launcher, next_power_of_2, same_as

_FLOAT = (torch.bfloat16, torch.float16, torch.float32)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# Elements per program and operand: BLOCK_R * next_pow2(D). Measured on an H200 (copy 4110 GB/s),
# CUDA-graph replay, 2026-11, Hkv 8, D 128: 1024 elements x 2 warps (two 16-byte loads per thread
# and operand): 8192 tokens bf16 18.7 us = 88 % of copy, fp8 cache 17.1 us = 72 %; 256 tokens
# 2.4 us. 4096 x 4: 83 %, 68 %, 2.7 us; 8 warps at 1024: 73 %.
_TILE_ELEMENTS = 1024
_NUM_WARPS = 2


def supports(op: str, facts: dict) -> str | None:
    if facts.get("dtype") not in _FLOAT:
        return f"{op}: the Triton kernel handles bf16/fp16/fp32 data, not {facts.get('dtype')}"
    cache_dtype = facts.get("cache_dtype")
    if cache_dtype not in _FLOAT + _FP8:
        return f"{op}: the Triton kernel handles bf16/fp16/fp32/fp8 caches, not {cache_dtype}"
    if cache_dtype in _FP8 and facts.get("device") == "cuda":
        # cvt.rn.satfinite to and from e4m3/e5m2 needs sm_89 (Ada, Hopper) or newer
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9):
            return f"{op}: fp8 caches need compute capability 8.9 or newer, got {capability}"
    return None


def _interpreted() -> bool:
    """True when triton.jit produced interpreter functions (TRITON_INTERPRET=1)."""
    return not isinstance(_cache_write_kernel, triton.runtime.jit.JITFunction)


# ---------------------------------------------------------------------------------------------
# conversions. The GPU's cvt.rn instructions round to nearest even (and .satfinite saturates);
# the interpreter's float -> fp8 cast neither rounds to nearest even nor carries into the
# exponent, reads fp8 NaN as a number, and truncates float32 -> bf16. Under the interpreter
# (EMULATE) the same bits are computed in integer arithmetic instead; on the GPU that path takes
# twice the hardware path's time (34 vs 17 us for 8192 tokens into an fp8 cache, H200).
# ---------------------------------------------------------------------------------------------


@triton.jit
def _quantize_fp8(x, scale, FP8_DTYPE: tl.constexpr, EMULATE: tl.constexpr):
    """``saturate(x / scale)`` in ``FP8_DTYPE``: x / scale in IEEE float32 (div_rn: Triton's
    ``/`` is approximate), clamped to the largest finite value, rounded to nearest even; NaN
    stays NaN (0x7F with x's sign), as torch's ``clamp(-max, max).to(fp8)`` does."""
    # mantissa bits, exponent bias, largest finite value
    MANT: tl.constexpr = 2 if FP8_DTYPE == tl.float8e5 else 3
    BIAS: tl.constexpr = 15 if FP8_DTYPE == tl.float8e5 else 7
    FP8_MAX: tl.constexpr = 57344.0 if FP8_DTYPE == tl.float8e5 else 448.0
    y = tl.math.div_rn(x.to(tl.float32), scale)
    # comparisons are false for NaN, so NaN passes both clamps unchanged
    y = tl.where(y > FP8_MAX, FP8_MAX, y)
    y = tl.where(y < -FP8_MAX, -FP8_MAX, y)
    if not EMULATE:
        return y.to(FP8_DTYPE)
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF  # |y| as float32 bits; <= FP8_MAX's bits unless NaN
    # -- normal fp8: round the float32 mantissa to MANT bits (a carry bumps the exponent) --
    SHIFT: tl.constexpr = 23 - MANT
    normal = (mag + ((1 << (SHIFT - 1)) - 1) + ((mag >> SHIFT) & 1)) >> SHIFT
    normal = normal - ((127 - BIAS) << MANT)
    # -- subnormal fp8: |y| in units of 2^(1 - BIAS - MANT), rounded to an integer <= 2^MANT --
    exp32 = mag >> 23
    sig = (mag & 0x7FFFFF) | 0x800000
    shift = tl.minimum((151 - BIAS - MANT) - exp32, 31)  # >= 24 - MANT here; 31 rounds to 0
    sub = (sig + ((1 << (shift - 1)) - 1) + ((sig >> shift) & 1)) >> shift
    code = tl.where(exp32 >= 128 - BIAS, normal, sub)
    code = tl.where(mag > 0x7F800000, 0x7F, code)
    return (code | sign).to(tl.uint8).to(FP8_DTYPE, bitcast=True)


@triton.jit
def _dequantize_fp8(x, scale, EMULATE: tl.constexpr):
    """``x * scale`` in float32 for an fp8 tile ``x`` (NaN and, for e5m2, inf preserved)."""
    if not EMULATE:
        return x.to(tl.float32) * scale
    b = x.to(tl.uint8, bitcast=True).to(tl.int32)
    if x.dtype == tl.float8e5:
        # e5m2 is the top byte of a float16
        v = (b << 8).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        mag = b & 0x7F
        # normal: exponent rebiased 7 -> 127, mantissa 3 -> 23 bits; subnormal: mag * 2^-9
        normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
        v = tl.where(mag >= 8, normal, mag.to(tl.float32) * 0.001953125)
        v = tl.where(mag == 0x7F, float("nan"), v)
        v = tl.where(b >= 0x80, -v, v)
    return v * scale


@triton.jit
def _cast_rtne(y, DTYPE: tl.constexpr, EMULATE: tl.constexpr):
    """float32 -> ``DTYPE``, rounded to nearest even (emulated for bf16 under the interpreter)."""
    if EMULATE and DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)  # NaN stays a (quiet) NaN
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)


# ---------------------------------------------------------------------------------------------
# cache writes: reshape_and_cache and concat_and_cache_mla
# ---------------------------------------------------------------------------------------------


@triton.jit
def _write_part(
    src_ptr,
    cache_ptr,
    scale,
    src_row,  # [BLOCK_R] int64 offsets of each row in src
    cache_row,  # [BLOCK_R] int64 offsets of each row's destination in the cache
    row_ok,  # [BLOCK_R] bool
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
    EMULATE: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (cols < D)[None, :]
    # -- load rows --
    x = tl.load(src_ptr + src_row[:, None] + cols[None, :], mask=mask)  # [BLOCK_R, BLOCK_D]
    # -- convert and store --
    if FP8:
        y = _quantize_fp8(x, scale, cache_ptr.dtype.element_ty, EMULATE)
    else:
        y = x.to(cache_ptr.dtype.element_ty)
    tl.store(cache_ptr + cache_row[:, None] + cols[None, :], y, mask=mask)


@triton.jit
def _cache_write_kernel(
    a_ptr,  # [T, H, DA]: key, or kv_c [T, DA] (H = 1)
    b_ptr,  # [T, H, DB]: value, or k_pe [T, DB]
    slot_mapping_ptr,  # [T'], T' <= T, int64 or int32
    a_cache_ptr,  # [NB, BS, H, DA]: key cache, or the MLA cache [NB, BS, DA + DB]
    b_cache_ptr,  # [NB, BS, H, DB]: value cache; None for MLA (b goes after a's columns)
    a_scale_ptr,  # [] or [1] float32, None unless FP8
    b_scale_ptr,  # [] or [1] float32, None unless FP8 (MLA: a's scale is used)
    num_tokens,  # T'
    num_slots,  # NB * BS
    block_size,
    stride_a_token,
    stride_a_head,
    stride_b_token,
    stride_b_head,
    stride_slot,
    stride_ac_block,
    stride_ac_slot,
    stride_ac_head,
    stride_bc_block,
    stride_bc_slot,
    stride_bc_head,
    NUM_HEADS: tl.constexpr,
    DA: tl.constexpr,
    DB: tl.constexpr,
    BLOCK_DA: tl.constexpr,
    BLOCK_DB: tl.constexpr,
    BLOCK_R: tl.constexpr,
    MLA: tl.constexpr,
    FP8: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """Axis 0: tiles of BLOCK_R rows of the row space [T' * H] (row = token * H + head)."""
    tl.static_assert(BLOCK_DA >= DA and BLOCK_DB >= DB)
    # -- rows of this tile and their slots --
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    token = rows // NUM_HEADS
    head = rows % NUM_HEADS
    in_range = token < num_tokens
    slot = tl.load(slot_mapping_ptr + token * stride_slot, mask=in_range, other=-1).to(tl.int64)
    # negative slots are padding; slots past the cache are dropped (memory safety, no debug mode)
    ok = in_range & (slot >= 0) & (slot < num_slots)
    block = slot // block_size
    offset = slot % block_size
    # -- scales: one float32 each, read here so they can change without recompiling --
    a_scale = 1.0
    b_scale = 1.0
    if FP8:
        a_scale = tl.load(a_scale_ptr).to(tl.float32)
        if MLA:
            b_scale = a_scale
        else:
            b_scale = tl.load(b_scale_ptr).to(tl.float32)
    # -- part a: key / kv_c --
    a_cache_row = block * stride_ac_block + offset * stride_ac_slot + head * stride_ac_head
    _write_part(
        a_ptr,
        a_cache_ptr,
        a_scale,
        token * stride_a_token + head * stride_a_head,
        a_cache_row,
        ok,
        DA,
        BLOCK_DA,
        FP8,
        EMULATE,
    )
    # -- part b: value / k_pe (MLA: in the same cache row, after a's DA columns) --
    if MLA:
        b_cache = a_cache_ptr + DA
        b_cache_row = a_cache_row
    else:
        b_cache = b_cache_ptr
        b_cache_row = block * stride_bc_block + offset * stride_bc_slot + head * stride_bc_head
    _write_part(
        b_ptr,
        b_cache,
        b_scale,
        token * stride_b_token + head * stride_b_head,
        b_cache_row,
        ok,
        DB,
        BLOCK_DB,
        FP8,
        EMULATE,
    )


def _rows_per_tile(width: int) -> int:
    return max(1, _TILE_ELEMENTS // next_power_of_2(width))


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
) -> None:
    """``key_cache[s // BS, s % BS] = q(key[t])`` (and value) for ``s = slot_mapping[t] >= 0``.

    key ``[T, Hkv, D]``, value ``[T, Hkv, Dv]``, caches ``[NB, BS, Hkv, D|Dv]`` (last dim
    contiguous), slot_mapping ``[T' <= T]``; scales float32 ``[]``/``[1]``, read for fp8 caches.
    """
    args = (key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    prepare_reshape_and_cache(*args)(*args, {})


def prepare_reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(key, value, key_cache,
    value_cache, slot_mapping, k_scale, v_scale, options)``; grid and every launch argument but
    the tensors are decided here."""
    num_tokens = slot_mapping.shape[0]
    num_heads, head_size = key.shape[1], key.shape[2]
    head_size_v = value.shape[2]
    if num_tokens * num_heads == 0:
        return _nothing
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    fp8 = key_cache.dtype in _FP8
    block_r = _rows_per_tile(max(head_size, head_size_v))
    grid = (cdiv(num_tokens * num_heads, block_r),)
    sk, sv, skc, svc = key.stride(), value.stride(), key_cache.stride(), value_cache.stride()
    write = launcher(
        _cache_write_kernel,
        grid,
        # ``run`` passes None for the scales of a bf16/fp16/fp32 cache
        **({} if fp8 else {"a_scale_ptr": same_as(None), "b_scale_ptr": same_as(None)}),
        num_tokens=num_tokens,
        num_slots=num_blocks * block_size,
        block_size=block_size,
        stride_a_token=sk[0],
        stride_a_head=sk[1],
        stride_b_token=sv[0],
        stride_b_head=sv[1],
        stride_slot=slot_mapping.stride(0),
        stride_ac_block=skc[0],
        stride_ac_slot=skc[1],
        stride_ac_head=skc[2],
        stride_bc_block=svc[0],
        stride_bc_slot=svc[1],
        stride_bc_head=svc[2],
        NUM_HEADS=num_heads,
        DA=head_size,
        DB=head_size_v,
        BLOCK_DA=next_power_of_2(head_size),
        BLOCK_DB=next_power_of_2(head_size_v),
        BLOCK_R=block_r,
        MLA=False,
        FP8=fp8,
        EMULATE=_interpreted(),
        num_warps=_NUM_WARPS,
    )

    def run(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, options):
        write(
            key_cache,
            a_ptr=key,
            b_ptr=value,
            slot_mapping_ptr=slot_mapping,
            a_cache_ptr=key_cache,
            b_cache_ptr=value_cache,
            a_scale_ptr=k_scale if fp8 else None,
            b_scale_ptr=v_scale if fp8 else None,
        )

    def pin(key, value, key_cache, value_cache, slot_mapping):
        """``fire(key, value, slot_mapping, key_cache, value_cache)`` (the kernel's order): ``run``'s
        launch pinned (``_launch``'s "Pinned launches"; True when it launched, False where the
        cached launch does not apply to that call: call ``run``) for later plain eager calls whose
        tensors match these in type, dtype, device, sizes and strides (the caller checks:
        ``lowering.eager_planned``); None for an fp8 cache (its scales are tensors the pin does not
        take, so its launcher pins other parameters than ``_PINNED_WRITE``) or where the launcher
        has not yet launched these dtypes, 16-byte aligned, on the current device."""
        if getattr(write, "pinned", None) != _PINNED_WRITE:
            return None
        return write.pin(key_cache, key, value, slot_mapping, key_cache, value_cache)

    run.pin = pin
    return run


# The tensors of a cache write's pinned launch, in _cache_write_kernel's order (the scales, None
# for a bf16/fp16/fp32 cache, are not among them; the MLA form has no b_cache_ptr)
_PINNED_WRITE = ("a_ptr", "b_ptr", "slot_mapping_ptr", "a_cache_ptr", "b_cache_ptr")
_PINNED_WRITE_MLA = ("a_ptr", "b_ptr", "slot_mapping_ptr", "a_cache_ptr")


def _nothing(*args) -> None:
    return None


def concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    scale: Tensor | None,
) -> None:
    """``kv_cache[s // BS, s % BS] = q([kv_c[t] | k_pe[t]])`` for ``s = slot_mapping[t] >= 0``.

    kv_c ``[T, L]``, k_pe ``[T, R]``, kv_cache ``[NB, BS, L + R]`` (last dim contiguous).
    """
    args = (kv_c, k_pe, kv_cache, slot_mapping, scale)
    prepare_concat_and_cache_mla(*args)(*args, {})


def prepare_concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    scale: Tensor | None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(kv_c, k_pe, kv_cache,
    slot_mapping, scale, options)``."""
    num_tokens = slot_mapping.shape[0]
    latent, rope = kv_c.shape[1], k_pe.shape[1]
    if num_tokens == 0:
        return _nothing
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    fp8 = kv_cache.dtype in _FP8
    block_r = _rows_per_tile(max(latent, rope))
    grid = (cdiv(num_tokens, block_r),)
    write = launcher(
        _cache_write_kernel,
        grid,
        b_cache_ptr=None,
        b_scale_ptr=None,
        **({} if fp8 else {"a_scale_ptr": same_as(None)}),  # ``run`` passes None then
        num_tokens=num_tokens,
        num_slots=num_blocks * block_size,
        block_size=block_size,
        stride_a_token=kv_c.stride(0),
        stride_a_head=0,
        stride_b_token=k_pe.stride(0),
        stride_b_head=0,
        stride_slot=slot_mapping.stride(0),
        stride_ac_block=kv_cache.stride(0),
        stride_ac_slot=kv_cache.stride(1),
        stride_ac_head=0,
        stride_bc_block=0,
        stride_bc_slot=0,
        stride_bc_head=0,
        NUM_HEADS=1,
        DA=latent,
        DB=rope,
        BLOCK_DA=next_power_of_2(latent),
        BLOCK_DB=next_power_of_2(rope),
        BLOCK_R=block_r,
        MLA=True,
        FP8=fp8,
        EMULATE=_interpreted(),
        num_warps=_NUM_WARPS,
    )

    def run(kv_c, k_pe, kv_cache, slot_mapping, scale, options):
        write(
            kv_cache,
            a_ptr=kv_c,
            b_ptr=k_pe,
            slot_mapping_ptr=slot_mapping,
            a_cache_ptr=kv_cache,
            a_scale_ptr=scale if fp8 else None,
        )

    def pin(kv_c, k_pe, kv_cache, slot_mapping):
        """``fire(kv_c, k_pe, slot_mapping, kv_cache)``: as ``prepare_reshape_and_cache``'s ``pin``."""
        if getattr(write, "pinned", None) != _PINNED_WRITE_MLA:
            return None
        return write.pin(kv_cache, kv_c, k_pe, slot_mapping, kv_cache)

    run.pin = pin
    return run


# ---------------------------------------------------------------------------------------------
# cache reads: gather_cache
# ---------------------------------------------------------------------------------------------


@triton.jit
def _gather_cache_kernel(
    kv_cache_ptr,  # [NB, BS, H, D], or [NB, BS, W] (H = 1, D = W)
    block_table_ptr,  # [B, MB] int32
    cu_seq_lens_ptr,  # [B + 1] int32
    seq_starts_ptr,  # [B] int32, None when every sequence starts at 0
    out_ptr,  # [N, H, D], or [N, W]
    scale_ptr,  # [] or [1] float32, None unless FP8
    num_out_rows,  # N
    num_seqs,  # B
    max_blocks,  # MB
    num_blocks,  # NB
    block_size,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_bt_seq,
    stride_bt_block,
    stride_cu,
    stride_starts,
    stride_out_row,
    stride_out_head,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    FP8: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """Axis 0: tiles of BLOCK_R rows of the row space [N * H] (row = out row * H + head)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    n = rows // NUM_HEADS
    head = rows % NUM_HEADS
    in_out = n < num_out_rows
    # -- the sequence of each row: seq = #{i in 1..B : cu[i] <= n}, by binary search --
    step = 1
    while step <= num_seqs:
        step *= 2
    seq = tl.zeros([BLOCK_R], dtype=tl.int32)
    while step > 0:
        cand = seq + step
        v = tl.load(cu_seq_lens_ptr + cand * stride_cu, mask=in_out & (cand <= num_seqs), other=0)
        seq = tl.where((cand <= num_seqs) & (v <= n), cand, seq)
        step = step // 2
    seq = tl.minimum(seq, num_seqs - 1)
    start = tl.load(cu_seq_lens_ptr + seq * stride_cu, mask=in_out, other=0)
    total = tl.load(cu_seq_lens_ptr + num_seqs * stride_cu)
    local = n - start
    # rows past cu_seq_lens[-1] are left untouched
    valid = in_out & (n < total) & (local >= 0)
    # -- the cache slot of each row: position p of sequence seq --
    pos = local
    if HAS_STARTS:
        pos += tl.load(seq_starts_ptr + seq * stride_starts, mask=valid, other=0)
    block = pos // block_size  # pos >= 0 wherever in_table holds, so // is floor division
    in_table = valid & (pos >= 0) & (block < max_blocks)
    block_id = tl.load(
        block_table_ptr + seq.to(tl.int64) * stride_bt_seq + block * stride_bt_block,
        mask=in_table,
        other=-1,
    ).to(tl.int64)
    ok = in_table & (block_id >= 0) & (block_id < num_blocks)
    offset = pos - block * block_size
    # -- load the rows (0 for a bad block id, as the reference writes), dequantise, store --
    cols = tl.arange(0, BLOCK_D)
    col_ok = (cols < HEAD_SIZE)[None, :]
    src = block_id * stride_kc_block + offset * stride_kc_slot + head * stride_kc_head
    x = tl.load(
        kv_cache_ptr + src[:, None] + cols[None, :], mask=ok[:, None] & col_ok, other=0.0
    )  # [BLOCK_R, BLOCK_D]
    if FP8:
        y = _dequantize_fp8(x, tl.load(scale_ptr).to(tl.float32), EMULATE)
    else:
        y = x.to(tl.float32)
    dst = n * stride_out_row + head * stride_out_head
    tl.store(
        out_ptr + dst[:, None] + cols[None, :],
        _cast_rtne(y, out_ptr.dtype.element_ty, EMULATE),
        mask=valid[:, None] & col_ok,
    )


def gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None,
) -> None:
    """Rows ``cu_seq_lens[i] .. cu_seq_lens[i+1]`` of ``out`` ``[N, W]``/``[N, H, D]`` get tokens
    ``seq_starts[i] ..`` of sequence i from ``kv_cache`` ``[NB, BS, W]``/``[NB, BS, H, D]``."""
    args = (kv_cache, block_table, cu_seq_lens, seq_starts, out, scale)
    prepare_gather_cache(*args)(*args, {})


def prepare_gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None,
) -> Callable[..., None]:
    """The runner of calls shaped like this one (``lowering.plan``): ``run(kv_cache, block_table,
    cu_seq_lens, seq_starts, out, scale, options)``."""
    num_seqs, max_blocks = block_table.shape
    num_out_rows = out.shape[0]
    if num_seqs == 0 or num_out_rows == 0:
        return _nothing
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    four_d = kv_cache.dim() == 4
    num_heads = kv_cache.shape[2] if four_d else 1
    head_size = kv_cache.shape[-1]
    fp8 = kv_cache.dtype in _FP8
    block_r = _rows_per_tile(head_size)
    grid = (cdiv(num_out_rows * num_heads, block_r),)
    gather = launcher(
        _gather_cache_kernel,
        grid,
        # what ``run`` passes for absent tensors: no start offsets, no scale of a bf16/fp16/fp32 cache
        **({} if seq_starts is not None else {"seq_starts_ptr": same_as(None)}),
        **({} if fp8 else {"scale_ptr": same_as(None)}),
        num_out_rows=num_out_rows,
        num_seqs=num_seqs,
        max_blocks=max_blocks,
        num_blocks=num_blocks,
        block_size=block_size,
        stride_kc_block=kv_cache.stride(0),
        stride_kc_slot=kv_cache.stride(1),
        stride_kc_head=kv_cache.stride(2) if four_d else 0,
        stride_bt_seq=block_table.stride(0),
        stride_bt_block=block_table.stride(1),
        stride_cu=cu_seq_lens.stride(0),
        stride_starts=seq_starts.stride(0) if seq_starts is not None else 0,
        stride_out_row=out.stride(0),
        stride_out_head=out.stride(1) if four_d else 0,
        NUM_HEADS=num_heads,
        HEAD_SIZE=head_size,
        BLOCK_D=next_power_of_2(head_size),
        BLOCK_R=block_r,
        HAS_STARTS=seq_starts is not None,
        FP8=fp8,
        EMULATE=_interpreted(),
        num_warps=_NUM_WARPS,
    )

    def run(kv_cache, block_table, cu_seq_lens, seq_starts, out, scale, options):
        gather(
            out,
            kv_cache_ptr=kv_cache,
            block_table_ptr=block_table,
            cu_seq_lens_ptr=cu_seq_lens,
            seq_starts_ptr=seq_starts,
            out_ptr=out,
            scale_ptr=scale if fp8 else None,
        )

    return run
