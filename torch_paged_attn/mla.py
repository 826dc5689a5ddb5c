"""DeepSeek-V2/V3 multi-head latent attention (MLA) as an ``nn.Module`` on the paged ops.

Weights (``D`` hidden size, ``H`` heads, ``L`` kv_lora_rank, ``R`` rope dim, ``Dn`` nope dim,
``Dv`` value dim, ``Lq`` q_lora_rank)::

    c_q  = x @ W_DQ                      [T, Lq]   (q-LoRA; without it c_q = x)
    q    = c_q @ W_UQ, q_pe = rope(c_q @ W_QR)                 [T, H, Dn], [T, H, R]
    kv_c = x @ W_DKV, k_pe = rope(x @ W_KR)                    [T, L], [T, R] (shared by all heads)
    k    = [kv_c @ W_UK | k_pe],  v = kv_c @ W_UV              [T, H, Dn + R], [T, H, Dv]
    out  = softmax(scale * q·k, causal) @ v, then @ W_O        scale = 1 / sqrt(Dn + R)

The cache holds rows ``[kv_c | k_pe]`` (``concat_and_cache_mla``). Two computation paths, as
vLLM's MLA backend describes them:

- decode (data-movement friendly): W_UK is absorbed into the query,
  ``q_latent[t, h] = W_UK[:, h] @ q[t, h]`` (a batched matmul), so ``q·k = q_latent·kv_c + q_pe·k_pe``
  and ``mla_decode`` reads each cache row once for all heads; its latent output goes through W_UV.
- prefill (compute friendly): the new tokens attend to themselves causally with
  ``paged_attention`` (head size Dn + R = 192, value size Dv = 128); the cached context is read
  in chunks of at most ``workspace_tokens`` rows (``gather_cache``, dequantised), up-projected
  through W_UK/W_UV and attended to without a mask, returning LSEs; ``merge_attn_states``
  combines the chunks and the new tokens' part.

Rotary embedding: rotate-half (GPT-NeoX) over the R rope dims, base ``rope_theta``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .lowering.reference import rows_of
from .ops import (
    concat_and_cache_mla,
    gather_cache,
    merge_attn_states,
    mla_decode,
    paged_attention,
)

# Block size of the temporary paged layout the prefill path gives its keys and values (any
# multiple of 8 works; 16 is the project's default and a tile of the attention kernel).
_PREFILL_BLOCK = 16


def apply_rope(x: Tensor, positions: Tensor, theta: float = 10000.0) -> Tensor:
    """Rotate-half rotary embedding of ``x`` ``[T, ..., R]`` at ``positions`` ``[T]``.

    Angles are computed in float64 and rounded once to ``x``'s dtype."""
    rope = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, rope, 2, dtype=torch.float64, device=x.device) / rope)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, R/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rope // 2,)
    cos = angles.cos().to(x.dtype).reshape(shape)
    sin = angles.sin().to(x.dtype).reshape(shape)
    x1, x2 = x[..., : rope // 2], x[..., rope // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def context_chunks(
    context_lens: Sequence[int], workspace_tokens: int, device: torch.device | str
) -> list[tuple[Tensor, Tensor, int]]:
    """Split each sequence's cached context into chunks that fit a workspace of
    ``workspace_tokens`` rows: chunk ``k`` takes tokens ``k*c .. (k+1)*c - 1`` of every sequence,
    ``c = workspace_tokens // B`` (vLLM's chunked-context plan, built on the host from the
    scheduler's lengths). Returns ``(cu_seq_lens [B + 1] int32, seq_starts [B] int32, rows)`` per chunk.
    """
    num_seqs = len(context_lens)
    if num_seqs == 0 or max(context_lens, default=0) <= 0:
        return []
    per_seq = workspace_tokens // num_seqs
    if per_seq < 1:
        raise ValueError(
            f"workspace_tokens: expected at least one row per sequence ({num_seqs}), got {workspace_tokens}"
        )
    chunks = []
    for k in range(math.ceil(max(context_lens) / per_seq)):
        start = k * per_seq
        lens = [min(max(n - start, 0), per_seq) for n in context_lens]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        chunks.append(
            (
                torch.tensor(cu, dtype=torch.int32, device=device),
                torch.full((num_seqs,), start, dtype=torch.int32, device=device),
                cu[-1],
            )
        )
    return chunks


