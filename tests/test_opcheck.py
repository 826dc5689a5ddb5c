"""``torch.library.opcheck`` on every op and ``_out`` op (DESIGN rule 4).

opcheck runs the op eagerly, under fake tensors, through AOTAutograd with dynamic shapes, and
checks the schema's mutation and aliasing annotations against what the op really does. Each op
gets several input sets (decode, prefill mix with padding rows, GQA/MQA, fp8 caches, lse given or
not, sinks/ALiBi/softcap/windows, strided views). The schema check compares tensors with
arithmetic that CPU fp8 lacks, so for inputs holding an fp8 tensor that one check is skipped and
the other three still run. Outputs passed in (``out``, ``lse``) start as NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from torch_paged_attn.testing import FP8_DTYPES, make_block_table, make_paged_batch, random_cache

ALL_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
BF16, F32, E4M3, E5M2 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2
NAN = float("nan")


@dataclass
class Case:
    id: str
    op: str
    make: Callable[[], tuple[tuple, dict]]  # -> (args, kwargs) of torch.ops.paged_attn.<op>


def _nan(*shape: int, dtype: torch.dtype = F32) -> Tensor:
    return torch.full(shape, NAN, dtype=dtype)


def _has_fp8(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(t, Tensor) and t.dtype in FP8_DTYPES for t in (*args, *kwargs.values()))


# -- paged_attention / paged_attention_out -----------------------------------------------------------


def _paged(q_lens, kv_lens, *, out_form=False, lse=True, strided_out=False, options=None, **batch):
    def make():
        b = make_paged_batch(q_lens, kv_lens, **batch)
        kwargs = dict(scale=0.125, **(options or {}))
        if b.k_scale is not None:
            kwargs.update(k_scale=b.k_scale, v_scale=b.v_scale)
        if not out_form:
            return b.args(), dict(kwargs, return_lse=lse)
        num_tokens, num_heads = b.query.shape[:2]
        head_size_v = b.value_cache.shape[-1]
        if strided_out:  # out is a slice of a wider buffer, as a fused projection's input would be
            out = _nan(num_tokens, num_heads, 2 * head_size_v, dtype=b.query.dtype)[..., :head_size_v]
        else:
            out = _nan(num_tokens, num_heads, head_size_v, dtype=b.query.dtype)
        lse_t = _nan(num_tokens, num_heads) if lse else None
        return (*b.args(), out, lse_t), kwargs

    return make


def _strided_query(q_lens, kv_lens, *, causal=True, **batch):
    """The query is ``[..., :D]`` of a ``[T, Hq, 3 * D]`` fused QKV projection."""

    def make():
        b = make_paged_batch(q_lens, kv_lens, **batch)
        head_size = b.query.shape[2]
        g = torch.Generator().manual_seed(batch.get("seed", 0) + 100)
        qkv = torch.randn(*b.query.shape[:2], 3 * head_size, generator=g).to(b.query.dtype)
        qkv[..., :head_size] = b.query
        kwargs = dict(scale=0.125, causal=causal, return_lse=True)
        if b.k_scale is not None:
            kwargs.update(k_scale=b.k_scale, v_scale=b.v_scale)
        return (qkv[..., :head_size], *b.args()[1:]), kwargs

    return make


SINKS_ALIBI = dict(
    sinks=torch.linspace(-1.0, 1.0, 8),
    alibi_slopes=torch.tensor([2.0 ** (-i) for i in range(1, 9)]),
    softcap=30.0,
    window_left=9,
    window_right=0,
)

PAGED_CASES = [
    Case("decode_B3_Hq4_Hkv2_D32_bs16_lse", "paged_attention", _paged([1, 1, 1], [17, 0, 5], seed=1)),
    Case(
        "prefill_mix_pad2_Hq4_Hkv2_bs16_nolse", "paged_attention",
        _paged([3, 1, 5], [7, 33, 5], pad_tokens=2, lse=False, seed=2),
    ),
    Case(
        "mqa_Hq8_Hkv1_sinks_alibi_softcap_window_bf16", "paged_attention",
        _paged([2, 1], [20, 9], num_heads=8, num_kv_heads=1, dtype=BF16, options=SINKS_ALIBI, seed=3),
    ),
    Case(
        "fp8_e4m3_D32_Dv16_chunked8", "paged_attention",
        _paged(
            [4, 1], [12, 30], cache_dtype=E4M3, head_size_v=16, options=dict(attention_chunk_size=8), seed=4
        ),
    ),
    Case(
        "fp8_e5m2_bf16_strided_query_noncausal_bs24", "paged_attention",
        _strided_query([2, 1], [30, 3], dtype=BF16, cache_dtype=E5M2, block_size=24, causal=False, seed=5),
    ),
    Case(
        "out_prefill_pad3_nolse_gqa_Hq6_Hkv2", "paged_attention_out",
        _paged([4, 2], [4, 19], num_heads=6, out_form=True, lse=False, pad_tokens=3, seed=8),
    ),
    Case(
        "out_decode_fp8_e4m3_strided_out_lse_window", "paged_attention_out",
        _paged([1, 1], [17, 8], cache_dtype=E4M3, out_form=True, strided_out=True,
               options=dict(window_left=4, window_right=1), seed=9),
    ),
]


# -- mla_decode ----------------------------------------------------------------------------------------


def _mla(q_lens, kv_lens, *, dtype=F32, cache_dtype=None, causal=True, latent=64, rope=16, seed=0):
    def make():
        g = torch.Generator().manual_seed(seed)
        cache_dtype_ = dtype if cache_dtype is None else cache_dtype
        num_blocks = sum(-(-n // 16) for n in kv_lens) + 2
        table, covered = make_block_table(kv_lens, 16, num_blocks, g)
        cache = random_cache((num_blocks, 16, latent + rope), cache_dtype_, "cpu", g, scale=0.5)
        if cache_dtype_ not in FP8_DTYPES:
            cache[~covered] = NAN
        num_tokens = sum(q_lens)
        qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        args = (
            torch.randn(num_tokens, 4, latent, generator=g).to(dtype),
            torch.randn(num_tokens, 4, rope, generator=g).to(dtype),
            cache,
            table,
            torch.tensor(kv_lens, dtype=torch.int32),
            qsl,
        )
        kwargs = dict(scale=0.09, causal=causal)
        if cache_dtype_ in FP8_DTYPES:
            kwargs["kv_scale"] = torch.tensor([0.5])
        return args, kwargs

    return make


MLA_CASES = [
    Case("mla_decode_B3_L64_R16", "mla_decode", _mla([1, 1, 1], [33, 1, 0], seed=10)),
    Case(
        "mla_spec2_bf16_fp8_e4m3_noncausal_L512_R64", "mla_decode",
        _mla([2, 2], [18, 5], dtype=BF16, cache_dtype=E4M3, causal=False, latent=512, rope=64, seed=11),
    ),
]


# -- cache writes --------------------------------------------------------------------------------------


def _reshape(num_rows, slots, *, dtype=F32, cache_dtype=None, head_size_v=32, slot_dtype=torch.int64, seed=0):
    """``num_rows`` rows of key/value, ``len(slots) <= num_rows`` of them written (the rest are
    padding); negative slots are skipped."""

    def make():
        g = torch.Generator().manual_seed(seed)
        cache_dtype_ = dtype if cache_dtype is None else cache_dtype
        args = (
            torch.randn(num_rows, 2, 32, generator=g).to(dtype),
            torch.randn(num_rows, 2, head_size_v, generator=g).to(dtype),
            random_cache((5, 16, 2, 32), cache_dtype_, "cpu", g),
            random_cache((5, 16, 2, head_size_v), cache_dtype_, "cpu", g),
            torch.tensor(slots, dtype=slot_dtype),
        )
        if cache_dtype_ in FP8_DTYPES:
            return args + (torch.tensor([0.5]), torch.tensor(2.0)), {}
        return args, {}

    return make


def _concat(num_rows, slots, *, dtype=F32, cache_dtype=None, seed=0):
    def make():
        g = torch.Generator().manual_seed(seed)
        cache_dtype_ = dtype if cache_dtype is None else cache_dtype
        args = (
            torch.randn(num_rows, 64, generator=g).to(dtype),
            torch.randn(num_rows, 16, generator=g).to(dtype),
            random_cache((4, 16, 80), cache_dtype_, "cpu", g),
            torch.tensor(slots),
        )
        if cache_dtype_ in FP8_DTYPES:
            return args + (torch.tensor([0.25]),), {}
        return args, {}

    return make


def _gather(row_shape, lens, starts, *, cache_dtype=F32, out_dtype=F32, spare_rows=2, seed=0):
    """Sequence i gathers ``lens[i]`` tokens from ``starts[i]`` (None: from 0); ``out`` has
    ``spare_rows`` rows past the last one gathered, which must stay NaN."""

    def make():
        g = torch.Generator().manual_seed(seed)
        kv_lens = [s + n for s, n in zip(starts or [0] * len(lens), lens)]
        num_blocks = sum(-(-n // 16) for n in kv_lens) + 2
        table, _ = make_block_table(kv_lens, 16, num_blocks, g)
        cache = random_cache((num_blocks, 16, *row_shape), cache_dtype, "cpu", g, scale=0.5)
        cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
        seq_starts = None if starts is None else torch.tensor(starts, dtype=torch.int32)
        out = _nan(sum(lens) + spare_rows, *row_shape, dtype=out_dtype)
        scale = torch.tensor([0.5]) if cache_dtype in FP8_DTYPES else None
        return (cache, table, cu, seq_starts, out, scale), {}

    return make


CACHE_CASES = [
    Case("rc_f32_negative_slots_2_padding_rows", "reshape_and_cache", _reshape(5, [3, -1, 77], seed=20)),
    Case(
        "rc_bf16_Dv16_int32_slots", "reshape_and_cache",
        _reshape(4, [0, 17, 18, 79], dtype=BF16, head_size_v=16, slot_dtype=torch.int32, seed=21),
    ),
    Case("rc_fp8_e5m2_scales", "reshape_and_cache", _reshape(3, [40, -5, 2], cache_dtype=E5M2, seed=22)),
    Case("cc_f32_negative_slot_padding_row", "concat_and_cache_mla", _concat(3, [63, -1], seed=23)),
    Case(
        "cc_fp8_e4m3_scale_bf16", "concat_and_cache_mla",
        _concat(2, [5, 40], dtype=BF16, cache_dtype=E4M3, seed=24),
    ),
    Case("gc_3d_f32_seq_starts", "gather_cache", _gather((80,), [10, 0, 3], [7, 2, 30], seed=25)),
    Case(
        "gc_4d_bf16_from_0", "gather_cache",
        _gather((2, 32), [5, 17], None, cache_dtype=BF16, out_dtype=BF16, seed=26),
    ),
    Case(
        "gc_fp8_e4m3_to_bf16", "gather_cache",
        _gather((48,), [3, 20], [16, 1], cache_dtype=E4M3, out_dtype=BF16, seed=27),
    ),
]


# -- merge_attn_states(_out) -----------------------------------------------------------------------------


def _merge(dtype=F32, *, out_form=False, lse=True, seed=0):
    """Random states with a few empty parts: -inf and +inf LSEs on either side, and a row empty
    on both."""

    def make():
        g = torch.Generator().manual_seed(seed)
        num_tokens, num_heads, head_size = 6, 3, 32
        prefix_lse = torch.randn(num_tokens, num_heads, generator=g) * 3
        suffix_lse = torch.randn(num_tokens, num_heads, generator=g) * 3
        prefix_lse[0, 0] = suffix_lse[1, 2] = float("-inf")
        prefix_lse[2, 1] = float("inf")
        prefix_lse[3] = suffix_lse[3] = float("-inf")
        args = (
            torch.randn(num_tokens, num_heads, head_size, generator=g).to(dtype),
            prefix_lse,
            torch.randn(num_tokens, num_heads, head_size, generator=g).to(dtype),
            suffix_lse,
        )
        if out_form:
            out = _nan(num_tokens, num_heads, head_size, dtype=dtype)
            args += (out, _nan(num_tokens, num_heads) if lse else None)
        return args, {}

    return make


MERGE_CASES = [
    Case("merge_f32_empty_parts", "merge_attn_states", _merge(seed=30)),
    Case("merge_bf16", "merge_attn_states", _merge(BF16, seed=31)),
    Case("merge_out_f32_lse", "merge_attn_states_out", _merge(out_form=True, seed=32)),
    Case("merge_out_bf16_nolse", "merge_attn_states_out", _merge(BF16, out_form=True, lse=False, seed=33)),
]



def _merge_n(num_parts, dtype=F32, *, out_form=False, lse=True, seed=0):
    """N stacked states with empty parts (-inf and +inf) and a row empty in every part."""

    def make():
        g = torch.Generator().manual_seed(seed)
        num_tokens, num_heads, head_size = 5, 2, 32
        lses = torch.randn(num_parts, num_tokens, num_heads, generator=g) * 3
        lses[0, 0, 0] = float("-inf")
        lses[-1, 1, 1] = float("inf")
        lses[:, 2] = float("-inf")
        args = (torch.randn(num_parts, num_tokens, num_heads, head_size, generator=g).to(dtype), lses)
        if out_form:
            out = _nan(num_tokens, num_heads, head_size, dtype=dtype)
            args += (out, _nan(num_tokens, num_heads) if lse else None)
        return args, {}

    return make


MERGE_N_CASES = [
    Case("merge_n1_f32", "merge_attn_states_n", _merge_n(1, seed=34)),
    Case("merge_n3_bf16", "merge_attn_states_n", _merge_n(3, BF16, seed=35)),
    Case("merge_n_out_n5_f32_lse", "merge_attn_states_n_out", _merge_n(5, out_form=True, seed=36)),
    Case("merge_n_out_n2_bf16_nolse", "merge_attn_states_n_out", _merge_n(2, BF16, out_form=True, lse=False, seed=37)),
]

CASES = PAGED_CASES + MLA_CASES + CACHE_CASES + MERGE_CASES + MERGE_N_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_opcheck(case: Case):
    args, kwargs = case.make()
    checks = ALL_CHECKS
    if _has_fp8(args, kwargs):
        checks = tuple(c for c in ALL_CHECKS if c != "test_schema")
    op = getattr(torch.ops.paged_attn, case.op).default
    result = torch.library.opcheck(op, args, kwargs, test_utils=checks)
    assert result == {check: "SUCCESS" for check in checks}


def test_every_op_is_checked():
    from torch_paged_attn.ops._library import OPS

    assert {c.op for c in CASES} == set(OPS)
