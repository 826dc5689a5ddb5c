"""Paged attention, cache update and merge against the copy bandwidth: one command, one process.

    python benchmarks/paged_attention.py [--shapes decode,prefill] [--contenders flashinfer,torch_paged_attn]
                                         [--modes both|graph|eager] [--quick] [--out DIR]
    python benchmarks/paged_attention.py --device cpu --tiny --quick     # smoke run, no GPU

Measures the device's copy bandwidth first, then for each shape of the table (the issue's shape
list; bf16, block 16, Hq 32 / Hkv 8, D 128 unless the name says otherwise) times every contender:

    torch_paged_attn                 this project (paged_attention, reshape_and_cache, merge_attn_states),
                                     backend "triton"
    torch_paged_attn[triton-prefill] the same with the Gluon sm_90 prefill kernel switched off (prefill
                                     shapes: the Triton prefill kernel, the default before it)
    torch_paged_attn[batch-inv]      the same in batch-invariant mode (decode shapes)
    torch_paged_attn[flash]          paged_attention with set_backend("flash") (FlashAttention where it
                                     supports the call, else Triton)
    torch_paged_attn[auto]           paged_attention with the default backend "auto"
    gather+sdpa                      torch ops: gather the pages of every sequence, then
                                     F.scaled_dot_product_attention (padded batch, one call)
    flex_attention(paged)            torch.nn.attention.experimental._paged_attention.PagedAttention
                                     + compiled flex_attention, over the same cache memory
    flash_attn_4                     flash_attn.cute.flash_attn_varlen_func with page_table
    flashinfer(decode)               flashinfer.BatchDecodeWithPagedKVCacheWrapper, CUDA cores
    flashinfer(decode,tc)            the same with use_tensor_cores=True (fp8 KV: kv_data_type, host scales)
    flashinfer(prefill)              flashinfer.BatchPrefillWithPagedKVCacheWrapper, causal (prefill and
                                     chunked prefill); merge: flashinfer.merge_state (base-2 LSEs)
    vllm_triton                      vLLM's unified_attention (Triton), when vLLM is installed
    torch                            eager torch ops (cache update: index_copy_; merge: the formula)

FlashInfer is planned outside the timed region from the same block table (``flashinfer_pages``).
On CUDA every contender is timed twice (``--modes``): ``graph``, CUDA-graph replays (host cost
out), and ``eager``, one call per sample with the L2 flushed before it (``_harness.bench``).
Printed: microseconds (p50, p20-p80), GB/s and % of the copy bandwidth for the bytes the op must
move (formulas in ``attention_bytes``, ``cache_update_bytes``, ``merge_bytes``), TFLOP/s for
prefill shapes, and per timing mode the ratios ``vs FA4`` (FlashAttention-4's p50 over the row's:
prefill rows, and the flash / auto backends against FA4 called directly on the same inputs, target
>= 0.97x) and ``vs FI`` (the fastest FlashInfer variant's p50 over ours: above 1, ours is faster).
Those ratios divide medians timed one after the other; the GPU's clocks drift between them by a few
percent on compute-bound shapes. So after a shape's rows two pairs are also timed side by side in
each mode, their samples alternating (``_harness.bench_pair``): ``torch_paged_attn[flash]`` against
``flash_attn_4`` and ``torch_paged_attn`` against the faster FlashInfer variant; the row's note
gives the median ratio of the rounds with its 20th-80th percentiles (JSON: ``paired_vs_fa4``,
``paired_vs_flashinfer``). A contender that cannot run prints n/a with the reason; none can stop the
run. Every output (graph and eager variants alike) is checked on its first call against an fp32
reference on two sequences (``max_err`` in the JSON). JSON rows go to
``<out>/paged_attention-<gpu>-<date>.json``, rewritten after every shape so an interrupted run keeps
what it measured.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import sys
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn.testing import PagedBatch  # noqa: E402

RESULTS = os.path.join(HERE, "results")
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Shape:
    """One row group of the table. ``seq_len`` keys are visible to each of the ``batch``
    sequences, whose last ``q_len`` tokens are the queries (decode: ``q_len = 1``)."""

    name: str
    kind: str  # "decode", "prefill", "cache_update" or "merge"
    batch: int = 1
    q_len: int = 1
    seq_len: int = 0
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    cache_dtype: torch.dtype = torch.bfloat16
    tokens: int = 0  # cache update / merge rows

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16


SHAPES = [
    Shape("decode_B64_ctx4096", "decode", batch=64, seq_len=4096),
    Shape("decode_B1_ctx32768", "decode", batch=1, seq_len=32768),
    Shape("decode_B8_ctx8192_Hq64", "decode", batch=8, seq_len=8192, num_heads=64),
    Shape("decode_B256_ctx1024", "decode", batch=256, seq_len=1024),
    Shape("decode_mha_B32_ctx2048", "decode", batch=32, seq_len=2048, num_kv_heads=32),
    Shape("decode_fp8_B64_ctx4096", "decode", batch=64, seq_len=4096, cache_dtype=FP8),
    Shape("prefill_B4_q2048", "prefill", batch=4, q_len=2048, seq_len=2048),
    Shape("chunked_prefill_B4_q512_ctx4096", "prefill", batch=4, q_len=512, seq_len=4096 + 512),
    Shape("cache_update_T8192", "cache_update", tokens=8192),
    Shape("cache_update_T256", "cache_update", tokens=256),
    Shape("merge_T8192_H32_D128", "merge", tokens=8192, num_heads=32),
]

# Stand-ins of the same names and kinds, small enough for the reference backend on a CPU.
_TINY = {
    "decode": dict(num_heads=4, num_kv_heads=2, head_size=32),
    "prefill": dict(batch=2, num_heads=4, num_kv_heads=2, head_size=32),
    "cache_update": dict(num_kv_heads=2, head_size=32),
    "merge": dict(num_heads=4, head_size=32),
}


def tiny(s: Shape) -> Shape:
    t = replace(s, **_TINY[s.kind])
    if s.kind == "decode":  # context lengths keep their order: 1024 -> 8 ... 32768 -> 256
        t = replace(t, batch=min(s.batch, 3), seq_len=s.seq_len // 128)
    if s.name.startswith("decode_mha"):
        t = replace(t, num_kv_heads=t.num_heads)
    if s.kind == "prefill":
        q = 24 if s.q_len == s.seq_len else 8
        t = replace(t, q_len=q, seq_len=q if s.q_len == s.seq_len else q + 40)
    if s.kind in ("cache_update", "merge"):
        t = replace(t, tokens=min(s.tokens, 48 if s.tokens > 256 else 8))
    return t


# -- bytes and flops ----------------------------------------------------------------------------


def _esize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def attention_bytes(s: Shape) -> tuple[int, str]:
    """K and V of the visible tokens read once, q read, out written (block table and lengths,
    < 0.1 %, left out):  B*seq_len*Hkv*(D+Dv)*cache_bytes + T*Hq*D*q_bytes + T*Hq*Dv*out_bytes."""
    T, D, c, q = s.batch * s.q_len, s.head_size, _esize(s.cache_dtype), _esize(s.dtype)
    kv = s.batch * s.seq_len * s.num_kv_heads * 2 * D * c
    qo = 2 * T * s.num_heads * D * q
    formula = f"K,V: {s.batch}*{s.seq_len}*{s.num_kv_heads}*({D}+{D})*{c} + q,out: 2*{T}*{s.num_heads}*{D}*{q}"
    return kv + qo, formula


def attention_flops(s: Shape) -> int:
    """2*(D+Dv) per visible (query, key, head): QK^T and PV. Causal, bottom-right aligned:
    query t of a sequence sees context + t + 1 keys."""
    ctx = s.seq_len - s.q_len
    pairs = s.batch * (s.q_len * ctx + s.q_len * (s.q_len + 1) // 2)
    return pairs * s.num_heads * 2 * (2 * s.head_size)


def cache_update_bytes(s: Shape) -> tuple[int, str]:
    """New keys and values read, the same bytes written into the cache, slot_mapping read:
    T*Hkv*(D+Dv)*(in_bytes + cache_bytes) + T*8."""
    T, D, i, c = s.tokens, s.head_size, _esize(s.dtype), _esize(s.cache_dtype)
    n = T * s.num_kv_heads * 2 * D * (i + c) + T * 8
    return n, f"{T}*{s.num_kv_heads}*({D}+{D})*({i}+{c}) + {T}*8"


def merge_bytes(s: Shape) -> tuple[int, str]:
    """Two partial outputs and LSEs read, one output and LSE written: 3*T*H*(D*out_bytes + 4)."""
    T, Hh, D, o = s.tokens, s.num_heads, s.head_size, _esize(s.dtype)
    return 3 * T * Hh * (D * o + 4), f"3*{T}*{Hh}*({D}*{o}+4)"


# -- inputs (built on the device; no NaN garbage: every cache slot is covered) -------------------


def paged_inputs(s: Shape, device: torch.device, seed: int) -> PagedBatch:
    """A uniform batch over a cache that holds exactly its blocks, placed in shuffled order.

    The block table depends on the shape only, not on ``seed``: the input copies that rotate
    through the L2 cache differ in their data, and one compiled FlexAttention block mask
    serves them all (a mask per copy would recompile it per copy)."""
    B, BS, Hkv, D = s.batch, s.block_size, s.num_kv_heads, s.head_size
    blocks = math.ceil(s.seq_len / BS)
    nb = B * blocks
    g = torch.Generator(device=device).manual_seed(0)
    table = torch.randperm(nb, device=device, generator=g).view(B, blocks).to(torch.int32)
    g.manual_seed(1 + seed)
    caches, scales = [], []
    for _ in range(2):
        x = torch.randn(nb, BS, Hkv, D, device=device, dtype=s.dtype, generator=g)
        caches.append(x.to(s.cache_dtype))
        scales.append(torch.ones((), device=device) if s.cache_dtype == FP8 else None)
    T = B * s.q_len
    return PagedBatch(
        query=torch.randn(T, s.num_heads, D, device=device, dtype=s.dtype, generator=g),
        key_cache=caches[0],
        value_cache=caches[1],
        block_table=table,
        seq_lens=torch.full((B,), s.seq_len, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=device) * s.q_len,
        k_scale=scales[0],
        v_scale=scales[1],
        q_lens=[s.q_len] * B,
        kv_lens=[s.seq_len] * B,
    )


def reference_rows(s: Shape, b: PagedBatch, seqs: list[int]) -> dict[int, torch.Tensor]:
    """fp32 attention of sequences ``seqs`` from a gather of their pages: ``[q_len, Hq, D]`` each."""
    out = {}
    blocks = math.ceil(s.seq_len / s.block_size)
    group = s.num_heads // s.num_kv_heads
    for i in seqs:
        rows = b.block_table[i, :blocks].long()
        k, v = (
            (cache[rows].float() * (1.0 if scale is None else scale)).flatten(0, 1)[: s.seq_len]  # [L, Hkv, D]
            for cache, scale in ((b.key_cache, b.k_scale), (b.value_cache, b.v_scale))
        )
        q = b.query[i * s.q_len : (i + 1) * s.q_len].float()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ k.transpose(1, 2) / math.sqrt(s.head_size)  # [Hq, q, L]
        pos = torch.arange(s.q_len, device=q.device)[:, None] + (s.seq_len - s.q_len)
        keys = torch.arange(s.seq_len, device=q.device)[None, :]
        scores = scores.masked_fill(keys > pos, float("-inf"))
        out[i] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


# -- contenders -----------------------------------------------------------------------------------


class Unavailable(Exception):
    """A contender that cannot run this shape here; the message is the reason printed."""


@dataclass
class Contender:
    """``fns[i]`` runs on the ``i``-th input copy; ``tokens(out)`` turns its output into [T, Hq, D].
    ``graph_fns``, when given, are what a CUDA graph captures instead of ``fns`` (a FlashInfer
    wrapper planned for graphs, say); both are checked against the reference."""

    fns: list[Callable[[], Any]]
    tokens: Callable[[Any], torch.Tensor]
    note: str = ""
    graph_fns: list[Callable[[], Any]] | None = None


def batch_invariant_context() -> Callable[[], Any]:
    """The batch-invariant mode as a context-manager factory, or Unavailable."""
    try:
        config = importlib.import_module("torch_paged_attn._config")
    except ImportError:
        config = None
    if hasattr(config, "batch_invariant"):

        def enter():
            try:
                return config.batch_invariant()
            except TypeError:  # a switch rather than a plain context manager
                return config.batch_invariant(True)

        return enter
    setter = getattr(tpa, "set_batch_invariant", None)
    if setter is None:
        raise Unavailable("torch_paged_attn._config.batch_invariant is not available")

    @contextlib.contextmanager
    def mode():
        setter(True)
        try:
            yield
        finally:
            setter(False)

    return mode


def backend_context(name: str) -> Callable[[], Any]:
    """``torch_paged_attn.backend(name)`` as a context-manager factory, or Unavailable."""
    if not hasattr(tpa, "backend"):
        raise Unavailable("torch_paged_attn.backend is not available")
    if name == "flash":
        from torch_paged_attn.lowering import flash

        missing = flash.available()
        if missing is not None:
            raise Unavailable(f"no FlashAttention ({missing[:80]})")
    return lambda: tpa.backend(name)


_GLUON_DEFAULTS: dict[str, bool] = {}  # the library's own choices, read once before any contender changes them


def gluon_kernel_context(module: str, gluon: bool | None) -> Callable[[], Any]:
    """A context, entered around each call, choosing the Triton backend's Gluon sm_90 kernel of
    ``torch_paged_attn.lowering.triton.<module>`` (its ``SM90_GLUON``) where ``gluon`` and it
    takes the call, else the Triton one; None: the library's default. Plans made under the other
    choice are dropped when the choice changes (between contenders, not between calls)."""
    try:
        import importlib

        from torch_paged_attn import lowering

        kernels = importlib.import_module(f"torch_paged_attn.lowering.triton.{module}")
    except ImportError:
        if gluon:
            raise Unavailable(f"no Triton {module} kernels") from None
        return contextlib.nullcontext
    if not hasattr(kernels, "SM90_GLUON"):
        if gluon:
            raise Unavailable(f"no Gluon {module} kernel in this version")
        return contextlib.nullcontext
    default = _GLUON_DEFAULTS.setdefault(module, kernels.SM90_GLUON)
    want = default if gluon is None else gluon

    @contextlib.contextmanager
    def choice():
        if kernels.SM90_GLUON != want:
            kernels.SM90_GLUON = want
            lowering._CHOICES.clear()
        yield

    return choice


def prefill_kernel_context(gluon: bool | None) -> Callable[[], Any]:
    """The prefill kernel for the calls after it (``gluon_kernel_context``)."""
    return gluon_kernel_context("prefill", gluon)


def ours(s: Shape, copies: list[PagedBatch], batch_invariant: bool = False, backend: str = "triton",
         gluon: bool | None = None) -> Contender:
    """This project's op on ``copies``; ``gluon``: the prefill kernel (``prefill_kernel_context``)."""
    if batch_invariant:
        mode = batch_invariant_context()
    else:
        mode = backend_context(backend) if hasattr(tpa, "backend") or backend != "triton" else contextlib.nullcontext
    kernel = prefill_kernel_context(gluon)

    def make(b: PagedBatch):
        def run():
            with mode(), kernel():
                return tpa.paged_attention(
                    *b.args(),
                    scale=1.0 / math.sqrt(s.head_size),
                    causal=True,
                    k_scale=b.k_scale,
                    v_scale=b.v_scale,
                    max_query_len=s.q_len,
                )[0]

        return run

    fns = [make(b) for b in copies]
    _, note = H.backend_of(fns[0])
    return Contender(fns, lambda out: out, note)


