"""The FlashAttention backend (lowering/flash.py) and per-call backend selection.

CPU tier (CI, no FlashAttention): the switch (set_backend, backend(), TORCH_PAGED_ATTN_BACKEND),
"flash" without FlashAttention (a RuntimeError naming what is missing), the "auto" rule on facts,
each adapter's supports table against the contract's features, and the FA4 argument mapping
through a fake ``flash_attn.cute`` whose ``flash_attn_varlen_func`` is plain torch written from
FA4's documented semantics (head-major natural-log LSE, bottom-right causal, ``None`` windows,
raw-logit sinks, rows past ``cu_seqlens_q[-1]`` left unwritten), checked against the float64 loop;
the kernels around the call (``flash_kernels``, interpreted with TRITON_INTERPRET=1, and their
torch formulation) against their plain-torch definitions: padding rows of a poisoned ``out``
zeroed, real rows untouched, bad block ids, with and without an LSE, strided index tensors, and
the launches counted (one beside FA4 on the common call); the private op through the dispatcher.

GPU tier (CUDA and an importable ``flash_attn.cute``): parity with the reference over what FA4
supports, the Triton fallback for what it does not, padding rows and bad block ids in a poisoned
``out`` (FA4 writing into it or through its own buffer), CUDA-graph capture/replay with and
without an LSE, and torch.compile(fullgraph=True) with one paged_attn node.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import types
from dataclasses import replace

import pytest
import torch

import _loop as loop
import torch_paged_attn as pa
from torch_paged_attn import _config, lowering
from torch_paged_attn.lowering import flash, reference
from torch_paged_attn.testing import assert_close, make_paged_batch

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """Each test starts from the default setting and empty selection caches."""
    monkeypatch.delenv("TORCH_PAGED_ATTN_BACKEND", raising=False)
    pa.set_backend(None)
    lowering._CHOICES.clear()
    flash._PLANS.clear()
    flash._function.cache_clear()
    flash._fa4_forward.cache_clear()
    yield
    monkeypatch.undo()  # a test's replacements of flash's functions go first
    pa.set_backend(None)
    lowering._CHOICES.clear()
    flash._PLANS.clear()
    flash._function.cache_clear()
    flash._fa4_forward.cache_clear()


# -- the switch ----------------------------------------------------------------------------------


def test_set_backend_and_context_manager():
    assert pa.get_backend() == "auto"
    pa.set_backend("triton")
    assert pa.get_backend() == "triton"
    with pa.backend("reference"):
        assert pa.get_backend() == "reference"
        with pa.backend("flash"):
            assert pa.get_backend() == "flash"
        assert pa.get_backend() == "reference"
    assert pa.get_backend() == "triton"
    pa.set_backend(None)
    assert pa.get_backend() == "auto"


@pytest.mark.parametrize("bad", ["cuda", "", "fa4", 3, None])
def test_bad_backend_names_list_the_choices(bad):
    calls = [lambda: pa.backend(bad)]
    if bad is not None:
        calls.append(lambda: pa.set_backend(bad))
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        for name in _config.BACKENDS:
            assert repr(name) in str(e.value)


def test_env_var_is_read_per_call(monkeypatch):
    monkeypatch.setenv("TORCH_PAGED_ATTN_BACKEND", "triton")
    assert pa.get_backend() == "triton"
    monkeypatch.setenv("TORCH_PAGED_ATTN_BACKEND", "Reference")
    assert pa.get_backend() == "reference"
    with pa.backend("auto"):  # an explicit setting wins over the variable
        assert pa.get_backend() == "auto"
    monkeypatch.setenv("TORCH_PAGED_ATTN_BACKEND", "fast")
    with pytest.raises(ValueError, match="TORCH_PAGED_ATTN_BACKEND.*'auto', 'triton', 'flash', 'reference'"):
        pa.get_backend()


def test_batch_invariant_switch_still_works(monkeypatch):
    assert not pa.is_batch_invariant()
    with pa.batch_invariant():
        assert pa.is_batch_invariant()
    monkeypatch.setenv("TORCH_PAGED_ATTN_BATCH_INVARIANT", "1")
    assert pa.is_batch_invariant()
    pa.set_batch_invariant(False)
    assert not pa.is_batch_invariant()
    pa.set_batch_invariant(None)
    with pytest.raises(TypeError):
        pa.set_batch_invariant("yes")


# -- selection on facts ----------------------------------------------------------------------------


def _facts(**kw) -> dict:
    f = dict(device="cuda", dtype=BF16, cache_dtype=BF16, head_size=128, head_size_v=128, block_size=16,
             num_heads=32, num_kv_heads=8, query_tokens_per_seq=2048, cache_nhd=True, scale=0.088,
             causal=True, window_left=-1, window_right=-1, softcap=0.0, attention_chunk_size=0,
             max_query_len=-1, alibi=False, sinks=False, lse=False)
    f.update(kw)
    return f


def _fake_fa4_installed(monkeypatch, capability=(9, 0), with_out=True):
    """A fake ``flash_attn.cute`` (see ``fake_flash_attn_varlen_func``) and a device of
    ``capability``; ``with_out``: also ``flash_attn.cute.interface._flash_attn_fwd`` (FA4's
    forward that takes ``out=``, see ``fake_flash_attn_fwd``)."""
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    cute = types.ModuleType("flash_attn.cute")
    cute.__path__ = []
    cute.flash_attn_varlen_func = fake_flash_attn_varlen_func
    pkg.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    if with_out:
        interface = types.ModuleType("flash_attn.cute.interface")
        interface._flash_attn_fwd = fake_flash_attn_fwd
        cute.interface = interface
        monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
    else:
        monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)
    monkeypatch.setattr(flash, "_capability", lambda: capability)
    flash._function.cache_clear()
    flash._fa4_forward.cache_clear()
    lowering._CHOICES.clear()
    flash._PLANS.clear()


def _name(module) -> str:
    return module.__name__.removeprefix("torch_paged_attn.lowering.")


def _no_flashattention(monkeypatch):
    """Every FlashAttention package unimportable (a ``None`` in sys.modules makes import fail),
    also on a machine that has one."""
    for name in ("flash_attn", "flash_attn.cute", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, name, None)
    flash._function.cache_clear()
    lowering._CHOICES.clear()


def test_flash_without_flashattention_is_an_error(monkeypatch):
    _no_flashattention(monkeypatch)
    assert flash.installed() == []
    with pa.backend("flash"):
        with pytest.raises(RuntimeError, match="backend 'flash'.*flash_attn.cute"):
            lowering.select("paged_attention", _facts())
        # off CUDA the reference runs whatever the setting
        assert _name(lowering.select("paged_attention", _facts(device="cpu"))) == "reference"
        # ops FlashAttention never runs are not affected
        assert _name(lowering.select("merge_attn_states", dict(device="cuda"))) != "flash"


def test_auto_without_flashattention_runs_triton(monkeypatch):
    _no_flashattention(monkeypatch)
    assert _name(lowering.select("paged_attention", _facts())) == "triton.paged_attention"


def test_triton_and_reference_settings():
    with pa.backend("triton"):
        assert _name(lowering.select("paged_attention", _facts())) == "triton.paged_attention"
    with pa.backend("reference"):
        assert _name(lowering.select("paged_attention", _facts())) == "reference"
        assert _name(lowering.select("reshape_and_cache", dict(device="cuda"))) == "reference"


def test_auto_rule_on_facts(monkeypatch, caplog):
    _fake_fa4_installed(monkeypatch)
    n = flash.AUTO_FLASH_MIN_QUERY_TOKENS
    prefill, decode = _facts(query_tokens_per_seq=n), _facts(query_tokens_per_seq=n - 1)
    assert flash.auto_declines("paged_attention", prefill) is None
    assert "decode-like" in flash.auto_declines("paged_attention", decode)
    assert _name(lowering.select("paged_attention", prefill)) == "flash"
    with caplog.at_level(logging.DEBUG, logger="torch_paged_attn.lowering"):
        for _ in range(3):
            lowering._CHOICES.clear()
            assert _name(lowering.select("paged_attention", decode)) == "triton.paged_attention"
    assert len([r for r in caplog.records if "decode-like" in r.getMessage()]) == 1  # logged once
    # what FA4 cannot do goes to Triton under auto and flash alike
    for setting in ("auto", "flash"):
        with pa.backend(setting):
            for facts in (_facts(alibi=True), _facts(attention_chunk_size=64), _facts(dtype=FP32, cache_dtype=FP32),
                          _facts(block_size=128), _facts(cache_nhd=False)):
                assert _name(lowering.select("paged_attention", facts)) == "triton.paged_attention", facts
            fp8 = _facts(cache_dtype=torch.float8_e4m3fn, backend=setting)
            assert "fp8" in flash.supports("paged_attention", fp8)
    # "flash" runs decode on FlashAttention too; batch-invariant mode never does
    with pa.backend("flash"):
        assert _name(lowering.select("paged_attention", decode)) == "flash"
        with pa.batch_invariant():
            assert _name(lowering.select("paged_attention", prefill)) == "triton.paged_attention"
    # MLA: FA4 on SM100 only, and only when asked for
    mla = dict(device="cuda", dtype=BF16, cache_dtype=BF16, latent=512, rope=64, block_size=16, num_heads=16,
               causal=True)
    with pa.backend("flash"):
        assert _name(lowering.select("mla_decode", mla)) == "triton.mla"  # SM90
        monkeypatch.setattr(flash, "_capability", lambda: (10, 0))
        lowering._CHOICES.clear()
        assert _name(lowering.select("mla_decode", mla)) == "flash"
    assert _name(lowering.select("mla_decode", mla)) == "triton.mla"  # auto


def test_the_setting_is_part_of_the_cache_key(monkeypatch):
    _fake_fa4_installed(monkeypatch)
    facts = _facts(query_tokens_per_seq=1)
    assert _name(lowering.select("paged_attention", facts)) == "triton.paged_attention"
    with pa.backend("flash"):
        assert _name(lowering.select("paged_attention", facts)) == "flash"
    with pa.backend("reference"):
        assert _name(lowering.select("paged_attention", facts)) == "reference"
    assert _name(lowering.select("paged_attention", facts)) == "triton.paged_attention"


def test_plan_by_signature_follows_the_setting_and_builds_facts_once(monkeypatch):
    """``lowering.plan`` remembers a call signature's runner per backend setting and batch-invariant
    mode (``planned``): switching either selects again; repeating builds no facts."""
    _fake_fa4_installed(monkeypatch)
    built = []
    select = lowering.select

    def selected(op, facts):  # a backend whose runner returns the name of the one select picked
        name = _name(select(op, facts))
        return types.SimpleNamespace(paged_attention=lambda **options: name)

    monkeypatch.setattr(lowering, "select", selected)

    def facts():
        built.append(1)
        return _facts(query_tokens_per_seq=2048)

    def choose(signature=("a call",)):
        run = lowering.planned(signature) or lowering.plan("paged_attention", signature, facts, (), {})
        return run({})

    assert choose() == "flash" and choose() == "flash"  # auto, prefill-like
    with pa.backend("triton"):
        assert choose() == "triton.paged_attention"
    with pa.batch_invariant():
        assert choose() == "triton.paged_attention"  # FlashAttention has no batch-invariant mode
    with pa.backend("reference"):
        assert choose() == "reference" and choose() == "reference"
    assert choose() == "flash"
    assert len(built) == 4  # auto, triton, batch-invariant, reference: once each
    assert choose(None) == "flash" and lowering.planned(None) is None
    assert len(built) == 5  # no signature: nothing remembered


# -- supports tables --------------------------------------------------------------------------------

# (adapter, capability, fact overrides, runs?) against the contract's features
SUPPORT_TABLE = [
    ("fa4", (9, 0), {}, True),
    ("fa4", (10, 0), {}, True),
    ("fa4", (8, 0), {}, False),  # FA4 paged KV: SM90/SM100 only
    ("fa4", (12, 0), {}, False),
    ("fa4", (9, 0), dict(dtype=FP16, cache_dtype=FP16), True),
    ("fa4", (9, 0), dict(dtype=FP32, cache_dtype=FP32), False),
    ("fa4", (9, 0), dict(cache_dtype=torch.float8_e4m3fn), False),
    ("fa4", (10, 0), dict(cache_dtype=torch.float8_e5m2), False),
    ("fa4", (9, 0), dict(alibi=True), False),
    ("fa4", (9, 0), dict(sinks=True, softcap=30.0, lse=True), True),
    ("fa4", (9, 0), dict(window_left=127, window_right=0), True),
    ("fa4", (9, 0), dict(causal=False, window_left=64, window_right=16), True),
    ("fa4", (9, 0), dict(causal=True, window_right=5), True),
    ("fa4", (9, 0), dict(attention_chunk_size=256), False),
    ("fa4", (9, 0), dict(block_size=8), True),
    ("fa4", (9, 0), dict(block_size=32), True),
    ("fa4", (9, 0), dict(block_size=544), True),
    ("fa4", (9, 0), dict(block_size=64), False),  # TMA pages: unused slots must be finite
    ("fa4", (10, 0), dict(block_size=128), False),
    ("fa4", (9, 0), dict(head_size=256, head_size_v=256), True),
    ("fa4", (9, 0), dict(head_size=96, head_size_v=256), True),
    ("fa4", (10, 0), dict(head_size=256, head_size_v=256), True),
    ("fa4", (10, 0), dict(head_size=192, head_size_v=128), True),
    ("fa4", (10, 0), dict(head_size=96, head_size_v=256), False),
    ("fa4", (10, 0), dict(head_size=192, head_size_v=192), False),
    ("fa4", (9, 0), dict(num_heads=40, num_kv_heads=8), True),  # GQA 5
    ("fa4", (9, 0), dict(cache_nhd=False), False),
    ("fa3", (9, 0), {}, True),
    ("fa3", (10, 0), {}, False),
    ("fa3", (9, 0), dict(sinks=True), False),
    ("fa3", (9, 0), dict(alibi=True), False),
    ("fa3", (9, 0), dict(attention_chunk_size=128), False),
    ("fa3", (9, 0), dict(block_size=64), False),
    ("fa3", (9, 0), dict(softcap=20.0, window_left=10, lse=True), True),
    ("fa2", (8, 0), dict(block_size=256), True),
    ("fa2", (9, 0), dict(block_size=512), True),
    ("fa2", (8, 0), dict(block_size=16), False),  # page_block_size % 256 == 0
    ("fa2", (8, 0), dict(block_size=256, alibi=True), True),  # causal: -slope*|i-j| == slope*(j-p)
    ("fa2", (8, 0), dict(block_size=256, alibi=True, causal=False), False),
    ("fa2", (8, 0), dict(block_size=256, sinks=True), False),
    ("fa2", (8, 0), dict(block_size=256, head_size_v=64), False),
    ("fa2", (7, 5), dict(block_size=256), False),
]


@pytest.mark.parametrize("adapter,capability,overrides,runs", SUPPORT_TABLE,
                         ids=[f"{a}_sm{c[0]}{c[1]}_{'_'.join(f'{k}{v}' for k, v in o.items()) or 'base'}"
                              for a, c, o, _ in SUPPORT_TABLE])
def test_supports_table(adapter, capability, overrides, runs):
    reason = flash._BY_NAME[adapter].unsupported("paged_attention", _facts(**overrides), capability)
    assert (reason is None) == runs, reason
    assert reason is None or isinstance(reason, str) and reason


def test_mla_support_table():
    mla = dict(dtype=BF16, cache_dtype=BF16, latent=512, rope=64, block_size=16, num_heads=16, causal=True)
    fa4 = flash._BY_NAME["fa4"]
    assert fa4.unsupported("mla_decode", mla, (10, 0)) is None
    assert fa4.unsupported("mla_decode", mla, (9, 0)) is not None
    assert fa4.unsupported("mla_decode", {**mla, "block_size": 64}, (10, 0)) is not None
    assert fa4.unsupported("mla_decode", {**mla, "cache_dtype": torch.float8_e4m3fn}, (10, 0)) is not None
    assert fa4.unsupported("mla_decode", {**mla, "latent": 256}, (10, 0)) is not None
    for name in ("fa3", "fa2"):
        assert flash._BY_NAME[name].unsupported("mla_decode", mla, (9, 0)) is not None


# -- FA4 argument mapping through a fake flash_attn.cute ----------------------------------------------

FAKE_CALLS: list[dict] = []


def fake_flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, max_seqlen_q=None, seqused_k=None,
                                page_table=None, softmax_scale=None, causal=False, window_size=(None, None),
                                learnable_sink=None, softcap=0.0, return_lse=False, **unused):
    """FA4's documented semantics in plain torch (flash_attn/cute/interface.py, 4.0.0b36): q
    ``[total_q, H, D]``, paged k/v ``[NP, PS, Hkv, D]``; query t of sequence b at position
    ``seqused_k[b] - q_len + t``; ``causal`` forces the right window to 0; a ``None`` window side is
    unbounded; ``softcap * tanh(scale * qk / softcap)``; the sink is a raw logit in the
    denominator; out ``[total_q, H, Dv]`` (rows past ``cu_seqlens_q[-1]`` not written: NaN here),
    lse ``[H, total_q]`` natural log (-inf, or the sink, for a row with no key)."""
    assert qv is None and not unused, unused
    assert q.dtype == k.dtype == v.dtype and q.dtype in (BF16, FP16)
    assert page_table.dtype == torch.int32 and page_table.stride(-1) == 1
    for t in (cu_seqlens_q, seqused_k):
        assert t.dtype == torch.int32 and t.stride(0) == 1
    assert isinstance(max_seqlen_q, int) or max_seqlen_q is None
    FAKE_CALLS.append(dict(causal=causal, window_size=window_size, softcap=softcap, scale=softmax_scale, out=None))
    total_q, num_heads, _ = q.shape
    num_pages, page_size, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    out = torch.full((total_q, num_heads, v.shape[-1]), float("nan"), dtype=q.dtype)
    lse = torch.full((num_heads, total_q), float("nan"))
    left, right = window_size
    if causal:
        right = 0
    cu, lens = cu_seqlens_q.tolist(), seqused_k.tolist()
    for b, seq_len in enumerate(lens):
        s, e = cu[b], cu[b + 1]
        pages = page_table[b, : -(-seq_len // page_size)].long()
        keys = k[pages].reshape(-1, num_kv_heads, k.shape[-1])[:seq_len].float()
        vals = v[pages].reshape(-1, num_kv_heads, v.shape[-1])[:seq_len].float()
        qpos = torch.arange(e - s) + seq_len - (e - s)
        kpos = torch.arange(seq_len)
        visible = torch.ones(e - s, seq_len, dtype=torch.bool)
        if right is not None:
            visible &= kpos[None, :] <= qpos[:, None] + right
        if left is not None:
            visible &= kpos[None, :] >= qpos[:, None] - left
        kk = keys.repeat_interleave(group, dim=1)  # [L, H, D]
        vv = vals.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,lhd->htl", q[s:e].float(), kk) * softmax_scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        sink = (learnable_sink.float() if learnable_sink is not None else torch.full((num_heads,), float("-inf")))
        logits = torch.cat([scores, sink[:, None, None].expand(-1, e - s, 1)], dim=-1)
        row_lse = torch.logsumexp(logits, dim=-1)  # [H, t]
        weights = torch.where(torch.isinf(row_lse)[..., None], 0.0, torch.exp(scores - row_lse[..., None]))
        out[s:e] = torch.einsum("htl,lhd->thd", weights, vv).to(q.dtype)
        lse[:, s:e] = row_lse
    return (out, lse if return_lse else None)


def fake_flash_attn_fwd(q, k, v, qv=None, cu_seqlens_q=None, max_seqlen_q=None, seqused_k=None, page_table=None,
                       softmax_scale=None, causal=False, window_size_left=None, window_size_right=None,
                       learnable_sink=None, softcap=None, return_lse=False, out=None, lse=None, **unused):
    """FA4's ``interface._flash_attn_fwd`` (4.0.0b36) as far as the adapter uses it: the
    semantics of ``fake_flash_attn_varlen_func``, written into ``out`` when given (FA4's output
    layout rule: contiguous last dimension, 16-byte aligned address and strides), rows past
    ``cu_seqlens_q[-1]`` left as they were; returns ``(out, lse, None, None, None)``."""
    assert not unused, unused
    if lse is not None:  # FA4's layout [H, T], float32, contiguous (its _validate_tensor)
        assert return_lse and lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
        assert lse.is_contiguous()
    if out is not None:
        assert out.shape == (q.shape[0], q.shape[1], v.shape[-1]) and out.dtype == q.dtype
        assert out.stride(-1) == 1 and out.data_ptr() % 16 == 0
        assert all(st * out.element_size() % 16 == 0 for st in out.stride()[:-1])
    o, s = fake_flash_attn_varlen_func(q, k, v, qv=qv, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                       seqused_k=seqused_k, page_table=page_table, softmax_scale=softmax_scale,
                                       causal=causal, window_size=(window_size_left, window_size_right),
                                       learnable_sink=learnable_sink, softcap=softcap or 0.0, return_lse=True)
    FAKE_CALLS[-1]["out"] = None if out is None else out.data_ptr()
    if out is None:
        out = o
    else:
        real = int(cu_seqlens_q[-1])
        out[:real] = o[:real]
    if lse is not None:
        lse.copy_(s)
        s = lse
    return out, s if return_lse else None, None, None, None


class FakeAux:
    """FA4's ``AuxData`` stand-in: an object among the kernel's arguments (no tensors in it)."""

    def __init__(self, tensors=None, scalars=None):
        self.tensors, self.scalars = tensors, scalars


KERNEL_CALLS: list[str] = []


def fake_compiled_kernel(q, k, v, out, lse, scale, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table,
                         window_left, window_right, learnable_sink, sparse, aux, causal=True, softcap=0.0):
    """The kernel FA4 4.0.0b36's forward compiles and calls (``compile_cache[key](*call_args)``, its
    sm_90 argument order), here ``fake_flash_attn_varlen_func``'s semantics into ``out`` (rows up to
    ``cu_seqlens_q[-1]``) and, when given, ``lse``. ``causal`` and ``softcap`` are compiled in:
    bound by ``fake_compiling_forward`` with ``functools.partial``."""
    assert cu_seqlens_k is None and seqused_q is None and sparse is None and isinstance(aux, FakeAux)
    KERNEL_CALLS.append("kernel")
    o, s = fake_flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, page_table=page_table,
                                       softmax_scale=scale, causal=causal, window_size=(window_left, window_right),
                                       learnable_sink=learnable_sink, softcap=softcap, return_lse=True)
    real = int(cu_seqlens_q[-1])
    out[:real] = o[:real]
    if lse is not None:
        lse.copy_(s)


def fake_compiling_forward(q, k, v, qv=None, cu_seqlens_q=None, max_seqlen_q=None, seqused_k=None, page_table=None,
                           softmax_scale=None, causal=False, window_size_left=None, window_size_right=None,
                           learnable_sink=None, softcap=None, return_lse=False, out=None, lse=None, **unused):
    """FA4 4.0.0b36's ``_flash_attn_fwd`` as it reaches its kernel: the output and LSE it
    allocates when not given, one compilation a key in ``fake_compiling_forward.compile_cache``,
    then ``compile_cache[key](*call_args)`` with detached inputs; ``SPLIT`` (a test's switch):
    the kernel writes a partial buffer of FA4's own, copied into ``out`` after it (as a split's
    combine does)."""
    assert qv is None and not unused, unused
    FAKE_CALLS.append(dict(causal=causal, window_size=(window_size_left, window_size_right), softcap=softcap,
                           scale=softmax_scale, out=None if out is None else out.data_ptr()))
    cache = fake_compiling_forward.compile_cache
    key = (q.dtype, q.shape[1:], k.shape[1:], causal, softcap, window_size_left is None, window_size_right is None,
           learnable_sink is None, return_lse)
    if key not in cache:
        cache[key] = functools.partial(fake_compiled_kernel, causal=causal, softcap=softcap or 0.0)
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    if lse is None and return_lse:
        lse = torch.empty(q.shape[1], q.shape[0])
    target = torch.empty_like(out) if fake_compiling_forward.SPLIT else out
    cache[key](q.detach(), k.detach(), v.detach(), target.detach(), lse, softmax_scale, cu_seqlens_q, None, None,
               seqused_k, page_table, window_size_left, window_size_right, learnable_sink, None, FakeAux())
    if target is not out:
        real = int(cu_seqlens_q[-1])
        out[:real] = target[:real]
    return out, lse, None, None, None


def _compiling_fa4_installed(monkeypatch, split=False, capability=(9, 0)):
    """``_fake_fa4_installed`` (a device of ``capability``) with ``fake_compiling_forward`` as
    FA4's forward, its compile cache empty."""
    _fake_fa4_installed(monkeypatch, capability=capability)
    interface = sys.modules["flash_attn.cute.interface"]
    monkeypatch.setattr(fake_compiling_forward, "compile_cache", {}, raising=False)
    monkeypatch.setattr(fake_compiling_forward, "SPLIT", split, raising=False)
    monkeypatch.setattr(interface, "_flash_attn_fwd", fake_compiling_forward)
    flash._fa4_forward.cache_clear()
    FAKE_CALLS.clear()
    KERNEL_CALLS.clear()


