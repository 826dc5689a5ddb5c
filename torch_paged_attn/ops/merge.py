"""``paged_attn::merge_attn_states`` / ``merge_attn_states_out`` (two parts) and
``paged_attn::merge_attn_states_n`` / ``merge_attn_states_n_out`` (N stacked parts)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import lowering
from ._checks import FLOAT_DTYPES, Checker, arg_types, check_arg_types, signature
from ._library import declare, plain_eager


def _check_merge(
    op: str, prefix_out: Tensor, prefix_lse: Tensor, suffix_out: Tensor, suffix_lse: Tensor
) -> Checker:
    if not isinstance(prefix_out, Tensor):
        raise TypeError(f"{op}: prefix_out: expected a torch.Tensor, got {type(prefix_out).__name__}")
    c = Checker(op, prefix_out.device)
    c.tensor("prefix_out", prefix_out, dim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_size = prefix_out.shape
    c.tensor("suffix_out", suffix_out, shape=tuple(prefix_out.shape), dtypes=(prefix_out.dtype,))
    for arg, t in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse)):
        c.tensor(arg, t, shape=(num_tokens, num_heads), dtypes=(torch.float32,), last_contiguous=False)
    return c


def _facts(prefix_out: Tensor, lse: Tensor | None) -> dict:
    return {
        "device": prefix_out.device.type,
        "dtype": prefix_out.dtype,
        "head_size": prefix_out.shape[2],
        "lse": lse is not None,
    }


@declare("merge_attn_states")
def _merge_attn_states(
    prefix_out: Tensor, prefix_lse: Tensor, suffix_out: Tensor, suffix_lse: Tensor
) -> tuple[Tensor, Tensor]:
    tensors = (prefix_out, prefix_lse, suffix_out, suffix_lse)
    out, lse, run, _ = _merge_plan(tensors)
    run(*tensors, out, lse, {})
    return out, lse


def _merge_plan(tensors: tuple) -> tuple[Tensor, Tensor, Callable, bool]:
    """``merge_attn_states``'s call validated (unless its signature was planned), its outputs
    allocated, and its runner: ``(out, lse, run, planned before)``."""
    prefix_out, prefix_lse = tensors[0], tensors[1]
    call = signature("merge_attn_states", tensors)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None:
        _check_merge("merge_attn_states", *tensors)
    out = prefix_out.new_empty(prefix_out.shape)
    lse = prefix_lse.new_empty(prefix_lse.shape)
    if run is None:
        return out, lse, lowering.plan("merge_attn_states", call, lambda: _facts(prefix_out, lse),
                                       (*tensors, out, lse), {}), False
    return out, lse, run, True


@declare("merge_attn_states_out")
def _merge_attn_states_out(
    prefix_out: Tensor,
    prefix_lse: Tensor,
    suffix_out: Tensor,
    suffix_lse: Tensor,
    out: Tensor,
    lse: Tensor | None,  # no schema default: torch 2.11 drops a trailing mutable default argument
) -> None:
    args = (prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)
    _merge_out_plan(args)[0](*args, {})


def _merge_out_plan(args: tuple) -> tuple[Callable, bool]:
    """``merge_attn_states_out``'s call validated (unless its signature was planned) and its
    runner: ``(run, planned before)``."""
    prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse = args
    call = signature("merge_attn_states_out", args)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is not None:
        return run, True
    c = _check_merge("merge_attn_states_out", prefix_out, prefix_lse, suffix_out, suffix_lse)
    c.tensor("out", out, shape=tuple(prefix_out.shape), dtypes=(prefix_out.dtype,))
    if lse is not None:
        c.tensor("lse", lse, shape=tuple(prefix_lse.shape), dtypes=(torch.float32,), last_contiguous=False)
    return lowering.plan("merge_attn_states", call, lambda: _facts(prefix_out, lse), args, {}), False


_MERGE_KINDS = (
    ("prefix_out", "tensor"),
    ("prefix_lse", "tensor"),
    ("suffix_out", "tensor"),
    ("suffix_lse", "tensor"),
)
_MERGE_TYPES = arg_types(*_MERGE_KINDS)
_MERGE_OUT_TYPES = arg_types(*_MERGE_KINDS, ("out", "tensor"), ("lse", "tensor?"))


def merge_attn_states(
    prefix_out: Tensor, prefix_lse: Tensor, suffix_out: Tensor, suffix_lse: Tensor
) -> tuple[Tensor, Tensor]:
    """Combine two attention results over disjoint key sets into the result over their union.

    With ``m = max(lse_p, lse_s)``::

        lse = m + log(exp(lse_p - m) + exp(lse_s - m))
        out = exp(lse_p - lse) * out_p + exp(lse_s - lse) * out_s

    An LSE of ``-inf`` or ``+inf`` marks an empty part, whose output is ignored (it may hold
    anything); both empty gives 0 and ``-inf``.

    Args:
        prefix_out, suffix_out: ``[T, H, D]`` bf16/fp16/fp32, same shape and dtype.
        prefix_lse, suffix_lse: ``[T, H]`` float32, natural log.

    Returns:
        ``(out [T, H, D]`` in the inputs' dtype, ``lse [T, H]`` float32``)``.

    See DESIGN.md for the contract (empty parts, NaN LSEs, errors).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> o1, o2 = torch.randn(3, 2, 32), torch.randn(3, 2, 32)
        >>> l1, l2 = torch.randn(3, 2), torch.full((3, 2), float("-inf"))
        >>> out, lse = pa.merge_attn_states(o1, l1, o2, l2)
        >>> torch.allclose(out, o1) and torch.equal(lse, l1)
        True
    """
    eager = plain_eager(prefix_out)
    if eager:  # a repeated call: straight to allocation and launch (see lowering.eager_planned)
        checked = (prefix_out, prefix_lse, suffix_out, suffix_lse)
        key = ("merge_attn_states", prefix_out.shape[0])
        hit = lowering.eager_planned(key, checked)
        if hit is not None:
            run, out_size, lse_size = hit
            out, lse = prefix_out.new_empty(*out_size), prefix_lse.new_empty(*lse_size)
            run(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse, {})
            return out, lse
    check_arg_types(
        "merge_attn_states", _MERGE_TYPES, (prefix_out, prefix_lse, suffix_out, suffix_lse)
    )
    if not eager:  # through the dispatcher (tracing, modes)
        return _merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse)
    out, lse, run, planned_before = _merge_plan(checked)  # the op's body, as declare's eager path runs it
    run(*checked, out, lse, {})
    if planned_before:  # a signature that recurs: remembered for the path above
        lowering.remember(key, checked, (run, tuple(out.shape), tuple(lse.shape)))
    return out, lse


def merge_attn_states_out(
    prefix_out: Tensor,
    prefix_lse: Tensor,
    suffix_out: Tensor,
    suffix_lse: Tensor,
    out: Tensor,
    lse: Tensor | None = None,
) -> None:
    """:func:`merge_attn_states` writing into ``out [T, H, D]`` and, when given, ``lse [T, H]``."""
    eager = plain_eager(prefix_out)
    if eager:  # a repeated call: straight to launch (see lowering.eager_planned)
        key = ("merge_attn_states_out", prefix_out.shape[0], lse is None)
        checked = (prefix_out, prefix_lse, suffix_out, suffix_lse, out)
        if lse is not None:
            checked += (lse,)
        run = lowering.eager_planned(key, checked)
        if run is not None:
            run(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse, {})
            return
    check_arg_types(
        "merge_attn_states_out",
        _MERGE_OUT_TYPES,
        (prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse),
    )
    if not eager:  # through the dispatcher (tracing, modes)
        _merge_attn_states_out(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)
        return
    args = (prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)
    run, planned_before = _merge_out_plan(args)  # the op's body, as declare's eager path runs it
    run(*args, {})
    if planned_before:  # a signature that recurs: remembered for the path above
        lowering.remember(key, checked, run)


# -- N parts -------------------------------------------------------------------------------------


def _check_merge_n(op: str, outs: Tensor, lses: Tensor) -> Checker:
    if not isinstance(outs, Tensor):
        raise TypeError(f"{op}: outs: expected a torch.Tensor, got {type(outs).__name__}")
    c = Checker(op, outs.device)
    c.tensor("outs", outs, dim=4, dtypes=FLOAT_DTYPES)
    num_parts, num_tokens, num_heads, _ = outs.shape
    if num_parts == 0:
        c.fail("outs", "at least one part (outs.shape[0] >= 1)", "shape [0, ...]")
    c.tensor(
        "lses", lses, shape=(num_parts, num_tokens, num_heads), dtypes=(torch.float32,), last_contiguous=False
    )
    return c


def _facts_n(outs: Tensor, lse: Tensor | None) -> dict:
    return {"device": outs.device.type, "dtype": outs.dtype, "head_size": outs.shape[3], "lse": lse is not None}


@declare("merge_attn_states_n")
def _merge_attn_states_n(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    call = signature("merge_attn_states_n", (outs, lses))  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None:
        _check_merge_n("merge_attn_states_n", outs, lses)
    out = outs.new_empty(outs.shape[1:])
    lse = lses.new_empty(lses.shape[1:])
    if run is None:
        run = lowering.plan("merge_attn_states_n", call, lambda: _facts_n(outs, lse), (outs, lses, out, lse), {})
    run(outs, lses, out, lse, {})
    return out, lse


@declare("merge_attn_states_n_out")
def _merge_attn_states_n_out(
    outs: Tensor,
    lses: Tensor,
    out: Tensor,
    lse: Tensor | None,  # no schema default: torch 2.11 drops a trailing mutable default argument
) -> None:
    args = (outs, lses, out, lse)
    call = signature("merge_attn_states_n_out", args)  # what validation reads: the key of the plan
    run = lowering.planned(call)
    if run is None:
        c = _check_merge_n("merge_attn_states_n_out", outs, lses)
        c.tensor("out", out, shape=tuple(outs.shape[1:]), dtypes=(outs.dtype,))
        if lse is not None:
            c.tensor("lse", lse, shape=tuple(lses.shape[1:]), dtypes=(torch.float32,), last_contiguous=False)
        run = lowering.plan("merge_attn_states_n", call, lambda: _facts_n(outs, lse), args, {})
    run(*args, {})


_MERGE_N_TYPES = arg_types(("outs", "tensor"), ("lses", "tensor"))
_MERGE_N_OUT_TYPES = arg_types(("outs", "tensor"), ("lses", "tensor"), ("out", "tensor"), ("lse", "tensor?"))


def merge_attn_states_n(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    """Combine N attention results over disjoint key sets into the result over their union.

    The N-part form of :func:`merge_attn_states` (split-KV decode, decode context parallelism:
    one part per rank). Per row ``(t, h)``, with ``m = max_i lses[i, t, h]``::

        lse = m + log(sum_i exp(lses[i] - m))
        out = sum_i exp(lses[i] - lse) * outs[i]          # summed in part order 0, 1, ..., N-1

    An LSE of ``-inf`` or ``+inf`` marks an empty part, whose output is ignored (it may hold
    anything); a row whose parts are all empty gives 0 and ``-inf``.

    Args:
        outs: ``[N, T, H, D]`` bf16/fp16/fp32, N >= 1 stacked partial outputs (last dim contiguous).
        lses: ``[N, T, H]`` float32, natural log: token-major per part, as every LSE of the
            package (``lses[i]`` is what ``paged_attention(..., return_lse=True)`` returns).

    Returns:
        ``(out [T, H, D]`` in ``outs``' dtype, ``lse [T, H]`` float32, natural log``)``.

    See DESIGN.md for the contract (empty parts, NaN LSEs, errors).

    Example::

        >>> import torch, torch_paged_attn as pa
        >>> outs = torch.randn(3, 4, 2, 32)
        >>> lses = torch.tensor([0.0, float("-inf"), 0.0]).reshape(3, 1, 1).expand(3, 4, 2).contiguous()
        >>> out, lse = pa.merge_attn_states_n(outs, lses)
        >>> torch.allclose(out, (outs[0] + outs[2]) / 2, atol=1e-6)
        True
    """
    check_arg_types("merge_attn_states_n", _MERGE_N_TYPES, (outs, lses))
    return _merge_attn_states_n(outs, lses)


def merge_attn_states_n_out(outs: Tensor, lses: Tensor, out: Tensor, lse: Tensor | None = None) -> None:
    """:func:`merge_attn_states_n` writing into ``out [T, H, D]`` and, when given, ``lse [T, H]``."""
    check_arg_types("merge_attn_states_n_out", _MERGE_N_OUT_TYPES, (outs, lses, out, lse))
    _merge_attn_states_n_out(outs, lses, out, lse)
