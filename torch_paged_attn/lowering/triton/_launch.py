"""The launch helpers of every Triton kernel of the package, and host-side integer helpers.

``launcher(kernel, grid, **constants)`` is what a plan (``lowering.plan``) keeps for each kernel it
launches: every argument but the tensors is fixed when the plan is made, and each call passes the
tensors alone, ``launcher(like, **tensors)``. On the cached path (below) the part of the cache key
that the constants decide is not recomputed per call: a call costs the tensors' dtypes and
addresses, one dictionary lookup and the binary's C launcher, which gets the addresses (no
driver query per pointer) and is called directly, with no Python frame of Triton's in between,
for every binary that needs no scratch memory ("Planned launches" below). Elsewhere it is
``launch(kernel, grid, like)(**tensors, **constants)``.

``launch(kernel, grid, like)`` is ``wrap_triton(kernel)[grid]`` whenever something may be
tracing (torch.compile, fake or functional tensors, a dispatch mode on the stack): that is what
lets torch.compile and AOTInductor see and launch the kernels themselves. For a plain eager call
on real CUDA tensors it is a cached launcher (below); otherwise the kernel's own ``kernel[grid]``
(the interpreter, CPU tensors, Triton versions whose launch protocol is not implemented here).

The cached launcher. ``JITFunction.run`` binds and specialises every argument on every call
(~70 us a launch of the attention kernel, 46 arguments, Triton 3.6, H200 host, 2026-11). Its
in-memory kernel cache is keyed on the specialisation of each argument (native_specialize_impl:
tensor -> (dtype, data_ptr % 16 == 0); int -> constexpr when == 1, else (i32 / i64 / u64 by
range, % 16 == 0); float -> fp32; bool -> u1; None -> constexpr; constexprs by value) and on the
launch options (num_warps, num_stages, ``knobs.runtime.debug``, instrumentation mode). The cached
launcher computes a key that determines all of those, with a generated function per kernel (one
expression per parameter, Python classes of scalars and constexprs included, so ``True``, ``1``
and ``1.0`` never share a key), plus the current device. The first call of a key goes through
``JITFunction.run``, which compiles or finds its binary, launches it and returns it; later calls
with an equal key call that binary's launcher directly, exactly as ``JITFunction.run`` ends:
``run(g0, g1, g2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
*all_arguments)`` (constexprs included, the C launcher skips them). A key finer than Triton's
only costs an extra cache entry; it is never coarser.

It runs only where that protocol was read from the source (Triton 3.6.x), on the current CUDA
stream (so CUDA-graph capture records it), and only while Triton has nothing attached to a launch
(no launch hooks, pre-run hooks, debug or instrumentation mode); anything else goes through
``kernel[grid]``. ``TORCH_PAGED_ATTN_FAST_LAUNCH=0`` turns it off; ``=check`` keeps it on and
asks Triton, at every cached launch, which binary it would run, raising if that is not the one
launched (tests and debugging; as slow as ``kernel[grid]``).

Pre-encoded descriptors. A Gluon kernel's host-side TMA descriptor is a ``TensorDescriptor``
argument; Triton 3.6's ``CudaLauncher`` (backends/nvidia/driver.py) wraps the binary's C
launcher ``mod.launch`` in ``wrap_handle_tensordesc``'s ``inner``, a Python loop over the
arguments that replaces each descriptor by ``make_tensordesc_arg(desc, meta)`` =
``[fill_tma_descriptor(...), *shape, *strides]`` (cuTensorMapEncodeTiled at every launch; ``meta``
from the binary's ``tensordesc_meta``), and ``CudaLauncher.__call__`` allocates global and profile
scratch only for sizes > 0 and passes ``launch_cooperative_grid`` and ``launch_pdl`` from the
metadata. With ``launcher(kernel, grid, x_desc=descriptor(shape, strides, box, layout), ...)``
a call passes the base tensor as ``x_desc``; a cached launch calls ``mod.launch`` (read from
``inner``'s closure with the descriptor indices and metadata, ``_unwrapped_launcher``) as
``inner`` would: ``mod.launch(g0, g1, g2, stream, function, launch_cooperative_grid, launch_pdl,
None, None, packed_metadata, None, None, None, *arguments)`` (``launch_metadata`` and hooks None:
``idle``), each descriptor expanded to the list Triton's own ``make_tensordesc_arg`` made for that
base address once (``DescriptorCache``). A binary with scratch, without TMA metadata or with
another launcher launches with a ``TensorDescriptor`` as before; elsewhere (tracing, CPU, other
Tritons) the ``TensorDescriptor`` is built per call and ``launch`` runs.

Planned launches. A ``launcher`` launch without descriptors calls its binary's C launcher the
same way, with the same 13 leading arguments (``mod.launch``, read from ``CudaLauncher.launch``:
``_direct_launch``), where ``JITFunction.run`` calls ``CudaLauncher.__call__``, a Python frame
that allocates no scratch for sizes of 0 and then calls ``mod.launch`` with exactly those
arguments (1.7 us a call under cProfile, 3000 paged_attention calls, H100 host, 2026-11-26). A
binary with scratch memory or another launcher gets its ``run`` with the arguments
``CompiledKernel.run`` takes (``_through_run``).

Pinned launches. ``go.pin(like, *tensors)`` (a ``launcher`` without descriptors, on the cached
path; ``go.pinned`` names the tensor parameters it takes, in the kernel's order, stand-ins left
out) returns ``fire(*tensors)`` for a caller that has already checked, per call, that the call
is a plain eager one (``lowering.plain_eager``) whose tensors have the dtypes, devices, sizes and
strides of the pinned ones (``lowering.eager_planned``'s check) and whose stand-ins are their
targets. ``fire`` then skips what ``go`` tests again per call (the cached path's test, keyword
binding, the dtype key): it reads the switch and ``idle``, the addresses and their alignment, and
the current device, launches the binary ``go`` found for those dtypes on that device (``pin``
returns None where ``go`` has not launched them aligned there yet) and returns True; where any of
those does not hold it launches nothing and returns False (call ``go``). Paged attention's eager decode
call: 11.4 us of host time before, 9.0 after (no-op binary, 2-core CPU, 2026-11-27); 24.7 and 22.4
on an H100 host, 2.2 less in 59 of 60 paired windows (1.9 on a second; benchmarks/RESULTS.md,
sixteenth run). Where ``_native`` builds and the binary's launch is one it makes (a direct launch,
no cluster, parameters it packs), ``pin`` returns its native ``Pinned`` instead: the same checks
and launch in one native call, with ``fire.new`` allocating the output as well (paged attention's
functional decode call: 17.5 us a call against 24.4 for this module's ``fire``, CUDA events, rows
interleaved over 30 rounds on one H100 host, benchmarks/RESULTS.md, seventeenth run).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NamedTuple

import torch
from torch.library import wrap_triton

from ..._config import EnvVar
from . import _native

_ENV = "TORCH_PAGED_ATTN_FAST_LAUNCH"
# Triton versions (major.minor) whose JITFunction.run / CompiledKernel.run protocol this module
# implements (read from their source: runtime/jit.py, compiler/compiler.py, backends/nvidia/driver.py).
_PROTOCOL_VERSIONS = ("3.6",)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``triton.cdiv`` is a constexpr function: ~5 us a host call)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (0 for ``n <= 0``), as ``triton.next_power_of_2``."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def contiguous_strides(*shape: int) -> tuple[int, ...]:
    """Strides of ``torch.empty(shape)`` for sizes >= 1 (torch counts a size of 0 as 1). No
    comparison of sizes: symbolic sizes while tracing give expressions, never guards."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step = step * size
    return tuple(reversed(strides))