def gather_sdpa(s: Shape, copies: list[PagedBatch]) -> Contender:
    bias = None
    if s.q_len not in (1, s.seq_len):
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(s.q_len, s.seq_len)
    blocks = math.ceil(s.seq_len / s.block_size)
    B, Hkv, D = s.batch, s.num_kv_heads, s.head_size

    def make(b: PagedBatch):
        table = b.block_table[:, :blocks].long()

        def pages(cache, scale):  # [NB, BS, Hkv, D] -> [B, Hkv, L, D]
            x = cache[table].view(B, blocks * s.block_size, Hkv, D)[:, : s.seq_len]
            if scale is not None:
                x = x.to(s.dtype) * scale.to(s.dtype)
            return x.transpose(1, 2)

        def run():
            q = b.query.view(B, s.q_len, s.num_heads, D).transpose(1, 2)
            return F.scaled_dot_product_attention(
                q,
                pages(b.key_cache, b.k_scale),
                pages(b.value_cache, b.v_scale),
                attn_mask=bias,
                is_causal=bias is None and s.q_len > 1,
                scale=1.0 / math.sqrt(D),
                enable_gqa=s.num_heads != Hkv,
            )

        return run

    return Contender([make(b) for b in copies], lambda out: out.transpose(1, 2).reshape(-1, s.num_heads, D))


