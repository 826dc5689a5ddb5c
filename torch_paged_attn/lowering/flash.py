"""The FlashAttention backend: paged_attention (and MLA decode on FlashAttention-4) through the
FlashAttention package that is installed, imported inside functions.

Adapters, tried in this order (the first installed one that supports the call runs it):

    fa4  flash_attn.cute.interface._flash_attn_fwd(q, k, v, qv, cu_seqlens_q, seqused_k, page_table,
         softmax_scale, causal, window_size_left/right, learnable_sink, softcap, return_lse, out)
         (what flash_attn.cute.flash_attn_varlen_func calls, with an output tensor; the public
         function where that is missing; flash-attn-4 4.0.0b36; SM90 and SM100/110; paged KV is
         not supported on SM80/SM120)
    fa3  flash_attn_interface.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens,
         page_table, cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_size, softcap,
         return_softmax_lse)                                         (FlashAttention-3, SM90)
    fa2  flash_attn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
         max_seqlen_k, softmax_scale, causal, window_size, softcap, alibi_slopes,
         return_attn_probs, block_table)       (flash-attn 2, SM80/SM90, block size % 256 == 0)

Each adapter says what it cannot do (``Adapter.unsupported``); the dispatcher then runs Triton
(``lowering.select``, one debug log line per reason). Conventions translated here: the contract's
LSE is ``[T, Hq]`` natural log, FlashAttention's is ``[Hq, T]`` (``[T, H]`` with ``qv``), natural
log, with ``+inf`` (FA2) for empty rows -> ``-inf``; rows past ``query_start_loc[-1]`` are not
written by FlashAttention -> 0 and ``-inf`` here; causal is bottom-right aligned in both; a causal
call's right window is the diagonal in both; ``-1`` (unbounded) is ``None`` for FA4; sinks are
raw logits in both. A sequence whose table holds an id outside ``[0, NB)`` in its used part
attends to no key on this backend (0 and -inf, or its sink alone: no other block's keys are ever
read in its place; the Triton kernels mask just the bad blocks); ``TORCH_PAGED_ATTN_DEBUG=1``
rejects such tables.

No pass over the output: FA4 writes into the caller's ``out`` (``interface._flash_attn_fwd``'s
``out=``, when ``out``'s layout is one FA4 takes: contiguous last dimension, 16-byte aligned
strides), and small kernels (``flash_kernels``) do the rest. The common call (FA4 into ``out``, no
LSE) costs one launch beside FlashAttention's, before it: it zeroes the length of each sequence
with a bad block id and the padding rows of ``out``, which FlashAttention never writes. A launch
after the call runs only where it has work: an LSE to write in the contract's layout (a ``[T,
Hq]`` float32 copy, the only data moved beside FlashAttention's), or padding rows to zero again
after FlashAttention's own buffer was copied over ``out`` (FA3 and FA2, the fallbacks, and outputs
FA4 does not take). What a call of one signature needs beside its tensors (FlashAttention's fixed
arguments, the kernels' launchers) is derived once (``_Plan``): at plan time for eager calls
(``prepare_paged_attention``), at a signature's first run otherwise. From a plan's second call
into ``out``, the kernel FA4 compiled for the signature is called directly, without FA4's forward
and its 100-230 us of host time (``_Recorder``).

Graphs: the call goes through the private opaque op ``paged_attn::_flash_attention`` (a
``torch.library.custom_op`` that mutates exactly ``out`` and ``lse``, with a fake), so Inductor,
which traces the public triton_op's body, sees one extern call and never traces into the CuTe-DSL
kernel; Dynamo and export keep the one public node. FA4 compiles a kernel on its first call: run
one call before CUDA-graph capture. This module imports nothing from ``torch_paged_attn.ops``.
"""

from __future__ import annotations

import abc
import functools
import importlib
import inspect
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# -- "auto": when FlashAttention runs ---------------------------------------------------------
# "auto" runs FlashAttention for a prefill-like call it supports and Triton otherwise. H200, bf16,
# block 16, Hq 32 / Hkv 8, D 128, 2026-11-22 (benchmarks/paged_attention.py):
#   decode, % of copy bandwidth, Triton vs FA4: B64x4096 102.5 vs 91.6; B1x32768 69 vs 7.5;
#   B8x8192 Hq64 89 vs 54.5; B256x1024 97 vs 71; MHA B32x2048 102 vs 89 -> Triton on every one.
#   prefill, TFLOP/s, FA4 vs Triton: 4 x 2048 causal 485 vs 247; chunked 4 x 512 on 4 x 4096
#   593 vs 291 -> FlashAttention about 2x.
# Prefill-like = at least this many query tokens per sequence: ``max_query_len`` when the call
# gives it (a static int), else ``num_tokens // num_seqs`` (shapes). Measured: 1 (Triton) and
# 512 (FA4); unmeasured in between. 128 is one FA4 query tile (tile_m 128): below it FA4's tile
# is partly empty while Triton's decode/short-query configurations are not.
AUTO_FLASH_MIN_QUERY_TOKENS = 128

