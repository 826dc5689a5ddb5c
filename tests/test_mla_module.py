"""The MLA module's decode (absorbed) and prefill (chunked context) paths against the naive
formulation: every key expanded through W_UK, every value through W_UV, plain softmax attention.

The truth is the naive formulation in float64; the budget is the same formulation's own error in
the module's precision (``assert_close``). With an fp8 cache the truth reads the cached rows as
the cache holds them (dequantised), which is what both paths attend to; the prefill path's new
tokens attend to each other with their exact rows. Caches hold NaN in every slot no sequence
covers; block tables hold garbage past each sequence's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import torch_paged_attn  # noqa: F401  (registers the ops)
from torch_paged_attn.mla import MLAAttention, context_chunks
from torch_paged_attn.ops import concat_and_cache_mla
from torch_paged_attn.testing import FP8_DTYPES, assert_close, make_block_table

E4M3 = torch.float8_e4m3fn
_CUDA = torch.cuda.is_available()


@dataclass(frozen=True)
class Dims:
    hidden: int = 32
    heads: int = 4
    latent: int = 32
    nope: int = 16
    rope: int = 16
    v: int = 16
    q_lora: int | None = None
    workspace: int = 16


TINY = Dims()
TINY_QLORA = Dims(q_lora=24)


def _rope64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding in float64 (``x [T, ..., R]``)."""
    r = x.shape[-1]
    inv = theta ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = positions.double()[:, None] * inv
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r // 2,)
    cos, sin = ang.cos().reshape(shape).to(x.dtype), ang.sin().reshape(shape).to(x.dtype)
    a, b = x[..., : r // 2], x[..., r // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def naive(w: dict, m: MLAAttention, xs: list, rows: list, q_lens: list[int]) -> torch.Tensor:
    """Naive MLA per sequence: ``xs[i] [n_i, D]`` all its tokens (positions 0..n_i-1), ``rows[i]``
    its cache rows ``[n_i, L + R]`` (None: from the projections), the last ``q_lens[i]`` tokens
    query. Weights ``w`` and inputs in one dtype; returns ``[sum q_lens, D]``."""
    outs = []
    for x, row, q_len in zip(xs, rows, q_lens):
        n = x.shape[0]
        pos = torch.arange(n)
        if row is None:
            kv_c, k_pe = x @ w["W_DKV"], _rope64(x @ w["W_KR"], pos, m.rope_theta)
        else:
            kv_c, k_pe = row[:, : m.kv_lora_rank], row[:, m.kv_lora_rank :]
        k = torch.cat([torch.einsum("nl,lhd->nhd", kv_c, w["W_UK"]),
                       k_pe[:, None, :].expand(-1, m.num_heads, -1)], dim=-1)  # [n, H, Dn + R]
        v = torch.einsum("nl,lhd->nhd", kv_c, w["W_UV"])
        xq, pq = x[n - q_len :], pos[n - q_len :]
        c_q = xq if w.get("W_DQ") is None else xq @ w["W_DQ"]
        q = torch.cat([torch.einsum("tc,chd->thd", c_q, w["W_UQ"]),
                       _rope64(torch.einsum("tc,chd->thd", c_q, w["W_QR"]), pq, m.rope_theta)], dim=-1)
        s = torch.einsum("thd,nhd->htn", q, k) * m.scale
        s = s.masked_fill(pos[None, None, :] > pq[None, :, None], float("-inf"))
        p = s.softmax(-1) if s.dtype == torch.float64 else s.float().softmax(-1).to(s.dtype)  # float32 softmax
        o = torch.einsum("htn,nhd->thd", p, v)
        outs.append(o.reshape(q_len, -1) @ w["W_O"])
    return torch.cat(outs)


def _weights(m: MLAAttention, dtype: torch.dtype) -> dict:
    return {name: p.detach().to("cpu", dtype) for name, p in m.named_parameters()}


def run_case(path: str, dims: Dims, ctx_lens: list[int], q_lens: list[int], *, cache_dtype=torch.float32,
             dtype=torch.float32, device="cpu", block_size: int = 16, seed: int = 0) -> None:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    m = MLAAttention(dims.hidden, dims.heads, kv_lora_rank=dims.latent, qk_nope_head_dim=dims.nope,
                     qk_rope_head_dim=dims.rope, v_head_dim=dims.v, q_lora_rank=dims.q_lora,
                     workspace_tokens=dims.workspace, dtype=dtype, device=device)
    lens = [c + q for c, q in zip(ctx_lens, q_lens)]
    num_blocks = sum(-(-n // block_size) for n in lens) + 2
    table, _ = make_block_table(lens, block_size, num_blocks, g)
    width = dims.latent + dims.rope
    kv_scale = None
    if cache_dtype in FP8_DTYPES:
        kv_scale = torch.tensor([0.05], device=device)
        cache = torch.full((num_blocks, block_size, width), 0x7F, dtype=torch.uint8).view(cache_dtype)
    else:
        cache = torch.full((num_blocks, block_size, width), float("nan"), dtype=cache_dtype)
    cache, table = cache.to(device), table.to(device)
    xs = [torch.randn(n, dims.hidden, generator=g) for n in lens]

    def slots(i: int, a: int, b: int) -> torch.Tensor:
        p = torch.arange(a, b)
        return table[i].cpu().long()[p // block_size] * block_size + p % block_size

    # -- the context is in the cache already --
    with torch.no_grad():
        x_ctx = torch.cat([x[:c] for x, c in zip(xs, ctx_lens)]).to(device, dtype)
        p_ctx = torch.cat([torch.arange(c) for c in ctx_lens]).to(device)
        kv_c, k_pe = m.project_kv(x_ctx, p_ctx)
        s_ctx = torch.cat([slots(i, 0, c) for i, c in enumerate(ctx_lens)]).to(device)
        concat_and_cache_mla(kv_c, k_pe, cache, s_ctx, scale=kv_scale)

        x_new = torch.cat([x[c:] for x, c in zip(xs, ctx_lens)]).to(device, dtype)
        p_new = torch.cat([torch.arange(c, c + q) for c, q in zip(ctx_lens, q_lens)]).to(device)
        s_new = torch.cat([slots(i, c, c + q) for i, (c, q) in enumerate(zip(ctx_lens, q_lens))]).to(device)
        qsl = torch.tensor([0, *q_lens], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
        if path == "decode":
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
            out = m.forward_decode(x_new, p_new, cache, s_new, table, seq_lens, qsl, kv_scale=kv_scale)
        else:
            out = m.forward_prefill(x_new, p_new, cache, s_new, table, qsl, ctx_lens, kv_scale=kv_scale,
                                    max_query_len=max(q_lens))

    # -- the naive formulation; cached rows as the cache holds them when it is fp8 --
    rows: list = [None] * len(lens)
    if cache_dtype in FP8_DTYPES:
        flat = cache.cpu().double().view(-1, width) * float(kv_scale)
        for i, (c, n) in enumerate(zip(ctx_lens, lens)):
            cached = flat[slots(i, 0, n if path == "decode" else c)]
            rows[i] = cached if path == "decode" else ("mixed", cached, c)

    def formulate(dt: torch.dtype) -> torch.Tensor:
        w = _weights(m, dt)
        rs = []
        for x, r in zip(xs, rows):
            if isinstance(r, tuple):  # prefill over fp8: cached context, exact new rows
                _, cached, c = r
                pos = torch.arange(x.shape[0])
                exact = torch.cat([x.to(dt) @ w["W_DKV"], _rope64(x.to(dt) @ w["W_KR"], pos, m.rope_theta)], -1)
                r = torch.cat([cached.to(dt), exact[c:]])
            rs.append(None if r is None else r.to(dt))
        return naive(w, m, [x.to(dt) for x in xs], rs, q_lens)

    truth, low = formulate(torch.float64), formulate(torch.float32 if dtype == torch.float32 else dtype)
    assert_close(out, truth, dtype=dtype, reference=low, name=f"{path} out")


CHUNKS = {  # workspace 16 rows, two sequences: 8 context rows per sequence and chunk
    "1chunk": ([5, 8], [3, 2]),
    "2chunks": ([12, 0], [2, 4]),
    "5chunks": ([40, 7], [3, 1]),
}


def test_chunk_plan() -> None:
    for name, (ctx, _) in CHUNKS.items():
        assert len(context_chunks(ctx, 16, "cpu")) == int(name[0])
    cu, starts, rows = context_chunks([40, 7], 16, "cpu")[1]
    assert cu.tolist() == [0, 8, 8] and starts.tolist() == [8, 8] and rows == 8


@pytest.mark.parametrize("cache_dtype", [torch.float32, E4M3], ids=["fp32", "e4m3"])
@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
def test_prefill_cpu(chunks: str, cache_dtype) -> None:
    ctx, q = CHUNKS[chunks]
    run_case("prefill", TINY, ctx, q, cache_dtype=cache_dtype, seed=len(chunks))


@pytest.mark.parametrize("cache_dtype", [torch.float32, E4M3], ids=["fp32", "e4m3"])
@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
def test_decode_cpu(chunks: str, cache_dtype) -> None:
    ctx, _ = CHUNKS[chunks]
    run_case("decode", TINY, ctx, [1, 1], cache_dtype=cache_dtype, seed=3)


@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_q_lora_and_speculative_tokens_cpu(path: str) -> None:
    """q-LoRA (W_DQ), several new tokens per sequence on the decode path, block size 8."""
    run_case(path, TINY_QLORA, [20, 3, 0], [2, 3, 1], block_size=8, seed=5)


def test_prefill_without_context_cpu() -> None:
    run_case("prefill", TINY, [0, 0], [5, 9], seed=6)


def test_decode_path_compiles_fullgraph_cpu() -> None:
    """The decode path traces as one graph (no host synchronisation, no data-dependent branch)."""
    torch.manual_seed(0)
    m = MLAAttention(32, 4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)
    cache = torch.zeros(4, 16, 48)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    args = (torch.randn(2, 32), torch.tensor([20, 5]), cache, torch.tensor([2 * 16 + 4, 16 + 5]), table,
            torch.tensor([21, 6], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32))
    with torch.no_grad():
        eager = m.forward_decode(*args)
        compiled = torch.compile(m.forward_decode, fullgraph=True, backend="eager")(*args)
    assert torch.equal(eager, compiled)


def test_workspace_too_small() -> None:
    with pytest.raises(ValueError, match="workspace_tokens"):
        context_chunks([3, 4, 5], 2, "cpu")


REAL = Dims(hidden=1024, heads=16, latent=512, nope=128, rope=64, v=128, q_lora=384, workspace=1024)


@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, E4M3], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_bf16_cuda(path: str, cache_dtype) -> None:
    """DeepSeek's head sizes in bf16 on the GPU; contexts that need 1, 2 and 5 chunks."""
    contexts = ([300, 200], [1000, 40], [2500, 700])
    assert [len(context_chunks(c, REAL.workspace, "cpu")) for c in contexts] == [1, 2, 5]
    for ctx in contexts:
        q = [1, 2] if path == "decode" else [64, 33]
        run_case(path, REAL, ctx, q, cache_dtype=cache_dtype, dtype=torch.bfloat16, device="cuda", seed=sum(ctx))
