"""``set_backend("triton")`` on CPU tensors (issue 16, item 5).

- Under Triton's interpreter (``TRITON_INTERPRET=1``, as CI runs) the public functions run the
  Triton kernels on CPU tensors, every op, with no warning: what a user steps through on a laptop.
  The results agree with the reference backend's (cache writes bitwise).
- Traced calls (torch.compile) cannot run interpreter kernels (they need real tensors): the
  reference is traced, with one warning.
- Without the interpreter the reference runs, with one warning on the ``torch_paged_attn.lowering``
  logger that names ``TRITON_INTERPRET=1``, however many calls; ``"flash"`` on CPU likewise.
  ``"auto"`` (the default) runs the reference on CPU silently.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

import torch_paged_attn as pa
from torch_paged_attn import lowering
from torch_paged_attn.testing import assert_close, make_paged_batch

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
LOGGER = "torch_paged_attn.lowering"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """Each test starts from the default setting, empty selection caches and no logged warning."""
    monkeypatch.delenv("TORCH_PAGED_ATTN_BACKEND", raising=False)
    pa.set_backend(None)
    lowering._CHOICES.clear()
    lowering._LOGGED.clear()
    yield
    pa.set_backend(None)
    lowering._CHOICES.clear()


@pytest.fixture
def chosen(monkeypatch) -> list[str]:
    """The backend module each selection picks, in order (``lowering._choose`` recorded)."""
    names: list[str] = []
    choose = lowering._choose

    def record(op, facts):
        module = choose(op, facts)
        names.append(module.__name__.removeprefix("torch_paged_attn.lowering."))
        return module

    monkeypatch.setattr(lowering, "_choose", record)
    return names


def _nan(*shape) -> torch.Tensor:
    return torch.full(shape, float("nan"))


def _calls() -> dict[str, callable]:
    """One call of each public op on tiny fresh inputs, returning what it computed or wrote."""
    g = torch.Generator().manual_seed(7)
    b = make_paged_batch([1, 4], [19, 9], block_size=8, dtype=torch.bfloat16, seed=3)
    mla_cache = torch.randn(4, 8, 48, generator=g)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 3], dtype=torch.int32)
    seq_lens = torch.tensor([11, 5], dtype=torch.int32)
    q_latent, q_rope = torch.randn(3, 4, 32, generator=g), torch.randn(3, 4, 16, generator=g)
    key, value = torch.randn(4, 2, 32, generator=g), torch.randn(4, 2, 32, generator=g)
    slots = torch.tensor([17, -1, 3])
    parts, lses = torch.randn(3, 5, 4, 32, generator=g), torch.randn(3, 5, 4, generator=g)
    cu, starts = torch.tensor([0, 10, 13], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)

    def attention_out():
        out, lse = _nan(*b.query.shape).to(b.query.dtype), _nan(*b.query.shape[:2])
        pa.paged_attention_out(*b.args(), out, lse, scale=0.2, window_left=5)
        return out, lse

    def cache_write():
        kc, vc = _nan(3, 8, 2, 32), _nan(3, 8, 2, 32)
        pa.reshape_and_cache(key, value, kc, vc, slots)
        return kc, vc

    def mla_write():
        kv = _nan(3, 8, 48)
        pa.concat_and_cache_mla(key[:, 0], value[:, 0, :16], kv, slots)
        return (kv,)

    def gather():
        out = _nan(16, 48)
        pa.gather_cache(mla_cache, table, cu, starts, out)
        return (out,)

    return {
        "paged_attention": lambda: pa.paged_attention(*b.args(), scale=0.2, return_lse=True),
        "paged_attention_out": attention_out,
        "mla_decode": lambda: pa.mla_decode(q_latent, q_rope, mla_cache, table, seq_lens, qsl, scale=0.15),
        "reshape_and_cache": cache_write,
        "concat_and_cache_mla": mla_write,
        "gather_cache": gather,
        "merge_attn_states": lambda: pa.merge_attn_states(parts[0], lses[0], parts[1], lses[1]),
        "merge_attn_states_n": lambda: pa.merge_attn_states_n(parts, lses),
    }


_WRITES = ("reshape_and_cache", "concat_and_cache_mla", "gather_cache")


@pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_triton_on_cpu_runs_the_kernels_under_the_interpreter(chosen, caplog):
    pytest.importorskip("triton")
    calls = _calls()
    with pa.backend("reference"):
        expected = {name: call() for name, call in calls.items()}
    chosen.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), pa.backend("triton"):
        for name, call in calls.items():
            chosen.clear()
            got = call()
            assert chosen and all(c.startswith("triton.") for c in chosen), (name, chosen)
            for i, (a, e) in enumerate(zip(got, expected[name])):
                if name in _WRITES:  # copies (and fp32 -> fp32 casts) are exact
                    assert torch.equal(a.nan_to_num(7.0), e.nan_to_num(7.0)), name
                else:
                    assert_close(a, e.double(), name=f"{name}[{i}]")
    assert not [r for r in caplog.records if r.name == LOGGER]


@pytest.mark.skipif(not _INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_traced_triton_on_cpu_traces_the_reference_with_one_warning(caplog):
    pytest.importorskip("triton")
    b = make_paged_batch([1, 4], [19, 9], block_size=8, seed=4)
    with pa.backend("reference"):
        expected = pa.paged_attention(*b.args(), scale=0.2)[0]
    with caplog.at_level(logging.WARNING, logger=LOGGER), pa.backend("triton"):
        step = torch.compile(lambda *a: pa.paged_attention(*a, scale=0.2)[0], fullgraph=True, backend="aot_eager")
        got = step(*b.args())
    assert torch.equal(got, expected)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "traced" in warnings[0], warnings


@pytest.mark.parametrize("setting", ["triton", "flash"])
def test_without_the_interpreter_the_reference_runs_with_one_warning(setting, monkeypatch, chosen, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    b = make_paged_batch([1, 4], [19, 9], block_size=8, seed=5)
    with pa.backend("reference"):
        expected = pa.paged_attention(*b.args(), scale=0.2, return_lse=True)
    chosen.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER), pa.backend(setting):
        for _ in range(3):
            lowering._CHOICES.clear()  # selected again each time: still one warning
            out, lse = pa.paged_attention(*b.args(), scale=0.2, return_lse=True)
            assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
        pa.merge_attn_states(out, lse, out, lse)
    assert set(chosen) == {"reference"}
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert repr(setting) in warnings[0] and "reference" in warnings[0]
    assert ("TRITON_INTERPRET=1" in warnings[0]) == (setting == "triton")


def test_auto_on_cpu_runs_the_reference_silently(chosen, caplog):
    b = make_paged_batch([2], [9], block_size=8, seed=6)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        pa.paged_attention(*b.args(), scale=0.2)
    assert chosen == ["reference"]
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