_HALF = (torch.bfloat16, torch.float16)
# FA4 loads pages by TMA when page_size == tile_n (its tiles: 64..192 keys). TMA reads whole
# pages, and rows past seq_len in a sequence's last page must then be finite (FA4's docstring);
# the contract lets uncovered slots hold NaN, so those block sizes run Triton instead.
_FA4_TMA_TILES = (64, 80, 96, 112, 128, 144, 160, 176, 192)
# FA3 loads pages by TMA when page_size is a multiple of its tile (>= 64 keys); below 64 never.
_FA3_MAX_BLOCK_SIZE = 63
# flash-attn 2's paged kernels require page_block_size % 256 == 0 (csrc/flash_attn/flash_api.cpp).
_FA2_BLOCK_MULTIPLE = 256


def _common(f: dict, cap: tuple[int, int] | None, majors: tuple[int, ...]) -> str | None:
    """Checks every adapter shares: a CUDA device of a supported architecture, 16-bit data."""
    if cap is None:
        return "no CUDA device"
    if cap[0] not in majors:
        return f"compute capability {cap[0]}.{cap[1]} (needs {' or '.join(f'{m}.x' for m in majors)})"
    if f.get("dtype") not in _HALF:
        return f"query dtype {f.get('dtype')} (bf16/fp16 only)"
    if f.get("cache_dtype") != f.get("dtype"):
        return f"cache dtype {f.get('cache_dtype')}: fp8 KV needs fp8 queries in FlashAttention"
    return None


def _paged_common(f: dict) -> str | None:
    if f.get("attention_chunk_size", 0) > 0:
        return "attention_chunk_size (local chunked attention)"
    if not f.get("cache_nhd", True):
        return "caches whose blocks are not [BS, Hkv, D] row-major (an HND view)"
    return None


@dataclass(frozen=True)
class Adapter(abc.ABC):
    """One FlashAttention generation: where it lives and what it cannot do."""

    name: str
    module: str  # imported to test for presence
    attribute: str  # the function the adapter calls

    @abc.abstractmethod
    def unsupported(self, op: str, f: dict, cap: tuple[int, int] | None) -> str | None:
        """None when this generation runs the call described by the facts ``f`` on a device of
        compute capability ``cap``, else why it cannot."""


class _FA4(Adapter):
    def unsupported(self, op, f, cap):
        if op == "mla_decode":
            reason = _common(f, cap, (10, 11))
            if reason:
                return reason
            if (f.get("latent"), f.get("rope")) != (512, 64):
                return f"MLA latent/rope {f.get('latent')}/{f.get('rope')} (FA4 takes 512/64)"
            bs = f.get("block_size", 0)
            if bs % 64 == 0 or bs in _FA4_TMA_TILES:
                return f"block_size {bs}: FA4 MLA loads such pages by TMA (needs finite unused slots)"
            return None
        reason = _common(f, cap, (9, 10, 11)) or _paged_common(f)
        if reason:
            return reason
        if f.get("alibi"):
            return "ALiBi"
        d, dv = f.get("head_size"), f.get("head_size_v")
        if cap[0] == 9:
            if not (8 <= d <= 256 and 8 <= dv <= 256 and d % 8 == 0 and dv % 8 == 0):
                return f"head sizes {d}/{dv} on SM90"
        elif not ((d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))):
            return f"head sizes {d}/{dv} on SM100 (<= 128, 192/128 or 256/256)"
        if f.get("block_size") in _FA4_TMA_TILES:
            return f"block_size {f.get('block_size')}: FA4 loads such pages by TMA (needs finite unused slots)"
        return None


class _FA3(Adapter):
    def unsupported(self, op, f, cap):
        if op != "paged_attention":
            return f"{op} is not wired to FlashAttention-3"
        reason = _common(f, cap, (9,)) or _paged_common(f)
        if reason:
            return reason
        if f.get("alibi"):
            return "ALiBi"
        if f.get("sinks"):
            return "sinks"
        d, dv = f.get("head_size"), f.get("head_size_v")
        if d != dv or not (8 <= d <= 256 and d % 8 == 0):
            return f"head sizes {d}/{dv}"
        if f.get("block_size", 0) > _FA3_MAX_BLOCK_SIZE:
            return f"block_size {f.get('block_size')} > {_FA3_MAX_BLOCK_SIZE}: FA3 may load pages by TMA"
        return None


class _FA2(Adapter):
    def unsupported(self, op, f, cap):
        if op != "paged_attention":
            return f"{op} is not wired to flash-attn 2"
        reason = _common(f, cap, (8, 9)) or _paged_common(f)
        if reason:
            return reason
        if f.get("sinks"):
            return "sinks"
        if f.get("alibi") and (not f.get("causal") or f.get("softcap", 0.0) > 0):
            return "ALiBi without causal or with softcap (FA2's bias is -slope * |i - j|)"
        d, dv = f.get("head_size"), f.get("head_size_v")
        if d != dv or not (8 <= d <= 256 and d % 8 == 0):
            return f"head sizes {d}/{dv}"
        if f.get("block_size", 0) % _FA2_BLOCK_MULTIPLE != 0:
            return f"block_size {f.get('block_size')} (flash-attn 2 pages are multiples of {_FA2_BLOCK_MULTIPLE})"
        return None


