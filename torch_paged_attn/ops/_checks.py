"""Input validation shared by every op, on the fake path and the real one alike.

Checks read shapes, dtypes, strides and devices only (DESIGN rules 1 and 3), so they cost no
host synchronisation and run under torch.compile. Value checks (block ids, slots, lengths) read
tensor contents and therefore synchronise: they run only when ``TORCH_PAGED_ATTN_DEBUG=1`` is set
and the call is concrete (not traced with fake tensors).

Every failure raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device,
layout or value) with a message ``"<op>: <argument>: expected <what>, got <what>"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .. import _config

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
CACHE_DTYPES = FLOAT_DTYPES + FP8_DTYPES
INDEX_DTYPES = (torch.int32,)
SLOT_DTYPES = (torch.int64, torch.int32)
# Largest number of query tokens, and of key positions a block table covers (columns x block
# size), in one call. Positions then lie in (-2^28, 2^28) (non-causal rows with q_len > seq_len
# are negative), so the kernels' int32 position arithmetic, a position plus a window side or a
# chunk size of up to 2^29 (``FAR``), cannot overflow.
MAX_POSITIONS = 2**28
# A window side or chunk size this large reaches past every position of any valid call: the ops
# read a window side >= FAR as unbounded (-1) and a chunk size >= FAR as FAR (the same chunks:
# position p is in chunk 0 for p >= 0 and chunk -1 for p < 0).
FAR = 2**29


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


class Checker:
    """Validation helpers bound to one op's name and one device (the first tensor's)."""

    def __init__(self, op: str, device: torch.device):
        self.op = op
        self.device = device

    def fail(self, arg: str, expected: str, got: str, cls: type[Exception] = ValueError):
        raise cls(f"{self.op}: {arg}: expected {expected}, got {got}")

    def tensor(
        self,
        arg: str,
        t: object,
        *,
        dim: int | None = None,
        dtypes: Sequence[torch.dtype] | None = None,
        shape: Sequence[int | None] | None = None,
        last_contiguous: bool = True,
    ) -> Tensor:
        """Check one tensor argument; ``None`` in ``shape`` means any size in that dimension."""
        if not isinstance(t, Tensor):
            self.fail(arg, "a torch.Tensor", type(t).__name__, TypeError)
        if dtypes is not None and t.dtype not in dtypes:
            self.fail(arg, f"dtype {_dtype_names(dtypes)}", str(t.dtype), TypeError)
        if shape is not None:
            dim = len(shape)
        if dim is not None and t.dim() != dim:
            self.fail(arg, f"a {dim}-D tensor", f"shape {_shape(t)}")
        if shape is not None and any(e is not None and s != e for s, e in zip(t.shape, shape)):
            want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
            self.fail(arg, f"shape {want}", f"shape {_shape(t)}")
        if t.device != self.device:
            self.fail(arg, f"a tensor on {self.device} (the device of the first argument)", str(t.device))
        if last_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
            self.fail(arg, "a contiguous last dimension (stride 1)", f"strides {tuple(t.stride())}")
        return t

    def scale(self, arg: str, t: object, cache_arg: str, cache_dtype: torch.dtype) -> None:
        """A per-tensor fp8 scale: float32, one element; required for fp8 caches, else ignored."""
        if cache_dtype not in FP8_DTYPES:
            return
        if t is None:
            self.fail(arg, f"a float32 scale tensor because {cache_arg} is {cache_dtype}", "None", TypeError)
        self.tensor(arg, t, dtypes=(torch.float32,), last_contiguous=False)
        if t.dim() > 1 or t.numel() != 1:
            self.fail(arg, "one element, shape [] or [1]", f"shape {_shape(t)}")

    def cache_blocks(self, arg: str, cache: Tensor) -> None:
        """A paged cache ``[NB, BS, ...]`` with at least one block of at least one slot."""
        if cache.shape[0] < 1 or cache.shape[1] < 1:
            self.fail(arg, "at least one block of at least one slot ([NB >= 1, BS >= 1, ...])",
                      f"shape {_shape(cache)}")

    def distinct_slots(self, arg: str, cache: Tensor) -> None:
        """A cache an op writes: no two of its elements share memory (a block stride too small to
        hold a block, a stride of 0, overlapping rows). Strides only: each dimension's stride, in
        increasing order, must exceed the span of the dimensions with smaller strides."""
        dims = sorted((st, n) for st, n in zip(cache.stride(), cache.shape) if n > 1)
        span = 0  # elements one step of the next dimension must clear
        for st, n in dims:
            if st <= span:
                self.fail(arg, "a cache whose blocks and slots do not share memory (each stride larger "
                          "than the span of the smaller ones: a block stride that holds a block)",
                          f"shape {_shape(cache)}, strides {tuple(cache.stride())}")
            span += (n - 1) * st

    def multiple(self, arg: str, value: int, of: int, lo: int, hi: int) -> None:
        if value % of != 0 or value < lo or value > hi:
            self.fail(arg, f"a multiple of {of} in [{lo}, {hi}]", str(value))

    def at_least(self, arg: str, value: float, lo: float) -> None:
        if not value >= lo:
            self.fail(arg, f">= {lo}", str(value))

    def same_dtype(self, arg: str, t: Tensor, other_arg: str, other: Tensor) -> None:
        if t.dtype != other.dtype:
            self.fail(arg, f"the dtype of {other_arg} ({other.dtype})", str(t.dtype), TypeError)

    def cache_dtype(self, arg: str, cache: Tensor, data_arg: str, data: Tensor) -> None:
        """A bf16/fp16/fp32 cache holds the data's dtype; an fp8 cache holds any of them."""
        if cache.dtype not in FP8_DTYPES and cache.dtype != data.dtype:
            self.fail(
                arg, f"{data.dtype} (the dtype of {data_arg}) or an fp8 dtype", str(cache.dtype), TypeError
            )

    # -- value checks, TORCH_PAGED_ATTN_DEBUG=1 only --

    def value(self, ok: Tensor, arg: str, expected: str, values: Tensor, offset: int = 0) -> None:
        """Fail unless every element of the boolean tensor ``ok`` holds (synchronises).

        ``values`` (the shape of ``ok``) holds what was checked; the message reports the first
        violation as ``<value> at <arg>[<index>]``, its first index shifted by ``offset`` (for a
        check of ``arg[offset:]``).
        """
        if not bool(ok.all()):
            index = (~ok).nonzero()[0].tolist()
            value = values[tuple(index)].item()
            index[0] += offset
            self.fail(arg, expected, f"{value} at {arg}[{', '.join(map(str, index))}]")


