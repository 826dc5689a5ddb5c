"""The cached Triton launcher (``lowering/triton/_launch.py``).

CPU tier (any machine with triton): the launcher's key never merges two calls that Triton
specialises differently (checked against Triton's own binder, ``native_specialize_impl``, over
ints around every boundary, tensors at every alignment, None, bools, floats and constexprs of
each class), the hit / miss logic on a stand-in kernel (a cached call passes every argument in
signature order to the binary's launcher, a new specialisation goes back to ``kernel[grid]``),
and which calls may take the cached path at all.

GPU tier (CUDA, TRITON_INTERPRET unset, a Triton whose protocol is implemented): every Triton
kernel of the package, through the public ops, with the cached launcher in check mode (Triton is
asked at each cached launch which binary it would run) against ``kernel[grid]``, bitwise, over
dtypes, alignments (views offset by one element) and sizes of 1 and multiples of 16; a second
specialisation compiles a second binary; CUDA-graph capture and replay equal eager.
"""

from __future__ import annotations

import itertools
import math
import os
import types
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

import torch_paged_attn  # noqa: E402
from torch_paged_attn.lowering.triton import _launch  # noqa: E402
from torch_paged_attn.testing import make_paged_batch  # noqa: E402

import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")


def _kernel_fn(x_ptr, y_ptr, n, m, scale, flag, BLOCK: tl.constexpr, MODE: tl.constexpr = "a"):
    pass


def _jit(**options) -> JITFunction:
    """A JITFunction over ``_kernel_fn`` whatever TRITON_INTERPRET says (never compiled here)."""
    return JITFunction(_kernel_fn, **options)


def _triton_key(kernel: JITFunction, kwargs: dict) -> tuple:
    """Triton's own in-memory cache key inputs for these arguments: (specialisation, options)."""
    from triton.backends.compiler import BaseBackend

    binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    _, specialization, options = binder(**kwargs)
    return str(specialization), str(options)


_BUF = torch.zeros(64, dtype=torch.float32)
_INTS = (0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 16,
         2**62, 2**63, 2**63 + 16)