ADAPTERS = (
    _FA4("fa4", "flash_attn.cute", "flash_attn_varlen_func"),
    _FA3("fa3", "flash_attn_interface", "flash_attn_with_kvcache"),
    _FA2("fa2", "flash_attn", "flash_attn_varlen_func"),
)
_BY_NAME = {a.name: a for a in ADAPTERS}


@functools.lru_cache(maxsize=None)
def _function(name: str) -> Any:
    """The adapter's FlashAttention function, or the reason it cannot be imported (a str)."""
    adapter = _BY_NAME[name]
    try:
        module = importlib.import_module(adapter.module)
    except Exception as e:  # ImportError, or a CuTe DSL / CUDA extension that fails to load
        return f"{adapter.module} not importable ({type(e).__name__}: {str(e)[:100]})"
    if name == "fa2" and not str(getattr(module, "__version__", "")).startswith("2."):
        return f"flash_attn {getattr(module, '__version__', '?')} is not flash-attn 2"
    fn = getattr(module, adapter.attribute, None)
    return fn if callable(fn) else f"{adapter.module} has no {adapter.attribute}"


def installed() -> list[str]:
    """Names of the adapters whose FlashAttention package imports."""
    return [a.name for a in ADAPTERS if not isinstance(_function(a.name), str)]


def available() -> str | None:
    """None when some FlashAttention package imports, else why none does."""
    if installed():
        return None
    return "; ".join(_function(a.name) for a in ADAPTERS)


