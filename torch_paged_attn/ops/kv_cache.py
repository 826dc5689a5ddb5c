"""KV-cache ops: ``paged_attn::reshape_and_cache``, ``paged_attn::concat_and_cache_mla`` and
``paged_attn::gather_cache``. The first two write new tokens into the cache through a slot mapping;
the third reads cached tokens back out, dequantised."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import lowering
from ._checks import (
    CACHE_DTYPES,
    FP8_DTYPES,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    SLOT_DTYPES,
    Checker,
    arg_types,
    check_arg_types,
    debug_checks_enabled,
    signature,
)
from ._library import declare, plain_eager


def _check_slots(c: Checker, slot_mapping: Tensor, num_rows: int, num_slots: int, rows_arg: str) -> None:
    c.tensor("slot_mapping", slot_mapping, dim=1, dtypes=SLOT_DTYPES, last_contiguous=False)
    if slot_mapping.shape[0] > num_rows:
        c.fail(
            "slot_mapping",
            f"at most {num_rows} entries (the rows of {rows_arg})",
            f"{slot_mapping.shape[0]} entries",
        )
    if debug_checks_enabled(slot_mapping):
        slots = slot_mapping.long()
        c.value(slots < num_slots, "slot_mapping", f"slots < num_blocks * block_size = {num_slots}", slots)


# -- reshape_and_cache ------------------------------------------------------------------------


@declare("reshape_and_cache")
def _reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    tensors = (key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    run, _ = _reshape_plan(tensors)
    run(*tensors, {})


def _reshape_plan(tensors: tuple) -> tuple:
    """``(run, planned_before)``: the plan of a reshape_and_cache call of these ``tensors`` (its
    arguments, in order), validated where it is new (and at every call under
    ``TORCH_PAGED_ATTN_DEBUG=1``), and whether it existed before this call."""
    key, key_cache, slot_mapping = tensors[0], tensors[2], tensors[4]
    call = signature("reshape_and_cache", tensors)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(key, slot_mapping):
        _check_reshape_and_cache(*tensors)
    if run is not None:
        return run, True

    def facts() -> dict:
        return {"device": key.device.type, "dtype": key.dtype, "cache_dtype": key_cache.dtype}

    return lowering.plan("reshape_and_cache", call, facts, tensors, {}), False


def _check_reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
) -> None:
    op = "reshape_and_cache"
    if not isinstance(key, Tensor):
        raise TypeError(f"{op}: key: expected a torch.Tensor, got {type(key).__name__}")
    c = Checker(op, key.device)
    c.tensor("key", key, dim=3, dtypes=FLOAT_DTYPES)
    num_rows, num_kv_heads, head_size = key.shape
    c.tensor("value", value, dim=3, dtypes=(key.dtype,))
    if tuple(value.shape[:2]) != (num_rows, num_kv_heads):
        c.fail("value", f"shape [{num_rows}, {num_kv_heads}, *] (key's tokens and heads)", f"shape {list(value.shape)}")
    c.tensor("key_cache", key_cache, dim=4, dtypes=CACHE_DTYPES)
    c.cache_blocks("key_cache", key_cache)
    num_blocks, block_size = key_cache.shape[:2]
    c.tensor("value_cache", value_cache, dim=4, dtypes=(key_cache.dtype,))
    c.cache_dtype("key_cache", key_cache, "key", key)
    want_k = (num_blocks, block_size, num_kv_heads, head_size)
    if tuple(key_cache.shape) != want_k:
        c.fail("key_cache", f"shape [NB, BS, {num_kv_heads}, {head_size}] (key's heads and head size)", f"shape {list(key_cache.shape)}")
    want_v = (num_blocks, block_size, num_kv_heads, value.shape[2])
    if tuple(value_cache.shape) != want_v:
        c.fail("value_cache", f"shape {list(want_v)}", f"shape {list(value_cache.shape)}")
    c.distinct_slots("key_cache", key_cache)
    c.distinct_slots("value_cache", value_cache)
    c.scale("k_scale", k_scale, "key_cache", key_cache.dtype)
    c.scale("v_scale", v_scale, "value_cache", value_cache.dtype)
    _check_slots(c, slot_mapping, num_rows, num_blocks * block_size, "key")


_RESHAPE_TYPES = arg_types(
    ("key", "tensor"),
    ("value", "tensor"),
    ("key_cache", "tensor"),
    ("value_cache", "tensor"),
    ("slot_mapping", "tensor"),
    ("k_scale", "tensor?"),
    ("v_scale", "tensor?"),
)


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> None:
    """Write new tokens' keys and values into a paged cache, in place.

    ``key_cache[s // BS, s % BS] = key[t]`` (and likewise for values) with ``s = slot_mapping[t]``;
    fp8 caches store ``saturate(x / scale)``, rounded to nearest even.

    Args:
        key: ``[T, Hkv, D]``, value: ``[T, Hkv, Dv]``, bf16/fp16/fp32 (same dtype). Rows past
            ``len(slot_mapping)`` are padding and are not read.
        key_cache, value_cache: ``[NB, BS, Hkv, D]`` / ``[NB, BS, Hkv, Dv]``, the key's dtype or fp8;
            any strides with a contiguous last dimension.
        slot_mapping: ``[T']`` int64 (or int32), ``T' <= T``; a negative slot skips the token.
        k_scale, v_scale: float32, one element, required for fp8 caches.

    See DESIGN.md for the contract (fp8 rounding, padding slots, strided caches, errors).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> kc, vc = torch.zeros(4, 16, 2, 64), torch.zeros(4, 16, 2, 64)
        >>> k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
        >>> pa.reshape_and_cache(k, v, kc, vc, torch.tensor([17, -1, 5]))
        >>> torch.equal(kc[1, 1], k[0]) and torch.equal(vc[0, 5], v[2])
        True
    """
    plain = k_scale is None and v_scale is None and plain_eager(key)
    if plain:  # a repeated plain call: its plan's launch, pinned (see lowering.eager_planned)
        entry = ("reshape_and_cache", key.shape[:1])
        hit = lowering.eager_planned(entry, (key, value, key_cache, value_cache, slot_mapping))
        if hit is not None:
            run, fire = hit
            if fire is None or not fire(key, value, slot_mapping, key_cache, value_cache):
                run(key, value, key_cache, value_cache, slot_mapping, None, None, {})
            return
    check_arg_types(
        "reshape_and_cache",
        _RESHAPE_TYPES,
        (key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale),
    )
    if not plain:
        _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
        return
    # the op's body, as declare's plain eager path runs it, remembering a signature that recurs
    tensors = (key, value, key_cache, value_cache, slot_mapping, None, None)
    run, planned_before = _reshape_plan(tensors)
    run(*tensors, {})
    if planned_before:
        lowering.remember(entry, tensors[:5], (run, _pinned(run, tensors[:5])))


def _pinned(run, tensors: tuple):
    """The plan's pinned launch of these tensors (a cache write's ``run.pin``, lowering/triton/kv_cache.py),
    None where the plan has none."""
    pin = getattr(run, "pin", None)
    return None if pin is None else pin(*tensors)


# -- concat_and_cache_mla ---------------------------------------------------------------------


@declare("concat_and_cache_mla")
def _concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    scale: Tensor | None = None,
) -> None:
    tensors = (kv_c, k_pe, kv_cache, slot_mapping, scale)
    run, _ = _concat_plan(tensors)
    run(*tensors, {})


def _concat_plan(tensors: tuple) -> tuple:
    """``(run, planned_before)`` of a concat_and_cache_mla call, as ``_reshape_plan``."""
    kv_c, kv_cache, slot_mapping = tensors[0], tensors[2], tensors[3]
    call = signature("concat_and_cache_mla", tensors)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(kv_c, slot_mapping):
        _check_concat_and_cache_mla(*tensors)
    if run is not None:
        return run, True

    def facts() -> dict:
        return {"device": kv_c.device.type, "dtype": kv_c.dtype, "cache_dtype": kv_cache.dtype}

    return lowering.plan("concat_and_cache_mla", call, facts, tensors, {}), False


def _check_concat_and_cache_mla(
    kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, scale: Tensor | None
) -> None:
    op = "concat_and_cache_mla"
    if not isinstance(kv_c, Tensor):
        raise TypeError(f"{op}: kv_c: expected a torch.Tensor, got {type(kv_c).__name__}")
    c = Checker(op, kv_c.device)
    c.tensor("kv_c", kv_c, dim=2, dtypes=FLOAT_DTYPES)
    num_rows, latent = kv_c.shape
    c.tensor("k_pe", k_pe, dim=2, dtypes=(kv_c.dtype,))
    if k_pe.shape[0] != num_rows:
        c.fail("k_pe", f"{num_rows} rows (kv_c's rows)", f"shape {list(k_pe.shape)}")
    c.tensor("kv_cache", kv_cache, dim=3, dtypes=CACHE_DTYPES)
    c.cache_dtype("kv_cache", kv_cache, "kv_c", kv_c)
    c.cache_blocks("kv_cache", kv_cache)
    num_blocks, block_size, width = kv_cache.shape
    if width != latent + k_pe.shape[1]:
        c.fail("kv_cache", f"row width {latent + k_pe.shape[1]} (kv_c + k_pe)", str(width))
    c.distinct_slots("kv_cache", kv_cache)
    c.scale("scale", scale, "kv_cache", kv_cache.dtype)
    _check_slots(c, slot_mapping, num_rows, num_blocks * block_size, "kv_c")


_CONCAT_TYPES = arg_types(
    ("kv_c", "tensor"),
    ("k_pe", "tensor"),
    ("kv_cache", "tensor"),
    ("slot_mapping", "tensor"),
    ("scale", "tensor?"),
)


def concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    scale: Tensor | None = None,
) -> None:
    """Write new tokens' MLA latent and rope parts into a paged latent cache, in place:
    ``kv_cache[s // BS, s % BS] = [kv_c[t] | k_pe[t]]`` with ``s = slot_mapping[t]``.

    Args:
        kv_c: ``[T, L]``, k_pe: ``[T, R]``, bf16/fp16/fp32 (same dtype); rows past
            ``len(slot_mapping)`` are padding.
        kv_cache: ``[NB, BS, L + R]``, kv_c's dtype or fp8 (stored ``saturate(x / scale)``).
        slot_mapping: ``[T']`` int64 (or int32), ``T' <= T``; negative slots are skipped.
        scale: float32, one element, required for an fp8 cache.

    See DESIGN.md for the contract (fp8 rounding, padding slots, strided caches, errors).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> cache = torch.zeros(2, 16, 512 + 64)
        >>> c, pe = torch.randn(1, 512), torch.randn(1, 64)
        >>> pa.concat_and_cache_mla(c, pe, cache, torch.tensor([18]))
        >>> torch.equal(cache[1, 2], torch.cat([c[0], pe[0]]))
        True
    """
    plain = scale is None and plain_eager(kv_c)
    if plain:  # a repeated plain call: its plan's launch, pinned (see lowering.eager_planned)
        entry = ("concat_and_cache_mla", kv_c.shape[:1])
        hit = lowering.eager_planned(entry, (kv_c, k_pe, kv_cache, slot_mapping))
        if hit is not None:
            run, fire = hit
            if fire is None or not fire(kv_c, k_pe, slot_mapping, kv_cache):
                run(kv_c, k_pe, kv_cache, slot_mapping, None, {})
            return
    check_arg_types("concat_and_cache_mla", _CONCAT_TYPES, (kv_c, k_pe, kv_cache, slot_mapping, scale))
    if not plain:
        _concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale)
        return
    # the op's body, as declare's plain eager path runs it, remembering a signature that recurs
    tensors = (kv_c, k_pe, kv_cache, slot_mapping, None)
    run, planned_before = _concat_plan(tensors)
    run(*tensors, {})
    if planned_before:
        lowering.remember(entry, tensors[:4], (run, _pinned(run, tensors[:4])))


# -- gather_cache -----------------------------------------------------------------------------


@declare("gather_cache")
def _gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None = None,
) -> None:
    if scale is not None and isinstance(kv_cache, Tensor) and kv_cache.dtype not in FP8_DTYPES:
        scale = None  # ignored for bf16/fp16/fp32 caches
    tensors = (kv_cache, block_table, cu_seq_lens, seq_starts, out, scale)
    call = signature("gather_cache", tensors)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(kv_cache, block_table, cu_seq_lens):
        _check_gather_cache(*tensors)
    if run is None:
        def facts() -> dict:
            return {"device": kv_cache.device.type, "dtype": out.dtype, "cache_dtype": kv_cache.dtype}

        run = lowering.plan("gather_cache", call, facts, tensors, {})
    run(*tensors, {})


def _check_gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None,
) -> None:
    op = "gather_cache"
    if not isinstance(kv_cache, Tensor):
        raise TypeError(f"{op}: kv_cache: expected a torch.Tensor, got {type(kv_cache).__name__}")
    c = Checker(op, kv_cache.device)
    c.tensor("kv_cache", kv_cache, dtypes=CACHE_DTYPES)
    if kv_cache.dim() not in (3, 4):
        c.fail("kv_cache", "a 3-D [NB, BS, W] or 4-D [NB, BS, H, D] tensor", f"shape {list(kv_cache.shape)}")
    c.cache_blocks("kv_cache", kv_cache)
    c.tensor("block_table", block_table, dim=2, dtypes=INDEX_DTYPES, last_contiguous=False)
    num_seqs = block_table.shape[0]
    c.tensor("cu_seq_lens", cu_seq_lens, shape=(num_seqs + 1,), dtypes=INDEX_DTYPES, last_contiguous=False)
    if seq_starts is not None:
        c.tensor("seq_starts", seq_starts, shape=(num_seqs,), dtypes=INDEX_DTYPES, last_contiguous=False)
    c.tensor("out", out, shape=(None,) + tuple(kv_cache.shape[2:]), dtypes=FLOAT_DTYPES)
    c.scale("scale", scale, "kv_cache", kv_cache.dtype)
    if debug_checks_enabled(kv_cache, block_table, cu_seq_lens):
        cu = cu_seq_lens.long()
        c.value(cu[:1] == 0, "cu_seq_lens", "cu_seq_lens[0] == 0", cu[:1])
        c.value(cu[1:] >= cu[:-1], "cu_seq_lens", "non-decreasing values", cu[1:], offset=1)
        c.value(
            cu[-1:] <= out.shape[0],
            "cu_seq_lens",
            f"cu_seq_lens[-1] <= rows of out ({out.shape[0]})",
            cu[-1:],
            offset=num_seqs,
        )
        starts = seq_starts.long() if seq_starts is not None else torch.zeros_like(cu[1:])
        capacity = block_table.shape[1] * kv_cache.shape[1]
        lengths = cu[1:] - cu[:-1]
        ends = starts + lengths
        c.value(starts >= 0, "seq_starts", "non-negative starts", starts)
        c.value(ends <= capacity, "seq_starts", f"start + length <= block_table capacity {capacity}", ends)
        # the blocks a sequence reads: those holding tokens seq_starts[i] .. seq_starts[i] + len_i - 1
        block_size, num_blocks = kv_cache.shape[1], kv_cache.shape[0]
        idx = torch.arange(block_table.shape[1], device=cu.device)[None, :]
        first = (starts // block_size)[:, None]
        end = ((ends + block_size - 1) // block_size)[:, None]
        used = (idx >= first) & (idx < end) & (lengths > 0)[:, None]
        ids = block_table.long()
        c.value(
            ~used | ((ids >= 0) & (ids < num_blocks)),
            "block_table",
            f"block ids in [0, {num_blocks}) in the used part",
            ids,
        )


_GATHER_TYPES = arg_types(
    ("kv_cache", "tensor"),
    ("block_table", "tensor"),
    ("cu_seq_lens", "tensor"),
    ("seq_starts", "tensor?"),
    ("out", "tensor"),
    ("scale", "tensor?"),
)


def gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None = None,
) -> None:
    """Copy cached tokens of several sequences into one contiguous, dequantised buffer.

    Row ``cu_seq_lens[i] + r`` of ``out`` receives token ``seq_starts[i] + r`` of sequence ``i``
    (``r < cu_seq_lens[i+1] - cu_seq_lens[i]``); rows past ``cu_seq_lens[-1]`` are left untouched.
    Used for MLA chunked-prefill context and context parallelism.

    Args:
        kv_cache: ``[NB, BS, W]`` or ``[NB, BS, H, D]``, bf16/fp16/fp32 or fp8.
        block_table: ``[B, MB]`` int32.
        cu_seq_lens: ``[B + 1]`` int32, cumulative numbers of tokens to gather.
        seq_starts: ``[B]`` int32, first token gathered of each sequence (None: 0).
        out: ``[N, W]`` or ``[N, H, D]``, bf16/fp16/fp32, ``N >= cu_seq_lens[-1]``.
        scale: float32, one element, required for an fp8 cache.

    See DESIGN.md for the contract (fp8, padding, errors).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> cache = torch.randn(4, 16, 8)
        >>> out = torch.zeros(5, 8)
        >>> pa.gather_cache(cache, torch.tensor([[3, 1]], dtype=torch.int32),
        ...                 torch.tensor([0, 5], dtype=torch.int32),
        ...                 torch.tensor([14], dtype=torch.int32), out)
        >>> torch.equal(out[2], cache[1, 0])
        True
    """
    check_arg_types(
        "gather_cache", _GATHER_TYPES, (kv_cache, block_table, cu_seq_lens, seq_starts, out, scale)
    )
    _gather_cache(kv_cache, block_table, cu_seq_lens, seq_starts, out, scale)
