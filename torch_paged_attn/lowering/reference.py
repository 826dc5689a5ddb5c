"""The reference backend: every op in plain, vectorised PyTorch. The executable specification.

Runs on any device, accumulates in float32, and is traceable (no ``.item()``, no boolean
indexing, no branch on a tensor's value), so the ops built on it compile and export. Each
function has the out-form signature of ``torch_paged_attn.lowering`` and writes its result into
the given tensors. Semantics: ``DESIGN.md`` of the project (positions, masks, score order,
sinks, fp8 rounding, padding).

Attention gathers each sequence's keys through its block table into ``[B, MB*BS, Hkv, D]``,
then each query row's keys (``[T, MB*BS, Hkv, D]``): memory grows as tokens x capacity, which
is what a specification can afford, not what a kernel should do.
"""

from __future__ import annotations

import torch
from torch import Tensor

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Same-size integer dtypes: fp8 cache writes move raw bytes (index_put has no fp8 CPU kernel).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def supports(op: str, facts: dict) -> str | None:
    return None


# ---------------------------------------------------------------------------------------------
# shared pieces
# ---------------------------------------------------------------------------------------------


def _dequant(x: Tensor, scale: Tensor | None) -> Tensor:
    """Cache values as float32: fp8 entries are multiplied by their per-tensor scale."""
    if x.dtype in _FP8:
        return x.float() * scale.float().reshape(())
    return x.float()


def _quant(x: Tensor, dtype: torch.dtype, scale: Tensor | None) -> Tensor:
    """Values as stored in a cache of ``dtype``: fp8 is saturate(x / scale), round to nearest even."""
    if dtype in _FP8:
        finfo = torch.finfo(dtype)
        y = x.float() / scale.float().reshape(())
        return y.clamp(finfo.min, finfo.max).to(dtype)
    return x.to(dtype)


