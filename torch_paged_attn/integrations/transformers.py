"""Hugging Face transformers on torch_paged_attn: the ``"paged_attn"`` attention implementation.

Importing this module registers ``"paged_attn"`` with transformers' ``AttentionInterface`` (the
attention function) and ``AttentionMaskInterface`` (the mask it is given). A model built with
``attn_implementation="paged_attn"`` (or switched with ``model.set_attn_implementation("paged_attn")``)
generates over a :class:`PagedCache`::

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="paged_attn")
    cache = PagedCache(model.config, max_cache_len=prompt_len + max_new_tokens)
    out = model.generate(input_ids, attention_mask=mask, past_key_values=cache, max_new_tokens=...)

How the cache is managed:

- :class:`PagedCache` is a ``transformers.Cache`` with one :class:`PagedLayer` per decoder layer.
  A layer owns a block pool ``key_cache [NB, BS, Hkv, D]`` / ``value_cache [NB, BS, Hkv, Dv]``, a
  ``block_table [B, MB]`` int32 and ``lengths [B]`` int32 (tokens stored per sequence). Every
  sequence gets ``MB = cdiv(max_cache_len, BS)`` blocks of the pool when the layer is first used
  (its block ids interleave with the other sequences': ``block_table[b, k] = k * B + b``); the
  buffers keep their addresses for the cache's lifetime, so a compiled decode step (and its CUDA
  graph) serves every step.
- ``PagedLayer.update`` stores nothing: it hands the attention function this step's keys and
  values together with the layer (a :class:`PagedStep`). Only the attention function sees the
  padding mask, so it is the one that writes (``reshape_and_cache``) and attends
  (``paged_attention``).
- Padding tokens are never stored. Real tokens of sequence ``b`` are packed at cache positions
  ``lengths[b], lengths[b] + 1, ...`` (slot ``-1`` for a pad), so a left-padded prompt of ``n`` real
  tokens occupies positions ``0 .. n-1``: causal masking, sliding windows, softcap and sinks then
  mean what they mean for the unpadded sequence, which is also what transformers' eager attention
  computes for left padding (its sliding window counts positions of the padded row, equal to the
  packed ones when the pads come first).
- Query rows are reordered per sequence (a stable sort that puts the step's pads first), so the real
  tokens are the last ``q_len`` rows of the sequence's segment, as the op's bottom-right causal
  alignment expects; outputs go back to the model's order. Pad rows get values no real token reads.

All of it is tensor arithmetic with shapes fixed by the batch and the step length: nothing reads
a tensor value on the host, so decode steps compile once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import ops as _ops  # noqa: F401  (registers torch.ops.paged_attn.*)
from ..ops import paged_attention, reshape_and_cache
from ..ops._checks import debug_checks_enabled

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as exc:  # the package itself never imports this module
    raise ImportError(
        "torch_paged_attn.integrations.transformers needs the transformers package: "
        "pip install transformers"
    ) from exc

ATTN_IMPLEMENTATION = "paged_attn"
DEFAULT_BLOCK_SIZE = 16

__all__ = [
    "ATTN_IMPLEMENTATION",
    "PagedCache",
    "RaggedBatch",
    "PagedLayer",
    "PagedStep",
    "paged_attention_forward",
    "paged_attention_mask",
    "register",
]


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


@dataclass
class PagedStep:
    """What :meth:`PagedLayer.update` hands the attention function: the layer and this step's
    keys ``[B, Hkv, L, D]`` and values ``[B, Hkv, L, Dv]`` (not yet stored)."""

    layer: PagedLayer
    key: Tensor
    value: Tensor


class PagedLayer(CacheLayerMixin):
    """One decoder layer's paged KV cache (see the module docstring for the layout).

    Args:
        max_cache_len: tokens each sequence may hold (its prompt with padding, plus new tokens).
        block_size: tokens per cache block, a multiple of 8.
    """

    is_compileable = True
    is_sliding = False

    def __init__(self, max_cache_len: int, block_size: int = DEFAULT_BLOCK_SIZE, **kwargs):
        super().__init__()
        if max_cache_len < 1:
            raise ValueError(f"max_cache_len: expected a positive int, got {max_cache_len}")
        if block_size < 8 or block_size % 8:
            raise ValueError(f"block_size: expected a positive multiple of 8, got {block_size}")
        self.max_cache_len = max_cache_len
        self.block_size = block_size
        # Positions the model has seen (pads included), as transformers' StaticLayer counts them: a
        # tensor, so that generate's position arithmetic does not recompile a compiled step.
        self.cumulative_length = torch.tensor(0, dtype=torch.int64)
        self.key_cache: Tensor | None = None
        self.value_cache: Tensor | None = None
        self.block_table: Tensor | None = None
        self.lengths: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        batch_size, num_kv_heads, _, head_size = key_states.shape
        device, dtype = key_states.device, key_states.dtype
        blocks_per_seq = -(-self.max_cache_len // self.block_size)
        num_blocks = batch_size * blocks_per_seq
        self.key_cache = torch.zeros(
            num_blocks, self.block_size, num_kv_heads, head_size, dtype=dtype, device=device
        )
        self.value_cache = torch.zeros(
            num_blocks, self.block_size, num_kv_heads, value_states.shape[-1], dtype=dtype, device=device
        )
        self.block_table = (
            torch.arange(num_blocks, dtype=torch.int32, device=device)
            .view(blocks_per_seq, batch_size)
            .t()
            .contiguous()
        )
        self.lengths = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.cumulative_length = self.cumulative_length.to(device)
        # transformers' Cache API reads these two names.
        self.keys, self.values = self.key_cache, self.value_cache
        if not _is_compiling():
            for t in (self.key_cache, self.value_cache, self.block_table, self.lengths, self.cumulative_length):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[PagedStep, PagedStep]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length.add_(key_states.shape[-2])
        step = PagedStep(self, key_states, value_states)
        return step, step

    def get_mask_sizes(self, query_length: int, *args, **kwargs) -> tuple[int, int]:
        return self.max_cache_len, 0

    def get_seq_length(self, *args, **kwargs):
        return self.cumulative_length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        if self.is_initialized:
            self.key_cache.zero_()
            self.value_cache.zero_()
            self.lengths.zero_()
        self.cumulative_length.zero_()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise ValueError(
            "PagedCache does not reorder sequences, so it cannot serve beam search: "
            "generate with num_beams=1 (greedy or sampling)"
        )


class PagedCache(Cache):
    """A ``transformers.Cache`` whose layers are :class:`PagedLayer` block pools, for models built
    with ``attn_implementation="paged_attn"``.

    Args:
        config: the model's config (its text config is used for the number of layers).
        max_cache_len: tokens each sequence may hold: the padded prompt length plus the new tokens.
        block_size: tokens per cache block (a multiple of 8; 16 by default).
    """

    def __init__(self, config, max_cache_len: int, block_size: int = DEFAULT_BLOCK_SIZE):
        text_config = config.get_text_config(decoder=True)
        layers = [
            PagedLayer(max_cache_len=max_cache_len, block_size=block_size)
            for _ in range(text_config.num_hidden_layers)
        ]
        super().__init__(layers=layers)


@dataclass
class RaggedBatch:
    """One ragged step of many sequences, for a model called as
    ``model(input_ids [1, T], position_ids [1, T], use_cache=False, paged_batch=RaggedBatch(...))``
    (what ``torch_paged_attn.serving`` does): transformers hands the keyword to every attention
    call, and layer ``l`` (``module.layer_idx``) stores its keys/values at ``slot_mapping`` in
    ``key_caches[l]`` / ``value_caches[l]`` and attends over them with the step's
    ``block_table [B, MB]``, ``seq_lens [B]``, ``query_start_loc [B + 1]`` (int32; decode tokens
    and prefill chunks mixed, causal bottom-right aligned; padding rows as DESIGN.md describes).
    No ``Cache`` object and no mask are involved."""

    key_caches: list[Tensor]
    value_caches: list[Tensor]
    block_table: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    slot_mapping: Tensor
    max_query_len: int = -1


def _ragged_attention(module, query, key, value, batch: RaggedBatch, scaling, sliding_window, softcap, sinks):
    """``paged_attention_forward`` for a :class:`RaggedBatch`: ``query [1, Hq, T, D]``,
    ``key``/``value [1, Hkv, T, D]`` (the step's new tokens, not yet stored). Returns
    ``(out [1, T, Hq, Dv], None)``."""
    if query.shape[0] != 1:
        raise ValueError(f"paged_batch: expected input_ids of shape [1, T], got a batch of {query.shape[0]}")
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise ValueError(f"paged_batch: the attention module {type(module).__name__} has no layer_idx")
    key_cache, value_cache = batch.key_caches[layer], batch.value_caches[layer]
    reshape_and_cache(key[0].transpose(0, 1), value[0].transpose(0, 1), key_cache, value_cache, batch.slot_mapping)
    out, _ = paged_attention(
        query[0].transpose(0, 1),
        key_cache,
        value_cache,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        scale=scaling,
        window_left=sliding_window - 1 if sliding_window else -1,
        softcap=float(softcap) if softcap else 0.0,
        sinks=sinks,
        max_query_len=batch.max_query_len,
    )
    return out.unsqueeze(0), None


def paged_attention_mask(*args, attention_mask: Tensor | None = None, **kwargs) -> Tensor | None:
    """The mask ``"paged_attn"`` layers receive: the model's 2D padding mask ``[B, past + L]``
    (True for a real token) as it came, or None when the model was given none. Causal, window and
    chunk structure come from the attention function's arguments, not from a materialised mask."""
    return attention_mask


def _step_slots(layer: PagedLayer, real: Tensor) -> tuple[Tensor, Tensor]:
    """Cache slots ``[B * L]`` int64 of this step's tokens (``-1`` for pads) and ``seq_lens [B]``."""
    block_size = layer.block_size
    lengths = layer.lengths.to(torch.int64)
    pos = lengths[:, None] + real.to(torch.int64).cumsum(1) - 1  # [B, L], packed cache position
    pos = pos.clamp(0, layer.block_table.shape[1] * block_size - 1)
    block = layer.block_table.to(torch.int64).gather(1, pos // block_size)
    slots = torch.where(real, block * block_size + pos % block_size, -1)
    seq_lens = lengths + real.to(torch.int64).sum(1)
    return slots.reshape(-1), seq_lens.to(torch.int32)


def paged_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key,
    value,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function for ``attn_implementation="paged_attn"``.

    Stores this step's keys/values in the layer's paged cache (``reshape_and_cache``, pads skipped)
    and attends over it (``paged_attention``): causal, ``sliding_window`` ``w`` as the op's window
    ``(w - 1, 0)`` (transformers' window holds the token and ``w - 1`` before it), ``softcap``,
    ``s_aux`` (or ``sinks``) as attention sinks, GQA through the cache's kv heads.

    Args:
        module: the attention module (only ``training`` is read).
        query: ``[B, Hq, L, D]``.
        key, value: the :class:`PagedStep` that :class:`PagedLayer` returned from ``update``.
        attention_mask: ``[B, past + L]`` bool padding mask (True = real token) or None.
        scaling: score scale; None means ``1/sqrt(D)``.
        paged_batch (keyword): a :class:`RaggedBatch`; the step is then one ragged row
            ``[1, T]`` of many sequences described by it (``key``/``value`` are the new tokens).

    Returns:
        ``(out [B, L, Hq, Dv], None)``; attention weights are never materialised.
    """
    ragged = kwargs.get("paged_batch")
    if ragged is not None:
        sinks = s_aux if s_aux is not None else kwargs.get("sinks")
        return _ragged_attention(module, query, key, value, ragged, scaling, sliding_window, softcap, sinks)
    if not isinstance(key, PagedStep):
        raise ValueError(
            'attn_implementation="paged_attn" attends over a PagedCache: pass '
            "past_key_values=PagedCache(model.config, max_cache_len=...) to the model or to generate "
            f"(the layer got keys of type {type(key).__name__})"
        )
    if module.training and dropout > 0.0:
        raise ValueError(f'attn_implementation="paged_attn" has no attention dropout, got dropout={dropout}')
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            'attn_implementation="paged_attn": attention_mask: expected a 2D padding mask [B, past + L], '
            f"got shape {list(attention_mask.shape)}"
        )
    sinks = s_aux if s_aux is not None else kwargs.get("sinks")
    layer = key.layer
    batch, num_heads, q_len, head_size = query.shape
    # The mask spans every position seen, so its width bounds the tokens stored (a shape: no sync);
    # without a mask, TORCH_PAGED_ATTN_DEBUG=1 checks the lengths themselves.
    if attention_mask is not None and attention_mask.shape[1] > layer.max_cache_len:
        raise ValueError(
            f"PagedCache: {attention_mask.shape[1]} positions exceed max_cache_len={layer.max_cache_len}"
        )

    # -- which of this step's tokens are real, and where they go --
    if attention_mask is None:
        real = torch.ones(batch, q_len, dtype=torch.bool, device=query.device)
    else:
        real = attention_mask[:, attention_mask.shape[1] - q_len:].to(device=query.device, dtype=torch.bool)
    slots, seq_lens = _step_slots(layer, real)
    capacity = layer.block_table.shape[1] * layer.block_size
    if debug_checks_enabled(seq_lens) and int(seq_lens.max()) > capacity:
        raise ValueError(f"PagedCache: a sequence of {int(seq_lens.max())} tokens exceeds its {capacity} slots")
    new_k = key.key.transpose(1, 2).reshape(batch * q_len, -1, key.key.shape[-1])
    new_v = key.value.transpose(1, 2).reshape(batch * q_len, -1, key.value.shape[-1])
    reshape_and_cache(new_k, new_v, layer.key_cache, layer.value_cache, slots)
    layer.lengths.copy_(seq_lens)

    # -- queries: pads of the step first, so real tokens end the segment (bottom-right causal) --
    q = query.transpose(1, 2)  # [B, L, Hq, D]
    order = None
    if q_len > 1 and attention_mask is not None:
        order = torch.argsort(real.to(torch.int8), dim=1, stable=True)  # [B, L]
        q = q.gather(1, order[:, :, None, None].expand(-1, -1, num_heads, head_size))
    q = q.reshape(batch * q_len, num_heads, head_size)
    query_start_loc = torch.arange(
        0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=query.device
    )
    out, _ = paged_attention(
        q,
        layer.key_cache,
        layer.value_cache,
        layer.block_table,
        seq_lens,
        query_start_loc,
        scale=scaling,
        window_left=sliding_window - 1 if sliding_window else -1,
        softcap=float(softcap) if softcap else 0.0,
        sinks=sinks,
        max_query_len=q_len,
    )
    out = out.view(batch, q_len, num_heads, -1)
    if order is not None:
        inverse = torch.argsort(order, dim=1)
        out = out.gather(1, inverse[:, :, None, None].expand(-1, -1, num_heads, out.shape[-1]))
    return out, None


def register() -> None:
    """Register ``"paged_attn"`` with transformers' attention and mask registries (idempotent;
    importing this module does it)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, paged_attention_mask)


register()
