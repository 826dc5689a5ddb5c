"""Per-signature plans (``lowering.plan`` / ``lowering.planned``): a repeated call reuses what its
first call derived (validated facts, backend, split plan, grid, launch arguments); anything that
changes what a plan derives from plans again.

CPU, interpreter tier: the ops are routed to the Triton backend's host path (as
``benchmarks/overhead.py --null-launch`` routes them) and its kernels run in the interpreter on
CPU tensors, checked against the reference.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

pytest.importorskip("triton")

import torch_paged_attn as pa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402
from torch_paged_attn.testing import assert_close, make_block_table, make_paged_batch  # noqa: E402

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")


@pytest.fixture
def on_triton(monkeypatch):
    """Ops on CPU tensors take the Triton backend, from no plans, in the default settings."""
    choose = lowering._choose
    monkeypatch.setattr(lowering, "_choose", lambda op, facts: choose(op, {**facts, "device": "cuda"}))
    monkeypatch.delenv("TORCH_PAGED_ATTN_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_BACKEND", raising=False)
    lowering._CHOICES.clear()
    yield
    lowering._CHOICES.clear()


@pytest.fixture
def prepared(on_triton, monkeypatch):
    """The list of (num_tokens, batch-invariant mode) of every plan ``prepare_paged_attention``
    makes."""
    made = []
    prepare = tpa.prepare_paged_attention

    def spy(query, *args, **options):
        made.append((query.shape[0], pa.is_batch_invariant()))
        return prepare(query, *args, **options)

    monkeypatch.setattr(tpa, "prepare_paged_attention", spy)
    return made


def _check(batch, out, lse):
    """Against the reference on the float64 upcast, with the tolerance helper's budget."""
    truth, truth_lse = reference.attention(*(t.double() if t.is_floating_point() else t for t in batch.args()),
                                           scale=0.125)
    assert_close(out, truth, dtype=torch.float32, name="out")
    assert_close(lse, truth_lse, dtype=torch.float32, name="lse")


def _call(batch):
    return pa.paged_attention(*batch.args(), scale=0.125, return_lse=True)


def test_repeated_call_plans_once_and_computes_each_call(prepared):
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    for seed in range(3):  # same signature, new values each call: planned once, each result right
        batch.query.copy_(torch.randn(batch.query.shape, generator=torch.Generator().manual_seed(seed)))
        out, lse = _call(batch)
        _check(batch, out, lse)
    assert prepared == [(2, False)]


def test_new_shape_or_setting_plans_again(prepared):
    decode = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    _call(decode)
    more = make_paged_batch([1, 1, 1], [20, 7, 40], dtype=torch.float32)
    out, lse = _call(more)
    _check(more, out, lse)
    with pa.batch_invariant():  # the same signature under another setting: its own plan
        out, lse = _call(decode)
        _check(decode, out, lse)
    out, lse = _call(decode)  # back to the default: its plan again, none new
    assert prepared == [(2, False), (3, False), (2, True)]
    with pa.backend("reference"):  # another backend: no Triton plan
        out_ref, _ = _call(decode)
    _check(decode, out_ref, lse)
    assert len(prepared) == 3


def test_out_form_plans_apart_from_functional_form(prepared):
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    out, lse = _call(batch)
    out2, lse2 = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    pa.paged_attention_out(*batch.args(), out2, lse2, scale=0.125)
    pa.paged_attention_out(*batch.args(), out2, None, scale=0.125)  # no LSE: its own plan
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    assert len(prepared) == 3


@pytest.mark.parametrize("broken", ["block_table dtype", "query head size", "scale"])
def test_bad_input_after_planned_call_raises(prepared, broken):
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    _call(batch)
    _call(batch)
    args = list(batch.args())
    scale = 0.125
    if broken == "block_table dtype":
        args[3] = args[3].long()
        exc, match = TypeError, "paged_attention: block_table: expected dtype int32"
    elif broken == "query head size":
        args[0] = torch.randn(2, 4, 40)
        exc, match = ValueError, "paged_attention: key_cache: expected head size 40"
    else:
        scale = float("inf")
        exc, match = ValueError, "paged_attention: scale: expected a finite float"
    with pytest.raises(exc, match=match):
        pa.paged_attention(*args, scale=scale, return_lse=True)


