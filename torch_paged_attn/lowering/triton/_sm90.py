"""What the Gluon sm_90 kernels (``prefill_sm90``, ``mla_sm90``) share on the host: whether the
device and this Triton can run them, which paged caches their TMA copies can read, and the TMA
descriptor of such a cache.

A cache ``[NB, BS, ...]`` is read as the 2-D ``[NB * BS, W]`` view (one row a slot, W its
elements), in boxes of ``[box, 64]`` (``box = min(BS, 64)`` rows of 64 columns: 128 bytes of
bf16/fp16 with the 128-byte swizzle, 64 bytes of fp8 with the 64-byte one); a row index past the last one reads zeros, which the kernels use
for block ids outside ``[0, NB)``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

import torch
import triton
from torch import Tensor

try:  # Gluon ships with Triton >= 3.5; without it the Gluon kernels decline every call
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma as _tma

    # Names that moved between the Tritons the kernels compile with (3.6, the GPU host's, and
    # 3.9, checked by compiling for sm_90): the TMA copy of a tile into shared memory (descriptor,
    # coordinates, barrier, destination), ``async_copy_global_to_shared`` in 3.6, ``async_load``
    # in 3.9 (which removed the old name);
    tma_load = getattr(_tma, "async_load", None) or _tma.async_copy_global_to_shared
    # A barrier of the calling warps (within a warp-specialised partition, its warps):
    # ``thread_barrier`` in 3.6, ``barrier`` in 3.9.
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
except ImportError:  # pragma: no cover - depends on the installed Triton
    gl = None


# The Tritons (major, minor) whose Gluon the kernels were run and tested with on an H100 (3.6);
# they compile with 3.9 too (``benchmarks/sass_report.py``, ``tests/test_benchmarks_smoke.py``)
# but run only once tested: other versions take the Triton kernels.
TESTED_TRITON = frozenset({(3, 6)})
TRITON_VERSION = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", triton.__version__).groups())


def unavailable(t: Tensor) -> str | None:
    """Why a Gluon sm_90 kernel cannot run on ``t``'s device (None: it can)."""
    if gl is None:
        return "Gluon is not available in this Triton"
    if TRITON_VERSION not in TESTED_TRITON:
        return (f"Gluon kernels tested with Triton {', '.join('%d.%d' % v for v in sorted(TESTED_TRITON))} "
                f"only (this is {triton.__version__})")
    if t.device.type != "cuda" or torch.cuda.get_device_capability(t.device) != (9, 0):
        return "not an sm_90 device"
    return None


