# Archived with decode_sm90_fp8.py (see its header); passed on an H100 with the kernel planned (logs/call4, logs/call7).
"""The Gluon sm_90 fp8 decode kernel (``lowering/triton/decode_sm90_fp8.py``).

CPU tier: the planner's choice (which calls it takes, its grid, split plan and launch arguments)
with the launches captured instead of run. GPU tier (an sm_90 device with a tested Triton): every
call it takes against the reference on the float32 upcast (``check_against_reference``: the
budget is the reference's own error), outputs and LSEs NaN-poisoned, caches NaN in uncovered
slots and garbage past each sequence's blocks (``make_inputs``); block sizes 8 .. 128, head sizes
64 and 128, 1 .. 16 query heads a kv head, e4m3 and e5m2, bf16 and fp16 queries, scales other
than 1, causal speculative tokens, padding rows, empty sequences, lengths 0, 1, BS +- 1 and across
the 64-key tiles, splits forced and planned, strided caches bitwise, bad block ids, CUDA-graph
replay and torch.compile, and a fuzz.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from test_triton_paged_attention import (  # noqa: E402
    BF16, FP16, FP32, Case, _fuzz_case, _fuzz_family, _strided_cache, check_against_reference, check_bad_block_ids,
    check_fp8_query_magnitudes, check_graph_replay, gpu_tier, make_inputs, run_triton,
)

import torch_paged_attn  # noqa: E402  (registers the ops)
from torch_paged_attn import _config, lowering  # noqa: E402
from torch_paged_attn.lowering.triton import _sm90, decode_sm90_fp8  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
I32 = torch.int32


# -- CPU tier: the plan ------------------------------------------------------------------------

@pytest.fixture
def planned(monkeypatch):
    """The planner as on a 132-SM sm_90 device with Gluon (programmatic dependent launch on), the
    Gluon fp8 decode kernel switched on, every launch captured as ``(kernel, grid, constants)`` and
    not run."""
    if _sm90.gl is None:
        pytest.skip("this Triton has no Gluon")
    made = []

    def launcher(kernel, grid, **constants):
        made.append((kernel, grid, constants))
        return lambda like, **tensors: made.append(("call", kernel, tensors))

    monkeypatch.setattr(_sm90, "unavailable", lambda t: None)
    monkeypatch.setattr(tpa, "SM90_FP8_DECODE", True)
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 132)
    monkeypatch.setattr(tpa, "use_pdl", lambda device: True)
    monkeypatch.setattr(tpa, "launcher", launcher)
    monkeypatch.setattr(decode_sm90_fp8, "launcher", launcher)
    return made


def _plan(made: list, *, tokens=4, seqs=4, heads=8, kv_heads=2, head_size=128, block_size=16, pages=64,
          dtype=BF16, cache_dtype=E4M3, with_lse=True, **options):
    """Plan and run one decode call on CPU tensors (the launches are captured): the kernels
    launched, in order."""
    q = torch.randn(tokens, heads, head_size, dtype=dtype)
    kc = torch.zeros(seqs * pages, block_size, kv_heads, head_size, dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    table = torch.arange(seqs * pages, dtype=I32).view(seqs, pages)
    lens, qsl = torch.full((seqs,), 5, dtype=I32), torch.arange(seqs + 1, dtype=I32).clamp(max=tokens)
    out, lse = torch.empty_like(q), torch.empty(tokens, heads) if with_lse else None
    scale = torch.ones(())
    opts = dict(scale=0.1, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None,
                k_scale=scale, v_scale=scale, attention_chunk_size=0)
    opts.update(options)
    made.clear()
    tpa.paged_attention(q, kc, vc, table, lens, qsl, out, lse, max_query_len=1, **opts)
    return [m for m in made if m[0] != "call"], [m for m in made if m[0] == "call"], (q, kc, vc, out, lse)


def test_plans_the_gluon_kernel_unsplit(planned) -> None:
    """B64 x 4096, Hq 32, Hkv 8 (512 programs fill the 396 resident slots): one launch of the
    Gluon kernel, grid (kv heads, tokens, 1), no workspace, every parameter fixed in the plan or a
    tensor of the call, the caches as their descriptors' bases."""
    plans, calls, (q, kc, vc, out, lse) = _plan(planned, tokens=64, seqs=64, heads=32, kv_heads=8, pages=256)
    assert [k for k, _, _ in plans] == [decode_sm90_fp8._decode_fp8_kernel]
    (kernel, grid, fixed), (_, _, tensors) = plans[0], calls[0]
    assert grid == (8, 64, 1)
    assert (fixed["GROUP"], fixed["HEAD_SIZE"], fixed["BLOCK_SIZE"], fixed["BOX"], fixed["STAGES"]) == (4, 128, 16, 16, 3)
    assert fixed["LSE_UNIT"] == pytest.approx(0.6931471805599453) and fixed["HAS_LSE"] and not fixed["USE_PDL"]
    assert fixed["k_desc"].shape == (64 * 256 * 16, 8 * 128) and fixed["k_desc"].block_shape == (16, 64)
    assert fixed["k_head_cols"] == 128 and fixed["k_head_rows"] == 0 and fixed["k_block_rows"] == 16
    assert tensors["k_desc"] is kc and tensors["v_desc"] is vc and tensors["out_ptr"] is out and tensors["lse_ptr"] is lse
    params = {p.name for p in kernel.params}
    assert params == (set(fixed) - {"num_warps"}) | set(tensors), params ^ (set(fixed) | set(tensors))


