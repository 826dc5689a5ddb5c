"""The Hopper prefill kernel (``lowering/triton/prefill.py``) against the float64 loop.

The interpreter tier makes the planner take the prefill kernel on the CPU (its capability lookup
answers 9.0 and every tile table entry is shrunk to tiny shapes, both packed and one-head rows),
then checks tiny cases of every feature against ``tests/_loop.py`` with the budget of the
reference's own error (``assert_close``); outputs and LSEs are NaN-poisoned, caches hold NaN in
uncovered slots and garbage past each sequence's blocks (``make_paged_batch``). The GPU tier
checks that an sm_90 device plans the kernel for the benchmark's prefill shapes, and that the
decode path and batch-invariant mode never take it.
"""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

import _loop as loop  # noqa: E402
from test_triton_paged_attention import (  # noqa: E402
    BF16, FP16, FP32, Case, _fuzz_case, _fuzz_family, _strided_cache, check_against_reference, check_bad_block_ids,
    check_graph_replay, make_inputs, run_triton,
)

import torch_paged_attn  # noqa: E402  (registers the ops)
from torch_paged_attn import _config, lowering  # noqa: E402
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402
from torch_paged_attn.lowering.triton import prefill  # noqa: E402
from torch_paged_attn.testing import assert_close  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CUDA = torch.cuda.is_available() and not _INTERPRET
interpreter_tier = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
gpu_tier = pytest.mark.skipif(not _CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")

# Tiles small enough for the interpreter: (BLOCK_M, TILE_N, warps, stages, PACK_HEADS, LAZY_RESCALE).
PACKED, ONE_HEAD, LAZY = (16, 16, 4, 1, True, False), (16, 32, 4, 1, False, False), (32, 16, 4, 1, True, True)


@pytest.fixture
def hopper(monkeypatch):
    """The planner as on an sm_90 device, every head size on the tile the test sets."""
    table = {d: PACKED for d in (16, 32, 64, 128)}
    monkeypatch.setattr(prefill, "_capability", lambda device: (9, 0))
    monkeypatch.setitem(prefill._CONFIGS, 9, table)
    monkeypatch.setattr(lowering, "_CHOICES", {})  # no plan made before the patches
    launched = []
    real = prefill.prepare

    def spy(*args, **kw):
        launched.append(args[8])
        return real(*args, **kw)

    monkeypatch.setattr(prefill, "prepare", spy)
    return table, launched


def check_against_loop(case: Case, tile: tuple, table: dict, launched: list, score_gain: float = 1.0,
                       device: str = "cpu") -> None:
    for d in table:
        table[d] = tile
    batch, options = make_inputs(case, device, zlib.crc32(case.id.encode()))
    options["scale"] *= score_gain
    hint = max(case.q_lens) if case.hint else -1
    out, lse = run_triton(batch, options, with_lse=case.with_lse, max_query_len=hint)
    declined = prefill.declines(tile, case.head_size, case.head_size_v or case.head_size, case.block_size,
                                case.num_heads // case.num_kv_heads, hint)
    if declined is None:
        assert launched and launched[-1] == tile, "the prefill kernel did not run"
    else:  # the shared kernel runs these sizes; its result is checked all the same
        assert not launched, f"the prefill kernel ran a call it declines ({declined})"
    if device != "cpu":  # GPU sizes: the reference on the float32 upcast (checked against the loop elsewhere)
        check_against_reference(batch, options, out, lse, case.dtype)
        return
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **options)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out, truth_out, dtype=case.dtype, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, truth_lse, dtype=case.dtype, reference=ref_lse, name="lse")


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CASES = [
    # ragged prefill + chunked prefill, an empty sequence, padding rows; kv_len in {0, 1, BS-1, BS, BS+1}
    Case((7, 20, 0, 5, 1), (7, 60, 0, 21, 17), pad_tokens=3),
    Case((33, 2), (33, 40), num_heads=8, num_kv_heads=2, block_size=32),  # GQA 4, diagonal across tiles
    Case((19,), (50,), causal=False, num_heads=3, num_kv_heads=3, block_size=64),  # MHA, non-causal
    Case((18, 5), (70, 5), window=(9, 2), causal=False),
    Case((18, 5), (70, 40), window=(20, -1), with_lse=False),
    Case((20, 6), (52, 30), chunk=16, causal=False, num_heads=4, num_kv_heads=1),
    Case((20,), (52,), chunk=13, window=(17, 0), causal=True, dtype=FP16),
    Case((9, 12), (40, 12), softcap=4.0, alibi=True, sinks=True, pad_tokens=2),
    Case((9, 12), (40, 0), sinks=True, dtype=FP16),
    Case((10, 4), (45, 20), cache_dtype=E4M3, sinks=True),
    Case((10,), (45,), cache_dtype=E5M2, dtype=FP16, softcap=3.0),
    Case((12, 3), (30, 17), head_size=40, head_size_v=24, block_size=24, num_heads=6, num_kv_heads=2),
    Case((12, 3), (30, 17), hint=True, strided="hnd"),
]