# Python types a public function accepts for each kind of argument. Symbolic numbers stand in for
# ints and floats while torch.compile traces the function.
_ARG_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "tensor": ((Tensor,), "a torch.Tensor"),
    "tensor?": ((Tensor, type(None)), "a torch.Tensor or None"),
    "int": ((int, torch.SymInt), "an int"),
    "float": ((float, int, torch.SymFloat, torch.SymInt), "a float"),
    "float?": ((float, int, torch.SymFloat, torch.SymInt, type(None)), "a float or None"),
    "bool": ((bool, torch.SymBool), "a bool"),
}


class ArgTypes(NamedTuple):
    """The accepted Python types of a public function's arguments, in order."""

    names: tuple[str, ...]
    types: tuple[tuple[type, ...], ...]
    what: tuple[str, ...]


def arg_types(*kinds: tuple[str, str]) -> ArgTypes:
    """An ``ArgTypes`` from ``(argument, kind)`` pairs, kinds as in ``_ARG_KINDS``."""
    return ArgTypes(
        tuple(arg for arg, _ in kinds),
        tuple(_ARG_KINDS[kind][0] for _, kind in kinds),
        tuple(_ARG_KINDS[kind][1] for _, kind in kinds),
    )


def check_arg_types(op: str, spec: ArgTypes, values: Sequence[object]) -> None:
    """Python types of a public function's arguments (``values``, in ``spec``'s order), checked
    before the dispatcher parses them: it would raise a ``RuntimeError`` for a list passed as a
    tensor, and rule 3 promises a TypeError. The all-right path is one ``map`` over the arguments:
    2.2 us for paged_attention's 18 on a 2-core CI machine, 2026-11."""
    if all(map(isinstance, values, spec.types)):
        return
    for arg, types, what, value in zip(spec.names, spec.types, spec.what, values):
        if not isinstance(value, types):
            raise TypeError(f"{op}: {arg}: expected {what}, got {type(value).__name__}")


