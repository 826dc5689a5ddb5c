"""``paged_attn::paged_attention`` and ``paged_attn::paged_attention_out``: declaration, checks,
and the public Python functions."""

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
    FAR,
    check_batch,
    check_positions,
    debug_check_batch,
    debug_checks_enabled,
    signature,
)
from ._library import declare, plain_eager


def _check_paged_attention(
    op: str,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    options: dict,
) -> Checker:
    """Shapes, dtypes and devices of one paged attention call (no tensor values are read)."""
    if not isinstance(query, Tensor):
        raise TypeError(f"{op}: query: expected a torch.Tensor, got {type(query).__name__}")
    c = Checker(op, query.device)
    c.tensor("query", query, dim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_size = query.shape
    c.tensor("key_cache", key_cache, dim=4, dtypes=CACHE_DTYPES)
    c.cache_blocks("key_cache", key_cache)
    num_blocks, block_size, num_kv_heads, key_head_size = key_cache.shape
    c.tensor("value_cache", value_cache, dim=4, dtypes=CACHE_DTYPES)
    c.same_dtype("value_cache", value_cache, "key_cache", key_cache)
    c.cache_dtype("key_cache", key_cache, "query", query)
    if tuple(value_cache.shape[:3]) != (num_blocks, block_size, num_kv_heads):
        c.fail(
            "value_cache",
            f"shape [{num_blocks}, {block_size}, {num_kv_heads}, *] (key_cache's first three dimensions)",
            f"shape {list(value_cache.shape)}",
        )
    if key_head_size != head_size:
        c.fail("key_cache", f"head size {head_size} (query's last dimension)", f"head size {key_head_size}")
    c.multiple("query head_size", head_size, 8, 8, 256)
    c.multiple("value_cache head_size", value_cache.shape[3], 8, 8, 256)
    c.multiple("key_cache block_size", block_size, 8, 8, 4096)
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        c.fail(
            "key_cache",
            f"a number of kv heads that divides the {num_heads} query heads",
            f"{num_kv_heads} kv heads",
        )
    _, max_blocks = check_batch(c, block_table, seq_lens, query_start_loc)
    check_positions(c, num_tokens, max_blocks, block_size, "query")
    if options["alibi_slopes"] is not None:
        c.tensor("alibi_slopes", options["alibi_slopes"], shape=(num_heads,), dtypes=(torch.float32,))
    if options["sinks"] is not None:
        c.tensor("sinks", options["sinks"], shape=(num_heads,), dtypes=FLOAT_DTYPES)
    c.scale("k_scale", options["k_scale"], "key_cache", key_cache.dtype)
    c.scale("v_scale", options["v_scale"], "value_cache", value_cache.dtype)
    for arg, lowest in (
        ("window_left", -1),
        ("window_right", -1),
        ("softcap", 0.0),
        ("attention_chunk_size", 0),
        ("max_query_len", -1),
    ):
        c.at_least(arg, options[arg], lowest)
    if not math.isfinite(options["scale"]):
        c.fail("scale", "a finite float", str(options["scale"]))
    if debug_checks_enabled(query, block_table, seq_lens, query_start_loc):
        debug_check_batch(
            c, block_table, seq_lens, query_start_loc, num_tokens, num_blocks, block_size
        )
        hint = options["max_query_len"]
        if hint > 0:  # a hint below the longest query would let a backend skip its rows
            lens = query_start_loc[1:].long() - query_start_loc[:-1].long()
            c.value(lens <= hint, "max_query_len", f"a bound of every query length (<= {hint})", lens)
    return c


def _signature(op: str, tensors: tuple, extra: tuple, options: dict, lse: bool) -> tuple | None:
    """Everything ``_check_paged_attention`` (and the out form's checks of ``extra``) reads, and
    what else a backend plans from (``causal``, whether an LSE is written): the key of the call's
    plan (``lowering.plan``)."""
    return signature(
        op,
        (*tensors, *extra, options["alibi_slopes"], options["sinks"], options["k_scale"], options["v_scale"]),
        (
            options["scale"],
            options["window_left"],
            options["window_right"],
            options["softcap"],
            options["attention_chunk_size"],
            options["max_query_len"],
            options["causal"],
            lse,
        ),
    )


def _block_row_major(cache: Tensor) -> bool:
    """Whether each block of a ``[NB, BS, H, D]`` cache is row-major ``[BS, H, D]`` (any block
    stride): FlashAttention's page layout; an HND view is not."""
    _, _, heads, size = cache.shape
    return cache.stride(3) == 1 and (heads == 1 or cache.stride(2) == size) and cache.stride(1) == heads * size


def _options(scale, causal, window_left, window_right, softcap, alibi_slopes, sinks, k_scale, v_scale,
             attention_chunk_size, max_query_len) -> dict:
    """The keyword options of one call, by name, as the backends take them.

    Integer options at or past ``FAR`` (2^29; ``2**31 - 1`` is a common "no limit") reach past
    every position of a valid call (at most 2^28 tokens and key positions, validated), so they
    become the value that means the same and that no backend's int32 arithmetic overflows on: a
    window side unbounded (-1), a chunk size ``FAR`` (chunk 0 for positions >= 0, chunk -1 for
    negative ones, as any larger size), a query-length hint none (-1). One comparison each on
    the common path (about 0.05 us a call on a 2-core CPU, within its noise)."""
    if window_left >= FAR or window_right >= FAR or attention_chunk_size >= FAR or max_query_len >= FAR:
        window_left = -1 if window_left >= FAR else window_left
        window_right = -1 if window_right >= FAR else window_right
        attention_chunk_size = min(attention_chunk_size, FAR)
        max_query_len = -1 if max_query_len >= FAR else max_query_len
    return {
        "scale": scale,
        "causal": causal,
        "window_left": window_left,
        "window_right": window_right,
        "softcap": softcap,
        "alibi_slopes": alibi_slopes,
        "sinks": sinks,
        "k_scale": k_scale,
        "v_scale": v_scale,
        "attention_chunk_size": attention_chunk_size,
        "max_query_len": max_query_len,
    }


def _plan(call: tuple | None, args: tuple, options: dict) -> Callable:
    """The runner of this call (``lowering.plan``), from its signature ``call``."""
    query, key_cache, value_cache, block_table, _, _, _, lse = args

    def facts() -> dict:
        return _facts(query, key_cache, value_cache, block_table, lse, options)

    return lowering.plan("paged_attention", call, facts, args, options)


def _facts(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, lse: Tensor | None,
           options: dict) -> dict:
    """The static facts of a call that backend selection reads (``lowering.select``)."""
    max_query_len = options["max_query_len"]
    num_seqs = block_table.shape[0]
    return {
        "device": query.device.type,
        "dtype": query.dtype,
        "cache_dtype": key_cache.dtype,
        "head_size": query.shape[2],
        "head_size_v": value_cache.shape[3],
        "block_size": key_cache.shape[1],
        "num_heads": query.shape[1],
        "num_kv_heads": key_cache.shape[2],
        # shapes "auto" decides on (lowering/flash.py): query tokens per sequence
        "query_tokens_per_seq": max_query_len if max_query_len > 0 else query.shape[0] // max(num_seqs, 1),
        "cache_nhd": _block_row_major(key_cache) and _block_row_major(value_cache),
        **{k: v for k, v in options.items() if not isinstance(v, Tensor)},
        "alibi": options["alibi_slopes"] is not None,
        "sinks": options["sinks"] is not None,
        "lse": lse is not None,
    }


@declare("paged_attention")
def _paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
    max_query_len: int = -1,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    options = _options(scale, causal, window_left, window_right, softcap, alibi_slopes, sinks, k_scale, v_scale,
                       attention_chunk_size, max_query_len)
    tensors = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc)
    out, lse, run, _ = _functional_plan(tensors, options, return_lse)
    run(*tensors, out, lse if return_lse else None, options)
    return out, lse