def _direct_inputs(seed):
    batch = make_paged_batch([1, 3, 1, 2], [9, 20, 2, 14], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=BF16, pad_tokens=2, seed=seed)
    options = dict(scale=0.2, causal=True, window_left=5, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=torch.randn(4, generator=torch.Generator().manual_seed(seed)), k_scale=None,
                   v_scale=None, attention_chunk_size=0)
    return batch, options


def _check_direct(batch, options, out, lse=None):
    loop_opts = {k: v for k, v in options.items() if k not in ("k_scale", "v_scale")}
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **loop_opts)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out, truth_out, dtype=BF16, reference=ref_out, name="out")
    if lse is not None:
        assert_close(lse, truth_lse, dtype=BF16, reference=ref_lse, name="lse")


@pytest.mark.parametrize("with_lse", [False, True])
def test_fa4_kernel_called_directly_after_the_first_call(with_lse, monkeypatch):
    """From a plan's second call on, the kernel FA4's forward ran at the first is called with each
    call's own tensors, without the forward: fresh inputs each call (new query, cache, lengths and
    table values, new tensors), each output (and LSE) poisoned, each equal to the float64 loop."""
    _compiling_fa4_installed(monkeypatch)
    run = None
    for seed in range(4):
        batch, options = _direct_inputs(seed)
        out = torch.full((batch.query.shape[0], 4, 32), float("nan"), dtype=BF16)
        lse = torch.full((batch.query.shape[0], 4), float("nan")) if with_lse else None
        args = (*batch.args(), out, lse)
        run = run or flash.prepare_paged_attention(*args, **options)  # one plan, as lowering.plan keeps it
        run(*args, options)
        _check_direct(batch, options, out, lse)
    forwards = [c for c in FAKE_CALLS if c["out"] is not None]  # (the kernel's own entries have None)
    assert len(forwards) == 1 and KERNEL_CALLS == ["kernel"] * 4


