"""Decode context parallelism (``torch_paged_attn.distributed``) against single-process attention.

The truth is one process attending over the whole (global) cache: ``paged_attention`` /
``mla_decode`` with the global batch description over a cache of block size ``W * BS``. Each
rank gets ``shard_cache`` of that cache and ``local_metadata`` of that description and must
reproduce the global ``(out, lse)`` to float32 rounding (the combine reassociates the softmax
sums), with -inf LSE rows (no visible key) exactly where the truth has them and no NaN (global
cache slots no sequence covers hold NaN; so do padding query rows).

Tiers:
- layout and metadata, in-process: ``local_seq_lens`` against a loop over positions, and new
  tokens written with ``local_slot_mapping`` land where ``shard_cache`` puts them;
- CPU collectives: gloo, 4 ranks spawned with ``torch.multiprocessing``, DCP groups of 4 and
  of 2 (two 2-rank subgroups of the 4), interleave 1 and a whole block, decode and speculative (several query tokens) batches with
  sequences of 0, 1 and fewer keys than ranks, paged attention (with sinks, heads replicated or
  sharded) and ``mla_decode`` (heads all-gathered, reduce-scattered back), both combine methods;
  and ``torch.compile(fullgraph=True)`` of a whole sharded decode step (cache write + attention
  + functional collectives) on gloo (AOTAutograd; Inductor on the GPU tier);
- GPU: the same on NCCL with two CUDA devices.

One spawn runs every scenario: starting a rank costs importing torch and the package, ~8 s of
CPU each (2026-11), so 4 ranks on a 2-core machine take ~40 s before the first scenario.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_paged_attn as pa
from torch_paged_attn.distributed import (
    DCPGroup,
    dcp_mla_decode,
    dcp_paged_attention,
    local_metadata,
    local_seq_lens,
    local_slot_mapping,
    shard_cache,
)
from torch_paged_attn.testing import make_block_table, make_paged_batch, random_cache

BS = 16  # block size of each rank's cache
NAN = float("nan")
_TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interleave(kind: str) -> int:
    return {"token": 1, "block": BS}[kind]


# -- layout and metadata (in-process) ---------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("interleave", [1, 4, BS])
def test_local_seq_lens_count_owned_positions(world: int, interleave: int):
    lens = list(range(0, 3 * world * BS + 2))
    for rank in range(world):
        got = local_seq_lens(torch.tensor(lens, dtype=torch.int32), rank, world, interleave)
        want = [sum(1 for j in range(n) if (j // interleave) % world == rank) for n in lens]
        assert got.dtype == torch.int32 and got.tolist() == want


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["token", "block"])
def test_local_slots_write_where_shard_cache_reads(world: int, kind: str):
    """reshape_and_cache with global slots into the global cache, sharded, equals
    reshape_and_cache with each rank's local slots into that rank's (NaN) cache; and the shards
    hold every token exactly once."""
    interleave = _interleave(kind)
    g = torch.Generator().manual_seed(world)
    num_blocks, virtual = 3, world * BS
    num_slots = num_blocks * virtual
    slots = torch.randperm(num_slots, generator=g)[:40]
    slots[::7] = -1  # padding tokens
    key = torch.randn(40, 2, 32, generator=g)
    value = torch.randn(40, 2, 16, generator=g)
    gk = torch.full((num_blocks, virtual, 2, 32), NAN)
    gv = torch.full((num_blocks, virtual, 2, 16), NAN)
    pa.reshape_and_cache(key, value, gk, gv, slots)
    seen = 0
    for rank in range(world):
        lk = torch.full((num_blocks, BS, 2, 32), NAN)
        lv = torch.full((num_blocks, BS, 2, 16), NAN)
        local = local_slot_mapping(slots, BS, rank, world, interleave)
        assert local.dtype == slots.dtype
        pa.reshape_and_cache(key, value, lk, lv, local)
        for got, want in ((lk, shard_cache(gk, rank, world, interleave)), (lv, shard_cache(gv, rank, world, interleave))):
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())
        seen += int((local >= 0).sum())
    assert seen == int((slots >= 0).sum())


def test_local_metadata_rows():
    """Speculative rows: token t of a sequence with q_len 3 and 5 keys sees 3 + t keys; a row
    whose position is negative (q_len > seq_len) and a padding row see none."""
    dcp = DCPGroup(None, 0, 1, 1)  # one rank: local lengths are the rows' global lengths
    meta = local_metadata(
        torch.tensor([[7, 8], [9, 3]], dtype=torch.int32),
        torch.tensor([5, 1], dtype=torch.int32),
        torch.tensor([0, 3, 5], dtype=torch.int32),
        6,
        dcp,
        block_size=BS,
    )
    assert meta.seq_lens.tolist() == [3, 4, 5, 0, 1, 0]
    assert meta.block_table.tolist() == [[7, 8]] * 3 + [[9, 3]] * 3
    assert meta.query_start_loc.tolist() == list(range(7))
    assert meta.slot_mapping is None


# -- scenarios run by every rank ----------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    id: str
    op: str  # "paged" or "mla"
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    interleave: str = "token"
    pad_tokens: int = 0
    shard_heads: bool = False
    method: str = "reduce"
    sinks: bool = False
    causal: bool = True


# kv lengths: 0, 1, fewer than the ranks (2, 3), one virtual block +- 1 (W * BS), several blocks
DECODE_LENS = (0, 1, 3, 2, 31, 33, 64, 65, 150)
SPEC = dict(q_lens=(3, 1, 2, 2), kv_lens=(40, 1, 1, 70))  # q_len 2 over 1 key: a row sees nothing


def scenarios(world: int) -> list[Scenario]:
    ones = tuple(1 for _ in DECODE_LENS)
    out = []
    for kind in ("token", "block"):
        out += [
            Scenario(f"paged_decode_{kind}", "paged", ones, DECODE_LENS, kind, pad_tokens=1),
            Scenario(f"paged_decode_{kind}_gather", "paged", ones, DECODE_LENS, kind, method="gather"),
            Scenario(f"paged_spec_{kind}_sinks", "paged", **SPEC, interleave=kind, sinks=True),
            Scenario(f"paged_decode_{kind}_shard_heads", "paged", ones, DECODE_LENS, kind, shard_heads=True),
            Scenario(f"mla_decode_{kind}", "mla", ones, DECODE_LENS, kind, pad_tokens=1, shard_heads=True),
            Scenario(f"mla_spec_{kind}_gather", "mla", **SPEC, interleave=kind, shard_heads=True, method="gather"),
        ]
    out += [
        Scenario("paged_noncausal_spec_block_shard_heads_gather", "paged", **SPEC, interleave="block",
                 shard_heads=True, method="gather", causal=False),
        Scenario("mla_decode_token_all_heads", "mla", ones, DECODE_LENS, "token", shard_heads=False),
    ]
    return out


def _heads(x: torch.Tensor, dcp: DCPGroup, shard: bool) -> torch.Tensor:
    """This rank's contiguous chunk of heads (dim 1) when sharding heads, else all of them."""
    if not shard:
        return x
    h = x.shape[1] // dcp.world_size
    return x[:, dcp.rank * h : (dcp.rank + 1) * h].contiguous()


