"""The Triton KV-cache kernels (reshape_and_cache, concat_and_cache_mla, gather_cache) against the
reference backend.

The cache writes start from a cache of random bytes (NaN patterns included) and compare the whole
underlying storage bitwise with the reference applied to a clone: a copy and fp8 quantisation
(saturate(x / scale), round to nearest even) have exactly one right answer, and writes outside a
strided view would show up in the storage. Inputs cover padding slots, slots past the cache,
padding rows of key/value (NaN, never read), int32 and int64 slot mappings, fp8 e4m3/e5m2 with
values from subnormal to far past saturation, strided sources and caches, and head_size_v !=
head_size. gather_cache poisons ``out`` with NaN (rows past ``cu_seq_lens[-1]`` must keep it)
and plants bad block ids in the used part of the table (the reference writes 0 there).

Two tiers: the interpreter tier (``TRITON_INTERPRET=1``, CPU tensors, tiny shapes) and the GPU
tier (CUDA: larger shapes, CUDA-graph capture and replay after changing the indices in place,
torch.compile through the public ops, no host synchronisation).
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

import torch_paged_attn  # noqa: E402,F401  (registers the ops)
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import kv_cache  # noqa: E402
from torch_paged_attn.testing import make_block_table  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
interpreter_tier = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    a = actual.view(_BITS[actual.element_size()])
    e = expected.view(_BITS[expected.element_size()])
    diff = a != e
    if diff.any():
        at = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(diff.sum())} of {diff.numel()} elements differ bitwise, first at {at}: "
            f"got {actual[tuple(at)].float().item()}, expected {expected[tuple(at)].float().item()}"
        )


def random_bytes(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A tensor of random bit patterns (NaN and inf included): a cache nobody has written yet."""
    size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def wide_range(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """float32 values whose magnitudes span 1e-7 .. 1e6 row by row: fp8 subnormals, normals and
    values far past saturation (448 for e4m3, 57344 for e5m2) all occur."""
    mag = 10.0 ** torch.empty(shape[:-1] + (1,)).uniform_(-7, 6, generator=g)
    return torch.randn(shape, generator=g) * mag


def slot_mapping(num_tokens: int, num_slots: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Distinct valid slots, with padding (negative) and out-of-range entries mixed in."""
    slots = torch.randperm(num_slots, generator=g)[:num_tokens].to(torch.int64)
    kind = torch.randint(0, 6, (num_tokens,), generator=g)
    slots = torch.where(kind == 0, -1, slots)
    slots = torch.where(kind == 1, num_slots + torch.randint(0, 3, (num_tokens,), generator=g), slots)
    if dtype == torch.int64:
        slots = torch.where(kind == 2, -(2**40), slots)
        slots[-1] = 2**33 + 5  # past the cache even when read as the low 32 bits
    else:
        slots = torch.where(kind == 2, -(2**31), slots)
        slots[-1] = 2**31 - 1
    return slots.to(dtype)


def cache_storages(case, g: torch.Generator) -> list[torch.Tensor]:
    """The tensors behind the key and value caches of ``case`` (see ``cache_views``)."""
    nb, bs, h = case.num_blocks, case.block_size, case.num_kv_heads
    d, dv, dtype = case.head_size, case.head_size_v, case.cache_dtype
    shapes = {
        "contiguous": [(nb, bs, h, d), (nb, bs, h, dv)],
        "layers": [(nb, 3, bs, h, d), (nb, 3, bs, h, dv)],  # cross-layer cache, layer 1 used
        "kv_unbind": [(nb, 2, bs, h, d)],  # [NB, 2, BS, H, D] unbound into key and value
        "hnd": [(nb, h, bs, d), (nb, h, bs, dv)],  # [NB, H, BS, D] permuted to NHD
        "padded_rows": [(nb, bs, h, d + 16), (nb, bs, h, dv + 16)],  # rows padded by 16
    }[case.layout]
    return [random_bytes(shape, dtype, g) for shape in shapes]


def cache_views(case, storages: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value caches ``[NB, BS, H, D|Dv]`` as views of ``storages``."""
    if case.layout == "contiguous":
        return storages[0], storages[1]
    if case.layout == "layers":
        return storages[0][:, 1], storages[1][:, 1]
    if case.layout == "kv_unbind":
        return storages[0][:, 0], storages[0][:, 1]
    if case.layout == "hnd":
        return storages[0].permute(0, 2, 1, 3), storages[1].permute(0, 2, 1, 3)
    return storages[0][..., : case.head_size], storages[1][..., : case.head_size_v]


# ---------------------------------------------------------------------------------------------
# reshape_and_cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteCase:
    num_tokens: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.bfloat16
    cache_dtype: torch.dtype = torch.bfloat16
    layout: str = "contiguous"
    pad_rows: int = 3  # rows of key/value past len(slot_mapping)
    slot_dtype: torch.dtype = torch.int64
    fused_source: bool = False  # key/value are slices of one [T, H, D + Dv + 16] buffer

    @property
    def id(self) -> str:
        s = (
            f"T{self.num_tokens}_H{self.num_kv_heads}_D{self.head_size}_Dv{self.head_size_v}"
            f"_bs{self.block_size}_NB{self.num_blocks}_{_SHORT[self.dtype]}"
            f"_cache{_SHORT[self.cache_dtype]}_{self.layout}"
        )
        if self.slot_dtype == torch.int32:
            s += "_slots32"
        if self.fused_source:
            s += "_fused"
        return s


SMALL_WRITES = [
    WriteCase(9, 2, 32, 32, 8, 3, torch.float32, torch.float32),
    WriteCase(9, 2, 32, 48, 8, 3, torch.bfloat16, torch.bfloat16, slot_dtype=torch.int32),
    WriteCase(12, 1, 64, 64, 16, 2, torch.float16, torch.float16, layout="kv_unbind"),
    WriteCase(9, 3, 40, 24, 8, 3, torch.bfloat16, torch.bfloat16, layout="hnd", fused_source=True),
    WriteCase(9, 2, 32, 32, 24, 2, torch.float32, torch.float32, layout="layers"),
    WriteCase(9, 2, 32, 32, 8, 3, torch.bfloat16, torch.float8_e4m3fn),
    WriteCase(9, 2, 32, 16, 8, 3, torch.float32, torch.float8_e4m3fn, layout="padded_rows", slot_dtype=torch.int32),
    WriteCase(9, 2, 32, 32, 8, 3, torch.float16, torch.float8_e5m2, layout="hnd", fused_source=True),
    WriteCase(9, 2, 32, 32, 8, 3, torch.float32, torch.float8_e5m2),
]
LARGE_WRITES = [
    WriteCase(8192, 8, 128, 128, 16, 700, torch.bfloat16, torch.bfloat16),
    WriteCase(256, 8, 128, 128, 16, 40, torch.bfloat16, torch.bfloat16),
    WriteCase(1000, 8, 128, 128, 16, 100, torch.bfloat16, torch.bfloat16, layout="kv_unbind", fused_source=True),
    WriteCase(777, 5, 80, 96, 32, 40, torch.float16, torch.float16, layout="hnd", slot_dtype=torch.int32),
    WriteCase(1000, 4, 256, 256, 544, 3, torch.float32, torch.float32, layout="layers"),
    WriteCase(2048, 8, 128, 128, 16, 200, torch.bfloat16, torch.float8_e4m3fn),
    WriteCase(2048, 8, 192, 128, 16, 200, torch.bfloat16, torch.float8_e5m2, layout="padded_rows"),
    WriteCase(600, 64, 64, 64, 8, 100, torch.float32, torch.float8_e4m3fn, layout="hnd"),
]


def write_inputs(case: WriteCase, device: str, seed: int):
    """key, value, the cache storages, slot_mapping and scales of one case, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    t, h, d, dv = case.num_tokens, case.num_kv_heads, case.head_size, case.head_size_v
    rows = t + case.pad_rows
    if case.fused_source:  # key and value sliced out of one projection output
        qkv = wide_range((rows, h, d + dv + 16), g).to(case.dtype)
        qkv[t:] = float("nan")  # padding rows: never read, so NaN there cannot reach the cache
        qkv = qkv.to(device)
        key, value = qkv[:, :, 16 : 16 + d], qkv[:, :, 16 + d :]
    else:
        key = wide_range((rows, h, d), g).to(case.dtype)
        value = wide_range((rows, h, dv), g).to(case.dtype)
        key[t:] = float("nan")
        value[t:] = float("nan")
        key, value = key.to(device), value.to(device)
    storages = [s.to(device) for s in cache_storages(case, g)]
    slots = slot_mapping(t, case.num_blocks * case.block_size, case.slot_dtype, g).to(device)
    k_scale = v_scale = None
    if case.cache_dtype in FP8:
        k_scale = torch.tensor([0.25 + float(torch.rand(1, generator=g))], device=device)
        v_scale = torch.tensor(0.5 + float(torch.rand(1, generator=g)), device=device)
    return key, value, storages, slots, k_scale, v_scale


def check_reshape_and_cache(case: WriteCase, device: str, seed: int) -> None:
    key, value, storages, slots, k_scale, v_scale = write_inputs(case, device, seed)
    expected = [s.clone() for s in storages]
    reference.reshape_and_cache(key, value, *cache_views(case, expected), slots, k_scale, v_scale)
    kv_cache.reshape_and_cache(key, value, *cache_views(case, storages), slots, k_scale, v_scale)
    written = ((slots >= 0) & (slots < case.num_blocks * case.block_size)).sum()
    assert written > 0, "the case writes nothing"
    for i, (got, want) in enumerate(zip(storages, expected)):
        assert_bitwise(got.cpu(), want.cpu(), f"cache storage {i}")


@interpreter_tier
@pytest.mark.parametrize("case", SMALL_WRITES, ids=lambda c: c.id)
def test_reshape_and_cache_interpreted(case: WriteCase) -> None:
    check_reshape_and_cache(case, "cpu", seed=zlib.crc32(case.id.encode()))


@gpu_tier
@pytest.mark.parametrize("case", SMALL_WRITES + LARGE_WRITES, ids=lambda c: c.id)
def test_reshape_and_cache_cuda(case: WriteCase) -> None:
    check_reshape_and_cache(case, "cuda", seed=zlib.crc32(case.id.encode()))


@interpreter_tier
def test_fp8_quantisation_every_rounding_boundary() -> None:
    """Every fp8 value, every midpoint between neighbours and the float32 values just beside each
    midpoint (where round-to-nearest-even decides), zeros, subnormals, saturation and NaN."""
    check_fp8_boundaries("cpu")


def check_fp8_boundaries(device: str) -> None:
    for dtype in FP8:
        values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        values = values[torch.isfinite(values)].unique()
        mids = ((values[1:].double() + values[:-1].double()) / 2).float()
        up = torch.nextafter(mids, torch.full_like(mids, math.inf))
        down = torch.nextafter(mids, torch.full_like(mids, -math.inf))
        fmax = torch.finfo(dtype).max
        edges = torch.tensor(
            [0.0, -0.0, 1e-30, -1e-30, 2.0**-10, 2.0**-17, 3 * 2.0**-18, fmax * 1.0001, fmax * 1.2,
             -fmax * 3, 1e30, math.inf, -math.inf, math.nan]
        )
        x = torch.cat([values, mids, up, down, edges])
        width = 64
        x = torch.cat([x, x[: (-x.numel()) % width]]).reshape(-1, 1, width)
        n = x.shape[0]
        scale = torch.tensor([1.0])
        slots = torch.arange(n)
        cache = torch.zeros(n, 1, 1, width, dtype=dtype)
        expected = cache.clone()
        x, cache, expected, slots, scale = (t.to(device) for t in (x, cache, expected, slots, scale))
        reference.reshape_and_cache(x, x, expected, expected.clone(), slots, scale, scale)
        kv_cache.reshape_and_cache(x, x, cache, cache.clone(), slots, scale, scale)
        assert_bitwise(cache.cpu(), expected.cpu(), f"{dtype} quantisation")


@gpu_tier
def test_fp8_quantisation_every_rounding_boundary_cuda() -> None:
    check_fp8_boundaries("cuda")


# ---------------------------------------------------------------------------------------------
# concat_and_cache_mla
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MlaCase:
    num_tokens: int
    latent: int
    rope: int
    block_size: int
    num_blocks: int
    dtype: torch.dtype = torch.bfloat16
    cache_dtype: torch.dtype = torch.bfloat16
    strided: bool = False  # cache rows padded (a [NB, BS, W + 32] buffer sliced), kv_c/k_pe slices

    @property
    def id(self) -> str:
        s = (
            f"T{self.num_tokens}_L{self.latent}_R{self.rope}_bs{self.block_size}_NB{self.num_blocks}"
            f"_{_SHORT[self.dtype]}_cache{_SHORT[self.cache_dtype]}"
        )
        return s + ("_strided" if self.strided else "")


SMALL_MLA = [
    MlaCase(9, 64, 16, 8, 3, torch.bfloat16, torch.bfloat16),
    MlaCase(9, 64, 16, 8, 3, torch.float32, torch.float32, strided=True),
    MlaCase(9, 64, 32, 16, 2, torch.bfloat16, torch.float8_e4m3fn, strided=True),
    MlaCase(9, 48, 16, 8, 3, torch.float16, torch.float8_e5m2),
]
LARGE_MLA = [
    MlaCase(4096, 512, 64, 64, 100, torch.bfloat16, torch.bfloat16),
    MlaCase(1000, 512, 64, 16, 100, torch.bfloat16, torch.float8_e4m3fn, strided=True),
]


def check_concat_and_cache_mla(case: MlaCase, device: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t, lat, rope = case.num_tokens, case.latent, case.rope
    rows = t + 2
    if case.strided:
        src = wide_range((rows, lat + rope + 8), g).to(case.dtype)
        src[t:] = float("nan")
        kv_c, k_pe = src[:, :lat], src[:, lat + 8 :]
    else:
        kv_c = wide_range((rows, lat), g).to(case.dtype)
        k_pe = wide_range((rows, rope), g).to(case.dtype)
        kv_c[t:] = float("nan")
        k_pe[t:] = float("nan")
    width = lat + rope
    storage = random_bytes((case.num_blocks, case.block_size, width + (32 if case.strided else 0)), case.cache_dtype, g)
    slots = slot_mapping(t, case.num_blocks * case.block_size, torch.int64, g)
    scale = torch.tensor(0.3 + float(torch.rand(1, generator=g))) if case.cache_dtype in FP8 else None
    kv_c, k_pe, storage, slots = (x.to(device) for x in (kv_c, k_pe, storage, slots))
    scale = None if scale is None else scale.to(device)
    expected = storage.clone()
    reference.concat_and_cache_mla(kv_c, k_pe, expected[..., :width], slots, scale)
    kv_cache.concat_and_cache_mla(kv_c, k_pe, storage[..., :width], slots, scale)
    assert_bitwise(storage.cpu(), expected.cpu(), "MLA cache storage")


@interpreter_tier
@pytest.mark.parametrize("case", SMALL_MLA, ids=lambda c: c.id)
def test_concat_and_cache_mla_interpreted(case: MlaCase) -> None:
    check_concat_and_cache_mla(case, "cpu", seed=zlib.crc32(case.id.encode()))


@gpu_tier
@pytest.mark.parametrize("case", SMALL_MLA + LARGE_MLA, ids=lambda c: c.id)
def test_concat_and_cache_mla_cuda(case: MlaCase) -> None:
    check_concat_and_cache_mla(case, "cuda", seed=zlib.crc32(case.id.encode()))


# ---------------------------------------------------------------------------------------------
# gather_cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatherCase:
    lens: tuple[int, ...]  # tokens gathered per sequence
    heads: int  # 0: a 3-D cache [NB, BS, W] with W = head_size
    head_size: int
    block_size: int
    cache_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.bfloat16
    starts: bool = True  # seq_starts given (else None: every sequence starts at 0)
    strided: bool = False  # HND cache (4-D) or padded rows (3-D); out a slice of a wider buffer
    pad_rows: int = 3  # rows of out past cu_seq_lens[-1]
    bad_ids: bool = True  # plant out-of-range block ids in the used part of the table

    @property
    def id(self) -> str:
        shape = f"H{self.heads}_D{self.head_size}" if self.heads else f"W{self.head_size}"
        s = (
            f"B{len(self.lens)}_N{sum(self.lens)}_{shape}_bs{self.block_size}"
            f"_cache{_SHORT[self.cache_dtype]}_out{_SHORT[self.out_dtype]}"
        )
        s += "_starts" if self.starts else ""
        s += "_strided" if self.strided else ""
        return s + ("_badids" if self.bad_ids else "")


SMALL_GATHERS = [
    GatherCase((5, 0, 17), 0, 64, 8, torch.float32, torch.float32),
    GatherCase((5, 0, 17), 0, 48, 8, torch.bfloat16, torch.bfloat16, starts=False, strided=True),
    GatherCase((9, 3), 0, 64, 16, torch.float8_e4m3fn, torch.bfloat16, strided=True),
    GatherCase((9, 3), 0, 32, 8, torch.float8_e5m2, torch.float16),
    GatherCase((6, 1, 11), 2, 32, 8, torch.float16, torch.float16),
    GatherCase((6, 1, 11), 3, 16, 8, torch.float32, torch.bfloat16, strided=True),
    GatherCase((7, 8), 2, 32, 8, torch.float8_e4m3fn, torch.float32, strided=True, pad_rows=0),
    GatherCase((7,), 2, 32, 8, torch.float8_e5m2, torch.bfloat16, starts=False),
]
LARGE_GATHERS = [
    GatherCase((4096, 1, 0, 3000, 17), 0, 576, 64, torch.bfloat16, torch.bfloat16),
    GatherCase((2048, 999, 5), 0, 576, 16, torch.float8_e4m3fn, torch.bfloat16, strided=True),
    GatherCase(tuple(range(0, 640, 10)), 8, 128, 16, torch.float16, torch.float16, strided=True),
    GatherCase((300, 40), 8, 128, 544, torch.float8_e5m2, torch.float32, starts=False),
]


def gather_inputs(case: GatherCase, device: str, seed: int):
    """kv_cache, block_table, cu_seq_lens, seq_starts, out (NaN) and scale of one case."""
    g = torch.Generator().manual_seed(seed)
    bs = case.block_size
    starts = [int(torch.randint(0, 2 * bs + 1, (1,), generator=g)) if case.starts else 0 for _ in case.lens]
    kv_lens = [s + n for s, n in zip(starts, case.lens)]
    num_blocks = sum(math.ceil(n / bs) for n in kv_lens) + 2
    max_blocks = max(math.ceil(n / bs) for n in kv_lens) + 1
    table, _ = make_block_table(kv_lens, bs, num_blocks, g, max_blocks=max_blocks)
    if case.bad_ids:  # out-of-range ids inside the used part: those rows read as 0
        bad = [num_blocks, -7, 2**31 - 1]
        for i, n in enumerate(kv_lens):
            if n > 0:
                table[i, (n - 1) // bs] = bad[i % 3]
    row = (case.heads, case.head_size) if case.heads else (case.head_size,)
    if case.cache_dtype in FP8:  # every bit pattern, NaN included
        values = random_bytes((num_blocks, bs) + row, case.cache_dtype, g)
    else:
        values = torch.randn((num_blocks, bs) + row, generator=g).to(case.cache_dtype)
    if case.strided and case.heads:  # HND storage viewed as NHD
        cache = values.permute(0, 2, 1, 3).contiguous().to(device).permute(0, 2, 1, 3)
    elif case.strided:  # rows padded by 16
        storage = torch.zeros((num_blocks, bs, case.head_size + 16), dtype=case.cache_dtype)
        storage[..., 8 : 8 + case.head_size] = values
        cache = storage.to(device)[..., 8 : 8 + case.head_size]
    else:
        cache = values.to(device)
    num_rows = sum(case.lens) + case.pad_rows
    pad = 8 if case.strided else 0
    out = torch.full((num_rows,) + row[:-1] + (row[-1] + pad,), float("nan"), dtype=case.out_dtype)
    out = out.to(device)[..., pad:]
    cu = torch.tensor([0] + list(case.lens), dtype=torch.int64).cumsum(0).to(torch.int32)
    seq_starts = torch.tensor(starts, dtype=torch.int32, device=device) if case.starts else None
    scale = None
    if case.cache_dtype in FP8:
        scale = torch.tensor([0.2 + float(torch.rand(1, generator=g))], device=device)
    return cache, table.to(device), cu.to(device), seq_starts, out, scale


def check_gather_cache(case: GatherCase, device: str, seed: int) -> None:
    cache, table, cu, starts, out, scale = gather_inputs(case, device, seed)
    expected = out.clone()
    reference.gather_cache(cache, table, cu, starts, expected, scale)
    kv_cache.gather_cache(cache, table, cu, starts, out, scale)
    got, want = out.cpu(), expected.cpu()
    n = sum(case.lens)
    assert torch.isnan(got[n:]).all(), "rows past cu_seq_lens[-1] were written"
    assert not torch.isnan(want[:n]).all(), "the case gathers nothing"
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@interpreter_tier
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN/inf * scale
@pytest.mark.parametrize("case", SMALL_GATHERS, ids=lambda c: c.id)
def test_gather_cache_interpreted(case: GatherCase) -> None:
    check_gather_cache(case, "cpu", seed=zlib.crc32(case.id.encode()))


@gpu_tier
@pytest.mark.parametrize("case", SMALL_GATHERS + LARGE_GATHERS, ids=lambda c: c.id)
def test_gather_cache_cuda(case: GatherCase) -> None:
    check_gather_cache(case, "cuda", seed=zlib.crc32(case.id.encode()))


# ---------------------------------------------------------------------------------------------
# GPU only: CUDA graphs, no host synchronisation, torch.compile through the public ops
# ---------------------------------------------------------------------------------------------


@gpu_tier
def test_reshape_and_cache_cuda_graph_replay() -> None:
    """Capture once, then change slot_mapping, key and value in place and replay: each replay
    writes where the new slots say, bitwise as the reference does."""
    case = WriteCase(300, 8, 128, 128, 16, 40, torch.bfloat16, torch.float8_e4m3fn)
    key, value, storages, slots, k_scale, v_scale = write_inputs(case, "cuda", seed=1)
    kc, vc = cache_views(case, storages)
    kv_cache.reshape_and_cache(key, value, kc, vc, slots, k_scale, v_scale)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kv_cache.reshape_and_cache(key, value, kc, vc, slots, k_scale, v_scale)
    for seed in (2, 3):
        new_key, new_value, _, new_slots, _, _ = write_inputs(case, "cuda", seed=seed)
        key.copy_(new_key)
        value.copy_(new_value)
        slots.copy_(new_slots)
        k_scale.fill_(0.5 * seed)
        expected = [s.clone() for s in storages]
        reference.reshape_and_cache(key, value, *cache_views(case, expected), slots, k_scale, v_scale)
        graph.replay()
        torch.cuda.synchronize()
        for i, (got, want) in enumerate(zip(storages, expected)):
            assert_bitwise(got, want, f"replay {seed}: cache storage {i}")


@gpu_tier
def test_gather_cache_cuda_graph_replay() -> None:
    """Capture once, change the block table, cu_seq_lens and seq_starts in place, replay."""
    case = GatherCase((40, 7, 0, 100), 0, 576, 16, torch.float8_e4m3fn, torch.bfloat16)
    cache, table, cu, starts, out, scale = gather_inputs(case, "cuda", seed=4)
    kv_cache.gather_cache(cache, table, cu, starts, out, scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kv_cache.gather_cache(cache, table, cu, starts, out, scale)
    g = torch.Generator().manual_seed(5)
    for _ in range(2):
        lens = torch.randint(0, 60, (4,), generator=g)
        cu.copy_(torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32))
        starts.copy_(torch.randint(0, 33, (4,), generator=g).to(torch.int32))
        table.copy_(torch.randint(-2, cache.shape[0] + 2, table.shape, generator=g).to(torch.int32))
        out.fill_(float("nan"))
        expected = out.clone()
        reference.gather_cache(cache, table, cu, starts, expected, scale)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@gpu_tier
def test_cache_kernels_no_host_sync() -> None:
    case = WriteCase(64, 8, 128, 128, 16, 8, torch.bfloat16, torch.float8_e5m2)
    key, value, storages, slots, k_scale, v_scale = write_inputs(case, "cuda", seed=6)
    kc, vc = cache_views(case, storages)
    mla = torch.zeros(8, 16, 576, dtype=torch.bfloat16, device="cuda")
    kv_c = torch.randn(64, 512, dtype=torch.bfloat16, device="cuda")
    k_pe = torch.randn(64, 64, dtype=torch.bfloat16, device="cuda")
    gcase = GatherCase((40, 7), 2, 64, 16, torch.float8_e4m3fn, torch.bfloat16)
    cache, table, cu, starts, out, scale = gather_inputs(gcase, "cuda", seed=7)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):  # the first call compiles, the second is the steady state
            kv_cache.reshape_and_cache(key, value, kc, vc, slots, k_scale, v_scale)
            kv_cache.concat_and_cache_mla(kv_c, k_pe, mla, slots, None)
            kv_cache.gather_cache(cache, table, cu, starts, out, scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@gpu_tier
def test_cache_ops_compiled_dispatch_to_triton() -> None:
    """torch.compile(fullgraph=True) over the public ops launches these kernels (the mutated
    caches are functionalised and written back): results equal the reference bitwise."""
    case = WriteCase(200, 4, 64, 64, 16, 20, torch.bfloat16, torch.float8_e4m3fn)
    key, value, storages, slots, k_scale, v_scale = write_inputs(case, "cuda", seed=8)
    kc, vc = cache_views(case, storages)
    gcase = GatherCase((40, 7, 3), 0, 576, 16, torch.bfloat16, torch.bfloat16)
    cache, table, cu, starts, out, _ = gather_inputs(gcase, "cuda", seed=9)

    def step(key, value, kc, vc, slots, k_scale, v_scale, cache, table, cu, starts, out):
        torch.ops.paged_attn.reshape_and_cache(key, value, kc, vc, slots, k_scale, v_scale)
        torch.ops.paged_attn.gather_cache(cache, table, cu, starts, out, None)

    expected = [s.clone() for s in storages]
    ekc, evc = cache_views(case, expected)
    eout = out.clone()
    reference.reshape_and_cache(key, value, ekc, evc, slots, k_scale, v_scale)
    reference.gather_cache(cache, table, cu, starts, eout, None)
    torch.compile(step, fullgraph=True)(key, value, kc, vc, slots, k_scale, v_scale, cache, table, cu, starts, out)
    for i, (got, want) in enumerate(zip(storages, expected)):
        assert_bitwise(got, want, f"compiled: cache storage {i}")
    torch.testing.assert_close(out, eout, rtol=0, atol=0, equal_nan=True)
