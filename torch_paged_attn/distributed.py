"""Decode context parallelism (DCP): the KV cache sharded over W ranks by token interleaving,
each rank attending over its own tokens, the ranks' results combined exactly through the LSE
(vLLM's decode context parallelism; the algebra is FlashDecoding's split-KV merge, one split
per rank).

Layout. The scheduler sees a cache of *virtual* blocks of ``W * BS`` tokens: the global
``block_table``, ``seq_lens``, ``query_start_loc`` and ``slot_mapping`` are exactly those of a
single-GPU cache with block size ``W * BS``. Each rank holds a physical cache ``[NB, BS, ...]``
(1/W of the tokens); its block ``b`` holds that rank's tokens of virtual block ``b``, so the
block table is the same on every rank. With interleave ``I`` (1: token by token; ``BS``: whole
blocks; any divisor of ``BS``), a sequence's key at global position ``j`` lives::

    on rank          (j // I) % W
    at local index   (j // (I * W)) * I + j % I      # block table row, then offset, as usual

    W=2, I=1:   global 0 1 2 3 4 5 6 7 ...  ->  rank 0: 0 2 4 6 ...   rank 1: 1 3 5 7 ...
    W=2, I=BS:  blocks [0..BS) [BS..2BS) ... ->  rank 0: 1st, 3rd, ...  rank 1: 2nd, 4th, ...

Per step (once, shared by every layer): ``local_metadata`` derives a rank's batch description
from the global one with tensor arithmetic only (no host synchronisation; CUDA-graph safe).
Per layer: ``dcp_paged_attention`` / ``dcp_mla_decode`` run the local op with ``return_lse`` and
``combine_attn_states`` merges the ranks through ``torch.distributed._functional_collectives``
(traceable by ``torch.compile(fullgraph=True)``; NCCL on GPUs, gloo on CPU): all-gather the
LSEs ``[W, T, H]``, rescale each local output by ``exp(lse_r - lse)``, and all-reduce (every
rank gets every head) or reduce-scatter over heads (MLA: query heads were all-gathered, each
rank gets its own heads back). ``method="gather"`` all-gathers the outputs instead and merges
them with ``merge_attn_states_n`` in rank order: W x the bytes, the same bits on every rank.

Query rows are attended as decode rows: a query token at position ``p`` becomes a row of its
own with ``seq_len = p + 1`` (causal; non-causal: the whole sequence), so speculative decoding
(several query tokens per sequence) stays exact when positions are split across ranks. ALiBi,
sliding windows and chunked attention depend on global positions and are not offered here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from .lowering.reference import rows_of
from .ops import merge_attn_states_n, mla_decode, paged_attention

# The single-tensor gather and reduce-scatter were named all_gather_tensor / reduce_scatter_tensor
# before torch 2.12 (still there, deprecated, in 2.13).
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor

__all__ = [
    "DCPGroup",
    "LocalMetadata",
    "combine_attn_states",
    "dcp_mla_decode",
    "dcp_paged_attention",
    "local_metadata",
    "local_seq_lens",
    "local_slot_mapping",
    "shard_cache",
]


@dataclass(frozen=True)
class DCPGroup:
    """The ranks that share one sequence's KV cache, and how tokens are dealt among them.

    ``rank`` and ``world_size`` are Python ints (read once, host side), so a compiled step
    specialises on them instead of calling into the process group while tracing.
    """

    group: dist.ProcessGroup
    rank: int
    world_size: int
    interleave: int = 1

    @classmethod
    def from_group(cls, group: dist.ProcessGroup | None = None, interleave: int = 1) -> DCPGroup:
        """The calling rank's view of ``group`` (default: the whole world)."""
        group = dist.group.WORLD if group is None else group
        if interleave < 1:
            raise ValueError(f"DCPGroup: interleave: expected >= 1, got {interleave}")
        return cls(group, dist.get_rank(group), dist.get_world_size(group), interleave)

    def check_block_size(self, block_size: int) -> None:
        if block_size % self.interleave != 0:
            raise ValueError(
                f"DCPGroup: interleave: expected a divisor of the local block size {block_size}, "
                f"got {self.interleave}"
            )