def _aligned_pages(cu: Tensor, num_rows: int, block_size: int) -> tuple[Tensor, Tensor, int]:
    """A paged layout for ragged rows: sequence ``i`` (rows ``cu[i] .. cu[i+1]``) starts at block
    ``cu[i] // BS + i``, so no two sequences share a block. Shapes depend on ``num_rows`` and
    ``B`` only. Returns ``(dest [num_rows] int64 row of each input row, block_table [B, MB]
    int32, num_blocks)``; rows past ``cu[-1]`` land past their sequence's end (never read)."""
    num_seqs = cu.shape[0] - 1
    seq, local, _ = rows_of(cu, num_rows)
    first_block = cu.long()[:-1] // block_size + torch.arange(num_seqs, device=cu.device)  # [B]
    dest = first_block[seq] * block_size + local
    num_blocks = num_rows // block_size + num_seqs + 1
    max_blocks = num_rows // block_size + 2
    table = first_block[:, None] + torch.arange(max_blocks, device=cu.device)[None, :]
    return dest, table.clamp(max=num_blocks - 1).to(torch.int32), num_blocks


class MLAAttention(nn.Module):
    """Multi-head latent attention over a paged ``[NB, BS, L + R]`` latent cache.

    Args:
        hidden_size: ``D``.
        num_heads: ``H``.
        kv_lora_rank: ``L`` (DeepSeek-V2/V3: 512).
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim: ``Dn`` (128), ``R`` (64), ``Dv`` (128).
        q_lora_rank: ``Lq`` (V3: 1536) or None for a full-rank query projection (V2-Lite).
        rope_theta: rotary base.
        workspace_tokens: rows of the context workspace of the prefill path (one chunk).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        q_lora_rank: int | None = None,
        rope_theta: float = 10000.0,
        workspace_tokens: int = 8192,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.rope_theta, self.workspace_tokens = rope_theta, workspace_tokens
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
        kw = dict(dtype=dtype, device=device)

        def weight(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, **kw) / math.sqrt(fan_in))

        q_in = hidden_size if q_lora_rank is None else q_lora_rank
        self.W_DQ = weight(hidden_size, q_lora_rank, fan_in=hidden_size) if q_lora_rank is not None else None
        self.W_UQ = weight(q_in, num_heads, qk_nope_head_dim, fan_in=q_in)
        self.W_QR = weight(q_in, num_heads, qk_rope_head_dim, fan_in=q_in)
        self.W_DKV = weight(hidden_size, kv_lora_rank, fan_in=hidden_size)
        self.W_KR = weight(hidden_size, qk_rope_head_dim, fan_in=hidden_size)
        self.W_UK = weight(kv_lora_rank, num_heads, qk_nope_head_dim, fan_in=kv_lora_rank)
        self.W_UV = weight(kv_lora_rank, num_heads, v_head_dim, fan_in=kv_lora_rank)
        self.W_O = weight(num_heads * v_head_dim, hidden_size, fan_in=num_heads * v_head_dim)

    # -- projections ----------------------------------------------------------------------------

    def project_q(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(q_nope [T, H, Dn], q_pe [T, H, R])``, the rope part rotated."""
        c_q = x if self.W_DQ is None else x @ self.W_DQ
        q_nope = torch.einsum("tc,chd->thd", c_q, self.W_UQ)
        q_pe = apply_rope(torch.einsum("tc,chd->thd", c_q, self.W_QR), positions, self.rope_theta)
        return q_nope, q_pe

    def project_kv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(kv_c [T, L], k_pe [T, R])``: the cache row of each token, the rope part rotated."""
        return x @ self.W_DKV, apply_rope(x @ self.W_KR, positions, self.rope_theta)

    def _output(self, o: Tensor) -> Tensor:
        """``[T, H, Dv] -> [T, D]`` through W_O."""
        return o.reshape(o.shape[0], -1) @ self.W_O

    # -- decode -------------------------------------------------------------------------------

    def forward_decode(
        self,
        x: Tensor,
        positions: Tensor,
        kv_cache: Tensor,
        slot_mapping: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        query_start_loc: Tensor,
        kv_scale: Tensor | None = None,
    ) -> Tensor:
        """Absorbed path for a few new tokens per sequence (decode, speculative verification).

        ``x [T, D]`` new tokens at ``positions [T]``; their rows are written at ``slot_mapping``
        first, then every token attends (causally) to its sequence's ``seq_lens`` cached rows.
        No host synchronisation: CUDA-graph capturable. Returns ``[T, D]``.
        """
        kv_c, k_pe = self.project_kv(x, positions)
        concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=kv_scale)
        q_nope, q_pe = self.project_q(x, positions)
        # absorb W_UK: [H, T, Dn] @ [H, Dn, L] -> [H, T, L], viewed as [T, H, L]
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.W_UK.permute(1, 2, 0)).transpose(0, 1)
        out_latent, _ = mla_decode(
            q_latent, q_pe, kv_cache, block_table, seq_lens, query_start_loc,
            scale=self.scale, causal=True, kv_scale=kv_scale,
        )
        # up-project with W_UV: [H, T, L] @ [H, L, Dv] -> [H, T, Dv]
        o = torch.bmm(out_latent.transpose(0, 1), self.W_UV.transpose(0, 1)).transpose(0, 1)
        return self._output(o)

    # -- prefill --------------------------------------------------------------------------------

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, cu_kv: Tensor, query_start_loc: Tensor, *, causal: bool,
        max_query_len: int,
    ) -> tuple[Tensor, Tensor]:
        """``paged_attention`` of ``q [T, H, Dn+R]`` over ragged keys/values ``[N, H, *]`` (rows
        ``cu_kv[i] .. cu_kv[i+1]`` belong to sequence i), laid out in a temporary paged buffer."""
        bs = _PREFILL_BLOCK
        dest, table, num_blocks = _aligned_pages(cu_kv, k.shape[0], bs)
        k_buf = k.new_zeros(num_blocks * bs, *k.shape[1:]).index_copy_(0, dest, k)
        v_buf = v.new_zeros(num_blocks * bs, *v.shape[1:]).index_copy_(0, dest, v)
        lens = (cu_kv[1:] - cu_kv[:-1]).to(torch.int32)
        return paged_attention(
            q, k_buf.view(num_blocks, bs, *k.shape[1:]), v_buf.view(num_blocks, bs, *v.shape[1:]),
            table, lens, query_start_loc, scale=self.scale, causal=causal, return_lse=True,
            max_query_len=max_query_len,
        )

    def _keys_values(self, kv_c: Tensor, k_pe: Tensor) -> tuple[Tensor, Tensor]:
        """Up-projection of latent rows: ``k [N, H, Dn + R]``, ``v [N, H, Dv]``."""
        k_nope = torch.einsum("nl,lhd->nhd", kv_c, self.W_UK)
        k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, self.num_heads, -1)], dim=-1)
        return k, torch.einsum("nl,lhd->nhd", kv_c, self.W_UV)

    def forward_prefill(
        self,
        x: Tensor,
        positions: Tensor,
        kv_cache: Tensor,
        slot_mapping: Tensor,
        block_table: Tensor,
        query_start_loc: Tensor,
        context_lens: Sequence[int],
        kv_scale: Tensor | None = None,
        max_query_len: int = -1,
    ) -> Tensor:
        """Compute-friendly path for long new spans over a cached context.

        ``x [T, D]`` new tokens at ``positions [T]`` (sequence i's tokens follow its
        ``context_lens[i]`` cached ones, a host-side list as the scheduler has it); their rows
        are written at ``slot_mapping``. Returns ``[T, D]``.
        """
        kv_c, k_pe = self.project_kv(x, positions)
        concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=kv_scale)
        q_nope, q_pe = self.project_q(x, positions)
        q = torch.cat([q_nope, q_pe], dim=-1)  # [T, H, Dn + R]

        # -- the new tokens among themselves, causal --
        k, v = self._keys_values(kv_c, k_pe)
        out, lse = self._attend(q, k, v, query_start_loc, query_start_loc, causal=True, max_query_len=max_query_len)

        # -- the cached context, one workspace-sized chunk at a time, merged through the LSEs --
        latent = self.kv_lora_rank
        workspace = x.new_empty(self.workspace_tokens, latent + self.qk_rope_head_dim)
        ctx_out = ctx_lse = None
        for cu, starts, rows in context_chunks(context_lens, self.workspace_tokens, x.device):
            gather_cache(kv_cache, block_table, cu, starts, workspace, scale=kv_scale)
            k, v = self._keys_values(workspace[:rows, :latent], workspace[:rows, latent:])
            o, s = self._attend(q, k, v, cu, query_start_loc, causal=False, max_query_len=max_query_len)
            if ctx_out is None:
                ctx_out, ctx_lse = o, s
            else:
                ctx_out, ctx_lse = merge_attn_states(ctx_out, ctx_lse, o, s)
        if ctx_out is not None:
            out, lse = merge_attn_states(ctx_out, ctx_lse, out, lse)
        return self._output(out)
