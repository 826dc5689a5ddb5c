"""The process-wide switches of torch_paged_attn: batch-invariant mode and the backend choice.

Each switch is one ``_Setting``: a value set explicitly (``set_*``), for the length of a ``with``
block (the context manager), or, when neither, read from an environment variable **at each
call**, never at import. A switch is a static fact of a call: under ``torch.compile`` it is read
while tracing, so a graph compiled under one setting keeps it.

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
``"reference"`` (the plain-PyTorch specification, on any device). Off CUDA the reference runs
whatever the setting.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Setting(Generic[T]):
    """One switch: an explicit value, or (when ``None``) the environment variable ``env``,
    parsed by ``parse`` at each read."""

    def __init__(self, env: str, parse: Callable[[str], T]):
        self.env = env
        self.parse = parse
        self.value: T | None = None

    def get(self) -> T:
        if self.value is not None:
            return self.value
        return self.parse(os.environ.get(self.env, ""))

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
