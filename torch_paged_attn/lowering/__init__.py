"""Backends that implement the ops, and the rule that picks one per call.

Every backend is a module exposing ``supports(op, facts) -> str | None`` (None when it can run the
call, else the reason it cannot) and, for each op it implements, a function of the same name with
the *out-form* signature below (it writes into ``out`` / ``lse`` / the caches and returns None);
a backend split into several modules (Triton: one per kernel family) also exposes
``module_for(op)``, the module holding that function. A module may also expose
``prepare_<op>(same arguments)``, returning a runner that repeats the call for any tensors of the
same shapes, strides, dtypes, devices and option values (see ``plan``). Backends never import one another; this
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

On CUDA the order is the backend setting's (``_config.get_backend()``): "triton" tries Triton
then the reference; "auto" and "flash" try ``flash`` (FlashAttention, which applies the auto
rule itself through its ``supports``) first, and "flash" raises a RuntimeError when no
FlashAttention package imports; "reference" runs the reference. A backend that declines a call
is logged once per reason at debug level on this module's logger. Off CUDA the reference runs,
except that "triton" runs the Triton kernels on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``) for calls that are not traced; an explicit "triton" or "flash" that
falls back to the reference there is logged once per reason at warning level.

``lse`` may be None (not asked for). ``facts`` holds static facts only (device type, dtypes,
shapes, option values), never tensor values, so selection costs no host synchronisation and
is stable under torch.compile.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from .. import _config

_log = logging.getLogger(__name__)

_TRITON = "torch_paged_attn.lowering.triton"
_FLASH = "torch_paged_attn.lowering.flash"
_REFERENCE = "torch_paged_attn.lowering.reference"
# Ops FlashAttention may run (lowering/flash.py implements these).
_FLASH_OPS = ("paged_attention", "mla_decode")


# The tests of plain_eager, bound once: 0.42 us a call instead of 0.61 us through the attribute
# chains (2-core CPU, 2026-11-24).
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_profiling = torch.autograd._profiler_enabled
_Tensor = torch.Tensor


def plain_eager(t: object) -> bool:
    """True for a call on a plain tensor outside torch.compile, dispatch or function modes and
    the profiler: nothing is watching the dispatcher, so an op's body (ours, or the FlashAttention
    backend's private op) may run directly."""
    # is_compiling() first: under dynamo it is a constant True and nothing after it is traced
    return (
        not _is_compiling()
        and type(t) is _Tensor
        and not t.requires_grad
        and _dispatch_modes() == 0
        and not _function_modes()
        and not _profiling()
    )


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_CHOICES: dict[tuple, ModuleType] = {}
_LOGGED: set[tuple] = set()


def select(op: str, facts: dict[str, Any]) -> ModuleType:
    """The module whose function named ``op`` runs a call described by ``facts``.

    ``facts["device"]`` is the device type ("cpu", "cuda", ...). Off CUDA the reference runs.
    The backend setting (``torch_paged_attn.set_backend``, ``TORCH_PAGED_ATTN_BACKEND``) and
    batch-invariant mode are read here, per call, and join the facts. Facts are static, so each
    distinct call signature is decided once and remembered.
    """
    facts = {**facts, "backend": _config.get_backend(), "batch_invariant": _config.is_batch_invariant()}
    if facts["backend"] == "triton" and facts.get("device") == "cpu":
        facts["interpreter"] = _interpreter_state()
    key = (op, *facts.items())
    try:
        choice = _CHOICES.get(key)
    except TypeError:  # symbolic sizes while tracing with dynamic shapes are not hashable
        return _choose(op, facts)
    if choice is None:
        choice = _CHOICES[key] = _choose(op, facts)
    return choice


# Entries of _CHOICES by call signature (see plan) before the dict is cleared: shapes vary between
# prefill calls, so the table is bounded.
_SIGNATURE_LIMIT = 4096


def planned(signature: tuple | None) -> Callable | None:
    """The runner ``plan`` made for a call of this signature under the current backend setting and
    batch-invariant mode, None when there is none yet (or ``signature`` is None)."""
    if signature is None:
        return None
    try:
        return _CHOICES.get((signature, *_config.flags()))
    except TypeError:  # unhashable (a symbolic scalar): never remembered
        return None