@pytest.mark.parametrize("why", ["split", "lse", "key_cache is value_cache", "sm100"])
def test_fa4_forward_kept_where_the_kernel_call_cannot_be_replayed(why, monkeypatch):
    """The forward runs at every call where its kernel call took a tensor of FA4's own (a split's
    partial buffer; ``lse``: split with an LSE), could not be told apart by role (one cache for
    keys and values), or on a device where replaying was not verified
    (``flash.DIRECT_CAPABILITIES``); the results stay right."""
    _compiling_fa4_installed(monkeypatch, split=why in ("split", "lse"), capability=(10, 0) if why == "sm100" else (9, 0))
    run = None
    for seed in range(3):
        batch, options = _direct_inputs(seed)
        if why == "key_cache is value_cache":
            batch.value_cache = batch.key_cache
        out = torch.full((batch.query.shape[0], 4, 32), float("nan"), dtype=BF16)
        lse = torch.full((batch.query.shape[0], 4), float("nan")) if why == "lse" else None
        args = (*batch.args(), out, lse)
        run = run or flash.prepare_paged_attention(*args, **options)
        run(*args, options)
        _check_direct(batch, options, out, lse)
    forwards = [c for c in FAKE_CALLS if c["out"] is not None]
    assert len(forwards) == 3 and KERNEL_CALLS == ["kernel"] * 3