def signature(op: str, tensors: Sequence[Tensor | None], scalars: tuple = ()) -> tuple | None:
    """A call's signature, the key of its plan (``lowering.plan``): per tensor argument its shape,
    strides, dtype and device (``None`` for None), then the scalar values validation and planning
    read. None (never remembered) unless the first tensor is a plain tensor (fake or subclass
    tensors: tracing) and every argument has those attributes. Not hashed here: an unhashable
    signature (a symbolic scalar) is never remembered (``lowering.planned``). 2.0 us for
    paged_attention's 10 arguments and 8 scalars (2-core CPU, 2026-11)."""
    if type(tensors[0]) is not Tensor:
        return None
    try:
        return (
            op,
            *[None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors],
            *scalars,
        )
    except AttributeError:
        return None


_DEBUG = _config.DEBUG  # TORCH_PAGED_ATTN_DEBUG


def debug_checks_enabled(*tensors: Tensor) -> bool:
    """True when ``TORCH_PAGED_ATTN_DEBUG=1`` (read at each call) and the call runs on real
    tensors (not traced)."""
    if not _DEBUG.get():
        return False
    if torch.compiler.is_compiling():
        return False
    from torch._subclasses.fake_tensor import is_fake
    from torch._subclasses.functional_tensor import FunctionalTensor

    return not any(is_fake(t) or isinstance(t, FunctionalTensor) for t in tensors)


def check_batch(
    c: Checker,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
) -> tuple[int, int]:
    """The batch description shared by the attention ops; returns (num_seqs, max_blocks)."""
    c.tensor("block_table", block_table, dim=2, dtypes=INDEX_DTYPES, last_contiguous=False)
    num_seqs, max_blocks = block_table.shape
    c.tensor("seq_lens", seq_lens, shape=(num_seqs,), dtypes=INDEX_DTYPES, last_contiguous=False)
    c.tensor(
        "query_start_loc",
        query_start_loc,
        shape=(num_seqs + 1,),
        dtypes=INDEX_DTYPES,
        last_contiguous=False,
    )
    return num_seqs, max_blocks


def check_positions(c: Checker, num_tokens: int, max_blocks: int, block_size: int, query_arg: str) -> None:
    """At most ``MAX_POSITIONS`` query tokens and key positions (``block_table`` columns x block size)."""
    if num_tokens > MAX_POSITIONS:
        c.fail(query_arg, f"at most 2^28 = {MAX_POSITIONS} tokens", f"{num_tokens} tokens")
    if max_blocks * block_size > MAX_POSITIONS:
        c.fail("block_table", f"at most 2^28 = {MAX_POSITIONS} key positions (columns x block size)",
               f"{max_blocks} x {block_size} = {max_blocks * block_size}")


def debug_check_batch(
    c: Checker,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    num_tokens: int,
    num_blocks: int,
    block_size: int,
) -> None:
    """Value checks of the batch description (TORCH_PAGED_ATTN_DEBUG=1)."""
    max_blocks = block_table.shape[1]
    qsl = query_start_loc.long()
    lens = seq_lens.long()
    last = qsl.shape[0] - 1
    c.value(qsl[:1] == 0, "query_start_loc", "query_start_loc[0] == 0", qsl[:1])
    c.value(qsl[1:] >= qsl[:-1], "query_start_loc", "non-decreasing values", qsl[1:], offset=1)
    c.value(
        qsl[-1:] <= num_tokens,
        "query_start_loc",
        f"query_start_loc[-1] <= num_tokens ({num_tokens})",
        qsl[-1:],
        offset=last,
    )
    c.value(lens >= 0, "seq_lens", "non-negative lengths", lens)
    capacity = max_blocks * block_size
    c.value(
        lens <= capacity,
        "seq_lens",
        f"lengths <= block_table capacity {max_blocks} x {block_size} = {capacity}",
        lens,
    )
    used = torch.arange(max_blocks, device=lens.device)[None, :] < ((lens + block_size - 1) // block_size)[:, None]
    ids = block_table.long()
    c.value(
        ~used | ((ids >= 0) & (ids < num_blocks)),
        "block_table",
        f"block ids in [0, {num_blocks}) in the used part",
        ids,
    )
