"""The ``paged_attn`` operator namespace: every op this package registers, in one view.

Each op is declared with ``torch.library.triton_op`` in the module named beside it: one schema
(inferred from the annotated signature), exact mutation annotations, and a body that validates
its inputs and hands them to the backend ``torch_paged_attn.lowering.select`` picks; on plain
tensors it does both once per call signature (``lowering.plan``), and a repeated signature goes
straight to allocation and launch (the public functions of paged_attention, mla_decode,
merge_attn_states and the cache writes go further: a plain eager call that recurs skips even the signature, through
``lowering.eager_planned``). The body doubles as the fake kernel (it allocates outputs from
shapes and launches nothing on fake tensors), and under torch.compile Inductor traces through it to the kernels it launches;
``torch.export`` keeps one ``torch.ops.paged_attn.*`` node per call.
"""

from collections.abc import Callable

import torch
from torch.library import triton_op

from ..lowering import plain_eager  # noqa: F401  (re-exported: the ops' eager shortcut)

NAMESPACE = "paged_attn"

# op name -> (declaring module, arguments it mutates)
OPS = {
    "paged_attention": ("paged_attention", ()),
    "paged_attention_out": ("paged_attention", ("out", "lse")),
    "mla_decode": ("mla", ()),
    "reshape_and_cache": ("kv_cache", ("key_cache", "value_cache")),
    "concat_and_cache_mla": ("kv_cache", ("kv_cache",)),
    "gather_cache": ("kv_cache", ("out",)),
    "merge_attn_states": ("merge", ()),
    "merge_attn_states_out": ("merge", ("out", "lse")),
    "merge_attn_states_n": ("merge", ()),
    "merge_attn_states_n_out": ("merge", ("out", "lse")),
}


def qualname(op: str) -> str:
    """``"paged_attn::<op>"`` for an op listed in ``OPS``."""
    if op not in OPS:
        raise KeyError(f"{op!r} is not a paged_attn op; known ops: {sorted(OPS)}")
    return f"{NAMESPACE}::{op}"


def mutated(op: str) -> tuple[str, ...]:
    return OPS[op][1]


def _register_no_gradient(op: str) -> None:
    """The ops are inference ops: an input that requires grad gives an output whose backward
    raises one error naming the fix. Under torch.compile AOTAutograd traces that backward while
    compiling, so the same message surfaces there instead of an internal trace failure."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"{qualname(op)} has no gradient (it is an inference op): call it under torch.no_grad() "
            "or torch.inference_mode(), or pass inputs that do not require grad"
        )

    def setup_context(ctx, inputs, output):
        return None

    torch.library.register_autograd(qualname(op), backward, setup_context=setup_context)


def declare(op: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as ``paged_attn::<op>`` (a ``triton_op``: its annotated
    signature is the schema, its body the implementation and the fake kernel) and return the
    callable the public function uses.

    That callable runs the body directly for a plain eager call (``plain_eager``) and goes through
    ``torch.ops.paged_attn.<op>`` otherwise, so compile, export, fake tensors, modes and the
    profiler still see one op. The custom-op machinery on the dispatcher path (autograd wrapper,
    alias checks, dynamo-disable) costs about 100 us of host time per call on a 2-core machine
    (2026-11), several times the Triton launch it wraps.
    """

    def register(fn: Callable) -> Callable:
        triton_op(qualname(op), mutates_args=mutated(op))(fn)
        if not mutated(op):
            _register_no_gradient(op)
        overload = getattr(getattr(torch.ops, NAMESPACE), op).default

        def call(*args, **kwargs):
            if plain_eager(args[0]):
                return fn(*args, **kwargs)
            return overload(*args, **kwargs)

        call.__name__ = call.__qualname__ = fn.__name__
        call.__doc__ = fn.__doc__
        return call

    return register