def _calls():
    """Argument sets covering every specialisation class of each parameter kind."""
    pointers = (None, _BUF, _BUF[1:], _BUF[4:], _BUF.to(torch.float16), _BUF.to(torch.float16)[8:])
    for x, n, m in itertools.product(pointers, _INTS, (1, 16, 7, 2**31)):
        yield dict(x_ptr=x, y_ptr=_BUF, n=n, m=m, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    for scale, flag, block, mode in itertools.product(
        (0.5, 1.0, 1, 16, True), (3, 1, True, False, 1.0), (16, 16.0, True, 1, 1.0, "16"), ("a", "b")
    ):
        yield dict(x_ptr=_BUF, y_ptr=None, n=16, m=16, scale=scale, flag=flag, BLOCK=block, MODE=mode, num_warps=4)
    for warps, stages in itertools.product((4, 8), (None, 2, 3)):
        options = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
        yield dict(x_ptr=_BUF, y_ptr=_BUF, n=16, m=16, scale=0.5, flag=3, BLOCK=16, **options)


@pytest.mark.parametrize("dns", [(), ("n",), ("n", "x_ptr")], ids=["specialized", "dns_n", "dns_n_x"])
def test_key_never_merges_two_triton_specialisations(dns) -> None:
    kernel = _jit(do_not_specialize=list(dns))
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    calls = list(_calls())
    fast._generate(calls[0])
    by_key: dict[tuple, tuple] = {}
    n_keys = 0
    for kwargs in calls:
        key = fast._key(kwargs)
        if key is None:  # a scalar of another Python class than the first call's: slow path
            assert any(type(kwargs[n]) is not type(calls[0][n]) for n in ("n", "m", "scale", "flag", "BLOCK", "MODE")
                       if n in kwargs and n in calls[0])
            continue
        triton_key = _triton_key(kernel, kwargs)
        seen = by_key.setdefault(key, triton_key)
        assert seen == triton_key, f"{kwargs}: key {key} also stands for Triton's {seen}, not {triton_key}"
        n_keys += 1
    assert n_keys > 100 and len(by_key) > 20


def test_key_of_a_tensor_descriptor_never_merges_two_triton_specialisations() -> None:
    """Host-side TMA descriptors (the Gluon kernels' cache arguments) of each dtype, block shape
    and shared layout, over bases 16-byte aligned (as TMA wants) at several offsets, and sizes:
    equal keys only where Triton's binder specialises equally, and new bases of one kind keep
    one key."""
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    gl = pytest.importorskip("triton.experimental.gluon.language")
    fast = _launch.FastLauncher(_jit(), current_device=lambda: 0, current_stream=lambda d: 0)
    calls = []
    for dtype, block, swizzle, offset, rows in itertools.product(
        (torch.bfloat16, torch.float16), ((64, 64), (32, 64), (8, 64)), (128, 64), (0, 8, 24), (64, 4096 + 8)
    ):
        base = torch.zeros(rows * 128 + offset, dtype=dtype)[offset:].view(rows, 128)
        layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
        desc = hopper.TensorDescriptor(base, [rows, 128], [128, 1], list(block), layout)
        calls.append(dict(x_ptr=desc, y_ptr=_BUF, n=16, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4))
    fast._generate(calls[0])
    by_key: dict[tuple, tuple] = {}
    for kwargs in calls:
        key = fast._key(kwargs)
        assert key is not None
        triton_key = _triton_key(fast.kernel, kwargs)
        seen = by_key.setdefault(key, triton_key)
        assert seen == triton_key, f"key {key} also stands for Triton's {seen}, not {triton_key}"
    assert len(by_key) == 2 * 3 * 2 == len(set(by_key.values()))


def test_key_is_as_coarse_as_triton_for_repeated_decode_values() -> None:
    """Values that change every decode step but not Triton's specialisation keep one key."""
    fast = _launch.FastLauncher(_jit(do_not_specialize=["n"]), current_device=lambda: 0, current_stream=lambda d: 0)
    base = dict(x_ptr=_BUF, y_ptr=_BUF, n=5, m=32, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    fast._generate(base)
    other = dict(base, x_ptr=_BUF[16:], n=7, m=48, scale=0.25, flag=9)
    assert fast._key(base) == fast._key(other)


class _Compiled:
    """Stands in for a CompiledKernel: records the launches of its ``run``."""

    def __init__(self, name: str):
        self.name = name
        self.function = f"function-{name}"
        self.packed_metadata = (4, 1, 0)
        self.launches: list[tuple] = []
        self.run = lambda *args: self.launches.append(args)


class _StandIn(JITFunction):
    """A JITFunction whose ``kernel[grid]`` hands out one _Compiled per Triton specialisation."""

    def __init__(self):
        super().__init__(_kernel_fn)
        self.binaries: dict[tuple, _Compiled] = {}
        self.slow_calls = 0

    def __getitem__(self, grid):
        def run(**kwargs):
            self.slow_calls += 1
            compiled = self._choose(kwargs)
            compiled.launches.append(("slow", grid))
            return compiled

        return run

    def _choose(self, kwargs):
        key = _triton_key(self, kwargs)
        return self.binaries.setdefault(key, _Compiled(str(len(self.binaries))))

    def run(self, *, grid, warmup, **kwargs):
        assert warmup
        return self._choose(kwargs)


def test_cached_launch_passes_every_argument_in_order() -> None:
    kernel = _StandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 1234)
    y = torch.zeros(8)
    args = dict(x_ptr=_BUF, y_ptr=y, n=33, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    first = fast.bind((5,))(**args)
    assert kernel.slow_calls == 1 and first.launches == [("slow", (5,))]
    again = fast.bind((5, 2))(**dict(args, n=35))  # same specialisation: cached
    assert again is first and kernel.slow_calls == 1
    assert again.launches[-1] == (5, 2, 1, 1234, "function-0", (4, 1, 0), None, None, None,
                                  _BUF, y, 35, 16, 0.5, 3, 16, "a")


@pytest.mark.parametrize(
    "change",
    [
        dict(x_ptr=_BUF[1:]),  # alignment
        dict(x_ptr=_BUF.to(torch.float16)),  # dtype
        dict(y_ptr=None),  # None
        dict(n=1),  # == 1 is a constexpr
        dict(m=17),  # % 16
        dict(n=2**31 + 1),  # i64
        dict(flag=True),  # bool
        dict(scale=1),  # int where a float was
        dict(BLOCK=32),  # constexpr value
        dict(BLOCK=True),  # constexpr class
        dict(MODE="b"),  # default overridden
        dict(num_warps=8),  # option
    ],
    ids=lambda c: "-".join(c),
)
def test_new_specialisation_goes_back_to_triton(change) -> None:
    kernel = _StandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    args = dict(x_ptr=_BUF, y_ptr=_BUF, n=33, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    first = fast.bind((1,))(**args)
    second = fast.bind((1,))(**dict(args, **change))
    assert kernel.slow_calls == 2, "a new specialisation must go through kernel[grid]"
    assert second is not first and len(kernel.binaries) == 2
    # a scalar of another Python class than the first call's always takes the slow path
    cached = fast._key(dict(args, **change)) is not None
    assert fast.bind((1,))(**dict(args, **change)) is second
    assert fast.bind((1,))(**args) is first
    assert kernel.slow_calls == (2 if cached else 3)


def test_devices_have_their_own_entries() -> None:
    kernel = _StandIn()
    device = [0]
    fast = _launch.FastLauncher(kernel, current_device=lambda: device[0], current_stream=lambda d: 0)
    args = dict(x_ptr=_BUF, y_ptr=_BUF, n=33, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    fast.bind((1,))(**args)
    device[0] = 1
    fast.bind((1,))(**args)
    assert kernel.slow_calls == 2


def test_check_mode_catches_a_wrong_binary() -> None:
    kernel = _StandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    args = dict(x_ptr=_BUF, y_ptr=_BUF, n=33, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4)
    fast.bind((1,), check=True)(**args)
    fast.bind((1,), check=True)(**args)  # Triton agrees
    key = fast._key(args)
    fast.cache[0, key] = (lambda *a: None, "f", (4, 1, 0), _Compiled("wrong"))
    with pytest.raises(RuntimeError, match="not the one Triton chooses"):
        fast.bind((1,), check=True)(**args)


def test_hooks_and_debug_disable_the_cached_path(monkeypatch) -> None:
    from triton import knobs

    fast = _launch.FastLauncher(_jit(), current_device=lambda: 0, current_stream=lambda d: 0)
    assert fast.idle()
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):
        hook.add(print)
        try:
            assert not fast.idle()
        finally:
            hook.remove(print)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)
        assert not fast.idle()
        monkeypatch.undo()
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert not fast.idle()
    monkeypatch.undo()
    fast.kernel.add_pre_run_hook(lambda *a, **k: None)
    assert not fast.idle()


def test_stage_hooks_and_the_cached_path(monkeypatch) -> None:
    """A compile stage hook keeps launches off the cached path, except the package's own
    (``_cluster.install``, PTX of marked kernels only) with no other hook chained behind it."""
    from triton import knobs

    from torch_paged_attn.lowering.triton import _cluster

    fast = _launch.FastLauncher(_jit(), current_device=lambda: 0, current_stream=lambda d: 0)

    def foreign(*args):
        return ("k", "h") if not args else None

    for before, idle in ((None, True), (foreign, False)):
        monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", before)
        assert fast.idle() == (before is None)
        _cluster.install()
        assert fast.idle() == idle, before
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", foreign)
    assert not fast.idle()


def test_which_calls_may_take_the_cached_path(monkeypatch) -> None:
    kernel = _jit()
    # CPU tensors: the kernel's own launcher
    assert not isinstance(_launch.launch(kernel, (1,), _BUF), _launch.functools.partial)
    # a fake tensor (tracing): wrap_triton
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(_BUF)
    assert type(_launch.launch(kernel, (1,), fake)).__name__ == "TraceableTritonKernelWrapper"
    # protocols: only the versions read from source; never the interpreter's functions
    monkeypatch.setattr(_launch, "_PROTOCOL_VERSIONS", ())
    assert _launch._fast_launcher(_jit()) is None
    monkeypatch.setattr(_launch, "_PROTOCOL_VERSIONS", (".".join(triton.__version__.split(".")[:2]),))
    assert isinstance(_launch._fast_launcher(_jit()), _launch.FastLauncher)
    from triton.runtime.interpreter import InterpretedFunction

    assert _launch._fast_launcher(InterpretedFunction(_kernel_fn)) is None
    # the switch
    for value, mode in (("0", "0"), ("", "0"), ("1", "1"), ("check", "check")):
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", value)
        assert _launch.fast_launch_mode() == mode


# -- launches planned with their constants (``launcher`` / ``FastLauncher.constant_launch``) --

_CONSTANTS = dict(n=33, m=16, scale=0.5, flag=3, BLOCK=16, num_warps=4)


def _open_on_cpu(like):
    """``_launch._cached_path_open`` without its CUDA test, so the cached path runs on CPU tensors."""
    return "1" if type(like) is torch.Tensor else None


def test_constant_launch_passes_every_argument_in_order(monkeypatch) -> None:
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    kernel = _StandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 1234)
    go = fast.constant_launch((5, 2), _CONSTANTS)
    y = torch.zeros(8)
    first = go(y, x_ptr=_BUF, y_ptr=y)
    assert kernel.slow_calls == 1 and first.launches == [("slow", (5, 2))]
    again = go(y, x_ptr=_BUF, y_ptr=y)
    assert again is first and kernel.slow_calls == 1
    # tensors as their addresses; the defaulted MODE is passed too; scalars and constexprs in
    # signature order among the tensors
    assert again.launches[-1] == (5, 2, 1, 1234, "function-0", (4, 1, 0), None, None, None,
                                  _BUF.data_ptr(), y.data_ptr(), 33, 16, 0.5, 3, 16, "a")
    go(y, x_ptr=None, y_ptr=y)  # a new binary (x_ptr is a constexpr None)
    assert go(y, x_ptr=None, y_ptr=y).launches[-1][9:11] == (None, y.data_ptr())  # None stays None
    with pytest.raises(TypeError):  # a tensor parameter left out
        go(y, x_ptr=_BUF)


def _pdl_fn(x_ptr, n, USE_PDL: tl.constexpr = False):
    pass


class _RecordingStandIn(_StandIn):
    """A _StandIn over ``_pdl_fn`` that records the keyword arguments of each ``kernel[grid]``."""

    def __init__(self):
        JITFunction.__init__(self, _pdl_fn)
        self.binaries, self.slow_calls, self.given = {}, 0, []

    def __getitem__(self, grid):
        run = super().__getitem__(grid)

        def record(**kwargs):
            self.given.append(kwargs)
            return run(**kwargs)

        return record


def test_programmatic_dependent_launch_only_on_the_cached_path(monkeypatch) -> None:
    """A launcher planned with ``launch_pdl`` and ``USE_PDL`` launches with both where it takes the
    cached path (its first call compiles through ``kernel[grid]`` with them, and the binary then
    serves the cached calls); wherever it does not (tracing, CPU tensors, no cached launcher),
    the kernel gets ``USE_PDL=False`` and no ``launch_pdl`` (``wrap_triton`` would pass it to the
    kernel as an argument)."""
    constants = dict(n=33, USE_PDL=True, launch_pdl=True, num_warps=4)
    assert _launch.without_pdl(constants) == dict(n=33, USE_PDL=False, num_warps=4)
    assert _launch.without_pdl(constants) is not constants and constants["launch_pdl"]  # a copy
    plain = dict(n=33, num_warps=4)
    assert _launch.without_pdl(plain) is plain and _launch.without_pdl(dict(n=1, USE_PDL=False)) == dict(
        n=1, USE_PDL=False)
    # the cached path
    kernel = _RecordingStandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    monkeypatch.setattr(_launch, "_fast_launcher", lambda k: fast if k is kernel else None)
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    go = _launch.launcher(kernel, (2,), **constants)
    first = go(_BUF, x_ptr=_BUF)
    assert kernel.given == [dict(x_ptr=_BUF, **constants)]
    assert go(_BUF, x_ptr=_BUF) is first and len(kernel.given) == 1  # cached
    # not the cached path: the same launcher, then one made while nothing caches
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: None)
    go(_BUF, x_ptr=_BUF)
    assert kernel.given[-1] == dict(x_ptr=_BUF, n=33, USE_PDL=False, num_warps=4)
    monkeypatch.setattr(_launch, "_fast_launcher", lambda k: None)
    _launch.launcher(kernel, (2,), **constants)(_BUF, x_ptr=_BUF)
    assert kernel.given[-1] == dict(x_ptr=_BUF, n=33, USE_PDL=False, num_warps=4)
    assert constants == dict(n=33, USE_PDL=True, launch_pdl=True, num_warps=4)  # left as given