def rows_of(cu: Tensor, num_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """For rows ``0..num_rows-1`` of a ragged batch described by the cumulative lengths ``cu``
    ([B + 1], int32 or int64, ``cu[0] == 0``): the sequence index (clamped into range), the row's
    index inside its sequence (int64), and whether the row belongs to a sequence at all (rows past
    ``cu[-1]`` do not). Shapes depend on ``num_rows`` and ``B`` only, so it traces into a graph.

    The search runs over the whole of ``cu`` (``row >= cu[0]`` for every row): Inductor in
    torch 2.11 cannot lower ``searchsorted`` over a slice such as ``cu[1:]`` of a computed tensor
    (``NotImplementedError: SliceView``)."""
    num_seqs = cu.shape[0] - 1
    rows = torch.arange(num_rows, device=cu.device, dtype=cu.dtype)
    seq = (torch.searchsorted(cu, rows, right=True) - 1).clamp(0, max(num_seqs - 1, 0))
    local = rows.long() - cu.long()[seq]
    valid = (rows.long() < cu.long()[-1]) & (local >= 0)
    return seq, local, valid


def _floor_div(x: Tensor, c: int) -> Tensor:
    return torch.div(x, c, rounding_mode="floor")


def _scatter_rows(cache: Tensor, rows: Tensor, slot_mapping: Tensor) -> None:
    """``cache[slot // BS, slot % BS] = rows[t]`` for every token whose slot lies inside the cache.

    ``cache`` is ``[NB, BS, *row]`` (any strides), ``rows`` ``[T, *row]`` in the cache's dtype.
    Skipped tokens (negative or out-of-range slots) are redirected to rewrite a written token's
    own slot with its own value (or, when no token is written, cache row 0 with itself), so the
    scatter stays a fixed-shape ``index_put_`` with no boolean indexing.
    """
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    # fp8 has no CPU index_put: its bytes are scattered. Other dtypes scatter as themselves:
    # Inductor (CPU, torch 2.13) converts instead of reinterpreting a store through an int16 view
    # of a bf16/fp16 input (pytorch/pytorch#151156), which wrote garbage into compiled caches.
    bits = _BITS[cache.element_size()] if cache.dtype in _FP8 else cache.dtype
    dst = cache.view(bits)
    src = rows.view(bits)
    slots = slot_mapping.long()
    written = (slots >= 0) & (slots < num_blocks * block_size)
    first = written.to(torch.int32).argmax().reshape(1)  # a 1-element index, never a host int
    row_shape = (-1,) + (1,) * (src.dim() - 1)
    any_written = written.index_select(0, first)
    fallback_slot = torch.where(any_written, slots.index_select(0, first), 0)
    fallback_row = torch.where(
        any_written.reshape(row_shape), src.index_select(0, first), dst[0, 0].unsqueeze(0)
    )
    slots = torch.where(written, slots, fallback_slot)
    src = torch.where(written.reshape(row_shape), src, fallback_row)
    dst.index_put_((slots // block_size, slots % block_size), src)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------


def attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    scale: float,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    attention_chunk_size: int = 0,
) -> tuple[Tensor, Tensor]:
    """Paged attention as a function: ``(out [T, Hq, Dv] in query's dtype, lse [T, Hq] float32)``."""
    num_tokens, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    head_size_v = value_cache.shape[-1]
    num_seqs, max_blocks = block_table.shape
    group = num_heads // num_kv_heads
    device = query.device
    capacity = max_blocks * block_size
    # Positions lie in [-num_tokens, capacity) and keys in [0, capacity): a window side or chunk
    # of ``reach`` or more selects the same keys as ``reach`` (2**31 - 1 means "no limit" to some
    # callers), and int64 arithmetic on positions plus ``reach`` cannot overflow.
    reach = max(capacity + num_tokens, 1)
    window_left, window_right = min(window_left, reach), min(window_right, reach)
    attention_chunk_size = min(attention_chunk_size, reach)

    if num_seqs == 0:  # no sequence: every row is padding
        out = query.new_zeros(num_tokens, num_heads, head_size_v)
        return out, query.new_full((num_tokens, num_heads), float("-inf"), dtype=torch.float32)

    # -- which sequence each query row belongs to, and its absolute position p --
    seq, local, row_valid = rows_of(query_start_loc, num_tokens)
    qsl = query_start_loc.long()
    lens = seq_lens.long()
    seq_len = lens[seq]
    q_len = qsl[seq + 1] - qsl[seq]
    pos = seq_len - q_len + local  # [T]

    # -- keys of each sequence through its block table; blocks past the used part, or with an
    #    id outside the cache, hold no visible key (and are never read from memory) --
    blocks_used = (lens + block_size - 1) // block_size  # [B]
    block_ids = block_table.long()
    block_idx = torch.arange(max_blocks, device=device)
    block_ok = (
        (block_idx[None, :] < blocks_used[:, None]) & (block_ids >= 0) & (block_ids < num_blocks)
    )
    block_ids = torch.where(block_ok, block_ids, 0)
    key_pos = torch.arange(capacity, device=device)  # [L]
    key_ok = block_ok.repeat_interleave(block_size, dim=1) & (key_pos[None, :] < lens[:, None])

    def gather(cache: Tensor, cache_scale: Tensor | None) -> Tensor:
        # [B, MB, BS, Hkv, d] -> [B, L, Hkv, d]; keys that are not visible become 0 (not NaN).
        # Contiguous before any arithmetic: indexing keeps a strided cache's dimension order
        # (and with one block a row, the reshape below stays a view), and the dots' summation
        # order follows the layout; strided caches must give the contiguous cache's bits.
        x = _dequant(cache[block_ids].contiguous(), cache_scale)
        x = x.reshape(num_seqs, capacity, num_kv_heads, cache.shape[-1])
        return torch.where(key_ok[:, :, None, None], x, 0.0)

    keys = gather(key_cache, k_scale)[seq]  # [T, L, Hkv, D]
    values = gather(value_cache, v_scale)[seq]  # [T, L, Hkv, Dv]

    # -- the mask: [T, L] --
    rel = key_pos[None, :]
    p = pos[:, None]
    visible = key_ok[seq] & row_valid[:, None]
    if causal:
        visible = visible & (rel <= p)
    if window_left >= 0:
        visible = visible & (rel >= p - window_left)
    if window_right >= 0:
        visible = visible & (rel <= p + window_right)
    if attention_chunk_size > 0:
        visible = visible & (
            _floor_div(rel, attention_chunk_size) == _floor_div(p, attention_chunk_size)
        )

    # a row reads only the values it sees: NaN in a covered slot outside a row's window or
    # chunk must not reach it through 0 * NaN
    values = torch.where(visible[:, :, None, None], values, 0.0)

    # -- scores: scale, softcap, ALiBi, then the mask: [T, Hkv, G, L] --
    q = query.float().contiguous().reshape(num_tokens, num_kv_heads, group, head_size)
    s = torch.einsum("tkgd,tlkd->tkgl", q, keys) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().reshape(1, num_kv_heads, group, 1)
        s = s + slopes * (rel - p).float()[:, None, None, :]
    s = torch.where(visible[:, None, None, :], s, float("-inf"))

    # -- softmax with the sink as one more logit in the denominator (a -inf column if none) --
    if sinks is not None:
        sink = sinks.float().reshape(1, num_kv_heads, group, 1).expand(num_tokens, -1, -1, 1)
    else:
        sink = s.new_full((num_tokens, num_kv_heads, group, 1), float("-inf"))
    logits = torch.cat([s, sink], dim=-1)
    m = logits.amax(dim=-1, keepdim=True)
    m = torch.where(m == float("-inf"), 0.0, m)
    e = torch.exp(logits - m)
    denom = e.sum(dim=-1, keepdim=True)
    acc = torch.einsum("tkgl,tlkd->tkgd", e[..., :capacity], values)
    # no visible key and no sink: 0; a NaN score (a NaN scale, query or key) makes denom NaN
    # and the row NaN, never a finite-looking 0
    out = torch.where(denom == 0, 0.0, acc / denom)
    lse = (m + torch.log(denom)).squeeze(-1)

    out = torch.where(row_valid[:, None, None, None], out, 0.0)
    lse = torch.where(row_valid[:, None, None], lse, float("-inf"))
    out = out.reshape(num_tokens, num_heads, head_size_v).to(query.dtype)
    return out, lse.reshape(num_tokens, num_heads)


def paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    out: Tensor,
    lse: Tensor | None,
    *,
    scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    sinks: Tensor | None,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    attention_chunk_size: int,
    max_query_len: int = -1,
) -> None:
    o, s = attention(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale=scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        attention_chunk_size=attention_chunk_size,
    )
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)


def mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    out: Tensor,
    lse: Tensor | None,
    *,
    scale: float,
    causal: bool,
    kv_scale: Tensor | None,
) -> None:
    """MLA is paged attention with one kv head whose key is the whole cache row [latent | rope]
    and whose value is the latent part."""
    latent = q_latent.shape[-1]
    o, s = attention(
        torch.cat([q_latent, q_rope], dim=-1),
        kv_cache.unsqueeze(2),
        kv_cache[..., :latent].unsqueeze(2),
        block_table,
        seq_lens,
        query_start_loc,
        scale=scale,
        causal=causal,
        k_scale=kv_scale,
        v_scale=kv_scale,
    )
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)


# ---------------------------------------------------------------------------------------------
# cache ops
# ---------------------------------------------------------------------------------------------


def reshape_and_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
) -> None:
    num_tokens = slot_mapping.shape[0]
    _scatter_rows(key_cache, _quant(key[:num_tokens], key_cache.dtype, k_scale), slot_mapping)
    _scatter_rows(
        value_cache, _quant(value[:num_tokens], value_cache.dtype, v_scale), slot_mapping
    )


def concat_and_cache_mla(
    kv_c: Tensor,
    k_pe: Tensor,
    kv_cache: Tensor,
    slot_mapping: Tensor,
    scale: Tensor | None,
) -> None:
    num_tokens = slot_mapping.shape[0]
    rows = torch.cat([kv_c[:num_tokens], k_pe[:num_tokens]], dim=-1)
    _scatter_rows(kv_cache, _quant(rows, kv_cache.dtype, scale), slot_mapping)


