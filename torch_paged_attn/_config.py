"""The process-wide switches of torch_paged_attn: batch-invariant mode and the backend choice.

Each switch is one ``_Setting``: a value set explicitly (``set_*``), for the length of a ``with``
block (the context manager), or, when neither, read from an environment variable **at each
call**, never at import (``EnvVar``: a dict lookup in ``os.environ``'s own store, parsed again
only when the raw value changed, so ``os.environ[...] = ...`` and ``monkeypatch.setenv`` take
effect at the next call). A switch is a static fact of a call: under ``torch.compile`` it is read
while tracing, so a graph compiled under one setting keeps it.

Under Dynamo a switch is read as a constant (``torch.compiler.assume_constant_result``): the read
runs as plain Python at trace time and its result enters the graph with no guard, so a compiled
function that makes the process's first read (a model whose first call is compiled) traces the same
as one compiled after eager calls. Tracing the read itself would compare the memo's first value, a
sentinel object, with the environment's bytes, which Dynamo cannot do ("Missing richcompare_impl
override"), and would guard on the environment.

Batch-invariant mode (``set_batch_invariant``, ``batch_invariant()``,
``TORCH_PAGED_ATTN_BATCH_INVARIANT=1``): every kernel splits a sequence's keys at fixed positions
(multiples of a split size in tokens, never derived from the batch) and combines the pieces in a
fixed order with one tile configuration, so a sequence's output is bit-identical whatever batch it
runs in (alone, beside 6 others, beside 63 others). The default mode may choose split counts and
tile sizes from the batch's shape, which is faster but lets the rounding of a result depend on its
neighbours. FlashAttention is not used in this mode (its splits follow the batch).

Backend (``set_backend``, ``backend()``, ``TORCH_PAGED_ATTN_BACKEND``), one of ``BACKENDS``:
``"auto"`` (default: FlashAttention for prefill-like calls it supports, else Triton; the rule is
in ``torch_paged_attn/lowering/flash.py``), ``"triton"``, ``"flash"`` (FlashAttention wherever it
supports the call, else Triton; an error on CUDA when no FlashAttention package is installed) and
``"reference"`` (the plain-PyTorch specification, on any device). Off CUDA the reference runs,
except that ``"triton"`` runs the Triton kernels on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before the process starts; traced calls still trace the reference);
an explicit ``"triton"`` or ``"flash"`` that falls back is logged once at warning level on the
``torch_paged_attn.lowering`` logger.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


# os.environ's own store: on POSIX the dict of encoded names and values that os.environ's item
# assignment and deletion (monkeypatch.setenv included) update in place. A lookup in it costs
# 0.03 us where os.environ.get costs 0.6 us (it encodes the name and goes through the Mapping
# ABC; 2-core CPU, 2026-11), and an op reads three or four switches per call. Elsewhere (Windows:
# upper-cased str names) os.environ.get.
_STORE = getattr(os.environ, "_data", None) if os.name == "posix" else None
if not isinstance(_STORE, dict):
    _STORE = None
_UNREAD = object()


class EnvVar(Generic[T]):
    """An environment variable read at each ``get()``, parsed by ``parse`` (its string, ``unset``
    when it is not set) only when its raw value changed since the last read."""

    def __init__(self, name: str, parse: Callable[[str], T], unset: str = ""):
        self.name = name
        self.unset = unset
        self.key = os.fsencode(name) if _STORE is not None else name
        self.parse = parse
        self.raw: object = _UNREAD
        self.parsed: T | None = None
        self.traced_read = _constant_read(self.read)

    def get(self) -> T:
        if _dynamo_tracing():
            return self.traced_read()
        return self.read()

    def read(self) -> T:
        raw = _STORE.get(self.key) if _STORE is not None else os.environ.get(self.name)
        if raw != self.raw:
            text = self.unset if raw is None else os.fsdecode(raw) if isinstance(raw, bytes) else raw
            self.parsed = self.parse(text)  # a parse error raises again at the next read
            self.raw = raw
        return self.parsed


# False when called, a constant True while Dynamo traces (a Python call: 0.03 us, where
# is_compiling() costs 0.11 us; 2-core CPU, 2026-11). AOTAutograd and Inductor run a traced op's
# body as plain Python, where the memo below serves.
_dynamo_tracing = torch.compiler.is_dynamo_compiling


def _constant_read(read: Callable[[], T]) -> Callable[[], T]:
    """``read`` as a function of no arguments that Dynamo runs at trace time and records as a
    constant (``assume_constant_result``). No arguments: torch 2.11's Dynamo passes a marked
    function's arguments as Python constants, which a switch object is not (torch 2.11 on an
    H100, 2026-11-23: "UserDefinedObjectVariable(EnvVar) is not a constant")."""

    def read_switch() -> T:
        return read()

    return torch.compiler.assume_constant_result(read_switch)


class _Setting(Generic[T]):
    """One switch: an explicit value, or (when ``None``) the environment variable ``env``,
    parsed by ``parse``, read at each ``get()``."""

    def __init__(self, env: str, parse: Callable[[str], T]):
        self.env = EnvVar(env, parse)
        self.value: T | None = None
        self.traced_read = _constant_read(self.read)

    def get(self) -> T:
        if _dynamo_tracing():
            return self.traced_read()
        return self.read()

    def read(self) -> T:
        if self.value is not None:
            return self.value
        return self.env.read()

    @contextlib.contextmanager
    def override(self, value: T) -> Iterator[None]:
        previous = self.value
        self.value = value
        try:
            yield
        finally:
            self.value = previous


# -- batch-invariant mode -----------------------------------------------------------------------

_BATCH_INVARIANT = _Setting("TORCH_PAGED_ATTN_BATCH_INVARIANT", lambda s: s not in ("", "0"))


def set_batch_invariant(flag: bool | None) -> None:
    """Turn batch-invariant mode on (``True``) or off (``False``); ``None`` defers to the
    environment variable ``TORCH_PAGED_ATTN_BATCH_INVARIANT`` again."""
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"set_batch_invariant: flag: expected a bool or None, got {type(flag).__name__}")
    _BATCH_INVARIANT.value = flag


def is_batch_invariant() -> bool:
    """Whether calls made now run in batch-invariant mode."""
    return _BATCH_INVARIANT.get()


def batch_invariant(flag: bool = True) -> contextlib.AbstractContextManager[None]:
    """``with batch_invariant():`` runs its body in batch-invariant mode (or, with ``False``, in
    the default mode) and restores the previous setting on exit."""
    if not isinstance(flag, bool):
        raise TypeError(f"batch_invariant: flag: expected a bool, got {type(flag).__name__}")
    return _BATCH_INVARIANT.override(flag)


# -- backend ------------------------------------------------------------------------------------

BACKENDS = ("auto", "triton", "flash", "reference")


def _backend_name(name: object, where: str) -> str:
    if not isinstance(name, str) or name.strip().lower() not in BACKENDS:
        raise ValueError(f"{where}: expected one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name.strip().lower()


_BACKEND = _Setting(
    "TORCH_PAGED_ATTN_BACKEND",
    lambda s: _backend_name(s, "environment variable TORCH_PAGED_ATTN_BACKEND") if s else "auto",
)


def set_backend(name: str | None) -> None:
    """Choose the backend of later calls: ``"auto"``, ``"triton"``, ``"flash"`` or ``"reference"``;
    ``None`` defers to the environment variable ``TORCH_PAGED_ATTN_BACKEND`` (default ``"auto"``)."""
    _BACKEND.value = None if name is None else _backend_name(name, "set_backend: name")


def get_backend() -> str:
    """The backend setting calls made now use (the environment variable is read here)."""
    return _BACKEND.get()


def backend(name: str) -> contextlib.AbstractContextManager[None]:
    """``with backend("flash"):`` runs its body with that backend setting and restores the
    previous one on exit."""
    return _BACKEND.override(_backend_name(name, "backend: name"))


def flags() -> tuple[str, bool]:
    """``(get_backend(), is_batch_invariant())``: the switches every call's plan depends on."""
    return _BACKEND.get(), _BATCH_INVARIANT.get()


# -- debug checks --------------------------------------------------------------------------------

# ``TORCH_PAGED_ATTN_DEBUG=1``: value checks (block ids, slots, lengths) at every call, which may
# synchronise (ops/_checks.py).
DEBUG = EnvVar("TORCH_PAGED_ATTN_DEBUG", lambda s: s not in ("", "0"))


def eager_flags() -> tuple[str, bool] | None:
    """``flags()`` for a caller that knows Dynamo is not tracing (a plain eager call), without the
    tracing test of each read; None under ``TORCH_PAGED_ATTN_DEBUG=1`` (every call validated)."""
    if DEBUG.read():
        return None
    backend, invariant = _BACKEND.value, _BATCH_INVARIANT.value
    return (
        _BACKEND.env.read() if backend is None else backend,
        _BATCH_INVARIANT.env.read() if invariant is None else invariant,
    )
