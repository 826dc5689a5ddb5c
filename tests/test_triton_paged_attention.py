"""The Triton paged attention kernels against the reference backend.

The truth is the reference evaluated on the float32 upcast of the query (the reference computes
in float32 whatever the input, and ``tests/test_reference.py`` checks it against a float64 loop);
the budget is the reference's own error in the working precision (``assert_close``). Outputs and
LSEs are poisoned with NaN before the kernel writes them; caches hold NaN in every slot no
sequence covers and garbage past each sequence's used blocks (``make_paged_batch``).

Two tiers: the interpreter tier (``TRITON_INTERPRET=1``, CPU tensors, tiny shapes, every feature
once) and the GPU tier (CUDA: the feature grid, a seeded fuzz of 2,000 configurations,
batch-invariant bitwise equality, CUDA-graph replay, no host synchronisation, planted bad block
ids, the public op under torch.compile).
"""

from __future__ import annotations

import contextlib
import os
import random
import zlib
from dataclasses import dataclass, replace

import pytest
import torch

pytest.importorskip("triton")

import _loop as loop  # noqa: E402
import torch_paged_attn  # noqa: E402  (registers the ops)
from torch_paged_attn import _config  # noqa: E402
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import _launch  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402
from torch_paged_attn.testing import PagedBatch, assert_close, make_paged_batch  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
interpreter_tier = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")

_SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


@dataclass(frozen=True)
class Case:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 32
    head_size_v: int | None = None
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16
    cache_dtype: torch.dtype | None = None
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    chunk: int = 0
    with_lse: bool = True
    pad_tokens: int = 0
    strided: str = ""  # "" | "cross_layer" (caches sliced from [NB, 2, ...]) | "hnd" (permuted)
    split_tokens: int | None = None  # force split-KV at multiples of this many keys
    hint: bool = False  # pass max_query_len = max(q_lens)
    max_query_len: int | None = None  # pass this hint instead (an extreme: 0, 2^31 - 1, ...)

    @property
    def id(self) -> str:
        b = len(self.q_lens)
        s = f"B{b}_q{max(self.q_lens, default=0)}_kv{max(self.kv_lens, default=0)}"
        s += f"_Hq{self.num_heads}_Hkv{self.num_kv_heads}_D{self.head_size}"
        if self.head_size_v is not None:
            s += f"_Dv{self.head_size_v}"
        s += f"_bs{self.block_size}_{_SHORT[self.dtype]}"
        if self.cache_dtype is not None:
            s += f"_{_SHORT[self.cache_dtype]}"
        s += "" if self.causal else "_noncausal"
        s += f"_win{self.window[0]}.{self.window[1]}" if self.window != (-1, -1) else ""
        s += f"_cap{self.softcap:g}" if self.softcap else ""
        s += "_alibi" if self.alibi else ""
        s += "_sinks" if self.sinks else ""
        s += f"_chunk{self.chunk}" if self.chunk else ""
        s += "" if self.with_lse else "_nolse"
        s += f"_pad{self.pad_tokens}" if self.pad_tokens else ""
        s += f"_{self.strided}" if self.strided else ""
        s += f"_split{self.split_tokens}" if self.split_tokens else ""
        s += f"_mql{self.max_query_len}" if self.max_query_len is not None else ""
        return s