@pytest.mark.parametrize("dns", [(), ("x_ptr",)], ids=["specialized", "dns_x"])
def test_constant_launch_runs_the_binary_triton_chooses(dns, monkeypatch) -> None:
    """Over pointer alignments, dtypes and None, in a shuffled order with repeats, and over
    constants that Triton specialises differently, every launch runs exactly the binary Triton
    chooses for its arguments; repeated keys never go back to ``kernel[grid]``."""
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    kernel = _StandIn()
    kernel.do_not_specialize = list(dns)
    kernel.params = [p for p in JITFunction(_kernel_fn, do_not_specialize=list(dns)).params]
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    pointers = (None, _BUF, _BUF[1:], _BUF[4:], _BUF[8:], _BUF.to(torch.float16), _BUF.to(torch.float16)[8:])
    constant_sets = (_CONSTANTS, dict(_CONSTANTS, n=1), dict(_CONSTANTS, m=17), dict(_CONSTANTS, BLOCK=32, MODE="b"),
                     dict(_CONSTANTS, num_warps=8))
    calls = [(c, x, y) for c in range(len(constant_sets)) for x in pointers for y in pointers[1:3]] * 2
    random = __import__("random").Random(0)
    random.shuffle(calls)
    launchers = [fast.constant_launch((3,), c) for c in constant_sets]
    seen = set()
    for c, x, y in calls:
        before = kernel.slow_calls
        compiled = launchers[c](_BUF, x_ptr=x, y_ptr=y)
        assert compiled is kernel._choose(dict(x_ptr=x, y_ptr=y, **constant_sets[c])), (constant_sets[c], x, y)
        key = (c, None if x is None else (x.dtype, x.data_ptr() % 16), y.data_ptr() % 16)
        if key in seen:
            assert kernel.slow_calls == before, f"a repeated call went back to kernel[grid]: {key}"
        seen.add(key)
    assert len(kernel.binaries) > 10


@pytest.mark.parametrize("target", ["y_ptr", None], ids=["same_as_y", "same_as_none"])
@pytest.mark.parametrize("dns", [(), ("x_ptr",), ("y_ptr",)], ids=["specialized", "dns_x", "dns_y"])
def test_same_as_hint_runs_the_binary_triton_chooses(dns, target, monkeypatch) -> None:
    """A ``same_as`` hint (``x_ptr`` usually is ``y_ptr``, or usually None) changes no launch: with
    ``x_ptr`` the very tensor of ``y_ptr``, another tensor (other dtypes, alignments), or None,
    every launch runs exactly Triton's binary, passes the tensors' own addresses, and a repeated
    key (the hint holding or not) never goes back to ``kernel[grid]``."""
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    kernel = _StandIn()
    kernel.do_not_specialize = list(dns)
    kernel.params = [p for p in JITFunction(_kernel_fn, do_not_specialize=list(dns)).params]
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    monkeypatch.setattr(_launch, "_fast_launcher", lambda k: fast if k is kernel else None)
    go = _launch.launcher(kernel, (3,), x_ptr=_launch.same_as(target), **_CONSTANTS)  # the hint split off
    assert not isinstance(go, _launch.functools.partial) and list(fast._factories) == [
        (tuple(_CONSTANTS), (("x_ptr", target),))]
    ys = (_BUF, _BUF[1:], _BUF[4:], _BUF.to(torch.float16), _BUF.to(torch.float16)[8:])
    calls = [(y, x) for y in ys for x in ("same", None, *ys)] * 2
    __import__("random").Random(1).shuffle(calls)
    seen = set()
    for y, x in calls:
        x = y if isinstance(x, str) else x
        before = kernel.slow_calls
        compiled = go(_BUF, x_ptr=x, y_ptr=y)
        assert compiled is kernel._choose(dict(x_ptr=x, y_ptr=y, **_CONSTANTS)), (x, y)
        if kernel.slow_calls == before:  # a cached launch: each pointer's own address
            assert compiled.launches[-1][9:11] == (None if x is None else x.data_ptr(), y.data_ptr())
        key = (x is y, None if x is None else (x.dtype, x.data_ptr() % 16), y.dtype, y.data_ptr() % 16)
        if target is None and x is None and kernel.slow_calls == before:  # the hint held: one lookup
            assert fast._tensor_params[(tuple(_CONSTANTS), (("x_ptr", None),))][0] == ("y_ptr",)
        if key in seen:
            assert kernel.slow_calls == before, f"a repeated call went back to kernel[grid]: {key}"
        seen.add(key)
    # a hint naming no tensor parameter is dropped, not an error
    go = fast.constant_launch((3,), _CONSTANTS, {"x_ptr": "n"})
    assert go(_BUF, x_ptr=_BUF, y_ptr=_BUF) is kernel._choose(dict(x_ptr=_BUF, y_ptr=_BUF, **_CONSTANTS))


def test_constant_launch_closed_paths_go_through_launch(monkeypatch) -> None:
    """Where the cached path is closed (a CPU tensor; Triton busy with a hook; the switch at 0)
    every call is ``launch``'s; check mode asks Triton at each cached launch."""
    kernel = _StandIn()
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 0)
    go = fast.constant_launch((2,), _CONSTANTS)  # the real gate: CPU tensors never take the cached path
    for n in range(3):
        go(_BUF, x_ptr=_BUF, y_ptr=_BUF)
        assert kernel.slow_calls == n + 1
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    go = fast.constant_launch((2,), _CONSTANTS)
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)
    assert kernel.slow_calls == 4  # one miss, then cached
    kernel.add_pre_run_hook(lambda *a, **k: None)
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)
    assert kernel.slow_calls == 5  # a pre-run hook: through kernel[grid]
    kernel.pre_run_hooks.clear()
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: "check")
    go = fast.constant_launch((2,), _CONSTANTS)
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)  # a hit of the kernel's cache, remembered by this launch
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)  # Triton agrees
    fast.cache[0, fast._key(dict(x_ptr=_BUF, y_ptr=_BUF, **_CONSTANTS))] = (lambda *a: None, "f", (4, 1, 0), _Compiled("x"))
    go = fast.constant_launch((2,), _CONSTANTS)
    go(_BUF, x_ptr=_BUF, y_ptr=_BUF)  # remembers the planted wrong binary
    with pytest.raises(RuntimeError, match="not the one Triton chooses"):
        go(_BUF, x_ptr=_BUF, y_ptr=_BUF)


def _record_launches(monkeypatch, device: list[int] | None = None) -> tuple[list[tuple], dict]:
    """Every kernel of the package on the Triton backend's host path with CPU tensors, each binary
    a recorder: returns ``(launched, recorders)``, ``launched`` getting ``(kernel name, grid,
    arguments)`` per launch, as ``JITFunction.run`` would pass them at a cache miss (by name,
    defaults filled, in parameter order) and as the binary's C launcher gets them on the cached
    path. ``device``: a one-item list holding the current device the launchers see (0)."""
    from torch_paged_attn import lowering

    launched: list[tuple] = []
    device = device if device is not None else [0]

    class Recorder(_launch.FastLauncher):
        def _miss(self, grid, kwargs):  # what JITFunction.run would pass, from the arguments by name
            args = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in self.params)
            g = (*grid, 1, 1)[:3]
            launched.append((self.kernel.fn.__name__, g, args))

            def binary(g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit, *arguments):
                launched.append((self.kernel.fn.__name__, (g0, g1, g2), arguments))

            self.cache[self.current_device(), self._key(kwargs)] = (binary, None, None, None)

    recorders: dict[int, Recorder] = {}

    def fast_launcher(kernel):
        if id(kernel) not in recorders:
            jit = kernel if type(kernel) is JITFunction else JITFunction(kernel.fn)
            recorders[id(kernel)] = Recorder(jit, current_device=lambda: device[0], current_stream=lambda d: 0)
        return recorders[id(kernel)]

    choose = lowering._choose
    monkeypatch.setattr(lowering, "_choose", lambda op, facts: choose(op, {**facts, "device": "cuda"}))
    monkeypatch.setattr(_launch, "_fast_launcher", fast_launcher)
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    return launched, recorders