def plan(op: str, signature: tuple | None, facts: Callable[[], dict[str, Any]], args: tuple,
         options: dict[str, Any]) -> Callable:
    """The runner of a call of ``op`` (``args`` positional, ``options`` by keyword, as the out-form
    functions above take them): ``run(*args, options)`` runs the call, or another of the same
    signature, on the backend ``select(op, facts())`` picks.

    A backend may expose ``prepare_<op>(*args, **options)``, which derives everything a call of
    this signature needs (tile configuration, split plan, grid, constant launch arguments) once and
    returns the runner; otherwise the runner calls the backend's function. ``signature`` (a
    summary of everything validation and the runner derive from: shapes, strides, dtypes, devices
    and option values of the call, never tensor values; None while tracing) keys the runner, with
    the backend setting and batch-invariant mode, for ``planned``: a repeated call, a decode step,
    skips validation, facts, selection and planning and goes straight to allocation and launch
    (paged_attention with no-op launches: 20.4 us of host time a call before, 11.9 us after,
    2-core CPU, 2026-11). Plans read a backend module's tuning constants when they are made:
    after changing one, clear them (``_CHOICES.clear()``, as the tests do).
    """
    backend = select(op, facts())
    prepare = getattr(backend, f"prepare_{op}", None)
    run = prepare(*args, **options) if prepare is not None else _unprepared(getattr(backend, op))
    if signature is not None:
        if len(_CHOICES) >= _SIGNATURE_LIMIT:
            _CHOICES.clear()
        try:
            _CHOICES[(signature, *_config.flags())] = run
        except TypeError:  # unhashable (a symbolic scalar): not remembered
            pass
    return run


# -- the eager fast path -------------------------------------------------------------------------
#
# A public function's plain eager call (``plain_eager``; ``TORCH_PAGED_ATTN_DEBUG`` off) first asks
# ``eager_planned`` for what an earlier valid call left with ``remember``. The key: the function's
# name, its number of tokens (so that batches of a few sizes in turn keep one entry each), its
# scalar arguments with their Python classes (``1`` and ``True``, ``-1`` and ``-1.0`` never share
# an entry, so no type error is skipped), which optional tensors are None, and the backend setting
# and batch-invariant mode. Each entry holds one check of the call's tensors (Python type, dtype,
# device, requires_grad, sizes, strides: everything validation and planning read) and what the
# function needs to run (the plan's runner, its options, the sizes of what it allocates). The
# check is Dynamo's C++ ``TensorGuards`` where it behaves as probed (``_native_tensor_guards``):
# 0.8 us for paged_attention_out's 8 tensors, where the Python signature
# (``ops/_checks.signature``) and its lookup (``planned``) cost 6.4 us. A call is remembered
# when its signature was planned already (it recurs), so calls of ever new shapes pay only the
# miss: the key and at most ``_EAGER_ENTRIES`` checks. Entries live in ``_CHOICES``, so
# ``_CHOICES.clear()`` drops them with the plans.
#
# Host time of one call (``python benchmarks/overhead.py --null-launch --device cpu``: the
# package's host code, kernels no-ops; median over 3 runs of each run's median "call us", the two
# trees run in turn; 2-core x86_64 CPU shared with other jobs, 2026-11-24; not yet measured on the
# GPU host), us:
#
#     op                      before  after        op                      before  after
#     paged_attention           25.0   10.8        merge_attn_states         17.4    9.1
#     paged_attention_out       19.5    8.0        merge_attn_states_out     11.0    6.1
#     mla_decode                19.3   10.4        reshape_and_cache         11.4   10.7
#
# (before: the signature path; after also counts the cached launcher's short key and hints,
# ``triton/_launch.py``, which the cache writes owe their gain to.)

# Entries kept per key, the most recently remembered first: calls that alternate between a few
# layouts of one size (layers of two cache layouts, say) each keep theirs.
_EAGER_ENTRIES = 4