def _paged_case(s: Scenario, dcp: DCPGroup, device: str):
    """(global truth (out, lse), this rank's (out, lse)) of a paged attention scenario."""
    world, interleave = dcp.world_size, _interleave(s.interleave)
    b = make_paged_batch(
        list(s.q_lens), list(s.kv_lens), num_heads=8, num_kv_heads=2, head_size=32, block_size=world * BS,
        pad_tokens=s.pad_tokens, seed=len(s.id),
    )
    sinks = torch.linspace(-1.0, 2.0, 8) if s.sinks else None
    options = dict(scale=0.17, sinks=sinks)
    want = pa.paged_attention(*b.args(), causal=s.causal, return_lse=True, **options)
    meta = local_metadata(
        b.block_table.to(device), b.seq_lens.to(device), b.query_start_loc.to(device), b.query.shape[0], dcp,
        block_size=BS, causal=s.causal,
    )
    kc = shard_cache(b.key_cache, dcp.rank, world, interleave).to(device)
    vc = shard_cache(b.value_cache, dcp.rank, world, interleave).to(device)
    query = _heads(b.query, dcp, s.shard_heads).to(device)
    options["sinks"] = None if sinks is None else sinks.to(device)
    got = dcp_paged_attention(query, kc, vc, meta, dcp, shard_heads=s.shard_heads, method=s.method, **options)
    return want, got


