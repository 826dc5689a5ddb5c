"""Decode context parallelism: 2-rank sharded paged decode against 1-rank decode over the whole cache.

    python benchmarks/dcp_decode.py [--shapes decode_B8*] [--quick] [--out DIR]     # needs 2 GPUs
    python benchmarks/dcp_decode.py --device cpu --tiny --quick                      # smoke run, gloo

Spawns 2 ranks (NCCL on GPUs 0 and 1; gloo on CPU). Rank 0 measures the copy bandwidth, then for
each shape (Llama-3-70B-like decode: Hq 32 / Hkv 8, D 128, bf16, block 16):

    1 rank                  paged_attention over the whole cache on GPU 0
    2 ranks (reduce)        dcp_paged_attention, interleave 1: local attention over half the
                            tokens, LSE all-gather, rescale, all-reduce (vLLM's DCP combine)
    2 ranks (gather)        the same with method="gather": outputs all-gathered and merged by
                            merge_attn_states_n (the same bits on every rank)

Bytes (``cache_bytes``): the whole cache a decode step reads, ``B * ctx * Hkv * (D + Dv) * 2``,
for every row, so GB/s compares wall time directly (2 ranks read half each: the ideal is 2x the
1-rank GB/s). Timing on GPUs: each contender's call captured ``CALLS_PER_GRAPH`` times in one CUDA
graph (collectives included, the same count on both ranks so that they pair up), the graph
replayed back to back, CUDA events around each replay: what a serving engine's captured decode
step costs, without the host. The ``eager`` rows time the plain calls with CUDA events (L2
flushed before each call): on a fast GPU these measure the host's launch rate, not the GPU. Every
cache here is many times the L2, so replays do not hit it. Median of 30 samples (5 with
--quick); rank 0's figures are reported. Each contender's output is checked against the 1-rank
output (``max_err``). JSON rows go to ``<out>/dcp_decode-<gpu>-<date>.json``.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import distributed as dcp_lib  # noqa: E402

RESULTS = os.path.join(HERE, "results")
WORLD = 2
CALLS_PER_GRAPH = 10


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    seq_len: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16  # of each rank's cache; the 1-rank cache uses WORLD * block_size
    dtype: torch.dtype = torch.bfloat16


SHAPES = [
    Shape("decode_B8_ctx131072", batch=8, seq_len=131072),
    Shape("decode_B8_ctx32768", batch=8, seq_len=32768),
    Shape("decode_B64_ctx16384", batch=64, seq_len=16384),
]


def tiny(s: Shape) -> Shape:
    """A stand-in of the same name, small enough for the reference backend on a CPU."""
    return replace(s, batch=min(s.batch, 3), seq_len=max(s.seq_len // 512, 40), num_heads=8, num_kv_heads=2,
                   head_size=32, dtype=torch.float32)


def cache_bytes(s: Shape) -> tuple[int, str]:
    esize = torch.empty(0, dtype=s.dtype).element_size()
    return s.batch * s.seq_len * s.num_kv_heads * 2 * s.head_size * esize, "B * ctx * Hkv * (D + Dv) * 2 bytes"


def _inputs(s: Shape, device: torch.device):
    """The global (1-rank) inputs, built identically on every rank, and this rank's shard."""
    g = torch.Generator().manual_seed(0)
    virtual = WORLD * s.block_size
    blocks_per_seq = -(-s.seq_len // virtual)
    num_blocks = s.batch * blocks_per_seq
    table = torch.randperm(num_blocks, generator=g).reshape(s.batch, blocks_per_seq).to(torch.int32)
    shape = (num_blocks, virtual, s.num_kv_heads, s.head_size)
    # seeded generators on the cache's device: every rank must build the same global cache
    gd = torch.Generator(device).manual_seed(1)
    kc = torch.randn(shape, dtype=s.dtype, device=device, generator=gd)
    vc = torch.randn(shape, dtype=s.dtype, device=device, generator=gd)
    query = torch.randn(s.batch, s.num_heads, s.head_size, generator=g).to(s.dtype).to(device)
    seq_lens = torch.full((s.batch,), s.seq_len, dtype=torch.int32, device=device)
    qsl = torch.arange(s.batch + 1, dtype=torch.int32, device=device)
    return query, kc, vc, table.to(device), seq_lens, qsl


def _row(s: Shape, provider: str, t: H.Timing | None, copy_gbps: float, out, want, reason: str = "") -> H.Row:
    nbytes, formula = cache_bytes(s)
    row = H.Row(shape=s.name, provider=provider, dtype=str(s.dtype).replace("torch.", ""), bytes=nbytes,
                bytes_formula=formula)
    if t is None:
        row.status, row.reason = "n/a", reason
        return row
    row.extra["max_err"] = float((out.float() - want.float()).abs().max())
    return row.fill(t, copy_gbps)


def _time_graph(fn, device: torch.device, quick: bool) -> H.Timing:
    """``fn`` captured ``CALLS_PER_GRAPH`` times in one CUDA graph, replays timed by CUDA events.
    The warm-up and the capture issue the same collectives on every rank in the same order."""
    stream = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    stream.wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    samples = 5 if quick else 30
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize(device)
    del graph
    times = [a.elapsed_time(b) * 1e3 / CALLS_PER_GRAPH for a, b in zip(starts, ends)]
    return H._timing(times, "cuda-graph", CALLS_PER_GRAPH, 1)


def _timings(fn, device: torch.device, quick: bool) -> list[tuple[str, H.Timing]]:
    """(suffix, timing) of ``fn``: graph replay and eager on GPUs, wall time on CPUs."""
    if device.type != "cuda":
        return [("", H.bench([fn], device, quick=quick, use_graph=False))]
    return [("", _time_graph(fn, device, quick)), (", eager", H.bench([fn], device, quick=quick, use_graph=False))]


def _run_shape(s: Shape, device: torch.device, rank: int, copy_gbps: float, quick: bool) -> list[H.Row]:
    query, kc, vc, table, seq_lens, qsl = _inputs(s, device)
    scale = s.head_size**-0.5
    rows = []
    # -- 1 rank: rank 0 alone over the whole cache (rank 1 waits at the barrier) --
    want = None
    if rank == 0:
        def single():
            return tpa.paged_attention(query, kc, vc, table, seq_lens, qsl, scale=scale, max_query_len=1)[0]

        want = single()
        for suffix, t in _timings(single, device, quick):
            rows.append(_row(s, f"1 rank{suffix}", t, copy_gbps, want, want))
    dist.barrier()
    # -- 2 ranks: each rank's half of the cache, then the exact combine --
    dcp = dcp_lib.DCPGroup.from_group()
    local_k = dcp_lib.shard_cache(kc, rank, WORLD, dcp.interleave)
    local_v = dcp_lib.shard_cache(vc, rank, WORLD, dcp.interleave)
    del kc, vc  # the shards are copies: free the global cache before timing
    meta = dcp_lib.local_metadata(table, seq_lens, qsl, s.batch, dcp, block_size=s.block_size)
    for method in ("reduce", "gather"):
        def sharded():
            return dcp_lib.dcp_paged_attention(query, local_k, local_v, meta, dcp, scale=scale, method=method)[0]

        out = sharded()
        for suffix, t in _timings(sharded, device, quick):
            if rank == 0:
                rows.append(_row(s, f"{WORLD} ranks ({method}){suffix}", t, copy_gbps, out, want))
    return rows


def _worker(rank: int, port: int, argv: list[str] | None) -> None:
    args, device, shapes = H.parse_cli(__doc__.splitlines()[0], SHAPES, tiny, "decode_B8*", RESULTS, argv)
    if device.type == "cuda":
        device = H.resolve_device(f"cuda:{rank}")
    else:
        torch.set_num_threads(1)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        meta = H.device_info(device)
        meta.update(world_size=WORLD, backend=backend, args=vars(args))
        copy_gbps, copy_t = H.copy_bandwidth(device, quick=args.quick)
        meta.update(copy_gbps=copy_gbps, copy_us=copy_t.p50_us)
        if rank == 0:
            H.progress(f"device: {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  {backend} x {WORLD}")
            print(f"copy bandwidth: {copy_gbps:.0f} GB/s (read + write, median of {copy_t.samples})")
        path = H.json_path("dcp_decode", meta, args.out) if rank == 0 else ""
        rows: list[H.Row] = []
        for s in shapes:
            if rank == 0:
                H.progress(f"{s.name} ...")
            rows.extend(_run_shape(s, device, rank, copy_gbps, args.quick))
            if rank == 0:
                H.write_json(path, "dcp_decode", rows, meta)
        if rank == 0:
            H.print_table(rows, f"DCP decode ({meta['gpu']}, {backend} x {WORLD}, copy {copy_gbps:.0f} GB/s)")
            print(f"\nJSON: {path}")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args, device, _ = H.parse_cli(__doc__.splitlines()[0], SHAPES, tiny, "decode_B8*", RESULTS, argv)
    if device.type == "cuda" and torch.cuda.device_count() < WORLD:
        print(f"dcp_decode: needs {WORLD} CUDA devices, found {torch.cuda.device_count()}", file=sys.stderr)
        return 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(port, argv if argv is not None else sys.argv[1:]), nprocs=WORLD, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