def test_cache_write_plans_per_shape(on_triton):
    """reshape_and_cache: a repeated signature writes each call's values; another number of slots
    plans again (its grid and ``num_tokens`` differ); a bad input after planned calls raises."""
    kc, vc = torch.zeros(4, 16, 2, 32), torch.zeros(4, 16, 2, 32)
    for seed, slots in ((0, [17, 5]), (1, [17, 5]), (2, [3, 40, 63])):
        g = torch.Generator().manual_seed(seed)
        k, v = torch.randn(len(slots), 2, 32, generator=g), torch.randn(len(slots), 2, 32, generator=g)
        pa.reshape_and_cache(k, v, kc, vc, torch.tensor(slots))
        for t, s in enumerate(slots):
            assert torch.equal(kc[s // 16, s % 16], k[t]) and torch.equal(vc[s // 16, s % 16], v[t])
    with pytest.raises(TypeError, match="reshape_and_cache: value: expected dtype float32"):
        pa.reshape_and_cache(k, v.half(), kc, vc, torch.tensor([3, 40, 63]))


def test_merge_out_with_and_without_lse(on_triton):
    """merge_attn_states_out with an LSE and then without: separate plans (HAS_LSE differs); the
    LSE given before is not written by the second call."""
    g = torch.Generator().manual_seed(3)
    po, so = torch.randn(3, 2, 32, generator=g), torch.randn(3, 2, 32, generator=g)
    pl, sl = torch.randn(3, 2, generator=g), torch.randn(3, 2, generator=g)
    truth, truth_lse = torch.empty(3, 2, 32, dtype=torch.float64), torch.empty(3, 2, dtype=torch.float64)
    reference.merge_attn_states(po.double(), pl.double(), so.double(), sl.double(), truth, truth_lse)
    out, lse = torch.empty_like(po), torch.empty_like(pl)
    pa.merge_attn_states_out(po, pl, so, sl, out, lse)
    assert_close(out, truth, name="out")
    assert_close(lse, truth_lse, name="lse")
    out2, kept = torch.full_like(po, float("nan")), lse.clone()
    pa.merge_attn_states_out(po, pl, so, sl, out2, None)
    assert torch.equal(out2, out) and torch.equal(lse, kept)


# -- the eager entries of public functions (lowering.eager_planned / remember) --------------------


@pytest.fixture
def usual_path(on_triton, monkeypatch):
    """A list with one item per call that went past the eager entries (to ``lowering.planned``)."""
    calls = []
    planned = lowering.planned

    def spy(signature):
        calls.append(signature[0] if signature else None)
        return planned(signature)

    monkeypatch.setattr(lowering, "planned", spy)
    monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG", raising=False)
    return calls


def _fresh(batch, seed):
    batch.query.copy_(torch.randn(batch.query.shape, generator=torch.Generator().manual_seed(seed)))


def test_eager_entry_serves_repeated_calls(usual_path):
    """The first call plans, the second (its signature planned: a recurring one) is remembered,
    later ones take the entry; each computes its own values, functional and out forms alike."""
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    for seed in range(4):
        _fresh(batch, seed)
        out, lse = _call(batch)
        _check(batch, out, lse)
    assert usual_path == ["paged_attention"] * 2
    out, lse = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    for seed in range(4, 8):
        _fresh(batch, seed)
        pa.paged_attention_out(*batch.args(), out, lse, scale=0.125)
        _check(batch, out, lse)
    assert usual_path == ["paged_attention"] * 2 + ["paged_attention_out"] * 2


def test_eager_entry_lse_not_asked_for(usual_path):
    """Calls served by the eager entry without ``return_lse``: each gets its own ``[0]`` float32
    lse (a view of one shared empty storage, ``lowering.unresizable_empty``), which no caller can
    grow or reshape under another's; the outputs are each call's own, and a later call that asks
    for the lse gets the real one."""
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    got = []
    for seed in range(4):
        _fresh(batch, seed)
        out, lse = pa.paged_attention(*batch.args(), scale=0.125)
        truth, _ = reference.attention(*(t.double() if t.is_floating_point() else t for t in batch.args()),
                                       scale=0.125)
        assert_close(out, truth, dtype=torch.float32, name="out")
        assert lse.shape == (0,) and lse.dtype == torch.float32 and lse.device == out.device
        got.append(lse)
    assert usual_path == ["paged_attention"] * 2  # calls 3 and 4 took the entry
    first, served = got[2], got[3]
    assert first is not served
    with pytest.raises(RuntimeError, match="not resizable"):
        served.resize_(8)
    with pytest.raises(RuntimeError, match="not resizable"):
        served.untyped_storage().resize_(32)
    assert first.shape == (0,)
    first.unsqueeze_(0)  # a caller's in-place view change stays its own
    _, lse = pa.paged_attention(*batch.args(), scale=0.125)
    assert first.shape == (1, 0) and lse.shape == (0,)
    _fresh(batch, 9)
    out, lse = _call(batch)
    _check(batch, out, lse)


@pytest.mark.parametrize("change", [
    "query strides", "cache dtype", "block_table shape", "scale", "window_left", "window_left class",
    "causal class", "no lse", "value_cache is key_cache", "alibi", "batch-invariant", "reference backend",
    "debug", "plans cleared",
])
def test_each_change_leaves_the_eager_entry(usual_path, monkeypatch, change):
    """A call that differs from a remembered one in anything validation or planning reads goes the
    usual way (validated, planned or found by signature) and is right, or raises as it would
    have; the remembered call still takes its entry afterwards."""
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    out, lse = torch.empty(2, 4, 32), torch.empty(2, 4)
    base = dict(scale=0.125, window_left=-1, causal=True)
    used = {}

    def call(args=None, lse=lse, **kw):
        used.update(args=args or batch.args(), options={**base, **kw})
        out.fill_(float("nan"))
        pa.paged_attention_out(*used["args"], out, lse, **used["options"])

    for _ in range(3):
        call()
    del usual_path[:]
    args = list(batch.args())
    raises = {
        "cache dtype": (TypeError, "paged_attention_out: value_cache: expected the dtype of key_cache"),
        "window_left class": (TypeError, "paged_attention_out: window_left: expected an int, got float"),
        "causal class": (TypeError, "paged_attention_out: causal: expected a bool, got int"),
    }
    if change == "query strides":  # the same sizes, another row stride: a slice of a wider buffer
        args[0] = torch.randn(2, 4, 64)[..., :32].copy_(batch.query)
        call(args)
    elif change == "cache dtype":
        args[2] = args[2].half()
    elif change == "block_table shape":  # a wider table: the columns past each sequence are never read
        args[3] = torch.cat([args[3], args[3]], dim=1)
        call(args)
    elif change in ("scale", "window_left", "alibi"):
        call(**{"scale": {"scale": 0.25}, "window_left": {"window_left": 3},
                "alibi": {"alibi_slopes": torch.ones(4)}}[change])
    elif change == "window_left class":  # -1.0 == -1, and hashes alike: the key holds the class
        base["window_left"] = -1.0
    elif change == "causal class":  # 1 == True
        base["causal"] = 1
    elif change == "no lse":
        call(lse=None)
    elif change == "value_cache is key_cache":  # one tensor twice: the native check fails on it
        args[2] = args[1]
        for _ in range(3):
            call(args)
    elif change == "batch-invariant":
        with pa.batch_invariant():
            call()
    elif change == "reference backend":
        with pa.backend("reference"):
            call()
    elif change == "debug":
        monkeypatch.setenv("TORCH_PAGED_ATTN_DEBUG", "1")
        call()
        call()
        monkeypatch.delenv("TORCH_PAGED_ATTN_DEBUG")
    elif change == "plans cleared":
        lowering._CHOICES.clear()
        call()
    if change in raises:
        exc, match = raises[change]
        with pytest.raises(exc, match=match):
            call(args)
        assert len(usual_path) <= 1
    else:
        # debug: every call validated; a tensor given twice: its signature was planned, so its
        # entry is remembered at once and serves the next two calls
        assert usual_path == ["paged_attention_out"] * (2 if change == "debug" else 1), usual_path
        options = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in used["options"].items()}
        truth, _ = reference.attention(*(t.double() if t.is_floating_point() else t for t in used["args"]), **options)
        assert_close(out, truth, dtype=torch.float32, name="out")
    del usual_path[:]
    base.update(window_left=-1, causal=True)
    call()  # the remembered call: its entry (none after the plans were cleared: planned again)
    assert usual_path == (["paged_attention_out"] if change == "plans cleared" else [])


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_tensor_check_tells_apart_what_plans_read(native, monkeypatch):
    """The check of an eager entry (Dynamo's C++ TensorGuards where it probes right, else Python)
    passes new tensors of the same sizes, strides, dtype and device, and fails every difference."""
    found = lowering._native_tensor_guards()
    if native and found is None:
        pytest.skip("TensorGuards missing or probed wrong: the Python check serves")
    monkeypatch.setattr(lowering, "_NATIVE", [found if native else None])
    x, y = torch.randn(4, 3), torch.zeros(2, dtype=torch.int32)
    check = lowering._tensor_check((x, y))
    assert check(torch.randn(4, 3), torch.ones(2, dtype=torch.int32)) and check(x, y)
    others = (
        torch.randn(3, 4).t(), torch.randn(4, 4)[:, :3], torch.randn(5, 3), torch.randn(4, 3, 1),
        torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, device="meta"), torch.randn(4, 3).requires_grad_(),
        torch.randn(4, 3).as_subclass(lowering._ProbeSubclass), [[0.0] * 3] * 4, None,
    )
    for other in others:
        assert not check(other, y), other
    for fewer_or_more in ((x,), (x, y, y)):  # never within one key (it fixes the count): no match
        with contextlib.suppress(TypeError):  # (the native check raises)
            assert not check(*fewer_or_more)
    twice = lowering._tensor_check((x, x))  # one tensor given twice (the native check fails on it)
    assert twice(x, x) and twice(torch.randn(4, 3), torch.randn(4, 3)) and not twice(x, y)