def test_planned_launches_of_every_kernel_pass_what_kernel_grid_would(monkeypatch) -> None:
    """Every kernel of the package, through the public ops' plans on CPU tensors (the Triton
    backend's host path, binaries stood in): the first call of a plan goes through ``kernel[grid]``
    semantics (arguments by name, defaults filled, in the kernel's parameter order), later calls
    through the generated cached path (the second through the plan's runner, the third through
    the eager entry: for plain paged attention without lse, the plan's pin); all pass the same
    grid and the same arguments."""
    from torch_paged_attn import lowering

    launched, recorders = _record_launches(monkeypatch)
    lowering._CHOICES.clear()
    try:
        for name, fn in _op_calls(torch.float32, 0, 3, device="cpu").items():
            calls = []
            for _ in range(3):
                launched.clear()
                fn()
                calls.append(list(launched))
            first = calls[0]
            assert first, name
            # the cached path passes each tensor's address. The inputs are the same tensors at
            # every call; outputs and workspaces are new ones (the first call's are still alive,
            # so their addresses are not reused): an address of one call never shows up
            # elsewhere in the other call
            # (decode_split calls the backend function, which plans at every call: there the
            # later calls are the cached launcher's by-name path, with tensors)
            def address(y):
                return y.data_ptr() if isinstance(y, torch.Tensor) and name == "decode_split" else y

            addresses1 = {x.data_ptr() for _, _, a in first for x in a if isinstance(x, torch.Tensor)}
            for later in calls[1:]:
                assert len(later) == len(first), name
                addresses2 = {address(y) for (_, _, a), (_, _, a1) in zip(later, first) for y, x in zip(a, a1)
                              if isinstance(x, torch.Tensor)}
                for (k1, g1, a1), (k2, g2, a2) in zip(first, later):
                    assert (k1, g1, len(a1)) == (k2, g2, len(a2)), name
                    for x, y in zip(a1, a2):
                        if isinstance(x, torch.Tensor):
                            y = address(y)
                            assert type(y) is int, (name, k1)
                            if x.data_ptr() != y:  # both new
                                assert x.data_ptr() not in addresses2 and y not in addresses1, (name, k1)
                        else:
                            assert type(x) is type(y) and x == y, (name, k1, x, y)
        assert {r.kernel.fn.__name__ for r in recorders.values()} >= {
            "_attention_kernel", "_combine_kernel", "_mla_kernel", "_cache_write_kernel", "_gather_cache_kernel",
            "_merge_attn_states_kernel",
        }
    finally:
        lowering._CHOICES.clear()


def _pin_of(op: str):
    """The ``fire`` of ``op``'s one remembered eager entry (``lowering.remember``'s payload: the
    functional form's ends with ``fire`` and its native ``new``, the out form's with ``fire``)."""
    from torch_paged_attn import lowering

    entries = [payload for key, found in lowering._CHOICES.items() if isinstance(found, list) and key[0][0] == op
               for _, payload in found]
    assert len(entries) == 1, entries
    return entries[0][-2 if op == "paged_attention" else -1]


@pytest.mark.parametrize("form", ["paged_attention", "paged_attention_out", "paged_attention_out with lse"])
def test_plain_paged_attention_launches_through_its_pin(form, monkeypatch) -> None:
    """A plain call (no alibi, sinks or fp8 scales; an lse only in the out form) served by its
    eager entry launches through the plan's pin (``_launch``'s generated ``pin``): one launch, the
    same grid and arguments as the call that planned it (the output's and lse's addresses its
    own), without the per-call test of the cached path that the plan's runner makes. Where the
    cached launch may not run (fast launch off or in check mode, Triton's debug mode, an output or
    lse off 16-byte alignment, another current device) the pin launches nothing and says so, and
    the call takes the runner."""
    from triton import knobs

    from torch_paged_attn import lowering

    device = [0]
    launched, _ = _record_launches(monkeypatch, device)
    opened = []
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: opened.append(like) or _open_on_cpu(like))
    monkeypatch.delenv("TORCH_PAGED_ATTN_FAST_LAUNCH", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG", raising=False)
    lowering._CHOICES.clear()
    batch = make_paged_batch([1, 1, 1], [20, 7, 33], num_heads=8, num_kv_heads=2, head_size=64, dtype=torch.float32)
    outs = [torch.empty(3, 8, 64) for _ in range(4)]
    with_lse = form == "paged_attention_out with lse"
    lses = {id(out): torch.empty(3, 8) for out in outs} if with_lse else {}
    misaligned = _offset_view(outs[0], 1)
    lse_of = lses.get  # the lse a call passes with each out (None: none)

    def call(out):
        launched.clear()
        opened.clear()
        if form != "paged_attention":
            torch_paged_attn.paged_attention_out(*batch.args(), out, lse_of(id(out)), max_query_len=1)
        else:
            out = torch_paged_attn.paged_attention(*batch.args(), max_query_len=1)[0]
        assert len(launched) == 1
        (kernel, grid, arguments), = launched
        return kernel, grid, tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in arguments), out

    try:
        first = call(outs[0])  # planned: kernel[grid]'s arguments
        call(outs[1])  # the plan's runner; remembered, with the pin
        assert len(opened) == 2  # the runner's test of the cached path, then the pin's, once
        fire = _pin_of(form.split()[0])
        assert fire is not None
        for out in outs[2:]:
            kernel, grid, arguments, got = call(out)
            assert not opened, "the runner ran"
            assert (kernel, grid) == first[:2] and len(arguments) == len(first[2])
            for a, b, name in zip(first[2], arguments, _launch._fast_launcher(
                    torch_paged_attn.lowering.triton.paged_attention._attention_kernel).params):
                if name.name == "lse_ptr" and with_lse:
                    assert a == lses[id(outs[0])].data_ptr() and b == lses[id(out)].data_ptr()
                elif name.name in ("out_ptr", "lse_ptr", "part_out_ptr", "part_lse_ptr"):
                    assert a == first[3].data_ptr() and b == got.data_ptr(), name.name
                else:
                    assert type(a) is type(b) and a == b, name.name
        args = (*batch.args(), outs[2], *([lses[id(outs[2])]] if with_lse else []))

        declining = [("setenv", "TORCH_PAGED_ATTN_FAST_LAUNCH", "0"),
                     ("setenv", "TORCH_PAGED_ATTN_FAST_LAUNCH", "check"), ("setattr", knobs.runtime, "debug", True)]
        for how, *change in declining:
            launched.clear()
            with monkeypatch.context() as m:
                getattr(m, how)(*change)
                assert fire(*args) is False and not launched, change
            assert fire(*args) is True and len(launched) == 1, change  # the change undone
        launched.clear()
        assert fire(*batch.args(), misaligned, *args[7:]) is False and not launched
        if with_lse:
            assert fire(*args[:7], _offset_view(args[7], 1)) is False and not launched
            with pytest.raises(TypeError):  # this entry's fire takes the lse
                fire(*args[:7])
        device[0] = 1
        assert fire(*args) is False and not launched
        device[0] = 0
        assert fire(*args) is True and len(launched) == 1
        if form != "paged_attention":  # the misaligned output through the runner: its own binary
            if with_lse:
                lses[id(misaligned)] = torch.empty(3, 8)
            kernel, grid, arguments, _ = call(misaligned)
            assert opened and (kernel, grid) == first[:2]
            assert arguments[6] == misaligned.data_ptr() and arguments[6] % 16
    finally:
        lowering._CHOICES.clear()