_FLEX: Any = None


def _flex(device: torch.device) -> Callable[..., Any]:
    """flex_attention, compiled on CUDA (eager on CPU: the smoke run exercises the paging only)."""
    global _FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention
    if _FLEX is None:
        # one compilation per shape; the default limit (8) would fall back to the unfused eager path
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def flex_paged(s: Shape, copies: list[PagedBatch], device: torch.device) -> Contender:
    if s.cache_dtype != s.dtype:
        raise Unavailable("flex_attention takes q, k and v of one dtype (no fp8 cache)")
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as e:
        raise Unavailable(f"PagedAttention not importable: {e}") from e
    flex = _flex(device)
    B, BS, D, blocks = s.batch, s.block_size, s.head_size, math.ceil(s.seq_len / s.block_size)
    # The kernel tile may not exceed a page (16 keys): flex's prefill kernel does not clamp it.
    options = {"BLOCK_N": BS} if s.q_len >= 128 else None

    # One page table and block mask for every input copy (they share the block table).
    b0 = copies[0]
    nb = b0.key_cache.shape[0]
    paged = PagedAttention(n_pages=nb, page_size=BS, max_batch_size=B, device=device)
    table = b0.block_table[:, :blocks].long()
    paged.page_table[:, :blocks] = table
    paged.physical_to_logical[torch.arange(B, device=device)[:, None], table] = torch.arange(blocks, device=device)
    paged.capacity.fill_(blocks * BS)
    seq_lens = b0.seq_lens.long()
    context = seq_lens - s.q_len

    def causal(bi, h, q_idx, kv_idx):  # bottom-right aligned, as the contract
        return (kv_idx <= q_idx + context[bi]) & (kv_idx < seq_lens[bi])

    logical = create_block_mask(causal, B, None, s.q_len, blocks * BS, device=device, BLOCK_SIZE=(128, BS))
    try:
        mask = paged.convert_logical_block_mask(logical, torch.arange(B, device=device), kv_len=seq_lens)
    except TypeError:  # releases without kv_len: the causal mask already bounds the keys
        mask = paged.convert_logical_block_mask(logical, torch.arange(B, device=device))
    kwargs = {"kernel_options": options} if options else {}

    def make(b: PagedBatch):
        # [NB, BS, Hkv, D] viewed as flex's [1, Hkv, NB*BS, D]: physical index = block*BS + offset
        k = b.key_cache.view(1, nb * BS, s.num_kv_heads, D).transpose(1, 2)
        v = b.value_cache.view(1, nb * BS, s.num_kv_heads, D).transpose(1, 2)

        def run():
            q = b.query.view(B, s.q_len, s.num_heads, D).transpose(1, 2)
            return flex(
                q, k, v, block_mask=mask, scale=1.0 / math.sqrt(D), enable_gqa=s.num_heads != s.num_kv_heads, **kwargs
            )

        return run

    return Contender([make(b) for b in copies], lambda out: out.transpose(1, 2).reshape(-1, s.num_heads, D))