def launch(kernel, grid, like: torch.Tensor):
    """The launcher of ``kernel`` over ``grid`` for a call whose tensors look like ``like``;
    call it with the kernel's arguments by keyword."""
    if type(like) is torch.Tensor and _dispatch_modes() == 0:
        mode = _cached_path_open(like)  # looked up in the module per call (benchmarks/overhead.py swaps it)
        if mode is not None:
            fast = _fast_launcher(kernel)
            if fast is not None and fast.idle():
                return fast.bind(grid, check=mode == "check")
        return kernel[grid]
    return wrap_triton(kernel)[grid]


_MODE = EnvVar(_ENV, lambda mode: "0" if mode in ("", "0") else mode, unset="1")


def fast_launch_mode() -> str:
    """``TORCH_PAGED_ATTN_FAST_LAUNCH``, read per launch: ``"1"`` (default), ``"0"`` or ``"check"``."""
    return _MODE.get()


class FastLauncher:
    """The cached launcher of one ``triton.runtime.JITFunction`` (see the module docstring).

    ``bind(grid)`` is a ``functools.partial`` of a function generated for the kernel's signature
    (at its first call, from the kinds of its arguments), so the keyword arguments of a launch
    are bound once, by the interpreter, with no dictionary in between.
    """

    def __init__(self, kernel, current_device: Callable[[], int] | None = None,
                 current_stream: Callable[[int], int] | None = None):
        from triton import knobs

        self.kernel = kernel
        self.knobs = knobs
        # what JITFunction.run uses (driver.active.get_current_device / get_current_stream),
        # looked up at the first launch
        self.current_device = current_device
        self.current_stream = current_stream
        self.cache: dict[tuple, tuple] = {}  # (device, key) -> (run, function, packed_metadata, compiled)
        self.misses = 0
        self.params = kernel.params
        self.launch: Callable | None = None  # the generated launcher: launch(grid, **arguments)
        self.key: Callable | None = None  # the generated key: key(**arguments) -> tuple | None
        self._factories: dict[tuple, Callable] = {}  # constant_launch's generated code, by names
        self._tensor_params: dict[tuple, tuple] = {}  # by names: go's tensor parameters, those aligned

    # -- when the cached path may run --

    def idle(self) -> bool:
        """True while Triton attaches nothing to a launch: no launch hooks, no pre-run hooks, no
        debug or instrumentation mode, no pipeline-inspection hook (all read by JITFunction.run)
        but the package's own (``_cluster.install``) with nothing chained behind it, which changes
        only the PTX of the kernels that carry its marker, and so which binary a key compiles to,
        not which one it runs (the cached path runs the binary ``JITFunction.run`` compiled)."""
        knobs, kernel = self.knobs, self.kernel
        runtime = knobs.runtime
        if kernel.pre_run_hooks or runtime.debug or kernel.debug or knobs.compilation.instrumentation_mode:
            return False
        enter, exit = runtime.launch_enter_hook, runtime.launch_exit_hook
        # Triton 3.6's HookChain: idle while its list of calls is empty (a bare callable is a hook)
        if enter is not None and (enter.calls if type(enter) is _HookChain else True):
            return False
        if exit is not None and (exit.calls if type(exit) is _HookChain else True):
            return False
        stages = getattr(runtime, "add_stages_inspection_hook", None)
        return stages is None or (getattr(stages, "tpa_cluster_pair", False) and stages.tpa_previous is None)

    def bind(self, grid, check: bool = False) -> Callable:
        """``kernel[grid]``'s equivalent: a callable taking the kernel's arguments by keyword."""
        if check:
            return functools.partial(self._checked, grid)
        if self.launch is None:
            return functools.partial(self._first, grid)
        return functools.partial(self.launch, grid)

    # -- the generated code --

    def _generate(self, kwargs: dict[str, Any]) -> None:
        """Generate ``self.key`` and ``self.launch`` from the kinds of the first call's arguments.

        The key holds, per parameter: a constexpr's value; a pointer's ``None`` or dtype and
        address % 16; an int's % 16 == 0 when 1 < n < 2**31, else its value (range only when
        do_not_specialize);
        and, for every scalar and constexpr, its Python class (compared with the first call's:
        another class returns None and takes the slow path). Then the launch options.
        """
        if self.current_device is None:
            from triton.runtime import driver

            self.current_device = driver.active.get_current_device
            self.current_stream = driver.active.get_current_stream
        signature, exprs, scalars, names = [], [], [], []
        namespace: dict[str, Any] = {}
        for p in self.params:
            n = p.name
            names.append(n)
            if p.has_default:
                namespace[f"_default_{n}"] = p.default
                signature.append(f"{n}=_default_{n}")
            else:
                signature.append(n)
            value = kwargs.get(n, p.default if p.has_default else None)
            if p.is_constexpr:
                exprs.append(n)
                scalars.append(n)
            elif value is None or isinstance(value, torch.Tensor):
                exprs.extend(_pointer_key(p))
            elif isinstance(value, (bool, float)):
                scalars.append(n)  # u1 / fp32: the class is the whole specialisation
            elif _is_tensor_descriptor(value):
                # a host-side TMA descriptor (Gluon kernels): specialised on its dtype, block
                # shape and shared layout (Triton 3.6, native_specialize_impl: not the base's
                # address, shape or strides); the binary's launcher encodes it at each launch
                scalars.append(n)
                exprs.append(f"{n}.base.dtype, tuple({n}.block_shape), {n}.layout, {n}.padding")
            elif isinstance(value, int):
                scalars.append(n)
                # a bool for the common values (i32, not 1), else the value in a tuple (never
                # equal to a bool); 30 ints cost 1.9 us this way, 5.8 us with a range test on
                # both sides and != 1 (2-core CI, 2026-11)
                if p.do_not_specialize:  # i32 / i64 / u64 by range
                    exprs.append(f"True if -2147483649 < {n} < 2147483648 else ({n},)")
                else:  # constexpr 1, or i32 / i64 / u64 and % 16 == 0
                    exprs.append(f"{n} & 15 == 0 if 1 < {n} < 2147483648 else ({n},)")
            else:
                raise TypeError(f"unsupported argument {n} of type {type(value).__name__}")
        params = ", ".join(signature + ["**_options"])
        arguments = "".join(f"{n}, " for n in names)
        by_name = "".join(f"{n}={n}, " for n in names)
        classes = "".join(f"{n}.__class__, " for n in scalars)
        key = f"({''.join(f'{e}, ' for e in exprs)}*_options.items())"
        src = f"""
def key({params}):
    if ({classes}) != _scalar_types:
        return None
    return {key}


def launch(_grid, {params}):
    try:
        if ({classes}) != _scalar_types:
            raise TypeError
        _key = {key}
        _device = _current_device()
        _entry = _cache[_device, _key]
    except (AttributeError, TypeError, KeyError):
        return _miss(_grid, dict({by_name}**_options))
    _n = len(_grid)
    _entry[0](_grid[0], _grid[1] if _n > 1 else 1, _grid[2] if _n > 2 else 1, _current_stream(_device),
              _entry[1], _entry[2], None, None, None, {arguments})
    return _entry[3]
"""
        first = {n: kwargs.get(n, namespace.get(f"_default_{n}")) for n in names}
        namespace.update(
            _scalar_types=tuple(type(first[n]) for n in scalars),
            _current_device=self.current_device,
            _current_stream=self.current_stream,
            _cache=self.cache,
            _miss=self._miss,
        )
        exec(src, namespace)
        self.key = namespace["key"]
        self.launch = namespace["launch"]

    def constant_launch(self, grid, constants: dict[str, Any], same: dict[str, str] | None = None,
                        descriptors: dict[str, Descriptor] | None = None) -> Callable:
        """``launcher(kernel, grid, **constants)``: ``go(like, **tensors)``, taking every
        parameter of the kernel that ``constants`` does not hold (tensors or None).

        Where the cached path is open (``_cached_path_open(like)`` and ``idle``), ``go`` keys
        binaries on ``(device, dtype and address % 16 of each tensor)`` in a cache of its own:
        with the constants fixed, that determines this launcher's key (which only adds the
        constants' classes and values and the launch options). A key not seen yet takes
        ``bind(grid)`` (a hit of this launcher's cache, or ``kernel[grid]``), and the binary the
        full key finds is then remembered under the short one; in check mode Triton is asked
        at every cached launch which binary it would run, as ``bind(grid, check=True)`` does.
        Elsewhere ``go`` is ``launch``.

        A cached launch calls the binary's C launcher (``_plain_entry``, ``_descriptor_entry``)
        and passes each tensor as its address (``data_ptr()``, read once for the key and the
        launch), which the C launcher takes as it is: given a tensor it would call
        ``data_ptr()`` again and ask the driver to translate the address
        (``cuPointerGetAttribute``), a check that the tensor is on a GPU. The caller guarantees
        that: every tensor of a call is on the device of ``like`` (the ops validate the devices of
        a call signature before they plan it). The code is generated once per set of constant
        names and ``same`` (``_factories``); each ``go`` only binds its values.

        ``same`` maps a tensor parameter to another that it usually is, or to None when it is
        usually None (``same_as``: a stand-in for an absent optional tensor): while it is that
        very object, ``go`` reads no dtype or address of it; any other value takes the full key.

        ``descriptors`` maps a descriptor parameter to its ``Descriptor`` (``launcher`` splits
        them off): ``go`` takes the base tensor there, and a cached launch calls the binary's C
        launcher itself with the encoded descriptor from ``DescriptorCache`` (see "Pre-encoded
        descriptors" in the module docstring); a binary whose launch cannot be taken apart that
        way (``_descriptor_entry``) launches as ``bind(grid)`` does, with a ``TensorDescriptor``.
        """
        same = same or {}
        descriptors = descriptors or {}
        same = {a: t for a, t in same.items() if a not in descriptors and t not in descriptors}
        names = (tuple(constants), tuple(same.items())) + ((tuple(descriptors),) if descriptors else ())
        factory = self._factories.get(names)
        if factory is None:
            factory = self._make_factory(constants, same, tuple(descriptors))
            if factory is None:  # no active Triton driver (no GPU): nothing could take the cached path
                return _elsewhere(self.kernel, grid, without_pdl(constants), descriptors)
            self._factories[names] = factory
        cache: dict[tuple, tuple] = {}  # (device, dtype and address % 16 of each tensor) -> entry
        aligned: dict[tuple, tuple] = {}  # (device, dtype of each tensor but aliases) -> entry
        own, aliases, specialised = self._tensor_params[names]

        def miss(key: tuple | None, tensors: dict[str, Any]):
            arguments = {**_described(tensors, descriptors), **constants}
            compiled = self.bind(grid)(**arguments)
            full = self._key(arguments)
            device = self.current_device()
            entry = self.cache.get((device, full)) if full is not None else None
            if entry is not None:
                entry = (self._descriptor_entry(entry, descriptors, tensors) if descriptors
                         else self._plain_entry(entry))
            if key is not None and entry is not None:
                cache[key] = entry
                given = [tensors[n] for n in own]
                if (
                    all(isinstance(t, torch.Tensor) for t in given)
                    and all(tensors[a] is (None if t is None else tensors[t]) for a, t in aliases)
                    and not any(tensors[n].data_ptr() & 15 for n in specialised)
                ):
                    aligned[(device, *(t.dtype for t in given))] = entry
            return compiled

        def check(entry: tuple, tensors: dict[str, Any]) -> None:
            chosen = self.kernel.run(grid=grid, warmup=True, **_described(tensors, descriptors), **constants)
            if chosen is not entry[3]:
                raise RuntimeError(
                    f"fast launch of {self.kernel.fn.__name__}: the cached binary is not the one "
                    f"Triton chooses for these arguments (constants {constants})"
                )

        g = (*grid, 1, 1)[:3]
        elsewhere = _elsewhere(self.kernel, grid, without_pdl(constants), descriptors)
        return factory(g[0], g[1], g[2], tuple(constants.values()), cache, aligned, miss, elsewhere, check)

    def _make_factory(self, constants: dict[str, Any], same: dict[str, str],
                      descriptors: tuple[str, ...] = ()) -> Callable | None:
        """The generated ``factory(g0, g1, g2, constant values, cache, aligned, miss, elsewhere,
        check) -> go`` of ``constant_launch`` for these constant names (None without an active
        Triton driver). A parameter with a default that ``constants`` does not name takes its
        default; the others are ``go``'s tensors.

        ``go`` looks a call up in two caches: when every tensor is given (none is None), every
        parameter of ``same`` is its target, and every address Triton specialises on is a
        multiple of 16 (the usual case: PyTorch's allocations are 512-byte aligned), in
        ``aligned`` under ``(device, dtype of each tensor but the aliases)``, which costs one OR
        of the addresses instead of a test and a key entry per address; otherwise in ``cache``
        under the full key. Paged attention's decode launch (14 pointers, 7 of them stand-ins),
        no-op binary, 2-core CPU, 2026-11-24: 5.6 us before (full key, constants as closure
        variables, two helper calls in ``idle``), 3.2 us after."""
        if self.current_device is None:
            from triton.runtime import driver

            try:
                active = driver.active
                self.current_device, self.current_stream = active.get_current_device, active.get_current_stream
            except RuntimeError:
                return None
        namespace: dict[str, Any] = {
            "_current_device": _fast_current_device(self.current_device),
            "_current_stream": self.current_stream,
            "_module": sys.modules[__name__],  # _cached_path_open is looked up per call (tests swap it)
            "_idle": self.idle,
            "_MODE": _MODE,
            "_ready": lambda: _MODE.read() == "1" and self.idle(),
            "_native_pin": _native.pinned,
        }
        tensors, exprs, arguments, specialised = [], [], [], []
        values: list[str] = []  # the native pin's spec of each fixed argument: "name: ('v', value)"
        runs: list[list[str]] = []  # runs of consecutive fixed arguments (constants, defaults)
        fixed_names = {p.name for p in self.params if p.name in constants or p.has_default}
        tensor_names = {p.name for p in self.params} - fixed_names
        # a hint whose target is not a tensor parameter (or is hinted itself) is dropped
        aliases = {a: t for a, t in same.items()
                   if a in tensor_names and (t is None or (t in tensor_names and t not in same))}
        for p in self.params:
            if p.name in constants or p.has_default:
                fixed = p.name
                if p.name not in constants:
                    namespace[f"_default_{p.name}"] = p.default
                    fixed = f"_default_{p.name}"
                if not arguments or not arguments[-1].startswith("*_fixed"):
                    runs.append([])
                    arguments.append(f"*_fixed{len(runs) - 1}")
                runs[-1].append(fixed)
                values.append(f"{p.name!r}: ('v', {fixed}), ")
            elif p.name in descriptors:  # the base tensor; Triton specialises the descriptor on its
                tensors.append(p.name)     # dtype, block shape and layout (the last two fixed here)
                exprs.append(f"{p.name}.dtype")
                arguments.append(f"*_d_{p.name}")
            else:
                tensors.append(p.name)
                exprs.extend(_pointer_key(p, address=f"_p_{p.name}"))
                arguments.append(f"_p_{p.name}")
                if not (p.do_not_specialize or p.do_not_specialize_on_alignment):
                    if aliases.get(p.name, p.name) is not None:
                        specialised.append(aliases.get(p.name, p.name))
        own = [n for n in tensors if n not in aliases]
        specialised = list(dict.fromkeys(specialised))
        self._tensor_params[(tuple(constants), tuple(same.items())) + ((descriptors,) if descriptors else ())] = (
            tuple(own), tuple(aliases.items()), tuple(specialised))
        addresses = "".join(f"_p_{n} = None if {n} is None else {n}.data_ptr()\n                " for n in tensors)
        stand_ins = " or ".join(f"{a} is not {t}" for a, t in aliases.items())
        # the addresses of the tensors given (None raises), the aliases' read off their targets: go's
        # short key and pin's fire (both bodies indented 12)
        own_addresses = "".join(f"_p_{n} = {n}.data_ptr()\n            " for n in own)
        own_addresses += "".join(f"_p_{a} = {'None' if t is None else f'_p_{t}'}\n            "
                                 for a, t in aliases.items())
        given = (f"if {stand_ins}:\n                raise TypeError\n            " if aliases else "") + own_addresses
        misaligned = " | ".join(f"_p_{n}" for n in specialised) or "0"
        dtypes = "".join(f"{n}.dtype, " for n in own)
        unpack = "".join(f"{n}, " for n in constants)
        by_name = "{" + "".join(f"{n!r}: {n}, " for n in tensors) + "}"
        by_keyword = "".join(f"{n}={n}, " for n in tensors)
        # the fixed arguments as tuples, star-unpacked into the call: 59 constants of the attention
        # kernel cost 0.7 us less than as 59 closure variables (2-core CPU, 2026-11-24)
        fixed_runs = "".join(f"    _fixed{i} = ({''.join(f'{a}, ' for a in run)})\n" for i, run in enumerate(runs))
        # the C launcher's arguments (an entry of _plain_entry or _descriptor_entry), descriptors encoded
        encoded = "".join(f"_d_{n} = _entry[{6 + j}].get(_p_{n}) or _entry[{6 + j}].encode({n})\n        "
                          for j, n in enumerate(d for d in tensors if d in descriptors))
        binary = (f"{encoded}_entry[0](_g0, _g1, _g2, _current_stream(_device), _entry[1], _entry[4], _entry[5], "
                  f"None, None, _entry[2], None, None, None,")
        # the native pin's spec (_native.pack): every fixed argument's value, every tensor's index
        # among the pinned ones (an alias its target's; one that stands in for None is a constexpr)
        spec = "{" + "".join(values) + "".join(
            f"{n!r}: ('t', {own.index(aliases.get(n, n))}), " for n in tensors if aliases.get(n, n) is not None) + "}"
        aligned_at = [own.index(n) for n in specialised]
        pin = "" if descriptors or not own else f"""
    def pin(_like, {", ".join(own)}):
        if _module._cached_path_open(_like) is None:
            return None
        try:
            _pinned_device = _current_device()
            _entry = _aligned.get((_pinned_device, {dtypes}))
        except AttributeError:
            return None
        if _entry is None:  # no aligned launch of these dtypes on this device yet
            return None
        _native = _native_pin(_ready, _entry, (_g0, _g1, _g2), _pinned_device, {spec}, {len(own)}, {aligned_at},
                              {own[-1]})
        if _native is not None:  # the same launch in one native call (_native.py)
            return _native

        def fire({", ".join(own)}):
            if _MODE.read() != "1" or not _idle():
                return False
            {own_addresses}if ({misaligned}) & 15:
                return False
            _device = _current_device()
            if _device != _pinned_device:
                return False
            {binary}
                      {"".join(f"{n}, " for n in arguments)})
            return True

        return fire

    go.pin = pin
    go.pinned = ({"".join(f"{n!r}, " for n in own)})
"""
        src = f"""
def factory(_g0, _g1, _g2, _constants, _cache, _aligned, _miss, _elsewhere, _check):
    ({unpack}) = _constants
{fixed_runs}
    def go(_like, {", ".join(tensors)}):
        _mode = _module._cached_path_open(_like)
        if _mode is None or not _idle():
            return _elsewhere(_like, {by_keyword})
        try:  # every tensor given, aliases their targets, specialised addresses aligned: the short key
            {given}if ({misaligned}) & 15:
                raise TypeError
            _device = _current_device()
            _entry = _aligned[_device, {dtypes}]
        except (AttributeError, TypeError, KeyError):
            try:
                {addresses}_device = _current_device()
                _key = (_device, {"".join(f"{e}, " for e in exprs)})
            except (AttributeError, TypeError):
                return _miss(None, {by_name})
            _entry = _cache.get(_key)
            if _entry is None:
                return _miss(_key, {by_name})
        if _mode != "1":
            _check(_entry, {by_name})
        {binary}
                  {"".join(f"{n}, " for n in arguments)})
        return _entry[3]
{pin}
    return go
"""
        exec(src, namespace)
        return namespace["factory"]

    def _plain_entry(self, entry: tuple) -> tuple:
        """The entry of ``constant_launch``'s launches without descriptors for the binary of
        ``entry`` (an entry of ``self.cache``: run, function, packed_metadata, compiled):
        ``(launch, function, packed_metadata, compiled, launch_cooperative_grid, launch_pdl)``,
        ``launch`` called as Triton 3.6's C launcher is, ``launch(g0, g1, g2, stream, function,
        launch_cooperative_grid, launch_pdl, None, None, packed_metadata, None, None, None,
        *arguments)``. Where the binary's ``run`` is Triton 3.6's ``CudaLauncher`` and needs no
        scratch memory (``_direct_launch``), ``launch`` is what ``run`` would call with those very
        arguments, with no Python frame between (see "Planned launches" in the module
        docstring); otherwise ``run`` itself behind ``_through_run``, which drops the four
        arguments ``CudaLauncher.__call__`` inserts."""
        direct = _direct_launch(entry[0])
        if direct is not None:
            return (direct[0], entry[1], entry[2], entry[3], direct[1], direct[2])
        return (functools.partial(_through_run, entry[0]), entry[1], entry[2], entry[3], None, None)

    def _descriptor_entry(self, entry: tuple, descriptors: dict[str, Descriptor], tensors: dict[str, Any]):
        """The entry of ``constant_launch``'s descriptor launches for the binary of ``entry`` (an
        entry of ``self.cache``: run, function, packed_metadata, compiled) whose descriptor
        parameters got the bases in ``tensors``: ``(C launcher, function, packed_metadata,
        compiled, launch_cooperative_grid, launch_pdl, DescriptorCache of each descriptor in
        parameter order)``; None where the binary's launch is not the one read from Triton 3.6
        (``_unwrapped_launcher``) or needs scratch memory, which then launches as before."""
        compiled = entry[3]
        direct = _direct_launch(getattr(compiled, "run", None))
        unwrapped = None if direct is None else _unwrapped_launcher(direct[0])
        if unwrapped is None:
            return None
        raw, indices, metas, encode = unwrapped
        positions = [i for i, p in enumerate(self.params) if p.name in descriptors]
        if sorted(indices) != positions or len(metas) != len(positions) or any(m is None for m in metas):
            return None  # descriptors not lowered to TMA (meta None): their expansion holds the tensor
        caches = tuple(
            DescriptorCache.of(descriptors[self.params[i].name], tensors[self.params[i].name].dtype, meta, encode)
            for i, meta in zip(positions, metas)
        )
        return (raw, compiled.function, compiled.packed_metadata, compiled, direct[1], direct[2], *caches)

    def _first(self, grid, **kwargs):
        self._generate(kwargs)
        return self.launch(grid, **kwargs)

    def _key(self, kwargs: dict[str, Any]) -> tuple | None:
        try:
            return self.key(**kwargs)
        except (AttributeError, TypeError):  # an argument of another kind: Triton decides
            return None

    def _miss(self, grid, kwargs: dict[str, Any]):
        """Through ``JITFunction.run`` (which compiles or finds the binary and launches it);
        the binary it returns serves later calls with the same key."""
        compiled = self.kernel[grid](**kwargs)
        key = self._key(kwargs)
        if key is not None and compiled is not None:
            entry = (compiled.run, compiled.function, compiled.packed_metadata, compiled)
            try:
                self.cache[self.current_device(), key] = entry
            except TypeError:  # an unhashable constexpr: this call shape stays on the slow path
                return compiled
            self.misses += 1
        return compiled

    def _checked(self, grid, **kwargs):
        """``TORCH_PAGED_ATTN_FAST_LAUNCH=check``: the cached launch, after asking Triton which
        binary it would run (``JITFunction.run(warmup=True)``: no launch) and raising unless it
        is the cached one."""
        if self.launch is None:
            self._generate(kwargs)
        key = self._key(kwargs)
        entry = self.cache.get((self.current_device(), key)) if key is not None else None
        if entry is not None:
            chosen = self.kernel.run(grid=grid, warmup=True, **kwargs)
            if chosen is not entry[3]:
                raise RuntimeError(
                    f"fast launch of {self.kernel.fn.__name__}: the cached binary is not the one "
                    f"Triton chooses for these arguments (key {key})"
                )
        return self.launch(grid, **kwargs)