# lazy rescaling on the cases whose running state starts or ends unusually (empty rows, sinks)
_TILED = [(c, t) for c in CASES for t in (PACKED, ONE_HEAD)] + [(c, LAZY) for c in (CASES[0], CASES[7], CASES[8])]
_TILE_NAMES = {PACKED: "packed", ONE_HEAD: "one_head", LAZY: "lazy"}


@interpreter_tier
@pytest.mark.parametrize(("case", "tile"), _TILED, ids=[f"{c.id}-{_TILE_NAMES[t]}" for c, t in _TILED])
def test_prefill_kernel_interpreted(case: Case, tile: tuple, hopper) -> None:
    table, launched = hopper
    check_against_loop(case, tile, table, launched)


@interpreter_tier
@pytest.mark.parametrize("tile", [PACKED, LAZY], ids=["eager", "lazy"])
def test_prefill_kernel_large_scores_interpreted(tile: tuple, hopper) -> None:
    """Scores of standard deviation ~12 (log2 units ~17): the running max grows past the lazy
    threshold (8) on later tiles too, not only on the first."""
    table, launched = hopper
    check_against_loop(Case((40, 7), (90, 30), num_heads=8, num_kv_heads=2), tile, table, launched, score_gain=12.0)


@interpreter_tier
def test_prefill_kernel_bad_block_ids_interpreted(hopper) -> None:
    """Block ids outside [0, NB) hide their keys, as in the reference (and the shared kernel)."""
    table, launched = hopper

    def ran() -> None:
        assert launched, "the prefill kernel did not run"

    check_bad_block_ids("cpu", Case((9, 3, 12), (100, 50, 64), block_size=16, sinks=True), (None,), ran)


def _planned(monkeypatch, case: Case, **kw) -> list:
    """The tiles the prefill planner returned for ``case`` (planning on the CPU as on sm_90)."""
    monkeypatch.setattr(prefill, "_capability", lambda device: (9, 0))
    seen = []
    real = prefill.config
    monkeypatch.setattr(prefill, "config", lambda *a: seen.append(real(*a)) or seen[-1])
    monkeypatch.setattr(prefill, "prepare", lambda *a, **k: (lambda *args: None))
    batch, options = make_inputs(case, "cpu", seed=1)
    out = torch.empty_like(batch.query)
    tpa.prepare_paged_attention(*batch.args(), out, None, **options, **kw)
    return seen


def test_decode_and_invariant_calls_keep_the_shared_kernel(monkeypatch) -> None:
    """Decode calls (one query token each, or the hint 1), batch-invariant mode, forced splits and
    float32 queries never reach the prefill kernel; a bf16 prefill call does."""
    prefill_case = Case((40, 30), (40, 90), head_size=128)
    assert _planned(monkeypatch, prefill_case) == [prefill._CONFIGS[9][128]]
    assert _planned(monkeypatch, Case((1, 1), (40, 90), head_size=128)) == []
    assert _planned(monkeypatch, prefill_case, max_query_len=1) == []
    assert _planned(monkeypatch, prefill_case, split_tokens=64) == [None]
    assert _planned(monkeypatch, prefill_case, max_query_len=8) == [None]  # 8 tokens x 2 heads: 16 rows
    assert _planned(monkeypatch, prefill_case, max_query_len=40) == [prefill._CONFIGS[9][128]]
    monkeypatch.setattr(prefill, "_MAX_GRID_Y", 3)  # 70 tokens, 64 a block: 1 + 2 + 1 slots
    assert _planned(monkeypatch, prefill_case) == [None]
    assert _planned(monkeypatch, replace(prefill_case, dtype=FP32)) == [None]
    assert _planned(monkeypatch, replace(prefill_case, head_size=256)) == [None]
    with _config.batch_invariant(True):
        assert _planned(monkeypatch, prefill_case) == []


