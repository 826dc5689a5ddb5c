"""The Triton MLA decode kernel against a float64 formulation, with the reference's budget.

The truth is absorbed MLA evaluated in float64 from the cache rows each sequence's block table
names (fp8 rows dequantised); the budget is the reference backend's own error in the working
precision (``assert_close``). Outputs and LSEs are poisoned with NaN before the kernel writes
them; the cache holds NaN in every slot no sequence covers and the block table garbage past each
sequence's used blocks (``make_block_table``).

Two tiers: the interpreter tier (``TRITON_INTERPRET=1``, CPU tensors, latent 32/48/64 + rope 16,
few heads, and DeepSeek's 512 + 64 row once) and the GPU tier (CUDA: latent 512 + rope 64, 8 to
128 heads, block sizes 16/24/32/64, fp8, speculative tokens, batch invariance, CUDA-graph replay
with no host synchronisation, the public op under torch.compile).
"""

from __future__ import annotations

import math
import os
import random
import zlib
from dataclasses import dataclass, replace

import pytest
import torch

triton = pytest.importorskip("triton")

import _loop as loop  # noqa: E402
from test_triton_paged_attention import combine_settings, recorded_combines  # noqa: E402
import torch_paged_attn  # noqa: E402  (registers the ops)
from torch_paged_attn import _config  # noqa: E402
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import _launch  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402
from torch_paged_attn.testing import FP8_DTYPES, assert_close, make_block_table, random_cache  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
interpreter_tier = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_SHORT = {FP32: "fp32", BF16: "bf16", FP16: "fp16", E4M3: "e4m3", E5M2: "e5m2"}


@dataclass(frozen=True)
class Case:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int = 4
    latent: int = 32
    rope: int = 16
    block_size: int = 16
    dtype: torch.dtype = BF16
    cache_dtype: torch.dtype | None = None
    causal: bool = True
    with_lse: bool = True
    pad_tokens: int = 0
    strided: bool = False  # cache a layer of [NB, 2, BS, W]; q and out slices of wider tensors
    split_tokens: int | None = None
    hint: bool = False  # pass max_query_len = max(q_lens)

    @property
    def id(self) -> str:
        s = f"B{len(self.q_lens)}_q{max(self.q_lens)}_kv{max(self.kv_lens)}_H{self.num_heads}"
        s += f"_L{self.latent}_R{self.rope}_bs{self.block_size}_{_SHORT[self.dtype]}"
        s += f"_{_SHORT[self.cache_dtype]}" if self.cache_dtype is not None else ""
        s += "" if self.causal else "_noncausal"
        s += "" if self.with_lse else "_nolse"
        s += f"_pad{self.pad_tokens}" if self.pad_tokens else ""
        s += "_strided" if self.strided else ""
        s += f"_split{self.split_tokens}" if self.split_tokens else ""
        s += "_hint" if self.hint else ""
        return s


@dataclass
class MlaBatch:
    q_latent: torch.Tensor
    q_rope: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_scale: torch.Tensor | None
    scale: float

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q_latent, self.q_rope, self.kv_cache, self.block_table, self.seq_lens, self.query_start_loc)


