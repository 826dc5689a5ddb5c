"""The native pinned launch (``lowering/triton/_native.py``, ``_pinned.cpp``).

CPU tier: the kernel parameters packed as Triton 3.6's C launcher stores them (bytes written out
by hand from the C types: two's complement ints, IEEE floats, bf16 as the float32's upper half);
what cannot be packed is refused; the extension builds with this machine's compiler against the
installed torch, is found again without a rebuild, and refuses bad arguments; nothing is built for
a launch it would not make or with the switch off.

GPU tier (CUDA, TRITON_INTERPRET unset, the extension built): a repeated plain decode call of
either form is served by a ``Pinned`` and writes exactly what the runner writes; it declines (writes
nothing, the runner serves) with fast launch off, in check mode and for a misaligned output; the
functional form's lse is a new ``[0]`` tensor each call that cannot grow; CUDA-graph capture of a
natively served call replays to the eager result. Repeated plain cache writes (``reshape_and_cache``,
``concat_and_cache_mla``) are served by one too and write what index assignment writes.
"""

from __future__ import annotations

import os
import struct

import pytest
import torch

triton = pytest.importorskip("triton")

import torch_paged_attn  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import _native  # noqa: E402
from torch_paged_attn.testing import make_paged_batch  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")


def _f32_bits(hex_le: str) -> float:
    return struct.unpack("<f", bytes.fromhex(hex_le))[0]


def test_pack_stores_each_parameter_as_the_c_launcher_does() -> None:
    signature = {"x_ptr": "*bf16", "BLOCK": "constexpr", "n": "i32", "big": "i64", "u": "u64", "s": "fp32",
                 "h": "fp16", "b": "bf16", "flag": "i1", "y_ptr": "*fp32", "d": "fp64", "small": "i8",
                 "us": "u16", "z_ptr": "*bf16"}
    spec = {"x_ptr": ("t", 2), "BLOCK": ("v", 64), "n": ("v", -1), "big": ("v", -(1 << 40) + 3),
            "u": ("v", (1 << 64) - 1), "s": ("v", 0.1), "h": ("v", -2.5), "flag": ("v", True), "y_ptr": ("t", 0),
            "b": ("v", _f32_bits("ffff803f")), "d": ("v", 1 / 3), "small": ("v", -7), "us": ("v", 65535),
            "z_ptr": ("t", 2)}
    params, slots = _native.pack(signature, spec)
    expected = [
        "0000000000000000",  # x_ptr: its address goes here
        "ffffffff00000000",  # i32 -1
        "0300000000ffffff",  # i64 -2**40 + 3 = 0xffffff0000000003
        "ffffffffffffffff",  # u64 2**64 - 1
        "cdcccc3d00000000",  # fp32 0.1 = 0x3dcccccd
        "00c1000000000000",  # fp16 -2.5 = 0xc100
        "803f000000000000",  # bf16 of 0x3f80ffff: the upper half 0x3f80 (truncated, not rounded to 0x3f81)
        "0100000000000000",  # i1 True
        "0000000000000000",  # y_ptr
        "555555555555d53f",  # fp64 1/3 = 0x3fd5555555555555
        "f900000000000000",  # i8 -7
        "ffff000000000000",  # u16 65535
        "0000000000000000",  # z_ptr
        "0000000000000000",  # global scratch: none
        "0000000000000000",  # profile scratch: none
    ]
    assert params.hex() == "".join(expected)
    assert slots == [0, 2, 8, 0, 12, 2]


@pytest.mark.parametrize("signature, spec, error", [
    ({"n": "i32"}, {"n": ("t", 0)}, TypeError),  # a tensor for a scalar
    ({"p": "*fp32"}, {"p": ("v", 0)}, TypeError),  # a value for a pointer
    ({"d": "nvTmaDesc"}, {"d": ("v", 0)}, TypeError),  # a type the launcher builds otherwise
    ({"n": "i32"}, {"n": ("v", 1 << 31)}, OverflowError),  # out of the C type's range, as PyArg "i" refuses
    ({"n": "u8"}, {"n": ("v", -1)}, OverflowError),
    ({"n": "i32"}, {}, KeyError),  # a parameter the spec does not name
])
def test_pack_refuses_what_it_cannot_store(signature, spec, error) -> None:
    with pytest.raises(error):
        _native.pack(signature, spec)


def test_no_build_for_a_launch_it_would_not_make(monkeypatch) -> None:
    """An entry launched through its ``run`` (scratch memory, another launcher: no cooperative
    flag), a cluster launch, a signature it cannot pack, or the switch off: None, nothing built."""
    monkeypatch.setattr(_native, "module", lambda: pytest.fail("built for a launch it does not make"))
    compiled = type("Compiled", (), {"src": type("Src", (), {"signature": {"x_ptr": "*fp32", "n": "i32"}})()})()
    spec = {"x_ptr": ("t", 0), "n": ("v", 3)}
    out = torch.empty(2)
    assert _native.pinned(bool, (None, 1, (4, 1, 0), compiled, None, None), (1, 1, 1), 0, spec, 1, [0], out) is None
    assert _native.pinned(bool, (None, 1, (4, 2, 0), compiled, False, False), (1, 1, 1), 0, spec, 1, [0], out) is None
    assert _native.pinned(bool, (None, 1, (4, 1, 0), compiled, False, False), (1, 1, 1), 0, {}, 1, [0], out) is None
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_PAGED_ATTN_NATIVE_LAUNCH", "0")
    monkeypatch.setattr(_native, "build", lambda: pytest.fail("built with the switch off"))
    assert _native.module() is None