def _fast_current_device(current_device: Callable[[], int]) -> Callable[[], int]:
    """``current_device`` (Triton's ``driver.active.get_current_device``), or, where that is
    ``torch.cuda.current_device``, the C function it returns after its lazy-initialisation test
    (``torch._C._cuda_getDevice``): the cached path runs only for CUDA tensors, so CUDA is
    initialised. One Python call fewer per launch (not yet measured on the GPU host)."""
    if current_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        return torch._C._cuda_getDevice
    return current_device


def _pointer_key(p, address: str | None = None) -> list[str]:
    """The key expressions of a pointer parameter ``p``: None -> constexpr None; a tensor -> its
    dtype and, unless the parameter is do_not_specialize(_on_alignment), whether its address is a
    multiple of 16 (flat, no inner tuple: 14 pointers cost 1.5 us instead of 3.7 us, 2-core CI).
    ``address``: the name of a variable already holding the address (None for None)."""
    n = p.name
    exprs = [f"None if {n} is None else {n}.dtype"]
    if not (p.do_not_specialize or p.do_not_specialize_on_alignment):
        exprs.append(f"None if {n} is None else {n}.data_ptr() & 15" if address is None
                     else f"None if {address} is None else {address} & 15")
    return exprs


class SameAs(NamedTuple):
    """``launcher(..., x_ptr=same_as("y_ptr"))``: the tensor passed as ``x_ptr`` is usually the one
    passed as ``y_ptr`` (a stand-in for an absent optional tensor); ``same_as(None)``: ``x_ptr`` is
    usually None. A hint, never an assumption: ``x_ptr`` is still passed at every call, and a call
    where it is anything else launches exactly as without the hint."""

    name: str | None


