"""Bad inputs are rejected before anything is written (DESIGN rules 1 and 3).

Every case starts from a valid call, breaks one argument, and checks that the public function
raises a ``ValueError``/``TypeError`` whose message reads ``"<op>: <argument>: expected <what>,
got <what>"``, and that no tensor argument (caches, ``out``, ``lse``) changed, bitwise.

Value checks (block ids, slots, lengths) run only under ``TORCH_PAGED_ATTN_DEBUG=1``. Each such
case is checked twice: with debug it raises; without debug it runs, and the bad entries are
masked (sequences the bad value does not touch give the same result, out-of-range slots are
skipped, no NaN from uncovered cache slots leaks into an output).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import torch_paged_attn as pa
from torch_paged_attn.testing import make_block_table, make_paged_batch, random_cache

DEBUG_ENV = "TORCH_PAGED_ATTN_DEBUG"
F32, F16, E4M3, E5M2 = torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2
NAN = float("nan")

# Shapes of the valid calls every case starts from: two sequences with 17 and 5 keys, 1 and 3 new
# tokens (T = 4), Hq 4 / Hkv 2, D 32, block size 16, 6 cache blocks, 2 blocks per table row.
T, HQ, HKV, D, BS = 4, 4, 2, 32, 16
KV_LENS, Q_LENS = [17, 5], [1, 3]
LATENT, ROPE = 64, 16


@pytest.fixture(autouse=True)
def _seeded():
    """The shapes-only replacements in the cases below draw from the global generator."""
    with torch.random.fork_rng():
        torch.manual_seed(2026)
        yield


# -- valid calls ---------------------------------------------------------------------------------


def _poison(shape: tuple[int, ...], dtype: torch.dtype = F32) -> Tensor:
    return torch.full(shape, NAN, dtype=dtype)


def _paged(cache_dtype: torch.dtype | None = None) -> dict:
    b = make_paged_batch(
        Q_LENS, KV_LENS, num_heads=HQ, num_kv_heads=HKV, head_size=D, block_size=BS,
        cache_dtype=cache_dtype, seed=11,
    )
    args = dict(
        query=b.query,
        key_cache=b.key_cache,
        value_cache=b.value_cache,
        block_table=b.block_table,
        seq_lens=b.seq_lens,
        query_start_loc=b.query_start_loc,
        return_lse=True,
    )
    if cache_dtype is not None:
        args.update(k_scale=b.k_scale, v_scale=b.v_scale)
    return args


def _paged_out(cache_dtype: torch.dtype | None = None) -> dict:
    args = _paged(cache_dtype)
    del args["return_lse"]
    return dict(args, out=_poison((T, HQ, D)), lse=_poison((T, HQ)))


def _mla(cache_dtype: torch.dtype = F32) -> dict:
    g = torch.Generator().manual_seed(12)
    table, covered = make_block_table(KV_LENS, BS, 6, g)
    cache = random_cache((6, BS, LATENT + ROPE), cache_dtype, "cpu", g, scale=0.5)
    if cache_dtype == F32:
        cache[~covered] = NAN
    args = dict(
        q_latent=torch.randn(T, HQ, LATENT, generator=g),
        q_rope=torch.randn(T, HQ, ROPE, generator=g),
        kv_cache=cache,
        block_table=table,
        seq_lens=torch.tensor(KV_LENS, dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 4], dtype=torch.int32),
        scale=0.1,
    )
    if cache_dtype != F32:
        args["kv_scale"] = torch.tensor([0.5])
    return args


def _reshape(cache_dtype: torch.dtype = F32) -> dict:
    g = torch.Generator().manual_seed(13)
    args = dict(
        key=torch.randn(3, HKV, D, generator=g),
        value=torch.randn(3, HKV, D, generator=g),
        key_cache=random_cache((6, BS, HKV, D), cache_dtype, "cpu", g),
        value_cache=random_cache((6, BS, HKV, D), cache_dtype, "cpu", g),
        slot_mapping=torch.tensor([5, -1, 40]),
    )
    if cache_dtype != F32:
        args.update(k_scale=torch.tensor([0.5]), v_scale=torch.tensor(0.25))
    return args


def _concat(cache_dtype: torch.dtype = F32) -> dict:
    g = torch.Generator().manual_seed(14)
    args = dict(
        kv_c=torch.randn(3, LATENT, generator=g),
        k_pe=torch.randn(3, ROPE, generator=g),
        kv_cache=random_cache((6, BS, LATENT + ROPE), cache_dtype, "cpu", g),
        slot_mapping=torch.tensor([5, -1, 40]),
    )
    if cache_dtype != F32:
        args["scale"] = torch.tensor([0.5])
    return args


def _gather(cache_dtype: torch.dtype = F32) -> dict:
    """Sequence 0 gathers its tokens 7..16 into rows 0..9, sequence 1 its tokens 2..4 into 10..12;
    row 13 of ``out`` is spare."""
    g = torch.Generator().manual_seed(15)
    table, _ = make_block_table(KV_LENS, BS, 6, g)
    args = dict(
        kv_cache=random_cache((6, BS, LATENT + ROPE), cache_dtype, "cpu", g),
        block_table=table,
        cu_seq_lens=torch.tensor([0, 10, 13], dtype=torch.int32),
        seq_starts=torch.tensor([7, 2], dtype=torch.int32),
        out=_poison((14, LATENT + ROPE)),
    )
    if cache_dtype != F32:
        args["scale"] = torch.tensor([0.5])
    return args


def _merge() -> dict:
    g = torch.Generator().manual_seed(16)
    return dict(
        prefix_out=torch.randn(T, 2, D, generator=g),
        prefix_lse=torch.randn(T, 2, generator=g),
        suffix_out=torch.randn(T, 2, D, generator=g),
        suffix_lse=torch.randn(T, 2, generator=g),
    )


def _merge_out() -> dict:
    return dict(_merge(), out=_poison((T, 2, D)), lse=_poison((T, 2)))


def _merge_n() -> dict:
    g = torch.Generator().manual_seed(17)
    return dict(outs=torch.randn(3, T, 2, D, generator=g), lses=torch.randn(3, T, 2, generator=g))


def _merge_n_out() -> dict:
    return dict(_merge_n(), out=_poison((T, 2, D)), lse=_poison((T, 2)))


# -- helpers ---------------------------------------------------------------------------------------


def _strided_last(t: Tensor) -> Tensor:
    """``t``'s values with a last dimension of stride 2 (every other element of a wider tensor)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def _with(t: Tensor, index: tuple, value: int) -> Tensor:
    t = t.clone()
    t[index] = value
    return t