def row_layout(cache: Tensor) -> tuple[int, int, int] | None:
    """How a paged cache ``[NB, BS, W...]`` (MLA) or ``[NB, BS, Hkv, D]`` lies in its ``[rows, W]``
    view (``descriptor_spec``: one row a slot, ``W`` = the slot stride, from the cache's first
    element): ``(block_rows, head_rows, head_cols)``, slot ``s`` of head ``h`` in block ``b`` being
    row ``b * block_rows + h * head_rows + s``, its elements from column ``h * head_cols``. A
    contiguous cache is ``(BS, 0, D)`` (``(BS, 0, 0)`` for MLA); a layer of a cross-layer buffer
    ``[NB, layers, BS, ...]`` has ``block_rows = layers * BS``; an HND view ``[NB, Hkv, BS,
    D].permute(0, 2, 1, 3)`` is ``(Hkv * BS, BS, 0)``, ``W = D``. None: no such view (a last
    dimension that is not contiguous, blocks not a whole number of rows apart, heads neither
    side by side in a row nor a whole number of rows apart)."""
    if cache.stride(-1) != 1 or cache.dim() not in (3, 4):
        return None
    width, s0 = cache.stride(1), cache.stride(0)
    if width < 1 or s0 % width:
        return None
    if cache.dim() == 3:
        return (s0 // width, 0, 0) if cache.shape[2] <= width else None
    heads, size, s2 = cache.shape[2], cache.shape[3], cache.stride(2)
    if heads == 1:
        return (s0 // width, 0, 0) if size <= width else None
    if s2 % width == 0 and s2 // width >= cache.shape[1]:  # each head's slots a run of rows
        return s0 // width, s2 // width, 0
    if size <= s2 and (heads - 1) * s2 + size <= width:  # the heads side by side in a row
        return s0 // width, 0, s2
    return None


def block_rows(cache: Tensor) -> int:
    """Rows of the ``[rows, W]`` view from one block of ``cache`` to the next (``row_layout``)."""
    return row_layout(cache)[0]


def view_rows(cache: Tensor) -> int:
    """Rows of ``cache``'s ``[rows, W]`` view: up to the last block's last head's last slot. The
    kernels send a block id outside ``[0, NB)`` to this row, past the view, where TMA reads zeros."""
    rows, head_rows, _ = row_layout(cache)
    heads = cache.shape[2] if cache.dim() == 4 else 1
    return (cache.shape[0] - 1) * rows + (heads - 1) * head_rows + cache.shape[1]


def cache_declines(caches: Iterable[Tensor], strided: bool = False) -> str | None:
    """Why TMA cannot read these paged caches ``[NB, BS, ...]`` (None: it can): a block size that
    is a power of two >= 8, contiguous storage starting 16-byte aligned (the caching allocator's
    storages start 512-byte aligned), and fewer than 2^31 rows (TMA coordinates are int32; the
    kernels address one row past the last). ``strided`` (a kernel that addresses rows and columns
    as ``row_layout`` says): any cache with such a view whose row stride is a multiple of 16 bytes
    (a layer of a cross-layer buffer, K and V unbound from ``[NB, 2, ...]``, the HND view)."""
    for cache in caches:
        num_blocks, block_size = cache.shape[:2]
        if block_size < 8 or block_size & (block_size - 1):
            return "block size: a power of two >= 8 only"
        if strided:
            if row_layout(cache) is None or cache.stride(1) * cache.element_size() % 16:
                return "caches: a slot's elements in one row of the cache, rows 16-byte aligned"
        elif not cache.is_contiguous():
            return "caches: contiguous, 16-byte aligned storage only"
        if cache.storage_offset() * cache.element_size() % 16:
            return "caches: storage 16-byte aligned"
        if view_rows(cache) >= 2**31 - 64:
            return "cache rows: under 2^31 (TMA coordinates are int32)"
    return None


@functools.lru_cache(maxsize=None)
def _smem_layout(box: int, dtype: torch.dtype):
    element = {torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}
    return gl.NVMMASharedLayout.get_default_for([box, 64], element.get(dtype, gl.float16))


def descriptor_spec(cache: Tensor, box: int):
    """The TMA descriptor of a cache the kernels take (``cache_declines``) as a ``[rows, W]`` view
    from its first element (``view_rows``; ``[NB * BS, W]`` for a contiguous cache, one row a slot,
    a block's slot ``s`` at row ``block * block_rows + s``), boxes ``[box, 64]``, for
    ``_launch.launcher``: the plans fix it once, and each call passes the cache itself (the base).
    A ``TensorDescriptor`` built per call instead cost 3.6 us of host time with the layout cached,
    14.6 us without (2-core CI host), and Triton 3.6 encoded it again at every launch
    (``_launch``, "Pre-encoded descriptors")."""
    from ._launch import descriptor

    width = cache.stride(1)
    return descriptor((view_rows(cache), width), (width, 1), (box, 64), _smem_layout(box, cache.dtype))


def descriptor(cache: Tensor, box: int):
    """``descriptor_spec``'s ``TensorDescriptor`` for ``cache`` (what ``kernel[grid]`` takes)."""
    return descriptor_spec(cache, box).of(cache)


# Launchers an opaque op's body keeps (``kept_launcher``): its calls' shapes vary, so the store is bounded.
_KEPT_LAUNCHERS = 256


def kept_launcher(launchers: dict, key: tuple, make: Callable[[], Callable]) -> Callable:
    """``launchers[key]``, made by ``make()`` at its first call: the launcher that the body of a
    Gluon kernel's opaque op (``paged_attn::_mla_sm90``, ``_prefill_sm90``) keeps for calls of
    ``key``'s shapes and options, as a plan's runner keeps its own. At most ``_KEPT_LAUNCHERS``
    are kept."""
    go = launchers.get(key)
    if go is None:
        if len(launchers) >= _KEPT_LAUNCHERS:
            launchers.clear()
        go = launchers[key] = make()
    return go