def test_plans_splits_through_the_combine_kernel(planned) -> None:
    """B1 x 32768 (8 programs unsplit): split until the 396 resident slots (3 an SM) are filled
    (49 splits a program, 669 keys, 704 rounded up to the 64-key tile: 47 splits of 704), partials
    [T, S, Hq, D] / [T, S, Hq] in log2 for ``_combine_kernel``, which applies v_scale (IS_FP8); no
    LSE asked for, the combine writes none."""
    plans, calls, (q, kc, vc, out, lse) = _plan(planned, tokens=1, seqs=1, heads=32, kv_heads=8, pages=2048,
                                                with_lse=False)
    assert [k for k, _, _ in plans] == [tpa._combine_kernel, decode_sm90_fp8._decode_fp8_kernel]
    (_, cgrid, combine), (_, grid, fixed) = plans
    splits = grid[2]
    assert grid[:2] == (8, 1) and splits == 47 and fixed["split_tokens"] == 704
    assert fixed["LSE_UNIT"] == 1.0 and fixed["HAS_LSE"] and fixed["USE_PDL"]
    assert combine["IS_FP8"] and not combine["HAS_LSE"] and combine["num_splits"] == splits
    part_out, part_lse = calls[0][2]["out_ptr"], calls[0][2]["lse_ptr"]
    assert part_out.shape == (1, splits, 32, 128) and part_lse.shape == (1, splits, 32)
    assert calls[1][2]["part_out_ptr"] is part_out and calls[1][2]["out_ptr"] is out


@pytest.mark.parametrize("change", [
    dict(window_left=10), dict(softcap=5.0), dict(sinks=torch.zeros(8)), dict(alibi_slopes=torch.zeros(8)),
    dict(attention_chunk_size=64), dict(heads=64, kv_heads=2), dict(head_size=96), dict(head_size=256),
    dict(dtype=FP32), dict(cache_dtype=BF16, dtype=BF16), dict(block_size=24), "invariant", "off",
], ids=["window", "softcap", "sinks", "alibi", "chunk", "group32", "D96", "D256", "fp32", "bf16cache", "bs24",
        "invariant", "off"])
def test_declined_calls_run_the_triton_kernel(change, planned, monkeypatch) -> None:
    """What the Gluon kernel does not take runs ``_attention_kernel``; so does every call with the
    switch off (the default)."""
    if change == "off":
        monkeypatch.setattr(tpa, "SM90_FP8_DECODE", False)
        change = {}
    if change == "invariant":
        monkeypatch.setattr(_config, "is_batch_invariant", lambda: True)
        change = {}
    plans, _, _ = _plan(planned, **change)
    assert decode_sm90_fp8._decode_fp8_kernel not in [k for k, _, _ in plans]
    assert tpa._attention_kernel in [k for k, _, _ in plans]