def test_recorder_passes_other_threads_and_closes():
    """The stand-in compile cache delegates lookups and compilations, records only its own
    thread's kernel calls, and none once closed."""
    cache = {"a": lambda x: x + 1}
    recorder = flash._Recorder(cache)
    recorder["b"] = lambda x: x * 2
    assert "b" in cache and "b" in recorder and recorder["a"](1) == 2
    seen = []
    worker = threading.Thread(target=lambda: seen.append(recorder["b"](3)))
    worker.start()
    worker.join()
    assert seen == [6] and len(recorder.calls) == 1
    recorder.open = False
    assert recorder["a"](5) == 6 and len(recorder.calls) == 1


def test_replayer_rejects_unknown_tensors():
    """A recorded call is replayed only when every tensor it took is one of the call's (a view of
    the same address, shape and strides), tensors hidden in containers or objects included."""
    q, out = torch.randn(4, 2), torch.randn(4, 2)
    kernel = lambda *a: None  # noqa: E731
    assert flash._replayer([(kernel, (q.detach(), out, 0.5, None), {})], dict(q=q, out=out)) is not None
    assert flash._replayer([(kernel, (q.clone(), out), {})], dict(q=q, out=out)) is None  # a copy
    assert flash._replayer([(kernel, (q.t(), out), {})], dict(q=q, out=out)) is None  # another view
    assert flash._replayer([(kernel, (q, out, (torch.ones(1),)), {})], dict(q=q, out=out)) is None
    assert flash._replayer([(kernel, (q, out, FakeAux([torch.ones(1)])), {})], dict(q=q, out=out)) is None
    assert flash._replayer([(kernel, (q,), {})], dict(q=q, out=out)) is None  # out never passed
    assert flash._replayer([(kernel, (q, out), {}), (kernel, (q, out), {})], dict(q=q, out=out)) is None
    assert flash._replayer([], dict(q=q, out=out)) is None


MAPPING_CASES = [
    dict(),
    dict(window=(3, 0)),
    dict(window=(7, 2), causal=False),
    dict(window=(-1, 2), causal=False),
    dict(window=(5, 4), causal=True),  # causal still applies: the right window is the diagonal
    dict(softcap=5.0),
    dict(sinks=True),
    dict(sinks=True, softcap=3.0, window=(6, 0), dtype=FP16),
    dict(causal=False, sinks=True),
    dict(num_heads=8, num_kv_heads=1, head_size_v=16),
]