@pytest.mark.parametrize("op", ["reshape_and_cache", "concat_and_cache_mla"])
def test_plain_cache_writes_launch_through_their_pin(op, monkeypatch) -> None:
    """A plain cache write (no fp8 scales) that its eager entry serves launches through the plan's
    pin: from the third call of a signature one launch with the grid and arguments of the call that
    planned it (the caches' addresses their own), without the runner's test of the cached path;
    with fast launch off or in check mode, or a cache off 16-byte alignment, the pin launches
    nothing and says so, and the call takes the runner (one launch, the same arguments)."""
    from torch_paged_attn import lowering

    launched, _ = _record_launches(monkeypatch)
    opened = []
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: opened.append(like) or _open_on_cpu(like))
    monkeypatch.delenv("TORCH_PAGED_ATTN_FAST_LAUNCH", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG", raising=False)
    lowering._CHOICES.clear()
    g = torch.Generator().manual_seed(3)
    slots = torch.tensor([17, -1, 5, 40], dtype=torch.int64)
    if op == "reshape_and_cache":
        inputs = (torch.randn(4, 2, 64, generator=g), torch.randn(4, 2, 32, generator=g))
        caches = [(torch.randn(4, 16, 2, 64, generator=g), torch.randn(4, 16, 2, 32, generator=g)) for _ in range(5)]
        write = torch_paged_attn.reshape_and_cache
    else:
        inputs = (torch.randn(4, 64, generator=g), torch.randn(4, 16, generator=g))
        caches = [(torch.randn(4, 16, 80, generator=g),) for _ in range(5)]
        write = torch_paged_attn.concat_and_cache_mla

    def call(cache):
        launched.clear()
        opened.clear()
        write(*inputs, *cache, slots)
        assert len(launched) == 1
        (kernel, grid, arguments), = launched
        return kernel, grid, tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in arguments)

    try:
        first = call(caches[0])  # planned: kernel[grid]'s arguments
        call(caches[1])  # the plan's runner; remembered, with the pin
        entries = [payload for key, found in lowering._CHOICES.items() if isinstance(found, list) and key[0][0] == op
                   for _, payload in found]
        assert len(entries) == 1 and entries[0][1] is not None
        fire = entries[0][1]
        names = [p.name for p in _launch._fast_launcher(
            torch_paged_attn.lowering.triton.kv_cache._cache_write_kernel).params]

        def same_launch(launch, cache):  # the planning call's, the caches' addresses this call's
            kernel, grid, arguments = launch
            assert (kernel, grid) == first[:2] and len(arguments) == len(first[2])
            own = {"a_cache_ptr": cache[0], "b_cache_ptr": cache[-1]}
            for a, b, name in zip(first[2], arguments, names):
                if name in own and b is not None:
                    assert b == own[name].data_ptr(), name
                else:
                    assert type(a) is type(b) and a == b, name

        for cache in caches[2:4]:
            same_launch(call(cache), cache)
            assert not opened, "the runner ran"
        pinned = (*inputs, slots, *caches[4])  # fire takes the kernel's order
        for mode in ("0", "check"):
            with monkeypatch.context() as m:
                m.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", mode)
                launched.clear()
                assert fire(*pinned) is False and not launched, mode
                if mode == "check":  # the runner serves the call (with fast launch off, kernel[grid] does)
                    same_launch(call(caches[4]), caches[4])
                    assert opened, mode
        launched.clear()
        misaligned = tuple(_offset_view(c, 1) for c in caches[4])
        assert fire(*inputs, slots, *misaligned) is False and not launched
        assert fire(*pinned) is True and len(launched) == 1
    finally:
        lowering._CHOICES.clear()


def test_launcher_without_the_cached_path_is_launch(monkeypatch) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    run = _launch.launcher(InterpretedFunction(_kernel_fn), (1,), **_CONSTANTS)
    assert isinstance(run, _launch.functools.partial) and run.func is _launch._launch_with
    monkeypatch.setattr(_launch, "_PROTOCOL_VERSIONS", (".".join(triton.__version__.split(".")[:2]),))
    fast = _launch._fast_launcher(_jit())
    fast.current_device, fast.current_stream = (lambda: 0), (lambda d: 0)
    assert not isinstance(_launch.launcher(fast.kernel, (1,), **_CONSTANTS), _launch.functools.partial)
    if not torch.cuda.is_available():  # no Triton driver: launch's path, not an error at plan time
        run = _launch.launcher(_jit(), (1,), **_CONSTANTS)
        assert isinstance(run, _launch.functools.partial) and run.func is _launch._launch_with


def test_host_integer_helpers_match_triton() -> None:
    for n in range(-3, 3000):
        assert _launch.next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 1000):
            assert _launch.cdiv(n, d) == triton.cdiv(n, d)


# -- GPU tier ------------------------------------------------------------------------------------


def _offset_view(t: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s values in a fresh buffer starting ``offset`` elements in (so ``offset = 1`` moves the
    address off 16-byte alignment); same shape and strides."""
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = flat[offset:].view(t.shape)
    view.copy_(t)
    return view


def _op_calls(dtype: torch.dtype, offset: int, num_seqs: int, device: str = "cuda"):
    """One call of every public op (every Triton kernel of the package: attention and its split-KV
    combine, MLA, cache writes, gather, merge), inputs offset by ``offset`` elements; returns
    ``{name: fn}`` whose results are tensors to compare."""
    q_lens = [1] * num_seqs
    kv_lens = [16 * (i + 1) + (i % 3) for i in range(num_seqs)]
    batch = make_paged_batch(q_lens, kv_lens, num_heads=8, num_kv_heads=2, head_size=64, dtype=dtype,
                             device=device, seed=num_seqs + offset, nan_uncovered=False)
    q = _offset_view(batch.query, offset)
    args = (q, batch.key_cache, batch.value_cache, batch.block_table, batch.seq_lens, batch.query_start_loc)
    prefill = make_paged_batch([num_seqs + 2, 3], [num_seqs + 40, 20], num_heads=8, num_kv_heads=2, head_size=64,
                               dtype=dtype, device=device, seed=7 + offset, nan_uncovered=False)
    pargs = (_offset_view(prefill.query, offset),) + prefill.args()[1:]
    g = torch.Generator(device="cpu").manual_seed(offset)
    T, H, D = num_seqs, 8, 64

    def rnd(*shape, dt=dtype):
        return _offset_view(torch.randn(*shape, generator=g).to(device=device, dtype=dt), offset)

    L, R = 64, 16
    mla_cache = rnd(8, 16, L + R)
    bt = torch.arange(8, dtype=torch.int32, device=device).view(1, 8).repeat(num_seqs, 1)[:, :4].contiguous()
    lens = torch.full((num_seqs,), 50, dtype=torch.int32, device=device)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
    slots = torch.randperm(8 * 16, generator=g)[:T].to(device)

    key, value, kv_c, k_pe = rnd(T, 2, D), rnd(T, 2, D), rnd(T, L), rnd(T, R)
    q_latent, q_rope = rnd(T, H, L), rnd(T, H, R)
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=device)
    table = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4]], dtype=torch.int32, device=device)
    po, so = rnd(T, H, D), rnd(T, H, D)
    pl, sl = rnd(T, H, dt=torch.float32), rnd(T, H, dt=torch.float32)
    # every input exists before the calls: they allocate outputs only, so CUDA graphs capture them

    def reshape_and_cache():
        kc, vc = batch.key_cache.clone(), batch.value_cache.clone()
        torch_paged_attn.reshape_and_cache(key, value, kc, vc, slots)
        return kc, vc

    def concat_and_cache_mla():
        cache = mla_cache.clone()
        torch_paged_attn.concat_and_cache_mla(kv_c, k_pe, cache, slots)
        return (cache,)

    def gather_cache():
        out = torch.zeros(48, L + R, dtype=dtype, device=device)
        torch_paged_attn.gather_cache(mla_cache, table, cu, None, out)
        return (out,)

    out = torch.empty(T, H, D, dtype=dtype, device=device)

    def decode_out():  # the out form without lse: its plain calls launch through the plan's pin
        torch_paged_attn.paged_attention_out(*args, out, max_query_len=1)
        return (out,)

    return {
        "decode": lambda: torch_paged_attn.paged_attention(*args, return_lse=True, max_query_len=1),
        "decode_plain": lambda: torch_paged_attn.paged_attention(*args, max_query_len=1)[:1],
        "decode_out": decode_out,
        "decode_split": lambda: _split_decode(args),
        "prefill": lambda: torch_paged_attn.paged_attention(*pargs, return_lse=True),
        "mla": lambda: torch_paged_attn.mla_decode(q_latent, q_rope, mla_cache, bt, lens, qsl, scale=0.1),
        "reshape_and_cache": reshape_and_cache,
        "concat_and_cache_mla": concat_and_cache_mla,
        "gather_cache": gather_cache,
        "merge": lambda: torch_paged_attn.merge_attn_states(po, pl, so, sl),
    }


def _split_decode(args):
    """The attention kernel's split-KV form plus its combine kernel, forced."""
    from torch_paged_attn.lowering.triton import paged_attention as tpa

    q, kc, vc = args[:3]
    out = torch.empty(q.shape[0], q.shape[1], vc.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    tpa.paged_attention(*args, out, lse, scale=1 / math.sqrt(q.shape[2]), causal=True, window_left=-1,
                        window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, k_scale=None, v_scale=None,
                        attention_chunk_size=0, max_query_len=1, split_tokens=16)
    return out, lse


def _results(fn) -> list[torch.Tensor]:
    out = fn()
    out = out if isinstance(out, tuple) else (out,)
    torch.cuda.synchronize()
    return [t.clone() for t in out]


def _fast_launchers():
    from torch_paged_attn.lowering.triton import kv_cache, merge, mla, paged_attention

    kernels = (paged_attention._attention_kernel, paged_attention._combine_kernel, mla._mla_kernel,
               mla._combine_kernel, kv_cache._cache_write_kernel, kv_cache._gather_cache_kernel,
               merge._merge_attn_states_kernel)
    return {k.fn.__name__ + "@" + k.fn.__module__.rsplit(".", 1)[-1]: _launch._fast_launcher(k) for k in kernels}


def _protocol_or_skip() -> None:
    version = ".".join(triton.__version__.split(".")[:2])
    if version not in _launch._PROTOCOL_VERSIONS:
        pytest.skip(f"the cached launcher is off on triton {triton.__version__}")


@gpu_tier
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_kernel_fast_equals_kernel_grid_cuda(dtype, monkeypatch) -> None:
    _protocol_or_skip()
    for num_seqs, offset in itertools.product((1, 16, 5), (0, 1, 8)):
        calls = _op_calls(dtype, offset, num_seqs)
        for name, fn in calls.items():
            monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "0")
            expected = _results(fn)
            for mode in ("check", "1"):  # check: Triton confirms each cached binary; 1: as shipped
                monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", mode)
                for _ in range(2):  # the first call fills the cache, the second launches from it
                    got = _results(fn)
                    for e, g in zip(expected, got):
                        assert torch.equal(e.view(torch.uint8), g.view(torch.uint8)), (name, mode, num_seqs, offset)
    launchers = _fast_launchers()
    unused = [name for name, fast in launchers.items() if fast is None or not fast.cache]
    assert not unused, f"kernels never launched through the cached launcher: {unused}"


@gpu_tier
def test_second_specialisation_compiles_its_own_binary_cuda(monkeypatch) -> None:
    """A misaligned call after an aligned one gets its own binary (Triton's), not the cached one."""
    _protocol_or_skip()
    monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    from torch_paged_attn.lowering.triton import merge

    from torch_paged_attn import lowering

    fast = _launch._fast_launcher(merge._merge_attn_states_kernel)
    fast.cache.clear()
    lowering._CHOICES.clear()  # the plans' own binaries too (``FastLauncher.constant_launch``)
    binaries = []
    for offset in (0, 1):  # 16-byte aligned inputs, then inputs one element off
        fn = _op_calls(torch.float32, offset, 16)["merge"]
        got = _results(fn)
        got_cached = _results(fn)
        binaries.append({entry[3] for entry in fast.cache.values()})
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "0")
        expected = _results(fn)
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
        for e, g, c in zip(expected, got, got_cached):
            assert torch.equal(e, g) and torch.equal(e, c)
    assert len(binaries[0]) == 1 and len(binaries[1]) == 2, "the misaligned call reused the aligned binary"