def same_as(name: str | None) -> SameAs:
    return SameAs(name)


def without_hints(constants: dict[str, Any]) -> dict[str, Any]:
    """The ``constants`` of a ``launcher`` call without its ``same_as`` hints: what the kernel
    takes besides the tensors (for code that records launches in place of ``launcher``)."""
    return {k: v for k, v in constants.items() if not isinstance(v, SameAs)}


def launcher(kernel, grid, **constants) -> Callable[..., Any]:
    """The launch of ``kernel`` over ``grid`` with every argument but the tensors fixed
    (``constants``: scalars, constexprs, None pointers and launch options, by keyword, and
    ``same_as`` hints for tensor parameters); call it as ``launcher(like, **tensors)`` with every
    other parameter of the kernel (hinted ones included; the base tensor for each ``descriptor``
    constant, see "Pre-encoded descriptors" above). Same results as
    ``launch(kernel, grid, like)(**tensors, **constants)``, which it is wherever Triton's launch
    protocol is not implemented here (``FastLauncher.constant_launch`` otherwise), there with
    programmatic dependent launch off (``without_pdl``)."""
    constants, same, descriptors = split_constants(constants)
    fast = None if torch.compiler.is_compiling() else _fast_launcher(kernel)
    if fast is None:
        return _elsewhere(kernel, grid, without_pdl(constants), descriptors)
    return fast.constant_launch(grid, constants, same, descriptors)