def test_prefill_like_calls_do_not_plan_it(planned) -> None:
    """Only decode-planned calls: a prefill-like call (max_query_len > 1) does not take it."""
    q = torch.randn(40, 8, 128, dtype=BF16)
    kc = torch.zeros(8, 16, 2, 128, dtype=E4M3)
    table, lens, qsl = torch.arange(8, dtype=I32).view(1, 8), torch.tensor([100], dtype=I32), torch.tensor([0, 40], dtype=I32)
    scale = torch.ones(())
    tpa.paged_attention(q, kc, kc.clone(), table, lens, qsl, torch.empty_like(q), None, scale=0.1, causal=True,
                        window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, sinks=None, k_scale=scale,
                        v_scale=scale, attention_chunk_size=0, max_query_len=40)
    assert decode_sm90_fp8._decode_fp8_kernel not in [m[0] for m in planned]


# -- GPU tier: the kernel on the device --------------------------------------------------------

@pytest.fixture
def gluon_decode(monkeypatch):
    """On an sm_90 device with a tested Triton's Gluon, the Gluon fp8 decode kernel switched on: the
    calls it planned are recorded (each ``prepare``'s split_tokens argument)."""
    if not torch.cuda.is_available() or _sm90.unavailable(torch.empty(0, device="cuda")):
        pytest.skip("the Gluon decode kernel runs on sm_90 with a tested Triton's Gluon only")
    monkeypatch.setattr(tpa, "SM90_FP8_DECODE", True)  # (off by default: paged_attention.SM90_FP8_DECODE)
    monkeypatch.setattr(lowering, "_CHOICES", {})  # no plan made before this test
    launched = []
    real = decode_sm90_fp8.prepare
    monkeypatch.setattr(decode_sm90_fp8, "prepare", lambda *a, **k: launched.append(k["split_tokens"]) or real(*a, **k))
    return launched


_DECODE = dict(q_lens=(1, 1, 1, 1, 1, 1), kv_lens=(1023, 1, 16, 0, 700, 2100))
_BASE = Case(**_DECODE, num_heads=8, num_kv_heads=2, head_size=128, cache_dtype=E4M3)
_GLUON_CASES = (
    [replace(_BASE, block_size=bs) for bs in (8, 16, 32, 64, 128)]
    + [replace(_BASE, head_size=64, block_size=bs) for bs in (16, 64)]
    + [replace(_BASE, num_heads=h, num_kv_heads=kv) for h, kv in ((4, 4), (6, 2), (32, 8), (16, 1), (32, 2))]
    + [replace(_BASE, cache_dtype=E5M2), replace(_BASE, dtype=FP16), replace(_BASE, cache_dtype=E5M2, dtype=FP16),
       replace(_BASE, causal=False, with_lse=False),
       # padding rows past query_start_loc[-1] (6 tokens over 6 sequences: decode-planned)
       Case((1, 1, 0, 1, 0, 0), (1023, 1, 16, 700, 0, 5), num_heads=8, num_kv_heads=2, head_size=128,
            cache_dtype=E4M3, pad_tokens=3),
       # speculative tokens in a decode-planned call (3 tokens over 4 sequences): causal within the sequence
       Case((2, 0, 1, 0), (70, 0, 129, 64), num_heads=8, num_kv_heads=2, head_size=128, cache_dtype=E4M3),
       Case((3, 0, 0, 0, 0), (3, 5, 0, 64, 65), num_heads=16, num_kv_heads=2, head_size=64, cache_dtype=E5M2,
            causal=False),
       # lengths across the tile edges: 63, 64, 65, 127, 128, 129 keys
       Case((1,) * 6, (63, 64, 65, 127, 128, 129), num_heads=8, num_kv_heads=1, head_size=128, cache_dtype=E4M3)]
    + [replace(_BASE, split_tokens=s) for s in (64, 128, 1024)]
    + [replace(_BASE, split_tokens=64, with_lse=False, block_size=8)]
)


