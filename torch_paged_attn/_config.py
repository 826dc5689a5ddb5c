"""Batch-invariant mode: the one process-wide switch of torch_paged_attn.

In batch-invariant mode every kernel splits a sequence's keys at fixed positions (multiples of a
split size in tokens, never derived from the batch) and combines the pieces in a fixed order with
one tile configuration, so a sequence's output is bit-identical whatever batch it runs in (alone,
beside 6 others, beside 63 others). The default mode may choose split counts and tile sizes from
the batch's shape, which is faster but lets the rounding of a result depend on its neighbours.

The mode is on when ``set_batch_invariant(True)`` was called, inside ``with batch_invariant():``,
or when the environment variable ``TORCH_PAGED_ATTN_BATCH_INVARIANT=1`` is set. The variable is
read at each call, not at import. The switch is a static fact of a call: under ``torch.compile``
it is read while tracing, so a graph compiled in one mode keeps that mode.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_ENV = "TORCH_PAGED_ATTN_BATCH_INVARIANT"

# None: follow the environment variable; True/False: set explicitly.
_batch_invariant: bool | None = None


def set_batch_invariant(flag: bool | None) -> None:
    """Turn batch-invariant mode on (``True``) or off (``False``); ``None`` defers to the
    environment variable ``TORCH_PAGED_ATTN_BATCH_INVARIANT`` again."""
    global _batch_invariant
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"set_batch_invariant: flag: expected a bool or None, got {type(flag).__name__}")
    _batch_invariant = flag


def is_batch_invariant() -> bool:
    """Whether calls made now run in batch-invariant mode."""
    if _batch_invariant is not None:
        return _batch_invariant
    return os.environ.get(_ENV, "0") not in ("", "0")


@contextlib.contextmanager
def batch_invariant(flag: bool = True) -> Iterator[None]:
    """``with batch_invariant():`` runs its body in batch-invariant mode (or, with ``False``, in
    the default mode) and restores the previous setting on exit."""
    global _batch_invariant
    previous = _batch_invariant
    set_batch_invariant(flag)
    try:
        yield
    finally:
        _batch_invariant = previous
