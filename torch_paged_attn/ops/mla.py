"""``paged_attn::mla_decode``: multi-head latent attention over a paged latent cache."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .. import lowering
from ._checks import (
    CACHE_DTYPES,
    FLOAT_DTYPES,
    Checker,
    arg_types,
    check_arg_types,
    check_batch,
    check_positions,
    debug_check_batch,
    debug_checks_enabled,
    signature,
)
from ._library import declare, plain_eager


def _check_mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    kv_scale: Tensor | None,
    scale: float,
) -> None:
    op = "mla_decode"
    if not isinstance(q_latent, Tensor):
        raise TypeError(f"{op}: q_latent: expected a torch.Tensor, got {type(q_latent).__name__}")
    c = Checker(op, q_latent.device)
    c.tensor("q_latent", q_latent, dim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, latent = q_latent.shape
    c.tensor("q_rope", q_rope, dim=3, dtypes=(q_latent.dtype,))
    if tuple(q_rope.shape[:2]) != (num_tokens, num_heads):
        c.fail("q_rope", f"shape [{num_tokens}, {num_heads}, *] (q_latent's tokens and heads)", f"shape {list(q_rope.shape)}")
    rope = q_rope.shape[2]
    c.multiple("q_latent latent size", latent, 8, 8, 1024)
    c.multiple("q_rope rope size", rope, 8, 8, 256)
    c.tensor("kv_cache", kv_cache, dim=3, dtypes=CACHE_DTYPES)
    c.cache_blocks("kv_cache", kv_cache)
    num_blocks, block_size, width = kv_cache.shape
    if width != latent + rope:
        c.fail("kv_cache", f"row width {latent + rope} (latent {latent} + rope {rope})", f"{width}")
    c.cache_dtype("kv_cache", kv_cache, "q_latent", q_latent)
    c.multiple("kv_cache block_size", block_size, 8, 8, 4096)
    _, max_blocks = check_batch(c, block_table, seq_lens, query_start_loc)
    check_positions(c, num_tokens, max_blocks, block_size, "q_latent")
    c.scale("kv_scale", kv_scale, "kv_cache", kv_cache.dtype)
    if not math.isfinite(scale):
        c.fail("scale", "a finite float", str(scale))
    if debug_checks_enabled(q_latent, block_table, seq_lens, query_start_loc):
        debug_check_batch(c, block_table, seq_lens, query_start_loc, num_tokens, num_blocks, block_size)


@declare("mla_decode")
def _mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    causal: bool = True,
    kv_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    tensors = (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc)
    options = {"scale": scale, "causal": causal, "kv_scale": kv_scale}
    out, lse, run, _ = _mla_plan(tensors, options)
    run(*tensors, out, lse, options)
    return out, lse


def _mla_plan(tensors: tuple, options: dict) -> tuple[Tensor, Tensor, Callable, bool]:
    """``mla_decode``'s call validated (unless its signature was planned), its outputs allocated,
    and its runner: ``(out, lse, run, planned before)``."""
    q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc = tensors
    scale, causal, kv_scale = options["scale"], options["causal"], options["kv_scale"]
    # what validation reads, and causal: the key of the call's plan (lowering.plan)
    call = signature("mla_decode", (*tensors, kv_scale), (scale, causal))
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(*tensors):
        _check_mla_decode(*tensors, kv_scale, scale)
    num_tokens, num_heads, latent = q_latent.shape
    out = q_latent.new_empty(num_tokens, num_heads, latent)
    lse = q_latent.new_empty(num_tokens, num_heads, dtype=torch.float32)
    if run is not None:
        return out, lse, run, True

    def facts() -> dict:
        return {
            "device": q_latent.device.type,
            "dtype": q_latent.dtype,
            "cache_dtype": kv_cache.dtype,
            "latent": latent,
            "rope": q_rope.shape[2],
            "block_size": kv_cache.shape[1],
            "num_heads": num_heads,
            "causal": causal,
        }

    return out, lse, lowering.plan("mla_decode", call, facts, (*tensors, out, lse), options), False


_MLA_TYPES = arg_types(
    ("q_latent", "tensor"),
    ("q_rope", "tensor"),
    ("kv_cache", "tensor"),
    ("block_table", "tensor"),
    ("seq_lens", "tensor"),
    ("query_start_loc", "tensor"),
    ("scale", "float"),
    ("causal", "bool"),
    ("kv_scale", "tensor?"),
)


def mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    scale: float,
    causal: bool = True,
    kv_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Absorbed multi-head latent attention (DeepSeek MLA) decode over a paged latent cache.

    Every head attends to the same cache rows ``[c_j | k_pe_j]`` (latent ``L`` + rope ``R``)::

        s_j = scale * (q_latent . c_j + q_rope . k_pe_j),   out = softmax(s) @ c

    Shapes: ``T`` query tokens, ``H`` heads, ``B`` sequences, ``NB`` blocks, ``BS`` block size.

    Args:
        q_latent: ``[T, H, L]`` bf16/fp16/fp32, queries already multiplied by W_UK (absorbed).
        q_rope: ``[T, H, R]``, the rotary part, same dtype.
        kv_cache: ``[NB, BS, L + R]``, the query's dtype or fp8; row = ``[latent | rope]``.
        block_table, seq_lens, query_start_loc: as :func:`paged_attention`; several query tokens
            per sequence (speculative decoding) attend causally, bottom-right aligned.
        scale: score scale (DeepSeek uses ``1/sqrt(qk_nope_head_dim + qk_rope_head_dim)``).
        causal: mask keys after each token's position.
        kv_scale: float32, one element, required for an fp8 cache.

    Returns:
        ``(out [T, H, L]`` in the query's dtype, ``lse [T, H]`` float32, natural log``)``.

    See DESIGN.md for the contract (positions, padding rows, fp8, NaN, errors, backends).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> cache = torch.randn(4, 16, 512 + 64)
        >>> ql, qr = torch.randn(1, 8, 512), torch.randn(1, 8, 64)
        >>> bt = torch.tensor([[2, 0]], dtype=torch.int32)
        >>> out, lse = pa.mla_decode(ql, qr, cache, bt, torch.tensor([20], dtype=torch.int32),
        ...                          torch.tensor([0, 1], dtype=torch.int32), scale=0.07)
        >>> out.shape
        torch.Size([1, 8, 512])
    """
    eager = plain_eager(q_latent)
    if eager:  # a repeated call: straight to allocation and launch (see lowering.eager_planned)
        key = ("mla_decode", q_latent.shape[:1], scale, causal, scale.__class__, causal.__class__, kv_scale is None)
        checked = (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc)
        if kv_scale is not None:
            checked += (kv_scale,)
        hit = lowering.eager_planned(key, checked)
        if hit is not None:
            run, options, out_size, lse_size, lse_like = hit
            if kv_scale is not None:
                options = {**options, "kv_scale": kv_scale}
            out, lse = q_latent.new_empty(*out_size), lse_like.new_empty(*lse_size)
            run(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, out, lse, options)
            return out, lse
    check_arg_types(
        "mla_decode",
        _MLA_TYPES,
        (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc, scale, causal, kv_scale),
    )
    if not eager:  # through the dispatcher (tracing, modes)
        return _mla_decode(
            q_latent,
            q_rope,
            kv_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale=scale,
            causal=causal,
            kv_scale=kv_scale,
        )
    # the op's body, as declare's plain eager path runs it
    tensors = (q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc)
    options = {"scale": scale, "causal": causal, "kv_scale": kv_scale}
    out, lse, run, planned_before = _mla_plan(tensors, options)
    run(*tensors, out, lse, options)
    if planned_before:  # a signature that recurs: remembered for the path above
        lowering.remember(key, checked, (run, {**options, "kv_scale": None}, tuple(out.shape), tuple(lse.shape),
                                         lse.new_empty(0)))
    return out, lse