@gpu_tier
def test_cuda_graph_replay_with_fast_launch_equals_eager_cuda(monkeypatch) -> None:
    _protocol_or_skip()
    monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "1")
    calls = _op_calls(torch.bfloat16, 0, 5)
    for name, fn in calls.items():
        expected = _results(fn)  # eager, fills the cache
        _results(fn)  # eager from the cache
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up on the side stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fn()
        static = static if isinstance(static, tuple) else (static,)
        graph.replay()
        torch.cuda.synchronize()
        for e, g in zip(expected, static):
            assert torch.equal(e.view(torch.uint8), g.view(torch.uint8)), name


# -- pre-encoded TMA descriptors (Gluon kernels) ----------------------------------------------------

_TRITON_36 = ".".join(triton.__version__.split(".")[:2]) == "3.6"
triton_36 = pytest.mark.skipif(not _TRITON_36, reason="Triton 3.6's launcher (backends/nvidia/driver.py) only")
# a binary's tensordesc_meta entry for a bf16 descriptor with [64, 64] boxes, 128-byte swizzle
_META = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [64, 64], "fp4_padded": False}


def _desc_kernel_fn(x_ptr, x_desc, n, BLOCK: tl.constexpr):
    pass


def _spec(rows: int = 64, width: int = 128, box: tuple = (64, 64), swizzle: int = 128):
    gl = pytest.importorskip("triton.experimental.gluon.language")
    layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
    return _launch.descriptor((rows, width), (width, 1), box, layout)


@pytest.fixture
def fake_fill(monkeypatch):
    """Triton's active driver replaced by one whose ``fill_tma_descriptor`` returns its arguments
    (as the "CUtensorMap": equal maps for equal arguments); the list of its calls."""

    calls = []

    def fill(*args):
        calls.append(args)
        return ("map", *(tuple(a) if isinstance(a, list) else a for a in args))

    utils = types.SimpleNamespace(fill_tma_descriptor=fill)
    monkeypatch.setattr(triton.runtime, "driver", types.SimpleNamespace(active=types.SimpleNamespace(utils=utils)))
    return calls


def _triton_encode():
    from triton.backends.nvidia.driver import make_tensordesc_arg

    return make_tensordesc_arg


def _bf16_base(offset: int = 0) -> torch.Tensor:
    """A bf16 buffer whose data starts 16-byte aligned, ``offset`` elements in."""
    buf = torch.zeros(64 * 128 + 64, dtype=torch.bfloat16)
    skip = (-buf.data_ptr() % 16) // 2
    return buf[skip + offset:]


@triton_36
def test_descriptor_cache_key(fake_fill, monkeypatch) -> None:
    """Equal values share one encoding; another base address, shape, stride, box, layout, dtype
    or binary metadata gets its own, as Triton's ``make_tensordesc_arg`` encodes it."""
    monkeypatch.setattr(_launch, "_DESCRIPTORS", {})
    encode = _triton_encode()
    base = _bf16_base()
    cache = _launch.DescriptorCache.of(_spec(), torch.bfloat16, _META, encode)
    assert _launch.DescriptorCache.of(_spec(), torch.bfloat16, dict(_META), encode) is cache
    first = cache.encode(base)
    assert cache.get(base.data_ptr()) is first and len(fake_fill) == 1
    assert first == tuple(encode(_spec().of(base), _META))  # Triton's own expansion
    fp16_meta = dict(_META, elem_type=6)
    variants = [
        (cache, _bf16_base(8)),  # another address (16 bytes on)
        (_launch.DescriptorCache.of(_spec(rows=32), torch.bfloat16, _META, encode), base),  # shape
        (_launch.DescriptorCache.of(_spec(width=64), torch.bfloat16, _META, encode), base),  # shape and stride
        (_launch.DescriptorCache.of(_spec(box=(32, 64)), torch.bfloat16, dict(_META, block_size=[32, 64]), encode),
         base),  # box
        (_launch.DescriptorCache.of(_spec(swizzle=64), torch.bfloat16, dict(_META, swizzle=2), encode), base),
        (_launch.DescriptorCache.of(_spec(), torch.float16, fp16_meta, encode), base.view(torch.float16)),  # dtype
    ]
    encodings = {first}
    for c, b in variants:
        assert c is cache or c.get(b.data_ptr()) is None
        e = c.encode(b)
        assert e not in encodings and e == tuple(encode(c.spec.of(b), c.meta))
        encodings.add(e)
    # a spec, dtype or metadata alone makes another cache (its encodings may coincide: the binary's
    # metadata is what decides the map, and a binary of another box has other metadata)
    assert _launch.DescriptorCache.of(_spec(box=(32, 64)), torch.bfloat16, _META, encode) is not cache
    assert _launch.DescriptorCache.of(_spec(), torch.float16, _META, encode) is not cache


_DESC_SIGNATURE = {"x_ptr": "*fp32", "x_desc": "tensordesc<bf16[64, 64]>", "n": "i32", "BLOCK": "constexpr"}
_PLAIN_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "m": "i32", "scale": "fp32", "flag": "i32",
                    "BLOCK": "constexpr", "MODE": "constexpr"}