def gather_cache(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    seq_starts: Tensor | None,
    out: Tensor,
    scale: Tensor | None,
) -> None:
    num_rows = out.shape[0]
    num_seqs, max_blocks = block_table.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    if num_seqs == 0 or num_rows == 0:
        return
    seq, local, valid = rows_of(cu_seq_lens, num_rows)
    pos = local if seq_starts is None else seq_starts.long()[seq] + local
    block = _floor_div(pos, block_size)
    offset = pos - block * block_size
    in_table = valid & (block >= 0) & (block < max_blocks)
    block_id = block_table.long()[seq, block.clamp(0, max(max_blocks - 1, 0))]
    ok = in_table & (block_id >= 0) & (block_id < num_blocks)
    rows = kv_cache[torch.where(ok, block_id, 0), torch.where(ok, offset, 0)]
    row_shape = (num_rows,) + (1,) * (out.dim() - 1)
    rows = torch.where(ok.reshape(row_shape), _dequant(rows, scale), 0.0).to(out.dtype)
    out.copy_(torch.where(valid.reshape(row_shape), rows, out))


# ---------------------------------------------------------------------------------------------
# merge
# ---------------------------------------------------------------------------------------------


def merge(
    prefix_out: Tensor, prefix_lse: Tensor, suffix_out: Tensor, suffix_lse: Tensor
) -> tuple[Tensor, Tensor]:
    """Exact combination of two attention results over disjoint key sets, through their LSEs.

    An LSE of -inf or +inf marks an empty part: its output is not read (it may be garbage). A
    NaN LSE in either part makes the row's output and LSE NaN."""
    lp = prefix_lse.float()
    ls = suffix_lse.float()
    lp = torch.where(lp == float("inf"), float("-inf"), lp)
    ls = torch.where(ls == float("inf"), float("-inf"), ls)
    m = torch.maximum(lp, ls)
    m = torch.where(m == float("-inf"), 0.0, m)
    wp = torch.exp(lp - m)
    ws = torch.exp(ls - m)
    denom = wp + ws
    safe = torch.where(denom > 0, denom, 1.0)
    part_p = torch.where((wp > 0)[..., None], prefix_out.float() * (wp / safe)[..., None], 0.0)
    part_s = torch.where((ws > 0)[..., None], suffix_out.float() * (ws / safe)[..., None], 0.0)
    nan = (lp.isnan() | ls.isnan())[..., None]
    out = torch.where(nan, float("nan"), part_p + part_s)
    return out.to(prefix_out.dtype), m + torch.log(denom)


def merge_attn_states(
    prefix_out: Tensor,
    prefix_lse: Tensor,
    suffix_out: Tensor,
    suffix_lse: Tensor,
    out: Tensor,
    lse: Tensor | None,
) -> None:
    o, s = merge(prefix_out, prefix_lse, suffix_out, suffix_lse)
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)


def merge_n(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    """Exact combination of N attention results ``outs [N, T, H, D]`` / ``lses [N, T, H]`` over
    disjoint key sets. An LSE of -inf or +inf marks an empty part: its output is not read; a
    NaN LSE in any part makes the row's output and LSE NaN."""
    ls = lses.float()
    ls = torch.where(ls == float("inf"), float("-inf"), ls)
    m = ls.amax(dim=0)
    m = torch.where(m == float("-inf"), 0.0, m)
    w = torch.exp(ls - m)  # [N, T, H]; 0 exactly for an empty part
    denom = w.sum(dim=0)
    safe = torch.where(denom > 0, denom, 1.0)
    parts = torch.where((w > 0)[..., None], outs.float() * (w / safe)[..., None], 0.0)
    out = torch.where(ls.isnan().any(dim=0)[..., None], float("nan"), parts.sum(dim=0))
    return out.to(outs.dtype), m + torch.log(denom)


def merge_attn_states_n(outs: Tensor, lses: Tensor, out: Tensor, lse: Tensor | None) -> None:
    o, s = merge_n(outs, lses)
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)