def test_layouts_of_one_key_keep_their_entries(usual_path):
    """Calls of one key (same size and options) in layouts taken in turn: up to
    ``_EAGER_ENTRIES`` of them keep an entry each; more are served the usual way, still right,
    and the entries of the key never exceed that bound."""
    batch = make_paged_batch([1, 1], [20, 7], dtype=torch.float32)
    width = lowering._EAGER_ENTRIES + 1
    # the same query in row strides 32, 64, ...: one layout each
    layouts = [torch.randn(2, 4, 32 * (i + 1))[..., :32].copy_(batch.query) for i in range(width)]
    truth, truth_lse = reference.attention(*(t.double() if t.is_floating_point() else t for t in batch.args()),
                                           scale=0.125)

    def run(layouts, rounds):
        for _ in range(rounds):
            for q in layouts:
                out, lse = pa.paged_attention(q, *batch.args()[1:], scale=0.125, return_lse=True)
                assert_close(out, truth, dtype=torch.float32, name="out")
                assert_close(lse, truth_lse, dtype=torch.float32, name="lse")

    run(layouts[:2], 2)  # planned, remembered
    del usual_path[:]
    run(layouts[:2], 3)
    assert usual_path == []  # two layouts, two entries
    run(layouts, 3)  # one layout too many, in turn: each call is remembered after its entry went
    entries = [v for v in lowering._CHOICES.values() if isinstance(v, list)]
    assert len(entries) == 1 and len(entries[0]) == lowering._EAGER_ENTRIES


