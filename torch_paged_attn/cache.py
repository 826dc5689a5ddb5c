"""Model-side KV-cache helpers: a host-side ``BlockAllocator`` and ``PagedKVCache``, an ``nn.Module``
whose per-layer caches are registered buffers.

``BlockAllocator`` hands out the blocks of one paged cache to sequences. A sequence of ``n``
tokens owns ``cdiv(n, BS)`` blocks, listed in order in its block table; token ``p`` lives at
``slot = table[p // BS] * BS + p % BS``. Forking a sequence shares its *full* blocks with the
child (reference counts), and gives the child a fresh block for a partly filled last block;
copying that block's first ``n % BS`` tokens is the caller's job (``fork`` returns the pair,
``PagedKVCache.copy_blocks`` does the copy). Appends only ever write into a sequence's last,
partly filled block or into fresh blocks, so no write lands in a block another sequence reads.

Prefix caching (what a serving engine uses to compute a shared system prompt once): a full block
can be ``register``-ed under a hash of its contents (chained with its parent block's hash, so a
hash names the whole prefix). ``cached_prefix`` finds the longest run of registered leading blocks,
``allocate_prefix`` starts a sequence on them (reference counts), and ``copy_on_write`` gives a
sequence a private copy of a shared block it is about to write. A registered block whose count
drops to zero stays cached (evictable, least recently freed first) until ``_take`` needs it.

``PagedKVCache`` keeps ``key_cache_<l>`` / ``value_cache_<l>`` (``[NB, BS, Hkv, D]``) and, for fp8,
``k_scale_<l>`` / ``v_scale_<l>`` (float32 ``[1]``) as buffers: ``model.to(device)`` moves them,
CUDA graphs treat them as static, and ``torch.export`` lifts them as buffers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor, nn

from .ops import paged_attention, paged_attention_out, reshape_and_cache

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, *FP8_DTYPES)


class OutOfBlocksError(RuntimeError):
    """The allocator has fewer free blocks than a request needs; its state is unchanged."""

    def __init__(self, request: str, needed: int, free: int, num_blocks: int):
        self.needed, self.free, self.num_blocks = needed, free, num_blocks
        super().__init__(
            f"BlockAllocator: {request} needs {needed} free blocks, {free} of {num_blocks} are free; "
            f"free finished sequences or build the cache with more blocks"
        )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockAllocator:
    """Hands out the ``num_blocks`` blocks of a paged cache to sequences, with reference counts.

    Sequence ids are any hashable values chosen by the caller. Every method either completes or
    raises before changing anything (``OutOfBlocksError`` when blocks run out, ``KeyError`` for
    an unknown sequence, ``ValueError`` for a bad argument).

    Example::

        >>> a = BlockAllocator(num_blocks=8, block_size=16)
        >>> a.allocate("a", 20)          # 2 blocks, 20 tokens
        [0, 1]
        >>> a.append("a", 2)             # token positions 20, 21 of block 1
        [20, 21]
        >>> a.fork("a", "b")             # "b" shares block 0, gets a fresh copy of block 1
        (1, 2)
        >>> a.block_table("b"), a.ref_count(0)
        ([0, 2], 2)
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # popped from the end: block 0 is handed out first
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs: list[int] = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._lens: dict[Hashable, int] = {}
        # prefix cache: content hash <-> block, and the registered blocks nobody holds (LRU order)
        self._block_of: dict[Hashable, int] = {}
        self._hash_of: dict[int, Hashable] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # -- queries --------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can take: never used, or cached by nobody (evictable)."""
        return len(self._free) + len(self._evictable)

    def free_blocks(self) -> list[int]:
        return list(self._free) + list(self._evictable)

    def num_blocks_of(self, seq: Hashable) -> int:
        return len(self._table(seq))

    def cached_prefix(self, hashes: Sequence[Hashable]) -> list[int]:
        """The registered blocks of the longest leading run of ``hashes`` (chained block hashes)."""
        blocks = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def sequences(self) -> list[Hashable]:
        return list(self._tables)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._tables

    def block_table(self, seq: Hashable) -> list[int]:
        """The blocks of ``seq`` in token order (a copy)."""
        return list(self._table(seq))

    def seq_len(self, seq: Hashable) -> int:
        self._table(seq)
        return self._lens[seq]

    def slots(self, seq: Hashable, start: int, end: int) -> list[int]:
        """Cache slots of token positions ``start .. end - 1`` of ``seq``."""
        table, bs = self._table(seq), self.block_size
        if not 0 <= start <= end <= self._lens[seq]:
            raise ValueError(f"slots: positions {start}..{end} outside the {self._lens[seq]} tokens of {seq!r}")
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # -- changes --------------------------------------------------------------------------------

    def allocate(self, seq: Hashable, num_tokens: int = 0) -> list[int]:
        """Start sequence ``seq`` with room for ``num_tokens`` tokens; returns its blocks."""
        if seq in self._tables:
            raise ValueError(f"allocate: sequence {seq!r} already exists")
        if num_tokens < 0:
            raise ValueError(f"allocate: num_tokens must be >= 0, got {num_tokens}")
        blocks = self._take(cdiv(num_tokens, self.block_size), f"allocating {num_tokens} tokens for {seq!r}")
        self._tables[seq] = blocks
        self._lens[seq] = num_tokens
        return list(blocks)

    def allocate_prefix(self, seq: Hashable, blocks: Sequence[int], num_tokens: int) -> None:
        """Start ``seq`` on the cached full ``blocks`` (from ``cached_prefix``) holding its first
        ``num_tokens`` tokens (at most ``len(blocks) * BS``, more than ``(len(blocks) - 1) * BS``)."""
        if seq in self._tables:
            raise ValueError(f"allocate_prefix: sequence {seq!r} already exists")
        if not (len(blocks) - 1) * self.block_size < num_tokens <= len(blocks) * self.block_size:
            raise ValueError(f"allocate_prefix: {num_tokens} tokens do not fill {len(blocks)} blocks")
        for b in blocks:
            if self._refs[b] == 0:
                if b not in self._evictable:
                    raise ValueError(f"allocate_prefix: block {b} is neither held nor cached")
                del self._evictable[b]
            self._refs[b] += 1
        self._tables[seq] = list(blocks)
        self._lens[seq] = num_tokens

    def register(self, seq: Hashable, index: int, block_hash: Hashable) -> None:
        """Record that block ``index`` of ``seq`` is full and holds the content named by
        ``block_hash``; a hash already registered keeps its first block."""
        block = self._table(seq)[index]
        if block_hash not in self._block_of and block not in self._hash_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash

    def copy_on_write(self, seq: Hashable, index: int) -> tuple[int, int] | None:
        """Make block ``index`` of ``seq`` private before ``seq`` writes into it: when another
        sequence holds it or the prefix cache names it, ``seq`` gets a fresh block instead and the
        caller copies ``src -> dst`` (``PagedKVCache.copy_blocks``). Returns ``(src, dst)`` or None."""
        table = self._table(seq)
        src = table[index]
        if self._refs[src] == 1 and src not in self._hash_of:
            return None
        (dst,) = self._take(1, f"copying block {src} of {seq!r} before a write")
        self._release(src)
        table[index] = dst
        return src, dst

    def append(self, seq: Hashable, num_tokens: int = 1) -> list[int]:
        """Extend ``seq`` by ``num_tokens`` tokens, taking blocks as needed; returns their slots."""
        table = self._table(seq)
        if num_tokens < 0:
            raise ValueError(f"append: num_tokens must be >= 0, got {num_tokens}")
        old = self._lens[seq]
        new = old + num_tokens
        need = cdiv(new, self.block_size) - len(table)
        table.extend(self._take(need, f"appending {num_tokens} tokens to {seq!r} ({old} tokens)"))
        self._lens[seq] = new
        return self.slots(seq, old, new)

    def try_grow(self, seq: Hashable, num_tokens: int) -> bool:
        """Make ``seq`` hold ``num_tokens`` tokens (at least its current length), taking blocks as
        needed: ``append`` without the slot list, and False (nothing changed) instead of
        ``OutOfBlocksError`` when blocks are short. A serving scheduler calls it once per request
        and step."""
        table = self._table(seq)
        if num_tokens < self._lens[seq]:
            raise ValueError(f"try_grow: {seq!r} holds {self._lens[seq]} tokens, cannot shrink to {num_tokens}")
        need = -(-num_tokens // self.block_size) - len(table)
        if need > 0:
            if need > len(self._free) + len(self._evictable):
                return False
            table.extend(self._take(need, f"growing {seq!r} to {num_tokens} tokens"))
        self._lens[seq] = num_tokens
        return True

    def fork(self, parent: Hashable, child: Hashable) -> tuple[int, int] | None:
        """Start ``child`` as a copy of ``parent``: the full blocks are shared (reference counts),
        a partly filled last block is replaced by a fresh one. Returns ``(src, dst)``, the block
        whose first ``seq_len % BS`` tokens the caller must copy, or None when nothing is partial."""
        table = self._table(parent)
        if child in self._tables:
            raise ValueError(f"fork: sequence {child!r} already exists")
        n = self._lens[parent]
        full = n // self.block_size
        partial = len(table) > full
        fresh = self._take(1 if partial else 0, f"forking {parent!r} ({n} tokens) into {child!r}")
        for b in table[:full]:
            self._refs[b] += 1
        self._tables[child] = table[:full] + fresh
        self._lens[child] = n
        return (table[full], fresh[0]) if partial else None

    def free(self, seq: Hashable) -> None:
        """End ``seq``: its blocks whose reference count drops to zero become free."""
        table = self._table(seq)
        for b in reversed(table):
            self._release(b)
        del self._tables[seq], self._lens[seq]

    # -- internals ------------------------------------------------------------------------------

    def _table(self, seq: Hashable) -> list[int]:
        try:
            return self._tables[seq]
        except KeyError:
            raise KeyError(f"unknown sequence {seq!r} ({len(self._tables)} live sequences)") from None

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _take(self, count: int, request: str) -> list[int]:
        if count > self.num_free_blocks:
            raise OutOfBlocksError(request, count, self.num_free_blocks, self.num_blocks)
        blocks = []
        for _ in range(count):
            if self._free:
                b = self._free.pop()
            else:  # evict the least recently freed cached block
                b, _ = self._evictable.popitem(last=False)
                del self._block_of[self._hash_of.pop(b)]
            self._refs[b] = 1
            blocks.append(b)
        return blocks


class PagedKVCache(nn.Module):
    """Per-layer paged key/value caches as registered buffers, and the two calls a layer makes.

    Args:
        num_layers: layers, each with its own key and value cache.
        num_blocks, block_size: ``NB`` blocks of ``BS`` tokens (``BS`` a multiple of 8).
        num_kv_heads, head_size: ``Hkv`` and ``D``; ``head_size_v`` defaults to ``D``.
        dtype: cache dtype, bf16/fp16/fp32 or fp8 (e4m3fn/e5m2). fp8 caches get float32 scale
            buffers ``k_scale_<l>`` / ``v_scale_<l>`` of shape ``[1]``, initialised to
            ``k_scale`` / ``v_scale``; they may be changed in place without recompiling.
        device: where the buffers live.

    Example::

        >>> import torch
        >>> cache = PagedKVCache(1, num_blocks=4, block_size=16, num_kv_heads=2, head_size=32,
        ...                      dtype=torch.float32)
        >>> k = v = torch.randn(1, 2, 32)
        >>> q = torch.randn(1, 4, 32)
        >>> out = cache(0, q, k, v, torch.tensor([3]), torch.tensor([[0]], dtype=torch.int32),
        ...             torch.tensor([4], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
        >>> out.shape
        torch.Size([1, 4, 32])
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        *,
        head_size_v: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ):
        super().__init__()
        if dtype not in CACHE_DTYPES:
            raise TypeError(f"PagedKVCache: dtype: expected one of {CACHE_DTYPES}, got {dtype}")
        head_size_v = head_size if head_size_v is None else head_size_v
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_size, self.head_size_v = num_kv_heads, head_size, head_size_v
        self.dtype = dtype
        self.is_fp8 = dtype in FP8_DTYPES
        shape = (num_blocks, block_size, num_kv_heads)
        for layer in range(num_layers):
            for name, size in (("key_cache", head_size), ("value_cache", head_size_v)):
                self.register_buffer(f"{name}_{layer}", torch.zeros(*shape, size, dtype=dtype, device=device))
            if self.is_fp8:
                for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
                    scale = torch.full((1,), value, dtype=torch.float32, device=device)
                    self.register_buffer(f"{name}_{layer}", scale)

    def key_cache(self, layer: int) -> Tensor:
        return getattr(self, f"key_cache_{layer}")

    def value_cache(self, layer: int) -> Tensor:
        return getattr(self, f"value_cache_{layer}")

    def scales(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """``(k_scale, v_scale)`` of an fp8 layer, ``(None, None)`` otherwise."""
        if not self.is_fp8:
            return None, None
        return getattr(self, f"k_scale_{layer}"), getattr(self, f"v_scale_{layer}")

    def write(self, layer: int, key: Tensor, value: Tensor, slot_mapping: Tensor) -> None:
        """Store ``key [T, Hkv, D]`` / ``value [T, Hkv, Dv]`` at ``slot_mapping [T']`` (negative
        slots and rows past ``T'`` are padding) through ``reshape_and_cache``."""
        _check_no_grad("write", key, value)
        k_scale, v_scale = self.scales(layer)
        reshape_and_cache(
            key, value, self.key_cache(layer), self.value_cache(layer), slot_mapping, k_scale, v_scale
        )

    def attend(
        self,
        layer: int,
        query: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        query_start_loc: Tensor,
        *,
        out: Tensor | None = None,
        scale: float | None = None,
        max_query_len: int = -1,
        **options,
    ) -> Tensor:
        """``paged_attention`` of ``query [T, Hq, D]`` over this layer's cache; into ``out``
        (``paged_attention_out``) when given. ``options``: the ops' keyword options (causal,
        window_left, softcap, sinks, ...). Returns the output ``[T, Hq, Dv]``."""
        _check_no_grad("attend", query)
        k_scale, v_scale = self.scales(layer)
        args = (query, self.key_cache(layer), self.value_cache(layer), block_table, seq_lens, query_start_loc)
        kwargs = dict(scale=scale, max_query_len=max_query_len, k_scale=k_scale, v_scale=v_scale, **options)
        if out is None:
            return paged_attention(*args, **kwargs)[0]
        paged_attention_out(*args, out, None, **kwargs)
        return out

    def forward(
        self,
        layer: int,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        slot_mapping: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        query_start_loc: Tensor,
        **options,
    ) -> Tensor:
        """Write the new tokens' keys and values, then attend over the cache (``attend``'s options)."""
        self.write(layer, key, value, slot_mapping)
        return self.attend(layer, query, block_table, seq_lens, query_start_loc, **options)

    @torch.no_grad()
    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (what ``BlockAllocator.fork`` asks for)."""
        if not pairs:
            return
        device = self.key_cache(0).device if self.num_layers else None
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=device)
        for layer in range(self.num_layers):
            for cache in (self.key_cache(layer), self.value_cache(layer)):
                if cache.dtype in FP8_DTYPES:  # index kernels do not take fp8: move the raw bytes
                    cache = cache.view(torch.uint8)
                cache.index_copy_(0, dst, cache.index_select(0, src))


def _check_no_grad(method: str, *tensors: Tensor) -> None:
    """The paged_attn ops have no backward. With grad mode on and an input that requires grad,
    eager calls would return outputs whose backward fails and torch.compile would fail inside
    AOTAutograd's backward trace; raise one clear error instead, in both."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(
            f"PagedKVCache.{method}: an input requires grad, but the paged_attn ops have no backward "
            f"(inference only). Run the model under torch.no_grad() or torch.inference_mode(), or "
            f"call model.requires_grad_(False)."
        )