@gpu_tier
@pytest.mark.parametrize("case", _GLUON_CASES, ids=lambda c: c.id + (f"_split{c.split_tokens}" if c.split_tokens else ""))
def test_gluon_decode_kernel_cuda(case: Case, gluon_decode, monkeypatch) -> None:
    """Against the reference on the float32 upcast, with k_scale and v_scale other than 1; the
    cached launcher in check mode (Triton confirms each binary it launches)."""
    monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
    options["k_scale"] = torch.tensor(0.75, device="cuda")
    options["v_scale"] = torch.tensor([1.5], device="cuda")
    out, lse = run_triton(batch, options, with_lse=case.with_lse, split_tokens=case.split_tokens)
    assert gluon_decode, "the Gluon decode kernel did not run"
    check_against_reference(batch, options, out, lse, case.dtype)


@gpu_tier
def test_gluon_decode_kernel_planned_splits_cuda(gluon_decode) -> None:
    """A batch of one long sequence (8 programs unsplit) is split until the SMs are filled; the
    combine kernel merges the partials (v_scale applied there)."""
    case = Case((1,), (32768 - 5,), num_heads=32, num_kv_heads=8, head_size=128, cache_dtype=E4M3)
    batch, options = make_inputs(case, "cuda", seed=21)
    options["v_scale"] = torch.tensor(0.5, device="cuda")
    out, lse = run_triton(batch, options)
    assert gluon_decode, "the Gluon decode kernel did not run"
    check_against_reference(batch, options, out, lse, BF16)


@gpu_tier
def test_gluon_decode_kernel_query_magnitudes_cuda(gluon_decode) -> None:
    """bf16 queries of 2^30 and 2^-30 (the query tile scaled into fp16's range by a power of two)."""
    check_fp8_query_magnitudes("cuda", 128, q_lens=(1, 1, 1))
    assert gluon_decode, "the Gluon decode kernel did not run"


@gpu_tier
def test_gluon_decode_kernel_bad_block_ids_cuda(gluon_decode) -> None:
    """Block ids outside [0, NB) (-1, NB, -2^31, 2^31 - 1) hide their keys, unsplit and split."""

    def ran() -> None:
        assert gluon_decode, "the Gluon decode kernel did not run"

    for bs in (8, 64):
        case = Case((1,) * 5, (100, 50, 640, 7, 129), num_heads=8, num_kv_heads=2, head_size=128, block_size=bs,
                    cache_dtype=E4M3)
        check_bad_block_ids("cuda", case, (None, 64), ran)


@gpu_tier
@pytest.mark.parametrize("layout", ["cross_layer", "hnd", "mixed"])
def test_gluon_decode_kernel_strided_caches_bitwise_cuda(layout: str, gluon_decode) -> None:
    """DESIGN.md section 2: a layer of a cross-layer cache, an HND view, and K contiguous with V
    an HND view give the contiguous caches' bits (each cache's ``[rows, W]`` view)."""
    for case in (Case((1,) * 4, (300, 37, 700, 9), num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                      cache_dtype=E4M3),
                 Case((1,) * 3, (260, 9, 64), num_heads=16, num_kv_heads=2, head_size=64, block_size=64,
                      cache_dtype=E5M2)):
        batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
        gluon_decode.clear()
        want = run_triton(batch, options)
        assert gluon_decode, "the Gluon decode kernel did not run"
        check_against_reference(batch, options, *want, case.dtype)
        k, v = batch.key_cache, batch.value_cache
        if layout == "mixed":
            batch.value_cache = _strided_cache(v, "hnd")
        else:
            batch.key_cache, batch.value_cache = _strided_cache(k, layout), _strided_cache(v, layout)
        gluon_decode.clear()
        got = run_triton(batch, options)
        assert gluon_decode, f"the Gluon decode kernel did not take the {layout} caches"
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (layout, case.id)