def _bits(t: Tensor) -> Tensor:
    """The raw bytes of ``t``, so that NaN == NaN and fp8 compares without arithmetic."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _snapshot(args: dict) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in args.items() if isinstance(v, Tensor) and v.device.type != "meta"}


def _assert_unchanged(args: dict, before: dict[str, Tensor]) -> None:
    for name, old in before.items():
        assert torch.equal(_bits(args[name]), _bits(old)), f"{name} was modified by a rejected call"


def _message_pattern(op: str, arg: str, expected: str, got: str) -> str:
    return rf"^{re.escape(op)}: {re.escape(arg)}: expected .*{re.escape(expected)}.*, got .*{re.escape(got)}"


# -- shape, dtype, device and type errors (no debug needed) ------------------------------------------


@dataclass
class Bad:
    id: str
    op: str  # public function of torch_paged_attn
    base: Callable[[], dict]
    change: Callable[[dict], dict]  # valid arguments -> the arguments to replace
    exc: type[Exception]
    arg: str  # the argument the message must name
    expected: str
    got: str


V, TE = ValueError, TypeError
PA, PAO, MLA, RC, CC, GC, MS, MSO, MSN, MSNO = (
    "paged_attention",
    "paged_attention_out",
    "mla_decode",
    "reshape_and_cache",
    "concat_and_cache_mla",
    "gather_cache",
    "merge_attn_states",
    "merge_attn_states_out",
    "merge_attn_states_n",
    "merge_attn_states_n_out",
)

BAD = [
    # -- paged_attention --
    Bad(
        "query_rank2", PA, _paged,
        lambda a: {"query": a["query"][0]},
        V, "query", "a 3-D tensor", "shape [4, 32]",
    ),
    Bad(  # a 0-D query (no head size to take the default scale from, no token count for the key)
        "query_rank0", PA, _paged,
        lambda a: {"query": a["query"][0, 0, 0]},
        V, "query", "a 3-D tensor", "shape []",
    ),
    Bad(
        "out_query_rank0", PAO, _paged_out,
        lambda a: {"query": a["query"][0, 0, 0]},
        V, "query", "a 3-D tensor", "shape []",
    ),
    Bad(
        "query_int64", PA, _paged,
        lambda a: {"query": a["query"].long()},
        TE, "query", "dtype bfloat16 or float16 or float32", "torch.int64",
    ),
    Bad(
        "key_cache_rank3", PA, _paged,
        lambda a: {"key_cache": a["key_cache"][0]},
        V, "key_cache", "a 4-D tensor", "shape [16, 2, 32]",
    ),
    Bad(
        "heads_4_over_3", PA, _paged,
        lambda a: {"key_cache": torch.randn(6, BS, 3, D), "value_cache": torch.randn(6, BS, 3, D)},
        V, "key_cache", "kv heads that divides the 4 query heads", "3 kv heads",
    ),
    Bad(
        "head_size_query64_cache32", PA, _paged,
        lambda a: {"query": torch.randn(T, HQ, 64)},
        V, "key_cache", "head size 64", "head size 32",
    ),
    Bad(
        "head_size_36", PA, _paged,
        lambda a: {
            "query": torch.randn(T, HQ, 36),
            "key_cache": torch.randn(6, BS, HKV, 36),
            "value_cache": torch.randn(6, BS, HKV, 36),
        },
        V, "query head_size", "a multiple of 8", "36",
    ),
    Bad(  # head size 0 and the default scale: the validation error, not a division by zero
        "head_size_0", PA, _paged,
        lambda a: {
            "query": torch.randn(T, HQ, 0),
            "key_cache": torch.randn(6, BS, HKV, 0),
            "value_cache": torch.randn(6, BS, HKV, 0),
        },
        V, "query head_size", "a multiple of 8", "0",
    ),
    Bad(
        "block_size_12", PA, _paged,
        lambda a: {"key_cache": torch.randn(6, 12, HKV, D), "value_cache": torch.randn(6, 12, HKV, D)},
        V, "key_cache block_size", "a multiple of 8", "12",
    ),
    Bad(
        "value_cache_blocks_differ", PA, _paged, lambda a: {"value_cache": torch.randn(5, BS, HKV, D)},
        V, "value_cache", "shape [6, 16, 2, *]", "shape [5, 16, 2, 32]",
    ),
    Bad(
        "block_table_int64", PA, _paged,
        lambda a: {"block_table": a["block_table"].long()},
        TE, "block_table", "dtype int32", "torch.int64",
    ),
    Bad(
        "block_table_rank1", PA, _paged,
        lambda a: {"block_table": a["block_table"][0]},
        V, "block_table", "a 2-D tensor", "shape [2]",
    ),
    Bad(
        "seq_lens_int64", PA, _paged,
        lambda a: {"seq_lens": a["seq_lens"].long()},
        TE, "seq_lens", "dtype int32", "torch.int64",
    ),
    Bad(
        "seq_lens_3_for_2_seqs", PA, _paged,
        lambda a: {"seq_lens": torch.tensor([17, 5, 1], dtype=torch.int32)},
        V, "seq_lens", "shape [2]", "shape [3]",
    ),
    Bad(
        "query_start_loc_2_for_2_seqs", PA, _paged,
        lambda a: {"query_start_loc": torch.tensor([0, 4], dtype=torch.int32)},
        V, "query_start_loc", "shape [3]", "shape [2]",
    ),
    Bad(
        "key_cache_on_meta", PA, _paged,
        lambda a: {"key_cache": a["key_cache"].to("meta")},
        V, "key_cache", "a tensor on cpu", "meta",
    ),
    Bad(
        "block_table_on_meta", PA, _paged,
        lambda a: {"block_table": a["block_table"].to("meta")},
        V, "block_table", "a tensor on cpu", "meta",
    ),
    Bad(
        "key_cache_last_dim_stride2", PA, _paged, lambda a: {"key_cache": _strided_last(a["key_cache"])},
        V, "key_cache", "a contiguous last dimension", "strides (2048, 128, 64, 2)",
    ),
    Bad(
        "value_cache_last_dim_stride2", PA, _paged,
        lambda a: {"value_cache": _strided_last(a["value_cache"])},
        V, "value_cache", "a contiguous last dimension", "strides (2048, 128, 64, 2)",
    ),
    Bad(
        "query_last_dim_stride2", PA, _paged,
        lambda a: {"query": _strided_last(a["query"])},
        V, "query", "a contiguous last dimension", "strides",
    ),
    Bad(
        "value_cache_fp16_key_cache_fp32", PA, _paged, lambda a: {"value_cache": a["value_cache"].half()},
        TE, "value_cache", "the dtype of key_cache", "torch.float16",
    ),
    Bad(
        "cache_fp16_query_fp32", PA, _paged,
        lambda a: {"key_cache": a["key_cache"].half(), "value_cache": a["value_cache"].half()},
        TE, "key_cache", "torch.float32 (the dtype of query) or an fp8 dtype", "torch.float16",
    ),
    Bad(
        "fp8_e4m3_without_k_scale", PA, lambda: _paged(E4M3),
        lambda a: {"k_scale": None},
        TE, "k_scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "fp8_e5m2_without_v_scale", PA, lambda: _paged(E5M2),
        lambda a: {"v_scale": None},
        TE, "v_scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "k_scale_2_elements", PA, lambda: _paged(E4M3),
        lambda a: {"k_scale": torch.ones(2)},
        V, "k_scale", "one element", "shape [2]",
    ),
    Bad(
        "k_scale_fp16", PA, lambda: _paged(E4M3),
        lambda a: {"k_scale": torch.ones(1, dtype=F16)},
        TE, "k_scale", "dtype float32", "torch.float16",
    ),
    Bad(
        "alibi_3_slopes_for_4_heads", PA, _paged,
        lambda a: {"alibi_slopes": torch.ones(3)},
        V, "alibi_slopes", "shape [4]", "shape [3]",
    ),
    Bad(
        "alibi_fp16", PA, _paged,
        lambda a: {"alibi_slopes": torch.ones(HQ, dtype=F16)},
        TE, "alibi_slopes", "dtype float32", "torch.float16",
    ),
    Bad(
        "sinks_2_for_4_heads", PA, _paged,
        lambda a: {"sinks": torch.zeros(2)},
        V, "sinks", "shape [4]", "shape [2]",
    ),
    Bad("window_left_minus2", PA, _paged, lambda a: {"window_left": -2}, V, "window_left", ">= -1", "-2"),
    Bad("softcap_negative", PA, _paged, lambda a: {"softcap": -1.0}, V, "softcap", ">= 0.0", "-1.0"),
    Bad("scale_nan", PA, _paged, lambda a: {"scale": NAN}, V, "scale", "a finite float", "nan"),
    Bad(
        "max_query_len_minus2", PA, _paged,
        lambda a: {"max_query_len": -2},
        V, "max_query_len", ">= -1", "-2",
    ),
    Bad(
        "key_cache_list", PA, _paged,
        lambda a: {"key_cache": a["key_cache"].tolist()},
        TE, "key_cache", "a torch.Tensor", "list",
    ),
    Bad(
        "seq_lens_none", PA, _paged,
        lambda a: {"seq_lens": None},
        TE, "seq_lens", "a torch.Tensor", "NoneType",
    ),
    Bad(
        "window_left_float", PA, _paged,
        lambda a: {"window_left": 1.5},
        TE, "window_left", "an int", "float",
    ),
    Bad("causal_str", PA, _paged, lambda a: {"causal": "yes"}, TE, "causal", "a bool", "str"),
    # -- paged_attention_out --
    Bad(
        "out_head_size_0", PAO, _paged_out,
        lambda a: {
            "query": torch.randn(T, HQ, 0),
            "key_cache": torch.randn(6, BS, HKV, 0),
            "value_cache": torch.randn(6, BS, HKV, 0),
            "out": _poison((T, HQ, 0)),
        },
        V, "query head_size", "a multiple of 8", "0",
    ),
    Bad(
        "out_head_size_16", PAO, _paged_out,
        lambda a: {"out": _poison((T, HQ, 16))},
        V, "out", "shape [4, 4, 32]", "shape [4, 4, 16]",
    ),
    Bad(
        "out_fp16", PAO, _paged_out,
        lambda a: {"out": _poison((T, HQ, D), F16)},
        TE, "out", "dtype float32", "torch.float16",
    ),
    Bad(
        "out_on_meta", PAO, _paged_out,
        lambda a: {"out": _poison((T, HQ, D)).to("meta")},
        V, "out", "a tensor on cpu", "meta",
    ),
    Bad("out_list", PAO, _paged_out, lambda a: {"out": [0.0]}, TE, "out", "a torch.Tensor", "list"),
    Bad(
        "lse_fp16", PAO, _paged_out,
        lambda a: {"lse": _poison((T, HQ), F16)},
        TE, "lse", "dtype float32", "torch.float16",
    ),
    Bad(
        "lse_transposed", PAO, _paged_out,
        lambda a: {"lse": _poison((HQ + 1, T))},
        V, "lse", "shape [4, 4]", "shape [5, 4]",
    ),
    Bad(
        "out_fp8_cache_without_scale", PAO, lambda: _paged_out(E4M3),
        lambda a: {"k_scale": None},
        TE, "k_scale", "a float32 scale tensor", "None",
    ),
    # -- mla_decode --
    Bad(
        "mla_width_72_for_64_plus_16", MLA, _mla,
        lambda a: {"kv_cache": torch.randn(6, BS, 72)},
        V, "kv_cache", "row width 80", "72",
    ),
    Bad(
        "mla_q_latent_rank0", MLA, _mla,
        lambda a: {"q_latent": a["q_latent"][0, 0, 0]},
        V, "q_latent", "a 3-D tensor", "shape []",
    ),
    Bad(
        "mla_kv_cache_rank4", MLA, _mla,
        lambda a: {"kv_cache": a["kv_cache"].unsqueeze(2)},
        V, "kv_cache", "a 3-D tensor", "shape [6, 16, 1, 80]",
    ),
    Bad(
        "mla_q_rope_3_tokens", MLA, _mla,
        lambda a: {"q_rope": a["q_rope"][:3]},
        V, "q_rope", "shape [4, 4, *]", "shape [3, 4, 16]",
    ),
    Bad(
        "mla_q_rope_fp16", MLA, _mla,
        lambda a: {"q_rope": a["q_rope"].half()},
        TE, "q_rope", "dtype float32", "torch.float16",
    ),
    Bad(
        "mla_fp8_without_kv_scale", MLA, lambda: _mla(E4M3),
        lambda a: {"kv_scale": None},
        TE, "kv_scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "mla_cache_fp16_query_fp32", MLA, _mla,
        lambda a: {"kv_cache": a["kv_cache"].half()},
        TE, "kv_cache", "or an fp8 dtype", "torch.float16",
    ),
    Bad(
        "mla_block_table_int64", MLA, _mla,
        lambda a: {"block_table": a["block_table"].long()},
        TE, "block_table", "dtype int32", "torch.int64",
    ),
    Bad(
        "mla_kv_cache_on_meta", MLA, _mla,
        lambda a: {"kv_cache": a["kv_cache"].to("meta")},
        V, "kv_cache", "a tensor on cpu", "meta",
    ),
    Bad("mla_scale_str", MLA, _mla, lambda a: {"scale": "0.1"}, TE, "scale", "a float", "str"),
    # -- reshape_and_cache --
    Bad(
        "slot_mapping_4_for_3_rows", RC, _reshape,
        lambda a: {"slot_mapping": torch.tensor([5, -1, 40, 41])},
        V, "slot_mapping", "at most 3 entries (the rows of key)", "4 entries",
    ),
    Bad(
        "slot_mapping_float", RC, _reshape,
        lambda a: {"slot_mapping": a["slot_mapping"].float()},
        TE, "slot_mapping", "dtype int64 or int32", "torch.float32",
    ),
    Bad(
        "slot_mapping_rank2", RC, _reshape,
        lambda a: {"slot_mapping": a["slot_mapping"][None]},
        V, "slot_mapping", "a 1-D tensor", "shape [1, 3]",
    ),
    Bad(
        "slot_mapping_on_meta", RC, _reshape,
        lambda a: {"slot_mapping": a["slot_mapping"].to("meta")},
        V, "slot_mapping", "a tensor on cpu", "meta",
    ),
    Bad(
        "rc_key_4_heads_cache_2", RC, _reshape,
        lambda a: {"key": torch.randn(3, 4, D), "value": torch.randn(3, 4, D)},
        V, "key_cache", "shape [NB, BS, 4, 32]", "shape [6, 16, 2, 32]",
    ),
    Bad(
        "rc_value_2_rows_key_3", RC, _reshape,
        lambda a: {"value": a["value"][:2]},
        V, "value", "shape [3, 2, *]", "shape [2, 2, 32]",
    ),
    Bad(
        "rc_value_cache_fp16", RC, _reshape,
        lambda a: {"value_cache": a["value_cache"].half()},
        TE, "value_cache", "dtype float32", "torch.float16",
    ),
    Bad(
        "rc_cache_fp16_key_fp32", RC, _reshape,
        lambda a: {"key_cache": a["key_cache"].half(), "value_cache": a["value_cache"].half()},
        TE, "key_cache", "torch.float32 (the dtype of key) or an fp8 dtype", "torch.float16",
    ),
    Bad(
        "rc_fp8_without_k_scale", RC, lambda: _reshape(E4M3),
        lambda a: {"k_scale": None},
        TE, "k_scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "rc_v_scale_shape_1x1", RC, lambda: _reshape(E5M2),
        lambda a: {"v_scale": torch.ones(1, 1)},
        V, "v_scale", "one element, shape [] or [1]", "shape [1, 1]",
    ),
    Bad(
        "rc_key_cache_last_dim_stride2", RC, _reshape, lambda a: {"key_cache": _strided_last(a["key_cache"])},
        V, "key_cache", "a contiguous last dimension", "strides",
    ),
    Bad("rc_key_list", RC, _reshape, lambda a: {"key": [[0.0]]}, TE, "key", "a torch.Tensor", "list"),
    # -- concat_and_cache_mla --
    Bad(
        "cc_width_72_for_64_plus_16", CC, _concat,
        lambda a: {"kv_cache": torch.randn(6, BS, 72)},
        V, "kv_cache", "row width 80", "72",
    ),
    Bad(
        "cc_k_pe_2_rows_kv_c_3", CC, _concat,
        lambda a: {"k_pe": a["k_pe"][:2]},
        V, "k_pe", "3 rows", "shape [2, 16]",
    ),
    Bad(
        "cc_fp8_without_scale", CC, lambda: _concat(E4M3),
        lambda a: {"scale": None},
        TE, "scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "cc_slot_mapping_4_for_3_rows", CC, _concat,
        lambda a: {"slot_mapping": torch.tensor([1, 2, 3, 4])},
        V, "slot_mapping", "at most 3 entries (the rows of kv_c)", "4 entries",
    ),
    Bad(
        "cc_cache_fp16_kv_c_fp32", CC, _concat,
        lambda a: {"kv_cache": a["kv_cache"].half()},
        TE, "kv_cache", "or an fp8 dtype", "torch.float16",
    ),
    # -- gather_cache --
    Bad(
        "gc_out_width_72_for_80", GC, _gather,
        lambda a: {"out": _poison((14, 72))},
        V, "out", "shape [*, 80]", "shape [14, 72]",
    ),
    Bad(
        "gc_out_3d_for_3d_cache", GC, _gather, lambda a: {"out": _poison((14, 1, LATENT + ROPE))},
        V, "out", "a 2-D tensor", "shape [14, 1, 80]",
    ),
    Bad(
        "gc_out_int32", GC, _gather,
        lambda a: {"out": torch.zeros(14, LATENT + ROPE, dtype=torch.int32)},
        TE, "out", "dtype bfloat16 or float16 or float32", "torch.int32",
    ),
    Bad(
        "gc_out_on_meta", GC, _gather,
        lambda a: {"out": a["out"].to("meta")},
        V, "out", "a tensor on cpu", "meta",
    ),
    Bad(
        "gc_cu_seq_lens_2_for_2_seqs", GC, _gather,
        lambda a: {"cu_seq_lens": torch.tensor([0, 13], dtype=torch.int32)},
        V, "cu_seq_lens", "shape [3]", "shape [2]",
    ),
    Bad(
        "gc_seq_starts_int64", GC, _gather,
        lambda a: {"seq_starts": a["seq_starts"].long()},
        TE, "seq_starts", "dtype int32", "torch.int64",
    ),
    Bad(
        "gc_seq_starts_3_for_2_seqs", GC, _gather,
        lambda a: {"seq_starts": torch.zeros(3, dtype=torch.int32)},
        V, "seq_starts", "shape [2]", "shape [3]",
    ),
    Bad(
        "gc_kv_cache_rank2", GC, _gather,
        lambda a: {"kv_cache": a["kv_cache"][0]},
        V, "kv_cache", "a 3-D [NB, BS, W] or 4-D", "shape [16, 80]",
    ),
    Bad(
        "gc_fp8_without_scale", GC, lambda: _gather(E5M2),
        lambda a: {"scale": None},
        TE, "scale", "a float32 scale tensor", "None",
    ),
    Bad(
        "gc_block_table_int64", GC, _gather,
        lambda a: {"block_table": a["block_table"].long()},
        TE, "block_table", "dtype int32", "torch.int64",
    ),
    # -- caches without a block, caches whose blocks or slots share memory (writes) --
    Bad(
        "key_cache_0_blocks", PA, _paged,
        lambda a: {"key_cache": torch.randn(0, BS, HKV, D), "value_cache": torch.randn(0, BS, HKV, D)},
        V, "key_cache", "at least one block", "shape [0, 16, 2, 32]",
    ),
    Bad(
        "out_key_cache_0_blocks", PAO, _paged_out,
        lambda a: {"key_cache": torch.randn(0, BS, HKV, D), "value_cache": torch.randn(0, BS, HKV, D)},
        V, "key_cache", "at least one block", "shape [0, 16, 2, 32]",
    ),
    Bad(
        "mla_kv_cache_0_blocks", MLA, _mla,
        lambda a: {"kv_cache": torch.randn(0, BS, LATENT + ROPE)},
        V, "kv_cache", "at least one block", "shape [0, 16, 80]",
    ),
    Bad(
        "rc_caches_0_blocks", RC, _reshape,
        lambda a: {"key_cache": torch.randn(0, BS, HKV, D), "value_cache": torch.randn(0, BS, HKV, D)},
        V, "key_cache", "at least one block", "shape [0, 16, 2, 32]",
    ),
    Bad(
        "cc_kv_cache_0_blocks", CC, _concat,
        lambda a: {"kv_cache": torch.randn(0, BS, LATENT + ROPE)},
        V, "kv_cache", "at least one block", "shape [0, 16, 80]",
    ),
    Bad(
        "gc_kv_cache_0_blocks", GC, _gather,
        lambda a: {"kv_cache": torch.randn(0, BS, LATENT + ROPE)},
        V, "kv_cache", "at least one block", "shape [0, 16, 80]",
    ),
    Bad(
        "gc_kv_cache_block_size_0", GC, _gather,
        lambda a: {"kv_cache": torch.randn(6, 0, LATENT + ROPE)},
        V, "kv_cache", "at least one block of at least one slot", "shape [6, 0, 80]",
    ),
    Bad(
        "rc_key_cache_blocks_stride_0", RC, _reshape,
        lambda a: {"key_cache": a["key_cache"][:1].expand(6, -1, -1, -1)},
        V, "key_cache", "blocks and slots do not share memory", "strides (0, 64, 32, 1)",
    ),
    Bad(
        "rc_value_cache_block_stride_half_a_block", RC, _reshape,
        lambda a: {"value_cache": a["value_cache"].as_strided((6, BS, HKV, D), (BS * HKV * D // 2, HKV * D, D, 1))},
        V, "value_cache", "a block stride that holds a block", "strides (512, 64, 32, 1)",
    ),
    Bad(
        "rc_key_cache_heads_overlap", RC, _reshape,
        lambda a: {"key_cache": a["key_cache"].as_strided((6, BS, HKV, D), (BS * HKV * D, HKV * D, D // 2, 1))},
        V, "key_cache", "do not share memory", "strides (1024, 64, 16, 1)",
    ),
    Bad(
        "cc_kv_cache_blocks_stride_0", CC, _concat,
        lambda a: {"kv_cache": a["kv_cache"][:1].expand(6, -1, -1)},
        V, "kv_cache", "blocks and slots do not share memory", "strides (0, 80, 1)",
    ),
    Bad(
        "cc_kv_cache_slots_stride_0", CC, _concat,
        lambda a: {"kv_cache": a["kv_cache"][:, :1].expand(-1, BS, -1)},
        V, "kv_cache", "blocks and slots do not share memory", "strides (1280, 0, 1)",
    ),
    # -- merge_attn_states(_out) --
    Bad(
        "merge_suffix_out_head_size_16", MS, _merge,
        lambda a: {"suffix_out": torch.randn(T, 2, 16)},
        V, "suffix_out", "shape [4, 2, 32]", "shape [4, 2, 16]",
    ),
    Bad(
        "merge_suffix_lse_transposed", MS, _merge,
        lambda a: {"suffix_lse": torch.randn(2, T)},
        V, "suffix_lse", "shape [4, 2]", "shape [2, 4]",
    ),
    Bad(
        "merge_prefix_lse_fp16", MS, _merge,
        lambda a: {"prefix_lse": a["prefix_lse"].half()},
        TE, "prefix_lse", "dtype float32", "torch.float16",
    ),
    Bad(
        "merge_suffix_out_fp16", MS, _merge,
        lambda a: {"suffix_out": a["suffix_out"].half()},
        TE, "suffix_out", "dtype float32", "torch.float16",
    ),
    Bad(
        "merge_prefix_out_list", MS, _merge,
        lambda a: {"prefix_out": [1.0]},
        TE, "prefix_out", "a torch.Tensor", "list",
    ),
    Bad(
        "merge_out_fp16", MSO, _merge_out,
        lambda a: {"out": _poison((T, 2, D), F16)},
        TE, "out", "dtype float32", "torch.float16",
    ),
    Bad(
        "merge_out_lse_fp16", MSO, _merge_out,
        lambda a: {"lse": _poison((T, 2), F16)},
        TE, "lse", "dtype float32", "torch.float16",
    ),
    Bad(
        "merge_out_lse_3_rows", MSO, _merge_out,
        lambda a: {"lse": _poison((3, 2))},
        V, "lse", "shape [4, 2]", "shape [3, 2]",
    ),
    Bad(
        "merge_out_on_meta", MSO, _merge_out,
        lambda a: {"out": a["out"].to("meta")},
        V, "out", "a tensor on cpu", "meta",
    ),
    # -- merge_attn_states_n(_out) --
    Bad(
        "merge_n_outs_rank3", MSN, _merge_n,
        lambda a: {"outs": a["outs"][0]},
        V, "outs", "a 4-D tensor", "shape [4, 2, 32]",
    ),
    Bad(
        "merge_n_zero_parts", MSN, _merge_n,
        lambda a: {"outs": a["outs"][:0], "lses": a["lses"][:0]},
        V, "outs", "at least one part", "shape [0, ...]",
    ),
    Bad(
        "merge_n_lses_head_major", MSN, _merge_n,
        lambda a: {"lses": torch.randn(3, 2, T)},
        V, "lses", "shape [3, 4, 2]", "shape [3, 2, 4]",
    ),
    Bad(
        "merge_n_lses_2_parts", MSN, _merge_n,
        lambda a: {"lses": a["lses"][:2]},
        V, "lses", "shape [3, 4, 2]", "shape [2, 4, 2]",
    ),
    Bad(
        "merge_n_lses_bf16", MSN, _merge_n,
        lambda a: {"lses": a["lses"].bfloat16()},
        TE, "lses", "dtype float32", "torch.bfloat16",
    ),
    Bad(
        "merge_n_outs_int32", MSN, _merge_n,
        lambda a: {"outs": a["outs"].int()},
        TE, "outs", "dtype bfloat16 or float16 or float32", "torch.int32",
    ),
    Bad(
        "merge_n_lses_list", MSN, _merge_n,
        lambda a: {"lses": [0.0]},
        TE, "lses", "a torch.Tensor", "list",
    ),
    Bad(
        "merge_n_out_fp16", MSNO, _merge_n_out,
        lambda a: {"out": _poison((T, 2, D), F16)},
        TE, "out", "dtype float32", "torch.float16",
    ),
    Bad(
        "merge_n_out_3_parts_shape", MSNO, _merge_n_out,
        lambda a: {"out": _poison((3, T, 2, D))},
        V, "out", "a 3-D tensor", "shape [3, 4, 2, 32]",
    ),
    Bad(
        "merge_n_out_lse_transposed", MSNO, _merge_n_out,
        lambda a: {"lse": _poison((2, T))},
        V, "lse", "shape [4, 2]", "shape [2, 4]",
    ),
]


@pytest.mark.parametrize("op", [PA, MLA])
@pytest.mark.parametrize("what", ["tokens", "key_positions"])
def test_more_than_2pow28_positions_are_rejected(op: str, what: str, monkeypatch):
    """At most 2^28 query tokens and key positions (block table columns x block size) a call:
    every position plus any window or chunk size then fits the kernels' int32 arithmetic.
    Stride-0 views: nothing that large is allocated."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    args = _paged() if op == PA else _mla()
    if what == "tokens":
        for name in ("query",) if op == PA else ("q_latent", "q_rope"):
            args[name] = args[name][:1, :1].expand(2**28 + 1, HQ, -1)
        arg, expected, got = ("query" if op == PA else "q_latent"), "at most 2^28 = 268435456 tokens", "268435457"
    else:
        args["block_table"] = args["block_table"][:, :1].expand(2, 2**24 + 1)
        arg, expected, got = "block_table", "at most 2^28 = 268435456 key positions", "16777217 x 16 = 268435472"
    with pytest.raises(ValueError, match=_message_pattern(op, arg, expected, got)):
        getattr(pa, op)(**args)