def split_constants(constants: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str | None], dict[str, Descriptor]]:
    """A ``launcher`` call's ``constants`` apart: ``(what the kernel takes besides the tensors,
    the same_as hints by parameter, the descriptor constants by parameter)``."""
    same = {k: v.name for k, v in constants.items() if isinstance(v, SameAs)}
    descriptors = {k: v for k, v in constants.items() if isinstance(v, Descriptor)}
    if same or descriptors:
        constants = {k: v for k, v in constants.items() if k not in same and k not in descriptors}
    return constants, same, descriptors


def _elsewhere(kernel, grid, constants: dict[str, Any], descriptors: dict[str, Descriptor]) -> Callable:
    """``launch``'s path for ``launcher``'s calls, a ``TensorDescriptor`` made per call for each
    descriptor parameter."""
    if descriptors:
        return functools.partial(_launch_with_descriptors, kernel, grid, constants, descriptors)
    return functools.partial(_launch_with, kernel, grid, constants)


def _launch_with(kernel, grid, constants: dict[str, Any], like: torch.Tensor, **tensors):
    return launch(kernel, grid, like)(**tensors, **constants)


def without_pdl(constants: dict[str, Any]) -> dict[str, Any]:
    """``constants`` with programmatic dependent launch off (no ``launch_pdl`` option, a
    ``USE_PDL`` constexpr False): what a ``launcher`` passes wherever it does not take the cached
    path. Only the cached path launches with it: ``wrap_triton`` takes no ``launch_pdl`` (it would
    reach the kernel as an argument), and Inductor's analysis of which tensors a kernel writes
    rejects the griddepcontrol instructions (inline assembly that is not pure). A kernel compiled
    with ``USE_PDL`` and launched without ``launch_pdl`` is correct too: both instructions do
    nothing then."""
    if "launch_pdl" not in constants and not constants.get("USE_PDL"):
        return constants
    return {**{k: v for k, v in constants.items() if k != "launch_pdl"}, "USE_PDL": False}