def make_batch(case: Case, device: str, seed: int) -> MlaBatch:
    g = torch.Generator().manual_seed(seed)
    cache_dtype = case.cache_dtype or case.dtype
    width = case.latent + case.rope
    used = sum(-(-n // case.block_size) for n in case.kv_lens)
    num_blocks = used + 3
    table, covered = make_block_table(list(case.kv_lens), case.block_size, num_blocks, g)
    kv_scale, s = None, 1.0
    if cache_dtype in FP8_DTYPES:
        s = 0.25 + float(torch.rand(1, generator=g))
        kv_scale = torch.tensor([s], dtype=torch.float32, device=device)
    cache = random_cache((num_blocks, case.block_size, width), cache_dtype, "cpu", g, s)
    if cache_dtype in FP8_DTYPES:
        cache.view(torch.uint8)[~covered] = 0x7F  # a NaN in e4m3fn and e5m2
    else:
        cache[~covered] = float("nan")
    if case.strided:  # one layer of a cross-layer cache; the other layer is NaN
        bits = cache.view(torch.uint8) if cache_dtype in FP8_DTYPES else cache
        buf = torch.full((num_blocks, 2, case.block_size, width), 0x7F if bits.dtype == torch.uint8 else float("nan"),
                         dtype=bits.dtype)
        buf[:, 1] = bits
        # sliced after the move: .to() of a view with gaps would give a contiguous copy
        buf = buf.to(device)
        cache = buf[:, 1].view(cache_dtype) if bits is not cache else buf[:, 1]
    num_tokens = sum(case.q_lens) + case.pad_tokens
    q_lat = torch.randn(num_tokens, case.num_heads, case.latent, generator=g)
    q_rope = torch.randn(num_tokens, case.num_heads, case.rope, generator=g)
    if case.pad_tokens:
        q_lat[sum(case.q_lens):] = float("nan")
        q_rope[sum(case.q_lens):] = float("nan")
    if case.strided:  # slices of one fused projection output [T, H, 8 + L + R]
        fused = torch.full((num_tokens, case.num_heads, 8 + width), float("nan"))
        fused[..., 8 : 8 + case.latent] = q_lat
        fused[..., 8 + case.latent :] = q_rope
        fused = fused.to(case.dtype).to(device)
        q_lat, q_rope = fused[..., 8 : 8 + case.latent], fused[..., 8 + case.latent :]
    else:
        q_lat, q_rope = q_lat.to(case.dtype).to(device), q_rope.to(case.dtype).to(device)
    qsl = torch.tensor([0, *case.q_lens], dtype=torch.int64).cumsum(0).to(torch.int32)
    return MlaBatch(
        q_latent=q_lat,
        q_rope=q_rope,
        kv_cache=cache.to(device),  # a no-op for the strided cache, already there
        block_table=table.to(device),
        seq_lens=torch.tensor(case.kv_lens, dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device),
        kv_scale=kv_scale,
        scale=(0.5 + float(torch.rand(1, generator=g))) / math.sqrt(case.latent + case.rope),
    )


def truth64(b: MlaBatch, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA in float64, one sequence at a time: ``(out [T, H, L], lse [T, H])``."""
    latent = b.q_latent.shape[2]
    q = torch.cat([b.q_latent, b.q_rope], dim=-1).double().cpu()
    cache, table = b.kv_cache.cpu(), b.block_table.cpu().long()
    num_blocks, bs = cache.shape[:2]
    out = torch.zeros(q.shape[0], q.shape[1], latent, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    qsl = b.query_start_loc.cpu().tolist()
    for i, n in enumerate(b.seq_lens.cpu().tolist()):
        j = torch.arange(n)
        ids = table[i, j // bs] if n else torch.zeros(0, dtype=torch.long)
        ok = (ids >= 0) & (ids < num_blocks)  # a bad block id holds no visible key
        rows = cache[ids.clamp(0, num_blocks - 1), j % bs].double()
        if b.kv_scale is not None:
            rows = rows * float(b.kv_scale.cpu())
        rows = torch.where(ok[:, None], rows, 0.0)
        q_len = qsl[i + 1] - qsl[i]
        for t in range(q_len):
            visible = ok & ((j <= n - q_len + t) if causal else True)
            if not visible.any():
                continue
            s = q[qsl[i] + t] @ rows.T * b.scale  # [H, n]
            s = s.masked_fill(~visible, float("-inf"))
            lse[qsl[i] + t] = torch.logsumexp(s, dim=-1)
            out[qsl[i] + t] = torch.softmax(s, dim=-1) @ rows[:, :latent]
    return out, lse


def run_triton(b: MlaBatch, *, causal=True, with_lse=True, strided_out=False, **kw):
    t, h, latent = b.q_latent.shape
    pad = 24 if strided_out else 0
    out = torch.full((t, h, latent + pad), float("nan"), dtype=b.q_latent.dtype, device=b.q_latent.device)[..., pad:]
    lse = torch.full((t, h), float("nan"), device=b.q_latent.device) if with_lse else None
    tmla.mla_decode(*b.args(), out, lse, scale=b.scale, causal=causal, kv_scale=b.kv_scale, **kw)
    return out, lse


def check(b: MlaBatch, out, lse, causal: bool, dtype: torch.dtype) -> None:
    ref_out = torch.empty_like(out)
    ref_lse = torch.empty(out.shape[:2], device=out.device)
    reference.mla_decode(*b.args(), ref_out, ref_lse, scale=b.scale, causal=causal, kv_scale=b.kv_scale)
    t_out, t_lse = truth64(b, causal)
    assert_close(out, t_out, dtype=dtype, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, t_lse, dtype=dtype, reference=ref_lse, name="lse")


def check_case(case: Case, device: str) -> None:
    b = make_batch(case, device, zlib.crc32(case.id.encode()))
    hint = max(case.q_lens) if case.hint else -1
    out, lse = run_triton(b, causal=case.causal, with_lse=case.with_lse, strided_out=case.strided,
                          max_query_len=hint, split_tokens=case.split_tokens)
    check(b, out, lse, case.causal, case.dtype)


# -- interpreter tier: tiny shapes, every feature at least once ------------------------------
SMALL = [
    # decode, kv_len in {0, 1, BS-1, BS, BS+1}, padding rows
    Case((1, 1, 1, 1, 1, 1), (15, 16, 17, 1, 0, 70), pad_tokens=2),
    Case((1, 1, 1), (150, 70, 200), split_tokens=64, hint=True),
    # speculative tokens: causal, bottom-right; a block of several tokens per program
    Case((2, 3, 1), (129, 65, 3), num_heads=8, hint=True),
    Case((4, 2), (100, 2), num_heads=4, latent=64, split_tokens=64),
    Case((3, 2), (40, 70), causal=False, dtype=FP32),
    Case((1, 1), (100, 41), block_size=8, dtype=FP16, with_lse=False),
    Case((2, 1), (100, 50), block_size=24, num_heads=5, split_tokens=64),
    Case((1, 1, 1), (130, 64, 90), block_size=32, num_heads=16, latent=64),
    Case((1, 2), (90, 33), num_heads=70, block_size=16, dtype=FP16),  # two head groups of 35
    Case((2, 1), (70, 33), latent=48, num_heads=3, split_tokens=64),  # latent halves of 32 + 16 columns
    Case((1, 2, 1), (150, 9, 200), cache_dtype=E4M3, split_tokens=64),
    Case((2, 1), (70, 130), cache_dtype=E5M2, dtype=FP16),
    Case((2, 1, 1), (70, 130, 33), strided=True, split_tokens=64, pad_tokens=1),
    Case((1, 1), (70, 40), num_heads=16, latent=512, rope=64, block_size=64),  # DeepSeek's row, once
]


@interpreter_tier
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_mla_interpreted(case: Case) -> None:
    check_case(case, "cpu")


@interpreter_tier
@pytest.mark.parametrize("scores", ["rows", "keys", "split"])
def test_score_forms_interpreted(scores: str, monkeypatch) -> None:
    """Every form of the score dots (SCORES: rows x keys chained, keys x rows transposed, three
    dots summed), whatever the tile table holds: speculative blocks (causal), non-causal, padding
    rows, an empty sequence, splits, an fp8 cache."""
    for table in (tmla._CONFIGS, tmla._FP8_CONFIGS):
        for block_m, config in list(table.items()):
            monkeypatch.setitem(table, block_m, (*config[:4], scores, *config[5:]))
    launched = []
    launcher = tmla.launcher

    def recording(kernel, grid, **constants):
        if kernel is tmla._mla_kernel:
            launched.append(constants["SCORES"])
        return launcher(kernel, grid, **constants)

    monkeypatch.setattr(tmla, "launcher", recording)
    for case in (Case((2, 3, 1), (129, 65, 3), num_heads=8, hint=True),
                 Case((3, 2), (40, 70), causal=False, num_heads=16, latent=64),
                 Case((1, 1, 1), (70, 0, 33), num_heads=4, pad_tokens=2),
                 Case((2, 2, 1), (150, 9, 200), cache_dtype=E4M3, num_heads=16, split_tokens=64, hint=True)):
        check_case(case, "cpu")
    # non-causal calls run chained scores where the table says "split" (no mask branch parts them)
    assert scores in launched and set(launched) <= {scores, "rows"}
    assert (launched.count("rows") == 1) == (scores == "split")


@interpreter_tier
@pytest.mark.parametrize("tile_n", [16, 32])
def test_page_tiles_interpreted(tile_n: int, monkeypatch) -> None:
    """Tiles inside one page (TILE_N divides the block size: one block id and one base address a
    tile, PAGE_TILE): kv_len at and around the page size, padding rows, an empty sequence,
    speculative and non-causal rows, splits, an fp8 cache, a strided cache, and ids outside
    [0, NB) in the used part of the table."""
    for table in (tmla._CONFIGS, tmla._FP8_CONFIGS):
        for block_m, config in list(table.items()):
            monkeypatch.setitem(table, block_m, (tile_n, *config[1:]))
    launched = []
    launcher = tmla.launcher

    def recording(kernel, grid, **constants):
        if kernel is tmla._mla_kernel:
            launched.append((constants["BLOCK_SIZE"], constants["TILE_N"]))
        return launcher(kernel, grid, **constants)

    monkeypatch.setattr(tmla, "launcher", recording)
    for case in (Case((1, 1, 1, 1, 1, 1), (31, 32, 33, 1, 0, 70), block_size=32, pad_tokens=2),
                 Case((2, 3, 1), (129, 65, 3), num_heads=8, block_size=32, hint=True),
                 Case((3, 2), (40, 70), causal=False, num_heads=16, latent=64, block_size=32),
                 Case((1, 2, 1), (150, 9, 200), cache_dtype=E4M3, block_size=64, split_tokens=64),
                 Case((2, 1, 1), (70, 130, 33), strided=True, block_size=32, split_tokens=64, pad_tokens=1)):
        check_case(case, "cpu")
    check_bad_block_ids("cpu", Case((1, 2, 1), (100, 50, 64), block_size=32))
    assert launched and all(bs % tn == 0 for bs, tn in launched), launched


def _grid_orders(monkeypatch, case: Case, device: str = "cpu", max_grid_y: int | None = None) -> list[tuple]:
    """``case`` run with every tile's GRID "queries" and then "heads" (``mla._CONFIGS``): the
    launched ``(grid, HEAD_GROUP_FASTEST)`` of each; the two give the same bits and match the loop."""
    if max_grid_y is not None:
        monkeypatch.setattr(tmla, "_MAX_GRID_Y", max_grid_y)
    launched = []

    def recording(kernel, grid, **constants):
        if kernel is tmla._mla_kernel:
            launched.append((grid, constants["HEAD_GROUP_FASTEST"]))
        return _launch.launcher(kernel, grid, **constants)

    monkeypatch.setattr(tmla, "launcher", recording)
    b = make_batch(case, device, zlib.crc32(case.id.encode()))
    hint = max(case.q_lens) if case.hint else -1
    results = []
    for order in ("queries", "heads"):
        for table in (tmla._CONFIGS, tmla._FP8_CONFIGS):
            for block_m, config in list(table.items()):
                monkeypatch.setitem(table, block_m, (*config[:5], order))
        results.append(run_triton(b, causal=case.causal, max_query_len=hint, split_tokens=case.split_tokens))
    (out_q, lse_q), (out_h, lse_h) = results
    assert torch.equal(out_q, out_h) and torch.equal(lse_q, lse_h)
    check(b, out_h, lse_h, case.causal, case.dtype)
    return launched


@interpreter_tier
def test_grid_orders_interpreted(monkeypatch) -> None:
    """The head group on grid axis 0 (GRID "heads") gives the bits of the query block there, with
    two head groups (70 heads of 35): decode, split-KV through the workspace, speculative
    (causal) tokens with padding rows; each launch's grid is the planned order's."""
    for case in (Case((1, 1, 1), (90, 17, 0), num_heads=70),
                 Case((1, 1), (150, 200), num_heads=70, split_tokens=64),
                 Case((2, 3, 1), (129, 65, 3), num_heads=70, hint=True, pad_tokens=2)):
        q_blocks = sum(case.q_lens) + case.pad_tokens + len(case.q_lens) + 1  # one token a block at 35 heads
        splits = 1 if case.split_tokens is None else -(-max(case.kv_lens) // case.split_tokens)
        assert _grid_orders(monkeypatch, case) == [((q_blocks, 2, splits), False), ((2, q_blocks, splits), True)]


@interpreter_tier
def test_grid_order_axis_limit_interpreted(monkeypatch) -> None:
    """GRID "heads" puts the query blocks on grid axis 1: at most _MAX_GRID_Y of them, else the
    planner keeps them on axis 0 (B2 decode: 2 + 2 + 1 query blocks)."""
    case = Case((1, 1), (70, 33), num_heads=70)
    assert _grid_orders(monkeypatch, case, "cpu", max_grid_y=5) == [((5, 2, 1), False), ((2, 5, 1), True)]
    assert _grid_orders(monkeypatch, case, "cpu", max_grid_y=4) == [((5, 2, 1), False), ((5, 2, 1), False)]


def test_grid_order_axis_limit_planned(monkeypatch) -> None:
    """CUDA's 65535 on grid axis 1, planned on meta tensors: one sequence of T decode tokens has
    T + 2 query blocks, so T = 65533 keeps GRID "heads" and T = 65534 falls back to "queries"."""
    for table in (tmla._CONFIGS, tmla._FP8_CONFIGS):
        for block_m, config in list(table.items()):
            monkeypatch.setitem(table, block_m, (*config[:5], "heads"))
    launched = []
    monkeypatch.setattr(tmla, "launcher", lambda kernel, grid, **constants: (
        lambda like, **tensors: launched.append((grid, constants["HEAD_GROUP_FASTEST"]))
        if kernel is tmla._mla_kernel else None))
    meta = dict(device="meta")
    for t in (65533, 65534):
        tmla.mla_decode(
            torch.empty(t, 70, 32, dtype=BF16, **meta), torch.empty(t, 70, 16, dtype=BF16, **meta),
            torch.empty(4, 16, 48, dtype=BF16, **meta), torch.empty(1, 4, dtype=torch.int32, **meta),
            torch.empty(1, dtype=torch.int32, **meta), torch.empty(2, dtype=torch.int32, **meta),
            torch.empty(t, 70, 32, dtype=BF16, **meta), torch.empty(t, 70, **meta),
            scale=0.1, causal=True, kv_scale=None, max_query_len=1,
        )
    assert launched == [((2, 65535, 1), True), ((65536, 2, 1), False)]


def check_bad_block_ids(device: str, case: Case) -> None:
    """Ids outside [0, NB) in the used part of the table: those keys are not visible, never read."""
    b = make_batch(case, device, seed=11)
    nb, bs = b.kv_cache.shape[:2]
    bad = (-1, nb, -(2**31), 2**31 - 1)
    for i, n in enumerate(case.kv_lens):
        b.block_table[i, (5 * i) % -(-n // bs)] = bad[i % len(bad)]
    for split in (None, 64):
        out, lse = run_triton(b, split_tokens=split)
        assert torch.isfinite(out).all() and not torch.isnan(lse).any()
        check(b, out, lse, True, case.dtype)


@interpreter_tier
def test_bad_block_ids_interpreted() -> None:
    check_bad_block_ids("cpu", Case((1, 2, 1), (100, 50, 64), block_size=8))


def check_merge_paths_bitwise(device: str, case: Case, monkeypatch) -> None:
    """Splits through the workspace and the combine kernel, and the same splits merged inside
    each program: the same bits."""
    b = make_batch(case, device, seed=21)
    out_a, lse_a = run_triton(b, split_tokens=case.split_tokens)
    monkeypatch.setattr(tpa, "_WORKSPACE_BYTES", 0)
    out_b, lse_b = run_triton(b, split_tokens=case.split_tokens)
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
    check(b, out_b, lse_b, True, case.dtype)


@interpreter_tier
def test_merge_paths_bitwise_interpreted(monkeypatch) -> None:
    check_merge_paths_bitwise("cpu", Case((1, 2, 1), (300, 200, 5), split_tokens=64, dtype=FP16), monkeypatch)


def check_combine_blockings(device: str, case: Case, monkeypatch, settings: list[dict]) -> list[tuple]:
    """Split-KV ``case`` with the combine kernel planned under each of ``settings``
    (``test_triton_paged_attention.combine_settings``): the same bits, matching the float64 loop
    of ``tests/_loop.py`` on the CPU (``truth64`` on a GPU). Returns each run's combine launch
    (``recorded_combines``)."""
    launched = recorded_combines(monkeypatch, tmla)
    b = make_batch(case, device, zlib.crc32(case.id.encode()))
    results = []
    for setting in settings:
        for name, value in setting.items():
            monkeypatch.setattr(tpa, name, value)
        results.append(run_triton(b, causal=case.causal, split_tokens=case.split_tokens))
    assert len(launched) == len(settings), "a call did not run the combine kernel"
    out, lse = results[0]
    for other_out, other_lse in results[1:]:
        assert torch.equal(other_out, out) and torch.equal(other_lse, lse)
    if device == "cpu":
        truth_out, truth_lse = loop.mla_decode(*b.args(), scale=b.scale, causal=case.causal, kv_scale=b.kv_scale)
        ref_out, ref_lse = torch.empty_like(out), torch.empty_like(lse)
        reference.mla_decode(*b.args(), ref_out, ref_lse, scale=b.scale, causal=case.causal, kv_scale=b.kv_scale)
        assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="out")
        assert_close(lse, truth_lse, dtype=case.dtype, reference=ref_lse, name="lse")
    else:
        check(b, out, lse, case.causal, case.dtype)
    return launched


@interpreter_tier
def test_combine_blockings_bitwise_interpreted(monkeypatch) -> None:
    """The combine kernel at the blocking of large batches (4 partials an iteration), with whole
    rows that cover half the programs asked for but not all (6 for 4 rows: 8 partials an
    iteration, ``_COMBINE_ROW_LOAD_SPLITS`` clamped to the splits), with one head and whole rows a
    program (8 partials an iteration), and with one head and 32 latent columns a program (latent
    48 padded to 64: the second column block is half padding) loading 8 partials an iteration
    (one iteration) and 4 (two): the same bits. An fp8 cache (the combine applies its scale), 5, 2
    and 1 splits, a padding row."""
    case = Case((1, 1, 1), (300, 70, 1), num_heads=3, latent=48, split_tokens=64, cache_dtype=E4M3, pad_tokens=1)
    launched = check_combine_blockings("cpu", case, monkeypatch, combine_settings(1, 6, 9, 10**9, few_load_splits=4))
    assert launched == [((4, 1, 1), 4, 64, 4, 2), ((4, 1, 1), 4, 64, 8, 2), ((4, 3, 1), 1, 64, 8, 2),
                        ((4, 3, 2), 1, 32, 8, 1), ((4, 3, 2), 1, 32, 4, 1)]


@gpu_tier
def test_combine_blockings_bitwise_b1_cuda(monkeypatch) -> None:
    """B1 x 32768 with DeepSeek's 128 heads (latent 512, the planner's own splits, as the
    benchmark's B1_ctx32768_H128): the combine blocking of large batches (one head a program, 4
    partials an iteration), the device's own plan (one head a program too: 128 programs cover
    half of 132 SMs; 16 partials an iteration where they do not cover them all) and a finer one
    (at least 264 programs: half rows) give the same bits and match the truth; bf16 and fp8
    caches."""
    for cache_dtype in (None, E4M3):
        case = replace(_BASE, q_lens=(1,), kv_lens=(32768,), num_heads=128, block_size=64, cache_dtype=cache_dtype)
        launched = check_combine_blockings("cuda", case, monkeypatch, combine_settings(1, None, 264))
        (grid, _, _, rows_load, _), (own_grid, _, _, own_load, _), (fine_grid, *_, load_splits, _) = launched
        assert grid == own_grid == (1, 128, 1) and rows_load == 4
        assert own_load == (tpa._COMBINE_ROW_LOAD_SPLITS if tpa._num_sms(torch.device("cuda")) > 128 else 4)
        assert fine_grid[0] * fine_grid[1] * fine_grid[2] >= 264
        assert load_splits == tpa._COMBINE_FEW_LOAD_SPLITS


@interpreter_tier
@pytest.mark.parametrize("num_heads, levels", [(8, ((1, 4), (20, 2), (40, 1))), (6, ((1, 4), (15, 2), (40, 1)))])
def test_narrow_combine_heads_bitwise_interpreted(monkeypatch, num_heads: int, levels: tuple) -> None:
    """The combine after the narrow Gluon kernels' splits (``mla._combine`` with ``all_splits`` and
    ``tile=mla._COMBINE_TILE``; their bf16 partials of latent 512, filled here): up to four heads a
    program where that leaves as many programs as asked for (``_COMBINE_MIN_PROGRAMS``), two, or
    one where fewer would not (``levels``: programs asked for, heads a program), and one head a
    program without the tile (the wide kernel's combine); at 6 heads the last program of a token
    has heads past the last. The same bits every way, matching the float64 merge of the partials;
    an empty split (LSE -inf), one whose LSE is far below the others, and a padding row past
    ``query_start_loc`` (its splits empty, as the narrow kernels write them: 0 and -inf)."""
    num_tokens, num_splits, latent = 5, 3, 512
    gen = torch.Generator().manual_seed(31)
    workspace = tpa._Workspace(True, num_tokens, num_splits, num_heads, latent, torch.device("cpu"), BF16)
    part_out = torch.randn(num_tokens, num_splits, num_heads, latent, generator=gen).to(BF16)
    part_lse = (torch.randn(num_tokens, num_splits, num_heads, generator=gen) * 4).float()  # log2
    part_lse[1, 2, 3] = float("-inf")
    part_lse[2, 0, :] = -200.0
    part_out[4], part_lse[4] = 0.0, float("-inf")  # a padding row's splits, as the narrow kernels write them
    seq_lens = torch.tensor([300, 250], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 2, 4], dtype=torch.int32)  # token 4: padding
    q_latent = torch.empty(num_tokens, num_heads, latent, dtype=BF16)
    launched = recorded_combines(monkeypatch, tmla)
    results = []
    for want, tile in (*((want, tmla._COMBINE_TILE) for want, _ in levels), (1, 0)):
        monkeypatch.setattr(tpa, "_COMBINE_MIN_PROGRAMS", want)
        out = torch.full((num_tokens, num_heads, latent), float("nan"), dtype=BF16)
        lse = torch.full((num_tokens, num_heads), float("nan"))
        combine = tmla._combine(workspace, 128, num_splits, num_tokens, 2, num_heads, latent, False, seq_lens,
                                query_start_loc, out, lse, pdl=False, all_splits=True, tile=tile)
        combine(q_latent, part_out, part_lse, seq_lens, query_start_loc, out, lse)
        results.append((out, lse))
    assert [(grid, block_h) for grid, block_h, *_ in launched] == [
        ((num_tokens, -(-num_heads // block_h), 1), block_h) for block_h in (*(b for _, b in levels), 1)]
    out, lse = results[0]
    for other_out, other_lse in results[1:]:
        assert torch.equal(other_out, out) and torch.equal(other_lse, lse)
    truth_out, truth_lse = loop.merge_attn_states_n(part_out[:4].transpose(0, 1),
                                                    part_lse[:4].transpose(0, 1) * math.log(2))
    assert_close(out[:4], truth_out, dtype=BF16, name="out")
    assert_close(lse[:4], truth_lse, dtype=BF16, name="lse")
    assert torch.equal(out[4], torch.zeros_like(out[4])) and bool((lse[4] == float("-inf")).all())


@interpreter_tier
def test_strided_cache_bitwise_interpreted() -> None:
    """A cache that is one layer of a cross-layer buffer gives the bits of the contiguous one."""
    case = Case((2, 1), (70, 100), split_tokens=64)
    b = make_batch(case, "cpu", seed=5)
    out, lse = run_triton(b, split_tokens=64)
    wide = torch.full((b.kv_cache.shape[0], 2, *b.kv_cache.shape[1:]), float("nan"), dtype=b.kv_cache.dtype)
    wide[:, 0] = b.kv_cache
    b.kv_cache = wide[:, 0]
    out_s, lse_s = run_triton(b, split_tokens=64)
    assert torch.equal(out, out_s) and torch.equal(lse, lse_s)


def check_batch_invariance(device: str, case: Case, at: int, split: int | None) -> None:
    """In batch-invariant mode decode sequence ``at`` of ``case`` gives the bits it gives alone."""
    b = make_batch(case, device, seed=13)
    with _config.batch_invariant():
        out, lse = run_triton(b, split_tokens=split)
        one = torch.tensor([0, 1], dtype=torch.int32, device=device)  # one decode token per sequence
        alone = MlaBatch(b.q_latent[at : at + 1], b.q_rope[at : at + 1], b.kv_cache, b.block_table[at : at + 1],
                         b.seq_lens[at : at + 1], one, b.kv_scale, b.scale)
        out_a, lse_a = run_triton(alone, split_tokens=split)
    assert torch.equal(out[at], out_a[0]) and torch.equal(lse[at], lse_a[0])


@interpreter_tier
def test_batch_invariant_interpreted() -> None:
    check_batch_invariance("cpu", Case((1, 1, 1), (90, 300, 17)), at=1, split=128)


def check_fp8_query_magnitudes(device: str, case: Case) -> None:
    """bf16 queries far outside fp16's range (2^30) and near its floor (2^-30) over an fp8 cache,
    the softmax scale compensating: the kernel's power-of-two rescaling for its fp16 dots keeps
    the reference's answer."""
    for cache_dtype in (E4M3, E5M2):
        b = make_batch(replace(case, cache_dtype=cache_dtype), device, seed=17)
        q_lat, q_rope, scale = b.q_latent, b.q_rope, b.scale
        for factor in (2.0**30, 2.0**-30):
            b.q_latent, b.q_rope, b.scale = q_lat * factor, q_rope * factor, scale / factor
            for split in (None, 64):
                out, lse = run_triton(b, split_tokens=split)
                check(b, out, lse, True, BF16)


@interpreter_tier
def test_fp8_query_magnitudes_interpreted() -> None:
    check_fp8_query_magnitudes("cpu", Case((1, 2, 1), (70, 40, 130)))


@interpreter_tier
def test_public_op_selects_reference_off_cuda() -> None:
    """On CPU the op runs the reference (the kernel runs only on CUDA tensors)."""
    b = make_batch(Case((1,), (20,), dtype=FP32), "cpu", seed=1)
    out, lse = torch_paged_attn.mla_decode(*b.args(), scale=b.scale)
    check(b, out, lse, True, FP32)


# -- GPU tier ----------------------------------------------------------------------------------
_DECODE = dict(q_lens=(1, 1, 1, 1, 1), kv_lens=(1023, 1, 16, 700, 2100))
_MTP = dict(q_lens=(2, 2, 1, 3, 2), kv_lens=(1023, 2, 17, 700, 2100))
_BASE = Case(**_DECODE, num_heads=16, latent=512, rope=64)


def _grid() -> list[Case]:
    cases = []
    for shape in (_DECODE, _MTP):
        for h in (8, 16, 32, 64, 128):
            cases.append(replace(_BASE, **shape, num_heads=h))
        for bs in (16, 32, 64, 24):
            cases.append(replace(_BASE, **shape, block_size=bs))
        for dtype, cache in ((BF16, E4M3), (FP16, E4M3), (BF16, E5M2)):
            cases.append(replace(_BASE, **shape, dtype=dtype, cache_dtype=cache))
        cases += [
            replace(_BASE, **shape, dtype=FP16),
            replace(_BASE, **shape, split_tokens=256),
            replace(_BASE, **shape, num_heads=128, split_tokens=512, cache_dtype=E4M3),
            replace(_BASE, **shape, strided=True, pad_tokens=3),
            replace(_BASE, **shape, with_lse=False, hint=True),
            replace(_BASE, **shape, causal=False),
        ]
    for latent, rope in ((256, 32), (128, 64), (96, 16)):
        cases.append(replace(_BASE, latent=latent, rope=rope))
    return cases


@gpu_tier
@pytest.mark.parametrize("case", _grid(), ids=lambda c: c.id)
def test_mla_cuda(case: Case) -> None:
    check_case(case, "cuda")


@gpu_tier
def test_grid_orders_cuda(monkeypatch) -> None:
    """GRID "heads" and "queries" give the same bits with DeepSeek's 128 heads (two head groups):
    decode, speculative tokens, forced splits, an fp8 cache (the Triton kernel: Gluon off)."""
    monkeypatch.setattr(tmla, "SM90_GLUON", False)
    for case in (replace(_BASE, num_heads=128), replace(_BASE, **_MTP, num_heads=128, hint=True),
                 replace(_BASE, num_heads=128, split_tokens=512, cache_dtype=E4M3)):
        (grid_q, fast_q), (grid_h, fast_h) = _grid_orders(monkeypatch, case, "cuda")
        assert (fast_q, fast_h) == (False, True) and grid_h == (grid_q[1], grid_q[0], grid_q[2]) and grid_h[0] == 2


@gpu_tier
def test_batch_invariant_cuda() -> None:
    check_batch_invariance("cuda", replace(_BASE, q_lens=(1,) * 40, kv_lens=tuple(range(100, 4100, 100))), 30, None)


@gpu_tier
def test_bad_block_ids_cuda() -> None:
    check_bad_block_ids("cuda", replace(_BASE, q_lens=(1, 2, 1), kv_lens=(1000, 500, 64)))


@gpu_tier
def test_merge_paths_bitwise_cuda(monkeypatch) -> None:
    """The Triton kernel's two merge paths (the Gluon kernels have only the combine kernel's)."""
    monkeypatch.setattr(tmla, "SM90_GLUON", False)
    check_merge_paths_bitwise("cuda", replace(_BASE, **_MTP, split_tokens=512), monkeypatch)


def check_graph_replays(base: Case, ran=None) -> MlaBatch:
    """Capture one call of 4 decode tokens over ``base``'s cache kind (after an eager call, which
    ``ran()`` may check, and one more under sync-debug "error"), rewrite lengths, table, queries
    and cache in place (the cache poisoned with NaN first), replay: each replay equals the truth of
    the new contents. Returns the static batch, holding the last contents."""
    static = make_batch(replace(base, q_lens=(1,) * 4, kv_lens=(1300,) * 4), "cuda", 0)
    out = torch.full((4, base.num_heads, base.latent), float("nan"), dtype=base.dtype, device="cuda")
    lse = torch.full((4, base.num_heads), float("nan"), device="cuda")

    def call():
        tmla.mla_decode(*static.args(), out, lse, scale=static.scale, causal=True, kv_scale=static.kv_scale)

    call()  # compile outside the capture
    if ran is not None:
        ran()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed, kv_lens in ((1, (30, 1270, 0, 5)), (2, (1, 2, 3, 1100))):
        new = make_batch(replace(base, q_lens=(1,) * 4, kv_lens=kv_lens), "cuda", seed)
        static.block_table.fill_(-1)
        static.block_table[:, : new.block_table.shape[1]].copy_(new.block_table[:, : static.block_table.shape[1]])
        static.seq_lens.copy_(new.seq_lens)
        static.q_latent.copy_(new.q_latent)
        static.q_rope.copy_(new.q_rope)
        if base.cache_dtype in FP8_DTYPES:
            static.kv_cache.view(torch.uint8).fill_(0x7F)
            static.kv_scale.copy_(new.kv_scale)
        else:
            static.kv_cache.fill_(float("nan"))
        n = min(new.kv_cache.shape[0], static.kv_cache.shape[0])
        static.kv_cache[:n].copy_(new.kv_cache[:n])
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        check(static, out, lse, True, base.dtype)
    return static


@gpu_tier
def test_cuda_graph_replay_and_no_host_sync() -> None:
    """``check_graph_replays`` on an fp8 cache (16 heads: the narrow Gluon kernel on sm_90)."""
    check_graph_replays(replace(_BASE, cache_dtype=E4M3))


@gpu_tier
def test_public_op_cuda_and_compiled() -> None:
    """The public op runs a kernel of the Triton backend on CUDA (on sm_90 a Gluon one: at 16
    heads with speculative tokens the narrow kernel or, on this case's pages of 16 keys,
    mla_sm90_pair), eagerly and under torch.compile(fullgraph=True)."""
    b = make_batch(replace(_BASE, **_MTP), "cuda", seed=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch_paged_attn.mla_decode(*b.args(), scale=b.scale)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any(k in n for n in names for k in ("_mla_kernel", "_mla_narrow_kernel", "_mla_pair_kernel")), names

    def fn(*args):
        return torch_paged_attn.mla_decode(*args, scale=b.scale)

    for f in (fn, torch.compile(fn, fullgraph=True)):
        out, lse = f(*b.args())
        check(b, out, lse, True, BF16)


@gpu_tier
def test_fp8_query_magnitudes_cuda() -> None:
    check_fp8_query_magnitudes("cuda", replace(_BASE, q_lens=(1, 2, 1), kv_lens=(700, 40, 1300)))


# -- edges: strided caches per tier, NaN given as data -------------------------------------------


def check_strided_bitwise(device: str, case: Case) -> None:
    """The cache as one layer of a cross-layer buffer gives the contiguous cache's bits, with and
    without split-KV."""
    b = make_batch(case, device, seed=5)
    for split in (None, 64):
        out, lse = run_triton(b, split_tokens=split)
        cache = b.kv_cache
        wide = torch.full((cache.shape[0], 3, *cache.shape[1:]), float("nan"), dtype=cache.dtype, device=device)
        wide[:, 1] = cache
        b.kv_cache = wide[:, 1]
        out_s, lse_s = run_triton(b, split_tokens=split)
        b.kv_cache = cache
        assert torch.equal(out, out_s) and torch.equal(lse, lse_s), split


def check_nan_kv_scale(device: str, case: Case) -> None:
    """A NaN kv_scale: NaN out and lse for every row that sees a key, 0 and -inf for the others,
    with and without split-KV, as the reference has it."""
    b = make_batch(case, device, seed=23)
    b.kv_scale = torch.full((1,), float("nan"), device=device)
    ref_out = torch.empty(b.q_latent.shape, dtype=b.q_latent.dtype, device=device)
    ref_lse = torch.empty(b.q_latent.shape[:2], device=device)
    reference.mla_decode(*b.args(), ref_out, ref_lse, scale=b.scale, causal=True, kv_scale=b.kv_scale)
    sees = ref_lse.isnan().all(-1)
    assert sees.any() and not sees.all() and torch.equal(ref_out.isnan().all(-1), ref_lse.isnan())
    for split in (None, 64):
        out, lse = run_triton(b, split_tokens=split)
        assert torch.equal(out.isnan(), ref_out.isnan()) and torch.equal(lse.isnan(), ref_lse.isnan()), split
        assert torch.equal(out[~sees], torch.zeros_like(out[~sees])) and (lse[~sees] == float("-inf")).all()


@interpreter_tier
def test_strided_cache_bitwise_one_block_interpreted() -> None:
    check_strided_bitwise("cpu", Case((2, 1, 1), (10, 16, 3), dtype=FP16))  # one block a table row


@interpreter_tier
def test_nan_kv_scale_interpreted() -> None:
    check_nan_kv_scale("cpu", Case((1, 2, 1, 1), (70, 9, 0, 1), cache_dtype=E4M3, pad_tokens=1))


@gpu_tier
def test_strided_cache_bitwise_cuda() -> None:
    """On every kernel the planner picks here (the narrow Gluon kernel for 16 heads, the wide one
    for 128 on sm_90; the Triton kernel for the short tables and elsewhere)."""
    check_strided_bitwise("cuda", replace(_BASE, **_MTP))
    check_strided_bitwise("cuda", replace(_BASE, q_lens=(1, 1, 2), kv_lens=(10, 64, 33), block_size=64))
    check_strided_bitwise("cuda", replace(_BASE, num_heads=128, block_size=16))
    check_strided_bitwise("cuda", replace(_BASE, cache_dtype=E4M3))


@gpu_tier
def test_nan_kv_scale_cuda() -> None:
    check_nan_kv_scale("cuda", replace(_BASE, q_lens=(1, 2, 1, 1), kv_lens=(1000, 9, 0, 1), cache_dtype=E4M3,
                                       pad_tokens=2))


# -- GPU tier: the Gluon sm_90 kernel (mla_sm90) on every call it takes ------------------------------

@pytest.fixture
def gluon_mla(monkeypatch):
    """``mla.SM90_GLUON`` on, plans dropped; the plans the Gluon kernel made are recorded (their
    ``split_tokens``, and whether they split: ``workspace``)."""
    from torch_paged_attn import lowering
    from torch_paged_attn.lowering.triton import mla_sm90

    if not _CUDA or mla_sm90._sm90.unavailable(torch.empty(0, device="cuda")):
        pytest.skip("the Gluon MLA kernel runs on sm_90 with a tested Triton's Gluon only")
    monkeypatch.setattr(tmla, "SM90_GLUON", True)
    monkeypatch.setattr(tmla, "_GLUON_MIN_KEYS", 0)
    monkeypatch.setattr(lowering, "_CHOICES", {})
    launched = []
    real = mla_sm90.prepare
    monkeypatch.setattr(mla_sm90, "prepare", lambda **k: launched.append(k) or real(**k))
    return launched


def one_sm(monkeypatch) -> None:
    """Split planning sees one SM: no call splits its keys unless told to."""
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 1)


def test_gluon_kernels_run_on_tested_tritons_only(monkeypatch) -> None:
    """The Gluon sm_90 kernels decline every call on a Triton they were not run and tested with
    (Gluon's API moves between releases), naming both versions, and the MLA lowering then plans
    its Triton kernel; on a tested Triton the device decides."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90

    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")
    ql, qr = torch.empty(1, 128, 512, dtype=BF16), torch.empty(1, 128, 64, dtype=BF16)
    monkeypatch.setattr(_sm90, "TESTED_TRITON", frozenset({(3, 6)}))
    monkeypatch.setattr(_sm90, "TRITON_VERSION", (3, 9))
    reason = _sm90.unavailable(ql)
    assert reason is not None and "3.6" in reason and triton.__version__ in reason, reason
    assert mla_sm90.declines(ql, qr, torch.empty(8, 64, 576, dtype=BF16)) == reason
    monkeypatch.setattr(_sm90, "TRITON_VERSION", (3, 6))
    assert _sm90.unavailable(ql) == "not an sm_90 device"


def _wide_planner(monkeypatch):
    """``plan(tokens, heads, keys, block_size=64, **options)``: the keyword arguments
    ``mla.prepare_mla_decode`` gives ``mla_sm90.prepare`` for one token a sequence (None: another
    kernel), on any machine, with the wide Gluon kernel taking every call and 132 SMs."""
    from torch_paged_attn.lowering.triton import mla_sm90

    plans = []
    monkeypatch.setattr(tmla, "SM90_GLUON", True)
    monkeypatch.setattr(mla_sm90, "declines", lambda *a: None)
    monkeypatch.setattr(mla_sm90, "prepare", lambda **k: plans.append(k) or "gluon")
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)

    def plan(tokens: int, heads: int, keys: int, block_size: int = 64, **options):
        ql, qr = torch.empty(tokens, heads, 512, dtype=BF16), torch.empty(tokens, heads, 64, dtype=BF16)
        cache = torch.empty(4, block_size, 576, dtype=BF16)
        table = torch.zeros(tokens, -(-keys // block_size), dtype=torch.int32)
        lens, qsl = torch.full((tokens,), keys, dtype=torch.int32), torch.arange(tokens + 1, dtype=torch.int32)
        plans.clear()
        tmla.prepare_mla_decode(ql, qr, cache, table, lens, qsl, torch.empty_like(ql), torch.empty(tokens, heads),
                                scale=0.1, causal=True, kv_scale=None, **options)
        return plans[-1] if plans else None

    return plan


def test_gluon_mla_planning(monkeypatch) -> None:
    """Which calls the Gluon kernel is planned for and how they split (no launch; any machine):
    a batch that fills 132 SMs unsplit, one token split into at most 132 programs of whole pairs
    of 64-key tiles (the kernel's unit) with a workspace and a combine, forced splits rounded up to
    a pair, and the Triton kernel for tables under ``_GLUON_MIN_KEYS`` keys, in batch-invariant
    mode and where the workspace would pass its cap."""
    from torch_paged_attn.lowering.triton import mla_sm90

    plan = _wide_planner(monkeypatch)
    assert mla_sm90.SPLIT_KEYS == 2 * mla_sm90.TILE_N == 128
    unsplit = plan(64, 128, 4096)  # 128 programs
    assert unsplit is not None and unsplit["split_tokens"] == tpa._NO_SPLIT and "workspace" not in unsplit
    for tokens, heads, keys in ((1, 128, 32768), (1, 64, 512), (8, 128, 8192), (33, 64, 4096)):
        p = plan(tokens, heads, keys)
        assert p is not None and p["workspace"] is not None and p["combine"] is not None, (tokens, heads, keys)
        splits = -(-keys // p["split_tokens"])
        assert p["split_tokens"] % mla_sm90.SPLIT_KEYS == 0 and p["split_tokens"] >= 2 * mla_sm90.SPLIT_KEYS
        assert 1 < splits and tokens * (heads // 64) * splits <= 132, (tokens, heads, keys, p["split_tokens"])
    assert plan(8, 128, 4096, split_tokens=100)["split_tokens"] == 128
    assert plan(8, 128, 4096, split_tokens=64)["split_tokens"] == 128  # a split's tiles are whole pairs
    assert plan(8, 128, 4096, split_tokens=129)["split_tokens"] == 256
    assert plan(8, 128, 4096, split_tokens=4096)["split_tokens"] == tpa._NO_SPLIT  # one split: none
    # the floor is on the table's capacity (its blocks times the block size), a shape
    low = tmla._GLUON_MIN_KEYS
    assert plan(64, 128, low) is not None and plan(64, 128, low - 63) is not None
    assert plan(64, 128, low - 64) is None and plan(64, 128, low - 8, block_size=8) is None
    with _config.batch_invariant(True):
        assert plan(1, 128, 32768) is None
    # over the workspace cap: 32 splits of 64 tokens x 128 heads (538 MB of partials), 16,384 of
    # one token (4.3 GB)
    assert plan(64, 128, 4096, split_tokens=128) is None and plan(1, 128, 2**20, split_tokens=64) is None


def test_sm90_cache_views() -> None:
    """The Gluon kernels' ``[rows, W]`` view of a paged cache (no launch; any machine): a
    contiguous cache is ``NB * BS`` rows, a block every ``BS``; a layer of a cross-layer buffer
    ``[NB, 3, BS, W]`` a block every ``3 * BS`` rows, up to the last block's last slot; for
    attention caches K or V unbound from ``[NB, 2, ...]`` and the HND view too; taken by the
    kernels that address such views (``strided``), and never a cache without one or whose start
    is not 16-byte aligned."""
    from torch_paged_attn.lowering.triton import _sm90

    cache = torch.empty(5, 16, 576, dtype=BF16)
    assert (_sm90.block_rows(cache), _sm90.view_rows(cache)) == (16, 80)
    layer = torch.empty(5, 3, 16, 576, dtype=BF16)[:, 1]
    assert (_sm90.block_rows(layer), _sm90.view_rows(layer)) == (48, 4 * 48 + 16)
    assert _sm90.cache_declines((cache,)) is None and _sm90.cache_declines((cache,), strided=True) is None
    assert _sm90.cache_declines((layer,)) is not None and _sm90.cache_declines((layer,), strided=True) is None
    odd = torch.empty(5 * 16 * 576 + 1, dtype=BF16)[1:].view(5, 16, 576)  # starts 2 bytes in
    assert _sm90.cache_declines((odd,), strided=True) is not None
    # attention caches [NB, BS, Hkv, D]: heads side by side in a row, or (HND) a run of rows each
    nhd = torch.empty(5, 16, 4, 128, dtype=BF16)
    assert _sm90.row_layout(nhd) == (16, 0, 128) and _sm90.view_rows(nhd) == 80
    unbound = torch.empty(5, 2, 16, 4, 128, dtype=BF16)[:, 1]  # K or V of a [NB, 2, ...] buffer
    assert _sm90.row_layout(unbound) == (32, 0, 128) and _sm90.view_rows(unbound) == 4 * 32 + 16
    hnd = torch.empty(5, 4, 16, 128, dtype=BF16).permute(0, 2, 1, 3)
    assert _sm90.row_layout(hnd) == (64, 16, 0) and _sm90.view_rows(hnd) == 4 * 64 + 3 * 16 + 16
    for c in (nhd, unbound, hnd):
        assert _sm90.cache_declines((c,), strided=True) is None
    assert _sm90.cache_declines((unbound,)) is not None and _sm90.cache_declines((hnd,)) is not None
    # no [rows, W] view: a last dimension with a stride, blocks not a whole number of rows apart
    assert _sm90.row_layout(torch.empty(5, 16, 4, 256, dtype=BF16)[..., ::2]) is None
    odd_blocks = torch.empty(5 * (16 * 576 + 64), dtype=BF16).as_strided((5, 16, 576), (16 * 576 + 64, 576, 1))
    assert _sm90.row_layout(odd_blocks) is None


def test_gluon_mla_narrow_planning(monkeypatch) -> None:
    """Which calls the narrow kernel is planned for, with how many query tokens a program and how
    they split (no launch; any machine): 16 heads x 128 sequences unsplit (128 programs on 132
    SMs), 32 x 8192 keys split 4 ways at multiples of its 64-key tile, 2 speculative tokens a
    program (32 rows; from the hint or the mean) where they fill the SMs with few splits, 16
    rows a program (mla._narrow_query_block) where 32 would split at least 8 ways and at most 3
    programs then read a page (one token a program at 16 heads, 2 at 8 heads, 12 heads padded to
    16 rows; 4 tokens at 16 heads stay 2 a program), and on fp8 caches always; the Triton kernel
    for 48 heads, 16 heads with the narrow kernel off, and batch-invariant mode. Where the default
    plan splits two ways, pairs of CTAs instead (mla._fold): 16 rows a program always, 32 where
    the pairs cover 90 % of the SMs; not on fp8 caches, mla_sm90_pair's programs or forced
    splits."""
    plan = _narrow_planner(monkeypatch)
    p = plan(128, 1, 16, 4096)
    assert p["block_q"] == 1 and p["split_tokens"] == tpa._NO_SPLIT and "workspace" not in p and not p["fold"]
    p = plan(32, 1, 16, 8192)
    assert p["block_q"] == 1 and p["workspace"] is not None and p["split_tokens"] == 2048 and not p.get("fold")
    for options in ({}, {"max_query_len": 2}):
        p = plan(64, 2, 16, 4096, **options)
        assert p["block_q"] == 2 and p["fold"] and p["split_tokens"] == tpa._NO_SPLIT and "workspace" not in p
    for seqs, per_seq, fold in ((60, 2, True), (56, 2, False), (48, 2, False), (48, 1, True), (45, 1, True)):
        p = plan(seqs, per_seq, 16, 4096)  # two splits each
        assert p.get("fold", False) == fold, (seqs, per_seq, p)
        assert fold or p["workspace"].shapes[0][1] == 2, (seqs, per_seq, p)
    assert not plan(64, 2, 16, 4096, split_tokens=2048).get("fold")
    assert not plan(64, 2, 16, 4096, cache_dtype=torch.float8_e4m3fn).get("fold")
    p = plan(64, 2, 16, 4096, block_size=16)  # mla_sm90_pair's programs, split two ways
    assert p["pair"] and not p.get("fold") and p["workspace"].shapes[0][1] == 2
    monkeypatch.setattr(tmla, "SM90_FOLD", False)
    for options in ({}, {"max_query_len": 2}):
        p = plan(64, 2, 16, 4096, **options)
        assert p["block_q"] == 2 and p["split_tokens"] == 2048, options
    monkeypatch.setattr(tmla, "SM90_FOLD", True)
    # 32 rows would split 8 ways (16 programs) or more: 16 rows
    assert plan(16, 2, 16, 4096)["block_q"] == 1
    assert plan(1, 2, 16, 32768)["block_q"] == 1
    assert plan(8, 3, 16, 4096)["block_q"] == 1  # 3 programs a sequence
    assert plan(8, 4, 8, 4096)["block_q"] == 2  # 2 tokens x 8 heads, 2 programs a sequence
    assert plan(8, 2, 12, 4096)["block_q"] == 1
    assert plan(8, 4, 16, 4096)["block_q"] == 2  # one a token would be 4 programs a sequence
    assert plan(24, 2, 16, 4096)["block_q"] == 2  # 5 splits
    assert plan(16, 2, 16, 4096, split_tokens=4096)["block_q"] == 1  # the rule is the default plan's
    assert plan(8, 2, 32, 4096)["block_q"] == 1
    for seqs, per_seq, heads, keys, block_q in ((64, 2, 16, 4096, 1), (128, 2, 16, 4096, 1), (32, 4, 16, 4096, 1),
                                                (8, 4, 8, 4096, 2), (8, 2, 32, 4096, 1), (64, 2, 4, 4096, 2)):
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):  # 16 rows (mla_sm90_fp8) whatever the split
            assert plan(seqs, per_seq, heads, keys, cache_dtype=fp8)["block_q"] == block_q, (seqs, per_seq, heads)
    monkeypatch.setattr(tmla, "SM90_FP8", False)  # the narrow kernel's own fp8 path: 32 rows
    assert plan(64, 2, 16, 4096, cache_dtype=torch.float8_e4m3fn)["block_q"] == 2
    monkeypatch.setattr(tmla, "SM90_FP8", True)
    assert plan(8, 1, 16, 4096, split_tokens=100)["split_tokens"] == 128  # the tile's multiples
    assert plan(8, 1, 48, 4096) is None
    monkeypatch.setattr(tmla, "SM90_NARROW", False)
    assert plan(8, 1, 16, 4096) is None
    monkeypatch.setattr(tmla, "SM90_NARROW", True)
    with _config.batch_invariant(True):
        assert plan(8, 1, 16, 4096) is None


def _narrow_planner(monkeypatch):
    """``plan(seqs, per_seq, heads, keys, cache_dtype=BF16, block_size=64, **options)``: the
    keyword arguments ``mla.prepare_mla_decode`` gives ``mla_sm90.prepare`` for such a call
    (None: another kernel), on any machine, with the wide Gluon kernel declining everything, the
    narrow one taking up to 32 rows, ``mla_sm90_pair`` 17-32 rows over a bf16/fp16 cache, and 132
    SMs."""
    from torch_paged_attn.lowering.triton import mla_sm90, mla_sm90_narrow, mla_sm90_pair

    plans = []
    monkeypatch.setattr(tmla, "SM90_GLUON", True)
    monkeypatch.setattr(mla_sm90, "declines", lambda *a: "not here")
    monkeypatch.setattr(mla_sm90_narrow, "declines",
                        lambda ql, qr, kv, block_q: None if ql.shape[1] * block_q <= 32 else "rows")
    monkeypatch.setattr(mla_sm90_pair, "declines", lambda ql, qr, kv, block_q: None if (
        17 <= ql.shape[1] * block_q <= 32 and kv.dtype == ql.dtype) else "rows or dtype")
    monkeypatch.setattr(mla_sm90, "prepare", lambda **k: plans.append(k) or "gluon")
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)

    def plan(seqs: int, per_seq: int, heads: int, keys: int, cache_dtype=BF16, block_size: int = 64, **options):
        tokens = seqs * per_seq
        ql, qr = torch.empty(tokens, heads, 512, dtype=BF16), torch.empty(tokens, heads, 64, dtype=BF16)
        cache = torch.empty(4, block_size, 576, dtype=cache_dtype)
        table = torch.zeros(seqs, -(-keys // block_size), dtype=torch.int32)
        lens = torch.full((seqs,), keys, dtype=torch.int32)
        qsl = torch.arange(0, tokens + 1, per_seq, dtype=torch.int32)
        plans.clear()
        tmla.prepare_mla_decode(ql, qr, cache, table, lens, qsl, torch.empty_like(ql), torch.empty(tokens, heads),
                                scale=0.1, causal=True, kv_scale=None, **options)
        return plans[-1] if plans else None

    return plan


@pytest.mark.parametrize("in_query_dtype", [True, False])
def test_gluon_mla_partials_dtype(monkeypatch, in_query_dtype) -> None:
    """The narrow Gluon kernels' split-KV partial outputs are allocated in the query's dtype
    (``mla._NARROW_PARTIALS_IN_QUERY_DTYPE``; float32 with it off), their LSEs in float32; the
    wide kernel's partials stay float32 (no launch, any machine; the fold off, which runs 2 tokens
    B64 x 4096 as pairs of CTAs without partials)."""
    monkeypatch.setattr(tmla, "_NARROW_PARTIALS_IN_QUERY_DTYPE", in_query_dtype)
    monkeypatch.setattr(tmla, "SM90_FOLD", False)
    plan = _narrow_planner(monkeypatch)
    for seqs, per_seq, keys in ((64, 2, 4096), (32, 1, 8192), (32, 4, 4096)):
        p = plan(seqs, per_seq, 16, keys)
        assert p["block_q"] > 0 and p["workspace"] is not None, (seqs, per_seq)
        part_out, part_lse = p["workspace"].tensors(torch.empty(1, dtype=BF16))
        assert part_out.dtype == (BF16 if in_query_dtype else torch.float32) and part_lse.dtype == torch.float32
        assert part_out.shape == (seqs * per_seq, part_out.shape[1], 16, 512) and part_out.shape[1] > 1
    wide = _wide_planner(monkeypatch)(1, 128, 32768)  # B1 x 32768, 128 heads: split
    assert wide["block_q"] == 0 and wide["workspace"].tensors(torch.empty(1, dtype=BF16))[0].dtype == torch.float32


def test_gluon_mla_combine_blocking(monkeypatch) -> None:
    """The combine after the narrow kernels' splits takes up to ``mla._COMBINE_TILE // 512`` heads
    of latent 512 a program where that leaves a program for each of the 132 SMs (2 tokens B64 x
    4096 and 4 tokens B32 x 4096, pair kernel: four heads; 1 token B32 x 8192: two; B16 x 8192:
    one); the wide kernel's (B1 x 32768, 128 heads) one head a program, as before (no launch, any
    machine; the fold off, which runs 2 tokens B64 x 4096 as pairs of CTAs without a combine)."""
    monkeypatch.setattr(tmla, "SM90_FOLD", False)
    plan = _narrow_planner(monkeypatch)
    launched = recorded_combines(monkeypatch, tmla)
    for seqs, per_seq, keys, grid in ((64, 2, 4096, (128, 4, 1)), (32, 4, 4096, (128, 4, 1)),
                                      (32, 1, 8192, (32, 8, 1)), (16, 1, 8192, (16, 16, 1))):
        launched.clear()
        assert plan(seqs, per_seq, 16, keys)["workspace"] is not None, (seqs, per_seq)
        (got, block_h, dv_block, _, _), = launched
        assert got == grid and block_h == 16 // grid[1] and dv_block == 512, (seqs, per_seq, got)
    launched.clear()
    _wide_planner(monkeypatch)(1, 128, 32768)
    (got, block_h, _, _, _), = launched
    assert got == (1, 128, 1) and block_h == 1


def test_gluon_mla_fold_launch(monkeypatch) -> None:
    """The narrow kernel's fold launches two CTAs a query block with ``FOLD`` (2 tokens x 16
    heads, 4 sequences: 4 + 4 + 1 blocks), and its launcher refuses what the fold cannot run: an
    fp8 cache, splits, no LSE, mla_sm90_pair's programs (no launch, any machine)."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90

    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")
    made = []
    monkeypatch.setattr(mla_sm90, "launcher", lambda kernel, grid, **c: made.append((kernel, grid, c)))
    ql, qr = torch.empty(8, 16, 512, dtype=BF16), torch.empty(8, 16, 64, dtype=BF16)
    table = torch.zeros(4, 4, dtype=torch.int32)
    lens, qsl = torch.full((4,), 100, dtype=torch.int32), torch.arange(0, 9, 2, dtype=torch.int32)

    def plan(cache=torch.empty(8, 64, 576, dtype=BF16), splits=1, has_lse=True, pair=False):
        mla_sm90._launcher(ql, qr, cache, table, lens, qsl, (0, 0, 0), (0, 0, 0), splits, 1.0, has_lse, 0.1, True,
                           tpa._NO_SPLIT, 2, pair=pair, fold=True)
        return made[-1]

    kernel, grid, c = plan()
    assert kernel.__name__ == "_mla_narrow_kernel" and grid == (2 * 9, 1, 1) and c["FOLD"] and c["ROWS"] == 32
    for bad in ({"cache": torch.empty(8, 64, 576, dtype=E4M3)}, {"splits": 2}, {"has_lse": False}, {"pair": True}):
        with pytest.raises(ValueError, match="fold"):
            plan(**bad)