@pytest.mark.parametrize("with_out", [True, False], ids=["out_param", "varlen_func"])
@pytest.mark.parametrize("case", MAPPING_CASES, ids=lambda c: "_".join(f"{k}{v}" for k, v in c.items()) or "base")
def test_fa4_argument_mapping_against_the_loop(case, with_out, monkeypatch):
    """Every option through FA4 (into ``out`` itself with ``with_out``, else through the public
    function and a copy), against the float64 loop; outputs poisoned, padding rows included."""
    _fake_fa4_installed(monkeypatch, with_out=with_out)
    FAKE_CALLS.clear()
    dtype = case.get("dtype", BF16)
    batch = make_paged_batch([1, 4, 3, 2, 0], [9, 20, 2, 0, 5], num_heads=case.get("num_heads", 4),
                             num_kv_heads=case.get("num_kv_heads", 2), head_size=32,
                             head_size_v=case.get("head_size_v"), block_size=8, dtype=dtype, pad_tokens=2, seed=4)
    g = torch.Generator().manual_seed(1)
    heads = batch.query.shape[1]
    options = dict(scale=0.2, causal=case.get("causal", True), window_left=case.get("window", (-1, -1))[0],
                   window_right=case.get("window", (-1, -1))[1], softcap=case.get("softcap", 0.0), alibi_slopes=None,
                   sinks=torch.randn(heads, generator=g) * 2 if case.get("sinks") else None, k_scale=None,
                   v_scale=None, attention_chunk_size=0)
    t, _, _ = batch.query.shape
    out = torch.full((t, heads, batch.value_cache.shape[-1]), float("nan"), dtype=dtype)
    lse = torch.full((t, heads), float("nan"))
    flash.paged_attention(*batch.args(), out, lse, **options)
    assert len(FAKE_CALLS) == 1
    call = FAKE_CALLS[0]
    assert call["out"] == (out.data_ptr() if with_out else None)  # FA4 wrote into out itself
    assert call["scale"] == options["scale"] and call["causal"] == options["causal"]
    loop_opts = {k: v for k, v in options.items() if k not in ("k_scale", "v_scale")}
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **loop_opts)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out, truth_out, dtype=dtype, reference=ref_out, name="out")
    assert_close(lse, truth_lse, dtype=dtype, reference=ref_lse, name="lse")
    # without lse: out only
    out2 = torch.full_like(out, float("nan"))
    flash.paged_attention(*batch.args(), out2, None, **options)
    assert torch.equal(out2, out)