def _launch_with_descriptors(kernel, grid, constants: dict[str, Any], descriptors: dict[str, Descriptor],
                             like: torch.Tensor, **tensors):
    return launch(kernel, grid, like)(**_described(tensors, descriptors), **constants)


def _described(tensors: dict[str, Any], descriptors: dict[str, Descriptor]) -> dict[str, Any]:
    """``tensors`` with each descriptor parameter's base replaced by its ``TensorDescriptor``."""
    if not descriptors:
        return tensors
    return {n: descriptors[n].of(t) if n in descriptors else t for n, t in tensors.items()}


# -- pre-encoded descriptors ----------------------------------------------------------------------


class Descriptor(NamedTuple):
    """``launcher(..., x_desc=descriptor(shape, strides, block_shape, layout))``: parameter
    ``x_desc`` is a Gluon host-side TMA descriptor over ``shape`` / ``strides`` (elements) with
    boxes of ``block_shape`` in shared-memory ``layout``, and each call passes there the tensor
    whose address is its base (its dtype is the descriptor's)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    block_shape: tuple[int, ...]
    layout: Any
    padding: str = "zero"

    def of(self, base: torch.Tensor):
        """The ``TensorDescriptor`` that ``kernel[grid]`` takes for the base ``base``."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(base, list(self.shape), list(self.strides), list(self.block_shape), self.layout,
                                self.padding)