def eager_planned(key: tuple, tensors: tuple) -> Any:
    """The payload ``remember`` stored for a call of ``key`` (see above) whose ``tensors`` (in
    the same order) match an entry's; None when none does, and under ``TORCH_PAGED_ATTN_DEBUG=1``.
    The caller has checked ``plain_eager``."""
    flags = _config.eager_flags()
    if flags is None:
        return None
    try:
        entries = _CHOICES.get((key, *flags))
    except TypeError:  # an unhashable argument: the usual path raises its error
        return None
    if entries is not None:
        for check, payload in entries:
            try:
                if check(*tensors):
                    return payload
            except TypeError:  # another number of tensors (the native check raises): not this entry
                pass
    return None


def remember(key: tuple, tensors: tuple, payload: Any) -> None:
    """Store ``payload`` for later plain eager calls of ``key`` whose tensors look like
    ``tensors`` (``eager_planned``); call it only after the call was validated. Nothing is
    stored under ``TORCH_PAGED_ATTN_DEBUG=1``."""
    flags = _config.eager_flags()
    if flags is None:
        return
    full = (key, *flags)
    entry = (_tensor_check(tensors), payload)
    try:
        entries = _CHOICES.get(full)
    except TypeError:  # an unhashable scalar: never remembered
        return
    if entries is None:
        if len(_CHOICES) >= _SIGNATURE_LIMIT:
            _CHOICES.clear()
        _CHOICES[full] = [entry]
    else:
        entries.insert(0, entry)
        del entries[_EAGER_ENTRIES:]


def unresizable_empty(like: torch.Tensor) -> torch.Tensor:
    """A ``[0]`` tensor of ``like``'s dtype and device whose storage cannot grow. What
    ``paged_attention`` returns for an lse the call did not ask for is a ``detach()`` of one,
    remembered with the call's plan: a new tensor a call, sharing a storage of 0 bytes, where
    ``new_empty(0)`` went through the allocator (0.5 us a call on this project's 2-core CPU,
    2026-11-27; 1.8 us by CUDA events on an H100 host, results/gpu-2026-11-27c/logs/alloc-cost.txt).
    A caller's ``resize_`` of it raises instead of growing the storage the others share."""
    storage = torch._C._construct_storage_from_data_pointer(0, like.device, 0)
    return like.new_empty(0).set_(storage, 0, (0,), (1,))


def _describe(tensors: tuple) -> list | None:
    try:
        return [(type(t), t.dtype, t.device, t.requires_grad, t.shape, t.stride()) for t in tensors]
    except AttributeError:
        return None


def _tensor_check(tensors: tuple) -> Callable[..., bool]:
    """``check(*others)``: True iff ``others`` are as many tensors as ``tensors``, each of the same
    Python type, dtype, device, requires_grad, sizes and strides (and, natively, dispatch keys)."""
    native = _native_tensor_guards()
    if native is not None and len(set(map(id, tensors))) == len(tensors):  # it fails a tensor given twice
        return native(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        ).check
    expected = _describe(tensors)

    def check(*others) -> bool:
        return len(others) == len(expected) and _describe(others) == expected

    return check


_NATIVE: list = []  # [TensorGuards or None], decided at the first use


def _native_tensor_guards() -> type | None:
    """Dynamo's ``torch._C._dynamo.guards.TensorGuards`` (a private C++ class: one call checks the
    type, dispatch keys, dtype, device index, requires_grad, sizes and strides of each tensor)
    when it exists and tells apart, on probe tensors, every difference this cache relies on;
    else None (the Python check runs)."""
    if not _NATIVE:
        _NATIVE.append(_probe_tensor_guards())
    return _NATIVE[0]


