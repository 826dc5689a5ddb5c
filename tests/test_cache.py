"""``BlockAllocator`` and ``PagedKVCache`` (issue 5).

The allocator runs random programs of allocate / append / fork / free (hypothesis state machine,
at least 10,000 operations in all) against a shadow model of what every sequence has written:
each append writes a unique token id into the slots it gets, a fork copies the partial block the
allocator names, and after every operation every live sequence must read back exactly its own
history from the shadow cache. Also checked after every operation: reference counts equal the
number of live tables holding a block, free and used blocks partition the pool, two sequences
share a block only at the same table index, in the full-block part of both, and only when they
descend by forks from a common sequence; an append never returns a slot in a shared block; running out
of blocks raises ``OutOfBlocksError`` and changes nothing. Freeing everything returns every
reference count to zero and every block to the free list.

``PagedKVCache`` writes through ``reshape_and_cache`` (read back bitwise; fp8 against the
quantisation formula) and attends through ``paged_attention`` / ``paged_attention_out`` (against a
float64 softmax over the tokens each sequence wrote).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from torch_paged_attn.cache import BlockAllocator, OutOfBlocksError, PagedKVCache
from torch_paged_attn.testing import assert_close

NUM_BLOCKS, BLOCK_SIZE = 24, 4
TOTAL_OPERATIONS = 10_000


def _snapshot(a: BlockAllocator) -> tuple:
    return (
        a.free_blocks(),
        [a.ref_count(b) for b in range(a.num_blocks)],
        {s: (a.block_table(s), a.seq_len(s)) for s in a.sequences()},
    )


class AllocatorMachine(RuleBasedStateMachine):
    operations = 0  # across all runs of the machine
    out_of_blocks = 0  # operations refused for lack of blocks

    def __init__(self):
        super().__init__()
        self.a = BlockAllocator(NUM_BLOCKS, BLOCK_SIZE)
        self.cache: dict[int, int] = {}  # slot -> token id last written there
        self.history: dict[int, list[int]] = {}  # seq -> token ids of its positions
        self.lineage: dict[int, set[int]] = {}  # seq -> itself and the sequences it was forked from
        self.next_seq = 0
        self.next_token = 0

    # -- helpers --------------------------------------------------------------------------------

    def _write(self, seq: int, slots: list[int]) -> None:
        for slot in slots:
            block = slot // BLOCK_SIZE
            assert self.a.ref_count(block) == 1, f"append wrote into block {block} shared by {self.a.ref_count(block)}"
            self.cache[slot] = self.next_token
            self.history[seq].append(self.next_token)
            self.next_token += 1

    def _expect_out_of_blocks(self, call) -> None:
        AllocatorMachine.out_of_blocks += 1
        before = _snapshot(self.a)
        with pytest.raises(OutOfBlocksError, match=r"needs \d+ free blocks, \d+ of 24 are free"):
            call()
        assert _snapshot(self.a) == before

    def _seqs(self) -> list[int]:
        return sorted(self.history)

    # -- operations -----------------------------------------------------------------------------

    @rule(n=st.integers(0, 3 * BLOCK_SIZE + 1))
    def allocate(self, n):
        AllocatorMachine.operations += 1
        seq = self.next_seq
        if math.ceil(n / BLOCK_SIZE) > self.a.num_free_blocks:
            self._expect_out_of_blocks(lambda: self.a.allocate(seq, n))
            return
        self.next_seq += 1
        blocks = self.a.allocate(seq, n)
        assert len(blocks) == math.ceil(n / BLOCK_SIZE)
        self.history[seq], self.lineage[seq] = [], {seq}
        # a prefill: the first n positions get written
        start = self.next_token
        self._write(seq, self.a.slots(seq, 0, n))
        assert self.next_token == start + n

    @precondition(lambda self: self.history)
    @rule(data=st.data(), n=st.integers(0, 2 * BLOCK_SIZE + 1))
    def append(self, data, n):
        AllocatorMachine.operations += 1
        seq = data.draw(st.sampled_from(self._seqs()))
        old = self.a.seq_len(seq)
        need = math.ceil((old + n) / BLOCK_SIZE) - math.ceil(old / BLOCK_SIZE)
        if need > self.a.num_free_blocks:
            self._expect_out_of_blocks(lambda: self.a.append(seq, n))
            return
        slots = self.a.append(seq, n)
        assert len(slots) == n and self.a.seq_len(seq) == old + n
        self._write(seq, slots)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def fork(self, data):
        AllocatorMachine.operations += 1
        parent = data.draw(st.sampled_from(self._seqs()))
        child = self.next_seq
        partial = self.a.seq_len(parent) % BLOCK_SIZE != 0
        if partial and self.a.num_free_blocks == 0:
            self._expect_out_of_blocks(lambda: self.a.fork(parent, child))
            return
        self.next_seq += 1
        copy = self.a.fork(parent, child)
        assert (copy is not None) == partial
        if copy is not None:  # the caller's part of a fork: copy the partial block's tokens
            src, dst = copy
            assert self.a.ref_count(dst) == 1 and self.a.block_table(parent)[-1] == src
            for off in range(self.a.seq_len(parent) % BLOCK_SIZE):
                self.cache[dst * BLOCK_SIZE + off] = self.cache[src * BLOCK_SIZE + off]
        self.history[child] = list(self.history[parent])
        self.lineage[child] = self.lineage[parent] | {child}

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def free(self, data):
        AllocatorMachine.operations += 1
        seq = data.draw(st.sampled_from(self._seqs()))
        self.a.free(seq)
        del self.history[seq]

    @rule()
    def unknown_sequence(self):
        before = _snapshot(self.a)
        with pytest.raises(KeyError, match="unknown sequence"):
            self.a.append(-1)
        assert _snapshot(self.a) == before

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq, tokens in self.history.items():
            assert self.a.seq_len(seq) == len(tokens)
            assert len(self.a.block_table(seq)) == math.ceil(len(tokens) / BLOCK_SIZE)
            got = [self.cache.get(s) for s in self.a.slots(seq, 0, len(tokens))]
            assert got == tokens, f"sequence {seq} reads back other tokens"

    @invariant()
    def counts_and_partition(self):
        holders: dict[int, list[tuple[int, int]]] = {}
        for seq in self.history:
            for k, b in enumerate(self.a.block_table(seq)):
                holders.setdefault(b, []).append((seq, k))
        free = self.a.free_blocks()
        assert len(set(free)) == len(free), "a block is free twice"
        assert set(free).isdisjoint(holders), "a free block is held by a sequence"
        assert set(free) | set(holders) == set(range(NUM_BLOCKS)), "a block leaked"
        for b in range(NUM_BLOCKS):
            assert self.a.ref_count(b) == len(holders.get(b, [])), f"block {b}"
        for b, owners in holders.items():
            if len(owners) < 2:
                continue
            (s0, k0) = owners[0]
            for s, k in owners[1:]:
                assert k == k0, f"block {b} at different table indexes"
                assert s in self.lineage and s0 in self.lineage
                assert self.lineage[s] & self.lineage[s0], f"block {b} shared without a common fork ancestor"
                for seq in (s, s0):
                    assert k < self.a.seq_len(seq) // BLOCK_SIZE, f"partial block {b} shared"

    def teardown(self):
        for seq in self._seqs():
            self.a.free(seq)
        assert self.a.num_free_blocks == NUM_BLOCKS
        assert sorted(self.a.free_blocks()) == list(range(NUM_BLOCKS))
        assert all(self.a.ref_count(b) == 0 for b in range(NUM_BLOCKS))
        assert self.a.sequences() == []


def test_allocator_random_programs():
    AllocatorMachine.operations = AllocatorMachine.out_of_blocks = 0
    run_state_machine_as_test(
        AllocatorMachine,
        settings=settings(
            max_examples=350,  # ~20,000 operations: a margin over 10,000 on a loaded machine
            stateful_step_count=100,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"{AllocatorMachine.operations} operations")
    assert AllocatorMachine.operations >= TOTAL_OPERATIONS, AllocatorMachine.operations
    assert AllocatorMachine.out_of_blocks > 0  # the refusal path ran too


def test_out_of_blocks_message_and_state():
    a = BlockAllocator(num_blocks=3, block_size=16)
    a.allocate("a", 33)  # 3 blocks
    before = _snapshot(a)
    with pytest.raises(OutOfBlocksError) as info:
        a.append("a", 16)
    assert isinstance(info.value, RuntimeError)
    assert "needs 1 free blocks, 0 of 3 are free" in str(info.value)
    assert (info.value.needed, info.value.free, info.value.num_blocks) == (1, 0, 3)
    assert _snapshot(a) == before
    a.append("a", 15)  # fills the last block exactly: no new block needed
    assert a.seq_len("a") == 48
    assert a.fork("a", "b") is None  # all blocks full: shared, nothing to copy
    assert [a.ref_count(b) for b in range(3)] == [2, 2, 2]


def test_bad_arguments():
    a = BlockAllocator(num_blocks=4, block_size=8)
    a.allocate(0, 3)
    with pytest.raises(ValueError, match="already exists"):
        a.allocate(0)
    with pytest.raises(ValueError, match="already exists"):
        a.fork(0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        a.append(0, -1)
    with pytest.raises(ValueError, match="outside"):
        a.slots(0, 0, 4)
    with pytest.raises(KeyError, match="unknown sequence 7"):
        a.free(7)


# -- PagedKVCache --------------------------------------------------------------------------------


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 causal attention of the last ``len(q)`` positions over ``k, v [n, Hkv, D]`` (GQA)."""
    n, group = k.shape[0], q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for t in range(q.shape[0]):
        p = n - q.shape[0] + t
        s = torch.einsum("hd,nhd->hn", q[t].double(), k[: p + 1]) * scale
        out[t] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v[: p + 1])
    return out


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn], ids=lambda d: str(d)[6:]
)
def test_paged_kv_cache_write_attend_fork(dtype):
    g = torch.Generator().manual_seed(5)
    qdtype = torch.float32 if dtype in (torch.float32, torch.float8_e4m3fn) else dtype
    layers, nb, bs, hkv, hq, d = 2, 12, 16, 2, 4, 32
    cache = PagedKVCache(layers, nb, bs, hkv, d, dtype=dtype, k_scale=0.5, v_scale=0.25)
    names = {n for n, _ in cache.named_buffers()}
    assert {"key_cache_0", "value_cache_1"} <= names
    assert ("k_scale_1" in names) == (dtype == torch.float8_e4m3fn)
    assert cache.key_cache(1).shape == (nb, bs, hkv, d) and cache.key_cache(1).dtype == dtype

    a = BlockAllocator(nb, bs)
    a.allocate("p", 0)
    slots = torch.tensor(a.append("p", 21))
    kv = {}
    for layer in range(layers):
        k = torch.randn(21, hkv, d, generator=g).to(qdtype)
        v = torch.randn(21, hkv, d, generator=g).to(qdtype)
        cache.write(layer, k, v, slots)
        kv[layer] = (k, v)
        stored = cache.key_cache(layer).view(-1, hkv, d)[slots]
        if dtype == torch.float8_e4m3fn:
            want = (k.float() / 0.5).clamp(-448, 448).to(dtype)
            assert torch.equal(stored.view(torch.uint8), want.view(torch.uint8))
        else:
            assert torch.equal(stored, k.to(dtype))

    # the fork shares block 0 and copies the 5 tokens of block 1
    src, dst = a.fork("p", "c")
    cache.copy_blocks([(src, dst)])
    assert a.block_table("c")[0] == a.block_table("p")[0]
    table = torch.tensor([a.block_table("p"), a.block_table("c")], dtype=torch.int32)
    lens = torch.tensor([21, 21], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 4], dtype=torch.int32)  # 3 queries (positions 18..20), then 1
    for layer in range(layers):
        q = torch.randn(4, hq, d, generator=g).to(qdtype)
        k, v = kv[layer]
        if dtype == torch.float8_e4m3fn:  # what the cache holds, dequantised
            k = (k.float() / 0.5).clamp(-448, 448).to(dtype).float() * 0.5
            v = (v.float() / 0.25).clamp(-448, 448).to(dtype).float() * 0.25
        out = cache.attend(layer, q, table, lens, qsl, scale=0.2)
        into = torch.full_like(out, float("nan"))
        cache.attend(layer, q, table, lens, qsl, scale=0.2, out=into)
        truth = torch.cat([_dense_attention(q[:3], k, v, 0.2), _dense_attention(q[3:], k, v, 0.2)])
        assert_close(out, truth, dtype=qdtype)
        assert torch.equal(into, out)


def test_paged_kv_cache_rejects_bad_dtype():
    with pytest.raises(TypeError, match="dtype"):
        PagedKVCache(1, 4, 16, 2, 32, dtype=torch.int8)


def test_docstring_examples_run():
    import doctest

    import torch_paged_attn.cache as module

    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