def test_extension_builds_loads_and_refuses_bad_arguments(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_PAGED_ATTN_CACHE_DIR", str(tmp_path))
    path = _native.build()
    assert os.path.dirname(path) == str(tmp_path)
    built = os.stat(path).st_mtime_ns
    assert _native.build() == path and os.stat(path).st_mtime_ns == built  # found again, not rebuilt
    native = _native._load(path)
    out = torch.empty(4, 8)
    params = bytes(8 * 3)

    def make(**changes):
        args = dict(ready=bool, function=0, grid=(1, 1, 1), threads=128, shared=0, pdl=False, cooperative=False,
                    device=0, tensors=2, params=params, slots=(0, 0, 1, 1), aligned=(0,), out_sizes=(4, 8),
                    out_like=out, keep=None)
        args.update(changes)
        return native.Pinned(*args.values())

    for changes in ({"slots": (3, 0)}, {"slots": (0, 2)}, {"slots": (0,)}, {"aligned": (2,)}, {"tensors": 0},
                    {"params": bytes(12)}, {"grid": (1, 1)}):
        with pytest.raises(ValueError):
            make(**changes)
    with pytest.raises(TypeError):
        make(out_like=[4, 8])
    if not _CUDA:  # no driver here (or one that is not used): the only way left to fail
        try:
            make()
        except RuntimeError as e:
            assert "libcuda" in str(e)


# -- GPU tier ------------------------------------------------------------------------------------


def _entry(op: str) -> tuple:
    entries = [payload for key, found in lowering._CHOICES.items() if isinstance(found, list) and key[0][0] == op
               for _, payload in found]
    assert len(entries) == 1, entries
    return entries[0]


@gpu_tier
@pytest.mark.parametrize("form", ["paged_attention", "paged_attention_out", "paged_attention_out with lse"])
def test_native_pinned_launch_serves_plain_decode_cuda(form, monkeypatch) -> None:
    if _native.module() is None:
        pytest.skip("the native pinned launch did not build here (see the log)")
    monkeypatch.delenv("TORCH_PAGED_ATTN_FAST_LAUNCH", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG", raising=False)
    lowering._CHOICES.clear()
    batch = make_paged_batch([1] * 5, [20, 7, 33, 64, 1], num_heads=8, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16, device="cuda")
    args = batch.args()
    out = torch.empty(5, 8, 64, dtype=torch.bfloat16, device="cuda")
    with_lse = form == "paged_attention_out with lse"
    lse_out = torch.empty(5, 8, device="cuda") if with_lse else None
    given = (lse_out,) if with_lse else ()  # what fire takes after out

    def call():
        if form != "paged_attention":
            if with_lse:
                lse_out.fill_(float("nan"))
            torch_paged_attn.paged_attention_out(*args, out.fill_(float("nan")), lse_out, max_query_len=1)
            return (out.clone(), lse_out.clone()) if with_lse else out.clone()
        return torch_paged_attn.paged_attention(*args, max_query_len=1)

    try:
        with monkeypatch.context() as m:
            m.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "0")
            # each form against the runner of its own plan (with an lse or without)
            expected, expected_lse = torch_paged_attn.paged_attention(*args, max_query_len=1, return_lse=with_lse)
        lowering._CHOICES.clear()
        call(), call()  # planned, then remembered with its pin
        entry = _entry(form.split()[0])
        fire = entry[-2] if form == "paged_attention" else entry[-1]
        assert type(fire).__name__ == "Pinned"
        for _ in range(3):
            got = call()
            if form == "paged_attention":
                got, lse = got
                assert lse.shape == (0,) and lse.dtype == torch.float32 and lse is not entry[4]
                with pytest.raises(RuntimeError):
                    lse.resize_(4)
            elif with_lse:
                got, lse = got
                assert torch.equal(lse, expected_lse)
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))

        # declines: nothing written, and False / None so the caller's runner serves
        poisoned = torch.full_like(out, float("nan"))
        for mode in ("0", "check"):
            with monkeypatch.context() as m:
                m.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", mode)
                assert fire(*args, poisoned, *given) is False
                if not with_lse:
                    assert fire.new(*args, entry[4] if form == "paged_attention" else out) is None
        misaligned = torch.full((out.numel() + 1,), float("nan"), dtype=out.dtype, device="cuda")[1:].view(out.shape)
        assert fire(*args, misaligned, *given) is False
        if with_lse:
            lse_out.fill_(float("nan"))
            off = torch.full((lse_out.numel() + 1,), float("nan"), device="cuda")[1:].view(lse_out.shape)
            assert fire(*args, poisoned, off) is False
            torch.cuda.synchronize()
            assert off.isnan().all() and lse_out.isnan().all()
        torch.cuda.synchronize()
        assert poisoned.isnan().all() and misaligned.isnan().all()
        assert fire(*args, poisoned, *given) is True
        torch.cuda.synchronize()
        assert torch.equal(poisoned.view(torch.uint8), expected.view(torch.uint8))
        if with_lse:
            assert torch.equal(lse_out, expected_lse)

        # captured in a CUDA graph, replayed
        static = torch.full_like(out, float("nan"))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            if form != "paged_attention":
                torch_paged_attn.paged_attention_out(*args, static, lse_out, max_query_len=1)
            else:
                static = torch_paged_attn.paged_attention(*args, max_query_len=1)[0]
        if with_lse:
            lse_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static.view(torch.uint8), expected.view(torch.uint8))
        if with_lse:
            assert torch.equal(lse_out, expected_lse)
    finally:
        lowering._CHOICES.clear()