def test_fa4_bad_block_ids_read_no_other_block(monkeypatch):
    """A sequence with a block id outside [0, NB) in its used part attends to no key: 0 and -inf,
    the other sequences as the float64 loop has them."""
    _fake_fa4_installed(monkeypatch)
    batch = make_paged_batch([1, 4, 3], [9, 20, 17], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=BF16, seed=6)
    nb = batch.key_cache.shape[0]
    batch.block_table[1, 2] = nb
    batch.block_table[2, 0] = -1
    options = dict(scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    out = torch.full((8, 4, 32), float("nan"), dtype=BF16)
    lse = torch.full((8, 4), float("nan"))
    flash.paged_attention(*batch.args(), out, lse, **options)
    assert torch.equal(out[1:], torch.zeros_like(out[1:])) and bool((lse[1:] == float("-inf")).all())
    good = make_paged_batch([1], [9], num_heads=4, num_kv_heads=2, head_size=32, block_size=8, dtype=BF16, seed=6)
    truth_out, truth_lse = loop.paged_attention(batch.query[:1], batch.key_cache, batch.value_cache,
                                                batch.block_table[:1], batch.seq_lens[:1],
                                                good.query_start_loc, **{k: v for k, v in options.items()
                                                                         if k not in ("k_scale", "v_scale")})
    assert_close(out[:1], truth_out, dtype=BF16, name="out")
    assert_close(lse[:1], truth_lse, dtype=BF16, name="lse")


def test_fa4_window_translation(monkeypatch):
    """-1 is unbounded (None); a causal call passes no right window (FA4 sets it to 0)."""
    _fake_fa4_installed(monkeypatch)
    batch = make_paged_batch([2], [10], num_heads=2, num_kv_heads=1, head_size=16, dtype=BF16, seed=1)
    base = dict(scale=0.25, softcap=0.0, alibi_slopes=None, sinks=None, k_scale=None, v_scale=None,
                attention_chunk_size=0)
    expect = {(True, -1, -1): (None, None), (True, 4, 3): (4, None), (False, -1, 2): (None, 2),
              (False, 3, -1): (3, None), (False, 0, 0): (0, 0)}
    for (causal, wl, wr), window in expect.items():
        FAKE_CALLS.clear()
        out = torch.empty(2, 2, 16, dtype=BF16)
        flash.paged_attention(*batch.args(), out, None, causal=causal, window_left=wl, window_right=wr, **base)
        assert FAKE_CALLS[0]["window_size"] == window, (causal, wl, wr)


@pytest.mark.parametrize("layout", ["row_slice", "misaligned"])
def test_fa4_out_views_written_in_place(layout, monkeypatch):
    """``out`` as a strided view (a slice of a wider buffer): FA4 writes into it when its layout
    is one FA4 takes (16-byte aligned strides), else into its own buffer and the result is copied;
    both poisoned, padding rows included, equal to the float64 loop, and nothing outside the view
    is touched."""
    _fake_fa4_installed(monkeypatch)
    FAKE_CALLS.clear()
    batch = make_paged_batch([3, 1, 5], [11, 30, 5], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=BF16, pad_tokens=3, seed=9)
    t = batch.query.shape[0]
    extra = 8 if layout == "row_slice" else 3  # 4 x 32 + 3 bf16 per token: 262-byte rows, not aligned
    wide = torch.full((t, 4 * 32 + extra), float("nan"), dtype=BF16)
    out = wide[:, :128].view(t, 4, 32) if layout == "row_slice" else wide[:, :128].unflatten(1, (4, 32))
    lse = torch.full((t, 4), float("nan"))
    options = dict(scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    flash.paged_attention(*batch.args(), out, lse, **options)
    assert FAKE_CALLS[0]["out"] == (out.data_ptr() if layout == "row_slice" else None)
    loop_opts = {k: v for k, v in options.items() if k not in ("k_scale", "v_scale")}
    truth_out, truth_lse = loop.paged_attention(*batch.args(), **loop_opts)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    assert_close(out, truth_out, dtype=BF16, reference=ref_out, name="out")
    assert_close(lse, truth_lse, dtype=BF16, reference=ref_lse, name="lse")
    assert bool(wide[:, 128:].isnan().all())  # columns outside the view untouched


def _kernel_inputs(strided: bool):
    """A block table of 5 sequences over 9 blocks of 8 keys, with bad ids in two used parts and
    one past a used part; ``query_start_loc`` with 13 real rows of 21 (two 16-row programs);
    ``strided``: every index tensor a strided view (table columns, lengths and starts of step 2)."""
    g = torch.Generator().manual_seed(3)
    num_blocks = 9
    table = torch.randint(0, num_blocks, (5, 6), dtype=torch.int32, generator=g)
    lens = torch.tensor([0, 17, 48, 9, 40], dtype=torch.int32)
    table[1, 2] = num_blocks  # used (17 keys: 3 pages)
    table[2, 5] = -1  # used (48 keys: 6 pages)
    table[3, 4] = 99  # past the used part (9 keys: 2 pages): never read
    qsl = torch.tensor([0, 5, 9, 13, 13, 13], dtype=torch.int32)
    if strided:
        table, lens, qsl = _every_other(table), _every_other(lens), _every_other(qsl)
        assert table.stride() == (12, 2) and lens.stride() == (2,) and qsl.stride() == (2,)
    return table, lens, qsl, torch.empty(num_blocks, 8, 1, 8, dtype=BF16)


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose last dimension has stride 2 (garbage in between)."""
    return torch.stack([t, torch.full_like(t, 10**6)], dim=-1).flatten(-2)[..., ::2]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_index_tensors"])
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_flash_kernels_against_torch(kernels, strided):
    """The steps around a FlashAttention call (``_Plan._before`` / ``_after``: ``flash_kernels``
    interpreted, or their torch formulation) equal their plain-torch definitions: the guarded
    lengths; padding rows of ``out`` zeroed before the call only when FA4 writes into ``out``,
    after it only when FlashAttention's own buffer was copied; the LSE transposed, ``+inf`` as
    ``-inf``, padding ``-inf``; real rows of ``out`` never written (they stay NaN)."""
    if kernels == "triton" and not _INTERPRET:
        pytest.skip("the Triton kernels on CPU need TRITON_INTERPRET=1")
    table, lens, qsl, key_cache = _kernel_inputs(strided)
    g = torch.Generator().manual_seed(4)
    for with_lse in (False, True):
        for head_major in (True, False):
            out = torch.full((21, 3, 24), float("nan"), dtype=BF16)
            lse = torch.full((21, 3), float("nan")) if with_lse else None
            qv = None if head_major else torch.empty(21, 3, 8, dtype=BF16)  # FA4 with qv: a [T, H] LSE
            plan = flash._Plan("fa4", table, lens, qsl, key_cache, qv, out, lse, 0.1, True, -1, -1, 0.0, -1)
            if kernels == "torch":
                plan.before_launch = plan.after_launch = None
            else:
                assert plan.before_launch is not None and plan.after_launch is not None
            for in_place in (True, False):
                out.fill_(float("nan"))
                guarded = plan._before(table, lens, qsl, out, zero_padding=in_place)
                assert guarded.tolist() == [0, 0, 0, 9, 40] and guarded.dtype == torch.int32
                assert bool(out[:13].isnan().all())
                assert torch.equal(out[13:], torch.zeros_like(out[13:])) if in_place else bool(out[13:].isnan().all())
                if not with_lse and in_place:
                    continue  # the hot path: no launch after the call
                out[13:] = float("nan")  # the copy of FlashAttention's buffer over every row
                src = torch.randn(21, 3, generator=g)
                src[2, 1] = float("inf")  # FA2's empty row
                plan._after(out, lse, src.t().contiguous() if head_major else src, qsl, in_place)
                assert bool(out[:13].isnan().all())
                assert bool(out[13:].isnan().all()) if in_place else torch.equal(out[13:], torch.zeros_like(out[13:]))
                if with_lse:
                    want = torch.where(src == float("inf"), float("-inf"), src)
                    want[13:] = float("-inf")
                    assert torch.equal(lse, want)


def _launches(monkeypatch) -> list[str]:
    """Names of the Triton kernels launched from now on (interpreted launches go through
    ``_launch.launch``)."""
    from torch_paged_attn.lowering.triton import _launch

    names: list[str] = []
    real = _launch.launch

    def launch(kernel, grid, like):
        names.append(kernel.__name__)
        return real(kernel, grid, like)

    monkeypatch.setattr(_launch, "launch", launch)
    return names


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided_index_tensors"])
@pytest.mark.parametrize("with_out", [True, False], ids=["out_param", "varlen_func"])
@pytest.mark.parametrize("with_lse", [False, True], ids=["no_lse", "lse"])
def test_fa4_padding_rows_zero_real_rows_right(with_lse, with_out, strided, monkeypatch):
    """Padding rows (past ``query_start_loc[-1]``) of a poisoned ``out`` are 0 (``lse`` -inf),
    real rows equal the float64 loop, a sequence with a bad block id gets 0 / -inf, with and
    without an LSE, FA4 writing into ``out`` or through its own buffer and a copy, with block
    table, lengths and starts contiguous or strided views. Interpreted, the launches are counted:
    into ``out`` without an LSE, one kernel runs beside FlashAttention (before it); with an LSE or
    a copy, one more after it."""
    _fake_fa4_installed(monkeypatch, with_out=with_out)
    FAKE_CALLS.clear()
    batch = make_paged_batch([1, 3, 2, 0], [9, 20, 5, 4], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=BF16, pad_tokens=19, seed=8)  # 6 real rows of 25: two 16-row programs
    batch.block_table[2, 0] = -3  # sequence 2 (rows 4, 5): a bad id in its used part
    if strided:
        batch.block_table, batch.seq_lens = _every_other(batch.block_table), _every_other(batch.seq_lens)
        batch.query_start_loc = _every_other(batch.query_start_loc)
    t = batch.query.shape[0]
    options = dict(scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    out = torch.full((t, 4, 32), float("nan"), dtype=BF16)
    lse = torch.full((t, 4), float("nan")) if with_lse else None
    launched = _launches(monkeypatch)
    flash.paged_attention(*batch.args(), out, lse, **options)
    assert FAKE_CALLS[0]["out"] == (out.data_ptr() if with_out else None)
    assert torch.equal(out[6:], torch.zeros_like(out[6:])) and torch.equal(out[4:6], torch.zeros_like(out[4:6]))
    good = slice(0, 4)
    loop_opts = {k: v for k, v in options.items() if k not in ("k_scale", "v_scale")}
    table = batch.block_table.clone()
    table[2, 0] = 0
    truth_out, truth_lse = loop.paged_attention(batch.query, batch.key_cache, batch.value_cache, table,
                                                batch.seq_lens, batch.query_start_loc, **loop_opts)
    assert_close(out[good], truth_out[good], dtype=BF16, name="out")
    if with_lse:
        assert bool((lse[4:] == float("-inf")).all())
        assert_close(lse[good], truth_lse[good], dtype=BF16, name="lse")
    if _INTERPRET:
        after = ["after_call_kernel"] if with_lse or not with_out else []
        assert launched == ["before_call_kernel", *after], launched


def test_private_op_through_the_dispatcher(monkeypatch):
    """The private op called through the dispatcher (what a traced or compiled call runs) plans
    its body at a signature's first call (``_PLANS``) and reuses it; its results are the direct
    call's bits, padding rows and a bad sequence 0 / -inf; ``opcheck`` passes (schema, mutation,
    fake)."""
    _fake_fa4_installed(monkeypatch)
    batch = make_paged_batch([2, 1, 3], [9, 20, 4], num_heads=4, num_kv_heads=2, head_size=32, block_size=8,
                             dtype=BF16, pad_tokens=5, seed=12)
    batch.block_table[1, 1] = batch.key_cache.shape[0]  # sequence 1 (row 2): a bad id in its used part
    t = batch.query.shape[0]
    direct_out, direct_lse = torch.full((t, 4, 32), float("nan"), dtype=BF16), torch.full((t, 4), float("nan"))
    options = dict(scale=0.2, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    flash.paged_attention(*batch.args(), direct_out, direct_lse, **options)
    assert not flash._PLANS  # the eager call ran the plan made at plan time
    op = torch.ops.paged_attn._flash_attention.default
    for _ in range(2):
        out, lse = torch.full_like(direct_out, float("nan")), torch.full_like(direct_lse, float("nan"))
        args = ("fa4", *batch.args(), None, out, lse, 0.2, True, -1, -1, 0.0, None, None, -1)
        assert op(*args) is None
        assert torch.equal(out, direct_out) and torch.equal(lse, direct_lse)
        assert len(flash._PLANS) == 1
    for rows in (slice(2, 3), slice(6, t)):
        assert torch.equal(out[rows], torch.zeros_like(out[rows])) and bool((lse[rows] == float("-inf")).all())
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_private_op_fake_and_schema():
    """The private op mutates exactly ``out`` and ``lse``, and its fake returns nothing."""
    op = torch.ops.paged_attn._flash_attention.default
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "lse"]
    assert len(op._schema.returns) == 0
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(5, 4, 32, dtype=BF16)
        kc, vc = torch.empty(3, 8, 2, 32, dtype=BF16), torch.empty(3, 8, 2, 16, dtype=BF16)
        i = lambda *s: torch.empty(*s, dtype=torch.int32)  # noqa: E731
        out, lse = torch.empty(5, 4, 16, dtype=BF16), torch.empty(5, 4)
        assert op("fa4", q, kc, vc, i(2, 3), i(2), i(3), None, out, lse, 0.1, True, -1, -1, 0.0, None, None,
                  -1) is None
        assert op("fa4", q, kc, vc, i(2, 3), i(2), i(3), None, out, None, 0.1, True, -1, -1, 0.0, None, None,
                  -1) is None


# -- GPU tier ------------------------------------------------------------------------------------------



def _fa4_importable() -> bool:
    try:
        from flash_attn.cute import flash_attn_varlen_func  # noqa: F401
    except Exception:
        return False
    return True


_GPU = torch.cuda.is_available() and not _INTERPRET
gpu_fa4 = pytest.mark.skipif(
    not (_GPU and _fa4_importable()), reason="needs CUDA (TRITON_INTERPRET unset) and an importable flash_attn.cute"
)

if _GPU:  # the Triton tests' case builder and checks (they import triton)
    from test_triton_paged_attention import Case, check_against_reference, make_inputs
else:
    Case = None


def _spy(monkeypatch) -> list[str]:
    """Adapter names of the FlashAttention calls made from now on."""
    calls: list[str] = []
    real = flash._call

    def call(adapter, *args, **kwargs):
        calls.append(adapter)
        return real(adapter, *args, **kwargs)

    monkeypatch.setattr(flash, "_call", call)
    return calls


def _public(batch, options, *, with_lse=True):
    opts = {k: v for k, v in options.items()}
    return pa.paged_attention(*batch.args(), return_lse=with_lse, **opts)


def _gpu_cases(supported: bool) -> list:
    if Case is None:
        return []
    mixed = Case((1, 17, 1, 0, 5, 300), (1000, 300, 17, 0, 5, 333), num_heads=8, num_kv_heads=2, head_size=128,
                 pad_tokens=3)
    decode = Case((1, 1, 1, 1, 1), (1023, 1, 16, 700, 2100), num_heads=8, num_kv_heads=2, head_size=128)
    prefill = Case((512, 256), (512, 1024), num_heads=8, num_kv_heads=2, head_size=128)
    if not supported:  # features FA4 declines: the call must run Triton and be right
        return [replace(mixed, alibi=True), replace(mixed, chunk=256), replace(mixed, dtype=FP32),
                replace(mixed, cache_dtype=torch.float8_e4m3fn), replace(mixed, block_size=128),
                replace(mixed, block_size=64), replace(mixed, strided="hnd"), replace(decode, alibi=True)]
    cases = [mixed, decode, prefill]
    cases += [replace(mixed, dtype=FP16), replace(prefill, dtype=FP16)]
    cases += [replace(mixed, head_size=d) for d in (64, 96, 256)]
    cases += [replace(mixed, head_size=192, head_size_v=128)]
    cases += [replace(mixed, block_size=bs) for bs in (8, 32, 256, 544)]
    cases += [replace(mixed, num_heads=h, num_kv_heads=kv) for h, kv in ((8, 8), (10, 2), (64, 1))]
    cases += [replace(c, **f) for c in (mixed, prefill) for f in (
        dict(causal=False), dict(window=(127, 0)), dict(window=(64, 16), causal=False),
        dict(window=(-1, 5), causal=False), dict(window=(100, 5)), dict(softcap=30.0), dict(sinks=True),
        dict(with_lse=False), dict(sinks=True, softcap=20.0, window=(200, 0)), dict(strided="cross_layer"))]
    return cases


def _check_public(case, monkeypatch, expect_flash: bool) -> None:
    batch, options = make_inputs(case, "cuda", seed=17)
    calls = _spy(monkeypatch)
    with pa.backend("flash"):
        out, lse = _public(batch, options, with_lse=case.with_lse)
    assert bool(calls) == expect_flash, calls
    check_against_reference(batch, options, out, lse if case.with_lse else None, case.dtype)


@gpu_fa4
@pytest.mark.parametrize("case", _gpu_cases(True), ids=lambda c: c.id)
def test_flash_parity_cuda(case, monkeypatch):
    _check_public(case, monkeypatch, expect_flash=True)


@gpu_fa4
@pytest.mark.parametrize("case", _gpu_cases(False), ids=lambda c: c.id)
def test_flash_fallback_cuda(case, monkeypatch):
    _check_public(case, monkeypatch, expect_flash=False)


@gpu_fa4
def test_flash_bad_block_ids_read_no_other_block_cuda(monkeypatch):
    """A sequence with a block id outside [0, NB) attends to no key (0, -inf) on FlashAttention;
    the others equal the reference."""
    case = Case((1, 40, 1, 3), (900, 300, 17, 500), num_heads=8, num_kv_heads=2, head_size=128)
    batch, options = make_inputs(case, "cuda", seed=5)
    nb = batch.key_cache.shape[0]
    batch.block_table[1, 3] = nb + 7
    batch.block_table[3, 0] = -5
    calls = _spy(monkeypatch)
    with pa.backend("flash"):
        out, lse = _public(batch, options)
    assert calls
    qsl = batch.query_start_loc.tolist()
    for seq in (1, 3):
        rows = slice(qsl[seq], qsl[seq + 1])
        assert torch.equal(out[rows], torch.zeros_like(out[rows])) and bool((lse[rows] == float("-inf")).all())
    for seq in (0, 2):
        rows = slice(qsl[seq], qsl[seq + 1])
        ref_out, ref_lse = reference.attention(*batch.args(), **options)
        torch.testing.assert_close(out[rows].float(), ref_out[rows].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[rows], ref_lse[rows], atol=2e-2, rtol=2e-2)


@gpu_fa4
@pytest.mark.parametrize("with_lse", [True, False])
def test_flash_out_form_writes_in_place_cuda(with_lse, monkeypatch):
    """paged_attention_out on FA4: FlashAttention writes the caller's ``out`` (a poisoned row slice
    of a wider buffer, padding rows included) itself, and the result equals the reference."""
    case = Case((1, 17, 1, 0, 5, 300), (1000, 300, 17, 0, 5, 333), num_heads=8, num_kv_heads=2, head_size=128,
                pad_tokens=3)
    batch, options = make_inputs(case, "cuda", seed=23)
    t = batch.query.shape[0]
    wide = torch.full((t, 8 * 128 + 64), float("nan"), dtype=BF16, device="cuda")
    out = wide[:, : 8 * 128].view(t, 8, 128)
    lse = torch.full((t, 8), float("nan"), device="cuda") if with_lse else None
    forward = flash._fa4_forward()
    assert forward is not None, "flash_attn.cute.interface._flash_attn_fwd with out= is expected on FA4 4.0.0b36"
    written = []

    def spy(*args, **kwargs):
        written.append(kwargs.get("out") is out)
        return forward(*args, **kwargs)

    monkeypatch.setattr(flash, "_fa4_forward", lambda: spy)
    with pa.backend("flash"):
        pa.paged_attention_out(*batch.args(), out, lse, **options)
    assert written == [True]
    check_against_reference(batch, options, out, lse, case.dtype)
    assert bool(wide[:, 8 * 128 :].isnan().all())


@gpu_fa4
@pytest.mark.parametrize("with_lse", [False, True])
@pytest.mark.parametrize("fresh", ["values", "tensors"])
def test_flash_repeated_calls_run_fa4_kernel_directly_cuda(fresh, with_lse, monkeypatch):
    """Repeated ``paged_attention_out`` calls of one signature on FA4: the first runs FA4's
    forward, the later ones the kernel it ran, called directly (``flash._Recorder``); each call's
    inputs new (``values``: the same tensors refilled, as a CUDA-graph or a serving loop's static
    buffers; ``tensors``: new tensors), its ``out`` (and ``lse``) poisoned, padding rows and a bad
    block id included, each result equal to the reference."""
    case = Case((1, 40, 1, 3, 1), (900, 300, 17, 500, 64), num_heads=8, num_kv_heads=2, head_size=128,
                pad_tokens=5)
    forward = flash._fa4_forward()
    assert forward is not None, "flash_attn.cute.interface._flash_attn_fwd with out= is expected on FA4 4.0.0b36"
    forwards = []

    def spy(*args, **kwargs):
        forwards.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(flash, "_fa4_forward", lambda: spy)
    lowering._CHOICES.clear()
    flash._PLANS.clear()
    batch, options = make_inputs(case, "cuda", seed=40)  # options (a plan's signature) kept throughout
    out = torch.empty(batch.query.shape[0], 8, 128, dtype=BF16, device="cuda")
    lse = torch.empty(batch.query.shape[0], 8, device="cuda") if with_lse else None
    with pa.backend("flash"):
        for seed in range(41, 45):
            new, _ = make_inputs(case, "cuda", seed=seed)
            new.block_table[3, 2] = new.key_cache.shape[0] + seed  # sequence 3 (500 keys): used
            if fresh == "values":
                for mine, theirs in zip(batch.args(), new.args()):
                    mine.copy_(theirs)
            else:
                batch, out = new, torch.empty_like(out)
                lse = torch.empty_like(lse) if with_lse else None
            out.fill_(float("nan"))
            if with_lse:
                lse.fill_(float("nan"))
            pa.paged_attention_out(*batch.args(), out, lse, **options)
            qsl = batch.query_start_loc.tolist()
            for rows in (slice(qsl[-1], out.shape[0]), slice(qsl[3], qsl[4])):  # padding, the bad sequence
                assert torch.equal(out[rows], torch.zeros_like(out[rows]))
                assert lse is None or bool((lse[rows] == float("-inf")).all())
            truth_out, truth_lse = reference.attention(batch.query.float(), *batch.args()[1:], **options)
            ref_out, ref_lse = reference.attention(*batch.args(), **options)
            for good in (slice(0, qsl[3]), slice(qsl[4], qsl[5])):
                assert_close(out[good], truth_out[good], dtype=BF16, reference=ref_out[good], name="out")
                if with_lse:
                    assert_close(lse[good], truth_lse[good], dtype=BF16, reference=ref_lse[good], name="lse")
    assert forwards == [1]


@gpu_fa4
@pytest.mark.parametrize("layout", ["aligned", "misaligned"])
@pytest.mark.parametrize("with_lse", [False, True])
def test_flash_padding_rows_and_bad_ids_into_poisoned_out_cuda(with_lse, layout, monkeypatch):
    """paged_attention_out on FA4 into a NaN-poisoned ``out`` (and ``lse``), a row slice of a
    wider buffer: padding rows (past ``query_start_loc[-1]``) are 0 / -inf, a sequence with a bad
    block id 0 / -inf, the other rows equal the reference, nothing outside the view is written.
    ``aligned``: FA4 writes into ``out`` and the launch after the call runs only with an LSE;
    ``misaligned`` (a 2054-byte row stride): through FA4's own buffer and a copy, then that launch
    zeroes the padding rows again."""
    case = Case((1, 40, 1, 3), (900, 300, 17, 500), num_heads=8, num_kv_heads=2, head_size=128, pad_tokens=37)
    batch, options = make_inputs(case, "cuda", seed=29)
    batch.block_table[3, 1] = batch.key_cache.shape[0] + 2  # sequence 3: 500 keys, 32 pages: used
    t = batch.query.shape[0]
    wide = torch.full((t, 8 * 128 + (64 if layout == "aligned" else 3)), float("nan"), dtype=BF16, device="cuda")
    out = wide[:, : 8 * 128].unflatten(1, (8, 128))
    lse = torch.full((t, 8), float("nan"), device="cuda") if with_lse else None
    after = []
    real_after = flash._Plan._after

    def spy_after(self, *args):
        after.append(args[-1])  # in_place
        return real_after(self, *args)

    monkeypatch.setattr(flash._Plan, "_after", spy_after)
    calls = _spy(monkeypatch)
    with pa.backend("flash"):
        pa.paged_attention_out(*batch.args(), out, lse, **options)
    assert calls == ["fa4"]
    assert after == ([layout == "aligned"] if with_lse or layout == "misaligned" else [])
    qsl = batch.query_start_loc.tolist()
    for rows in (slice(qsl[-1], t), slice(qsl[3], qsl[4])):  # padding, the bad sequence
        assert torch.equal(out[rows], torch.zeros_like(out[rows]))
        assert lse is None or bool((lse[rows] == float("-inf")).all())
    truth_out, truth_lse = reference.attention(batch.query.float(), *batch.args()[1:], **options)
    ref_out, ref_lse = reference.attention(*batch.args(), **options)
    good = slice(0, qsl[3])  # sequences 0-2 (the reference masks just the bad block of sequence 3)
    assert_close(out[good], truth_out[good], dtype=BF16, reference=ref_out[good], name="out")
    if lse is not None:
        assert_close(lse[good], truth_lse[good], dtype=BF16, reference=ref_lse[good], name="lse")
    assert bool(wide[:, 8 * 128 :].isnan().all())


@gpu_fa4
def test_auto_picks_flash_for_prefill_only_cuda(monkeypatch):
    calls = _spy(monkeypatch)
    decode = Case((1, 1, 1), (500, 20, 900), num_heads=8, num_kv_heads=2, head_size=128)
    prefill = Case((256, 300), (256, 700), num_heads=8, num_kv_heads=2, head_size=128)
    for case, expect in ((decode, 0), (prefill, 1)):
        calls.clear()
        batch, options = make_inputs(case, "cuda", seed=3)
        out, lse = _public(batch, options)
        assert len(calls) == expect, case.id
        check_against_reference(batch, options, out, lse, case.dtype)


@gpu_fa4
@pytest.mark.parametrize("with_lse", [True, False])
def test_flash_cuda_graph_replay_cuda(with_lse, monkeypatch):
    """One eager call (FA4 compiles its kernel), capture, rewrite seq_lens / block_table /
    query_start_loc in place, replay: each replay equals the reference of the new contents (the
    padding rows, which move with query_start_loc, included; outputs poisoned before each)."""
    calls = _spy(monkeypatch)
    kw = dict(num_heads=8, num_kv_heads=2, head_size=128, dtype=BF16, device="cuda", max_blocks=80)

    def batch(seed, q_lens, kv_lens):
        used = sum(-(-n // 16) for n in kv_lens)
        return make_paged_batch(q_lens, kv_lens, seed=seed, pad_tokens=300 - sum(q_lens), extra_blocks=500 - used,
                                **kw)

    static = batch(0, [200, 1, 40, 30], [900, 1, 40, 1200])
    options = dict(scale=0.09, causal=True, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                   sinks=None, k_scale=None, v_scale=None, attention_chunk_size=0)
    out = torch.full((300, 8, 128), float("nan"), dtype=BF16, device="cuda")
    lse = torch.full((300, 8), float("nan"), device="cuda") if with_lse else None
    with pa.backend("flash"):
        pa.paged_attention_out(*static.args(), out, lse, max_query_len=200, **options)  # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pa.paged_attention_out(*static.args(), out, lse, max_query_len=200, **options)
    assert calls and set(calls) == {"fa4"}
    for seed, q_lens, kv_lens in ((1, [150, 1, 1, 48], [300, 1270, 0, 48]), (2, [1, 199, 1, 1], [1, 200, 3, 1100])):
        new = batch(seed, q_lens, kv_lens)
        for dst, src in zip(static.args(), new.args()):
            dst.copy_(src)
        out.fill_(float("nan"))
        if lse is not None:
            lse.fill_(float("nan"))
        graph.replay()
        check_against_reference(static, options, out, lse, BF16)


@gpu_fa4
def test_flash_compiled_fullgraph_one_node_cuda(monkeypatch):
    case = Case((1, 200, 0, 64), (300, 400, 0, 64), num_heads=8, num_kv_heads=2, head_size=128, sinks=True,
                pad_tokens=2)
    batch, options = make_inputs(case, "cuda", seed=5)
    options.pop("k_scale"), options.pop("v_scale")

    def fn(q, kc, vc, bt, sl, qsl):
        return pa.paged_attention(q, kc, vc, bt, sl, qsl, return_lse=True, **options)

    graphs = []

    def count(gm, inputs):
        graphs.append(gm)
        return gm.forward

    calls = _spy(monkeypatch)
    with pa.backend("flash"):
        torch._dynamo.reset()
        torch.compile(fn, fullgraph=True, backend=count)(*batch.args())
        targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
        ours = [t for t in targets if "paged_attn" in str(t)]
        assert ours == [torch.ops.paged_attn.paged_attention.default], targets
        torch._dynamo.reset()
        out, lse = torch.compile(fn, fullgraph=True)(*batch.args())
    assert calls and set(calls) == {"fa4"}
    check_against_reference(batch, options, out, lse, BF16)