class LocalMetadata(NamedTuple):
    """One rank's batch description, one decode row per query token (``R = T`` rows).

    block_table [T, MB] int32 (the row's sequence's block table row), seq_lens [T] int32 (keys of
    the row stored on this rank), query_start_loc [T + 1] int32 (``0, 1, ..., T``), slot_mapping
    [T_new] (this rank's slots of the new tokens, -1 where another rank stores them) or None.
    """

    block_table: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    slot_mapping: Tensor | None


# -- metadata --------------------------------------------------------------------------------------


def local_seq_lens(seq_lens: Tensor, rank: int, world_size: int, interleave: int) -> Tensor:
    """How many of the first ``seq_lens[i]`` keys rank ``rank`` stores (int32, same shape).

    Every full round of ``I * W`` positions gives each rank ``I`` keys; the last partial round
    gives rank r ``clamp(rem - r * I, 0, I)``.
    """
    lens = seq_lens.to(torch.int64).clamp(min=0)
    span = interleave * world_size
    full = torch.div(lens, span, rounding_mode="floor")
    rem = lens - full * span
    part = (rem - rank * interleave).clamp(0, interleave)
    return (full * interleave + part).to(torch.int32)


def local_slot_mapping(
    slot_mapping: Tensor, block_size: int, rank: int, world_size: int, interleave: int
) -> Tensor:
    """The slots of the new tokens in rank ``rank``'s cache of block size ``block_size``.

    ``slot_mapping`` holds global slots (``virtual_block * W * BS + offset``, negative: padding);
    tokens stored by another rank, and padding, get -1 (skipped by ``reshape_and_cache``).
    """
    virtual = block_size * world_size
    slots = slot_mapping.to(torch.int64)
    block = torch.div(slots, virtual, rounding_mode="floor")
    offset = slots - block * virtual
    owner = torch.div(offset, interleave, rounding_mode="floor") % world_size
    local = (
        block * block_size
        + torch.div(offset, interleave * world_size, rounding_mode="floor") * interleave
        + offset % interleave
    )
    mine = (slots >= 0) & (owner == rank)
    return torch.where(mine, local, -1).to(slot_mapping.dtype)


def local_metadata(
    block_table: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    num_tokens: int,
    dcp: DCPGroup,
    *,
    block_size: int,
    slot_mapping: Tensor | None = None,
    causal: bool = True,
) -> LocalMetadata:
    """This rank's ``LocalMetadata`` from the global batch description (tensor arithmetic on the
    tensors' device: no host synchronisation, so it can run inside a captured or compiled step).

    Args:
        block_table: ``[B, MB]`` int32 virtual block ids (the same on every rank).
        seq_lens: ``[B]`` int32 global key counts. query_start_loc: ``[B + 1]`` int32.
        num_tokens: ``T``, the query's first dimension (rows past ``query_start_loc[-1]`` are
            padding: they get ``seq_len`` 0, so output 0 and LSE -inf).
        block_size: ``BS``, the block size of each rank's cache (the virtual one is ``W * BS``).
        slot_mapping: ``[T_new]`` global slots of the tokens written this step, or None.
        causal: query token t of a sequence sees keys ``<= context + t``; else all its keys.
    """
    dcp.check_block_size(block_size)
    num_seqs = block_table.shape[0]
    device = block_table.device
    if num_seqs == 0:
        row_lens = torch.zeros(num_tokens, device=device, dtype=torch.int64)
        row_table = block_table.new_zeros(num_tokens, block_table.shape[1])
    else:
        seq, local, valid = rows_of(query_start_loc, num_tokens)
        new_tokens = query_start_loc.to(torch.int64).diff()[seq]
        lens = seq_lens.to(torch.int64)[seq]
        if causal:
            position = lens - new_tokens + local  # context + t
            row_lens = torch.minimum(position + 1, lens).clamp(min=0)
        else:
            row_lens = lens
        row_lens = torch.where(valid, row_lens, 0)
        row_table = block_table.index_select(0, seq)
    local_lens = local_seq_lens(row_lens, dcp.rank, dcp.world_size, dcp.interleave)
    local_slots = None
    if slot_mapping is not None:
        local_slots = local_slot_mapping(slot_mapping, block_size, dcp.rank, dcp.world_size, dcp.interleave)
    qsl = torch.arange(num_tokens + 1, device=device, dtype=torch.int32)
    return LocalMetadata(row_table, local_lens, qsl, local_slots)