@pytest.mark.parametrize("op", [PA, PAO])
def test_debug_rejects_a_query_length_hint_below_a_query(op: str, monkeypatch):
    """max_query_len, when > 0, bounds every query length (query lengths here: 1 and 3); 0 and -1
    mean no hint, and any larger value (2^31 - 1 included) is a true bound."""
    monkeypatch.setenv(DEBUG_ENV, "1")
    args = _paged() if op == PA else _paged_out()
    for hint in (-1, 0, 3, 4, 2**31 - 1, 2**40):
        getattr(pa, op)(**args, max_query_len=hint)
    for hint in (1, 2):
        with pytest.raises(ValueError, match=_message_pattern(op, "max_query_len", f"(<= {hint})", "3 at")):
            getattr(pa, op)(**args, max_query_len=hint)


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_input_is_rejected(case: Bad, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    args = case.base()
    args.update(case.change(args))
    before = _snapshot(args)
    with pytest.raises(case.exc, match=_message_pattern(case.op, case.arg, case.expected, case.got)):
        getattr(pa, case.op)(**args)
    _assert_unchanged(args, before)


def test_bad_cases_are_distinct():
    assert len({c.id for c in BAD}) == len(BAD)
    assert {c.op for c in BAD} == {PA, PAO, MLA, RC, CC, GC, MS, MSO, MSN, MSNO}


# -- value errors: caught under TORCH_PAGED_ATTN_DEBUG=1, masked without it -------------------------


def _run(op: str, args: dict) -> tuple[Tensor, ...]:
    """Call ``op`` and return what it produced: its outputs, or the tensors it writes."""
    result = getattr(pa, op)(**args)
    if op in (PA, MLA):
        return result
    if op == RC:
        return args["key_cache"], args["value_cache"]
    if op == CC:
        return (args["kv_cache"],)
    if op == GC:
        return (args["out"],)
    raise AssertionError(op)


def _same_rows(rows: slice | None, nan_free: bool = True) -> Callable[[str, dict, dict], None]:
    """Without debug the call runs, and ``rows`` of every output (the sequences the bad value does
    not touch) equal those of the valid call. With ``nan_free`` its outputs hold no NaN: uncovered
    cache slots, which hold NaN, stay masked. (A seq_len past the slots written declares those
    slots covered, so their NaN is the declared data.)"""

    def check(op: str, valid: dict, bad: dict) -> None:
        want = _run(op, valid)
        got = _run(op, bad)
        for w, g in zip(want, got):
            if nan_free:
                assert not torch.isnan(g).any(), "NaN from an uncovered cache slot leaked into the output"
            if rows is not None:
                assert torch.equal(g[rows], w[rows])

    return check


def _gather_rows(same: slice, written: slice) -> Callable[[str, dict, dict], None]:
    """Without debug gather_cache runs: rows ``same`` (sequences the bad value does not touch)
    equal the valid call's, and rows ``written`` (those some sequence still claims; ``out`` starts
    as NaN) hold no NaN."""

    def check(op: str, valid: dict, bad: dict) -> None:
        (want,) = _run(op, valid)
        (got,) = _run(op, bad)
        assert torch.equal(got[same], want[same])
        assert not torch.isnan(got[written]).any()

    return check


def _slots_skipped(op: str, valid: dict, bad: dict) -> None:
    """Without debug, slots outside the cache are skipped like negative ones: the cache equals
    the original with only the in-range slots written (computed here by a Python loop)."""
    if op == RC:
        pairs = [(bad["key"], bad["key_cache"]), (bad["value"], bad["value_cache"])]
    else:
        pairs = [(torch.cat([bad["kv_c"], bad["k_pe"]], dim=-1), bad["kv_cache"])]
    expected = [cache.clone() for _, cache in pairs]
    for (rows, cache), want in zip(pairs, expected):
        num_slots = cache.shape[0] * cache.shape[1]
        for t, slot in enumerate(bad["slot_mapping"].tolist()):
            if 0 <= slot < num_slots:
                want[slot // cache.shape[1], slot % cache.shape[1]] = rows[t]
    got = _run(op, bad)
    for g, w in zip(got, expected):
        assert torch.equal(_bits(g), _bits(w))


@dataclass
class DebugBad:
    id: str
    op: str
    base: Callable[[], dict]
    change: Callable[[dict], dict]
    arg: str
    expected: str
    got: str  # "<value> at <arg>[<index>]": the first bad entry
    without_debug: Callable[[str, dict, dict], None]


SEQ0_ROWS = slice(0, 1)  # sequence 0 owns query row 0 (one new token)
SEQ1_ROWS = slice(1, 4)  # sequence 1 owns rows 1..3
NUM_SLOTS = 6 * BS
CAPACITY = "lengths <= block_table capacity 2 x 16 = 32"
BLOCK_IDS = "block ids in [0, 6) in the used part"
SLOTS = f"slots < num_blocks * block_size = {NUM_SLOTS}"


def _i32(*values: int) -> Tensor:
    return torch.tensor(values, dtype=torch.int32)


DEBUG_BAD = [
    # -- paged_attention: lengths, block ids, query_start_loc --
    DebugBad(
        "seq_lens_33_capacity_32", PA, _paged, lambda a: {"seq_lens": _with(a["seq_lens"], (0,), 33)},
        "seq_lens", CAPACITY, "33 at seq_lens[0]", _same_rows(SEQ1_ROWS, nan_free=False),
    ),
    DebugBad(
        "seq_lens_negative", PA, _paged, lambda a: {"seq_lens": _with(a["seq_lens"], (1,), -1)},
        "seq_lens", "non-negative lengths", "-1 at seq_lens[1]", _same_rows(SEQ0_ROWS),
    ),
    DebugBad(
        "block_id_num_blocks", PA, _paged, lambda a: {"block_table": _with(a["block_table"], (0, 1), 6)},
        "block_table", BLOCK_IDS, "6 at block_table[0, 1]", _same_rows(SEQ1_ROWS),
    ),
    DebugBad(
        "block_id_negative", PA, _paged, lambda a: {"block_table": _with(a["block_table"], (1, 0), -1)},
        "block_table", BLOCK_IDS, "-1 at block_table[1, 0]", _same_rows(SEQ0_ROWS),
    ),
    DebugBad(
        "block_id_int32_max", PA, _paged,
        lambda a: {"block_table": _with(a["block_table"], (0, 0), 2**31 - 1)},
        "block_table", BLOCK_IDS, f"{2**31 - 1} at block_table[0, 0]", _same_rows(SEQ1_ROWS),
    ),
    DebugBad(
        "query_start_loc_starts_at_1", PA, _paged, lambda a: {"query_start_loc": _i32(1, 1, 4)},
        "query_start_loc", "query_start_loc[0] == 0", "1 at query_start_loc[0]", _same_rows(SEQ1_ROWS),
    ),
    DebugBad(
        "query_start_loc_decreasing", PA, _paged, lambda a: {"query_start_loc": _i32(0, 3, 2)},
        "query_start_loc", "non-decreasing values", "2 at query_start_loc[2]", _same_rows(None),
    ),
    DebugBad(
        "query_start_loc_past_tokens", PA, _paged, lambda a: {"query_start_loc": _i32(0, 1, 9)},
        "query_start_loc", "query_start_loc[-1] <= num_tokens (4)", "9 at query_start_loc[2]",
        _same_rows(SEQ0_ROWS),
    ),
    # -- mla_decode shares the batch checks --
    DebugBad(
        "mla_block_id_num_blocks", MLA, _mla, lambda a: {"block_table": _with(a["block_table"], (1, 0), 6)},
        "block_table", BLOCK_IDS, "6 at block_table[1, 0]", _same_rows(SEQ0_ROWS),
    ),
    DebugBad(
        "mla_seq_lens_past_capacity", MLA, _mla, lambda a: {"seq_lens": _with(a["seq_lens"], (1,), 40)},
        "seq_lens", CAPACITY, "40 at seq_lens[1]", _same_rows(SEQ0_ROWS, nan_free=False),
    ),
    # -- slots: negative ones mean padding, those at or past num_blocks * block_size are bad --
    DebugBad(
        "rc_slot_num_slots", RC, _reshape, lambda a: {"slot_mapping": torch.tensor([5, NUM_SLOTS, 40])},
        "slot_mapping", SLOTS, f"{NUM_SLOTS} at slot_mapping[1]", _slots_skipped,
    ),
    DebugBad(
        "rc_slot_2pow40", RC, _reshape, lambda a: {"slot_mapping": torch.tensor([2**40, -1, 40])},
        "slot_mapping", SLOTS, f"{2**40} at slot_mapping[0]", _slots_skipped,
    ),
    DebugBad(
        "rc_slot_int32", RC, _reshape, lambda a: {"slot_mapping": _i32(5, 1000, 40)},
        "slot_mapping", SLOTS, "1000 at slot_mapping[1]", _slots_skipped,
    ),
    DebugBad(
        "cc_slot_num_slots_plus_3", CC, _concat,
        lambda a: {"slot_mapping": torch.tensor([NUM_SLOTS + 3, -1, 40])},
        "slot_mapping", SLOTS, f"{NUM_SLOTS + 3} at slot_mapping[0]", _slots_skipped,
    ),
    # -- gather_cache: cu_seq_lens, seq_starts, block ids --
    DebugBad(
        "gc_cu_seq_lens_starts_at_1", GC, _gather, lambda a: {"cu_seq_lens": _i32(1, 10, 13)},
        "cu_seq_lens", "cu_seq_lens[0] == 0", "1 at cu_seq_lens[0]",
        _gather_rows(slice(10, 13), slice(1, 13)),
    ),
    DebugBad(
        "gc_cu_seq_lens_decreasing", GC, _gather, lambda a: {"cu_seq_lens": _i32(0, 10, 9)},
        "cu_seq_lens", "non-decreasing values", "9 at cu_seq_lens[2]", _gather_rows(slice(0, 9), slice(0, 9)),
    ),
    DebugBad(
        "gc_cu_seq_lens_past_out_rows", GC, _gather, lambda a: {"cu_seq_lens": _i32(0, 10, 15)},
        "cu_seq_lens", "cu_seq_lens[-1] <= rows of out (14)", "15 at cu_seq_lens[2]",
        _gather_rows(slice(0, 10), slice(0, 10)),
    ),
    DebugBad(
        "gc_seq_starts_past_capacity", GC, _gather,
        lambda a: {"seq_starts": _with(a["seq_starts"], (1,), 30)},
        "seq_starts", "start + length <= block_table capacity 32", "33 at seq_starts[1]",
        _gather_rows(slice(0, 10), slice(0, 13)),
    ),
    DebugBad(
        "gc_seq_starts_negative", GC, _gather, lambda a: {"seq_starts": _with(a["seq_starts"], (0,), -4)},
        "seq_starts", "non-negative starts", "-4 at seq_starts[0]", _gather_rows(slice(10, 13), slice(0, 13)),
    ),
    DebugBad(
        "gc_block_id_num_blocks", GC, _gather, lambda a: {"block_table": _with(a["block_table"], (0, 1), 6)},
        "block_table", BLOCK_IDS, "6 at block_table[0, 1]", _gather_rows(slice(10, 13), slice(0, 13)),
    ),
]

@pytest.mark.parametrize("case", DEBUG_BAD, ids=[c.id for c in DEBUG_BAD])
def test_debug_value_check_rejects(case: DebugBad, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    args = case.base()
    args.update(case.change(args))
    before = _snapshot(args)
    with pytest.raises(ValueError, match=_message_pattern(case.op, case.arg, case.expected, case.got)):
        getattr(pa, case.op)(**args)
    _assert_unchanged(args, before)


@pytest.mark.parametrize("case", DEBUG_BAD, ids=[c.id for c in DEBUG_BAD])
def test_without_debug_bad_values_are_masked(case: DebugBad, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    valid = case.base()
    bad = case.base()
    bad.update(case.change(bad))
    case.without_debug(case.op, valid, bad)


VALID = [
    ("paged_f32", PA, _paged),
    ("paged_fp8_e4m3", PA, lambda: _paged(E4M3)),
    ("paged_out", PAO, _paged_out),
    ("mla_f32", MLA, _mla),
    ("mla_fp8_e5m2", MLA, lambda: _mla(E5M2)),
    ("reshape_f32", RC, _reshape),
    ("reshape_fp8_e4m3", RC, lambda: _reshape(E4M3)),
    ("concat_f32", CC, _concat),
    ("gather_f32", GC, _gather),
    ("gather_fp8_e4m3", GC, lambda: _gather(E4M3)),
    ("merge", MS, _merge),
    ("merge_out", MSO, _merge_out),
]


@pytest.mark.parametrize(("op", "base"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_valid_inputs_pass_debug_checks(op: str, base: Callable[[], dict], monkeypatch):
    """The debug checks accept the valid calls every case starts from (garbage in the unused part
    of the block table included), and what the op produces is finite: the NaN in uncovered cache
    slots stays masked and every row of a NaN-poisoned ``out``/``lse`` it owns is written."""
    monkeypatch.setenv(DEBUG_ENV, "1")
    args = base()
    result = getattr(pa, op)(**args)
    if op in (PA, MLA, MS):
        produced = result
    elif op in (PAO, MSO):
        produced = (args["out"], args["lse"])
    elif op == GC:
        produced = (args["out"][:13],)  # row 13 is spare: no sequence gathers into it
    else:
        produced = (args["key_cache"] if op == RC else args["kv_cache"],)
    for t in produced:
        assert torch.isfinite(t.float()).all()


# -- remembered plans of valid calls (lowering.plan) never let a bad one through ----------------------


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_input_is_rejected_after_a_valid_call(case: Bad, monkeypatch):
    """The op remembers the signature of a valid call (shapes, strides, dtypes, devices, option
    values); the same call with one argument broken still fails validation."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    args = case.base()
    getattr(pa, case.op)(**args)
    getattr(pa, case.op)(**args)  # now from the remembered signature
    args.update(case.change(args))
    with pytest.raises(case.exc, match=_message_pattern(case.op, case.arg, case.expected, case.got)):
        getattr(pa, case.op)(**args)


@pytest.mark.parametrize("case", DEBUG_BAD, ids=[c.id for c in DEBUG_BAD])
def test_debug_value_check_rejects_after_a_valid_call(case: DebugBad, monkeypatch):
    """Value checks run on every call under TORCH_PAGED_ATTN_DEBUG=1, whatever was remembered:
    the bad values here keep the valid call's shapes, strides and dtypes."""
    args = case.base()
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    getattr(pa, case.op)(**case.base())
    getattr(pa, case.op)(**case.base())
    monkeypatch.setenv(DEBUG_ENV, "1")
    args.update(case.change(args))
    with pytest.raises(ValueError, match=_message_pattern(case.op, case.arg, case.expected, case.got)):
        getattr(pa, case.op)(**args)
