"""Per-signature plans (``lowering.plan`` / ``lowering.planned``): a repeated call reuses what its
first call derived (validated facts, backend, split plan, grid, launch arguments); anything that
changes what a plan derives from plans again.

CPU, interpreter tier: the ops are routed to the Triton backend's host path (as
``benchmarks/overhead.py --null-launch`` routes them) and its kernels run in the interpreter on
CPU tensors, checked against the reference.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

import torch_paged_attn as pa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering import reference  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa  # noqa: E402
from torch_paged_attn.testing import assert_close, make_paged_batch  # noqa: E402

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