@gpu_tier
def test_sm90_plans_prefill_kernel_cuda(monkeypatch) -> None:
    """On sm_90 the benchmark's prefill shapes plan this kernel; elsewhere the shared one (the
    Gluon kernel, which takes these shapes first on sm_90, off)."""
    case = Case((512, 512), (4096, 4608), num_heads=32, num_kv_heads=8, head_size=128)
    monkeypatch.setattr(prefill, "SM90_GLUON", False)
    monkeypatch.setattr(lowering, "_CHOICES", {})  # no plan made before the patch
    seen = []
    real = prefill.config
    monkeypatch.setattr(prefill, "config", lambda *a: seen.append(real(*a)) or seen[-1])
    batch, options = make_inputs(case, "cuda", seed=2)
    out, lse = run_triton(batch, options)
    major = torch.cuda.get_device_capability()[0]
    assert seen == [prefill._CONFIGS[major][128] if major in prefill._CONFIGS else None]
    truth_out, truth_lse = causal_reference_in_slices(batch.query.float(), batch, options)
    ref_out, ref_lse = causal_reference_in_slices(batch.query, batch, options)
    assert_close(out, truth_out, dtype=BF16, reference=ref_out, name="out")
    assert_close(lse, truth_lse, dtype=BF16, reference=ref_lse, name="lse")


def causal_reference_in_slices(query, batch, options: dict, rows: int = 64):
    """``reference.attention`` of a causal call without windows, chunks or padding rows over
    ``batch`` with queries ``query``, a sequence and ``rows`` query tokens at a time: each slice
    keeps its tokens' positions (its sequence cut after its last token) and so gives the same
    rows, without the whole call's per-token key gathers (1024 tokens x 4608 keys x 8 heads x 128,
    tens of GiB: beside other test workers, out of memory)."""
    assert options["causal"] and options["window_left"] < 0 and options["window_right"] < 0
    assert not options["attention_chunk_size"]
    qsl, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    assert qsl[-1] == query.shape[0], "no padding rows"
    i32 = dict(dtype=torch.int32, device=query.device)
    outs, lses = [], []
    for i, n in enumerate(lens):
        q_len = qsl[i + 1] - qsl[i]
        for a in range(0, q_len, rows):
            b = min(a + rows, q_len)
            o, l = reference.attention(
                query[qsl[i] + a : qsl[i] + b], batch.key_cache, batch.value_cache, batch.block_table[i : i + 1],
                torch.tensor([n - (q_len - b)], **i32), torch.tensor([0, b - a], **i32), **options)
            outs.append(o)
            lses.append(l)
    return torch.cat(outs), torch.cat(lses)


# -- GPU tier: the kernel on the device, every call prefill-like taken by it -----------------------

@pytest.fixture
def sm90_everywhere(monkeypatch):
    """On an sm_90 device, the Triton prefill kernel for every prefill-like call (one SM planned,
    so no call falls back for having few query blocks; the Gluon kernel off)."""
    if torch.cuda.get_device_capability()[0] not in prefill._CONFIGS:
        pytest.skip("no prefill kernel table for this GPU")
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 1)
    monkeypatch.setattr(prefill, "SM90_GLUON", False)  # this Triton kernel; gluon_prefill switches it back
    monkeypatch.setattr(lowering, "_CHOICES", {})  # no plan made before the patches
    launched = []
    real = prefill.prepare
    monkeypatch.setattr(prefill, "prepare", lambda *a, **k: launched.append(a[8]) or real(*a, **k))
    return launched


# each candidate of tune.py's attn_prefill sweep kind: the table's, stages, one-head rows, lazy
_GPU_TILES = [(128, 64, 8, 3, True, False), (128, 64, 8, 2, True, False), (128, 64, 8, 3, False, False),
              (128, 64, 8, 3, True, True), (64, 64, 4, 2, True, False), (128, 32, 8, 4, True, True)]