@pytest.mark.parametrize("op", ["mla_decode", "merge_attn_states", "merge_attn_states_out"])
def test_eager_entries_of_mla_and_merge(usual_path, op):
    """mla_decode and the merges: planned at the first call, remembered at the second, then served
    by their entry, each call computing its own values (against the reference on float64); a
    change of the causal flag's class still raises."""
    g = torch.Generator().manual_seed(5)
    if op == "mla_decode":
        table, _ = make_block_table([20, 7], 16, 4, g)
        cache = torch.randn(4, 16, 48, generator=g)
        lens, qsl = torch.tensor([20, 7], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32)
        ql, qr = torch.empty(2, 4, 32), torch.empty(2, 4, 16)
        inputs = (ql, qr)

        def call(**kw):
            return pa.mla_decode(ql, qr, cache, table, lens, qsl, scale=0.125, **kw)

        def truth():
            out, lse = torch.empty(2, 4, 32, dtype=torch.float64), torch.empty(2, 4, dtype=torch.float64)
            reference.mla_decode(ql.double(), qr.double(), cache.double(), table, lens, qsl, out, lse, scale=0.125,
                                 causal=True, kv_scale=None)
            return out, lse
    else:
        po, so, pl, sl = torch.empty(3, 2, 32), torch.empty(3, 2, 32), torch.empty(3, 2), torch.empty(3, 2)
        inputs = (po, so, pl, sl)
        out_t, lse_t = torch.empty(3, 2, 32), torch.empty(3, 2)

        def call():
            if op == "merge_attn_states":
                return pa.merge_attn_states(po, pl, so, sl)
            out_t.fill_(float("nan"))
            lse_t.fill_(float("nan"))
            pa.merge_attn_states_out(po, pl, so, sl, out_t, lse_t)
            return out_t, lse_t

        def truth():
            out, lse = torch.empty(3, 2, 32, dtype=torch.float64), torch.empty(3, 2, dtype=torch.float64)
            reference.merge_attn_states(po.double(), pl.double(), so.double(), sl.double(), out, lse)
            return out, lse
    for _ in range(4):
        for t in inputs:
            t.copy_(torch.randn(t.shape, generator=g))
        out, lse = call()
        want, want_lse = truth()
        assert_close(out, want, dtype=torch.float32, name="out")
        assert_close(lse, want_lse, dtype=torch.float32, name="lse")
    assert usual_path == [op] * 2
    if op == "mla_decode":
        with pytest.raises(TypeError, match="mla_decode: causal: expected a bool, got int"):
            call(causal=1)


