"""The pinned launch's native half: ``_pinned.cpp``, built once per environment with the system's
C++ compiler against the installed torch, and the ``Pinned`` launches made from it.

A repeated plain eager call that its entry serves (``lowering.eager_planned``) launches its plan's
one binary through ``go.pin``'s ``fire`` (``_launch.py``, "Pinned launches"). Where this module
loads, ``fire`` is a ``Pinned``: the binary's kernel parameters packed once, at pin time, from its
signature (``pack``), so a call reads the tensors' addresses, allocates the functional form's output
(``fire.new``) and calls the driver (``cuLaunchKernelEx``, as Triton's C launcher does) in one
native call, with no Python frame, argument parsing of the ~70 launch arguments or Python
allocation between. It declines (launches nothing: the caller takes the runner) exactly where the
Python ``fire`` does: the fast-launch switch off or in check mode, Triton's hooks, another current
device, an address the binary was specialised on not 16-byte aligned.

``TORCH_PAGED_ATTN_NATIVE_LAUNCH=0`` keeps the Python ``fire`` (read when a call is first
remembered). Building needs a C++17 compiler (``CXX``, else ``c++``) and torch's headers, as Triton
needs a C compiler for its own launchers; the first pinned call of a process that finds no build
compiles it (about 20 s on a 2-core x86-64 CPU) into ``TORCH_PAGED_ATTN_CACHE_DIR`` (default
``~/.cache/torch_paged_attn``), under a name from the source, torch, Python and compiler, with a
file lock for processes that start together. Where building or loading fails, the reason is logged
once and the Python ``fire`` serves.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
from types import ModuleType
from typing import Any, Callable

import torch

from ..._config import EnvVar

_log = logging.getLogger(__name__)

SWITCH = EnvVar("TORCH_PAGED_ATTN_NATIVE_LAUNCH", lambda v: v not in ("", "0"), unset="1")
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pinned.cpp")
_NAME = "_tpa_pinned"
_UNTRIED = object()
_module: Any = _UNTRIED


def module() -> ModuleType | None:
    """The built ``_pinned.cpp`` (built first where no build of this source, torch, Python and
    compiler exists), None where it cannot be built or loaded (logged once) or is switched off."""
    global _module
    if not SWITCH.read():
        return None
    if _module is _UNTRIED:
        try:
            _module = _load(build())
        except Exception as e:  # no compiler, no headers, a failed build: the Python fire serves
            _log.warning("torch_paged_attn: native pinned launches unavailable (%s: %s)",
                         type(e).__name__, str(e).strip()[-400:])
            _module = None
    return _module


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _command(source: str, target: str) -> list[str]:
    from torch.utils import cpp_extension

    import triton.backends.nvidia as nvidia  # cuda.h: Triton's copy, the one its launchers build with

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"],
                os.path.join(os.path.dirname(nvidia.__file__), "include")]
    return [
        _compiler(), "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in includes), source, "-o", target,
        f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python",
    ]


def build() -> str:
    """The path of the built extension (compiled now where the cache has none): its name hashes
    the source, torch's version, Python's and the compiler command."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    tag = hashlib.sha256(b"\0".join([
        source, torch.__version__.encode(), sys.version.encode(), " ".join(_command("S", "T")).encode(),
    ])).hexdigest()[:20]
    folder = os.environ.get("TORCH_PAGED_ATTN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_paged_attn")
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, f"{_NAME}-{tag}{sysconfig.get_config_var('EXT_SUFFIX')}")
    if os.path.exists(target):
        return target
    import fcntl

    with open(os.path.join(folder, f"{_NAME}-{tag}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same: wait, then load its build
        if os.path.exists(target):
            return target
        _log.warning("torch_paged_attn: building the native pinned launcher (once per environment) into %s",
                     folder)
        fd, partial = tempfile.mkstemp(dir=folder, suffix=".so")
        os.close(fd)
        try:
            done = subprocess.run(_command(_SOURCE, partial), capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{_compiler()} exited {done.returncode}: {done.stderr[-2000:]}")
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return target


def _load(path: str) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Triton 3.6's C launcher (backends/nvidia/driver.py: ty_to_cpp, FLOAT_STORAGE_TYPE and the pack_*
# functions): each non-constexpr parameter's C type; the driver reads a parameter at its address
_INTS = {"i1": (1, True), "i8": (1, True), "i16": (2, True), "i32": (4, True), "i64": (8, True),
         "u1": (1, False), "u8": (1, False), "u16": (2, False), "u32": (4, False), "u64": (8, False)}


def _pack_value(ty: str, value: Any) -> bytes:
    """``value`` as Triton's launcher stores a parameter of type ``ty``, in an 8-byte slot."""
    if ty in _INTS:
        size, signed = _INTS[ty]
        raw = int(value).to_bytes(size, "little", signed=signed)
    elif ty == "fp16":
        raw = struct.pack("<e", float(value))
    elif ty == "bf16":  # the float32's upper half (pack_bf16 truncates)
        raw = struct.pack("<f", float(value))[2:]
    elif ty in ("fp32", "f32"):
        raw = struct.pack("<f", float(value))
    elif ty == "fp64":
        raw = struct.pack("<d", float(value))
    else:
        raise TypeError(f"no native packing of a {ty!r} parameter")
    return raw.ljust(8, b"\0")


def pack(signature: dict[str, str], spec: dict[str, tuple[str, Any]]) -> tuple[bytes, list[int]]:
    """The kernel parameters of a binary with ``signature`` (parameter name -> Triton type, in
    order; ``"constexpr"`` ones are not passed) for ``spec`` (name -> ``("t", tensor index)`` or
    ``("v", value)``): the packed bytes (8 a parameter, Triton's two scratch pointers last, null)
    and the flattened ``(parameter, tensor)`` pairs whose slots take tensor addresses."""
    params, slots = [], []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        kind, value = spec[name]
        if ty.startswith("*"):
            if kind != "t":
                raise TypeError(f"pointer parameter {name} without a pinned tensor")
            slots += [len(params), value]
            params.append(bytes(8))
        elif kind == "v":
            params.append(_pack_value(ty, value))
        else:
            raise TypeError(f"tensor given for the {ty} parameter {name}")
    params += [bytes(8), bytes(8)]  # global_scratch, profile_scratch: none (a direct launch's binary)
    return b"".join(params), slots


def pinned(ready: Callable[[], bool], entry: tuple, grid: tuple, device: int, spec: dict, tensors: int,
           aligned: list[int], out: torch.Tensor) -> Any:
    """A ``Pinned`` launch of ``entry``'s binary (an entry of ``FastLauncher._plain_entry``) over
    ``grid`` on ``device`` with the parameters ``spec`` names (see ``pack``), taking ``tensors``
    tensors (the last one ``out``, which ``fire.new`` allocates like ``out``); None where the
    native module is not available or the binary's launch is not one it makes (not Triton 3.6's
    direct launch, a cluster, a parameter type it does not pack)."""
    _, function, metadata, compiled, cooperative, pdl = entry
    if cooperative is None:  # launched through its run (scratch memory, another launcher)
        return None
    try:
        num_warps, num_ctas, shared = metadata
        signature = compiled.src.signature
        if num_ctas != 1 or not isinstance(signature, dict):
            return None
        params, slots = pack(signature, spec)
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
        return None
    native = module()
    if native is None:
        return None
    try:
        return native.Pinned(ready, function, grid, 32 * num_warps, shared, bool(pdl), bool(cooperative), device,
                             tensors, params, slots, aligned, tuple(out.shape), out, entry)
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:  # no driver library, say
        _log.warning("torch_paged_attn: no native pinned launch (%s: %s)", type(e).__name__, e)
        return None
