"""``MetadataBuilder``: static buffers rewritten in place (issue 5).

A decode loop over a bucket of 4 rows with 3 live sequences (one forked from another, one
finishing and replaced mid-run) writes each step's new keys and values through the built
``slot_mapping`` and attends through the built ``block_table`` / ``seq_lens`` /
``query_start_loc``. Checked every step: the buffers are the same tensors at the same addresses
(what a captured CUDA graph replays), the padding row has seq_len 0, a flat query_start_loc and
slot -1, and every real token's output equals a float64 softmax over the keys and values that
sequence wrote, kept densely on the side. A chunked-prefill step (several new tokens per
sequence) is checked the same way.
"""

from __future__ import annotations

import pytest
import torch

import torch_paged_attn as pa
from torch_paged_attn.cache import BlockAllocator
from torch_paged_attn.metadata import MetadataBuilder
from torch_paged_attn.testing import assert_close

BS, HKV, HQ, D, NB, MB = 8, 2, 4, 32, 40, 8


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 causal attention of the last ``len(q)`` positions over ``k, v [n, Hkv, D]`` (GQA)."""
    n, group = k.shape[0], q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    rows = []
    for t in range(q.shape[0]):
        p = n - q.shape[0] + t
        s = torch.einsum("hd,nhd->hn", q[t].double(), k[: p + 1]) * scale
        rows.append(torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v[: p + 1]))
    return torch.stack(rows)


class World:
    """An allocator, a builder, a float32 cache with NaN in every slot never written, and the
    dense keys/values of every live sequence."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.alloc = BlockAllocator(NB, BS)
        self.builder = MetadataBuilder(self.alloc, MB, batch_buckets=[2, 4])
        self.kc = torch.full((NB, BS, HKV, D), float("nan"))
        self.vc = torch.full((NB, BS, HKV, D), float("nan"))
        self.dense: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g)

    def start(self, seq: str, n: int) -> None:
        self.alloc.allocate(seq, 0)
        self.dense[seq] = (torch.empty(0, HKV, D), torch.empty(0, HKV, D))
        self.step([seq], [n])

    def fork(self, parent: str, child: str) -> None:
        copy = self.alloc.fork(parent, child)
        if copy is not None:
            self.kc[copy[1]] = self.kc[copy[0]]
            self.vc[copy[1]] = self.vc[copy[0]]
        self.dense[child] = self.dense[parent]

    def step(self, seqs: list[str], q_lens: list[int], num_tokens: int | None = None):
        """Append ``q_lens`` tokens to ``seqs``, build, write, attend, check; returns the metadata."""
        for seq, q in zip(seqs, q_lens):
            self.alloc.append(seq, q)
        md = self.builder.build(seqs, q_lens, num_tokens=num_tokens)
        t = md.slot_mapping.shape[0]
        key, value, query = self.randn(t, HKV, D), self.randn(t, HKV, D), self.randn(t, HQ, D)
        pa.reshape_and_cache(key, value, self.kc, self.vc, md.slot_mapping)
        out = pa.paged_attention(
            query, self.kc, self.vc, md.block_table, md.seq_lens, md.query_start_loc,
            scale=0.3, max_query_len=md.max_query_len,
        )[0]
        start = 0
        for seq, q in zip(seqs, q_lens):
            k, v = self.dense[seq]
            k, v = torch.cat([k, key[start : start + q]]), torch.cat([v, value[start : start + q]])
            self.dense[seq] = (k, v)
            truth = _dense(query[start : start + q], k, v, 0.3)
            assert_close(out[start : start + q], truth, name=f"{seq} output")
            start += q
        assert torch.equal(out[start:], torch.zeros_like(out[start:]))  # padding token rows
        return md


def _addresses(md) -> list[int]:
    return [t.data_ptr() for t in md.tensors()]


def test_decode_bucket_buffers_are_static_and_padded():
    w = World(seed=0)
    w.start("a", 13)
    w.start("b", 1)
    w.fork("a", "c")  # shares a's first block, copies its partial second block
    live = ["a", "b", "c"]
    first = w.step(live, [1, 1, 1])
    addresses = _addresses(first)
    assert first.block_table.shape == (4, MB) and first.slot_mapping.shape == (4,)
    # torch.compile reads them in place (reduce-overhead copies no input before a replay)
    assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded" for t in first.tensors())
    for step in range(24):
        if step == 10:  # b finishes; d takes its place in the bucket
            w.alloc.free("b")
            w.start("d", 5)
            live = ["a", "d", "c"]
        md = w.step(live, [1, 1, 1])
        assert md is first and _addresses(md) == addresses
        lens = [w.alloc.seq_len(s) for s in live]
        assert md.seq_lens.tolist() == lens + [0]
        assert md.query_start_loc.tolist() == [0, 1, 2, 3, 3]
        assert md.slot_mapping[3].item() == -1
        assert md.positions.tolist() == [n - 1 for n in lens] + [0]
        for i, s in enumerate(live):
            blocks = w.alloc.block_table(s)
            assert md.block_table[i, : len(blocks)].tolist() == blocks
            assert md.slot_mapping[i].item() == w.alloc.slots(s, lens[i] - 1, lens[i])[0]
    assert w.alloc.block_table("a")[0] == w.alloc.block_table("c")[0]  # still shared


def test_chunked_prefill_step():
    w = World(seed=1)
    w.start("a", 9)
    w.start("b", 16)
    # 5 and 1 new tokens in a bucket of 2 sequences and 8 token rows (2 padding tokens)
    md = w.step(["a", "b"], [5, 1], num_tokens=8)
    assert md.query_start_loc.tolist() == [0, 5, 6]
    assert md.seq_lens.tolist() == [14, 17]
    assert md.positions[:6].tolist() == [9, 10, 11, 12, 13, 16]
    assert md.slot_mapping[6:].tolist() == [-1, -1]
    assert md.max_query_len == 5


def test_bucket_choice_and_limits():
    alloc = BlockAllocator(NB, BS)
    builder = MetadataBuilder(alloc, 2, batch_buckets=[4, 2])
    assert [builder.bucket(n) for n in (1, 2, 3, 4)] == [2, 2, 4, 4]
    with pytest.raises(ValueError, match="largest batch bucket 4"):
        builder.bucket(5)
    alloc.allocate("long", 3 * BS)
    with pytest.raises(ValueError, match="max_blocks_per_seq=2"):
        builder.build(["long"])
    alloc.allocate("short", 2)
    with pytest.raises(ValueError, match="cannot have 3 new ones"):
        builder.build(["short"], 3)


def test_docstring_example_runs():
    import doctest

    import torch_paged_attn.metadata as module

    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