def _functional_plan(tensors: tuple, options: dict, return_lse: bool) -> tuple[Tensor, Tensor, Callable, bool]:
    """``paged_attention``'s call validated (unless its signature was planned), its outputs
    allocated, and its runner: ``(out, lse, run, planned before)``."""
    call = _signature("paged_attention", tensors, (), options, return_lse)
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(*tensors):
        _check_paged_attention("paged_attention", *tensors, options)
    query = tensors[0]
    num_tokens, num_heads, _ = query.shape
    out = query.new_empty(num_tokens, num_heads, tensors[2].shape[3])
    lse = query.new_empty((num_tokens, num_heads) if return_lse else (0,), dtype=torch.float32)
    if run is None:
        return out, lse, _plan(call, (*tensors, out, lse if return_lse else None), options), False
    return out, lse, run, True


@declare("paged_attention_out")
def _paged_attention_out(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    out: Tensor,
    lse: Tensor | None,
    scale: float,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
    max_query_len: int = -1,
) -> None:
    options = _options(scale, causal, window_left, window_right, softcap, alibi_slopes, sinks, k_scale, v_scale,
                       attention_chunk_size, max_query_len)
    tensors = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc)
    _out_plan(tensors, out, lse, options)[0](*tensors, out, lse, options)


def _out_plan(tensors: tuple, out: Tensor, lse: Tensor | None, options: dict) -> tuple[Callable, bool]:
    """``paged_attention_out``'s call validated (unless its signature was planned) and its runner:
    ``(run, planned before)``."""
    call = _signature("paged_attention_out", tensors, (out, lse), options, lse is not None)
    run = lowering.planned(call)
    if run is None or debug_checks_enabled(*tensors):
        c = _check_paged_attention("paged_attention_out", *tensors, options)
        query, value_cache = tensors[0], tensors[2]
        num_tokens, num_heads, _ = query.shape
        c.tensor("out", out, shape=(num_tokens, num_heads, value_cache.shape[3]), dtypes=(query.dtype,))
        if lse is not None:
            c.tensor("lse", lse, shape=(num_tokens, num_heads), dtypes=(torch.float32,), last_contiguous=False)
    if run is None:
        return _plan(call, (*tensors, out, lse), options), False
    return run, True