def _mla_case(s: Scenario, dcp: DCPGroup, device: str):
    world, interleave = dcp.world_size, _interleave(s.interleave)
    g = torch.Generator().manual_seed(len(s.id))
    latent, rope, heads = 64, 16, 8
    num_blocks = sum(-(-n // (world * BS)) for n in s.kv_lens) + 2
    table, covered = make_block_table(list(s.kv_lens), world * BS, num_blocks, g)
    cache = random_cache((num_blocks, world * BS, latent + rope), torch.float32, "cpu", g, scale=0.5)
    cache[~covered] = NAN
    num_tokens = sum(s.q_lens) + s.pad_tokens
    q_latent = torch.randn(num_tokens, heads, latent, generator=g)
    q_rope = torch.randn(num_tokens, heads, rope, generator=g)
    seq_lens = torch.tensor(s.kv_lens, dtype=torch.int32)
    qsl = torch.tensor((0, *s.q_lens)).cumsum(0).to(torch.int32)
    want = pa.mla_decode(q_latent, q_rope, cache, table, seq_lens, qsl, scale=0.09)
    meta = local_metadata(table.to(device), seq_lens.to(device), qsl.to(device), num_tokens, dcp, block_size=BS)
    got = dcp_mla_decode(
        _heads(q_latent, dcp, s.shard_heads).to(device), _heads(q_rope, dcp, s.shard_heads).to(device),
        shard_cache(cache, dcp.rank, world, interleave).to(device), meta, dcp, scale=0.09,
        shard_heads=s.shard_heads, method=s.method,
    )
    return want, got


def _check(s: Scenario, dcp: DCPGroup, want, got, tol: float) -> None:
    (want_out, want_lse), (got_out, got_lse) = want, (t.cpu() for t in got)
    want_out = _heads(want_out, dcp, s.shard_heads)
    want_lse = _heads(want_lse, dcp, s.shard_heads)
    where = f"{s.id}, rank {dcp.rank} of {dcp.world_size}"
    assert not got_out.isnan().any() and not got_lse.isnan().any(), f"{where}: NaN"
    assert torch.equal(got_lse.isinf(), want_lse.isinf()), f"{where}: -inf rows differ"
    torch.testing.assert_close(got_out, want_out, rtol=tol, atol=tol, msg=lambda m: f"{where}: out: {m}")
    torch.testing.assert_close(got_lse, want_lse, rtol=tol, atol=tol, msg=lambda m: f"{where}: lse: {m}")


def _compiled_decode_step(dcp: DCPGroup, device: str, tol: float, compile_backend: str) -> None:
    """A whole decode step compiled with fullgraph=True (``compile_backend``: "inductor" or
    "aot_eager", behind a backend that records dynamo's graph): local metadata from the
    global one, the new token's key/value written with the local slots, sharded attention,
    combine (functional collectives in the graph). Against eager and the global truth."""
    world, interleave = dcp.world_size, 1
    kv_lens = [1, 3, 40, 0]
    b = make_paged_batch([1] * 4, kv_lens, num_heads=4, num_kv_heads=2, block_size=world * BS, seed=5)
    g = torch.Generator().manual_seed(6)
    key, value = torch.randn(4, 2, 32, generator=g), torch.randn(4, 2, 32, generator=g)
    virtual = world * BS
    slots = [int(b.block_table[i, (n - 1) // virtual]) * virtual + (n - 1) % virtual if n else -1
             for i, n in enumerate(kv_lens)]
    slot_mapping = torch.tensor(slots)
    gk, gv = b.key_cache.clone(), b.value_cache.clone()
    pa.reshape_and_cache(key, value, gk, gv, slot_mapping)
    want = pa.paged_attention(b.query, gk, gv, *b.args()[3:], scale=0.2, return_lse=True)

    def step(query, key, value, kc, vc, block_table, seq_lens, query_start_loc, slot_mapping):
        meta = local_metadata(
            block_table, seq_lens, query_start_loc, query.shape[0], dcp, block_size=BS, slot_mapping=slot_mapping
        )
        pa.reshape_and_cache(key, value, kc, vc, meta.slot_mapping)
        return dcp_paged_attention(query, kc, vc, meta, dcp, scale=0.2)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(compile_backend)(gm, example_inputs)

    def inputs():
        return [t.to(device) for t in (b.query, key, value)] + [
            shard_cache(c, dcp.rank, world, interleave).to(device) for c in (b.key_cache, b.value_cache)
        ] + [t.to(device) for t in (b.block_table, b.seq_lens, b.query_start_loc, slot_mapping)]

    eager_in, compiled_in = inputs(), inputs()
    eager = step(*eager_in)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)(*compiled_in)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("all_gather_into_tensor" in t for t in targets), targets
    assert any("all_reduce" in t for t in targets), targets
    assert sum("paged_attn.reshape_and_cache" in t for t in targets) == 1, targets
    assert sum("paged_attn.paged_attention" in t for t in targets) == 1, targets
    for i in (3, 4):  # the caches: written bitwise alike
        assert torch.equal(compiled_in[i].cpu().nan_to_num(), eager_in[i].cpu().nan_to_num())
    s = Scenario("compiled_decode_step", "paged", (1,) * 4, tuple(kv_lens))
    _check(s, dcp, want, compiled, tol)
    _check(s, dcp, want, eager, tol)


def _run_scenarios(group: dist.ProcessGroup, device: str, tol: float) -> None:
    for s in scenarios(dist.get_world_size(group)):
        dcp = DCPGroup.from_group(group, interleave=_interleave(s.interleave))
        case = _paged_case if s.op == "paged" else _mla_case
        want, got = case(s, dcp, device)
        _check(s, dcp, want, got, tol)


def _worker(rank: int, world: int, port: int, device_type: str, compile_backend: str) -> None:
    """World 4: every scenario on the whole world, then on two 2-rank subgroups at once (ranks
    {0, 1} and {2, 3}: a DCP group inside a larger job), then the compiled step on those.
    World 2: the scenarios and the compiled step on the whole world."""
    torch.set_num_threads(1)
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = f"cuda:{rank}" if device_type == "cuda" else "cpu"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    # float32 on CPU: rounding only. CUDA: the kernels' own float32 rounding over other key splits.
    tol = 1e-5 if device_type == "cpu" else 2e-4
    try:
        _run_scenarios(dist.group.WORLD, device, tol)
        pair = dist.group.WORLD
        if world == 4:
            pair, _ = dist.new_subgroups(2)
            _run_scenarios(pair, device, tol)
        _compiled_decode_step(DCPGroup.from_group(pair), device, tol, compile_backend)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, device_type: str, compile_backend: str) -> None:
    mp.spawn(_worker, args=(world, _free_port(), device_type, compile_backend), nprocs=world, join=True)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_gloo_world_4_and_2():
    """Gloo, 4 spawned ranks (world sizes 4 and 2). The compiled step runs AOTAutograd without
    Inductor's code generation here: two ranks compiling the reference attention's C++ on a
    2-core CI machine take ~55 s (2026-11), and tests/test_compile_export.py already covers
    Inductor on these ops; what this test adds is the collectives in one fullgraph trace."""
    _spawn(4, "cpu", "aot_eager")


@pytest.mark.skipif(not _TWO_GPUS or _INTERPRET, reason="needs 2 CUDA devices (and TRITON_INTERPRET unset)")
def test_nccl_world_2_and_compiled_step():
    """NCCL, 2 ranks on 2 GPUs (Triton kernels), the compiled step through Inductor."""
    _spawn(2, "cuda", "inductor")