@gpu_tier
@pytest.mark.parametrize("tile", _GPU_TILES, ids=str)
@pytest.mark.parametrize("case", CASES + [Case((300, 170), (300, 900), num_heads=32, num_kv_heads=8, head_size=128)],
                         ids=lambda c: c.id)
def test_prefill_kernel_cuda(case: Case, tile: tuple, sm90_everywhere, monkeypatch) -> None:
    table = dict(prefill._CONFIGS[torch.cuda.get_device_capability()[0]])
    monkeypatch.setitem(prefill._CONFIGS, torch.cuda.get_device_capability()[0], table)
    check_against_loop(case, tile, table, sm90_everywhere, device="cuda")


def check_graph_replay_and_compile(launched: list, message: str) -> None:
    """``check_graph_replay`` on prefill-like lengths (``launched``, the kernel's spy, non-empty
    after the first call), then the public op under torch.compile(fullgraph=True) against its
    eager bits."""

    def ran() -> None:
        assert launched, message

    static, options = check_graph_replay(
        400, ([100, 37, 200, 1], [900, 37, 260, 1200]),
        (([3, 300, 0, 90], [30, 1270, 0, 95]), ([1, 1, 1, 1], [1, 2, 3, 1100])), after_warmup=ran)

    public = {k: v for k, v in options.items() if k not in ("k_scale", "v_scale")}

    def functional(q, kc, vc, bt, sl, qsl):
        return torch_paged_attn.paged_attention(q, kc, vc, bt, sl, qsl, return_lse=True, **public)

    eager = functional(*static.args())
    compiled = torch.compile(functional, fullgraph=True)(*static.args())
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def check_fuzz_draw(case: Case, seed: int, ran=None) -> None:
    """One fuzz configuration on the GPU against the reference; ``ran()`` (optional) asserts which
    kernel took it. A failure names the seed and the case."""
    batch, options = make_inputs(case, "cuda", seed)
    out, lse = run_triton(batch, options, with_lse=case.with_lse, max_query_len=max(case.q_lens) if case.hint else -1)
    try:
        if ran is not None:
            ran()
        check_against_reference(batch, options, out, lse, case.dtype)
    except AssertionError as e:
        raise AssertionError(f"fuzz seed {seed}: {case.id}: {e}") from e


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(20))
def test_prefill_kernel_fuzz_cuda(family: int, sm90_everywhere) -> None:
    """1,000 prefill-like configurations (seeds 100000 + 50 f ..) through the prefill kernel."""
    f = _fuzz_family(random.Random(100000 + family))
    f.update(decode=False, split=None, head_size=min(f["head_size"], 128))
    f["dtype"] = BF16 if f["dtype"] == FP32 else f["dtype"]
    for draw in range(50):
        seed = 100000 + family * 50 + draw
        check_fuzz_draw(_fuzz_case(f, random.Random(seed)), seed)


@gpu_tier
def test_prefill_kernel_cuda_graph_and_compile(sm90_everywhere) -> None:
    """Captured once (no host sync), replayed on new lengths of the same shapes; the public op
    under torch.compile(fullgraph=True) gives the eager bits."""

    check_graph_replay_and_compile(sm90_everywhere, "the prefill kernel did not run")


# -- GPU tier: the Gluon kernel (prefill_sm90) on every call it takes ------------------------------

@pytest.fixture
def gluon_prefill(sm90_everywhere, monkeypatch):
    """The Gluon sm_90 prefill kernel switched on (one program: every work item through one
    persistent program, its barriers through many phases); the rows of each call it ran are recorded."""
    from torch_paged_attn.lowering.triton import prefill_sm90

    if prefill_sm90._sm90.unavailable(torch.empty(0, device="cuda")):
        pytest.skip("the Gluon prefill kernel runs on sm_90 with a tested Triton's Gluon only")
    monkeypatch.setattr(prefill, "SM90_GLUON", True)
    launched = []
    real = prefill_sm90.prepare
    monkeypatch.setattr(prefill_sm90, "prepare", lambda *a, **k: launched.append(k["rows"]) or real(*a, **k))
    return launched