# Remembered plain calls (the functional form's without lse) launch through their plan's pin
# (False: through ``run``, as before it; benchmarks/results/gpu-2026-11-27i/probe_pin.py times both
# in one process).
_PIN = True


def _pinned(run: Callable, plain: bool, tensors: tuple, out: Tensor, lse: Tensor | None = None) -> Callable | None:
    """What a remembered plain call keeps besides ``run``: the plan's ``pin`` of these tensors
    (see lowering/triton/paged_attention.py; with the caller's ``lse`` for the out form that
    passes one), None where the plan has none. The entry's check (``lowering.eager_planned``) is
    what lets later calls use it."""
    pin = getattr(run, "pin", None) if plain and _PIN else None
    if pin is None:
        return None
    return pin(*tensors, out) if lse is None else pin(*tensors, out, lse)


def _without_tensors(options: dict) -> dict:
    """``options`` with its tensors (``alibi_slopes``, ``sinks``, ``k_scale``, ``v_scale``) None:
    what a remembered entry keeps (each call passes its own)."""
    return {k: None if isinstance(v, Tensor) else v for k, v in options.items()}


# Stand-ins for the optional tensors that are None among the tensors an eager entry checks
# (``lowering.eager_planned``; the entry's key says which are None), one per argument: a check
# fails on a tensor given twice.
_NO_LSE, _NO_ALIBI, _NO_SINKS, _NO_K_SCALE, _NO_V_SCALE = (torch.empty(0) for _ in range(5))