def _triton_launcher(raw, metas: list | None, scratch: int = 0, profile_scratch: int = 0,
                     signature: dict = _DESC_SIGNATURE, launcher_class=None):
    """Triton 3.6's own ``CudaLauncher`` (its ``__call__`` and ``wrap_handle_tensordesc``) around
    the C launcher ``raw``, for ``_desc_kernel_fn``'s signature (or ``signature``), without
    compiling anything."""
    from triton.backends.nvidia import driver

    launcher_class = launcher_class or driver.CudaLauncher
    run = launcher_class.__new__(launcher_class)
    run.num_ctas = 1
    run.launch = driver.wrap_handle_tensordesc(raw, signature, metas)
    run.global_scratch_size, run.global_scratch_align = scratch, 128
    run.profile_scratch_size, run.profile_scratch_align = profile_scratch, 1
    run.launch_cooperative_grid, run.launch_pdl = False, True
    return run


class _DescStandIn(JITFunction):
    """A JITFunction over ``_desc_kernel_fn`` (or ``fn``) whose ``kernel[grid]`` launches, as
    ``JITFunction.run`` does, one stand-in binary per specialisation with Triton's launcher."""

    def __init__(self, make_run, fn=_desc_kernel_fn):
        super().__init__(fn)
        self.make_run = make_run
        self.binaries: dict[tuple, Any] = {}
        self.slow_calls = 0

    def _choose(self, kwargs):
        key = _triton_key(self, kwargs)
        if key not in self.binaries:
            self.binaries[key] = types.SimpleNamespace(run=self.make_run(), function=1000 + len(self.binaries),
                                                       packed_metadata=(4, 1, 0))
        return self.binaries[key]

    def __getitem__(self, grid):
        def run(**kwargs):
            self.slow_calls += 1
            compiled = self._choose(kwargs)
            g = (*grid, 1, 1)[:3]
            args = [kwargs[p.name] if p.name in kwargs else p.default for p in self.params]
            compiled.run(*g, 77, compiled.function, compiled.packed_metadata, None, None, None, *args)
            return compiled

        return run

    def run(self, *, grid, warmup, **kwargs):
        assert warmup
        return self._choose(kwargs)




@triton_36
def test_descriptor_launch_passes_what_triton_passes(fake_fill, monkeypatch) -> None:
    """A cached launch with a pre-encoded descriptor calls the C launcher with exactly the
    arguments Triton's ``CudaLauncher`` passes it for the same call with a ``TensorDescriptor``
    (``make_tensordesc_arg``'s expansion, launch flags, no scratch), encodes each base address
    once, and runs the binary Triton chooses (check mode too)."""
    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    monkeypatch.setattr(_launch, "_DESCRIPTORS", {})
    raw_calls: list[tuple] = []
    encoded: set[int] = set()
    kernel = _DescStandIn(lambda: _triton_launcher(lambda *a: raw_calls.append(a), [dict(_META)]))
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 77)
    monkeypatch.setattr(_launch, "_fast_launcher", lambda k: fast if k is kernel else None)
    spec = _spec()
    go = _launch.launcher(kernel, (3, 2), x_desc=spec, n=5, BLOCK=16, num_warps=4)
    x, base, other = torch.zeros(8), _bf16_base(), _bf16_base(8)
    first = go(x, x_ptr=x, x_desc=base)  # through kernel[grid], with a TensorDescriptor
    assert kernel.slow_calls == 1 and len(raw_calls) == 1 and len(fake_fill) == 1
    for b in (base, base, other, base, other):
        fills = len(fake_fill)
        assert go(x, x_ptr=x, x_desc=b) is first and kernel.slow_calls == 1
        cached = raw_calls[-1]
        # Triton's own launch of these arguments: CudaLauncher.__call__ -> inner -> C launcher
        first.run(3, 2, 1, 77, first.function, first.packed_metadata, None, None, None,
                  x.data_ptr(), spec.of(b), 5, 16)
        assert cached == raw_calls[-1], (cached, raw_calls[-1])
        assert cached[:13] == (3, 2, 1, 77, first.function, False, True, None, None, (4, 1, 0), None, None, None)
        assert len(fake_fill) == fills + 1 + (b.data_ptr() not in encoded)  # Triton's, and ours once
        encoded.add(b.data_ptr())
    # a new dtype of x is another specialisation, another binary
    assert go(x, x_ptr=x.half(), x_desc=base) is not first and kernel.slow_calls == 2
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: "check")
    assert go(x, x_ptr=x, x_desc=base) is first  # Triton agrees
    # a binary needing scratch memory: no pre-encoded launch (Triton's launcher allocates it)
    entry = (None, None, None, types.SimpleNamespace(run=_triton_launcher(lambda *a: None, [dict(_META)], scratch=64),
                                        function=1, packed_metadata=(4, 1, 0)))
    assert fast._descriptor_entry(entry, {"x_desc": spec}, {"x_desc": base}) is None
    # nor one whose descriptor was not lowered to TMA (no metadata: its expansion holds the tensor)
    entry = (None, None, None, types.SimpleNamespace(run=_triton_launcher(lambda *a: None, [None]), function=1,
                                        packed_metadata=(4, 1, 0)))
    assert fast._descriptor_entry(entry, {"x_desc": spec}, {"x_desc": base}) is None
    # nor one whose launcher is not Triton 3.6's CudaLauncher
    entry = (None, None, None, types.SimpleNamespace(run=lambda *a: None, function=1, packed_metadata=(4, 1, 0)))
    assert fast._descriptor_entry(entry, {"x_desc": spec}, {"x_desc": base}) is None


@triton_36
def test_planned_launch_calls_the_c_launcher_as_triton_does(monkeypatch) -> None:
    """A cached launch without descriptors calls the binary's C launcher itself with exactly the
    arguments Triton's ``CudaLauncher.__call__`` passes it for the same call (launch flags, None
    for scratch), and runs the binary Triton chooses (check mode too)."""
    from triton.backends.nvidia import driver

    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    raw_calls: list[tuple] = []

    def raw(*args):
        raw_calls.append(args)

    kernel = _DescStandIn(lambda: _triton_launcher(raw, None, signature=_PLAIN_SIGNATURE), _kernel_fn)
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 77)
    monkeypatch.setattr(_launch, "_fast_launcher", lambda k: fast if k is kernel else None)
    go = _launch.launcher(kernel, (3, 2), **_CONSTANTS)
    x, y = torch.zeros(8), torch.zeros(4)
    first = go(x, x_ptr=x, y_ptr=y)  # through kernel[grid]
    assert kernel.slow_calls == 1 and len(raw_calls) == 1
    entry = fast._plain_entry((first.run, first.function, first.packed_metadata, first))
    assert entry == (raw, first.function, first.packed_metadata, first, False, True)  # the C launcher itself
    for a, b in ((x, y), (y, x), (x, x)):
        assert go(x, x_ptr=a, y_ptr=b) is first and kernel.slow_calls == 1
        cached = raw_calls[-1]
        # Triton's own launch of these arguments: CompiledKernel.run = CudaLauncher.__call__ -> C launcher
        first.run(3, 2, 1, 77, first.function, first.packed_metadata, None, None, None,
                  a.data_ptr(), b.data_ptr(), 33, 16, 0.5, 3, 16, "a")
        assert cached == raw_calls[-1], (cached, raw_calls[-1])
        assert cached[:13] == (3, 2, 1, 77, first.function, False, True, None, None, (4, 1, 0), None, None, None)
        assert cached[13:] == (a.data_ptr(), b.data_ptr(), 33, 16, 0.5, 3, 16, "a")
    # a new dtype is another specialisation, another binary
    assert go(x, x_ptr=x.double(), y_ptr=y) is not first and kernel.slow_calls == 2
    monkeypatch.setattr(_launch, "_cached_path_open", lambda like: "check")
    assert go(x, x_ptr=x, y_ptr=y) is first  # Triton agrees

    # another launcher (a subclass of Triton's, another class): its run, with run's arguments
    class Launcher(driver.CudaLauncher):
        pass

    calls = []
    for run in (_triton_launcher(raw, None, signature=_PLAIN_SIGNATURE, launcher_class=Launcher),
                lambda *args: calls.append(args)):
        other = fast._plain_entry((run, 5, (4, 1, 0), first))
        assert other[0].func is _launch._through_run and other[0].args == (run,) and other[1:4] == (5, (4, 1, 0), first)
        other[0](3, 2, 1, 77, 5, other[4], other[5], None, None, (4, 1, 0), None, None, None, 11, 12)
    assert raw_calls[-1] == (3, 2, 1, 77, 5, False, True, None, None, (4, 1, 0), None, None, None, 11, 12)
    assert calls == [(3, 2, 1, 77, 5, (4, 1, 0), None, None, None, 11, 12)]