def _probe_tensor_guards() -> type | None:
    try:
        from torch._C._dynamo.guards import TensorGuards

        x = torch.empty(2, 3)
        check = TensorGuards(x, dynamic_dims_sizes=[[2, 3]], dynamic_dims_strides=[[3, 1]]).check
        others = (
            torch.empty(3, 2).t(),  # same sizes, other strides
            torch.empty(2, 4)[:, :3],  # same sizes, other row stride
            torch.empty(3, 3),
            torch.empty(2, 3, 1),
            torch.empty(2, 3, dtype=torch.float64),
            torch.empty(2, 3, device="meta"),
            torch.empty(2, 3).requires_grad_(),
            torch.empty(2, 3).as_subclass(_ProbeSubclass),
            None,
            [2, 3],
        )
        if check(torch.empty(2, 3)) and not any(check(y) for y in others):
            return TensorGuards
    except Exception:  # noqa: BLE001  (absent or changed: the Python check serves)
        pass
    return None


class _ProbeSubclass(torch.Tensor):
    pass


def _unprepared(function: Callable) -> Callable:
    def run(*args):
        return function(*args[:-1], **args[-1])

    return run


def _interpreter_state() -> str:
    """For a CPU call under the "triton" setting: ``"run"`` when Triton's interpreter runs the
    kernels (``TRITON_INTERPRET=1``, which Triton reads when it defines a kernel, so it must be set
    before the process's first call; and the call is not traced: the interpreter needs real
    tensors), ``"traced"`` when it is on but the call is traced (torch.compile, export, fake or
    functional tensors: the reference is traced), ``"off"`` otherwise."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return "off"
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() != 0:
        return "traced"
    return "run"


_FALLBACK_REASONS = {
    "off": "Triton runs CPU tensors only under its interpreter: set TRITON_INTERPRET=1 before the process starts",
    "traced": "Triton's interpreter cannot run a traced call (torch.compile, torch.export, fake tensors)",
}


def _chain(op: str, facts: dict[str, Any]) -> tuple[str, ...]:
    """Backends to try, in order of preference: the first whose supports() returns None runs."""
    backend = facts["backend"]
    if backend == "reference":
        return (_REFERENCE,)
    if facts.get("device") != "cuda":
        # Off CUDA the reference runs, except that "triton" runs the kernels on CPU tensors under
        # Triton's interpreter (to step through a kernel without a GPU). A backend setting that
        # cannot be honoured says so once, at warning level.
        interpreter = facts.get("interpreter")
        if interpreter == "run":
            return (_TRITON, _REFERENCE)
        if backend != "auto":
            _warn_once(backend, facts.get("device"), _FALLBACK_REASONS.get(interpreter, "it runs CUDA tensors only"))
        return (_REFERENCE,)
    if op not in _FLASH_OPS or backend == "triton":
        return (_TRITON, _REFERENCE)
    if backend == "flash":
        flash = importlib.import_module(_FLASH)
        missing = flash.available()
        if missing is not None:
            raise RuntimeError(
                f"torch_paged_attn: backend 'flash' was requested (set_backend, backend() or "
                f"TORCH_PAGED_ATTN_BACKEND) but no FlashAttention can run: {missing}. Install "
                "flash-attn-4 (flash_attn.cute), FlashAttention-3 (flash_attn_interface) or flash-attn "
                "2, or choose 'auto' or 'triton'."
            )
    return (_FLASH, _TRITON, _REFERENCE)  # "auto" and "flash"; flash.supports() applies the auto rule


def _choose(op: str, facts: dict[str, Any]) -> ModuleType:
    for name in _chain(op, facts):
        backend = _load(name)
        if backend is None:
            continue
        reason = backend.supports(op, facts)
        if reason is None:
            return backend.module_for(op) if hasattr(backend, "module_for") else backend
        _log_once(name, op, reason)
    return importlib.import_module(_REFERENCE)


def _warn_once(backend: str, device: object, reason: str) -> None:
    """One warning per backend setting, device type and reason for which the reference runs."""
    key = ("warning", backend, device, reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        _log.warning("torch_paged_attn: backend %r was requested for %s tensors, but %s; the reference "
                     "backend runs these calls", backend, device, reason)


def _log_once(name: str, op: str, reason: str) -> None:
    """One debug line per backend, op and reason a call fell through (not one per call)."""
    key = (name, op, reason)
    if key not in _LOGGED:
        _LOGGED.add(key)
        _log.debug("%s: %s does not run this call (%s); trying the next backend", op, name.rsplit(".", 1)[-1], reason)
