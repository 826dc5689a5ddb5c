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
def prepared(monkeypatch):
    """Ops on CPU tensors take the Triton backend; returns the list of (num_tokens, split_tokens
    batch-invariant mode) of every plan ``prepare_paged_attention`` makes."""
    choose = lowering._choose
    monkeypatch.setattr(lowering, "_choose", lambda op, facts: choose(op, {**facts, "device": "cuda"}))
    monkeypatch.delenv("TORCH_PAGED_ATTN_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("TORCH_PAGED_ATTN_BACKEND", raising=False)
    lowering._CHOICES.clear()
    made = []
    prepare = tpa.prepare_paged_attention

    def spy(query, *args, **options):
        made.append((query.shape[0], pa.is_batch_invariant()))
        return prepare(query, *args, **options)

    monkeypatch.setattr(tpa, "prepare_paged_attention", spy)
    yield made
    lowering._CHOICES.clear()


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