@pytest.mark.parametrize("op", ["reshape_and_cache", "concat_and_cache_mla"])
def test_eager_entries_of_cache_writes(usual_path, op):
    """The cache writes: planned at the first call, remembered at the second, then served by their
    entry, each call writing its own values into its own (poisoned) caches where index assignment
    puts them, a negative slot skipped; a bad input of the same shapes still raises, and so does
    an fp8 cache without its scale."""
    g = torch.Generator().manual_seed(9)
    slots = torch.tensor([17, -1, 5, 60])
    if op == "reshape_and_cache":
        inputs = (torch.empty(4, 2, 32), torch.empty(4, 2, 16))
        shapes = ((4, 16, 2, 32), (4, 16, 2, 16))
        write = pa.reshape_and_cache

        def rows(t):
            return (inputs[0][t], inputs[1][t])
    else:
        inputs = (torch.empty(4, 32), torch.empty(4, 16))
        shapes = ((4, 16, 48),)
        write = pa.concat_and_cache_mla

        def rows(t):
            return (torch.cat([inputs[0][t], inputs[1][t]]),)
    for _ in range(4):
        for t in inputs:
            t.copy_(torch.randn(t.shape, generator=g))
        caches = tuple(torch.full(s, float("nan")) for s in shapes)
        write(*inputs, *caches, slots)
        want = tuple(torch.full(s, float("nan")) for s in shapes)
        for t, s in enumerate(slots.tolist()):
            if s >= 0:
                for w, row in zip(want, rows(t)):
                    w[s // 16, s % 16] = row
        for c, w in zip(caches, want):
            assert torch.equal(c.nan_to_num(7.0), w.nan_to_num(7.0))
    assert usual_path == [op] * 2
    with pytest.raises(TypeError, match=f"{op}: .*expected dtype float32"):
        write(inputs[0], inputs[1].half(), *caches, slots)
    fp8 = tuple(torch.zeros(s, dtype=torch.float8_e4m3fn) for s in shapes)
    with pytest.raises((TypeError, ValueError), match=f"{op}: .*scale"):
        write(*inputs, *fp8, slots)