def _strided_cache(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as a strided view: a layer of a cross-layer cache, or an HND permutation.
    Slots outside the view hold NaN, so a stride mistake shows."""
    nb, bs, h, d = cache.shape
    bits = cache.view(torch.uint8) if cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else cache
    if layout == "cross_layer":
        buf = torch.full((nb, 2, bs, h, d), float("nan"), dtype=bits.dtype, device=cache.device)
        if bits.dtype == torch.uint8:
            buf.fill_(0x7F)
        view = buf[:, 1]
    else:
        buf = torch.empty((nb, h, bs, d), dtype=bits.dtype, device=cache.device)
        view = buf.permute(0, 2, 1, 3)
    view.copy_(bits)
    return view.view(cache.dtype) if bits is not cache else view


def make_inputs(case: Case, device: str, seed: int) -> tuple[PagedBatch, dict]:
    batch = make_paged_batch(
        list(case.q_lens),
        list(case.kv_lens),
        num_heads=case.num_heads,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        head_size_v=case.head_size_v,
        block_size=case.block_size,
        dtype=case.dtype,
        cache_dtype=case.cache_dtype,
        device=device,
        pad_tokens=case.pad_tokens,
        seed=seed,
    )
    if case.strided:
        batch.key_cache = _strided_cache(batch.key_cache, case.strided)
        batch.value_cache = _strided_cache(batch.value_cache, case.strided)
    g = torch.Generator().manual_seed(seed + 1)
    options = dict(
        scale=float(0.5 + torch.rand(1, generator=g)) / case.head_size**0.5,
        causal=case.causal,
        window_left=case.window[0],
        window_right=case.window[1],
        softcap=case.softcap,
        alibi_slopes=(torch.rand(case.num_heads, generator=g) * 0.3).to(device) if case.alibi else None,
        sinks=(torch.randn(case.num_heads, generator=g) * 2).to(device) if case.sinks else None,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        attention_chunk_size=case.chunk,
    )
    return batch, options


def run_triton(batch: PagedBatch, options: dict, *, with_lse=True, strided_out=False, **kw):
    """The Triton backend into NaN-poisoned ``out`` / ``lse`` (``out`` optionally a strided view)."""
    t, hq, _ = batch.query.shape
    dv = batch.value_cache.shape[-1]
    pad = 24 if strided_out else 0
    out = torch.full((t, hq, dv + pad), float("nan"), dtype=batch.query.dtype, device=batch.query.device)
    out = out[..., pad:]
    lse = torch.full((t, hq), float("nan"), device=batch.query.device) if with_lse else None
    tpa.paged_attention(*batch.args(), out, lse, **options, **kw)
    return out, lse


def check_against_reference(batch: PagedBatch, options: dict, out, lse, dtype: torch.dtype) -> None:
    truth_out, truth_lse = reference.attention(batch.query.float(), *batch.args()[1:], **options)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out, truth_out, dtype=dtype, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, truth_lse, dtype=dtype, reference=ref_lse, name="lse")


def check_case(case: Case, device: str) -> None:
    seed = zlib.crc32(case.id.encode())
    batch, options = make_inputs(case, device, seed)
    if case.strided:  # a strided query/out too: a slice of a fused QKV projection
        t, hq, d = batch.query.shape
        wide = torch.full((t, hq, d + 8), float("nan"), dtype=case.dtype, device=device)
        wide[..., 8:] = batch.query
        batch.query = wide[..., 8:]
    hint = max(case.q_lens) if case.hint else -1
    hint = case.max_query_len if case.max_query_len is not None else hint
    out, lse = run_triton(
        batch,
        options,
        with_lse=case.with_lse,
        strided_out=bool(case.strided),
        max_query_len=hint,
        split_tokens=case.split_tokens,
    )
    check_against_reference(batch, options, out, lse, case.dtype)


# -- interpreter tier: tiny shapes, every feature at least once ------------------------------
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
BIG = 2**31 - 1  # what several frameworks pass for "no limit"
SMALL = [
    # mixed decode + prefill, padding rows, kv_len in {0, 1, BS-1, BS, BS+1}
    Case((1, 3, 1, 2, 0, 1), (15, 16, 17, 1, 0, 40), pad_tokens=3),
    Case((1, 1, 1), (150, 70, 200), split_tokens=64, hint=True),
    # query blocks whose visible range ends or starts one key off a tile edge (64 keys a tile
    # here), where the kernel switches between masked and unmasked tiles
    Case((3, 2, 5, 1), (129, 65, 260, 128)),
    Case((3,), (129,), window=(63, 2), causal=False, dtype=FP32),
    Case((5,), (129,), window=(200, 2), causal=False),
    Case((70,), (80,), num_heads=16, chunk=63, causal=False),  # 16 rows a block: p 10..25, chunk [0, 63)
    Case((64,), (129,), chunk=65, causal=False),  # p 65..128: chunk [65, 130)
    Case((3, 2, 5), (129, 66, 260), window=(61, 2), causal=False, chunk=64, dtype=FP32),
    Case((1, 1, 2), (150, 70, 200), split_tokens=64, sinks=True, softcap=5.0, alibi=True, dtype=FP16),
    Case((5, 2, 3), (150, 1, 2), causal=False, window=(7, 3), sinks=True, pad_tokens=2, dtype=FP32),
    Case((5, 9, 3), (150, 4, 200), window=(20, -1), split_tokens=64, with_lse=False),
    Case((6, 9, 3), (150, 4, 200), chunk=8, causal=False, dtype=FP32),
    Case((6, 9, 3), (150, 40, 200), chunk=32, split_tokens=64),
    Case((5, 9, 3), (150, 4, 200), block_size=24, num_heads=10, num_kv_heads=2, head_size=40, head_size_v=24),
    Case((1, 1), (100, 230), num_heads=8, num_kv_heads=1, head_size=64, block_size=8, split_tokens=64),
    Case((4, 1), (90, 130), num_heads=130, num_kv_heads=2, head_size=16, block_size=32),
    Case((4, 1, 2), (150, 9, 200), cache_dtype=torch.float8_e4m3fn, split_tokens=64, sinks=True),
    Case((3, 1), (70, 130), cache_dtype=torch.float8_e5m2, dtype=FP16, softcap=3.0),
    Case((3, 1, 2), (70, 130, 33), strided="cross_layer", split_tokens=64, pad_tokens=1),
    Case((3, 1), (70, 130), strided="hnd", block_size=24, dtype=FP16),
    # integer options at their extremes: 2^31 - 1 ("no limit" elsewhere) overflowed the kernel's
    # int32 position arithmetic (a causal mixed batch attended to nothing: 0 and -inf)
    Case((1, 3, 1, 2, 0, 1), (15, 16, 17, 1, 0, 40), window=(-1, BIG), pad_tokens=1, max_query_len=BIG),
    Case((3, 2, 5), (129, 66, 260), window=(BIG, BIG), chunk=BIG, causal=False, dtype=FP32, split_tokens=64,
         max_query_len=0),
    Case((6, 1, 2), (2, 9, 0), window=(0, BIG), chunk=BIG, causal=False, dtype=FP32),  # p < 0: chunk -1
]


@interpreter_tier
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_attention_interpreted(case: Case) -> None:
    check_case(case, "cpu")


def _bad_block_ids(batch: PagedBatch) -> None:
    """Plant ids outside ``[0, NB)`` in the used part of the block table, in place."""
    nb, bs = batch.key_cache.shape[:2]
    bad = (-1, nb, -(2**31), 2**31 - 1, nb + 1000)
    for i, n in enumerate(batch.kv_lens):
        used = -(-n // bs)
        if used:
            batch.block_table[i, (7 * i) % used] = bad[i % len(bad)]


def check_bad_block_ids(device: str, case: Case | None = None, splits=(None, 64), ran=None) -> None:
    """Ids outside ``[0, NB)`` planted in ``case``'s table (``_bad_block_ids``), run unsplit and
    split at each of ``splits``: finite outputs equal to the reference's; ``ran()`` (optional)
    checks which kernel took the calls."""
    case = case or Case((1, 3, 1, 2), (100, 50, 64, 7), block_size=8, sinks=True)
    batch, options = make_inputs(case, device, seed=11)
    _bad_block_ids(batch)
    for split in splits:
        out, lse = run_triton(batch, options, split_tokens=split)
        if ran is not None:
            ran()
        assert torch.isfinite(out).all() and not torch.isnan(lse).any()
        # the reference reads keys of bad blocks as not visible: the same defined answer
        check_against_reference(batch, options, out, lse, case.dtype)


@interpreter_tier
def test_bad_block_ids_interpreted() -> None:
    check_bad_block_ids("cpu")


def check_batch_invariance(device: str, sizes: tuple[int, ...], kv_len: int, max_other: int, split: int | None) -> None:
    """One decode sequence alone and at a random place among ``n - 1`` others, in batch-invariant
    mode (``split``: its split size, forced small in the interpreter): the same bits."""
    kw = dict(num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=BF16, device=device)
    rng = random.Random(3)
    outs = []
    for n in (1,) + sizes:
        at = rng.randrange(n)
        kv_lens = [rng.randrange(1, max_other) for _ in range(n)]
        kv_lens[at] = kv_len
        batch = make_paged_batch([1] * n, kv_lens, seed=100 + n, **kw)
        alone = make_paged_batch([1], [kv_len], seed=7, **kw)  # the sequence's own values
        batch.query[at] = alone.query[0]
        for cache, src in ((batch.key_cache, alone.key_cache), (batch.value_cache, alone.value_cache)):
            for b in range(-(-kv_len // 16)):
                cache[batch.block_table[at, b]] = src[alone.block_table[0, b]]
        options = dict(scale=0.125, causal=True, window_left=-1, window_right=-1, softcap=0.0,
                       alibi_slopes=None, sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
        with _config.batch_invariant():
            out, lse = run_triton(batch, options, max_query_len=1, split_tokens=split)
        outs.append((out[at], lse[at]))
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])


@interpreter_tier
def test_batch_invariant_interpreted() -> None:
    check_batch_invariance("cpu", (3,), kv_len=300, max_other=400, split=128)


@interpreter_tier
def test_batch_invariant_across_merge_paths_interpreted(monkeypatch) -> None:
    """With 4 SMs (8 resident programs of this tile): alone, the sequence's splits go through
    the workspace and the combine kernel; among 5 (10 programs, which fill the slots) each
    program merges its own splits. The same bits either way."""
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 4)
    tile = tpa._DECODE_CONFIGS[64]
    assert tpa._fills_slots(5 * 2, torch.device("cpu"), tile[4])  # 5 sequences x 2 kv heads
    assert not tpa._fills_slots(1 * 2, torch.device("cpu"), tile[4])
    check_batch_invariance("cpu", (5,), kv_len=300, max_other=400, split=128)


def check_long_sequences_split_finer(device: str, split: int, long_split: int, long_from: int, kv_len: int,
                                     max_other: int, sizes: tuple[int, ...]) -> None:
    """Batch-invariant mode splits a sequence longer than ``long_from`` keys at multiples of
    ``long_split`` (shorter ones at ``split``): a long sequence alone gives the bits of a forced
    ``long_split`` split, equals the reference, and keeps its bits beside short sequences."""
    assert kv_len > long_from >= max_other
    kw = dict(num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=BF16, device=device)
    alone = make_paged_batch([1], [kv_len], seed=7, **kw)
    options = dict(scale=0.125, causal=True, window_left=-1, window_right=-1, softcap=0.0,
                   alibi_slopes=None, sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    with _config.batch_invariant():
        out, lse = run_triton(alone, options, max_query_len=1)
        forced_out, forced_lse = run_triton(alone, options, max_query_len=1, split_tokens=long_split)
        coarse_out, _ = run_triton(alone, options, max_query_len=1, split_tokens=split)
    assert torch.equal(out, forced_out) and torch.equal(lse, forced_lse)
    assert not torch.equal(out, coarse_out)  # the finer rule is what ran (the sums differ in rounding)
    check_against_reference(alone, options, out, lse, BF16)
    check_batch_invariance(device, sizes, kv_len=kv_len, max_other=max_other, split=None)


@interpreter_tier
def test_batch_invariant_long_sequences_interpreted(monkeypatch) -> None:
    monkeypatch.setattr(tpa, "_INVARIANT_SPLIT_TOKENS", 512)
    monkeypatch.setattr(tpa, "_INVARIANT_LONG_SPLIT_TOKENS", 256)
    monkeypatch.setattr(tpa, "_INVARIANT_LONG_FROM", 600)
    check_long_sequences_split_finer("cpu", 512, 256, 600, kv_len=1500, max_other=500, sizes=(3,))


def test_busy_query_blocks_bound_every_layout() -> None:
    """The split plan's count of query blocks that hold a token is an upper bound for every batch
    the shapes and the ``max_query_len`` hint allow (counted the way the kernel assigns blocks:
    ``cdiv(q_len, BLOCK_Q)`` per sequence), and exact for uniform batches with or without it."""
    rng = random.Random(7)
    for _ in range(2000):
        num_seqs, block_q, hint = rng.randint(1, 40), rng.choice((1, 2, 4, 8, 16)), rng.randint(1, 40)
        q_lens = [rng.randint(0, hint) for _ in range(num_seqs)]
        num_tokens = sum(q_lens)
        if num_tokens == 0:
            continue
        used = sum(-(-q // block_q) for q in q_lens)
        assert used <= tpa._busy_q_blocks(num_tokens, num_seqs, block_q, hint)
        assert 1 <= tpa._busy_q_blocks(num_tokens, num_seqs, block_q, -1) <= num_tokens  # no hint
    for num_seqs, q_len, block_q in ((64, 2, 2), (64, 2, 4), (8, 5, 4), (3, 1, 1), (64, 1, 4)):
        exact = num_seqs * -(-q_len // block_q)
        for hint in (q_len, -1):
            assert tpa._busy_q_blocks(num_seqs * q_len, num_seqs, block_q, hint) == exact


def check_merge_paths_bitwise(device: str, case: Case, monkeypatch) -> None:
    """Split-KV through the workspace and the combine kernel, and the same splits merged inside
    each program (what large batches do in batch-invariant mode): the same bits."""
    batch, options = make_inputs(case, device, seed=21)
    out_a, lse_a = run_triton(batch, options, split_tokens=case.split_tokens)
    monkeypatch.setattr(tpa, "_WORKSPACE_BYTES", 0)
    out_b, lse_b = run_triton(batch, options, split_tokens=case.split_tokens)
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
    check_against_reference(batch, options, out_b, lse_b, case.dtype)


@interpreter_tier
def test_merge_paths_bitwise_interpreted(monkeypatch) -> None:
    case = Case((1, 2, 1), (300, 200, 5), sinks=True, split_tokens=64, dtype=FP16)
    check_merge_paths_bitwise("cpu", case, monkeypatch)


@interpreter_tier
@pytest.mark.parametrize("case", [
    # a window whose first key falls inside a later split (the key loop starts mid-split): decode
    # (tiles of 256 keys, splits of 2) and prefill (tiles of 64, splits of 2)
    Case((1, 1, 1), (2500, 700, 65), window=(1100, 0), split_tokens=512),
    Case((3, 17, 1), (300, 260, 40), window=(70, 5), split_tokens=128, sinks=True),
    # chunked attention: each query block's keys start at its chunk, some splits without keys
    Case((2, 9), (290, 200), chunk=40, split_tokens=128, dtype=FP16),
    # every row masked in some splits (causal prefill over few keys), fp8 cache, splits of one tile
    Case((5, 1), (5, 250), split_tokens=16, cache_dtype=torch.float8_e4m3fn),
    # non-causal, softcap, ALiBi, no LSE
    Case((4, 1), (180, 333), causal=False, softcap=20.0, alibi=True, with_lse=False, split_tokens=128),
], ids=lambda c: c.id)
def test_merge_paths_bitwise_key_ranges_interpreted(case: Case, monkeypatch) -> None:
    """A program that merges its sequence's splits itself does so in its one key loop, at the
    split ends (``_attention_kernel``): the same bits as the workspace and the combine kernel
    where the loop starts inside a split (windows, chunks), where splits have no visible key, and
    with splits of one tile; and both match the float64 loop."""
    check_merge_paths_bitwise("cpu", case, monkeypatch)


def combine_settings(*levels, few_load_splits: int | None = None) -> list[dict]:
    """Plans of the combine kernel to compare: for each of ``levels``, at least that many programs
    (``_COMBINE_MIN_PROGRAMS``; 1: the blocking of large batches, whole rows of 512 // Dv heads;
    None: the device's SM count); then, with ``few_load_splits``, the last level loading that many
    partials an iteration (``_COMBINE_FEW_LOAD_SPLITS``)."""
    settings = [dict(_COMBINE_MIN_PROGRAMS=level, _COMBINE_FEW_LOAD_SPLITS=tpa._COMBINE_FEW_LOAD_SPLITS)
                for level in levels]
    if few_load_splits is not None:
        settings.append(dict(settings[-1], _COMBINE_FEW_LOAD_SPLITS=few_load_splits))
    return settings


def recorded_combines(monkeypatch, module) -> list[tuple]:
    """The combine launches ``module`` plans from now on, as ``(grid, BLOCK_H, DV_BLOCK,
    LOAD_SPLITS, num_warps)`` (the launches themselves run)."""
    launched = []

    def recording(kernel, grid, **constants):
        if kernel is tpa._combine_kernel:
            launched.append((grid, *(constants[k] for k in ("BLOCK_H", "DV_BLOCK", "LOAD_SPLITS", "num_warps"))))
        return _launch.launcher(kernel, grid, **constants)

    monkeypatch.setattr(module, "launcher", recording)
    return launched


def check_combine_blockings(device: str, case: Case, monkeypatch, settings: list[dict], **kw) -> list[tuple]:
    """Split-KV ``case`` with the combine kernel planned under each of ``settings``
    (``combine_settings``): every plan gives the same bits, which match the float64 loop on the
    CPU (the reference on the float32 upcast on a GPU, where the loop is too slow). Returns each
    run's combine launch (``recorded_combines``)."""
    launched = recorded_combines(monkeypatch, tpa)
    batch, options = make_inputs(case, device, seed=zlib.crc32(case.id.encode()))
    results = []
    for setting in settings:
        for name, value in setting.items():
            monkeypatch.setattr(tpa, name, value)
        results.append(run_triton(batch, options, split_tokens=case.split_tokens, **kw))
    assert len(launched) == len(settings), "a call did not run the combine kernel"
    out, lse = results[0]
    for other_out, other_lse in results[1:]:
        assert torch.equal(other_out, out) and torch.equal(other_lse, lse)
    if device == "cpu":
        truth_out, truth_lse = loop.paged_attention(*batch.args(), **options)
        ref_out, ref_lse = reference.attention(*batch.args(), **options)
        assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="out")
        assert_close(lse, truth_lse, dtype=case.dtype, reference=ref_lse, name="lse")
    else:
        check_against_reference(batch, options, out, lse, case.dtype)
    return launched


def decode_grid_orders(monkeypatch, case: Case, max_grid_y: int | None = None, **kw) -> list[tuple]:
    """``case`` on the CPU with the decode grid "queries" and then "heads" (``_DECODE_GRID``; grid
    axis 1 capped at ``max_grid_y``): the ``(grid, HEADS_FASTEST)`` of each attention launch. The
    two orders give the same bits, which match the float64 loop."""
    if max_grid_y is not None:
        monkeypatch.setattr(tpa, "_MAX_GRID_Y", max_grid_y)
    launched = []

    def recording(kernel, grid, **constants):
        if kernel is tpa._attention_kernel:
            launched.append((grid, constants["HEADS_FASTEST"]))
        return _launch.launcher(kernel, grid, **constants)

    monkeypatch.setattr(tpa, "launcher", recording)
    batch, options = make_inputs(case, "cpu", seed=zlib.crc32(case.id.encode()))
    results = []
    for order in ("queries", "heads"):
        monkeypatch.setattr(tpa, "_DECODE_GRID", order)
        results.append(run_triton(batch, options, split_tokens=case.split_tokens, **kw))
    (out, lse), (out_h, lse_h) = results
    assert torch.equal(out_h, out) and torch.equal(lse_h, lse)
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **options)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out_h, truth_out, dtype=case.dtype, reference=ref_out, name="out")
    assert_close(lse_h, truth_lse, dtype=case.dtype, reference=ref_lse, name="lse")
    return launched