def _wide_plan(monkeypatch, tokens: int, heads: int, cache: torch.Tensor, splits: int = 1) -> tuple:
    """The wide kernel's planned launch (no launch, any machine): ``(grid, constants)`` of
    ``mla_sm90._launcher`` for ``tokens`` one-token sequences of ``heads`` heads, latent 512 + rope
    64, over ``cache``, split ``splits`` ways."""
    from torch_paged_attn.lowering.triton import mla_sm90

    made = []
    monkeypatch.setattr(mla_sm90, "launcher", lambda kernel, grid, **c: made.append((grid, c)))
    ql, qr = torch.empty(tokens, heads, 512, dtype=BF16), torch.empty(tokens, heads, 64, dtype=BF16)
    table = torch.zeros(tokens, 4, dtype=torch.int32)
    lens, qsl = torch.full((tokens,), 100, dtype=torch.int32), torch.arange(tokens + 1, dtype=torch.int32)
    mla_sm90._launcher(ql, qr, cache, table, lens, qsl, (0, 0, 0), (0, 0, 0), splits, 1.0, True, 0.1, True, 128)
    return made[-1]


def test_gluon_mla_wide_grid_and_latents(monkeypatch) -> None:
    """The wide kernel's grid (no launch, any machine): at block sizes >= 64 a token's head groups
    side by side on axis 0 (``HEAD_GROUPS`` tells the kernel how many), under 64 (or with
    ``HEADS_FIRST`` off) on axis 1; splits on axis 2. It takes latents 128, 256 and 512 (half of
    one is a wgmma's N) and declines others, naming the latent."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90

    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")

    def grid(tokens: int, heads: int, block_size: int, splits: int):
        got, constants = _wide_plan(monkeypatch, tokens, heads, torch.empty(8, block_size, 576, dtype=BF16), splits)
        return got, constants["HEAD_GROUPS"]

    assert grid(64, 128, 64, 1) == ((128, 1, 1), 2)
    assert grid(3, 256, 128, 5) == ((12, 1, 5), 4)
    assert grid(1, 64, 64, 7) == ((1, 1, 7), 1)
    assert grid(64, 128, 16, 1) == ((64, 2, 1), 0)
    assert grid(5, 128, 32, 3) == ((5, 2, 3), 0)
    monkeypatch.setattr(mla_sm90, "HEADS_FIRST", False)
    assert grid(64, 128, 64, 1) == ((64, 2, 1), 0)

    monkeypatch.setattr(_sm90, "unavailable", lambda t: None)
    for latent in (128, 256, 512, 64, 192, 384, 640):
        ql, qr = torch.empty(2, 64, latent, dtype=BF16), torch.empty(2, 64, 64, dtype=BF16)
        reason = mla_sm90.declines(ql, qr, torch.empty(8, 64, latent + 64, dtype=BF16))
        if latent in (128, 256, 512):
            assert reason is None, (latent, reason)
        else:
            assert reason is not None and "latent" in reason, (latent, reason)


def test_gluon_mla_wide_prefetch_choice(monkeypatch) -> None:
    """Where the wide kernel's producer asks L2 for each pair's pages (no launch, any machine): at
    two or more head groups on pages of a whole tile or more whose rows lie one after another; not
    at one group, not under block size 64, not on a strided view (a layer of a cross-layer buffer
    is still rows one after another; a view whose rows are wider than a slot is not), not with
    ``PREFETCH_MIN_GROUPS`` raised past the groups."""
    from torch_paged_attn.lowering.triton import _sm90, mla_sm90

    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")

    def prefetch(heads: int, cache: torch.Tensor) -> bool:
        return _wide_plan(monkeypatch, 4, heads, cache)[1]["PREFETCH"]

    cache = torch.empty(8, 64, 576, dtype=BF16)
    assert prefetch(128, cache) and prefetch(256, cache) and prefetch(128, torch.empty(8, 128, 576, dtype=BF16))
    assert not prefetch(64, cache)
    assert not prefetch(128, torch.empty(8, 16, 576, dtype=BF16))
    assert not prefetch(128, torch.empty(8, 32, 576, dtype=BF16))
    assert prefetch(128, torch.empty(8, 3, 64, 576, dtype=BF16)[:, 1])  # a layer: rows still side by side
    assert not prefetch(128, torch.empty(8, 64, 640, dtype=BF16)[:, :, :576])  # rows 640 wide
    monkeypatch.setattr(mla_sm90, "PREFETCH_MIN_GROUPS", 3)
    assert not prefetch(128, cache) and prefetch(256, cache)


def test_gluon_mla_pair_planning(monkeypatch) -> None:
    """Which narrow-kernel calls run ``mla_sm90_pair`` (mla._pair; no launch, any machine): block
    sizes under 64, one token a program at 17-32 heads, and a sequence's tokens over several
    programs; not 2-4 tokens in one program on pages of 64 keys or more, not 16 rows or fewer,
    not fp8 caches, not with ``mla.SM90_PAIR`` off; its splits at multiples of a pair of tiles;
    below block size 64, speculative tokens stay in its 32-row programs where the narrow kernel's
    would go to 16 rows (mla._narrow_query_block)."""
    plan = _narrow_planner(monkeypatch)
    p = plan(64, 2, 16, 4096)
    assert p["block_q"] == 2 and not p["pair"]  # 2 tokens a program, block 64
    for block_size in (8, 16, 32):
        p = plan(64, 2, 16, 4096, block_size=block_size)
        assert p["block_q"] == 2 and p["pair"] and p["split_tokens"] % 128 == 0, block_size
    p = plan(32, 4, 16, 4096)
    assert p["block_q"] == 2 and p["pair"]  # 2 programs a sequence
    assert plan(32, 4, 16, 4096, max_query_len=4)["pair"]
    # where 32 rows would split 8 ways or more: 16 rows on the narrow kernel at block 64, 32 rows
    # on the pair kernel below it
    for seqs, per_seq, keys in ((16, 2, 4096), (1, 2, 32768), (16, 2, 8192)):
        p = plan(seqs, per_seq, 16, keys)
        assert p["block_q"] == 1 and not p["pair"], (seqs, keys)
        p = plan(seqs, per_seq, 16, keys, block_size=16)
        assert p["block_q"] == 2 and p["pair"], (seqs, keys)
    p = plan(64, 1, 32, 4096)
    assert p["block_q"] == 1 and p["pair"]
    assert plan(64, 1, 24, 4096)["pair"]
    assert not plan(128, 1, 16, 4096)["pair"]  # 16 rows
    assert not plan(8, 2, 12, 4096)["pair"]  # 1 token x 12 heads a program (16 rows)
    assert not plan(64, 2, 16, 4096, cache_dtype=torch.float8_e4m3fn, block_size=16)["pair"]
    assert plan(8, 1, 32, 4096, split_tokens=130)["split_tokens"] == 256  # a pair's multiples
    assert plan(8, 1, 16, 4096, split_tokens=130)["split_tokens"] == 192  # the narrow kernel's tile's
    monkeypatch.setattr(tmla, "SM90_PAIR", False)
    assert not plan(64, 1, 32, 4096)["pair"]
    assert not plan(64, 2, 16, 4096, block_size=16)["pair"]


# 128 and 64 heads, block sizes 64 / 16 / 8, decode (lengths 0, 1, BS +- 1, several tiles) and
# speculative tokens (causal and not), padding tokens (NaN queries), fp16, no LSE, a latent of 256;
# forced splits (64 and 128 keys, planned as one pair of tiles)
_GLUON_CASES = [
    replace(_BASE, num_heads=128, pad_tokens=2),
    replace(_BASE, **_MTP, num_heads=128),
    replace(_BASE, **_MTP, num_heads=64, causal=False, block_size=16),
    replace(_BASE, q_lens=(1, 1, 1, 1, 1, 1), kv_lens=(15, 16, 17, 63, 65, 0), num_heads=64, block_size=8),
    replace(_BASE, num_heads=128, dtype=FP16, with_lse=False, block_size=32),
    replace(_BASE, num_heads=64, latent=256, rope=64),
    replace(_BASE, **_MTP, num_heads=64, split_tokens=64, pad_tokens=1),
    replace(_BASE, num_heads=128, split_tokens=128, with_lse=False, block_size=128),
    replace(_BASE, num_heads=128, strided=True, pad_tokens=1),
]


@gpu_tier
@pytest.mark.parametrize("sms", ["one_sm", "all_sms"])
@pytest.mark.parametrize("case", _GLUON_CASES, ids=lambda c: c.id)
def test_gluon_mla_cuda(case: Case, sms: str, gluon_mla, monkeypatch) -> None:
    """Each case unsplit (one SM planned) and split as planned for this GPU (few tokens: many
    splits of at least two tiles, merged by the combine kernel), against the float64 loop; split,
    with the cached launcher in check mode (Triton confirms each binary it launches)."""
    if sms == "one_sm":
        one_sm(monkeypatch)
    else:
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    from torch_paged_attn.lowering.triton import _launch, mla_sm90

    monkeypatch.setattr(_launch, "_DESCRIPTORS", {})  # this test's encodings only
    check_case(case, "cuda")
    assert gluon_mla, "the Gluon MLA kernel did not run"

    if _launch._fast_launcher(mla_sm90._mla_sm90_kernel) is not None:  # Triton 3.6: its C launcher, called
        assert any(c.spec.shape[1] == case.latent + case.rope for c in _launch._DESCRIPTORS.values()), \
            "no launch with a pre-encoded descriptor"  # with the descriptor encoded by the package
    splits = gluon_mla[-1].get("workspace") is not None
    if case.split_tokens is not None or (sms == "all_sms" and max(case.kv_lens) > 256):
        assert splits, gluon_mla[-1]
    elif sms == "one_sm":
        assert not splits, gluon_mla[-1]


# The narrow kernel (mla_sm90_narrow: query tokens x heads <= 32 rows a program): 16 / 8 / 32 /
# 12 / 1 heads, decode (lengths 0, 1, BS +- 1, several tiles) and speculative tokens (2 a program,
# a sequence of 3 over two programs; 4 tokens x 8 heads; causal and not), block sizes 8 .. 128,
# padding tokens (NaN queries), fp16, no LSE, a latent of 256, forced splits (64 and 128 keys);
# the same on e4m3 / e5m2 caches with bf16 and fp16 queries
_NARROW_CASES = [
    replace(_BASE, pad_tokens=2),
    replace(_BASE, num_heads=8, block_size=16),
    replace(_BASE, num_heads=32, dtype=FP16, with_lse=False),
    replace(_BASE, **_MTP),
    replace(_BASE, **_MTP, causal=False, block_size=32),
    replace(_BASE, q_lens=(4, 1, 4), kv_lens=(700, 64, 1300), num_heads=8, hint=True),
    replace(_BASE, q_lens=(1, 1, 1, 1, 1, 1), kv_lens=(15, 16, 17, 63, 65, 0), block_size=8),
    replace(_BASE, num_heads=12, latent=256, rope=64),
    replace(_BASE, **_MTP, split_tokens=64, pad_tokens=1),
    replace(_BASE, split_tokens=128, with_lse=False, block_size=128),
    replace(_BASE, num_heads=1, pad_tokens=1),
    replace(_BASE, **_MTP, strided=True, block_size=16),
    # fp8 caches: at most 16 rows a program run mla_sm90_fp8 (two warpgroups on alternate tiles),
    # 32 rows the narrow kernel's fp8 path (three stages converted to fp16; four at latent 256)
    replace(_BASE, cache_dtype=E4M3, pad_tokens=2),
    replace(_BASE, dtype=FP16, cache_dtype=E5M2, latent=256, split_tokens=128),
    replace(_BASE, q_lens=(2, 1, 2), kv_lens=(700, 64, 1300), num_heads=8, cache_dtype=E4M3, block_size=128),
    replace(_BASE, num_heads=4, cache_dtype=E4M3, with_lse=False, block_size=32, strided=True),
    replace(_BASE, **_MTP, dtype=FP16, cache_dtype=E4M3, block_size=16),
    replace(_BASE, **_MTP, cache_dtype=E5M2, split_tokens=64, with_lse=False),
    replace(_BASE, q_lens=(1, 1, 1, 1, 1, 1), kv_lens=(15, 16, 17, 63, 65, 0), block_size=8, cache_dtype=E4M3),
    replace(_BASE, **_MTP, strided=True, cache_dtype=E4M3, causal=False),
    replace(_BASE, q_lens=(4, 1, 4), kv_lens=(700, 64, 1300), num_heads=8, latent=256, cache_dtype=E4M3, hint=True),
]


def fold_wherever(monkeypatch) -> None:
    """``mla._fold``: the narrow kernel's pairs of CTAs wherever they may run (its own programs
    over bf16/fp16 caches, the default plan), however many ways that plan splits."""
    monkeypatch.setattr(tmla, "_fold", lambda kv, heads, block_q, programs, pair, splits: (
        block_q >= 1 and not pair and kv.dtype not in FP8_DTYPES))


def paired_binaries() -> list[bool]:
    """For each binary of the narrow kernel this process compiled: whether it launches as pairs
    of CTAs (its PTX rewritten by ``_cluster``)."""
    from torch_paged_attn.lowering.triton import mla_sm90_narrow

    return [".reqnctapercluster 2, 1, 1" in k.asm["ptx"]
            for cache in mla_sm90_narrow._mla_narrow_kernel.device_caches.values() for k in cache[0].values()]


@gpu_tier
@pytest.mark.parametrize("sms", ["one_sm", "all_sms", "fold"])
@pytest.mark.parametrize("case", _NARROW_CASES, ids=lambda c: c.id)
def test_gluon_mla_narrow_cuda(case: Case, sms: str, gluon_mla, monkeypatch) -> None:
    """The narrow kernel on each case, unsplit (one SM planned), split as planned for this GPU
    (merged by the combine kernel) and as pairs of CTAs wherever they may run (each a half of the
    keys; not on fp8 caches, mla_sm90_pair's programs or forced splits), the cached launcher in
    check mode for the last two, against the float64 loop."""
    if sms == "one_sm":
        one_sm(monkeypatch)
    else:
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    if sms == "fold":
        fold_wherever(monkeypatch)
    check_case(case, "cuda")
    assert gluon_mla and gluon_mla[-1].get("block_q", 0) >= 1, f"the narrow kernel did not run: {gluon_mla}"
    plan = gluon_mla[-1]
    splits = plan.get("workspace") is not None
    if sms == "fold":
        fold = case.split_tokens is None and case.cache_dtype not in FP8_DTYPES and not plan["pair"]
        assert plan.get("fold", False) == fold and (not fold or not splits), plan
        if fold:
            assert any(paired_binaries()), "no binary of the narrow kernel launches as pairs of CTAs"
    elif case.split_tokens is not None or (sms == "all_sms" and max(case.kv_lens) > 256):
        assert splits, plan
    elif sms == "one_sm":
        assert not splits, plan


# The narrow kernel's pairs of CTAs beyond _NARROW_CASES (whose 32-row programs at block 16 run
# mla_sm90_pair): 32 rows at block sizes 64 and 128 (2 tokens x 16 heads, causal or not; 4 x 8
# with a sequence over two blocks), 1 and 2 tiles (rank 1 without keys, one each), lengths 0, 1
# and a tile +- 1 at 16 rows, fp16, no LSE, padding tokens, strided cache and output, latent 256
_FOLD_CASES = [
    replace(_BASE, **_MTP, block_size=64),
    replace(_BASE, **_MTP, block_size=128, causal=False, with_lse=False, pad_tokens=2),
    replace(_BASE, q_lens=(4, 1, 4), kv_lens=(700, 64, 1300), num_heads=8, hint=True, block_size=64, dtype=FP16),
    replace(_BASE, q_lens=(2, 2, 2, 2), kv_lens=(2, 63, 64, 65), block_size=64),
    replace(_BASE, q_lens=(1, 1, 1, 1, 1, 1), kv_lens=(0, 1, 63, 64, 65, 129), block_size=64, pad_tokens=1),
    replace(_BASE, **_MTP, block_size=64, strided=True),
    replace(_BASE, **_MTP, num_heads=12, latent=256, rope=64, block_size=64),
]


@gpu_tier
@pytest.mark.parametrize("case", _FOLD_CASES, ids=lambda c: c.id)
def test_gluon_mla_fold_cuda(case: Case, gluon_mla, monkeypatch) -> None:
    """The narrow kernel as pairs of CTAs (each a half of the keys, rank 1's state merged by rank
    0) on each case, the cached launcher in check mode, against the float64 loop; its binary
    launches as pairs."""
    monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    fold_wherever(monkeypatch)
    check_case(case, "cuda")
    assert gluon_mla and gluon_mla[-1].get("fold") and not gluon_mla[-1]["pair"], gluon_mla
    assert any(paired_binaries()), "no binary of the narrow kernel launches as pairs of CTAs"


@gpu_tier
def test_gluon_mla_fold_unpaired_cuda(gluon_mla, monkeypatch, tmp_path) -> None:
    """A fold whose binary was compiled without the CTA-pair rewrite (another compile hook set
    after the package's, a binary from a cache filled without it) runs on rank 0 alone: no pair
    to wait for, every key on rank 0, the same result, against the float64 loop."""
    import collections

    from torch_paged_attn.lowering.triton import _cluster, mla_sm90, mla_sm90_narrow

    kernel = mla_sm90_narrow._mla_narrow_kernel
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel, "device_caches", collections.defaultdict(kernel.create_binder))
    monkeypatch.setattr(kernel, _launch._ATTR, None, raising=False)  # (its binaries, kept on the kernel)
    monkeypatch.setattr(mla_sm90, "_LAUNCHERS", {})
    monkeypatch.setattr(_cluster, "rewrite", lambda ptx: ptx)
    fold_wherever(monkeypatch)
    for case in (replace(_BASE, **_MTP, block_size=64), replace(_BASE, pad_tokens=2, with_lse=False, block_size=64)):
        gluon_mla.clear()
        check_case(case, "cuda")
        assert gluon_mla and gluon_mla[-1].get("fold"), gluon_mla
    assert paired_binaries() and not any(paired_binaries())


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(20))
def test_gluon_mla_narrow_fuzz_cuda(family: int, gluon_mla, monkeypatch) -> None:
    """500 configurations the narrow kernel takes (seeds 500000 + 25 f ..): 1 to 32 heads, latent
    512 / 256 / 128, block sizes 8 .. 128, bf16 / fp16, 1-4 query tokens a sequence (causal or
    not; with or without the hint), lengths 0, 1, BS +- 1 and up to 3000 keys, padding tokens,
    with or without the LSE; half the families planned on one SM (unsplit), half for this GPU or
    with forced splits of 64-256 keys; against the float64 loop."""
    check_gluon_fuzz_family(500000, family, (1, 4, 8, 12, 16, 16, 32), gluon_mla, monkeypatch, narrow=True)


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(12))
def test_gluon_mla_narrow_fold_fuzz_cuda(family: int, gluon_mla, monkeypatch) -> None:
    """300 configurations as the narrow fuzz draws them (seeds 700000 + 25 f ..) with the narrow
    kernel's pairs of CTAs wherever they may run (bf16/fp16 caches, not mla_sm90_pair's programs
    or forced splits)."""
    fold_wherever(monkeypatch)
    check_gluon_fuzz_family(700000, family, (1, 4, 8, 12, 16, 16, 32), gluon_mla, monkeypatch, narrow=True)


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(20))
def test_gluon_mla_narrow_fp8_fuzz_cuda(family: int, gluon_mla, monkeypatch) -> None:
    """The narrow fuzz's 500 draws (seeds 600000 + 25 f ..) on fp8 caches: e4m3 or e5m2 a family."""
    check_gluon_fuzz_family(600000, family, (1, 4, 8, 12, 16, 16, 32), gluon_mla, monkeypatch, narrow=True,
                            cache_dtypes=(E4M3, E4M3, E5M2))


# mla_sm90_pair (17-32 rows a program over a bf16/fp16 cache), planned wherever it takes the call:
# 2 tokens x 16 heads (causal and not, odd and even tile counts, lengths under a tile), 1 token x
# 32 heads and x 24, 2 x 12, 4 tokens x 8, block sizes 8 .. 128, latent 256 / 128, fp16, no LSE,
# padding tokens, strided caches, forced splits (64 keys: rounded to a pair; 256), a sequence of 3
# tokens over two programs
_PAIR_CASES = [
    replace(_BASE, **_MTP),
    replace(_BASE, **_MTP, causal=False, block_size=32),
    replace(_BASE, **_MTP, block_size=8, pad_tokens=2),
    replace(_BASE, **_MTP, split_tokens=64, with_lse=False, block_size=128),
    replace(_BASE, **_MTP, strided=True, block_size=16, split_tokens=256),
    replace(_BASE, num_heads=32, dtype=FP16, pad_tokens=1),
    replace(_BASE, num_heads=24, latent=256, rope=64),
    replace(_BASE, q_lens=(2, 2, 2), kv_lens=(63, 64, 129), num_heads=12, latent=128, rope=64),
    replace(_BASE, q_lens=(4, 1, 4), kv_lens=(700, 64, 1300), num_heads=8, hint=True, block_size=16),
    replace(_BASE, q_lens=(3, 2, 3), kv_lens=(5, 200, 1900), hint=True),
    replace(_BASE, q_lens=(2, 2, 2, 2), kv_lens=(2, 3, 64, 65), block_size=16),
]


def _pair_wherever_it_runs(monkeypatch) -> None:
    """``mla._pair``: ``mla_sm90_pair`` wherever it takes the call, whatever the rule; programs of
    up to 32 rows however far they split (``mla._narrow_query_block``'s 16-row rule off)."""
    from torch_paged_attn.lowering.triton import mla_sm90_pair

    monkeypatch.setattr(tmla, "_SHORT_SPLITS", 1 << 30)
    monkeypatch.setattr(tmla, "_pair", lambda ql, qr, kv, block_q, *a: mla_sm90_pair.declines(ql, qr, kv, block_q)
                        is None)


@gpu_tier
@pytest.mark.parametrize("sms", ["one_sm", "all_sms"])
@pytest.mark.parametrize("case", _PAIR_CASES, ids=lambda c: c.id)
def test_gluon_mla_pair_cuda(case: Case, sms: str, gluon_mla, monkeypatch) -> None:
    """mla_sm90_pair on each case, unsplit (one SM planned) and split as planned for this GPU
    (merged by the combine kernel; the cached launcher in check mode), against the float64 loop."""
    _pair_wherever_it_runs(monkeypatch)
    if sms == "one_sm":
        one_sm(monkeypatch)
    else:
        monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    check_case(case, "cuda")
    assert gluon_mla and gluon_mla[-1].get("pair"), f"mla_sm90_pair did not run: {gluon_mla}"
    if case.split_tokens is not None:
        assert gluon_mla[-1].get("workspace") is not None and gluon_mla[-1]["split_tokens"] % 128 == 0


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(12))
def test_gluon_mla_pair_fuzz_cuda(family: int, gluon_mla, monkeypatch) -> None:
    """300 configurations (seeds 700000 + 25 f ..) with mla_sm90_pair wherever it takes the call:
    12 / 16 / 24 / 32 heads, the narrow fuzz's other draws (1-4 query tokens a sequence, latent
    512 / 256 / 128, block sizes 8 .. 128, lengths 0, 1, BS +- 1 and up to 3000 keys, forced
    splits); draws of 16 rows or fewer a program run the narrow kernel; against the float64 loop."""
    _pair_wherever_it_runs(monkeypatch)
    check_gluon_fuzz_family(700000, family, (12, 16, 16, 24, 32), gluon_mla, monkeypatch, narrow=True)