def descriptor(shape, strides, block_shape, layout, padding: str = "zero") -> Descriptor:
    return Descriptor(tuple(shape), tuple(strides), tuple(block_shape), layout, padding)


class DescriptorCache(dict):
    """Encoded descriptors of one ``Descriptor`` spec, base dtype and binary metadata (the
    binary's ``tensordesc_meta`` entry: swizzle, element size and type, block size, fp4 padding),
    by base address: ``cache[address]`` is the arguments Triton's ``make_tensordesc_arg``
    expands the descriptor into (``[CUtensorMap, *shape, *strides]``). The CUtensorMap is a
    function of exactly those values (cuTensorMapEncodeTiled of the address, dtype, shape,
    strides, box, swizzle, padding), so an entry is never stale, even where an address is reused
    by another tensor. ``of`` shares one cache per key among plans; each keeps at most
    ``_DESCRIPTOR_LIMIT`` addresses (one a layer's cache: models have up to ~100 layers)."""

    def __init__(self, spec: Descriptor, meta: dict, encode: Callable):
        super().__init__()
        self.spec, self.meta, self.encode_fn = spec, meta, encode

    @classmethod
    def of(cls, spec: Descriptor, dtype: torch.dtype, meta: dict, encode: Callable) -> DescriptorCache:
        key = (spec, dtype, _frozen(meta), encode)
        cache = _DESCRIPTORS.get(key)
        if cache is None:
            if len(_DESCRIPTORS) >= _DESCRIPTOR_LIMIT:
                _DESCRIPTORS.clear()
            cache = _DESCRIPTORS[key] = cls(spec, meta, encode)
        return cache

    def encode(self, base: torch.Tensor) -> tuple:
        """The encoding for ``base`` (remembered): Triton's ``make_tensordesc_arg`` of the
        descriptor ``spec.of(base)`` (which also checks the base's alignment)."""
        encoded = tuple(self.encode_fn(self.spec.of(base), self.meta))
        if len(self) >= _DESCRIPTOR_LIMIT:
            self.clear()
        self[base.data_ptr()] = encoded
        return encoded


