"""The public ops on CPU (the reference backend) against the float64 loops of ``_loop.py``.

A seeded random grid of paged attention configurations, then explicit edges: rows with no
visible key, huge softcapped scores, strided caches and queries, the ``_out`` forms, and the
cache, MLA and merge ops. Every output is poisoned (NaN) before the op writes it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch

import _loop as loop
import torch_paged_attn as pa
from torch_paged_attn.testing import assert_close, make_block_table, make_paged_batch, random_cache

NAN = float("nan")
NEG_INF = float("-inf")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8e4m3",
    torch.float8_e5m2: "fp8e5m2",
}
# Same-size integer dtypes, for bitwise comparisons that see NaN payloads and -0.0.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    diff = _bits(actual) != _bits(expected)
    if diff.any():
        at = diff.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(diff.sum())} elements differ bitwise, first at {at}: "
            f"got {actual[tuple(at)].float().item()}, expected {expected[tuple(at)].float().item()}"
        )


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of NaN (fp8: the 0x7F NaN pattern)."""
    if dtype in FP8:
        return torch.full(shape, 0x7F, dtype=torch.uint8).view(dtype)
    return torch.full(shape, NAN, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# the random grid
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttnCase:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    block_size: int
    dtype: torch.dtype
    cache_dtype: torch.dtype
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    chunk: int = 0
    softcap: float = 0.0
    alibi: bool = False
    sinks: bool = False
    return_lse: bool = True
    pad_tokens: int = 0
    spare_blocks: int = 0  # block table columns past the longest sequence (garbage)
    scale_mult: float = 1.0  # of 1/sqrt(D): > 1 pushes scores into the softcap's bend
    out_form: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        parts = [
            f"B{len(self.q_lens)}",
            "q[" + ",".join(map(str, self.q_lens)) + "]",
            "kv[" + ",".join(map(str, self.kv_lens)) + "]",
            f"Hq{self.num_heads}",
            f"Hkv{self.num_kv_heads}",
            f"D{self.head_size}",
            f"Dv{self.head_size_v}",
            f"bs{self.block_size}",
            _SHORT[self.dtype],
        ]
        if self.cache_dtype != self.dtype:
            parts.append(_SHORT[self.cache_dtype])
        parts.append("causal" if self.causal else "noncausal")
        if self.window != (-1, -1):
            parts.append(f"win({self.window[0]},{self.window[1]})")
        if self.chunk:
            parts.append(f"chunk{self.chunk}")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.scale_mult != 1.0:
            parts.append(f"scale{self.scale_mult:g}x")
        parts += [flag for flag, on in (("alibi", self.alibi), ("sinks", self.sinks)) if on]
        parts.append("lse" if self.return_lse else "nolse")
        if self.pad_tokens:
            parts.append(f"pad{self.pad_tokens}")
        if self.spare_blocks:
            parts.append(f"spare{self.spare_blocks}")
        if self.out_form:
            parts.append("outform")
        parts.append(f"seed{self.seed}")
        return "_".join(parts)


def _draw_case(rng: random.Random, seed: int) -> AttnCase:
    num_kv_heads = rng.choice([1, 2])  # 1 kv head: MQA whatever the ratio
    ratio = rng.choice([1, 4, 5, 6, 8])  # ratio 1: MHA
    head_size = rng.choice([32, 40, 64, 80])
    head_size_v = rng.choice([32, 48, 64, 80]) if rng.random() < 0.3 else head_size
    block_size = rng.choice([8, 16, 24, 32])
    dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
    cache_dtype = rng.choice(FP8) if rng.random() < 0.3 else dtype
    causal = rng.random() < 0.65
    num_seqs = rng.choice([1, 2, 2, 3, 3, 4])
    q_lens, kv_lens = [], []
    for _ in range(num_seqs):
        edges = [0, 1, block_size - 1, block_size, block_size + 1]
        kv = rng.choice(edges + [rng.randint(2, 3 * block_size)])
        if causal:
            if rng.random() < 0.06:
                q = kv + rng.randint(1, 3)  # negative context: the first rows see no key
            elif rng.random() < 0.5:
                q = min(kv, 1)  # decode
            else:
                q = rng.randint(0, min(kv, 6))
        else:
            q = rng.randint(0, 6)  # may exceed kv (cross-attention style rows)
        q_lens.append(q)
        kv_lens.append(kv)
    window = (-1, -1)
    if rng.random() < 0.3:
        left = rng.choice([-1, 0, 1, 3, 7, 20])
        right = rng.choice([-1, 0, 3] if causal else [-1, 0, 2, 5])
        window = (left if (left, right) != (-1, -1) else 3, right)
    return AttnCase(
        q_lens=tuple(q_lens),
        kv_lens=tuple(kv_lens),
        num_heads=num_kv_heads * ratio,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        head_size_v=head_size_v,
        block_size=block_size,
        dtype=dtype,
        cache_dtype=cache_dtype,
        causal=causal,
        window=window,
        chunk=rng.choice([3, 8, 13, 16]) if rng.random() < 0.15 else 0,
        softcap=rng.choice([5.0, 30.0]) if rng.random() < 0.25 else 0.0,
        alibi=rng.random() < 0.25,
        sinks=rng.random() < 0.25,
        return_lse=rng.random() < 0.6,
        pad_tokens=rng.randint(1, 3) if rng.random() < 0.3 else 0,
        spare_blocks=rng.randint(0, 2),
        scale_mult=4.0 if rng.random() < 0.3 else 1.0,
        out_form=rng.random() < 0.4,
        seed=seed,
    )


GRID_SEED = 20240611
GRID_SIZE = 520
GRID_GROUP = 20
_rng = random.Random(GRID_SEED)
GRID = [_draw_case(_rng, GRID_SEED + k) for k in range(GRID_SIZE)]
GROUPS = [GRID[k : k + GRID_GROUP] for k in range(0, GRID_SIZE, GRID_GROUP)]


def _options(case: AttnCase, batch, g: torch.Generator) -> dict:
    """Keyword options of one call; slopes in (0.05, 0.55) and sinks ~ 2 N(0, 1) drawn from ``g``."""
    alibi = sinks = None
    if case.alibi:
        alibi = torch.rand(case.num_heads, generator=g) * 0.5 + 0.05
    if case.sinks:
        sink_dtype = torch.float32 if case.seed % 2 else case.dtype
        sinks = (torch.randn(case.num_heads, generator=g) * 2).to(sink_dtype)
    return dict(
        scale=case.scale_mult / math.sqrt(case.head_size),
        causal=case.causal,
        window_left=case.window[0],
        window_right=case.window[1],
        softcap=case.softcap,
        alibi_slopes=alibi,
        sinks=sinks,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        attention_chunk_size=case.chunk,
    )


def _batch(case: AttnCase):
    used = [math.ceil(n / case.block_size) for n in case.kv_lens]
    return make_paged_batch(
        list(case.q_lens),
        list(case.kv_lens),
        num_heads=case.num_heads,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        head_size_v=case.head_size_v,
        block_size=case.block_size,
        dtype=case.dtype,
        cache_dtype=case.cache_dtype,
        pad_tokens=case.pad_tokens,
        max_blocks=max(used + [1]) + case.spare_blocks,
        seed=case.seed,
    )


def check_case(case: AttnCase) -> None:
    batch = _batch(case)
    opts = _options(case, batch, torch.Generator().manual_seed(case.seed + 1))
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    num_tokens = batch.query.shape[0]
    out_shape = (num_tokens, case.num_heads, case.head_size_v)
    if case.out_form:
        out = poisoned(out_shape, case.dtype)
        lse = poisoned((num_tokens, case.num_heads), torch.float32) if case.return_lse else None
        max_q = max(case.q_lens) if case.seed % 3 else -1
        pa.paged_attention_out(*batch.args(), out, lse, **opts, max_query_len=max_q)
    else:
        out, lse = pa.paged_attention(*batch.args(), **opts, return_lse=case.return_lse)
        if not case.return_lse:
            assert lse.shape == (0,) and lse.dtype == torch.float32
    assert out.shape == out_shape and out.dtype == case.dtype
    assert_close(out, truth_out, name="out")
    if case.return_lse:
        assert lse.dtype == torch.float32
        assert_close(lse, truth_lse, name="lse")


_GROUP_IDS = [
    f"grid{k:03d}-{k + len(g) - 1:03d}" for k, g in zip(range(0, GRID_SIZE, GRID_GROUP), GROUPS)
]


@pytest.mark.parametrize("group", GROUPS, ids=_GROUP_IDS)
def test_paged_attention_grid(group: list[AttnCase]) -> None:
    """Each group of configurations against the loop; a failure lists every failing id."""
    failures = []
    for case in group:
        try:
            check_case(case)
        except AssertionError as e:
            failures.append(f"{case.id}: {e}")
    summary = f"{len(failures)} of {len(group)} configurations failed:\n"
    assert not failures, summary + "\n".join(failures)


def _q_beyond_kv(case: AttnCase) -> bool:
    return any(q > k for q, k in zip(case.q_lens, case.kv_lens))


def test_grid_covers_the_contract() -> None:
    """The grid must keep exercising every feature: a generator change that drops one fails here."""

    def count(pred) -> int:
        return sum(1 for c in GRID if pred(c))

    needs = {
        "MHA": lambda c: c.num_heads == c.num_kv_heads,
        "MQA": lambda c: c.num_kv_heads == 1 and c.num_heads > 1,
        "GQA ratio 5": lambda c: c.num_heads == 5 * c.num_kv_heads,
        "GQA ratio 6": lambda c: c.num_heads == 6 * c.num_kv_heads,
        "GQA ratio 8, 2 kv heads": lambda c: c.num_heads == 16,
        "non-causal": lambda c: not c.causal,
        "non-causal q_len > seq_len": lambda c: not c.causal and _q_beyond_kv(c),
        "causal q_len > seq_len": lambda c: c.causal and _q_beyond_kv(c),
        "window left": lambda c: c.window[0] >= 0,
        "window right": lambda c: c.window[1] >= 0,
        "chunked": lambda c: c.chunk > 0,
        "softcap": lambda c: c.softcap > 0,
        "softcap with 4x scale": lambda c: c.softcap > 0 and c.scale_mult > 1,
        "alibi": lambda c: c.alibi,
        "sinks": lambda c: c.sinks,
        "fp8 e4m3": lambda c: c.cache_dtype == torch.float8_e4m3fn,
        "fp8 e5m2": lambda c: c.cache_dtype == torch.float8_e5m2,
        "D != Dv": lambda c: c.head_size != c.head_size_v,
        "bf16": lambda c: c.dtype == torch.bfloat16,
        "fp16": lambda c: c.dtype == torch.float16,
        "fp32": lambda c: c.dtype == torch.float32,
        "block 24": lambda c: c.block_size == 24,
        "return_lse": lambda c: c.return_lse,
        "no lse": lambda c: not c.return_lse,
        "padding rows": lambda c: c.pad_tokens > 0,
        "empty sequence": lambda c: 0 in c.kv_lens,
        "out form": lambda c: c.out_form,
        "garbage table columns": lambda c: c.spare_blocks > 0,
        "kv_len 1": lambda c: 1 in c.kv_lens,
        "kv_len BS-1": lambda c: c.block_size - 1 in c.kv_lens,
        "kv_len BS": lambda c: c.block_size in c.kv_lens,
        "kv_len BS+1": lambda c: c.block_size + 1 in c.kv_lens,
        "sinks with alibi and softcap": lambda c: c.sinks and c.alibi and c.softcap > 0,
    }
    thin = {name: count(p) for name, p in needs.items() if count(p) < 5}
    assert not thin, f"features with fewer than 5 configurations: {thin}"
    assert len({c.id for c in GRID}) == len(GRID) >= 500


# ---------------------------------------------------------------------------------------------
# the loop itself, against independent computations
# ---------------------------------------------------------------------------------------------


def test_loop_matches_sdpa_on_one_contiguous_sequence() -> None:
    """The ground truth agrees with torch's dense SDPA (float64) where both apply: one sequence,
    blocks in order, causal prefill over a context, GQA expanded by repeat_interleave."""
    kv_len, q_len, block_size, hq, hkv, d = 21, 5, 8, 6, 2, 32
    g = torch.Generator().manual_seed(7)
    nb = math.ceil(kv_len / block_size)
    kc = torch.randn(nb, block_size, hkv, d, generator=g, dtype=torch.float64)
    vc = torch.randn(nb, block_size, hkv, d, generator=g, dtype=torch.float64)
    q = torch.randn(q_len, hq, d, generator=g, dtype=torch.float64)
    table = torch.arange(nb, dtype=torch.int32)[None]
    out, lse = loop.paged_attention(
        q, kc, vc, table, torch.tensor([kv_len], dtype=torch.int32),
        torch.tensor([0, q_len], dtype=torch.int32), scale=0.3,
    )
    k = kc.reshape(-1, hkv, d)[:kv_len].repeat_interleave(hq // hkv, dim=1)
    v = vc.reshape(-1, hkv, d)[:kv_len].repeat_interleave(hq // hkv, dim=1)
    mask = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
    s = torch.einsum("thd,jhd->htj", q, k) * 0.3
    s = s.masked_fill(~mask, NEG_INF)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=0.3
    ).transpose(0, 1)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1).T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", FP8, ids=lambda d: _SHORT[d])
def test_loop_fp8_table_matches_torch_decoding(dtype) -> None:
    """The hand-decoded value of every bit pattern equals torch's fp8 -> float64 conversion."""
    patterns = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch_values = patterns.view(dtype).double()
    mine = torch.tensor([loop.fp8_decode(b, dtype) for b in range(256)], dtype=torch.float64)
    assert torch.equal(torch_values.isnan(), mine.isnan())
    ok = ~mine.isnan()
    assert torch.equal(torch_values[ok], mine[ok])


# ---------------------------------------------------------------------------------------------
# explicit edges of paged attention
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [8, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: _SHORT[d])
def test_kv_len_edges(block_size: int, dtype) -> None:
    """Every kv_len in {0, 1, BS-1, BS, BS+1} in one batch, decode and prefill rows alike."""
    kv = [0, 1, block_size - 1, block_size, block_size + 1]
    q = [0, 1, 2, 1, 3]
    batch = make_paged_batch(q, kv, num_heads=4, num_kv_heads=2, head_size=32, block_size=block_size,
                             dtype=dtype, max_blocks=4, pad_tokens=1, seed=block_size)
    opts = dict(scale=0.2)
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    out, lse = pa.paged_attention(*batch.args(), **opts, return_lse=True)
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")


# Batches in which some rows see no key; (q_lens, kv_lens, pad_tokens, options).
_EMPTY_ROWS = {
    "empty_sequences": ([0, 2, 1], [0, 0, 5], 0, dict(causal=False)),
    "causal_q_longer_than_kv": ([4, 1], [2, 3], 0, dict(causal=True)),
    "window_past_the_keys": ([5], [2], 0, dict(causal=False, window_left=0, window_right=0)),
    "chunk_of_negative_position": ([6], [3], 0, dict(causal=False, attention_chunk_size=4)),
    "padding_rows": ([2], [5], 3, dict(causal=True)),
}


@pytest.mark.parametrize("scenario", sorted(_EMPTY_ROWS))
@pytest.mark.parametrize("with_sinks", [False, True], ids=["nosink", "sink"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: _SHORT[d])
def test_rows_without_keys(scenario: str, with_sinks: bool, dtype) -> None:
    """No visible key: out exactly 0 and lse exactly -inf, or the sink's logit for a real row;
    padding rows are 0 / -inf even with a sink. Never NaN."""
    q_lens, kv_lens, pad, options = _EMPTY_ROWS[scenario]
    batch = make_paged_batch(q_lens, kv_lens, num_heads=4, num_kv_heads=1, head_size=32,
                             block_size=8, dtype=dtype, pad_tokens=pad, max_blocks=2, seed=3)
    sinks = torch.tensor([0.5, -1.25, 2.0, 0.0]) if with_sinks else None
    opts = dict(scale=0.25, sinks=sinks, **options)
    _, no_sink_lse = loop.paged_attention(*batch.args(), **{**opts, "sinks": None})
    empty = no_sink_lse == NEG_INF  # [T, Hq]
    assert empty.any(), "the scenario must contain rows without a visible key"
    padding = torch.arange(batch.query.shape[0]) >= sum(q_lens)

    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    out, lse = pa.paged_attention(*batch.args(), **opts, return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    if with_sinks:
        real = empty & ~padding[:, None]
        assert torch.equal(lse[real], sinks.expand_as(lse)[real])
        assert (lse[padding] == NEG_INF).all()
    else:
        assert (lse[empty] == NEG_INF).all()
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: _SHORT[d])
def test_softcap_keeps_huge_scores_finite(dtype) -> None:
    """Raw scores of exactly +-1e4 with softcap 50: finite output and lse, equal to the loop."""
    head_size = 32
    batch = make_paged_batch([3, 1], [11, 20], num_heads=4, num_kv_heads=2, head_size=head_size,
                             block_size=8, dtype=dtype, seed=11)
    g = torch.Generator().manual_seed(12)
    # every key is +-(1, ..., 1) and every query (1e4/D, ...): q.k = +-1e4 exactly
    signs = torch.randint(0, 2, batch.key_cache.shape[:3] + (1,), generator=g).to(dtype) * 2 - 1
    keys = signs.expand_as(batch.key_cache)
    batch.key_cache = torch.where(batch.key_cache.isnan(), batch.key_cache, keys)
    batch.query = torch.full_like(batch.query, 1e4 / head_size)
    opts = dict(scale=1.0, softcap=50.0)
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    assert truth_lse.abs().max() > 49  # the cap is what keeps these scores in range
    out, lse = pa.paged_attention(*batch.args(), **opts, return_lse=True)
    assert out.isfinite().all() and lse.isfinite().all()
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")


def _strided(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``cache`` in a non-contiguous view whose last dimension is contiguous,
    over storage poisoned with NaN outside the view."""
    nb, bs, h, d = cache.shape
    if layout == "cross_layer":  # [NB, layers, BS, H, D], layer 1
        view = poisoned((nb, 3, bs, h, d), cache.dtype)[:, 1]
    elif layout == "hnd":  # [NB, H, BS, D] storage seen as [NB, BS, H, D]
        view = poisoned((nb, h, bs, d), cache.dtype).permute(0, 2, 1, 3)
    else:
        raise ValueError(layout)
    view.copy_(cache)
    assert not view.is_contiguous() and view.stride(-1) == 1
    return view


# (dtype, head size, block size, kv lens): several blocks a sequence, and one block a table row
# (max_blocks 1), where indexing a strided cache kept its layout through the reference's reshape
# and the dots summed in another order (an LSE 1 ulp off in bf16, outputs off in fp16 D 256)
_STRIDED_BATCHES = {
    "blocks3": (torch.bfloat16, 32, 8, [17, 9, 30]),
    "oneblock_bf16": (torch.bfloat16, 128, 16, [10, 13, 16]),
    "oneblock_fp16_D256_bs64": (torch.float16, 256, 64, [40, 7, 64]),
}


@pytest.mark.parametrize("batch_kind", sorted(_STRIDED_BATCHES))
@pytest.mark.parametrize("layout", ["cross_layer", "unbind_kv", "hnd"])
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn], ids=lambda d: _SHORT.get(d, "samedtype"))
def test_strided_caches_are_bitwise_equal(layout: str, cache_dtype, batch_kind: str) -> None:
    dtype, head_size, block_size, kv_lens = _STRIDED_BATCHES[batch_kind]
    batch = make_paged_batch([1, 4, 2], kv_lens, num_heads=6, num_kv_heads=2, head_size=head_size,
                             block_size=block_size, dtype=dtype, cache_dtype=cache_dtype or dtype, seed=5,
                             extra_blocks=1, max_blocks=max(-(-n // block_size) for n in kv_lens))
    cache_dtype = batch.key_cache.dtype
    opts = dict(scale=0.2, k_scale=batch.k_scale, v_scale=batch.v_scale, return_lse=True)
    want_out, want_lse = pa.paged_attention(*batch.args(), **opts)
    if layout == "unbind_kv":  # [NB, 2, BS, H, D]
        both = poisoned((batch.key_cache.shape[0], 2) + tuple(batch.key_cache.shape[1:]), cache_dtype)
        both[:, 0].copy_(batch.key_cache)
        both[:, 1].copy_(batch.value_cache)
        kc, vc = both.unbind(1)
    else:
        kc, vc = _strided(batch.key_cache, layout), _strided(batch.value_cache, layout)
    out, lse = pa.paged_attention(batch.query, kc, vc, *batch.args()[3:], **opts)
    assert_bitwise(out, want_out, "out")
    assert_bitwise(lse, want_lse, "lse")
    scales = dict(k_scale=batch.k_scale, v_scale=batch.v_scale)
    if head_size <= 128:  # the float64 loop is slow at D 256
        truth_out, _ = loop.paged_attention(*batch.args(), scale=0.2, **scales)
        assert_close(out, truth_out, name="out")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda d: _SHORT[d])
def test_strided_query_and_out(dtype) -> None:
    """query a slice of a fused QKV projection, out a slice of a wider buffer: the same bits as
    the contiguous call, and nothing outside ``out``'s view is written."""
    hq, hkv, d = 4, 2, 32
    batch = make_paged_batch([2, 1, 3], [5, 12, 3], num_heads=hq, num_kv_heads=hkv, head_size=d,
                             block_size=8, dtype=dtype, pad_tokens=2, seed=9)
    num_tokens = batch.query.shape[0]
    qkv = torch.randn(num_tokens, hq + 2 * hkv, d, dtype=dtype)
    qkv[:, :hq] = batch.query
    query = qkv[:, :hq]
    buf = poisoned((num_tokens, hq + 2, 2 * d), dtype)
    out = buf[:, 1 : hq + 1, :d]
    lse_buf = poisoned((num_tokens, hq + 3), torch.float32)
    lse = lse_buf[:, 2 : hq + 2]
    assert not query.is_contiguous() and not out.is_contiguous() and not lse.is_contiguous()
    pa.paged_attention_out(query, *batch.args()[1:], out, lse, scale=0.2)
    want_out, want_lse = pa.paged_attention(*batch.args(), scale=0.2, return_lse=True)
    assert_bitwise(out, want_out, "out")
    assert_bitwise(lse, want_lse, "lse")
    outside = torch.ones(buf.shape, dtype=torch.bool)
    outside[:, 1 : hq + 1, :d] = False
    assert buf[outside].isnan().all()
    lse_outside = torch.ones(lse_buf.shape, dtype=torch.bool)
    lse_outside[:, 2 : hq + 2] = False
    assert lse_buf[lse_outside].isnan().all()


def test_out_form_writes_padding_rows_and_lse_is_optional() -> None:
    batch = make_paged_batch([3, 1], [7, 16], num_heads=8, num_kv_heads=2, head_size=32,
                             block_size=16, dtype=torch.bfloat16, pad_tokens=3, seed=21)
    num_tokens = batch.query.shape[0]
    sinks = torch.linspace(-1, 1, 8)
    opts = dict(scale=0.2, window_left=2, sinks=sinks)
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)

    out = poisoned((num_tokens, 8, 32), torch.bfloat16)
    lse = poisoned((num_tokens, 8), torch.float32)
    pa.paged_attention_out(*batch.args(), out, lse, **opts)
    assert torch.equal(out[4:], torch.zeros_like(out[4:]))
    assert (lse[4:] == NEG_INF).all()
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")

    out_no_lse = poisoned((num_tokens, 8, 32), torch.bfloat16)
    pa.paged_attention_out(*batch.args(), out_no_lse, None, **opts)
    assert_bitwise(out_no_lse, out, "out without lse")
    functional, empty_lse = pa.paged_attention(*batch.args(), **opts)
    assert empty_lse.shape == (0,) and empty_lse.dtype == torch.float32
    assert_bitwise(functional, out, "functional out")


@pytest.mark.parametrize("num_tokens", [0, 3])
def test_batch_without_sequences(num_tokens: int) -> None:
    """A bucket with no sequence (block_table [0, MB]): every row is padding, 0 and -inf."""
    batch = make_paged_batch([], [], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=torch.bfloat16, pad_tokens=num_tokens, max_blocks=2, seed=4)
    assert batch.block_table.shape == (0, 2)
    out, lse = pa.paged_attention(*batch.args(), scale=0.2, return_lse=True)
    assert torch.equal(out, torch.zeros(num_tokens, 4, 32, dtype=torch.bfloat16))
    assert lse.shape == (num_tokens, 4) and (lse == NEG_INF).all()
    out2 = poisoned((num_tokens, 4, 32), torch.bfloat16)
    lse2 = poisoned((num_tokens, 4), torch.float32)
    pa.paged_attention_out(*batch.args(), out2, lse2, scale=0.2, sinks=torch.ones(4))
    assert_bitwise(out2, out, "out")
    assert_bitwise(lse2, lse, "lse")


# ---------------------------------------------------------------------------------------------
# integer options at their extremes
# ---------------------------------------------------------------------------------------------

BIG = 2**31 - 1  # what several frameworks pass for "no limit"
HUGE = 2**40  # past int32; the schema's int is 64-bit
# (window_left, window_right, attention_chunk_size, max_query_len); 100 is larger than any
# sequence or query of the batches below
_EXTREMES = [
    (-1, BIG, 0, -1), (BIG, -1, 0, -1), (BIG, BIG, 0, -1), (HUGE, HUGE, 0, -1), (100, 100, 0, -1),
    (0, 0, 0, -1), (1, 1, 0, -1), (0, BIG, 0, -1), (BIG, 0, 0, -1), (1, BIG, 0, -1),
    (-1, -1, 1, -1), (-1, -1, BIG, -1), (-1, -1, HUGE, -1), (-1, -1, 100, -1), (3, BIG, BIG, -1),
    (-1, -1, 0, 0), (-1, -1, 0, 1), (-1, -1, 0, BIG), (-1, -1, 0, HUGE), (BIG, BIG, BIG, BIG),
]
# a mixed decode/prefill batch (causal), and one with more queries than keys (non-causal rows at
# negative positions, where chunk -1 differs from chunk 0)
_EXTREME_BATCHES = {True: ([1, 5, 1, 3, 0], [20, 9, 1, 3, 0]), False: ([4, 1, 2], [2, 9, 0])}


def _option_id(v: int) -> str:
    return {BIG: "2^31-1", HUGE: "2^40"}.get(v, str(v))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize(
    "options", _EXTREMES, ids=["win({},{})_chunk{}_mql{}".format(*map(_option_id, e)) for e in _EXTREMES]
)
def test_integer_options_at_their_extremes(options, causal: bool) -> None:
    """0, 1, 2^31 - 1, 2^40 and sizes past every sequence give the contract's answer (the loop's,
    in Python integers), and a window or chunk past every position gives the unbounded call's bits."""
    window_left, window_right, chunk, max_query_len = options
    q_lens, kv_lens = _EXTREME_BATCHES[causal]
    batch = make_paged_batch(q_lens, kv_lens, num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=torch.float32, pad_tokens=1, seed=31)
    opts = dict(scale=0.3, causal=causal, window_left=window_left, window_right=window_right,
                attention_chunk_size=chunk)
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    out, lse = pa.paged_attention(*batch.args(), **opts, max_query_len=max_query_len, return_lse=True)
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")
    far = 100  # past every position and key of these batches
    bounded = dict(opts)
    for side in ("window_left", "window_right"):
        bounded[side] = -1 if opts[side] >= far else opts[side]
    bounded["attention_chunk_size"] = min(chunk, far)
    want_out, want_lse = pa.paged_attention(*batch.args(), **bounded, return_lse=True)
    assert_bitwise(out, want_out, "out")
    assert_bitwise(lse, want_lse, "lse")


def test_reference_backend_takes_any_int64_option() -> None:
    """The reference backend itself (no op in front to normalise the options): window sides and a
    chunk size of 2^63 - 1 give the unbounded call's bits (int64 positions plus them would wrap)."""
    from torch_paged_attn.lowering import reference

    q_lens, kv_lens = _EXTREME_BATCHES[False]
    batch = make_paged_batch(q_lens, kv_lens, num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=torch.float32, pad_tokens=1, seed=33)
    top = 2**63 - 1
    for causal in (True, False):
        want = reference.attention(*batch.args(), scale=0.3, causal=causal, attention_chunk_size=100)
        got = reference.attention(*batch.args(), scale=0.3, causal=causal, window_left=top, window_right=top,
                                  attention_chunk_size=top)
        assert_bitwise(got[0], want[0], "out")
        assert_bitwise(got[1], want[1], "lse")


# ---------------------------------------------------------------------------------------------
# NaN given as data: NaN in, NaN out, only where it enters
# ---------------------------------------------------------------------------------------------


def assert_close_or_nan(actual: torch.Tensor, truth: torch.Tensor, name: str) -> None:
    """NaN exactly where the loop has NaN, ``assert_close`` everywhere else."""
    nan = truth.isnan()
    if not torch.equal(actual.isnan().cpu(), nan):
        at = (actual.isnan().cpu() != nan).nonzero()[0].tolist()
        raise AssertionError(f"{name}: NaN pattern differs first at {at}: got {actual[tuple(at)]}")
    assert_close(torch.where(nan, 0.0, actual.double().cpu()).to(actual.dtype), torch.where(nan, 0.0, truth),
                 name=name)


@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
def test_nan_fp8_scale_reaches_rows_that_see_a_key(which: str) -> None:
    """A NaN k_scale gives NaN out and lse for every row that sees a key; a NaN v_scale NaN out
    (the lse depends on scores only); rows without a key keep 0 and -inf (or the sink)."""
    batch = make_paged_batch([1, 3, 0, 2, 2], [20, 9, 5, 0, 1], num_heads=4, num_kv_heads=2, head_size=32,
                             block_size=8, dtype=torch.bfloat16, cache_dtype=torch.float8_e4m3fn, pad_tokens=1,
                             seed=41)
    opts = dict(scale=0.3, k_scale=batch.k_scale, v_scale=batch.v_scale)
    opts[which] = torch.tensor([NAN])
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    sees = torch.tensor([True, True, True, True, False, False, False, True, False])  # row 7: p 0 sees key 0
    assert torch.equal(truth_out.isnan().all(-1).all(-1), sees)
    for sinks in (None, torch.linspace(-1.0, 1.0, 4)):
        out, lse = pa.paged_attention(*batch.args(), **opts, sinks=sinks, return_lse=True)
        want_out, want_lse = loop.paged_attention(*batch.args(), **opts, sinks=sinks)
        assert_close_or_nan(out, want_out, "out")
        assert_close_or_nan(lse, want_lse, "lse")
        assert torch.equal(lse.isnan().all(-1), sees if which == "k_scale" else torch.zeros_like(sees))


def test_nan_cache_entry_reaches_only_rows_that_see_it() -> None:
    """NaN in a covered key and value slot (key 0 of a 20-key sequence) reaches the rows whose
    window holds key 0 and no other row (0 x NaN must not leak through the masked weights)."""
    batch = make_paged_batch([6], [20], num_heads=2, num_kv_heads=1, head_size=32, block_size=8,
                             dtype=torch.float32, seed=43)
    first = int(batch.block_table[0, 0])
    batch.key_cache[first, 0] = NAN
    batch.value_cache[first, 0] = NAN
    opts = dict(scale=0.3, window_left=15)  # rows at p = 14 .. 19: those up to p = 15 see key 0
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **opts)
    out, lse = pa.paged_attention(*batch.args(), **opts, return_lse=True)
    assert truth_lse[:, 0].isnan().tolist() == [True, True, False, False, False, False]
    assert_close_or_nan(out, truth_out, "out")
    assert_close_or_nan(lse, truth_lse, "lse")


def test_nan_lse_in_a_merge_part_gives_nan_rows() -> None:
    """A NaN LSE in any part of a merge (beside a finite, an empty or another NaN part) makes that
    row's out and lse NaN; other rows are untouched."""
    g = torch.Generator().manual_seed(45)
    po, so = torch.randn(5, 2, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    pl, sl = torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g)
    pl[0, 0], sl[1, 1], pl[2, 0], sl[2, 0] = NAN, NAN, NAN, NAN  # prefix, suffix, both
    pl[3, 1], sl[3, 1] = NAN, NEG_INF  # beside an empty part
    pl[4, 0], sl[4, 0] = NEG_INF, NAN
    nan_rows = torch.zeros(5, 2, dtype=torch.bool)
    nan_rows[0, 0] = nan_rows[1, 1] = nan_rows[2, 0] = nan_rows[3, 1] = nan_rows[4, 0] = True
    truth_out, truth_lse = loop.merge_attn_states(po, pl, so, sl)
    assert torch.equal(truth_lse.isnan(), nan_rows)
    out, lse = pa.merge_attn_states(po, pl, so, sl)
    assert_close_or_nan(out, truth_out, "out")
    assert_close_or_nan(lse, truth_lse, "lse")
    outs, lses = torch.stack([po, so, po]), torch.stack([pl, sl, torch.zeros_like(pl)])
    truth_out, truth_lse = loop.merge_attn_states_n(outs, lses)
    assert torch.equal(truth_lse.isnan(), nan_rows)
    out, lse = pa.merge_attn_states_n(outs, lses)
    assert_close_or_nan(out, truth_out, "out (N parts)")
    assert_close_or_nan(lse, truth_lse, "lse (N parts)")


# ---------------------------------------------------------------------------------------------
# mla_decode
# ---------------------------------------------------------------------------------------------


def _mla_batch(q_lens, kv_lens, *, heads, latent, rope, block_size, dtype, cache_dtype, pad, seed):
    g = torch.Generator().manual_seed(seed)
    used = sum(math.ceil(n / block_size) for n in kv_lens)
    num_blocks = used + 2
    max_blocks = max(math.ceil(n / block_size) for n in kv_lens) + 1
    table, covered = make_block_table(kv_lens, block_size, num_blocks, g, max_blocks)
    scale = None
    if cache_dtype in FP8:
        scale = torch.tensor([0.4 + float(torch.rand(1, generator=g))])
    cache = random_cache((num_blocks, block_size, latent + rope), cache_dtype, "cpu", g,
                         1.0 if scale is None else float(scale))
    poison = poisoned(cache.shape, cache_dtype)
    cache = torch.where(covered[:, :, None], _bits(cache), _bits(poison)).view(cache_dtype)
    num_tokens = sum(q_lens) + pad
    q_latent = torch.randn(num_tokens, heads, latent, generator=g).to(dtype)
    q_rope = torch.randn(num_tokens, heads, rope, generator=g).to(dtype)
    q_latent[sum(q_lens):] = NAN
    q_rope[sum(q_lens):] = NAN
    qsl = torch.tensor([0] + list(q_lens)).cumsum(0).to(torch.int32)
    return (q_latent, q_rope, cache, table, torch.tensor(kv_lens, dtype=torch.int32), qsl), scale


@pytest.mark.parametrize(
    "latent,rope,cache_dtype,dtype,causal",
    [
        (64, 16, torch.bfloat16, torch.bfloat16, True),
        (64, 16, torch.float32, torch.float32, False),
        (64, 16, torch.float8_e4m3fn, torch.bfloat16, True),
        (64, 16, torch.float8_e5m2, torch.float16, True),
        (512, 64, torch.float8_e4m3fn, torch.bfloat16, True),
    ],
    ids=lambda v: ("causal" if v else "noncausal") if isinstance(v, bool) else _SHORT.get(v, str(v)),
)
def test_mla_decode(latent, rope, cache_dtype, dtype, causal) -> None:
    """Several query tokens per sequence (speculative decoding), kv_len edges, padding rows."""
    args, kv_scale = _mla_batch([1, 3, 2, 0], [1, 17, 8, 0], heads=4, latent=latent, rope=rope,
                                block_size=8, dtype=dtype, cache_dtype=cache_dtype, pad=2,
                                seed=latent + rope)
    scale = 1 / math.sqrt(latent + rope)
    truth_out, truth_lse = loop.mla_decode(*args, scale=scale, causal=causal, kv_scale=kv_scale)
    out, lse = pa.mla_decode(*args, scale=scale, causal=causal, kv_scale=kv_scale)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert (lse[-2:] == NEG_INF).all() and torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")


def test_mla_decode_nan_kv_scale() -> None:
    """A NaN kv_scale: NaN out and lse for the rows that see a key, 0 and -inf for the others."""
    args, _ = _mla_batch([1, 3, 2, 0], [1, 17, 0, 0], heads=4, latent=64, rope=16, block_size=8,
                         dtype=torch.bfloat16, cache_dtype=torch.float8_e4m3fn, pad=2, seed=47)
    nan_scale = torch.tensor([NAN])
    truth_out, truth_lse = loop.mla_decode(*args, scale=0.1, kv_scale=nan_scale)
    out, lse = pa.mla_decode(*args, scale=0.1, kv_scale=nan_scale)
    assert truth_lse[:, 0].isnan().tolist() == [True] * 4 + [False] * 4
    assert_close_or_nan(out, truth_out, "out")
    assert_close_or_nan(lse, truth_lse, "lse")


# ---------------------------------------------------------------------------------------------
# reshape_and_cache and concat_and_cache_mla
# ---------------------------------------------------------------------------------------------


def _garbage_cache(shape, dtype, g) -> torch.Tensor:
    """Random bytes: NaN, inf and denormal patterns included, so a stray write shows bitwise."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)


def _slots(num_slots: int, n: int, g, keep: slice = slice(0)) -> torch.Tensor:
    """``n`` distinct slots, about a third of them negative (padding); rows ``keep`` are written."""
    slots = torch.randperm(num_slots, generator=g)[:n].long()
    skip = torch.rand(n, generator=g) < 0.35
    skip[0] = True
    skip[keep] = False
    return torch.where(skip, -1 - torch.randint(0, 7, (n,), generator=g), slots)


_CACHE_CASES = [
    (torch.float32, torch.float32, "contiguous"),
    (torch.bfloat16, torch.bfloat16, "cross_layer"),
    (torch.float16, torch.float16, "hnd"),
    (torch.bfloat16, torch.float8_e4m3fn, "contiguous"),
    (torch.float32, torch.float8_e4m3fn, "hnd"),
    (torch.float16, torch.float8_e5m2, "cross_layer"),
    (torch.bfloat16, torch.float8_e5m2, "contiguous"),
]


def _storage_outside(view: torch.Tensor) -> torch.Tensor:
    """The elements of ``view``'s storage that the view does not cover, as a flat tensor."""
    numel = view.untyped_storage().nbytes() // view.element_size()
    flat = torch.as_strided(view, (numel,), (1,), 0)
    covered = torch.zeros(numel, dtype=torch.bool)
    index = torch.arange(numel)
    covered[torch.as_strided(index, view.shape, view.stride(), view.storage_offset()).flatten()] = True
    return flat[~covered]


@pytest.mark.parametrize(
    "dtype,cache_dtype,layout,seed",
    [case + (k,) for k, case in enumerate(_CACHE_CASES)],
    ids=lambda v: _SHORT[v] if isinstance(v, torch.dtype) else str(v),
)
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=["slot64", "slot32"])
def test_reshape_and_cache(dtype, cache_dtype, layout, seed, slot_dtype) -> None:
    """Negative slots skipped, padding rows not read, untouched slots and the storage around a
    strided cache unchanged bitwise, fp8 values past the largest finite one saturated."""
    g = torch.Generator().manual_seed(100 + seed)
    nb, bs, hkv, d, dv, rows, n = 5, 8, 2, 32, 48, 14, 11
    key = torch.randn(rows, hkv, d, generator=g).to(dtype)
    value = torch.randn(rows, hkv, dv, generator=g).to(dtype)
    key[n:] = NAN  # rows past len(slot_mapping) are padding
    value[n:] = NAN
    k_scale = v_scale = None
    if cache_dtype in FP8:
        k_scale = torch.tensor([0.2 + 0.1 * float(torch.rand(1, generator=g))])
        v_scale = torch.tensor(0.25)
        fmax = torch.finfo(cache_dtype).max
        # beyond the largest finite value: these must saturate, not become inf or NaN
        big = fmax * float(k_scale)
        key[1:4, 0, :3] = torch.tensor([3 * big, -3 * big, 1.05 * big]).to(dtype)
        value[1:4, 1, -2:] = torch.tensor([2 * fmax * 0.25, -1.1 * fmax * 0.25]).to(dtype)
    slots = _slots(nb * bs, n, g, keep=slice(1, 4)).to(slot_dtype)
    kc = _garbage_cache((nb, bs, hkv, d), cache_dtype, g)
    vc = _garbage_cache((nb, bs, hkv, dv), cache_dtype, g)
    want_k, want_v = loop.reshape_and_cache(key, value, kc, vc, slots, k_scale, v_scale)
    if cache_dtype in FP8:
        top = loop.fp8_encode(torch.finfo(cache_dtype).max, cache_dtype)
        for slot in slots[1:4].tolist():
            assert _bits(want_k[slot // bs, slot % bs, 0, :3]).tolist() == [top, top | 0x80, top]
            assert _bits(want_v[slot // bs, slot % bs, 1, -2:]).tolist() == [top, top | 0x80]
    if layout == "contiguous":
        kc_t, vc_t = kc.clone(), vc.clone()
    else:
        kc_t, vc_t = _strided(kc, layout), _strided(vc, layout)
    pa.reshape_and_cache(key, value, kc_t, vc_t, slots, k_scale, v_scale)
    assert_bitwise(kc_t, want_k, "key_cache")
    assert_bitwise(vc_t, want_v, "value_cache")
    if layout == "cross_layer":  # the other layers' storage
        for view in (kc_t, vc_t):
            outside = _storage_outside(view)
            assert outside.numel() > 0
            assert (_bits(outside) == _bits(poisoned((1,), view.dtype))).all()


@pytest.mark.parametrize("dtype", FP8, ids=lambda d: _SHORT[d])
def test_fp8_rounding_ties_to_even_and_saturates(dtype) -> None:
    """Known bit patterns: midpoints round to the even pattern (normal and subnormal), values
    past the largest finite one saturate to it, with their sign."""
    if dtype == torch.float8_e4m3fn:
        cases = {1.0625: 0x38, 1.1875: 0x3A, -1.0625: 0xB8, 17.0: 0x58, 2.0**-10: 0x00,
                 3 * 2.0**-10: 0x02, 464.0: 0x7E, -1e6: 0xFE, 448.0: 0x7E}
    else:
        cases = {1.125: 0x3C, 1.375: 0x3E, -1.125: 0xBC, 2.0**-17: 0x00,
                 3 * 2.0**-17: 0x02, 60000.0: 0x7B, -1e9: 0xFB, 57344.0: 0x7B}
    values = torch.tensor(list(cases), dtype=torch.float32)
    want = torch.tensor(list(cases.values()), dtype=torch.uint8)
    assert torch.equal(torch.tensor([loop.fp8_encode(v, dtype) for v in cases], dtype=torch.uint8), want)
    n = len(cases)
    key = values.reshape(n, 1, 1).expand(n, 1, 8).contiguous()
    kc = torch.zeros(n, 8, 1, 8, dtype=torch.uint8).view(dtype)
    vc = torch.zeros(n, 8, 1, 8, dtype=torch.uint8).view(dtype)
    one = torch.tensor([1.0])
    pa.reshape_and_cache(key, key, kc, vc, torch.arange(n) * 8 + 3, one, one)
    assert torch.equal(_bits(kc[:, 3, 0, :]), want[:, None].expand(n, 8))
    assert torch.equal(_bits(vc[:, 3, 0, :]), want[:, None].expand(n, 8))


@pytest.mark.parametrize(
    "dtype,cache_dtype,strided",
    [
        (torch.bfloat16, torch.bfloat16, False),
        (torch.float32, torch.float32, True),
        (torch.bfloat16, torch.float8_e4m3fn, False),
        (torch.float16, torch.float8_e5m2, True),
    ],
    ids=lambda v: _SHORT.get(v, "strided" if v is True else "contiguous"),
)
def test_concat_and_cache_mla(dtype, cache_dtype, strided) -> None:
    """``[kv_c | k_pe]`` rows land in their slots bitwise; negative slots, padding rows and the
    other layer of a strided cache stay untouched."""
    g = torch.Generator().manual_seed(31)
    nb, bs, latent, rope, rows, n = 4, 16, 64, 16, 10, 8
    kv_c = torch.randn(rows, latent, generator=g).to(dtype)
    k_pe = torch.randn(rows, rope, generator=g).to(dtype)
    kv_c[n:] = NAN
    k_pe[n:] = NAN
    scale = torch.tensor([0.3]) if cache_dtype in FP8 else None
    cache = _garbage_cache((nb, bs, latent + rope), cache_dtype, g)
    slots = _slots(nb * bs, n, g)
    want = loop.concat_and_cache_mla(kv_c, k_pe, cache, slots, scale)
    if strided:
        big = poisoned((nb, 2, bs, latent + rope), cache_dtype)
        target = big[:, 1]
        target.copy_(cache)
    else:
        target = cache.clone()
    pa.concat_and_cache_mla(kv_c, k_pe, target, slots, scale)
    assert_bitwise(target, want, "kv_cache")
    if strided:
        assert (_bits(big[:, 0]) == _bits(poisoned((1,), cache_dtype))).all()


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float8_e4m3fn], ids=_SHORT.get)
@pytest.mark.parametrize("num_slots", [0, 4], ids=["no_slots", "all_negative"])
def test_cache_writes_with_nothing_to_write(cache_dtype, num_slots: int) -> None:
    """An empty or all-negative slot_mapping leaves every cache byte as it was."""
    g = torch.Generator().manual_seed(61)
    scale = torch.tensor([0.5]) if cache_dtype in FP8 else None
    slots = torch.full((num_slots,), -1, dtype=torch.int64)
    key = torch.randn(4, 2, 32, generator=g).half()
    kc, vc = _garbage_cache((3, 8, 2, 32), cache_dtype, g), _garbage_cache((3, 8, 2, 32), cache_dtype, g)
    kc_t, vc_t = kc.clone(), vc.clone()
    pa.reshape_and_cache(key, key, kc_t, vc_t, slots, scale, scale)
    assert_bitwise(kc_t, kc, "key_cache")
    assert_bitwise(vc_t, vc, "value_cache")
    mla = _garbage_cache((3, 8, 48), cache_dtype, g)
    mla_t = mla.clone()
    pa.concat_and_cache_mla(key[:, 0], key[:, 1, :16], mla_t, slots, scale)
    assert_bitwise(mla_t, mla, "kv_cache")


# ---------------------------------------------------------------------------------------------
# gather_cache
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row_shape,cache_dtype,out_dtype",
    [
        ((40,), torch.bfloat16, torch.bfloat16),
        ((2, 16), torch.float32, torch.bfloat16),
        ((40,), torch.float8_e4m3fn, torch.bfloat16),
        ((2, 16), torch.float8_e5m2, torch.float32),
        ((2, 16), torch.float8_e4m3fn, torch.float16),
    ],
    ids=lambda v: f"{len(v) + 2}D" if isinstance(v, tuple) else _SHORT[v],
)
@pytest.mark.parametrize("with_starts", [False, True], ids=["start0", "starts"])
def test_gather_cache(row_shape, cache_dtype, out_dtype, with_starts) -> None:
    """Tokens ``seq_starts[i] ..`` of each sequence, dequantised as ``float32(stored * scale)``,
    bitwise; an empty sequence in the middle; rows past ``cu_seq_lens[-1]`` keep their bits."""
    g = torch.Generator().manual_seed(41 + len(row_shape))
    bs = 8
    lengths = [5, 0, 17, 8]
    starts = [3, 9, 0, 7] if with_starts else [0, 0, 0, 0]
    reach = [s + n for s, n in zip(starts, lengths)]
    num_blocks = sum(math.ceil(r / bs) for r in reach) + 2
    max_blocks = max(math.ceil(r / bs) for r in reach) + 1
    table, covered = make_block_table(reach, bs, num_blocks, g, max_blocks)
    scale = torch.tensor(0.7) if cache_dtype in FP8 else None
    cache = random_cache((num_blocks, bs) + row_shape, cache_dtype, "cpu", g, 0.7)
    poison = poisoned(cache.shape, cache_dtype)
    mask = covered.reshape(num_blocks, bs, *([1] * len(row_shape)))
    cache = torch.where(mask, _bits(cache), _bits(poison)).view(cache_dtype)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    seq_starts = torch.tensor(starts, dtype=torch.int32) if with_starts else None
    out = poisoned((int(cu[-1]) + 3,) + row_shape, out_dtype)
    want = loop.gather_cache(cache, table, cu, out, seq_starts, scale)
    pa.gather_cache(cache, table, cu, seq_starts, out, scale=scale)
    assert not out[: int(cu[-1])].isnan().any()
    assert_bitwise(out, want, "out")  # rows past cu_seq_lens[-1] keep their NaN bits


# ---------------------------------------------------------------------------------------------
# merge_attn_states
# ---------------------------------------------------------------------------------------------


def _merge_inputs(dtype, g):
    t, h, d = 9, 3, 32
    po = torch.randn(t, h, d, generator=g).to(dtype)
    so = torch.randn(t, h, d, generator=g).to(dtype)
    pl = torch.randn(t, h, generator=g) * 3
    sl = torch.randn(t, h, generator=g) * 3
    inf = float("inf")
    # (row, prefix lse, suffix lse): empty prefix, empty suffix, both, +inf markers, mixed
    for row, (lp, ls) in enumerate([(NEG_INF, None), (None, NEG_INF), (NEG_INF, NEG_INF),
                                    (inf, None), (None, inf), (inf, NEG_INF), (inf, inf)]):
        if lp is not None:
            pl[row] = lp
            po[row] = NAN  # an empty part's output is garbage and must not be read
        if ls is not None:
            sl[row] = ls
            so[row] = NAN
    pl[7] = 120.0  # the suffix's weight, about e^-120, underflows in float32
    return po, pl, so, sl


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=_SHORT.get)
def test_merge_attn_states(dtype) -> None:
    """-inf and +inf mark empty parts (their NaN outputs never read), both empty gives 0 and
    -inf; the ``_out`` form writes the same bits, with or without ``lse``."""
    po, pl, so, sl = _merge_inputs(dtype, torch.Generator().manual_seed(51))
    truth_out, truth_lse = loop.merge_attn_states(po, pl, so, sl)
    out, lse = pa.merge_attn_states(po, pl, so, sl)
    assert out.dtype == dtype and lse.dtype == torch.float32
    both_empty = torch.tensor([2, 5, 6])
    assert torch.equal(out[both_empty], torch.zeros_like(out[both_empty]))
    assert (lse[both_empty] == NEG_INF).all()
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")

    out2 = poisoned(tuple(po.shape), dtype)
    lse2 = poisoned(tuple(pl.shape), torch.float32)
    pa.merge_attn_states_out(po, pl, so, sl, out2, lse2)
    assert_bitwise(out2, out, "out (_out form)")
    assert_bitwise(lse2, lse, "lse (_out form)")
    out3 = poisoned(tuple(po.shape), dtype)
    pa.merge_attn_states_out(po, pl, so, sl, out3)
    assert_bitwise(out3, out, "out (_out form, no lse)")