# every block size it takes (8 .. 128: 8 pages a tile .. one page, part of a page), both head sizes,
# causal and not, GQA packing (1, 4, 8 heads a kv head), empty sequences, chunked prefill, padding
# rows, lengths of 1, BS +- 1 and across the 64-key tiles, fp16, no LSE
_GLUON_CASES = [
    Case((7, 20, 0, 5, 1), (7, 60, 0, 21, 17), head_size=64, pad_tokens=3),
    Case((33, 2), (33, 40), num_heads=8, num_kv_heads=2, block_size=32, head_size=128),
    Case((19,), (50,), causal=False, num_heads=3, num_kv_heads=3, block_size=64, head_size=64),
    Case((200, 37, 1), (200, 300, 129), num_heads=16, num_kv_heads=2, block_size=8, head_size=128, with_lse=False),
    Case((130, 64), (1000, 64), num_heads=4, num_kv_heads=4, block_size=128, head_size=128, causal=False),
    Case((300, 170), (300, 900), num_heads=32, num_kv_heads=8, head_size=128),
    Case((9, 12, 65), (40, 12, 65), dtype=FP16, head_size=64, block_size=16),
    Case((128, 127), (191, 127), num_heads=8, num_kv_heads=1, head_size=128, block_size=16, pad_tokens=5),
    # more queries than keys: causal rows before the first key see none, full attention sees all
    Case((90, 70), (30, 200), causal=False, num_heads=8, num_kv_heads=2, head_size=64, block_size=32),
    Case((90, 70), (30, 200), num_heads=8, num_kv_heads=2, head_size=128, block_size=16),
]


@gpu_tier
@pytest.mark.parametrize("case", _GLUON_CASES, ids=lambda c: c.id)
def test_gluon_prefill_kernel_cuda(case: Case, gluon_prefill, monkeypatch) -> None:
    """Against the reference on the float32 upcast; outputs and LSEs NaN-poisoned, caches NaN in
    uncovered slots (``make_inputs``); the cached launcher in check mode (Triton confirms each
    binary it launches)."""
    monkeypatch.setenv("TORCH_PAGED_ATTN_FAST_LAUNCH", "check")
    batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
    out, lse = run_triton(batch, options, with_lse=case.with_lse)
    assert gluon_prefill and gluon_prefill[-1][0] == 128, "the Gluon prefill kernel did not run"
    check_against_reference(batch, options, out, lse, case.dtype)


@gpu_tier
@pytest.mark.fuzz
@pytest.mark.parametrize("family", range(20))
def test_gluon_prefill_kernel_fuzz_cuda(family: int, gluon_prefill) -> None:
    """500 prefill-like configurations the Gluon kernel takes (seeds 300000 + 25 f ..): the fuzz
    families with its sizes (head size 64 / 128, block sizes 8 .. 128, bf16 / fp16) and none of
    the features it declines; lengths 0, 1, BS +- 1 and up to 700 keys, q_len up to 40 and then
    a long one (several 64-key tiles of queries), through one persistent program."""
    rng = random.Random(300000 + family)
    f = _fuzz_family(rng)
    f.update(decode=False, split=None, head_size=rng.choice((64, 128)), head_size_v=None,
             block_size=rng.choice((8, 16, 32, 64, 128)), cache_dtype=None, window=False, softcap=False,
             alibi=False, sinks=False, chunk=False, dtype=rng.choice((BF16, BF16, FP16)))
    for draw in range(25):
        seed = 300000 + family * 25 + draw
        r = random.Random(seed)
        case = _fuzz_case(f, r)
        if draw % 5 == 0:  # a long prompt among the short ones: many query blocks and key tiles
            n = r.randint(100, 600)
            case = replace(case, q_lens=case.q_lens + (n,), kv_lens=case.kv_lens + (n + r.choice((0, 1, 300)),))
        gluon_prefill.clear()

        def ran() -> None:  # the long prompt makes the call prefill-like, 128 rows a program
            assert gluon_prefill, "the Gluon prefill kernel did not run"

        check_fuzz_draw(case, seed, ran if draw % 5 == 0 else None)


@gpu_tier
def test_gluon_prefill_kernel_bad_block_ids_cuda(gluon_prefill) -> None:
    """Block ids outside [0, NB) (-1, NB, -2^31, 2^31 - 1) hide their keys."""

    def ran() -> None:
        assert gluon_prefill, "the Gluon prefill kernel did not run"

    case = Case((90, 3, 120), (100, 50, 640), num_heads=8, num_kv_heads=2, head_size=128, block_size=16)
    check_bad_block_ids("cuda", case, (None,), ran)