def _capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def pick(op: str, facts: dict, capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """``(adapter name, "")`` of the first installed adapter that runs the call, else
    ``(None, reasons)``."""
    reasons = []
    for adapter in ADAPTERS:
        fn = _function(adapter.name)
        reason = fn if isinstance(fn, str) else adapter.unsupported(op, facts, capability)
        if reason is None:
            return adapter.name, ""
        reasons.append(f"{adapter.name}: {reason}")
    return None, "; ".join(reasons)


def auto_declines(op: str, facts: dict) -> str | None:
    """The "auto" rule: why Triton runs a call FlashAttention may support (None: try flash)."""
    if op != "paged_attention":
        return f"auto: {op} runs Triton (FlashAttention only for prefill-like paged_attention)"
    tokens = facts.get("query_tokens_per_seq", 0)
    if tokens < AUTO_FLASH_MIN_QUERY_TOKENS:
        return f"auto: {tokens} query tokens per sequence < {AUTO_FLASH_MIN_QUERY_TOKENS} (decode-like: Triton)"
    return None


def supports(op: str, facts: dict) -> str | None:
    """None when a FlashAttention adapter runs this call (under the facts' backend setting)."""
    if op not in ("paged_attention", "mla_decode"):
        return f"no FlashAttention path for {op}"
    if facts.get("batch_invariant"):
        return "batch-invariant mode (FlashAttention's splits follow the batch)"
    if facts.get("backend") == "auto":
        reason = auto_declines(op, facts)
        if reason is not None:
            return reason
    name, reasons = pick(op, facts, _capability())
    return None if name is not None else reasons


# ---------------------------------------------------------------------------------------------
# the private opaque op
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _fa4_forward() -> Any:
    """FA4's forward with its ``out=`` argument (``flash_attn.cute.interface._flash_attn_fwd``,
    4.0.0b36: ``flash_attn_varlen_func`` takes no output tensor), or None where that module or
    argument is missing (then the public function runs and its result is copied)."""
    try:
        fn = importlib.import_module("flash_attn.cute.interface")._flash_attn_fwd
        return fn if "out" in inspect.signature(fn).parameters else None
    except Exception:  # absent, renamed or failing to load: the public function
        return None


def _fa4_out_alignment(out: Tensor) -> int:
    """FA4's output layout rule (its ``validate_output_layout``): contiguous last dimension, no
    broadcast, address and strides aligned to the returned number of bytes (32 for a head size of
    512, else 16), or 0 when ``out``'s strides break it (its address is checked per call)."""
    size, align = out.element_size(), 32 if out.shape[-1] == 512 else 16
    ok = out.stride(-1) == 1 and all(st != 0 and st * size % align == 0 for st in out.stride()[:-1])
    return align if ok else 0


# -- FA4's compiled kernel called directly -----------------------------------------------------
# FA4's forward (``_flash_attn_fwd``) spends 100-230 us of host time a call on an H100 host (checks,
# its compile key, argument packing: benchmarks/results/gpu-2026-11-27f/logs/probe-eager.txt,
# decode B8 x 8192 Hq64), then calls the kernel it compiled for that key with the call's tensors.
# Every value it derives from a signature's shapes and options is the same at each call of a
# ``_Plan``, so the plan's first call records that kernel call (``_Recorder``) and later calls make
# it themselves with their own tensors (``_replayer``), where the recorded call passed nothing
# but the call's own tensors (an LSE included: ``_call`` gives FA4 a buffer of the call's own for
# it): a split (FA4's partial buffers and combine) or a copied input (FA4's own tensors) keeps
# FA4's forward at every call. What FA4 reads from the environment when it picks its kernel (its
# logging level, scheduler defaults) is then read at the plan's first call only.

# Where that is done: the compute capabilities on which the flash backend's GPU tests ran FA4's
# kernel this way (sm_90: H100, FA4 4.0.0b36, tests/test_flash_backend.py, 2026-11-27,
# benchmarks/results/gpu-2026-11-27f/logs/pytest-flash.log). Elsewhere FA4's forward may do work
# beside its kernel on the call's own tensors that a replay would skip; there it runs every call.
DIRECT_CAPABILITIES = ((9, 0),)
_CAPTURE_LOCK = threading.Lock()


class _Recorder:
    """Stands in for FA4's ``_flash_attn_fwd.compile_cache`` (4.0.0b36: a mapping from compile
    key to compiled kernel) during one forward call: lookups and compilations go to the cache,
    and the calls this thread makes of a kernel it looked up are recorded with their arguments."""

    def __init__(self, cache: Any):
        self.cache, self.calls, self.thread, self.open = cache, [], threading.get_ident(), True

    def __contains__(self, key: Any) -> bool:
        return key in self.cache

    def __setitem__(self, key: Any, value: Any) -> None:
        self.cache[key] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def __getitem__(self, key: Any) -> Any:
        kernel = self.cache[key]
        if not self.open or threading.get_ident() != self.thread:
            return kernel

        def record(*args, **kwargs):
            self.calls.append((kernel, args, kwargs))
            return kernel(*args, **kwargs)

        return record


def _recorded_forward(forward: Any, tensors: dict[str, Tensor | None], options: dict) -> tuple[Any, Any]:
    """``forward(**tensors, **options)`` (FA4's ``_flash_attn_fwd``, or a wrapper of it, on the
    call's tensors by role and the plan's fixed arguments), and the direct caller of the compiled
    kernel it ran (``_replayer``; None where there is none to make)."""
    try:
        owner = importlib.import_module("flash_attn.cute.interface")._flash_attn_fwd
        cache = owner.compile_cache
    except Exception:  # no compile cache to watch: FA4's forward at every call
        return forward(**tensors, **options), None
    with _CAPTURE_LOCK:
        recorder = _Recorder(cache)
        owner.compile_cache = recorder
        try:
            result = forward(**tensors, **options)
        finally:
            recorder.open = False
            if owner.compile_cache is recorder:
                owner.compile_cache = cache
    return result, _replayer(recorder.calls, tensors)


def _same_view(a: Tensor, b: Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
            and a.stride() == b.stride())


def _holds_tensor(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is or holds a tensor (through sequences, mappings and object fields);
    True past a few levels of nesting (unknown: not replayed)."""
    if isinstance(value, Tensor):
        return True
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return False
    if depth > 4:
        return True
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(x, depth + 1) for x in value)
    if isinstance(value, dict):
        return any(_holds_tensor(x, depth + 1) for x in value.values())
    fields = list(getattr(value, "__dict__", {}).values())
    fields += [getattr(value, name, None) for name in getattr(type(value), "__slots__", ())]
    return any(_holds_tensor(x, depth + 1) for x in fields)


def _replayer(calls: list, tensors: dict[str, Tensor | None]) -> Any:
    """``call(tensors)`` making the one recorded kernel call with another call's tensors of the
    same roles (a dict as ``tensors``), or None unless exactly one kernel call was recorded, each
    tensor it took is one of ``tensors`` (by address, dtype, shape and strides: not a copy, not a
    buffer of FA4's own) and each of ``tensors`` reached it."""
    if len(calls) != 1:
        return None
    kernel, args, kwargs = calls[0]
    given = {role: t for role, t in tensors.items() if t is not None}
    template, slots = list(args), []
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            roles = [role for role, t in given.items() if _same_view(arg, t)]
            if len(roles) != 1:
                return None
            slots.append((i, roles[0]))
            template[i] = None
        elif _holds_tensor(arg):
            return None
    if kwargs or {role for _, role in slots} != set(given):
        return None

    def call(now: dict[str, Tensor | None]) -> None:
        args = template.copy()
        for i, role in slots:
            args[i] = now[role]
        kernel(*args)

    return call


class _Plan:
    """What a FlashAttention call of one signature (shapes, strides, dtypes, device and option
    values of its arguments, never tensor values) needs beside its tensors, derived once: the
    FlashAttention function and its fixed keyword arguments, whether FA4 writes into ``out``
    (its strides here, its address per call), the layout of FlashAttention's LSE, and the
    launchers of the kernels around the call (``flash_kernels``; the torch formulation where
    Triton does not run: CPU tensors without its interpreter). Calling it runs the private op's
    body: one launch before the call, FlashAttention, and a launch after it only when there is an
    LSE to write or FlashAttention's own buffer was copied into ``out``."""

    def __init__(self, adapter: str, block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
                 key_cache: Tensor, qv: Tensor | None, out: Tensor, lse: Tensor | None, scale: float,
                 causal: bool, window_left: int, window_right: int, softcap: float, max_query_len: int):
        num_tokens, num_heads, head_size_v = out.shape
        num_seqs = block_table.shape[0]
        self.adapter, self.num_tokens, self.num_seqs = adapter, num_tokens, num_seqs
        self.num_blocks, self.block_size = key_cache.shape[0], key_cache.shape[1]
        self.function = _function(adapter)
        self.scale, self.causal, self.softcap = scale, causal, softcap
        self.window_left, self.window_right = window_left, window_right
        self.return_lse = lse is not None
        self.max_q = min(max_query_len, num_tokens) if max_query_len > 0 else num_tokens  # a bound, never a value
        # FlashAttention's must be contiguous (FA4 asserts it; its page table's rows too): the
        # contract lets them be strided views, copied then
        self.qsl_contiguous = query_start_loc.is_contiguous()
        self.table_rows_contiguous = block_table.stride(1) == 1 or block_table.shape[1] <= 1
        # FlashAttention's LSE: [H, T], or [T, H] from FA4 with qv (MLA)
        self.head_major = adapter != "fa4" or qv is None
        self.src_shape = (num_heads, num_tokens) if self.head_major else (num_tokens, num_heads)
        self.forward, self.align = None, 0
        if adapter == "fa4":
            left = window_left if window_left >= 0 else None
            right = window_right if window_right >= 0 and not causal else None
            common = dict(max_seqlen_q=self.max_q, softmax_scale=scale, causal=causal, softcap=softcap,
                          return_lse=self.return_lse)
            self.forward_kwargs = dict(common, window_size_left=left, window_size_right=right)
            self.public_kwargs = dict(common, window_size=(left, right))
            forward = _fa4_forward()
            self.align = _fa4_out_alignment(out) if forward is not None else 0
            self.forward = forward if self.align else None
        # FA4's kernel called directly (see _Recorder): decided at the plan's first call into out
        self.capture = self.forward is not None and _device_capability(out.device) in DIRECT_CAPABILITIES
        self.direct = None
        self._kernels(block_table, seq_lens, query_start_loc, out, lse)

    def _kernels(self, block_table, seq_lens, query_start_loc, out, lse) -> None:
        self.before_launch = self.after_launch = None  # (copied, in place) -> launcher or None
        if not _kernels_run_on(out):
            return
        from . import flash_kernels as fk
        from .triton._launch import cdiv, launcher, next_power_of_2

        num_tokens, num_heads, head_size_v = out.shape
        rows = dict(num_seqs=self.num_seqs, num_tokens=num_tokens, stride_o_tok=out.stride(0),
                    stride_o_head=out.stride(1), stride_qsl=query_start_loc.stride(0), NUM_HEADS=num_heads,
                    HEAD_SIZE_V=head_size_v, BLOCK_T=fk.BLOCK_T, BLOCK_D=min(next_power_of_2(head_size_v), 128))
        guard = dict(num_blocks=self.num_blocks, stride_bt_seq=block_table.stride(0),
                     stride_bt_block=block_table.stride(1), stride_sl=seq_lens.stride(0), BLOCK_SIZE=self.block_size,
                     BLOCK_PAGES=fk.BLOCK_PAGES)
        padding_programs = cdiv(num_tokens, fk.BLOCK_T)
        # indexed by zero_padding: False where FlashAttention's buffer is copied over every row of
        # out (the padding rows are zeroed after the copy), True where FA4 writes into out (it
        # never writes a padding row: they are zeroed here, with the guard, in the one launch)
        self.before_launch = (
            launcher(fk.before_call_kernel, (self.num_seqs,), **guard, **rows, ZERO_PADDING=False)
            if self.num_seqs > 0 else None,
            launcher(fk.before_call_kernel, (self.num_seqs + padding_programs,), **guard, **rows, ZERO_PADDING=True),
        )
        has_lse = lse is not None
        lse_args = dict(
            lse_ptr=None, src_ptr=None, stride_lse_tok=0, stride_lse_head=0, stride_src_a=0,
        ) if not has_lse else dict(
            stride_lse_tok=lse.stride(0), stride_lse_head=lse.stride(1),
            stride_src_a=self.src_shape[1],  # src is contiguous (``_after``)
        )
        lse_args.update(BLOCK_H=min(next_power_of_2(num_heads), 64), HAS_LSE=has_lse,
                        SRC_TOKEN_MAJOR=not self.head_major)
        # indexed by in_place: after a copy, the padding rows (and the LSE); into out, the LSE alone
        self.after_launch = (
            launcher(fk.after_call_kernel, (padding_programs,), **rows, **lse_args, ZERO_PADDING=True),
            launcher(fk.after_call_kernel, (padding_programs,), **rows, **lse_args, ZERO_PADDING=False)
            if has_lse else None,
        )

    def __call__(self, query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                 query_start_loc: Tensor, qv: Tensor | None, out: Tensor, lse: Tensor | None,
                 alibi_slopes: Tensor | None, sinks: Tensor | None) -> None:
        in_place = self.forward is not None and out.data_ptr() % self.align == 0
        guarded = self._before(block_table, seq_lens, query_start_loc, out, in_place)
        cu_seqlens_q = query_start_loc if self.qsl_contiguous else query_start_loc.contiguous()
        page_table = block_table if self.table_rows_contiguous else block_table.contiguous()
        o, src = _call(self.adapter, self, query, key_cache, value_cache, page_table, guarded, cu_seqlens_q, qv,
                       out if in_place else None, alibi_slopes, sinks)
        if not in_place:  # FlashAttention's own buffer (an output layout FA4 does not take, FA3, FA2)
            out.copy_(o[: self.num_tokens])
        if lse is not None or not in_place:
            self._after(out, lse, src, query_start_loc, in_place)

    def _before(self, block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor, out: Tensor,
                zero_padding: bool) -> Tensor:
        """``seq_lens`` with 0 for each sequence whose table has an id outside ``[0, NB)`` in its
        used part and, with ``zero_padding``, the padding rows of ``out`` zeroed
        (``flash_kernels.before_call_kernel``, one launch)."""
        guarded = torch.empty(self.num_seqs, dtype=torch.int32, device=seq_lens.device)
        if self.before_launch is None:  # the torch formulation
            ok = (block_table >= 0) & (block_table < self.num_blocks)
            used = torch.arange(block_table.shape[1], device=block_table.device) * self.block_size < seq_lens[:, None]
            guarded.copy_(torch.where((used & ~ok).any(dim=1), 0, seq_lens))
            if zero_padding:
                valid = torch.arange(self.num_tokens, device=out.device) < query_start_loc[-1]
                out.masked_fill_(~valid[:, None, None], 0)
            return guarded
        go = self.before_launch[zero_padding]
        if go is not None:
            go(out, block_table_ptr=block_table, seq_lens_ptr=seq_lens, guarded_ptr=guarded, out_ptr=out,
               query_start_loc_ptr=query_start_loc)
        return guarded

    def _after(self, out: Tensor, lse: Tensor | None, src: Tensor | None, query_start_loc: Tensor,
               in_place: bool) -> None:
        """``lse`` from FlashAttention's ``src`` (``+inf``, FA2's empty row, as ``-inf``; padding
        rows ``-inf``) and, unless ``in_place``, the padding rows of ``out`` zeroed
        (``flash_kernels.after_call_kernel``, one launch; real rows of ``out`` untouched)."""
        if self.after_launch is None:  # the torch formulation
            valid = torch.arange(self.num_tokens, device=out.device) < query_start_loc[-1]
            if not in_place:
                out.masked_fill_(~valid[:, None, None], 0)
            if lse is not None:
                x = src.t() if self.head_major else src
                x = torch.where(x == float("inf"), float("-inf"), x)
                lse.copy_(torch.where(valid[:, None], x[: self.num_tokens], float("-inf")))
            return
        if lse is None:
            self.after_launch[0](out, out_ptr=out, query_start_loc_ptr=query_start_loc)
            return
        if src.dtype is not torch.float32 or src.shape != self.src_shape or not src.is_contiguous():
            # the kernel reads src as a contiguous float32 [H, T] ([T, H]); FlashAttention's is one
            src = (src[:, : self.num_tokens] if self.head_major else src[: self.num_tokens]).float().contiguous()
        self.after_launch[in_place](out, out_ptr=out, lse_ptr=lse, src_ptr=src, query_start_loc_ptr=query_start_loc)


def _call(adapter: str, plan: _Plan, q, k, v, block_table, seq_lens, query_start_loc, qv, out, alibi_slopes, sinks):
    """One FlashAttention call: ``(o, lse in FA's layout or None)``; ``o`` is ``out`` when it is
    given (FA4 writes into it: through its forward at the plan's first call, then through the
    kernel that call ran where it can be replayed, ``_Plan.direct``), else FlashAttention's own
    buffer."""
    if adapter == "fa4":
        if out is not None:
            tensors = dict(q=q, k=k, v=v, qv=qv, cu_seqlens_q=query_start_loc, seqused_k=seq_lens,
                           page_table=block_table, learnable_sink=sinks, out=out, lse=None)
            if plan.return_lse:  # FA4's LSE (its layout) into a buffer of the call's own, as out
                tensors["lse"] = torch.empty(plan.src_shape, dtype=torch.float32, device=out.device)
            if plan.direct is not None:
                plan.direct(tensors)
                return out, tensors["lse"]
            if not plan.capture:
                return plan.forward(**tensors, **plan.forward_kwargs)[:2]
            plan.capture = False
            result, plan.direct = _recorded_forward(plan.forward, tensors, plan.forward_kwargs)
            return result[:2]
        res = plan.function(q, k, v, qv=qv, cu_seqlens_q=query_start_loc, seqused_k=seq_lens, page_table=block_table,
                            learnable_sink=sinks, **plan.public_kwargs)
        o, lse = res if isinstance(res, tuple) else (res, None)
        return o, lse if plan.return_lse else None
    # FA3 and FA2 may read table entries past a row's used part: ids made valid (0) for them
    fn, max_q, return_lse = plan.function, plan.max_q, plan.return_lse
    block_table = torch.where((block_table >= 0) & (block_table < plan.num_blocks), block_table, 0)
    q, seq_lens = q.contiguous(), seq_lens.contiguous()
    window = (plan.window_left, -1 if plan.causal else plan.window_right)
    if adapter == "fa3":
        res = fn(q, k, v, cache_seqlens=seq_lens, page_table=block_table, cu_seqlens_q=query_start_loc,
                 max_seqlen_q=max_q, softmax_scale=plan.scale, causal=plan.causal, window_size=window,
                 softcap=plan.softcap, return_softmax_lse=return_lse)
        return (res[0], res[1]) if return_lse else (res, None)
    cu_seqlens_k = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    o, lse, _ = fn(q, k, v, cu_seqlens_q=query_start_loc, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_q,
                   max_seqlen_k=block_table.shape[1] * k.shape[1], dropout_p=0.0, softmax_scale=plan.scale,
                   causal=plan.causal, window_size=window, softcap=plan.softcap, alibi_slopes=alibi_slopes,
                   return_attn_probs=True, block_table=block_table)
    return o, lse


@torch.library.custom_op("paged_attn::_flash_attention", mutates_args=("out", "lse"))
def _flash_attention(
    adapter: str,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    qv: Tensor | None,
    out: Tensor,
    lse: Tensor | None,
    scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    sinks: Tensor | None,
    max_query_len: int,
) -> None:
    """FlashAttention over a paged cache into ``out [T, H, Dv]`` and, when given, ``lse [T, H]``
    (float32, natural log), with the contract's values in every row. With ``qv`` (MLA), ``query``
    is the rope part and ``qv`` the latent part.

    The hot path (FA4 and an ``out`` it accepts, no ``lse``): one launch that zeroes the length of
    each sequence with a block id outside ``[0, NB)`` in its used part (it then attends to no key:
    0 and -inf, or its sink alone; no other block is read in its place) and the padding rows of
    ``out`` (past ``query_start_loc[-1]``, which FlashAttention never writes), then FlashAttention
    writing the real rows of ``out``. With ``lse``, one launch after it writes the LSE in the
    contract's layout; through FlashAttention's own buffer (FA3, FA2, an ``out`` FA4 does not
    take), the copy comes first and that launch zeroes the padding rows (``flash_kernels``)."""
    if query.shape[0] == 0:
        return
    plan = _plan_of(adapter, block_table, seq_lens, query_start_loc, key_cache, qv, out, lse, scale, causal,
                    window_left, window_right, softcap, max_query_len)
    plan(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, qv, out, lse, alibi_slopes, sinks)


@_flash_attention.register_fake
def _(adapter, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, qv, out, lse, scale,
      causal, window_left, window_right, softcap, alibi_slopes, sinks, max_query_len):
    return None


# Plans of the op's body (calls not planned by lowering.plan: traced or compiled ones at run time,
# MLA decode), by signature; cleared when full.
_PLANS: dict[tuple, _Plan] = {}
_PLAN_LIMIT = 256


def _plan_of(adapter: str, *args) -> _Plan:
    """The plan of a call with ``_Plan``'s arguments ``args``, made at its signature's first call."""
    key = (adapter, *[(a.shape, a.stride(), a.dtype, a.device) if isinstance(a, Tensor) else a for a in args])
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(adapter, *args)
    return plan


def _kernels_run_on(t: Tensor) -> bool:
    """Whether flash_kernels' Triton kernels run on ``t``'s device (CUDA, or the interpreter)."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _run_op(*args, **kwargs) -> None:
    """The private op: through the dispatcher when something may trace, else its body directly
    (the dispatcher's custom-op wrapper costs tens of microseconds of host time)."""
    from . import plain_eager

    if plain_eager(args[1]):
        return _flash_attention._init_fn(*args, **kwargs)
    return torch.ops.paged_attn._flash_attention(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# out-form functions (the signatures of torch_paged_attn.lowering)
# ---------------------------------------------------------------------------------------------


def paged_facts(query: Tensor, key_cache: Tensor, value_cache: Tensor, options: dict, with_lse: bool) -> dict:
    """The facts an adapter decides on, from a call's tensors and options (shapes only)."""
    _, block_size, num_kv_heads, head_size = key_cache.shape
    return {
        "dtype": query.dtype,
        "cache_dtype": key_cache.dtype,
        "head_size": head_size,
        "head_size_v": value_cache.shape[3],
        "block_size": block_size,
        "num_heads": query.shape[1],
        "num_kv_heads": num_kv_heads,
        "cache_nhd": cache_is_nhd(key_cache) and cache_is_nhd(value_cache),
        **{k: v for k, v in options.items() if not isinstance(v, Tensor)},
        "alibi": options.get("alibi_slopes") is not None,
        "sinks": options.get("sinks") is not None,
        "lse": with_lse,
    }


def cache_is_nhd(cache: Tensor) -> bool:
    """Whether each block of a ``[NB, BS, H, D]`` cache is row-major ``[BS, H, D]`` (any block stride)."""
    _, _, heads, size = cache.shape
    return cache.stride(3) == 1 and (heads == 1 or cache.stride(2) == size) and cache.stride(1) == heads * size


def _device_capability(device: torch.device) -> tuple[int, int] | None:
    """``device``'s compute capability; off CUDA, ``_capability()`` (the tests' fake FlashAttention
    on CPU tensors sets it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device.index if device.index is not None else None)
    return _capability()


def _adapter(op: str, facts: dict, device: torch.device) -> str:
    name, reasons = pick(op, facts, _device_capability(device))
    if name is None:  # select() asked supports() first; reaching here is a bug
        raise RuntimeError(f"torch_paged_attn: FlashAttention cannot run {op}: {reasons}")
    return name


def paged_attention(
    query: Tensor, key_cache: Tensor, value_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    **options,
) -> None:
    """Paged attention on FlashAttention into ``out`` / ``lse``; semantics of the contract."""
    args = (query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse)
    prepare_paged_attention(*args, **options)(*args, options)


def prepare_paged_attention(
    query: Tensor, key_cache: Tensor, value_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    *,
    scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
    alibi_slopes: Tensor | None, sinks: Tensor | None, k_scale: Tensor | None, v_scale: Tensor | None,
    attention_chunk_size: int, max_query_len: int = -1,
):
    """The runner of calls of this signature (``lowering.plan``): the adapter, the option values
    and, for a plan made eagerly, everything else the private op's body derives (``_Plan``: the
    FlashAttention function and its fixed arguments, the kernels' launchers) are decided once. A
    plain eager call then runs that body directly; a traced one goes through the private op."""
    if query.shape[0] == 0:
        return _nothing
    if block_table.shape[0] == 0:  # no sequence: every row is padding
        return _all_padding
    options = dict(scale=scale, causal=causal, window_left=window_left, window_right=window_right,
                   softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                   attention_chunk_size=attention_chunk_size, max_query_len=max_query_len)
    adapter = _adapter("paged_attention", paged_facts(query, key_cache, value_cache, options, lse is not None),
                       query.device)
    fixed = (float(scale), bool(causal), int(window_left), int(window_right), float(softcap))
    bound = int(max_query_len)
    from . import plain_eager

    # made only from real tensors (a traced call's shapes may be symbolic; its body plans at run time)
    plan = (_Plan(adapter, block_table, seq_lens, query_start_loc, key_cache, None, out, lse, *fixed, bound)
            if plain_eager(query) else None)

    def run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
        if plan is not None and plain_eager(query):
            plan(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, None, out, lse,
                 options["alibi_slopes"], options["sinks"])
        else:  # the private op (its body directly where nothing traces: a plan made while tracing)
            _run_op(adapter, query, key_cache, value_cache, block_table, seq_lens, query_start_loc, None, out, lse,
                    *fixed, options["alibi_slopes"], options["sinks"], bound)

    return run


def _nothing(*args) -> None:
    return None


def _all_padding(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, out, lse, options):
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))


def mla_decode(
    q_latent: Tensor, q_rope: Tensor, kv_cache: Tensor,
    block_table: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
    out: Tensor, lse: Tensor | None,
    *,
    scale: float, causal: bool, kv_scale: Tensor | None,
) -> None:
    """MLA decode on FA4's absorbed path: ``O = softmax(scale * (q_rope k_pe^T + q_latent c^T)) c``
    with ``k_pe`` / ``c`` the rope / latent columns of the cache rows (strided views, no copy)."""
    num_tokens, num_heads, latent = q_latent.shape
    if num_tokens == 0:
        return
    if block_table.shape[0] == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    facts = {"dtype": q_latent.dtype, "cache_dtype": kv_cache.dtype, "latent": latent,
             "rope": q_rope.shape[2], "block_size": kv_cache.shape[1], "num_heads": num_heads, "causal": causal}
    adapter = _adapter("mla_decode", facts, q_latent.device)
    k_pe = kv_cache[..., latent:].unsqueeze(2)  # [NB, BS, 1, R]
    c = kv_cache[..., :latent].unsqueeze(2)  # [NB, BS, 1, L]
    _run_op(
        adapter, q_rope, k_pe, c, block_table, seq_lens, query_start_loc, q_latent, out, lse,
        float(scale), bool(causal), -1, -1, 0.0, None, None, -1,
    )
