"""Attention metadata for one step, written in place into static buffers.

A CUDA graph replays the memory addresses it captured. ``MetadataBuilder`` therefore keeps, per
batch-size bucket ``(num_seqs, num_tokens)``, one preallocated ``StepMetadata`` on the device and
rewrites its tensors in place every step: a graph captured on a bucket's buffers replays
correctly for every later step of that bucket, whatever the lengths and block tables. Shapes
never change inside a bucket (``block_table`` is always ``[num_seqs, max_blocks_per_seq]``), so
compiled code does not recompile either.

For real sequence ``i`` with ``q_i`` new tokens and ``n_i`` tokens in the allocator (the new
ones included, i.e. after ``BlockAllocator.append``)::

    seq_lens[i]              = n_i
    query_start_loc[i + 1]   = query_start_loc[i] + q_i
    block_table[i, :used]    = allocator.block_table(seq)        (rest of the row: 0)
    slot_mapping[t]          = slot of position n_i - q_i + j     (token t = query_start_loc[i] + j)
    positions[t]             = n_i - q_i + j

Padding rows (sequences past the real ones): ``seq_lens`` 0, ``query_start_loc`` flat (equal to
the number of real tokens), ``block_table`` 0; padding tokens: ``slot_mapping`` -1,
``positions`` 0. The ops skip all of them (``DESIGN.md``: padding as CUDA-graph buckets produce it).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .cache import BlockAllocator


@dataclass
class StepMetadata:
    """The batch description of one step (static buffers of one bucket).

    ``block_table [B, MB]``, ``seq_lens [B]``, ``query_start_loc [B + 1]`` int32;
    ``slot_mapping [T]``, ``positions [T]`` int64; ``max_query_len`` the bucket's longest query
    (1 for decode), a hint the ops take.
    """

    block_table: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    slot_mapping: Tensor
    positions: Tensor
    max_query_len: int
    num_seqs: int = 0  # real (non-padding) sequences of the last build
    num_tokens: int = 0  # real tokens of the last build

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return self.block_table, self.seq_lens, self.query_start_loc, self.slot_mapping, self.positions


def mark_static(t: Tensor) -> None:
    """Tell ``torch.compile`` that ``t`` keeps its address from call to call (a static buffer
    rewritten in place). ``mode="reduce-overhead"`` then reads it where it lives instead of copying
    it into the graph's own input buffer before every replay (one copy kernel per input and step).
    Unguarded: a different tensor in its place re-records the graph rather than recompiling."""
    torch._dynamo.mark_static_address(t, guard=False)


class MetadataBuilder:
    """Builds ``StepMetadata`` from a ``BlockAllocator`` into per-bucket static buffers.

    Args:
        allocator: where the sequences' block tables and lengths come from.
        max_blocks_per_seq: ``MB``, the width of every block table (the longest sequence the
            buffers can describe is ``MB * BS`` tokens).
        device: where the buffers live.
        batch_buckets: the batch sizes the buffers are made for; a step of ``b`` sequences uses
            the smallest bucket ``>= b`` and pads the rest. None: each ``b`` is its own bucket.

    Example::

        >>> alloc = BlockAllocator(num_blocks=16, block_size=16)
        >>> _ = alloc.allocate("a", 20); _ = alloc.allocate("b", 3)
        >>> builder = MetadataBuilder(alloc, max_blocks_per_seq=4, batch_buckets=[4])
        >>> _ = alloc.append("a"); _ = alloc.append("b")
        >>> md = builder.build(["a", "b"])          # one decode token each, padded to 4
        >>> md.seq_lens.tolist(), md.query_start_loc.tolist(), md.slot_mapping.tolist()
        ([21, 4, 0, 0], [0, 1, 2, 2, 2], [20, 35, -1, -1])
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        max_blocks_per_seq: int,
        device: torch.device | str | None = None,
        batch_buckets: Sequence[int] | None = None,
    ):
        self.allocator = allocator
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.batch_buckets = sorted(batch_buckets) if batch_buckets else None
        self._buffers: dict[tuple[int, int], StepMetadata] = {}

    def bucket(self, num_seqs: int) -> int:
        """The padded batch size a step of ``num_seqs`` sequences runs at."""
        if self.batch_buckets is None:
            return num_seqs
        for b in self.batch_buckets:
            if b >= num_seqs:
                return b
        raise ValueError(f"bucket: {num_seqs} sequences exceed the largest batch bucket {self.batch_buckets[-1]}")

    def buffers(self, num_seqs: int, num_tokens: int, max_query_len: int) -> StepMetadata:
        """The static buffers of bucket ``(num_seqs, num_tokens)``, made on first use."""
        key = (num_seqs, num_tokens)
        md = self._buffers.get(key)
        if md is None:
            dev, i32, i64 = self.device, torch.int32, torch.int64
            md = StepMetadata(
                block_table=torch.zeros(num_seqs, self.max_blocks_per_seq, dtype=i32, device=dev),
                seq_lens=torch.zeros(num_seqs, dtype=i32, device=dev),
                query_start_loc=torch.zeros(num_seqs + 1, dtype=i32, device=dev),
                slot_mapping=torch.full((num_tokens,), -1, dtype=i64, device=dev),
                positions=torch.zeros(num_tokens, dtype=i64, device=dev),
                max_query_len=max_query_len,
            )
            for t in md.tensors():
                mark_static(t)
            self._buffers[key] = md
        md.max_query_len = max(md.max_query_len, max_query_len)
        return md

    def build(
        self,
        seqs: Sequence[Hashable],
        query_lens: Sequence[int] | int = 1,
        *,
        num_tokens: int | None = None,
    ) -> StepMetadata:
        """Write the metadata of a step over ``seqs`` (each with ``query_lens[i]`` new tokens,
        already appended to the allocator) into its bucket's buffers, in place, and return them.

        The bucket is ``(bucket(len(seqs)), num_tokens)``; ``num_tokens`` defaults to
        ``bucket(len(seqs)) * max(query_lens)`` (the batch size for decode).
        """
        if isinstance(query_lens, int):
            query_lens = [query_lens] * len(seqs)
        if len(query_lens) != len(seqs):
            raise ValueError(f"build: {len(seqs)} sequences but {len(query_lens)} query lengths")
        alloc, bs, mb = self.allocator, self.allocator.block_size, self.max_blocks_per_seq
        padded = self.bucket(len(seqs))
        max_q = max(query_lens, default=1)
        total = sum(query_lens)
        if num_tokens is None:
            num_tokens = padded * max_q
        if total > num_tokens:
            raise ValueError(f"build: {total} query tokens exceed the bucket's {num_tokens} token rows")

        table = torch.zeros(padded, mb, dtype=torch.int32)
        seq_lens = torch.zeros(padded, dtype=torch.int32)
        qsl = torch.full((padded + 1,), total, dtype=torch.int32)
        slots = torch.full((num_tokens,), -1, dtype=torch.int64)
        positions = torch.zeros(num_tokens, dtype=torch.int64)
        start = 0
        for i, (seq, q) in enumerate(zip(seqs, query_lens)):
            n = alloc.seq_len(seq)
            blocks = alloc.block_table(seq)
            if q < 0 or q > n:
                raise ValueError(f"build: sequence {seq!r} has {n} tokens, cannot have {q} new ones")
            if len(blocks) > mb:
                raise ValueError(
                    f"build: sequence {seq!r} has {n} tokens in {len(blocks)} blocks, "
                    f"more than max_blocks_per_seq={mb} (block size {bs})"
                )
            table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            seq_lens[i] = n
            qsl[i] = start
            slots[start : start + q] = torch.tensor(alloc.slots(seq, n - q, n), dtype=torch.int64)
            positions[start : start + q] = torch.arange(n - q, n)
            start += q

        md = self.buffers(padded, num_tokens, max_q)
        # Blocking copies from pageable memory: the host may rewrite these tensors next step.
        md.block_table.copy_(table)
        md.seq_lens.copy_(seq_lens)
        md.query_start_loc.copy_(qsl)
        md.slot_mapping.copy_(slots)
        md.positions.copy_(positions)
        md.num_seqs, md.num_tokens = len(seqs), total
        return md