def flash_attn_4(s: Shape, copies: list[PagedBatch], device: torch.device) -> Contender:
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    if s.cache_dtype != s.dtype:
        raise Unavailable("no fp8 KV cache in flash_attn.cute")
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # ImportError, or a CuTe DSL that fails to load
        raise Unavailable(f"flash_attn.cute not importable ({type(e).__name__}: {str(e)[:80]})") from e

    def make(b: PagedBatch):
        def run():
            out = flash_attn_varlen_func(
                b.query,
                b.key_cache,
                b.value_cache,
                cu_seqlens_q=b.query_start_loc,
                seqused_k=b.seq_lens,
                max_seqlen_q=s.q_len,
                max_seqlen_k=s.seq_len,
                page_table=b.block_table,
                softmax_scale=1.0 / math.sqrt(s.head_size),
                causal=True,
            )
            return out[0] if isinstance(out, tuple) else out

        return run

    return Contender([make(b) for b in copies], lambda out: out)


# -- FlashInfer ------------------------------------------------------------------------------------
# Wrappers are planned as a FlashInfer user plans them, outside the timed region: our block table
# and lengths become its CSR page list (paged_kv_indptr / indices / last_page_len) once per shape.
# The same pages, the same cache tensors (NHD, a (k_cache, v_cache) tuple). Eager rows use a wrapper
# planned with use_cuda_graph=False, graph rows one with use_cuda_graph=True and static buffers
# (vLLM's decode-capture configuration). FlashInfer JIT-compiles each kernel variant at its first
# plan/run (about a minute each, then cached under ~/.cache/flashinfer): that happens in the
# correctness call, before any timing.

FLASHINFER_WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace


def _flashinfer():
    try:
        import flashinfer
    except Exception as e:  # ImportError, or a JIT/CUDA setup that fails at import
        raise Unavailable(f"flashinfer not importable ({type(e).__name__}: {str(e)[:80]})") from e
    return flashinfer


def flashinfer_pages(b: PagedBatch, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our block table and lengths as FlashInfer's page list, on the host (plan() takes host
    tensors): ``indptr [B + 1]`` (cumulative pages per sequence), ``indices`` (the used part of each
    table row, concatenated), ``last_page_len [B]`` (keys in each sequence's last page, 1..BS; 0 for
    an empty sequence). int32."""
    table, lens = b.block_table.cpu(), b.seq_lens.cpu().long()
    pages = (lens + block_size - 1) // block_size
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = pages.cumsum(0)
    indices = torch.cat([table[i, : int(n)] for i, n in enumerate(pages)]).to(torch.int32)
    last = torch.where(lens > 0, lens - (pages - 1) * block_size, 0).to(torch.int32)
    return indptr, indices, last


def _flashinfer_scales(b: PagedBatch) -> dict:
    """fp8 caches: FlashInfer takes host floats (read once here, outside timing)."""
    if b.k_scale is None:
        return {}
    return dict(k_scale=float(b.k_scale), v_scale=float(b.v_scale))


def _flashinfer_contender(fi, wrapper, copies: list[PagedBatch]) -> Contender:
    """A planned FlashInfer wrapper's ``run`` on each copy: ``wrapper(False)`` for eager calls,
    ``wrapper(True)`` (static plan buffers) for CUDA-graph replays."""

    def fns(w):
        def make(b: PagedBatch):
            kv, scales = (b.key_cache, b.value_cache), _flashinfer_scales(b)
            return lambda: w.run(b.query, kv, **scales)

        return [make(b) for b in copies]

    return Contender(fns(wrapper(False)), lambda out: out, f"flashinfer {fi.__version__}",
                     graph_fns=fns(wrapper(True)))


def flashinfer_decode(s: Shape, copies: list[PagedBatch], device: torch.device, tensor_cores: bool) -> Contender:
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    if s.q_len != 1:
        raise Unavailable("decode wrapper: one query token per sequence")
    fi = _flashinfer()
    indptr, indices, last = flashinfer_pages(copies[0], s.block_size)
    scale = 1.0 / math.sqrt(s.head_size)

    def wrapper(graph: bool):
        ws = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        buffers = {}
        if graph:
            buffers = dict(paged_kv_indptr_buffer=indptr.to(device), paged_kv_indices_buffer=indices.to(device),
                           paged_kv_last_page_len_buffer=last.to(device))
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=graph, use_tensor_cores=tensor_cores,
                                                  **buffers)
        w.plan(indptr, indices, last, s.num_heads, s.num_kv_heads, s.head_size, s.block_size,
               q_data_type=s.dtype, kv_data_type=s.cache_dtype, sm_scale=scale)
        return w

    return _flashinfer_contender(fi, wrapper, copies)


def flashinfer_prefill(s: Shape, copies: list[PagedBatch], device: torch.device) -> Contender:
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    if s.q_len == 1:
        raise Unavailable("decode shape: see flashinfer(decode)")
    fi = _flashinfer()
    indptr, indices, last = flashinfer_pages(copies[0], s.block_size)
    qo_indptr = copies[0].query_start_loc.cpu()
    scale = 1.0 / math.sqrt(s.head_size)

    def wrapper(graph: bool):
        ws = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        buffers = {}
        if graph:
            buffers = dict(qo_indptr_buf=qo_indptr.to(device), paged_kv_indptr_buf=indptr.to(device),
                           paged_kv_indices_buf=indices.to(device), paged_kv_last_page_len_buf=last.to(device))
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=graph, **buffers)
        w.plan(qo_indptr, indptr, indices, last, s.num_heads, s.num_kv_heads, s.head_size, s.block_size,
               causal=True, sm_scale=scale, q_data_type=s.dtype, kv_data_type=s.cache_dtype)
        return w

    return _flashinfer_contender(fi, wrapper, copies)


def vllm_triton(s: Shape, copies: list[PagedBatch], device: torch.device) -> Contender:
    """vLLM's Triton paged attention (``unified_attention``), when vLLM is installed."""
    if device.type != "cuda":
        raise Unavailable("needs CUDA")
    unified = None
    for module in ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention"):
        try:
            unified = importlib.import_module(module).unified_attention
            break
        except Exception as e:  # absent, or a vLLM that fails to import here
            reason = f"{type(e).__name__}: {str(e)[:80]}"
    if unified is None:
        raise Unavailable(f"vllm not importable ({reason})")

    def make(b: PagedBatch):
        out = torch.empty_like(b.query)
        descale = b.k_scale.view(1, 1).expand(s.batch, s.num_kv_heads) if b.k_scale is not None else None

        def run():
            unified(q=b.query, k=b.key_cache, v=b.value_cache, out=out, cu_seqlens_q=b.query_start_loc,
                    max_seqlen_q=s.q_len, seqused_k=b.seq_lens, max_seqlen_k=s.seq_len,
                    softmax_scale=1.0 / math.sqrt(s.head_size), causal=True, window_size=(-1, -1),
                    block_table=b.block_table, softcap=0.0, q_descale=None, k_descale=descale, v_descale=descale)
            return out

        return run

    return Contender([make(b) for b in copies], lambda out: out)