# -- cache layout ----------------------------------------------------------------------------------


def shard_cache(cache: Tensor, rank: int, world_size: int, interleave: int) -> Tensor:
    """Rank ``rank``'s cache ``[NB, BS, ...]`` out of a global one ``[NB, W * BS, ...]`` (a copy):
    the tokens the rank stores, at the local offsets ``local_slot_mapping`` gives them."""
    num_blocks, virtual = cache.shape[:2]
    if virtual % (world_size * interleave) != 0:
        raise ValueError(
            f"shard_cache: cache: expected a block size divisible by world_size * interleave "
            f"= {world_size * interleave}, got shape {list(cache.shape)}"
        )
    block_size = virtual // world_size
    # virtual offset o = g * (I * W) + r * I + i  ->  rank r, local offset g * I + i
    split = cache.unflatten(1, (block_size // interleave, world_size, interleave))
    return split[:, :, rank].reshape(num_blocks, block_size, *cache.shape[2:]).clone()


# -- the exact combine -----------------------------------------------------------------------------


def _wait(t: Tensor) -> Tensor:
    return funcol.wait_tensor(t)


def _gather_lses(lse: Tensor, dcp: DCPGroup) -> Tensor:
    """Every rank's ``[T, H]`` LSE as ``[W, T, H]`` (rank order)."""
    gathered = _wait(_all_gather(lse.contiguous(), 0, dcp.group))
    return gathered.view(dcp.world_size, *lse.shape)


def combine_attn_states(
    out: Tensor, lse: Tensor, dcp: DCPGroup, *, scatter_heads: bool = False, method: str = "reduce"
) -> tuple[Tensor, Tensor]:
    """The attention over every rank's keys from each rank's partial result (collective).

    Args:
        out: ``[T, H, D]`` this rank's output over its keys; lse: ``[T, H]`` float32, natural log
            (-inf or +inf: this rank has no visible key for that row).
        scatter_heads: return only this rank's ``H / W`` heads (``[T, H/W, D]``, ``[T, H/W]``):
            rank r gets heads ``r * H/W .. (r+1) * H/W - 1``. Else every rank gets all heads.
        method: ``"reduce"``: all-gather LSEs, rescale, all-reduce / reduce-scatter in float32
            (vLLM's ``cp_lse_ag_out_ar`` / ``_rs``). ``"gather"``: all-gather (all-to-all when
            scattering heads) outputs and LSEs, then ``merge_attn_states_n`` in rank order.

    Returns:
        ``(out, lse)``: out in ``out``'s dtype, lse float32 ``[T, H]`` (natural log; -inf where no
        rank has a visible key, and then out is 0).
    """
    world, rank = dcp.world_size, dcp.rank
    num_tokens, num_heads = lse.shape
    if scatter_heads and num_heads % world != 0:
        raise ValueError(
            f"combine_attn_states: out: expected a head count divisible by world_size {world}, got {num_heads}"
        )
    local_heads = num_heads // world
    if method == "gather":
        if scatter_heads:  # rank j receives head chunk j of every rank: [W, T, H/W, ...]
            outs = out.view(num_tokens, world, local_heads, -1).transpose(0, 1).contiguous()
            lses = lse.view(num_tokens, world, local_heads).transpose(0, 1).contiguous()
            outs = _wait(funcol.all_to_all_single(outs, None, None, dcp.group))
            lses = _wait(funcol.all_to_all_single(lses, None, None, dcp.group))
        else:
            outs = _wait(_all_gather(out.contiguous(), 0, dcp.group)).view(world, *out.shape)
            lses = _gather_lses(lse, dcp)
        return merge_attn_states_n(outs, lses)
    if method != "reduce":
        raise ValueError(f"combine_attn_states: method: expected 'reduce' or 'gather', got {method!r}")
    lses = _gather_lses(lse.float(), dcp)
    lses = torch.where(lses == float("inf"), float("-inf"), lses)
    m = lses.amax(dim=0)
    m = torch.where(m == float("-inf"), 0.0, m)
    total = torch.exp(lses - m).sum(dim=0)  # [T, H]; 0 where every rank is empty
    lse_all = m + torch.log(total)
    mine = torch.where(lse == float("inf"), float("-inf"), lse.float())
    factor = torch.where(total > 0, torch.exp(mine - lse_all), 0.0)
    # an empty part's output may be garbage: select, do not multiply by 0
    part = torch.where((factor > 0)[..., None], out.float() * factor[..., None], 0.0)
    if scatter_heads:
        merged = _wait(_reduce_scatter(part, "sum", 1, dcp.group))
        lse_all = lse_all[:, rank * local_heads : (rank + 1) * local_heads]
    else:
        merged = _wait(funcol.all_reduce(part, "sum", dcp.group))
    return merged.to(out.dtype), lse_all.contiguous()


# -- sharded attention -----------------------------------------------------------------------------


def _gather_heads(x: Tensor, dcp: DCPGroup) -> Tensor:
    """``[T, H/W, ...]`` on each rank -> ``[T, H, ...]`` (rank r's heads at ``r*H/W ..``)."""
    return _wait(_all_gather(x.contiguous(), 1, dcp.group))


def dcp_paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    meta: LocalMetadata,
    dcp: DCPGroup,
    *,
    scale: float,
    softcap: float = 0.0,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    shard_heads: bool = False,
    method: str = "reduce",
) -> tuple[Tensor, Tensor]:
    """Paged attention over a KV cache sharded across ``dcp``'s ranks (collective).

    Equals ``paged_attention`` over the global cache (block size ``W * BS``) with the global
    batch description and ``return_lse=True``. Each rank runs ``paged_attention`` over its cache
    with ``meta = local_metadata(...)``, then ``combine_attn_states``. Sinks count once: only
    rank 0 passes them to its local attention.

    Args:
        query: ``[T, Hq, D]`` (all heads), or ``[T, Hq/W, D]`` this rank's heads with
            ``shard_heads`` (all-gathered first; the result comes back as this rank's heads).
        key_cache, value_cache: this rank's ``[NB, BS, Hkv, D]`` / ``[NB, BS, Hkv, Dv]``.
        sinks: ``[Hq]`` float32 over all heads, or None. The rest as in ``paged_attention``.

    Returns:
        ``(out [T, Hq, Dv], lse [T, Hq])`` (``Hq/W`` heads with ``shard_heads``), natural log.
    """
    if shard_heads:
        query = _gather_heads(query, dcp)
    out, lse = paged_attention(
        query, key_cache, value_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
        scale=scale, causal=True, softcap=softcap, sinks=sinks if dcp.rank == 0 else None,
        k_scale=k_scale, v_scale=v_scale, max_query_len=1, return_lse=True,
    )
    return combine_attn_states(out, lse, dcp, scatter_heads=shard_heads, method=method)


def dcp_mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    kv_cache: Tensor,
    meta: LocalMetadata,
    dcp: DCPGroup,
    *,
    scale: float,
    kv_scale: Tensor | None = None,
    shard_heads: bool = True,
    method: str = "reduce",
) -> tuple[Tensor, Tensor]:
    """``mla_decode`` over a latent cache sharded across ``dcp``'s ranks (collective).

    As vLLM does for MLA: each rank holds ``H/W`` query heads (tensor parallelism), all-gathers
    them, attends over its KV shard with every head, and the exact combine is reduce-scattered
    back to head shards. ``shard_heads=False``: every rank passes and gets all heads.

    Args:
        q_latent: ``[T, H/W, L]``, q_rope: ``[T, H/W, R]`` (``[T, H, ...]`` without shard_heads).
        kv_cache: this rank's ``[NB, BS, L + R]``. meta: ``local_metadata(...)`` of this rank.

    Returns:
        ``(out [T, H/W, L], lse [T, H/W])`` (all ``H`` heads without shard_heads), natural log.
    """
    if shard_heads:
        q_latent, q_rope = _gather_heads(q_latent, dcp), _gather_heads(q_rope, dcp)
    out, lse = mla_decode(
        q_latent, q_rope, kv_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
        scale=scale, causal=True, kv_scale=kv_scale,
    )
    return combine_attn_states(out, lse, dcp, scatter_heads=shard_heads, method=method)
