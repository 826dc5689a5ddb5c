"""torch_paged_attn: paged-KV-cache attention operators for PyTorch, at ``torch.ops.paged_attn.*``.

Module responsibilities (the path of one call, top to bottom)::

    torch_paged_attn.paged_attention(...)        typed wrapper, the docstring (ops/<family>.py)
      -> torch.ops.paged_attn.paged_attention    one registered boundary (torch.library.triton_op)
        -> _check_paged_attention                shapes/dtypes/devices only; shared by fake and real
        -> lowering.select(op, facts)            picks a backend from static facts, never values
          -> lowering/reference.py               plain PyTorch, any device: the specification
          -> lowering/triton/<family>.py         Triton kernels (CUDA)
          -> lowering/flash.py                   FlashAttention 4/3/2 (CUDA, when installed), behind
                                                 the private opaque op paged_attn::_flash_attention

- ``ops/`` declares: schema, mutation annotations, validation, the public function. It imports
  torch only; backends are imported lazily by ``lowering.select``.
- ``lowering/`` implements: one module per backend (per kernel family for Triton). Backends never
  import one another; each says through ``supports(op, facts)`` what it cannot do, and the
  dispatcher falls back to the next one (the reference runs everything).
- The op body is also the fake kernel: it allocates outputs from shapes and launches nothing on
  fake tensors, so ``torch.compile(fullgraph=True)`` and ``torch.export`` see one node per call.
  Off CUDA the body runs the reference, which is traceable (no host synchronisation).
- ``cache.py`` / ``metadata.py``: model-side helpers: ``PagedKVCache`` (per-layer caches as
  registered buffers), ``BlockAllocator`` (host-side blocks, forks share full prefix blocks with
  reference counts), ``MetadataBuilder`` (one batch-size bucket's static block_table / seq_lens /
  query_start_loc / slot_mapping buffers, rewritten in place each step so one graph serves them all).
- ``mla.py``: a DeepSeek-style MLA ``nn.Module`` on the ops (decode: W_UK absorbed, ``mla_decode``;
  prefill: ``paged_attention`` over the new tokens + the cached context in chunks through
  ``gather_cache`` / ``merge_attn_states``).
- ``testing.py`` builds inputs (block tables, caches with garbage in unused slots, ragged batches)
  for the tests and the benchmarks alike.
- ``TORCH_PAGED_ATTN_DEBUG=1`` (read per call) adds value checks that synchronise.
- ``set_backend`` / ``with backend(...)`` / ``TORCH_PAGED_ATTN_BACKEND`` (read per call):
  "auto" (FlashAttention for prefill-like calls it supports, else Triton), "triton", "flash",
  "reference"; ``_config.py`` holds this switch and batch-invariant mode.
"""

from . import cache, metadata, ops
from ._config import backend, batch_invariant, get_backend, is_batch_invariant, set_backend, set_batch_invariant
from .cache import BlockAllocator, OutOfBlocksError, PagedKVCache
from .metadata import MetadataBuilder, StepMetadata
from .mla import MLAAttention
from .ops import (
    concat_and_cache_mla,
    gather_cache,
    merge_attn_states,
    merge_attn_states_n,
    merge_attn_states_n_out,
    merge_attn_states_out,
    mla_decode,
    paged_attention,
    paged_attention_out,
    reshape_and_cache,
)

__version__ = "0.1.0"

__all__ = [
    "BlockAllocator",
    "MetadataBuilder",
    "OutOfBlocksError",
    "PagedKVCache",
    "StepMetadata",
    "cache",
    "metadata",
    "MLAAttention",
    "backend",
    "batch_invariant",
    "get_backend",
    "is_batch_invariant",
    "set_backend",
    "set_batch_invariant",
    "concat_and_cache_mla",
    "gather_cache",
    "merge_attn_states",
    "merge_attn_states_n",
    "merge_attn_states_n_out",
    "merge_attn_states_out",
    "mla_decode",
    "ops",
    "paged_attention",
    "paged_attention_out",
    "reshape_and_cache",
]