@gpu_tier
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("heads", [128, 16])
@pytest.mark.parametrize("sms", ["one_sm", "all_sms"])
def test_gluon_mla_bad_block_ids_cuda(sms: str, heads: int, block_size: int, gluon_mla, monkeypatch) -> None:
    """Ids outside [0, NB) in the used part of the table (-1, NB, 2^31 - 1): those keys are not
    visible, never read. Block size 64: one page a tile, whose id the wide kernel's producer and
    consumers look up once (``mla_sm90._load``, ``_page_ok``)."""
    if sms == "one_sm":
        one_sm(monkeypatch)
    b = make_batch(replace(_BASE, q_lens=(1, 2, 1), kv_lens=(1000, 500, 64), num_heads=heads, block_size=block_size),
                   "cuda", seed=11)
    nb, bs = b.kv_cache.shape[:2]
    for i, (n, bad) in enumerate(zip((1000, 500, 64), (-1, nb, 2**31 - 1))):
        b.block_table[i, (5 * i) % -(-n // bs)] = bad
    out, lse = run_triton(b)
    assert gluon_mla, "the Gluon MLA kernel did not run"
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    check(b, out, lse, True, BF16)


@gpu_tier
def test_gluon_mla_declines_cuda(gluon_mla) -> None:
    """fp8 caches of more than 32 rows a program (128 heads), 48 heads (neither 64-head groups nor
    32 rows) and batch-invariant mode run the Triton kernel."""
    for case in (replace(_BASE, num_heads=128, cache_dtype=E4M3), replace(_BASE, num_heads=48)):
        gluon_mla.clear()
        check_case(case, "cuda")
        assert not gluon_mla, f"the Gluon kernel took {case.id}"
    with _config.batch_invariant(True):
        check_case(replace(_BASE, num_heads=128), "cuda")
        check_case(replace(_BASE), "cuda")
    assert not gluon_mla, "the Gluon kernel took a batch-invariant call"


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(20))
def test_gluon_mla_kernel_fuzz_cuda(family: int, gluon_mla, monkeypatch) -> None:
    """500 configurations the Gluon kernel takes (seeds 400000 + 25 f ..): 64 / 128 heads,
    latent 512 / 256 / 128, block sizes 8 .. 128, bf16 / fp16, 1-4 query tokens a sequence
    (causal or not), lengths 0, 1, BS +- 1 and up to 3000 keys, padding tokens, with or without
    the LSE; half the families planned on one SM (unsplit), half for this GPU or with forced
    splits of 64-256 keys (planned as whole pairs of tiles); against the float64 loop."""
    check_gluon_fuzz_family(400000, family, (64, 128), gluon_mla, monkeypatch, narrow=False)


def check_gluon_fuzz_family(seed0: int, family: int, head_counts: tuple, gluon_mla, monkeypatch, narrow: bool,
                            cache_dtypes: tuple = ()) -> None:
    """One family of 25 draws for a Gluon MLA kernel (seeds ``seed0 + 25 family ..``): its head
    count from ``head_counts``, latent 512 / 256 / 128, a block size 8 .. 128, bf16 / fp16, 1-4
    query tokens a sequence (causal or not), lengths 0, 1, BS +- 1 and up to 3000 keys, padding
    tokens, with or without the LSE (``narrow``: with or without the hint), a cache of the query's
    dtype or one of ``cache_dtypes`` (fp8); even families planned on one SM, every fourth from the
    second with forced splits of 64-256 keys; each against the float64 loop, and the kernel asked
    for (``narrow``: the narrow one) must have run."""
    rng = random.Random(seed0 + family)
    if family % 2 == 0:
        one_sm(monkeypatch)
    heads, latent = rng.choice(head_counts), rng.choice((512, 512, 256, 128))
    bs, dtype, causal = rng.choice((8, 16, 32, 64, 64, 128)), rng.choice((BF16, BF16, FP16)), rng.random() < 0.8
    max_q = rng.choice((1, 1, 2, 4))
    cache_dtype = rng.choice(cache_dtypes) if cache_dtypes else None
    for draw in range(25):
        seed = seed0 + family * 25 + draw
        r = random.Random(seed)
        n = r.randint(1, 6)
        q_lens = tuple(r.randint(1, max_q) for _ in range(n))
        kv_lens = tuple(
            r.choice((0, 1, bs - 1, bs, bs + 1, 63, 64, 65, r.randint(1, 700), r.randint(700, 3000))) for _ in range(n))
        kv_lens = tuple(max(k, q if causal else 0) for k, q in zip(q_lens, kv_lens))
        split = r.choice((None, None, 64, 128, 256)) if family % 4 == 1 else None
        with_lse, pad_tokens = r.random() < 0.8, r.choice((0, 0, 1, 3))
        hint = narrow and r.random() < 0.5
        case = Case(q_lens, kv_lens, num_heads=heads, latent=latent, rope=64, block_size=bs, dtype=dtype,
                    cache_dtype=cache_dtype, causal=causal, with_lse=with_lse, pad_tokens=pad_tokens,
                    split_tokens=split, hint=hint)
        gluon_mla.clear()
        try:
            check_case(case, "cuda")
            if narrow:
                assert gluon_mla and gluon_mla[-1].get("block_q", 0) >= 1, "the narrow kernel did not run"
            else:
                assert gluon_mla, "the Gluon MLA kernel did not run"
        except AssertionError as e:
            raise AssertionError(f"fuzz seed {seed}: {case.id}: {e}") from e


def _write_by_kernel(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst = src`` bit for bit by an elementwise kernel (not a copy, which the driver may run
    as a memcpy): a kernel that the next kernel in the stream may follow by programmatic
    dependent launch."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dst.element_size()]
    torch.bitwise_or(src.view(ints), 0, out=dst.view(ints))


@gpu_tier
@pytest.mark.parametrize("kind", ["decode", "mtp", "fp8"])
@pytest.mark.parametrize("sms", ["one_sm", "all_sms"])
def test_gluon_mla_reads_inputs_written_just_before_cuda(kind: str, sms: str, gluon_mla, monkeypatch) -> None:
    """The narrow kernels, launched with programmatic dependent launch, read nothing before the
    kernels ahead of them in the stream have finished: in one CUDA graph, kernels write the
    queries, lengths, block table and cache right before the call (what they overwrite poisoned
    before each replay: NaN queries and cache, no block, length 1), unsplit and split; each
    replay equals the float64 truth of what those kernels wrote."""
    if sms == "one_sm":
        one_sm(monkeypatch)
    case = replace(_BASE, **(_MTP if kind == "mtp" else _DECODE), cache_dtype=E4M3 if kind == "fp8" else None)
    static, src = make_batch(case, "cuda", 0), make_batch(case, "cuda", 1)
    names = ("q_latent", "q_rope", "seq_lens", "block_table", "kv_cache") + (("kv_scale", ) if kind == "fp8" else ())
    out = torch.full(static.q_latent.shape, float("nan"), dtype=case.dtype, device="cuda")
    lse = torch.full(static.q_latent.shape[:2], float("nan"), device="cuda")

    def call():
        for name in names:  # the cache last: the largest write, right before the call
            _write_by_kernel(getattr(static, name), getattr(src, name))
        tmla.mla_decode(*static.args(), out, lse, scale=static.scale, causal=True, kv_scale=static.kv_scale)

    call()  # compile and plan outside the capture
    assert gluon_mla and gluon_mla[-1].get("block_q", 0) >= 1, "the narrow kernel did not run"
    assert (gluon_mla[-1].get("workspace") is not None) == (sms == "all_sms")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed in (2, 3):
        new = make_batch(case, "cuda", seed)
        for name in names:
            getattr(src, name).copy_(getattr(new, name))
        static.q_latent.fill_(float("nan"))
        static.q_rope.fill_(float("nan"))
        static.seq_lens.fill_(1)
        static.block_table.fill_(-1)
        if kind == "fp8":
            static.kv_cache.view(torch.uint8).fill_(0x7F)
            static.kv_scale.fill_(float("nan"))
        else:
            static.kv_cache.fill_(float("nan"))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        check(static, out, lse, True, case.dtype)


@gpu_tier
def test_gluon_mla_fold_graph_and_compile_cuda(gluon_mla, monkeypatch) -> None:
    """The narrow kernel's pairs of CTAs captured once under sync-debug "error" and replayed on
    new lengths (the pair compiled into the binary, so the graph launches it as pairs); the public
    op under torch.compile(fullgraph=True) gives the eager bits."""
    fold_wherever(monkeypatch)

    def ran() -> None:
        assert gluon_mla and gluon_mla[-1].get("fold"), gluon_mla

    compiled_gives_eager_bits(check_graph_replays(replace(_BASE, block_size=64), ran))
    assert any(paired_binaries())


@gpu_tier
@pytest.mark.parametrize("heads", [128, 16])
@pytest.mark.parametrize("sms", ["one_sm", "all_sms"])
def test_gluon_mla_graph_and_compile_cuda(sms: str, heads: int, gluon_mla, monkeypatch) -> None:
    """Captured once under sync-debug "error" and replayed on new lengths, unsplit and split (the
    workspace allocated in the graph); the public op under torch.compile(fullgraph=True) gives
    the eager bits."""
    if sms == "one_sm":
        one_sm(monkeypatch)

    def ran() -> None:
        assert gluon_mla, "the Gluon MLA kernel did not run"

    compiled_gives_eager_bits(check_graph_replays(replace(_BASE, num_heads=heads), ran))


def compiled_gives_eager_bits(static: MlaBatch) -> None:
    """The public op on ``static``'s tensors under torch.compile(fullgraph=True) gives the bits of
    its eager call."""
    from torch._inductor.utils import fresh_inductor_cache

    def public(ql, qr, kv, bt, sl, qsl):
        return torch_paged_attn.mla_decode(ql, qr, kv, bt, sl, qsl, scale=static.scale)

    eager = public(*static.args())
    # compiled afresh: the variants of a test compile this closure on equal inputs, and Dynamo's
    # cache (on the code object, guarded on the inputs) would serve the second the first one's
    # plan, made under another SM count or rule (only the op's body reads them)
    torch._dynamo.reset()
    with fresh_inductor_cache():
        compiled = torch.compile(public, fullgraph=True)(*static.args())
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