@gpu_tier
@pytest.mark.parametrize("layout", ["cross_layer", "hnd", "mixed"])
def test_gluon_prefill_kernel_strided_caches_bitwise_cuda(layout: str, gluon_prefill) -> None:
    """DESIGN.md section 2: a layer of a cross-layer cache, an HND view, and K contiguous with V
    an HND view give the contiguous caches' bits; the Gluon kernel runs all of them (each cache's
    ``[rows, W]`` view, ``_sm90.row_layout``), slots outside the views NaN, 2 and 8 query heads a
    kv head, block sizes 16 and 64."""
    for case in (Case((130, 37, 64), (300, 37, 700), num_heads=8, num_kv_heads=2, head_size=128, block_size=16),
                 Case((200, 9), (260, 9), num_heads=16, num_kv_heads=2, head_size=64, block_size=64)):
        batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
        gluon_prefill.clear()
        want = run_triton(batch, options)
        assert gluon_prefill, "the Gluon prefill kernel did not run"
        check_against_reference(batch, options, *want, case.dtype)
        k, v = batch.key_cache, batch.value_cache
        if layout == "mixed":
            batch.value_cache = _strided_cache(v, "hnd")
        else:
            batch.key_cache, batch.value_cache = _strided_cache(k, layout), _strided_cache(v, layout)
        gluon_prefill.clear()
        got = run_triton(batch, options)
        assert gluon_prefill, f"the Gluon prefill kernel did not take the {layout} caches"
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (layout, case.id)


@gpu_tier
def test_gluon_prefill_kernel_declines_cuda(gluon_prefill) -> None:
    """What it does not take (softcap, sinks, fp8, head size 32, odd block sizes) runs the Triton
    prefill kernel, right all the same."""
    for case in (Case((40,), (60,), head_size=64, softcap=3.0), Case((40,), (60,), head_size=64, sinks=True),
                 Case((40,), (60,), head_size=128, cache_dtype=E4M3), Case((40,), (60,), head_size=32),
                 Case((40,), (60,), head_size=64, block_size=24)):
        gluon_prefill.clear()
        batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
        out, lse = run_triton(batch, options)
        assert not gluon_prefill, f"the Gluon kernel took {case.id}"
        check_against_reference(batch, options, out, lse, case.dtype)


@gpu_tier
def test_gluon_prefill_kernel_cuda_graph_and_compile(gluon_prefill) -> None:
    """Captured once (no host sync), replayed on new lengths; the public op under
    torch.compile(fullgraph=True) gives the eager bits."""

    check_graph_replay_and_compile(gluon_prefill, "the Gluon prefill kernel did not run")


# -- D40/Dv24: ptxas (Triton 3.6, sm_90) built the P @ V descriptors from unwritten registers ------

# The case of the H100 failure and the variants measured there (results/gpu-tests-2026-11-23-d/
# d40-variants.txt: wrong with Hq 4 and block sizes 16 and 32, right with Dv 32, Dv 40, D 32), and
# the head sizes swapped.
_PTXAS_CASE = Case((12, 3), (30, 17), head_size=40, head_size_v=24, block_size=24, num_heads=6, num_kv_heads=2)
_PTXAS_CASES = [_PTXAS_CASE] + [
    replace(_PTXAS_CASE, **kw)
    for kw in (dict(head_size_v=32), dict(head_size_v=None), dict(head_size=32), dict(num_heads=4),
               dict(block_size=16), dict(block_size=32), dict(head_size=24, head_size_v=40))
]


def test_tile_pads_are_equal_when_both_head_sizes_pad() -> None:
    """K and V tiles take one width when both head sizes pad to different powers of two (the
    ptxas workaround of ``paged_attention._tile_pads``), else each its own."""
    assert tpa._tile_pads(40, 24) == (64, 64) and tpa._tile_pads(24, 40) == (64, 64)
    assert tpa._tile_pads(72, 40) == (128, 128) and tpa._tile_pads(8, 24) == (32, 32)
    assert tpa._tile_pads(40, 40) == (64, 64) and tpa._tile_pads(40, 32) == (64, 32)
    assert tpa._tile_pads(128, 64) == (128, 64) and tpa._tile_pads(40, 16) == (64, 16)
    assert tpa._tile_pads(576, 512) == (1024, 512)