# ---------------------------------------------------------------------------------------------
# merge_attn_states_n
# ---------------------------------------------------------------------------------------------


def _merge_n_inputs(num_parts: int, dtype, g):
    """Random parts; 1 in 6 entries empty (-inf or +inf, output NaN), a row empty in every part."""
    t, h, d = 7, 3, 32
    outs = torch.randn(num_parts, t, h, d, generator=g).to(dtype)
    lses = torch.randn(num_parts, t, h, generator=g) * 3
    kind = torch.randint(0, 12, (num_parts, t, h), generator=g)
    lses = torch.where(kind == 0, NEG_INF, lses)
    lses = torch.where(kind == 1, float("inf"), lses)
    lses[:, 0, 0] = NEG_INF
    lses[0, 1, 1] = float("inf")
    lses[1:, 1, 1] = NEG_INF
    outs[torch.isinf(lses)] = NAN  # an empty part's output is garbage and must not be read
    return outs, lses


@pytest.mark.parametrize("num_parts", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_SHORT.get)
def test_merge_attn_states_n(num_parts, dtype) -> None:
    """Against the float64 loop; all-empty rows give 0 and -inf; the ``_out`` form writes the
    same bits, with or without ``lse``."""
    outs, lses = _merge_n_inputs(num_parts, dtype, torch.Generator().manual_seed(60 + num_parts))
    truth_out, truth_lse = loop.merge_attn_states_n(outs, lses)
    out, lse = pa.merge_attn_states_n(outs, lses)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert (out[0, 0] == 0).all() and (out[1, 1] == 0).all() and lse[0, 0] == NEG_INF == lse[1, 1]
    assert_close(out, truth_out, name="out")
    assert_close(lse, truth_lse, name="lse")
    out2 = poisoned(tuple(outs.shape[1:]), dtype)
    lse2 = poisoned(tuple(lses.shape[1:]), torch.float32)
    pa.merge_attn_states_n_out(outs, lses, out2, lse2)
    assert_bitwise(out2, out, "out (_out form)")
    assert_bitwise(lse2, lse, "lse (_out form)")
    out3 = poisoned(tuple(outs.shape[1:]), dtype)
    pa.merge_attn_states_n_out(outs, lses, out3)
    assert_bitwise(out3, out, "out (_out form, no lse)")


def test_merge_attn_states_n_of_two_is_merge_attn_states() -> None:
    outs, lses = _merge_n_inputs(2, torch.float32, torch.Generator().manual_seed(70))
    out, lse = pa.merge_attn_states_n(outs, lses)
    want_out, want_lse = pa.merge_attn_states(outs[0], lses[0], outs[1], lses[1])
    torch.testing.assert_close(out, want_out, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(lse, want_lse)