_DESCRIPTORS: dict[tuple, DescriptorCache] = {}
_DESCRIPTOR_LIMIT = 1024


def _frozen(value: Any) -> Any:
    """``value`` (a binary's tensordesc_meta entry: a dict of ints, bools and lists) hashable."""
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _direct_launch(run: Any) -> tuple[Callable, bool, bool] | None:
    """``(run.launch, run.launch_cooperative_grid, run.launch_pdl)`` where ``run`` is Triton 3.6's
    ``CudaLauncher`` (backends/nvidia/driver.py) of a binary without global or profile scratch
    memory, else None (another launcher class or Triton, a binary with scratch).
    ``CudaLauncher.__call__(g0, g1, g2, stream, function, *rest)`` is then exactly
    ``run.launch(g0, g1, g2, stream, function, launch_cooperative_grid, launch_pdl, None, None,
    *rest)``: it allocates scratch only for sizes > 0 and passes None otherwise. ``run.launch`` is
    the binary's C launcher ``mod.launch``, or, for a kernel with descriptor arguments,
    ``wrap_handle_tensordesc``'s ``inner`` around it (``_unwrapped_launcher``)."""
    cls = type(run)
    driver = sys.modules.get(cls.__module__)
    if (cls.__name__ != "CudaLauncher" or getattr(driver, "CudaLauncher", None) is not cls
            or getattr(driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO"):
        return None  # the 13 leading arguments of the C launcher this module passes
    try:
        if run.global_scratch_size > 0 or run.profile_scratch_size > 0:
            return None
        return run.launch, run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:  # not the CudaLauncher this module knows
        return None


def _through_run(run: Callable, g0, g1, g2, stream, function, launch_cooperative_grid, launch_pdl,
                 global_scratch, profile_scratch, *rest) -> None:
    """A binary's ``run`` (``CompiledKernel.run``) called with a C launcher's arguments
    (``FastLauncher._plain_entry``): without the four that ``CudaLauncher.__call__`` inserts."""
    run(g0, g1, g2, stream, function, *rest)


def _unwrapped_launcher(inner: Any) -> tuple[Callable, set, list, Callable] | None:
    """``(C launcher, descriptor argument indices, tensordesc_meta, make_tensordesc_arg)`` behind
    the ``launch`` of Triton 3.6's ``CudaLauncher`` (``_direct_launch``) where that is
    ``wrap_handle_tensordesc``'s ``inner`` (a kernel with descriptor arguments), read from that
    closure; None for anything else (another Triton's wrapper, a kernel without descriptors)."""
    code = getattr(inner, "__code__", None)
    if code is None or getattr(inner, "__qualname__", "") != "wrap_handle_tensordesc.<locals>.inner":
        return None
    encode = getattr(sys.modules.get(getattr(inner, "__module__", "")), "make_tensordesc_arg", None)
    if encode is None:
        return None
    try:
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__)))
    except ValueError:  # an empty cell
        return None
    raw, indices, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
    if not callable(raw) or not isinstance(indices, set) or not isinstance(metas, list):
        return None
    return raw, indices, metas, encode


def _cached_path_open(like: torch.Tensor) -> str | None:
    """The mode (``"1"`` or ``"check"``) in which a ``launcher`` call whose tensors look like
    ``like`` takes the cached path, None where it may not, as ``launch`` decides: a plain CUDA
    tensor (``_untraced_mode`` for the rest). Triton's own state is checked after (``idle``)."""
    return _untraced_mode() if type(like) is torch.Tensor and like.is_cuda else None


def _untraced_mode() -> str | None:
    """``TORCH_PAGED_ATTN_FAST_LAUNCH`` (None for ``0``) while nothing traces: no dispatch mode on
    the stack, not compiling (then the switch is read without ``EnvVar.get``'s tracing test)."""
    if _dispatch_modes() == 0 and not _is_compiling():
        mode = _MODE.read()
        return None if mode == "0" else mode
    return None


# the tests of _untraced_mode, bound once: 0.18 us a call instead of 0.22 us through the attribute
# chains (2-core CPU, Triton 3.6, 2026-11-26); every cached launch runs them
_dispatch_modes = torch._C._len_torch_dispatch_stack
_is_compiling = torch.compiler.is_compiling


try:
    from triton.knobs import HookChain as _HookChain
except ImportError:  # older Triton: hooks are plain callables or None
    _HookChain = None


_ATTR = "_torch_paged_attn_fast_launcher"
_NONE = object()


def _fast_launcher(kernel) -> FastLauncher | None:
    """The cached launcher of ``kernel`` (kept on the kernel object); None where this Triton's
    protocol is not implemented or ``kernel`` is not a JITFunction (the interpreter's
    InterpretedFunction, an Autotuner)."""
    fast = getattr(kernel, _ATTR, None)
    if fast is not None:
        return None if fast is _NONE else fast
    fast = _NONE
    try:
        import triton
        from triton.runtime.jit import JITFunction

        version = ".".join(triton.__version__.split(".")[:2])
        if type(kernel) in _jit_classes(JITFunction) and version in _PROTOCOL_VERSIONS:
            fast = FastLauncher(kernel)
    except ImportError:
        pass
    setattr(kernel, _ATTR, fast)
    return None if fast is _NONE else fast


def _jit_classes(jit_function: type) -> tuple[type, ...]:
    """The kernel classes the cached launcher serves: Triton's JITFunction and Gluon's (same
    ``run`` protocol in Triton 3.6, Gluon's only compiling another AST source)."""
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:
        return (jit_function,)
    return (jit_function, GluonJITFunction)


def _is_tensor_descriptor(value: Any) -> bool:
    """Whether ``value`` is one of Triton's host-side tensor descriptors (``triton.tools`` or
    Gluon's)."""
    return type(value).__name__ == "TensorDescriptor" and hasattr(value, "block_shape") and hasattr(value, "base")