ATTENTION = {
    "torch_paged_attn": lambda s, c, d: ours(s, c),
    "torch_paged_attn[triton-prefill]": lambda s, c, d: ours(s, c, gluon=False),
    "torch_paged_attn[batch-inv]": lambda s, c, d: ours(s, c, batch_invariant=True),
    "torch_paged_attn[flash]": lambda s, c, d: ours(s, c, backend="flash"),
    "torch_paged_attn[auto]": lambda s, c, d: ours(s, c, backend="auto"),
    "gather+sdpa": lambda s, c, d: gather_sdpa(s, c),
    "flex_attention(paged)": flex_paged,
    "flash_attn_4": flash_attn_4,
    "flashinfer(decode)": lambda s, c, d: flashinfer_decode(s, c, d, tensor_cores=False),
    "flashinfer(decode,tc)": lambda s, c, d: flashinfer_decode(s, c, d, tensor_cores=True),
    "flashinfer(prefill)": flashinfer_prefill,
    "vllm_triton": vllm_triton,
}
FLASHINFER = ("flashinfer(decode)", "flashinfer(decode,tc)", "flashinfer(prefill)", "flashinfer")


# -- cache update and merge ---------------------------------------------------------------------


def cache_update_inputs(s: Shape, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Prefill-like slots: consecutive within a block, blocks in shuffled order."""
    g = torch.Generator(device=device).manual_seed(seed)
    T, BS, Hkv, D = s.tokens, s.block_size, s.num_kv_heads, s.head_size
    nb = math.ceil(T / BS)
    blocks = torch.randperm(nb, device=device, generator=g)
    t = torch.arange(T, device=device)
    return dict(
        key=torch.randn(T, Hkv, D, device=device, dtype=s.dtype, generator=g),
        value=torch.randn(T, Hkv, D, device=device, dtype=s.dtype, generator=g),
        key_cache=torch.zeros(nb, BS, Hkv, D, device=device, dtype=s.cache_dtype),
        value_cache=torch.zeros(nb, BS, Hkv, D, device=device, dtype=s.cache_dtype),
        slot_mapping=blocks[t // BS] * BS + t % BS,
    )


def cache_update(s: Shape, provider: str, copies: list[dict]) -> Contender:
    for x in copies:  # the check below must see this contender's writes, not an earlier one's
        x["key_cache"].zero_()
        x["value_cache"].zero_()

    def make(x):
        if provider == "torch_paged_attn":
            return lambda: tpa.reshape_and_cache(
                x["key"], x["value"], x["key_cache"], x["value_cache"], x["slot_mapping"]
            )

        def run():
            flat = (-1, s.num_kv_heads, s.head_size)
            x["key_cache"].view(flat).index_copy_(0, x["slot_mapping"], x["key"])
            x["value_cache"].view(flat).index_copy_(0, x["slot_mapping"], x["value"])

        return run

    fns = [make(x) for x in copies]
    note = H.backend_of(fns[0])[1] if provider == "torch_paged_attn" else ""
    x = copies[0]

    def stored(_):  # the cache rows the slots name, for the check against the new keys
        return x["key_cache"].view(-1, s.num_kv_heads, s.head_size)[x["slot_mapping"]]

    return Contender(fns, stored, note)


def merge_inputs(s: Shape, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    T, Hh, D = s.tokens, s.num_heads, s.head_size

    def part():
        return (
            torch.randn(T, Hh, D, device=device, dtype=s.dtype, generator=g),
            torch.randn(T, Hh, device=device, generator=g) * 4,
        )

    (po, pl), (so, sl) = part(), part()
    return dict(prefix_out=po, prefix_lse=pl, suffix_out=so, suffix_lse=sl)


def merge_reference(x: dict) -> torch.Tensor:
    m = torch.maximum(x["prefix_lse"], x["suffix_lse"])
    wp, ws = (x["prefix_lse"] - m).exp(), (x["suffix_lse"] - m).exp()
    total = wp + ws
    out = x["prefix_out"].float() * (wp / total)[..., None] + x["suffix_out"].float() * (ws / total)[..., None]
    return out.to(x["prefix_out"].dtype), m + total.log()


def merge(s: Shape, provider: str, copies: list[dict], device: torch.device) -> Contender:
    if provider == "flashinfer":
        if device.type != "cuda":
            raise Unavailable("needs CUDA")
        fi = _flashinfer()
        log2e = 1.0 / math.log(2.0)
        # FlashInfer's LSE is base 2; ours natural: converted once, outside timing
        lse2 = [(x["prefix_lse"] * log2e, x["suffix_lse"] * log2e) for x in copies]
        fns = [
            (lambda x=x, pl=pl, sl=sl: fi.merge_state(x["prefix_out"], pl, x["suffix_out"], sl)[0])
            for x, (pl, sl) in zip(copies, lse2)
        ]
        return Contender(fns, lambda out: out, f"flashinfer {fi.__version__}")

    def make(x):
        if provider == "torch_paged_attn":
            return lambda: tpa.merge_attn_states(
                x["prefix_out"], x["prefix_lse"], x["suffix_out"], x["suffix_lse"]
            )[0]
        return lambda: merge_reference(x)[0]

    fns = [make(x) for x in copies]
    note = H.backend_of(fns[0])[1] if provider == "torch_paged_attn" else ""
    return Contender(fns, lambda out: out, note)


# -- the run --------------------------------------------------------------------------------------


def _reason(e: BaseException) -> str:
    if isinstance(e, Unavailable):
        return str(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}"


def _max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def attention_contenders(s: Shape) -> list[str]:
    """The attention contenders of a shape's kind (decode: batch-invariant mode and FlashInfer's
    decode wrappers; prefill: FlashInfer's prefill wrapper)."""
    skip = ("flashinfer(prefill)", "torch_paged_attn[triton-prefill]") if s.kind == "decode" else (
        "torch_paged_attn[batch-inv]", "flashinfer(decode)", "flashinfer(decode,tc)")
    return [p for p in ATTENTION if p not in skip]


def run_shape(
    s: Shape, device: torch.device, copy_gbps: float, quick: bool, providers: list[str] | None,
    modes: tuple[str, ...] = ("graph", "eager"),
) -> list[H.Row]:
    if device.type != "cuda":
        modes = ("",)  # one wall-clock figure per contender
    if s.kind in ("decode", "prefill"):
        nbytes, formula = attention_bytes(s)
        flops = attention_flops(s) if s.kind == "prefill" else None
        names = attention_contenders(s)
        n = H.rotations(nbytes, device)
        copies = [paged_inputs(s, device, seed) for seed in range(n)]
        seqs = sorted({0, s.batch - 1})
        truth = reference_rows(s, copies[0], seqs)
        rows_of = lambda out: torch.cat([out[i * s.q_len : (i + 1) * s.q_len] for i in seqs])  # noqa: E731
        want = torch.cat([truth[i] for i in seqs])
        build = lambda p: ATTENTION[p](s, copies, device)  # noqa: E731
    elif s.kind == "cache_update":
        nbytes, formula = cache_update_bytes(s)
        flops, names = None, ["torch_paged_attn", "torch"]
        copies = [cache_update_inputs(s, device, seed) for seed in range(H.rotations(nbytes, device))]
        rows_of, want = (lambda out: out), copies[0]["key"]
        build = lambda p: cache_update(s, p, copies)  # noqa: E731
    else:
        nbytes, formula = merge_bytes(s)
        flops, names = None, ["torch_paged_attn", "flashinfer", "torch"]
        copies = [merge_inputs(s, device, seed) for seed in range(H.rotations(nbytes, device))]
        rows_of, want = (lambda out: out), merge_reference(copies[0])[0]
        build = lambda p: merge(s, p, copies, device)  # noqa: E731

    rows = []
    kept: dict[str, Contender] = {}  # the contenders of the paired timings (_paired)
    for name in names:
        if not H.selected(name, providers):
            continue
        mode_rows = []
        for mode in modes:
            row = H.Row(shape=s.name, provider=name, dtype=str(s.cache_dtype).replace("torch.", ""),
                        bytes=nbytes, bytes_formula=formula, flops=flops, mode=mode)
            row.extra.update(kind=s.kind, batch=s.batch, q_len=s.q_len, seq_len=s.seq_len, tokens=s.tokens,
                             num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_size=s.head_size)
            mode_rows.append(row)
        rows.extend(mode_rows)
        dead = H.cuda_alive(device)
        if dead:
            for row in mode_rows:
                row.status, row.reason = "n/a", dead
            continue
        H.progress(f"  {s.name}: {name}")
        try:
            c = build(name)
        except Exception as e:  # one contender's failure never stops the run
            for row in mode_rows:
                row.status, row.reason = "n/a", _reason(e)
            continue
        for row in mode_rows:
            try:
                graph = row.mode == "graph"
                fns = c.graph_fns if graph and c.graph_fns is not None else c.fns
                err = _max_err(rows_of(c.tokens(fns[0]())), want)  # the first call, checked
                row.extra["max_err"] = err
                row.fill(H.bench(fns, device, quick=quick, use_graph=graph), copy_gbps)
                notes = [c.note] if c.note else []
                if graph and row.timing != "cuda-graph":
                    notes.append("graph capture failed: timed eagerly")
                if not err < 0.05:  # bf16 outputs over 128-wide dot products: ~1e-2 when right
                    notes.append(f"WRONG RESULT: max rel err {err:.2g}")
                row.extra["note"] = "; ".join(notes)
            except Exception as e:  # one contender's failure never stops the run
                row.status, row.reason = "n/a", _reason(e)
                row.p20_us = row.p50_us = row.p80_us = None
        if device.type == "cuda" and (name in PAIRED or name in FLASHINFER):
            kept[name] = c
        c = None

    _relate(rows)
    if kept:
        _paired(rows, kept, device, quick, modes)
    kept.clear()
    del copies, build
    gc.collect()
    if device.type == "cuda" and H.cuda_alive(device) is None:
        torch.cuda.empty_cache()
    return rows


def _relate(rows: list[H.Row]) -> None:
    """Ratios inside one shape and timing mode: FlashAttention-4's and the best FlashInfer
    variant's p50 over each row's (``vs FA4``, ``vs FI``: above 1 the row is faster), the flash
    backend against FA4 called directly on the same inputs, batch-invariant cost vs default."""
    for mode in {r.mode for r in rows}:
        by = {r.provider: r for r in rows if r.status == "ok" and r.mode == mode}
        fa4, default = by.get("flash_attn_4"), by.get("torch_paged_attn")
        fis = [r for p, r in by.items() if p in FLASHINFER]
        fi = min(fis, key=lambda r: r.p50_us) if fis else None
        for r in by.values():
            if fa4 is not None and (r.flops is not None or r.provider in ("torch_paged_attn[flash]",
                                                                          "torch_paged_attn[auto]")):
                r.vs_fa4 = fa4.p50_us / r.p50_us
            if fi is not None and r.provider.startswith("torch_paged_attn"):
                r.vs_flashinfer = fi.p50_us / r.p50_us
                r.extra["flashinfer_best"] = fi.provider
            if r.provider == "torch_paged_attn[flash]" and fa4 is not None:
                # the wrapper's cost: target >= 0.97x (the issue); FlashAttention must be what ran
                r.extra["flash_vs_fa4_direct"] = r.vs_fa4
                r.extra["note"] = "; ".join(
                    x for x in (f"{r.vs_fa4:.3f}x FA4 called directly", r.extra.get("note", "")) if x)
            if r.provider == "torch_paged_attn[batch-inv]" and default is not None:
                cost = 100.0 * (r.p50_us / default.p50_us - 1.0)
                r.extra["vs_default_pct"] = cost
                r.extra["note"] = "; ".join(x for x in (f"{cost:+.1f}% vs default", r.extra.get("note", "")) if x)


# Contenders timed side by side (``_harness.bench_pair``) against a peer, besides their own rows:
# the flash backend against FA4 called directly (the wrapper's cost), the default against FA4 on
# prefill shapes and against the faster FlashInfer variant of the shape.
PAIRED = ("torch_paged_attn", "torch_paged_attn[flash]", "flash_attn_4")


def _paired(rows: list[H.Row], kept: dict[str, "Contender"], device: torch.device, quick: bool,
            modes: tuple[str, ...]) -> None:
    """Interleaved timings (``_harness.bench_pair``, in each timing mode) of
    ``torch_paged_attn[flash]`` against ``flash_attn_4``, of ``torch_paged_attn`` against
    ``flash_attn_4`` on the prefill shapes (those with a FLOP count) and against the faster
    FlashInfer variant (by the graph rows' p50), each written to the row of the first:
    ``extra["paired_vs_fa4"]`` / ``["paired_vs_flashinfer"]`` (the median per-round ratio, peer µs
    over ours: above 1 ours is faster, with its 20th-80th percentiles) and a note."""
    graph = {r.provider: r for r in rows if r.mode == "graph" and r.status == "ok"}
    fis = [graph[p] for p in kept if p in FLASHINFER and p in graph]
    pairs = [("torch_paged_attn[flash]", "flash_attn_4", "paired_vs_fa4", "FA4")]
    if any(r.flops is not None for r in graph.values()):  # prefill shapes: FA4 sets their target
        pairs.append(("torch_paged_attn", "flash_attn_4", "paired_vs_fa4", "FA4"))
    if fis:
        best = min(fis, key=lambda r: r.p50_us).provider
        pairs.append(("torch_paged_attn", best, "paired_vs_flashinfer", best))
    for mode in modes:
        by = {r.provider: r for r in rows if r.mode == mode and r.status == "ok"}
        for ours, peer, key, label in pairs:
            if ours not in kept or peer not in kept or ours not in by or peer not in by:
                continue
            graphed = mode == "graph"
            fns = [kept[p].graph_fns if graphed and kept[p].graph_fns is not None else kept[p].fns
                   for p in (ours, peer)]
            H.progress(f"  paired ({mode}): {ours} vs {peer}")
            H.paired_into(by[ours], key, label, fns[0], fns[1], device, quick=quick, use_graph=graphed)


def main(argv: list[str] | None = None) -> int:
    def modes_arg(ap) -> None:
        ap.add_argument("--modes", choices=("both", "graph", "eager"), default="both",
                        help="CUDA timing: graph replays, eager calls with the L2 flushed before each, or both")

    args, device, shapes = H.parse_cli(
        __doc__.splitlines()[0], SHAPES, tiny, "decode,merge*", RESULTS, argv, extra_args=modes_arg
    )

    modes = tuple(m for m in ("graph", "eager") if args.modes in (m, "both"))
    meta = H.device_info(device)
    meta["flash_attn_4"] = H.package_version("flash_attn", "flash-attn-4") if device.type == "cuda" else None
    meta["flashinfer"] = H.package_version("flashinfer", "flashinfer-python") if device.type == "cuda" else None
    meta["args"] = vars(args)
    H.progress(f"device: {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}")
    copy_gbps, copy_t = H.copy_bandwidth(device, quick=args.quick)
    meta["copy_gbps"] = copy_gbps
    meta["copy_us"] = copy_t.p50_us
    print(f"copy bandwidth: {copy_gbps:.0f} GB/s (read + write, median of {copy_t.samples})")
    path = H.json_path("paged_attention", meta, args.out)

    rows: list[H.Row] = []
    for s in shapes:
        H.progress(f"{s.name} ...")
        try:
            shape_rows = run_shape(s, device, copy_gbps, args.quick, H.split_patterns(args.providers), modes)
        except Exception as e:  # building the inputs failed (out of memory, say): the run goes on
            shape_rows = [H.Row(shape=s.name, provider="*", dtype=str(s.cache_dtype).replace("torch.", ""),
                                status="n/a", reason=f"inputs: {_reason(e)}")]
        rows.extend(shape_rows)
        best = [r for r in shape_rows if r.status == "ok" and r.pct_copy is not None]
        summary = ", ".join(f"{r.provider}{'/' + r.mode if r.mode else ''} {r.pct_copy:.0f}%" for r in best)
        H.progress(f"{s.name}: {summary or 'no result'}")
        H.write_json(path, "paged_attention", rows, meta)
    H.print_table(rows, f"paged attention ({meta['gpu']}, copy bandwidth {copy_gbps:.0f} GB/s)")
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