def _bench_module(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(_INTERPRET, reason="compiles for sm_90: needs TRITON_INTERPRET unset")
@pytest.mark.parametrize("kernel", ["prefill", "shared"])
@pytest.mark.parametrize("case", [_PTXAS_CASE, _PTXAS_CASES[-1]], ids=lambda c: c.id)
def test_ptxas_case_sass_reads_no_unwritten_uniform_register(case: Case, kernel: str, monkeypatch) -> None:
    """Each kernel as the op launches it on the D40/Dv24 case, compiled for sm_90 by the installed
    Triton (no GPU needed): no instruction of its SASS reads a uniform register that no
    instruction wrote on some path (``benchmarks/sass_uniform_check.py``). Triton 3.6's ptxas
    did, for the P @ V wgmma descriptors, before the K and V tiles took one width."""
    sass_report, uniform = _bench_module("sass_report"), _bench_module("sass_uniform_check")
    if kernel == "shared":
        monkeypatch.setattr(prefill, "_CONFIGS", {})
    batch, options = make_inputs(case, "cpu", seed=1)
    meta = {f: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            for f in ("query", "key_cache", "value_cache", "block_table", "seq_lens", "query_start_loc")
            for x in [getattr(batch, f)]}
    t, hq, dv = batch.query.shape[0], batch.query.shape[1], batch.value_cache.shape[3]
    out = torch.empty(t, hq, dv, dtype=batch.query.dtype, device="meta")
    lse = torch.empty(t, hq, device="meta")
    with sass_report.captured_launches(sms=1) as launches:
        tpa.paged_attention(*replace(batch, **meta).args(), out, lse, **options)
    names = [k.__name__ for k, _ in launches]
    assert names == (["_prefill_kernel"] if kernel == "prefill" else ["_attention_kernel"]), names
    for k, kwargs in launches:
        bad = uniform.check(sass_report.cuobjdump(sass_report.compile_for(k, kwargs, 90), "-sass"))
        assert not bad, f"{k.__name__} (D_PAD {kwargs['D_PAD']}, DV_PAD {kwargs['DV_PAD']}):\n" + "\n".join(bad)


@gpu_tier
@pytest.mark.parametrize("kernel", ["prefill", "shared"])
@pytest.mark.parametrize("case", _PTXAS_CASES, ids=lambda c: c.id)
def test_ptxas_case_against_loop_cuda(case: Case, kernel: str, monkeypatch) -> None:
    """The D40/Dv24 case and its variants on each kernel (one SM planned, so the prefill kernel
    takes them; its table emptied for the shared kernel), launched three times (the defect read
    registers earlier launches left), against the float64 loop on a CPU copy of the inputs."""
    if kernel == "prefill" and torch.cuda.get_device_capability()[0] not in prefill._CONFIGS:
        pytest.skip("no prefill kernel table for this GPU")
    monkeypatch.setattr(tpa, "_num_sms", lambda device: 1)
    monkeypatch.setattr(lowering, "_CHOICES", {})
    if kernel == "shared":
        monkeypatch.setattr(prefill, "_CONFIGS", {})
    seen = []
    real = prefill.config
    monkeypatch.setattr(prefill, "config", lambda *a: seen.append(real(*a)) or seen[-1])
    batch, options = make_inputs(case, "cuda", zlib.crc32(case.id.encode()))
    fields = ("query", "key_cache", "value_cache", "block_table", "seq_lens", "query_start_loc")
    cpu = replace(batch, **{f: getattr(batch, f).cpu() for f in fields})
    cpu_options = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in options.items()}
    truth_out, truth_lse = loop.paged_attention(*cpu.args(), **cpu_options)
    ref_out, ref_lse = reference.attention(*cpu.args(), **cpu_options)
    for launch in range(3):
        out, lse = run_triton(batch, options)
        assert (seen[-1] is not None) == (kernel == "prefill"), seen
        assert_close(out.cpu(), truth_out, dtype=case.dtype, reference=ref_out, name=f"out (launch {launch})")
        assert_close(lse.cpu(), truth_lse, dtype=case.dtype, reference=ref_lse, name=f"lse (launch {launch})")
