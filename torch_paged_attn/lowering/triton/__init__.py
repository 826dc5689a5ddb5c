"""The Triton backend: one module per kernel family, imported when first used.

``supports(op, facts)`` answers from static facts only; ``module_for(op)`` is the family module,
which exposes the out-form function of ``torch_paged_attn.lowering`` named after the op and its
own ``supports``. Launches go through
``torch.library.wrap_triton`` so that, under torch.compile, Inductor sees and launches the
kernels itself (inside CUDA graphs, and compiled into AOTInductor packages); the one exception,
the Gluon prefill kernel of sm_90 (``prefill_sm90``), runs behind a private opaque op.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# op -> kernel family module
_FAMILIES: dict[str, str] = {
    "paged_attention": "paged_attention",
    "mla_decode": "mla",
    "reshape_and_cache": "kv_cache",
    "concat_and_cache_mla": "kv_cache",
    "gather_cache": "kv_cache",
    "merge_attn_states": "merge",
    "merge_attn_states_n": "merge",
}


def _family(op: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{_FAMILIES[op]}")


def supports(op: str, facts: dict) -> str | None:
    if op not in _FAMILIES:
        return f"no Triton kernel for {op}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    try:
        family = _family(op)
    except ModuleNotFoundError as e:
        return f"Triton kernel module for {op} not available ({e})"
    return family.supports(op, facts)


def module_for(op: str) -> ModuleType:
    """The kernel family module that implements ``op`` (it exposes a function named ``op``)."""
    return _family(op)
