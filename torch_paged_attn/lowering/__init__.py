"""Backends that implement the ops, and the rule that picks one per call.

Every backend is a module exposing ``supports(op, facts) -> str | None`` (None when it can run the
call, else the reason it cannot) and, for each op it implements, a function of the same name with
the *out-form* signature below (it writes into ``out`` / ``lse`` / the caches and returns None);
a backend split into several modules (Triton: one per kernel family) also exposes
``module_for(op)``, the module holding that function. Backends never import one another; this
module imports them lazily. Each ``*_out`` op runs its functional form's function
(``paged_attention_out`` runs ``paged_attention``).

    paged_attention(query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
                    out, lse, *, scale, causal, window_left, window_right, softcap,
                    alibi_slopes, sinks, k_scale, v_scale, attention_chunk_size, max_query_len)
    mla_decode(q_latent, q_rope, kv_cache, block_table, seq_lens, query_start_loc,
               out, lse, *, scale, causal, kv_scale)
    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale)
    gather_cache(kv_cache, block_table, cu_seq_lens, seq_starts, out, scale)
    merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse, out, lse)
    merge_attn_states_n(outs, lses, out, lse)

``lse`` may be None (not asked for). ``facts`` holds static facts only (device type, dtypes,
shapes, option values), never tensor values, so selection costs no host synchronisation and
is stable under torch.compile.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

# In order of preference; the first whose supports() returns None runs the call.
_CUDA_BACKENDS = ("torch_paged_attn.lowering.triton", "torch_paged_attn.lowering.reference")
_REFERENCE = "torch_paged_attn.lowering.reference"


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_CHOICES: dict[tuple, ModuleType] = {}


def select(op: str, facts: dict[str, Any]) -> ModuleType:
    """The module whose function named ``op`` runs a call described by ``facts``.

    ``facts["device"]`` is the device type ("cpu", "cuda", ...). Off CUDA the reference runs.
    Facts are static, so each distinct call signature is decided once and remembered.
    """
    key = (op, *facts.items())
    try:
        choice = _CHOICES.get(key)
    except TypeError:  # symbolic sizes while tracing with dynamic shapes are not hashable
        return _choose(op, facts)
    if choice is None:
        choice = _CHOICES[key] = _choose(op, facts)
    return choice


def _choose(op: str, facts: dict[str, Any]) -> ModuleType:
    if facts.get("device") == "cuda":
        for name in _CUDA_BACKENDS:
            backend = _load(name)
            if backend is not None and backend.supports(op, facts) is None:
                return backend.module_for(op) if hasattr(backend, "module_for") else backend
    return importlib.import_module(_REFERENCE)