@gpu_tier
@pytest.mark.parametrize("op", ["reshape_and_cache", "concat_and_cache_mla"])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_native_pinned_cache_writes_cuda(op, slot_dtype, monkeypatch) -> None:
    """Repeated plain cache writes served by a ``Pinned``: new values in the same inputs and new
    slots each call, into poisoned caches, write exactly what index assignment does (a negative
    slot skipped, rows past the slots never read); a decline writes nothing; a CUDA-graph capture
    of a natively served call replays to it."""
    if _native.module() is None:
        pytest.skip("the native pinned launch did not build here (see the log)")
    monkeypatch.delenv("TORCH_PAGED_ATTN_FAST_LAUNCH", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG", raising=False)
    lowering._CHOICES.clear()
    g = torch.Generator(device="cpu").manual_seed(11)
    num_blocks, block_size, tokens = 6, 16, 5
    if op == "reshape_and_cache":
        inputs = (torch.empty(tokens + 2, 2, 64, dtype=torch.bfloat16, device="cuda"),
                  torch.empty(tokens + 2, 2, 32, dtype=torch.bfloat16, device="cuda"))
        shapes = ((num_blocks, block_size, 2, 64), (num_blocks, block_size, 2, 32))
        write = torch_paged_attn.reshape_and_cache
    else:
        inputs = (torch.empty(tokens + 2, 512, dtype=torch.bfloat16, device="cuda"),
                  torch.empty(tokens + 2, 64, dtype=torch.bfloat16, device="cuda"))
        shapes = ((num_blocks, block_size, 576),)
        write = torch_paged_attn.concat_and_cache_mla
    slots = torch.empty(tokens, dtype=slot_dtype, device="cuda")

    def fresh():  # new values in the same tensors: the inputs, the slots (one skipped), poisoned caches
        for t in inputs:
            t.copy_(torch.randn(t.shape, generator=g))
        chosen = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
        chosen[1] = -1
        slots.copy_(chosen)
        return tuple(torch.full(s, float("nan"), dtype=torch.bfloat16, device="cuda") for s in shapes)

    def expected(caches):  # index assignment, row by row
        want = [c.clone() for c in caches]
        for t, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            b, o = divmod(s, block_size)
            if op == "reshape_and_cache":
                want[0][b, o], want[1][b, o] = inputs[0][t], inputs[1][t]
            else:
                want[0][b, o] = torch.cat([inputs[0][t], inputs[1][t]])
        return want

    def same(got, want):
        return all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))

    try:
        for _ in range(2):  # planned, then remembered with its pin
            caches = fresh()
            want = expected(caches)
            write(*inputs, *caches, slots)
            assert same(caches, want)
        entries = [payload for key, found in lowering._CHOICES.items() if isinstance(found, list) and key[0][0] == op
                   for _, payload in found]
        assert len(entries) == 1 and type(entries[0][1]).__name__ == "Pinned"
        fire = entries[0][1]
        for _ in range(3):
            caches = fresh()
            want = expected(caches)
            write(*inputs, *caches, slots)
            assert same(caches, want)

        caches = fresh()
        for mode in ("0", "check"):  # declines: nothing written
            with monkeypatch.context() as m:
                m.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", mode)
                assert fire(*inputs, slots, *caches) is False
        torch.cuda.synchronize()
        assert all(c.isnan().all() for c in caches)
        assert fire(*inputs, slots, *caches) is True
        assert same(caches, expected(tuple(torch.full(s, float("nan"), dtype=torch.bfloat16, device="cuda")
                                            for s in shapes)))

        static = fresh()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            write(*inputs, *fresh(), slots)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            write(*inputs, *static, slots)
        for c in static:
            c.fill_(float("nan"))
        want = expected(static)
        graph.replay()
        torch.cuda.synchronize()
        assert same(static, want)
    finally:
        lowering._CHOICES.clear()