@interpreter_tier
def test_decode_grid_orders_interpreted(monkeypatch) -> None:
    """Decode with the kv heads on grid axis 0 ("heads") gives the bits of the query blocks there
    and matches the loop: a padding row and sinks; split-KV through the workspace; two head groups
    a kv head (Hq/Hkv 80 > 64); batch-invariant mode. Prefill-like calls keep the query blocks on
    axis 0. A program holds 16 // (Hq/Hkv) tokens (BLOCK_Q), so a batch of B decode tokens and P
    padding rows has (B + P) // BLOCK_Q + B + 1 query blocks."""
    for case, grid in ((Case((1, 1, 1), (70, 17, 40), num_heads=4, num_kv_heads=2, sinks=True, pad_tokens=1,
                             dtype=FP16), (4 // 8 + 3 + 1, 2, 1)),
                       (Case((1, 1), (40, 33), num_heads=160, num_kv_heads=2, head_size=16), (2 + 2 + 1, 4, 1))):
        assert decode_grid_orders(monkeypatch, case, max_query_len=1) == [
            (grid, False), ((grid[1], grid[0], grid[2]), True)], case.id
    # split-KV through the workspace: the splits stay on axis 2
    split = Case((1, 1), (300, 9), num_heads=6, num_kv_heads=3, head_size=128, split_tokens=128)
    (grid, fastest), (grid_h, fastest_h) = decode_grid_orders(monkeypatch, split, max_query_len=1)
    assert grid[:2] == (2 // 8 + 2 + 1, 3) and grid[2] >= 3 and grid_h == (grid[1], grid[0], grid[2])
    assert (fastest, fastest_h) == (False, True)
    with _config.batch_invariant():
        launched = decode_grid_orders(monkeypatch, Case((1, 1), (50, 20)), max_query_len=1)
    assert [fastest for _, fastest in launched] == [False, True]
    prefill = decode_grid_orders(monkeypatch, Case((3, 2), (40, 20)), max_query_len=3)
    assert [fastest for _, fastest in prefill] == [False, False] and prefill[0][0] == prefill[1][0]


@interpreter_tier
def test_decode_grid_axis_limit_interpreted(monkeypatch) -> None:
    """"heads" puts the query blocks on grid axis 1: at most _MAX_GRID_Y of them, else the
    planner keeps them on axis 0 (B3 decode at 2 tokens a program: 3 // 2 + 3 + 1 query blocks)."""
    case = Case((1, 1, 1), (30, 17, 5), num_heads=16, num_kv_heads=2)
    assert decode_grid_orders(monkeypatch, case, max_grid_y=5, max_query_len=1) == [
        ((5, 2, 1), False), ((2, 5, 1), True)]
    assert decode_grid_orders(monkeypatch, case, max_grid_y=4, max_query_len=1) == [
        ((5, 2, 1), False), ((5, 2, 1), False)]


def test_decode_grid_axis_limit_planned(monkeypatch) -> None:
    """CUDA's 65535 on grid axis 1, planned on meta tensors: B decode sequences at 8 tokens a
    program (Hq/Hkv 2) have B // 8 + B + 1 query blocks, 65535 at B = 58253 (the kv heads first)
    and 65536 at B = 58254 (the query blocks first)."""
    launched = []
    monkeypatch.setattr(tpa, "launcher", lambda kernel, grid, **constants: (
        lambda like, **tensors: launched.append((grid, constants["HEADS_FASTEST"]))
        if kernel is tpa._attention_kernel else None))
    meta = dict(device="meta")
    for b in (58253, 58254):
        cache = torch.empty(4, 16, 2, 32, dtype=BF16, **meta)
        tpa.paged_attention(
            torch.empty(b, 4, 32, dtype=BF16, **meta), cache, cache, torch.empty(b, 1, dtype=torch.int32, **meta),
            torch.empty(b, dtype=torch.int32, **meta), torch.empty(b + 1, dtype=torch.int32, **meta),
            torch.empty(b, 4, 32, dtype=BF16, **meta), None, scale=0.1, causal=True, window_left=-1,
            window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, k_scale=None, v_scale=None,
            attention_chunk_size=0, max_query_len=1,
        )
    assert launched == [((2, 65535, 1), True), ((65536, 2, 1), False)]


@interpreter_tier
def test_combine_blockings_bitwise_interpreted(monkeypatch) -> None:
    """The combine kernel at the blocking of large batches (4 partials an iteration), with one
    head and whole rows a program (8 partials an iteration), and with one head and 32 value columns a program (Dv 96 padded to 128: the
    last column block is all padding) loading 8 partials an iteration (one iteration) and 4 (two):
    the same bits. Decode of 3 sequences with 5, 2 and 1 splits (two merge groups, the second
    with 3 empty partials; one group; one split), sinks, a padding row."""
    case = Case((1, 1, 1), (600, 130, 5), num_heads=4, num_kv_heads=2, head_size=32, head_size_v=96,
                split_tokens=128, sinks=True, pad_tokens=1, dtype=FP16)
    settings = combine_settings(1, 9, 10**9, few_load_splits=4)
    launched = check_combine_blockings("cpu", case, monkeypatch, settings, max_query_len=1)
    assert launched == [((4, 1, 1), 4, 128, 4, 4), ((4, 4, 1), 1, 128, 8, 4), ((4, 4, 4), 1, 32, 8, 1),
                        ((4, 4, 4), 1, 32, 4, 1)]


@interpreter_tier
def test_combine_blockings_batch_invariant_interpreted(monkeypatch) -> None:
    """Batch-invariant mode stays invariant when the combine blocking depends on the batch: a
    sequence alone (2 programs of 2 heads, up to 16 partials an iteration) and among 3 (3
    programs of whole rows, 4 partials an iteration) gives the same bits."""
    monkeypatch.setattr(tpa, "_COMBINE_MIN_PROGRAMS", 3)
    launched = recorded_combines(monkeypatch, tpa)
    check_batch_invariance("cpu", (3,), kv_len=600, max_other=400, split=128)
    assert [launch[:3] for launch in launched] == [((1, 4, 1), 2, 64), ((3, 1, 1), 8, 64)]


@gpu_tier
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_combine_blockings_bitwise_b1_cuda(dtype, monkeypatch) -> None:
    """B1 x 32768 (Hq 32, Hkv 8, D 128, the planner's own splits, as the benchmark's decode_B1):
    the combine blocking of large batches and the device's own (one head, 32 columns a program
    on 132 SMs) give the same bits and match the reference; also with an fp8 cache and sinks."""
    for case in (Case((1,), (32768,), num_heads=32, num_kv_heads=8, head_size=128, dtype=dtype),
                 Case((1,), (32768,), num_heads=32, num_kv_heads=8, head_size=128, dtype=dtype,
                      cache_dtype=torch.float8_e4m3fn, sinks=True)):
        launched = check_combine_blockings("cuda", case, monkeypatch, combine_settings(1, None), max_query_len=1)
        (grid, *_), (fine_grid, *_, load_splits, _) = launched
        assert grid == (1, 8, 1)
        assert fine_grid[0] * fine_grid[1] * fine_grid[2] >= min(tpa._num_sms(torch.device("cuda")), 128)
        assert load_splits == tpa._COMBINE_FEW_LOAD_SPLITS


@interpreter_tier
def test_strided_caches_bitwise_interpreted() -> None:
    check_strided_bitwise("cpu", Case((2, 1), (70, 100), split_tokens=64))
    check_strided_bitwise("cpu", Case((3, 1), (10, 16), dtype=FP16))  # one block a table row


def check_nan_scale(device: str, case: Case) -> None:
    """A NaN k_scale: NaN out and lse for every row that sees a key; a NaN v_scale: NaN out for
    them (the lse depends on scores only, and stays the reference's); rows without a key keep 0
    and -inf. With and without split-KV."""
    for which in ("k_scale", "v_scale"):
        batch, options = make_inputs(case, device, seed=17)
        options[which] = torch.full((1,), float("nan"), device=device)
        ref_out, ref_lse = reference.attention(*batch.args(), **options)
        sees = ref_out.isnan().any(-1).any(-1)
        assert sees.any() and not sees.all()
        for split in (None, 64):
            out, lse = run_triton(batch, options, split_tokens=split)
            assert torch.equal(out.isnan(), ref_out.isnan()), (which, split)
            assert torch.equal(lse.isnan(), ref_lse.isnan()), (which, split)
            assert torch.equal(out[~sees], torch.zeros_like(out[~sees]))
            assert (lse[~sees] == float("-inf")).all()
            if which == "v_scale":
                truth_lse = reference.attention(batch.query.float(), *batch.args()[1:], **options)[1]
                assert_close(lse, truth_lse, dtype=case.dtype, reference=ref_lse, name="lse")


@interpreter_tier
def test_nan_scale_interpreted() -> None:
    check_nan_scale("cpu", Case((1, 3, 0, 2), (70, 9, 5, 0), cache_dtype=torch.float8_e4m3fn, pad_tokens=1))


def check_strided_bitwise(device: str, case: Case) -> None:
    """Caches as strided views give the bits of the contiguous case."""
    batch, options = make_inputs(case, device, seed=5)
    out, lse = run_triton(batch, options, split_tokens=case.split_tokens)
    for layout in ("cross_layer", "hnd"):
        batch.key_cache = _strided_cache(batch.key_cache.contiguous(), layout)
        batch.value_cache = _strided_cache(batch.value_cache.contiguous(), layout)
        out_s, lse_s = run_triton(batch, options, split_tokens=case.split_tokens)
        assert torch.equal(out, out_s) and torch.equal(lse, lse_s), layout


@interpreter_tier
def test_softcap_huge_scores_interpreted() -> None:
    """Raw scores of about +-1e4 with cap 50 stay finite (tanh form cannot overflow)."""
    case = Case((2, 1), (40, 60), softcap=50.0, dtype=FP32)
    batch, options = make_inputs(case, "cpu", seed=9)
    options["scale"] = 2000.0  # q.k has a standard deviation of about 5.7 at D = 32
    out, lse = run_triton(batch, options)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    check_against_reference(batch, options, out, lse, FP32)


def check_fp8_query_magnitudes(device: str, head_size: int, q_lens=(1, 3, 1)) -> None:
    """bf16 queries far outside fp16's range (2^30) and near its floor (2^-30) over an fp8 cache:
    the kernel's fp16 dots rescale the query tile by a power of two, so the result is the
    reference's; the softmax scale compensates, keeping scores of order one."""
    for cache_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        case = Case(q_lens, (70, 40, 130), head_size=head_size, cache_dtype=cache_dtype)
        batch, options = make_inputs(case, device, seed=13)
        for factor in (2.0**30, 2.0**-30):
            batch.query = batch.query * factor
            scaled = dict(options, scale=options["scale"] / factor)
            for split in (None, 64):
                out, lse = run_triton(batch, scaled, split_tokens=split)
                check_against_reference(batch, scaled, out, lse, BF16)
            batch.query = batch.query / factor


@interpreter_tier
def test_fp8_query_magnitudes_interpreted() -> None:
    check_fp8_query_magnitudes("cpu", 32)


# -- the scores' dot batched over the warps (SCORE_WARPS; the fp8 decode tile's default) ---------
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BATCHED = [
    # the fp8 decode tile (D 128): kv_len 0, 1 key, one tile; scales other than 1
    Case((1, 1, 1, 1), (300, 129, 1, 0), num_heads=8, num_kv_heads=2, head_size=128, cache_dtype=E4M3, sinks=True),
    Case((1, 1, 1), (300, 2, 128), num_heads=16, num_kv_heads=2, head_size=128, cache_dtype=E5M2, dtype=FP16,
         softcap=3.0, split_tokens=128),
    Case((1, 1), (260, 77), num_heads=4, num_kv_heads=4, head_size=128, cache_dtype=E4M3, dtype=FP32,
         window=(100, 0), with_lse=False),
    # the other decode tiles batched too (64 keys a warp): every position rule and score option
    Case((1, 1), (300, 40), num_heads=4, num_kv_heads=1, head_size=64, alibi=True, sinks=True, dtype=FP16,
         window=(50, 0)),
    Case((1, 1, 1), (600, 15, 140), num_heads=2, num_kv_heads=2, head_size=32, chunk=100, causal=False,
         dtype=FP32, hint=True, split_tokens=256),
    Case((1, 1), (200, 33), num_heads=4, num_kv_heads=1, head_size=64, block_size=8, strided="hnd",
         split_tokens=256, with_lse=False),
    Case((1, 1), (300, 64), num_heads=4, num_kv_heads=4, head_size=40, head_size_v=24, block_size=64,
         window=(-1, 3), causal=False, hint=True),
]


@contextlib.contextmanager
def batched_scores(monkeypatch, every_tile: bool = False):
    """Inside the block, every plan must batch its scores over 4 warps (``_score_warps``' answers
    are recorded and checked at the end, at least one plan made); ``every_tile``: the bf16 tiles'
    switch (``_DECODE_BATCHED_SCORES``) turned on beside the fp8 tile's."""
    if every_tile:
        monkeypatch.setattr(tpa, "_DECODE_BATCHED_SCORES", True)
    chosen: list[int] = []
    real = tpa._score_warps
    monkeypatch.setattr(tpa, "_score_warps", lambda *a: chosen.append(real(*a)) or chosen[-1])
    yield
    assert chosen and set(chosen) == {4}, chosen


def check_batched_scores(case: Case, device: str, monkeypatch) -> None:
    """Every decode tile with its scores' dot batched over the warps (the bf16 tiles' switch
    turned on beside the fp8 tile's): the float64 loop's answer; with planted bad block ids, split
    both ways."""
    with batched_scores(monkeypatch, every_tile=True):
        check_case(case, device)
    check_bad_block_ids(device, case, splits=(None, 128))


@interpreter_tier
@pytest.mark.parametrize("case", BATCHED, ids=lambda c: c.id)
def test_batched_scores_interpreted(case: Case, monkeypatch) -> None:
    check_batched_scores(case, "cpu", monkeypatch)


def check_batched_scores_bitwise(device: str, monkeypatch, cases) -> None:
    """With batched scores, the splits merged inside each program give the bits of the workspace
    and the combine kernel, including a window whose first key falls inside a later split."""
    with batched_scores(monkeypatch, every_tile=True):
        for case in cases:
            with monkeypatch.context() as m:
                check_merge_paths_bitwise(device, case, m)


@interpreter_tier
def test_batched_scores_merge_paths_bitwise_interpreted(monkeypatch) -> None:
    check_batched_scores_bitwise("cpu", monkeypatch, [
        Case((1, 1, 1), (700, 300, 5), num_heads=8, num_kv_heads=2, head_size=128, cache_dtype=E4M3, sinks=True,
             split_tokens=256),
        Case((1, 1, 1), (1300, 700, 65), head_size=64, window=(600, 0), split_tokens=256, dtype=FP16),
    ])


@interpreter_tier
def test_batched_scores_batch_invariant_interpreted(monkeypatch) -> None:
    with batched_scores(monkeypatch, every_tile=True):
        check_batch_invariance("cpu", (3,), kv_len=600, max_other=700, split=256)


@interpreter_tier
def test_batched_scores_nan_scale_interpreted(monkeypatch) -> None:
    with batched_scores(monkeypatch):
        check_nan_scale("cpu", Case((1, 1, 1, 1), (200, 9, 5, 0), num_heads=8, num_kv_heads=2, head_size=128,
                                    cache_dtype=E4M3, hint=True))


@interpreter_tier
def test_fp8_query_magnitudes_batched_scores_interpreted(monkeypatch) -> None:
    """The batched dot's query tile is rescaled in bf16 on the GPU (exact: a power of two), in
    float32 in the interpreter; either way queries of 2^30 and 2^-30 give the reference's answer."""
    with batched_scores(monkeypatch):
        check_fp8_query_magnitudes("cpu", 128, q_lens=(1, 1, 1))


@interpreter_tier
def test_batched_scores_prefill_tokens_batch_invariant_interpreted(monkeypatch) -> None:
    """Batch-invariant mode runs prefill tokens through the decode tile too: several tokens a
    16-row block (4 tokens x 4 heads here), causal within the block, with the scores batched."""
    with batched_scores(monkeypatch), _config.batch_invariant():
        check_case(Case((3, 1, 5, 0), (200, 70, 130, 9), num_heads=8, num_kv_heads=2, head_size=128,
                        cache_dtype=E4M3, sinks=True, pad_tokens=2), "cpu")


def test_score_warps_planned() -> None:
    """Batched where the fp8 decode tile is (its warps, on 16 rows); one dot for the bf16 tiles,
    prefill, wider row blocks, or fewer than 16 keys a warp."""
    g = tpa._score_warps
    assert tpa._FP8_DECODE_BATCHED_SCORES and not tpa._DECODE_BATCHED_SCORES
    assert g(True, True, 16, 128, 4) == 4
    assert g(True, False, 16, 128, 4) == 1  # bf16 decode (the default)
    assert g(False, True, 16, 128, 4) == 1  # prefill
    assert g(True, True, 32, 128, 4) == 1  # 32 query heads a kv head: 32 rows
    assert g(True, True, 16, 32, 4) == 1  # 8 keys a warp
    assert g(True, True, 16, 128, 8) == 8


# -- GPU tier ----------------------------------------------------------------------------------
_MIXED = dict(q_lens=(1, 17, 1, 0, 5, 1), kv_lens=(1000, 300, 17, 0, 5, 333))
_DECODE = dict(q_lens=(1, 1, 1, 1, 1), kv_lens=(1023, 1, 16, 700, 2100))


def _grid() -> list[Case]:
    base = Case(**_MIXED, num_heads=8, num_kv_heads=2, head_size=128)
    cases = []
    for d in (64, 80, 96, 112, 128, 192, 256):
        cases += [replace(base, head_size=d), replace(base, **_DECODE, head_size=d, hint=True)]
    for bs in (8, 16, 24, 32, 64, 128):
        cases += [replace(base, block_size=bs), replace(base, **_DECODE, block_size=bs, split_tokens=256)]
    for hq, hkv in ((4, 4), (8, 2), (10, 2), (12, 2), (16, 2), (64, 1), (128, 1)):
        heads = dict(num_heads=hq, num_kv_heads=hkv)
        cases += [replace(base, **heads), replace(base, **_DECODE, **heads)]
    for dtype in (BF16, FP16, FP32):
        cases += [replace(base, dtype=dtype), replace(base, **_DECODE, dtype=dtype, split_tokens=128)]
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    for dtype, cache in ((BF16, e4m3), (FP16, e4m3), (BF16, e5m2), (FP32, e5m2)):
        dtypes = dict(dtype=dtype, cache_dtype=cache)
        cases += [replace(base, **dtypes), replace(base, **_DECODE, **dtypes)]
    for d, dv in ((128, 64), (64, 128), (192, 128), (96, 256)):
        sizes = dict(head_size=d, head_size_v=dv)
        cases += [replace(base, **sizes), replace(base, **_DECODE, **sizes, split_tokens=64)]
    features = [
        dict(causal=False),
        dict(window=(127, 0)),
        dict(window=(64, 16), causal=False),
        dict(window=(-1, 5), causal=False),
        dict(softcap=30.0),
        dict(alibi=True),
        dict(sinks=True),
        dict(chunk=256),
        dict(chunk=48, causal=False),
        dict(with_lse=False),
        dict(pad_tokens=5),
        dict(sinks=True, softcap=20.0, alibi=True, window=(200, 0), pad_tokens=2),
        dict(strided="cross_layer"),
        dict(strided="hnd", cache_dtype=torch.float8_e4m3fn),
    ]
    for f in features:
        cases += [replace(base, **f), replace(base, **_DECODE, **f, split_tokens=128)]
    return cases


GRID = _grid()


@gpu_tier
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_attention_cuda(case: Case) -> None:
    check_case(case, "cuda")


_FUZZ_FAMILIES = 40
_FUZZ_DRAWS = 50  # 40 x 50 = 2,000 configurations


def _fuzz_family(rng: random.Random) -> dict:
    """The compile-time part of a configuration (dtypes, sizes, feature flags)."""
    d = rng.choice((64, 80, 128, 128, 256))
    dtype = rng.choice((BF16, BF16, FP16, FP32))
    return dict(
        head_size=d,
        head_size_v=rng.choice((None, None, None, 64, 128)),
        block_size=rng.choice((8, 16, 16, 24, 32, 64, 128)),
        num_kv_heads=rng.choice((1, 2)),
        group=rng.choice((1, 4, 5, 8)),
        dtype=dtype,
        cache_dtype=rng.choice((None, None, torch.float8_e4m3fn, torch.float8_e5m2)),
        causal=rng.random() < 0.7,
        window=rng.random() < 0.3,
        softcap=rng.random() < 0.25,
        alibi=rng.random() < 0.25,
        sinks=rng.random() < 0.3,
        chunk=rng.random() < 0.2,
        with_lse=rng.random() < 0.8,
        decode=rng.random() < 0.4,
        split=rng.choice((None, None, 64, 512)),
    )


def _fuzz_case(f: dict, rng: random.Random) -> Case:
    """A random batch for a family: lengths 0 and 1, around block edges, windows, chunks."""
    bs = f["block_size"]
    b = rng.randint(1, 8)
    edge = lambda: rng.choice((0, 1, bs - 1, bs, bs + 1, rng.randint(0, 700), rng.randint(0, 60)))  # noqa: E731
    kv_lens = tuple(edge() for _ in range(b))
    if f["decode"]:
        q_lens = tuple(1 for _ in range(b))
    else:
        q_lens = tuple(rng.choice((0, 1, 1, rng.randint(1, 40))) for _ in range(b))
    if f["causal"] and rng.random() < 0.9:  # mostly q_len <= seq_len, as a serving engine has it
        q_lens = tuple(min(q, k) for q, k in zip(q_lens, kv_lens))
    window = (-1, -1)
    if f["window"]:
        window = (rng.choice((-1, 0, rng.randint(0, 300))), rng.choice((-1, 0, rng.randint(0, 40))))
    return Case(
        q_lens=q_lens,
        kv_lens=kv_lens,
        num_heads=f["num_kv_heads"] * f["group"],
        num_kv_heads=f["num_kv_heads"],
        head_size=f["head_size"],
        head_size_v=f["head_size_v"],
        block_size=bs,
        dtype=f["dtype"],
        cache_dtype=f["cache_dtype"],
        causal=f["causal"],
        window=window,
        softcap=rng.uniform(1.0, 50.0) if f["softcap"] else 0.0,
        alibi=f["alibi"],
        sinks=f["sinks"],
        chunk=rng.choice((8, 16, 40, 128, 300)) if f["chunk"] else 0,
        with_lse=f["with_lse"],
        pad_tokens=rng.choice((0, 0, 1, 7)),
        split_tokens=f["split"],
        hint=rng.random() < 0.5,
    )


def _with_extremes(case: Case, f: dict, rng: random.Random) -> Case:
    """Integer options at their extremes (1, 2^31 - 1, past every sequence; hints 0, 2^31 - 1
    and past the batch), drawn from a generator of their own so that ``_fuzz_case``'s draws
    stay those of earlier runs."""
    far = (1, BIG, BIG, 10**6)
    window, chunk, hint = case.window, case.chunk, None
    if f["window"] and rng.random() < 0.3:
        window = tuple(rng.choice(far) if rng.random() < 0.6 else w for w in window)
    if f["chunk"] and rng.random() < 0.3:
        chunk = rng.choice(far)
    if rng.random() < 0.15:
        hint = rng.choice((0, BIG, sum(case.q_lens) + 5))
    return replace(case, window=window, chunk=chunk, max_query_len=hint)


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(_FUZZ_FAMILIES))
def test_attention_fuzz_cuda(family: int) -> None:
    """Seeds 0..1999: family ``f`` draws configurations ``50 f .. 50 f + 49``; about one in six
    also takes integer options at their extremes (``_with_extremes``, its own generator)."""
    rng = random.Random(family)
    f = _fuzz_family(rng)
    for draw in range(_FUZZ_DRAWS):
        seed = family * _FUZZ_DRAWS + draw
        case = _with_extremes(_fuzz_case(f, random.Random(seed)), f, random.Random(10**9 + seed))
        try:
            check_case(case, "cuda")
        except AssertionError as e:
            raise AssertionError(f"fuzz seed {seed}: {case.id}: {e}") from e


BATCHED_CUDA = BATCHED + [
    Case((1,) * 6, (4100, 1, 16, 700, 2100, 0), num_heads=32, num_kv_heads=8, head_size=128, cache_dtype=E4M3),
    Case((1,) * 4, (3000, 129, 4096, 17), num_heads=8, num_kv_heads=8, head_size=128, cache_dtype=E5M2,
         block_size=64, sinks=True, softcap=30.0, alibi=True, window=(1000, 0), split_tokens=512),
    Case((1,) * 4, (3000, 129, 4096, 17), num_heads=16, num_kv_heads=1, head_size=128, cache_dtype=E4M3,
         strided="hnd", chunk=1024, split_tokens=1024, pad_tokens=3, hint=True),
]


@gpu_tier
@pytest.mark.parametrize("case", BATCHED_CUDA, ids=lambda c: c.id)
def test_batched_scores_cuda(case: Case, monkeypatch) -> None:
    check_batched_scores(case, "cuda", monkeypatch)


@gpu_tier
def test_batched_scores_merge_paths_bitwise_cuda(monkeypatch) -> None:
    check_batched_scores_bitwise("cuda", monkeypatch, [
        Case((1, 1, 1, 1), (3000, 2000, 5, 800), num_heads=16, num_kv_heads=4, head_size=128, cache_dtype=E4M3,
             sinks=True, split_tokens=512),
        Case((1, 1, 1), (5000, 700, 65), head_size=64, window=(2100, 0), split_tokens=1024, dtype=BF16),
    ])


@gpu_tier
def test_batched_scores_batch_invariant_cuda(monkeypatch) -> None:
    with batched_scores(monkeypatch, every_tile=True):
        check_batch_invariance("cuda", (7, 64), kv_len=3000, max_other=5000, split=None)


@gpu_tier
def test_fp8_query_magnitudes_batched_scores_cuda(monkeypatch) -> None:
    with batched_scores(monkeypatch):
        check_fp8_query_magnitudes("cuda", 128, q_lens=(1, 1, 1))


@gpu_tier
def test_batch_invariant_cuda() -> None:
    check_batch_invariance("cuda", (7, 64), kv_len=3000, max_other=5000, split=None)


@gpu_tier
def test_batch_invariant_long_sequences_cuda() -> None:
    check_long_sequences_split_finer("cuda", tpa._INVARIANT_SPLIT_TOKENS, tpa._INVARIANT_LONG_SPLIT_TOKENS,
                                     tpa._INVARIANT_LONG_FROM, kv_len=20000, max_other=5000, sizes=(7, 64))


@gpu_tier
def test_batch_invariant_mixed_batch_cuda(monkeypatch) -> None:
    """A decode sequence alone and beside a long prefill whose workspace would exceed the budget
    (so its splits are merged inside each program): the same bits."""
    kw = dict(num_heads=8, num_kv_heads=2, head_size=128, dtype=BF16, device="cuda")
    alone = make_paged_batch([1], [2500], seed=1, **kw)
    mixed = make_paged_batch([300, 1], [4000, 2500], seed=2, **kw)
    mixed.query[300] = alone.query[0]
    for cache, src in ((mixed.key_cache, alone.key_cache), (mixed.value_cache, alone.value_cache)):
        for b in range(-(-2500 // 16)):
            cache[mixed.block_table[1, b]] = src[alone.block_table[0, b]]
    options = dict(scale=0.09, causal=True, window_left=-1, window_right=-1, softcap=0.0,
                   alibi_slopes=None, sinks=torch.randn(8, device="cuda"), k_scale=None, v_scale=None,
                   attention_chunk_size=0)
    with _config.batch_invariant():
        out_a, lse_a = run_triton(alone, options, max_query_len=1)
        monkeypatch.setattr(tpa, "_WORKSPACE_BYTES", 1 << 20)
        out_m, lse_m = run_triton(mixed, options, max_query_len=300)
    assert torch.equal(out_a[0], out_m[300]) and torch.equal(lse_a[0], lse_m[300])
    check_against_reference(mixed, options, out_m, lse_m, BF16)


@gpu_tier
def test_batch_invariant_env_cuda(monkeypatch) -> None:
    """The environment variable is read per call."""
    monkeypatch.setenv("TORCH_PAGED_ATTN_BATCH_INVARIANT", "1")
    assert _config.is_batch_invariant()
    check_batch_invariance("cuda", (7,), kv_len=2500, max_other=3000, split=None)


@gpu_tier
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=_SHORT.get)
def test_merge_paths_bitwise_cuda(dtype, monkeypatch) -> None:
    case = Case((1, 2, 1, 9), (3000, 2000, 5, 800), num_heads=16, num_kv_heads=4, head_size=128,
                sinks=True, split_tokens=512, dtype=dtype)
    check_merge_paths_bitwise("cuda", case, monkeypatch)


@gpu_tier
def test_strided_caches_bitwise_cuda() -> None:
    check_strided_bitwise("cuda", Case(**_MIXED, num_heads=8, num_kv_heads=2, head_size=128))
    check_strided_bitwise("cuda", Case((3, 1, 1), (40, 64, 7), num_heads=8, num_kv_heads=2, head_size=256,
                                       block_size=64, dtype=FP16))  # one block a table row
    check_strided_bitwise("cuda", Case(**_DECODE, num_heads=8, num_kv_heads=2, head_size=128, split_tokens=256))


@gpu_tier
def test_nan_scale_cuda() -> None:
    check_nan_scale("cuda", Case(**_MIXED, num_heads=8, num_kv_heads=2, head_size=128,
                                 cache_dtype=torch.float8_e4m3fn, pad_tokens=2))


@gpu_tier
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_integer_option_extremes_public_op_cuda(backend: str) -> None:
    """The public op on a causal mixed decode/prefill batch: window_right 2^31 - 1 (and other
    sides and sizes past every position) gives the bits of the unbounded call, on the default
    backend and on Triton."""
    case = Case(**_MIXED, num_heads=8, num_kv_heads=2, head_size=128, sinks=True, pad_tokens=2)
    batch, options = make_inputs(case, "cuda", seed=19)
    options.pop("k_scale"), options.pop("v_scale")
    with _config.backend(backend):
        want_out, want_lse = torch_paged_attn.paged_attention(*batch.args(), **options, return_lse=True)
        check_against_reference(batch, options, want_out, want_lse, BF16)
        for window, hint in (((-1, BIG), -1), ((BIG, BIG), BIG), ((2**40, BIG), 0), ((BIG, 10**6), 2**40)):
            extreme = dict(options, window_left=window[0], window_right=window[1])
            out, lse = torch_paged_attn.paged_attention(*batch.args(), **extreme, max_query_len=hint,
                                                        return_lse=True)
            assert torch.equal(out, want_out) and torch.equal(lse, want_lse), (window, hint)
        chunked = dict(options, attention_chunk_size=BIG)
        out, lse = torch_paged_attn.paged_attention(*batch.args(), **chunked, return_lse=True)
        check_against_reference(batch, chunked, out, lse, BF16)


@gpu_tier
@pytest.mark.parametrize("backend", ["triton", "flash"])
def test_strided_caches_bitwise_public_op_cuda(backend: str) -> None:
    """Through the public op: a cross-layer slice gives the contiguous cache's bits on the same
    backend (FlashAttention reads it with its block stride). An HND view, which FlashAttention
    declines, runs on Triton: its bits are those of the contiguous cache on Triton."""
    if backend == "flash":
        from torch_paged_attn.lowering import flash

        if flash.available() is not None:
            pytest.skip(f"no FlashAttention: {flash.available()}")
    case = Case((1, 64, 1, 0, 5, 130), (1000, 300, 17, 0, 5, 333), num_heads=8, num_kv_heads=2, head_size=128,
                sinks=backend == "flash")
    batch, options = make_inputs(case, "cuda", seed=29)
    options.pop("k_scale"), options.pop("v_scale")
    with _config.backend(backend):
        want = torch_paged_attn.paged_attention(*batch.args(), **options, return_lse=True)
    with _config.backend("triton"):
        want_triton = torch_paged_attn.paged_attention(*batch.args(), **options, return_lse=True)
    contiguous = batch.key_cache, batch.value_cache
    for layout, expected in (("cross_layer", want), ("hnd", want_triton)):
        batch.key_cache, batch.value_cache = (_strided_cache(c, layout) for c in contiguous)
        with _config.backend(backend):
            out, lse = torch_paged_attn.paged_attention(*batch.args(), **options, return_lse=True)
        assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1]), layout


@gpu_tier
def test_bad_block_ids_cuda() -> None:
    check_bad_block_ids("cuda")


def check_graph_replay(rows: int, static_lens: tuple, replays: tuple, after_warmup=None) -> tuple:
    """Capture one call on a batch of ``rows`` token rows and 400 blocks (lengths ``static_lens``)
    under sync-debug "error" (an eager call too), rewrite seq_lens, block_table and query_start_loc
    in place with each of ``replays`` (``(q_lens, kv_lens)``), replay: every replay equals the
    reference of the new contents. ``after_warmup()`` runs after the first (compiling) call.
    Returns the static batch and the options."""
    kw = dict(num_heads=8, num_kv_heads=2, head_size=128, dtype=BF16, device="cuda", max_blocks=80)

    def batch(seed, q_lens, kv_lens):  # the same shapes whatever the lengths
        used = sum(-(-n // 16) for n in kv_lens)
        return make_paged_batch(q_lens, kv_lens, seed=seed, pad_tokens=rows - sum(q_lens), extra_blocks=400 - used,
                                **kw)

    static = batch(0, *static_lens)
    options = dict(scale=0.09, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    out = torch.full((rows, 8, 128), float("nan"), dtype=BF16, device="cuda")
    lse = torch.full((rows, 8), float("nan"), device="cuda")
    tpa.paged_attention(*static.args(), out, lse, **options)  # compile outside the capture
    if after_warmup is not None:
        after_warmup()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tpa.paged_attention(*static.args(), out, lse, **options)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            tpa.paged_attention(*static.args(), out, lse, **options)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed, (q_lens, kv_lens) in enumerate(replays, start=1):
        new = batch(seed, q_lens, kv_lens)
        for dst, src in zip(static.args(), new.args()):
            dst.copy_(src)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        check_against_reference(static, options, out, lse, BF16)
    return static, options


@gpu_tier
def test_cuda_graph_replay_and_no_host_sync() -> None:
    """Capture once (under sync-debug "error"), rewrite seq_lens, block_table and query_start_loc
    in place, replay: every replay equals the reference of the new contents."""
    check_graph_replay(6, ([1, 1, 3, 1], [900, 1, 40, 1200]),
                       (([2, 1, 1, 1], [30, 1270, 0, 5]), ([1, 1, 1, 1], [1, 2, 3, 1100])))


def _kernels_launched(fn) -> list[str]:
    """Names of the CUDA kernels ``fn()`` launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@gpu_tier
def test_public_ops_cuda_and_compiled() -> None:
    """The public ops run the Triton kernel on CUDA, eagerly and under torch.compile(fullgraph=True)."""
    case = Case(**_MIXED, num_heads=8, num_kv_heads=2, head_size=128, sinks=True, pad_tokens=2)
    batch, options = make_inputs(case, "cuda", seed=3)
    options.pop("k_scale"), options.pop("v_scale")
    out = torch.full_like(batch.query, float("nan"))

    def functional(q, kc, vc, bt, sl, qsl):
        return torch_paged_attn.paged_attention(q, kc, vc, bt, sl, qsl, return_lse=True, **options)

    def out_form(q, kc, vc, bt, sl, qsl):
        torch_paged_attn.paged_attention_out(q, kc, vc, bt, sl, qsl, out, None, **options)

    for name, fn in (("functional", functional), ("out", out_form)):
        kernels = _kernels_launched(lambda: fn(*batch.args()))
        assert any("_attention_kernel" in k for k in kernels), f"{name}: launched {kernels}"
    for fn in (functional, torch.compile(functional, fullgraph=True)):
        o, s = fn(*batch.args())
        check_against_reference(batch, options, o, s, BF16)
    for fn in (out_form, torch.compile(out_form, fullgraph=True)):
        out.fill_(float("nan"))
        fn(*batch.args())
        check_against_reference(batch, options, out, None, BF16)


@gpu_tier
def test_softcap_huge_scores_cuda() -> None:
    case = Case((2, 1), (400, 600), softcap=50.0, dtype=FP32, head_size=128)
    batch, options = make_inputs(case, "cuda", seed=9)
    options["scale"] = 1000.0  # q.k has a standard deviation of about 11 at D = 128
    out, lse = run_triton(batch, options)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    check_against_reference(batch, options, out, lse, FP32)


@gpu_tier
def test_fp8_query_magnitudes_cuda() -> None:
    check_fp8_query_magnitudes("cuda", 128)