@triton_36
@pytest.mark.parametrize("scratch", ["global", "profile"])
def test_planned_launch_with_scratch_goes_through_triton(scratch, monkeypatch) -> None:
    """A binary with global or profile scratch memory launches every call through Triton's
    ``CudaLauncher``, which allocates it, with the arguments ``CompiledKernel.run`` takes."""
    from triton.backends.nvidia import driver

    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    allocations = []
    allocator = types.SimpleNamespace(get=lambda: lambda size, align, stream: allocations.append(size) or 1234)
    monkeypatch.setattr(driver._allocation, "_allocator" if scratch == "global" else "_profile_allocator", allocator)
    raw_calls: list[tuple] = []
    sizes = dict(scratch=64) if scratch == "global" else dict(profile_scratch=64)
    kernel = _DescStandIn(lambda: _triton_launcher(lambda *a: raw_calls.append(a), None, signature=_PLAIN_SIGNATURE,
                                                   **sizes), _kernel_fn)
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 77)
    go = fast.constant_launch((3,), _CONSTANTS)
    x, y = torch.zeros(8), torch.zeros(4)
    first = go(x, x_ptr=x, y_ptr=y)
    for _ in range(3):
        assert go(x, x_ptr=x, y_ptr=y) is first
    assert kernel.slow_calls == 1 and len(allocations) == 4 == len(raw_calls)  # scratch at every launch
    slot = 7 if scratch == "global" else 8
    assert all(c[slot] == 1234 and c[15 - slot] is None for c in raw_calls)
    assert raw_calls[-1][13:] == (x.data_ptr(), y.data_ptr(), 33, 16, 0.5, 3, 16, "a")


@triton_36
def test_descriptor_launch_with_scratch_goes_through_triton(fake_fill, monkeypatch) -> None:
    """A binary with global scratch launches every call through Triton's ``CudaLauncher`` (which
    allocates the scratch), with the ``TensorDescriptor``."""
    from triton.backends.nvidia import driver

    monkeypatch.setattr(_launch, "_cached_path_open", _open_on_cpu)
    allocations = []
    monkeypatch.setattr(driver._allocation, "_allocator",
                        types.SimpleNamespace(get=lambda: lambda size, align, stream: allocations.append(size) or 1234))
    raw_calls: list[tuple] = []
    kernel = _DescStandIn(lambda: _triton_launcher(lambda *a: raw_calls.append(a), [dict(_META)], scratch=64))
    fast = _launch.FastLauncher(kernel, current_device=lambda: 0, current_stream=lambda d: 77)
    go = fast.constant_launch((3,), {"n": 5, "BLOCK": 16, "num_warps": 4}, descriptors={"x_desc": _spec()})
    x, base = torch.zeros(8), _bf16_base()
    for _ in range(3):
        go(x, x_ptr=x, x_desc=base)
    assert len(allocations) == 3 and all(c[7] == 1234 for c in raw_calls)  # scratch at every launch
    assert len(fake_fill) == 3  # Triton's launcher encodes at every launch


def test_descriptor_launcher_elsewhere_builds_the_descriptor(monkeypatch) -> None:
    """Where the cached path is not implemented (another Triton) the descriptor parameter's base
    becomes its ``TensorDescriptor`` per call, and ``launch`` runs."""
    monkeypatch.setattr(_launch, "_PROTOCOL_VERSIONS", ("0.0",))
    kernel = JITFunction(_desc_kernel_fn)
    spec = _spec()
    go = _launch.launcher(kernel, (2,), x_desc=spec, n=5, BLOCK=16)
    assert isinstance(go, _launch.functools.partial) and go.func is _launch._launch_with_descriptors
    seen = []
    monkeypatch.setattr(_launch, "launch", lambda k, grid, like: lambda **kw: seen.append((k, grid, kw)))
    x, base = torch.zeros(8), _bf16_base()
    go(x, x_ptr=x, x_desc=base)
    (k, grid, kw), = seen
    assert k is kernel and grid == (2,) and kw["x_ptr"] is x and (kw["n"], kw["BLOCK"]) == (5, 16)
    desc = kw["x_desc"]
    assert type(desc).__name__ == "TensorDescriptor" and desc.base is base
    assert (list(desc.shape), list(desc.strides), list(desc.block_shape), desc.layout) == (
        [64, 128], [128, 1], [64, 64], spec.layout)


@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_gluon_plans_pass_only_tensors_per_call(split, monkeypatch) -> None:
    """The Gluon kernels' plans (``mla_sm90.prepare``, ``prefill_sm90.prepare``) fix every launch
    argument but the tensors: a planned eager call passes tensors alone, the cache itself as its
    descriptor's base."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90, prefill_sm90
    from torch_paged_attn.lowering.triton import paged_attention as tpa

    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")
    made, calls = [], []

    def launcher(kernel, grid, **constants):
        made.append((kernel, grid, constants))
        return lambda like, **tensors: calls.append((like, tensors))

    monkeypatch.setattr(mla_sm90, "launcher", launcher)
    monkeypatch.setattr(prefill_sm90, "launcher", launcher)
    bf = torch.bfloat16
    ql, qr, cache = torch.zeros(2, 128, 512, dtype=bf), torch.zeros(2, 128, 64, dtype=bf), torch.zeros(4, 64, 576, dtype=bf)
    table, lens, qsl = torch.zeros(2, 8, dtype=torch.int32), torch.ones(2, dtype=torch.int32), torch.arange(3, dtype=torch.int32)
    out, lse = torch.empty_like(ql), torch.empty(2, 128)
    call = (ql, qr, cache, table, lens, qsl, out, lse)
    if split:
        workspace = tpa._Workspace(True, 2, 4, 128, 512, ql.device)
        run = mla_sm90.prepare(scale=0.1, causal=True, split_tokens=128, call=call, workspace=workspace,
                               combine=lambda *a: None)
    else:
        run = mla_sm90.prepare(scale=0.1, causal=True, split_tokens=tpa._NO_SPLIT, call=call)
    run(*call, {})
    q, k, v = torch.zeros(5, 8, 64, dtype=bf), torch.zeros(4, 16, 2, 64, dtype=bf), torch.zeros(4, 16, 2, 64, dtype=bf)
    p_out, p_lse = torch.empty_like(q), None if split else torch.empty(5, 8)
    prefill_sm90.prepare(q, k, v, table, lens, qsl, p_out, p_lse, scale=0.1, causal=True,
                         rows=(128, 32, 4, 1))(q, k, v, table, lens, qsl, p_out, p_lse, {})
    assert len(made) == len(calls) == 2
    (mla_kernel, grid, constants), (pre_kernel, _, pre_constants) = made
    assert grid == (4, 1, 4 if split else 1) and constants["HEAD_GROUPS"] == 2  # 2 tokens x 2 head groups on axis 0
    assert isinstance(constants["kv_desc"], _launch.Descriptor) and constants["kv_desc"].shape == (256, 576)
    assert isinstance(pre_constants["k_desc"], _launch.Descriptor) and pre_constants["v_desc"].shape == (64, 128)
    for like, tensors in calls:
        assert isinstance(like, torch.Tensor)
        assert all(isinstance(t, torch.Tensor) for t in tensors.values()), tensors
    mla_tensors, pre_tensors = calls[0][1], calls[1][1]
    assert mla_tensors["kv_desc"] is cache and pre_tensors["k_desc"] is k and pre_tensors["v_desc"] is v
    # every kernel parameter is either fixed in the plan or a tensor of the call
    for (kernel, _, fixed), (_, tensors) in zip(made, calls):
        params = {p.name for p in kernel.params if not p.has_default}
        assert params == (set(fixed) - {"num_warps"}) | set(tensors), params ^ (set(fixed) | set(tensors))