_BATCH_KINDS = (
    ("query", "tensor"),
    ("key_cache", "tensor"),
    ("value_cache", "tensor"),
    ("block_table", "tensor"),
    ("seq_lens", "tensor"),
    ("query_start_loc", "tensor"),
)
_OPTION_KINDS = (
    ("causal", "bool"),
    ("window_left", "int"),
    ("window_right", "int"),
    ("softcap", "float"),
    ("alibi_slopes", "tensor?"),
    ("sinks", "tensor?"),
    ("k_scale", "tensor?"),
    ("v_scale", "tensor?"),
    ("attention_chunk_size", "int"),
    ("max_query_len", "int"),
)
_PAGED_TYPES = arg_types(*_BATCH_KINDS, ("scale", "float?"), ("return_lse", "bool"), *_OPTION_KINDS)
_PAGED_OUT_TYPES = arg_types(
    *_BATCH_KINDS, ("out", "tensor"), ("lse", "tensor?"), ("scale", "float?"), *_OPTION_KINDS
)


def _default_scale(query: Tensor, scale: float | None) -> float:
    """``scale``, or 1 / sqrt(head size) for None (1.0 for a 0-D query or head size 0, which
    validation then rejects with its own message)."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(query.shape[-1]) if query.dim() and query.shape[-1] else 1.0


_ARGS_DOC = """
    Shapes: ``T`` query tokens, ``B`` sequences, ``Hq``/``Hkv`` query/kv heads, ``D``/``Dv`` key/value
    head sizes, ``NB`` cache blocks, ``BS`` block size, ``MB`` blocks per sequence in the table.

    Args:
        query: ``[T, Hq, D]`` bf16/fp16/fp32; the tokens of all sequences, one after another. May be a
            strided view whose last dimension is contiguous.
        key_cache: ``[NB, BS, Hkv, D]``, the query's dtype or fp8 (e4m3fn/e5m2). ``BS`` a multiple of 8.
            Any strides with a contiguous last dimension (a slice of a cross-layer cache, an HND view).
        value_cache: ``[NB, BS, Hkv, Dv]``, the dtype of ``key_cache``.
        block_table: ``[B, MB]`` int32; entry ``[i, k]`` is the cache block holding keys
            ``k*BS .. k*BS+BS-1`` of sequence ``i``. Entries past ``cdiv(seq_lens[i], BS)`` are never read.
        seq_lens: ``[B]`` int32, keys visible to each sequence (its context plus its new tokens).
        query_start_loc: ``[B + 1]`` int32, cumulative query lengths. Rows past ``query_start_loc[-1]``
            are padding: output 0, lse -inf.
        scale: score scale; ``None`` means ``1/sqrt(D)``.
        causal: mask keys after each token's position (bottom-right aligned, see below).
        window_left, window_right: sliding window; ``-1`` is unbounded, and so is any side past every
            position (``2**31 - 1`` included). A token at position ``p`` sees keys
            ``p - window_left .. p + window_right``. A window of ``w`` tokens is ``(w - 1, 0)``.
        softcap: ``> 0`` caps scores as ``softcap * tanh(s / softcap)``.
        alibi_slopes: ``[Hq]`` float32; adds ``slope[h] * (j - p)`` to the score of key ``j``.
        sinks: ``[Hq]``; a logit per head added to the softmax denominator only (not scaled).
        k_scale, v_scale: float32 tensors of one element, required for fp8 caches:
            a cache entry means ``stored * scale``.
        attention_chunk_size: ``c > 0`` restricts a token to keys of its own chunk of ``c`` positions
            (``p // c``, floor division; any size up to ``2**63 - 1``).
        max_query_len: optional hint, a bound of the batch's query lengths (1 for pure decode); ``<= 0``
            means none. A smaller value is a caller error (``TORCH_PAGED_ATTN_DEBUG=1`` reports it).

    Positions (sequence with ``seq_len = 6``, ``q_len = 2``: context 4, queries at ``p = 4, 5``)::

        keys j:      0 1 2 3 4 5
        query p=4:   x x x x x .      causal: j <= p
        query p=5:   x x x x x x
        window (2, 0) at p=5:  . . . x x x
"""


def paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
    max_query_len: int = -1,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    """Attention of ragged query tokens over a paged (block-table) KV cache: decode, prefill,
    chunked prefill and speculative verification in one call.

    For query token ``t`` of sequence ``i`` at position ``p`` and each visible key ``j``::

        s_j = scale * q_t . k_j   -> softcap -> + alibi_slope * (j - p) -> mask
        out_t = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)),  lse_t = log(exp(sink) + sum_j exp(s_j))
    {args}
    Returns:
        ``(out, lse)``: ``out [T, Hq, Dv]`` in the query's dtype; ``lse [T, Hq]`` float32, natural log,
        when ``return_lse`` (else a ``[0]`` tensor). A row with no visible key gets 0 and ``-inf``
        (or the sink's logit).

    See DESIGN.md for the contract (positions and masks, padding rows, fp8, NaN, errors, backends).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> kc = torch.randn(8, 16, 2, 64); vc = torch.randn(8, 16, 2, 64)
        >>> q = torch.randn(2, 4, 64)  # one decode token for each of 2 sequences
        >>> bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        >>> lens = torch.tensor([20, 7], dtype=torch.int32)
        >>> qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
        >>> out, lse = pa.paged_attention(q, kc, vc, bt, lens, qsl, return_lse=True)
        >>> out.shape, lse.shape
        (torch.Size([2, 4, 64]), torch.Size([2, 4]))
    """
    eager = plain_eager(query)
    if eager:  # a repeated call: straight to allocation and launch (see lowering.eager_planned)
        # The key and the checked tuple are written out here and in paged_attention_out: built by a
        # shared helper they cost 0.6-0.9 us more a call (null-launch host time, 2-core CPU,
        # 2026-11-24), on the path whose whole budget is 15 us.
        key = (
            "paged_attention", query.shape[:1], scale, causal, window_left, window_right, softcap,
            attention_chunk_size, max_query_len, return_lse, scale.__class__, causal.__class__,
            window_left.__class__, window_right.__class__, softcap.__class__, attention_chunk_size.__class__,
            max_query_len.__class__, return_lse.__class__,
            alibi_slopes is None, sinks is None, k_scale is None, v_scale is None,
        )
        plain = alibi_slopes is None and sinks is None and k_scale is None and v_scale is None
        checked = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc) if plain else (
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
            _NO_ALIBI if alibi_slopes is None else alibi_slopes, _NO_SINKS if sinks is None else sinks,
            _NO_K_SCALE if k_scale is None else k_scale, _NO_V_SCALE if v_scale is None else v_scale,
        )
        hit = lowering.eager_planned(key, checked)
        if hit is not None:
            run, options, out_size, lse_size, lse_like, fire, new = hit
            if new is not None:  # the pinned launch's native form: out allocated and the kernel launched in one call
                result = new(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, lse_like)
                if result is not None:
                    return result
            out = query.new_empty(*out_size)
            # the Python pin (a native one that declined above, fire itself, is not asked again)
            if new is None and fire is not None and fire(query, key_cache, value_cache, block_table, seq_lens,
                                                         query_start_loc, out):
                return out, lse_like.detach()  # a plain call without lse: the plan's one launch, pinned
            if not plain:
                options = {**options, "alibi_slopes": alibi_slopes, "sinks": sinks, "k_scale": k_scale,
                           "v_scale": v_scale}
            lse = lse_like.new_empty(*lse_size) if return_lse else lse_like.detach()  # see unresizable_empty
            run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out,
                lse if return_lse else None, options)
            return out, lse
    check_arg_types(
        "paged_attention",
        _PAGED_TYPES,
        (query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, return_lse,
         causal, window_left, window_right, softcap, alibi_slopes, sinks, k_scale, v_scale,
         attention_chunk_size, max_query_len),
    )
    if not eager:  # through the dispatcher (tracing, modes)
        return _paged_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale=_default_scale(query, scale),
            causal=causal,
            window_left=window_left,
            window_right=window_right,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            attention_chunk_size=attention_chunk_size,
            max_query_len=max_query_len,
            return_lse=return_lse,
        )
    # the op's body, as declare's plain eager path runs it
    options = _options(_default_scale(query, scale), causal, window_left, window_right, softcap, alibi_slopes, sinks,
                       k_scale, v_scale, attention_chunk_size, max_query_len)
    tensors = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc)
    out, lse, run, planned_before = _functional_plan(tensors, options, return_lse)
    run(*tensors, out, lse if return_lse else None, options)
    if planned_before:  # a signature that recurs: remembered for the path above
        fire = _pinned(run, plain and not return_lse, tensors, out)
        lowering.remember(key, checked, (run, _without_tensors(options), tuple(out.shape), tuple(lse.shape),
                                         lowering.unresizable_empty(lse), fire, getattr(fire, "new", None)))
    return out, lse


def paged_attention_out(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    out: Tensor,
    lse: Tensor | None = None,
    *,
    scale: float | None = None,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
    max_query_len: int = -1,
) -> None:
    """:func:`paged_attention` writing into preallocated tensors (CUDA-graph static buffers).

    ``out`` is ``[T, Hq, Dv]`` in the query's dtype (may be a strided view with a contiguous last
    dimension); ``lse``, when given, is ``[T, Hq]`` float32. Every row is written, padding rows too.
    Other arguments as :func:`paged_attention`.
    """
    eager = plain_eager(query)
    if eager:  # a repeated call: straight to launch (see lowering.eager_planned)
        key = (
            "paged_attention_out", query.shape[:1], scale, causal, window_left, window_right, softcap,
            attention_chunk_size, max_query_len, scale.__class__, causal.__class__, window_left.__class__,
            window_right.__class__, softcap.__class__, attention_chunk_size.__class__, max_query_len.__class__,
            lse is None, alibi_slopes is None, sinks is None, k_scale is None, v_scale is None,
        )
        plain = alibi_slopes is None and sinks is None and k_scale is None and v_scale is None
        checked = (
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, _NO_LSE if lse is None else lse,
        ) if plain else (
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out,
            _NO_LSE if lse is None else lse, _NO_ALIBI if alibi_slopes is None else alibi_slopes,
            _NO_SINKS if sinks is None else sinks, _NO_K_SCALE if k_scale is None else k_scale,
            _NO_V_SCALE if v_scale is None else v_scale,
        )
        hit = lowering.eager_planned(key, checked)
        if hit is not None:
            run, options, fire = hit
            if fire is not None and (
                fire(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out) if lse is None
                else fire(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse)
            ):
                return  # a plain call: the plan's one launch, pinned
            if not plain:
                options = {**options, "alibi_slopes": alibi_slopes, "sinks": sinks, "k_scale": k_scale,
                           "v_scale": v_scale}
            run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options)
            return
    check_arg_types(
        "paged_attention_out",
        _PAGED_OUT_TYPES,
        (query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, scale,
         causal, window_left, window_right, softcap, alibi_slopes, sinks, k_scale, v_scale,
         attention_chunk_size, max_query_len),
    )
    if not eager:  # through the dispatcher (tracing, modes)
        _paged_attention_out(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            out,
            lse,
            scale=_default_scale(query, scale),
            causal=causal,
            window_left=window_left,
            window_right=window_right,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            attention_chunk_size=attention_chunk_size,
            max_query_len=max_query_len,
        )
        return
    # the op's body, as declare's plain eager path runs it
    options = _options(_default_scale(query, scale), causal, window_left, window_right, softcap, alibi_slopes, sinks,
                       k_scale, v_scale, attention_chunk_size, max_query_len)
    tensors = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc)
    run, planned_before = _out_plan(tensors, out, lse, options)
    run(*tensors, out, lse, options)
    if planned_before:  # a signature that recurs: remembered for the path above
        pinned = _pinned(run, plain, tensors, out, lse)
        lowering.remember(key, checked, (run, _without_tensors(options), pinned))


paged_attention.__doc__ = paged_attention.__doc__.replace("{args}", _ARGS_DOC)