@gpu_tier
def test_gluon_decode_kernel_agrees_with_the_triton_kernel_cuda(gluon_decode, monkeypatch) -> None:
    """The benchmark's shape, smaller (B16 x 1000, Hq 32, Hkv 8): both kernels within the
    reference's budget of each other's truth (the Triton kernel switched off and on)."""
    case = Case((1,) * 16, tuple(1000 - 37 * i for i in range(16)), num_heads=32, num_kv_heads=8, head_size=128,
                cache_dtype=E4M3)
    batch, options = make_inputs(case, "cuda", seed=4)
    got = run_triton(batch, options)
    assert gluon_decode, "the Gluon decode kernel did not run"
    check_against_reference(batch, options, *got, BF16)
    monkeypatch.setattr(tpa, "SM90_FP8_DECODE", False)
    monkeypatch.setattr(lowering, "_CHOICES", {})
    gluon_decode.clear()
    triton_out = run_triton(batch, options)
    assert not gluon_decode, "the Gluon kernel ran with SM90_FP8_DECODE off"
    check_against_reference(batch, options, *triton_out, BF16)


@gpu_tier
def test_gluon_decode_kernel_cuda_graph_and_compile(gluon_decode) -> None:
    """Captured once with no host synchronisation, replayed on new lengths and block tables of the
    same shapes; the public op under torch.compile(fullgraph=True) gives the eager bits."""

    def ran() -> None:
        assert gluon_decode, "the Gluon decode kernel did not run"

    static, options = check_graph_replay(
        4, ([1, 1, 1, 1], [900, 1, 40, 1200]), (([1, 1, 1, 1], [30, 1270, 0, 5]), ([1, 1, 1, 1], [1, 2, 3, 1100])),
        after_warmup=ran, cache_dtype=E4M3)
    public = {k: v for k, v in options.items() if k in ("scale", "k_scale", "v_scale")}

    def functional(q, kc, vc, bt, sl, qsl):
        return torch_paged_attn.paged_attention(q, kc, vc, bt, sl, qsl, return_lse=True, **public)

    gluon_decode.clear()
    eager = functional(*static.args())
    compiled = torch.compile(functional, fullgraph=True)(*static.args())
    ran()
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(10))
def test_gluon_decode_kernel_fuzz_cuda(family: int, gluon_decode) -> None:
    """500 decode configurations the Gluon kernel takes (seeds 500000 + 50 f ..): the fuzz
    families with its sizes (head size 64 / 128, block sizes 8 .. 128, 1 .. 16 query heads a kv
    head, e4m3 / e5m2, bf16 / fp16) and none of the features it declines; lengths 0, 1, BS +- 1
    and up to 700 keys, padding rows, forced splits; planned with ``max_query_len`` 1."""
    rng = random.Random(500000 + family)
    f = _fuzz_family(rng)
    f.update(decode=True, head_size=rng.choice((64, 128)), head_size_v=None, block_size=rng.choice((8, 16, 32, 64, 128)),
             group=rng.choice((1, 3, 4, 8, 16)), cache_dtype=rng.choice((E4M3, E5M2)), window=False, softcap=False,
             alibi=False, sinks=False, chunk=False, dtype=rng.choice((BF16, BF16, FP16)))
    for draw in range(50):
        seed = 500000 + family * 50 + draw
        case = replace(_fuzz_case(f, random.Random(seed)), hint=False)
        gluon_decode.clear()
        batch, options = make_inputs(case, "cuda", seed)
        # planned as decode (max_query_len 1, as a serving engine's decode step) whatever the padding rows
        out, lse = run_triton(batch, options, with_lse=case.with_lse, split_tokens=case.split_tokens,
                              max_query_len=1)
        try:
            assert gluon_decode or not batch.query.shape[0], "the Gluon decode kernel did not run"
            check_against_reference(batch, options, out, lse, case.dtype)
        except AssertionError as e:
            raise AssertionError(f"fuzz seed {seed}: {case.id}: {e}") from e
