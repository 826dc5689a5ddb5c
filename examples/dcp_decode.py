"""Decode context parallelism on 2 ranks: each rank stores half of every sequence's KV cache,
and the sharded decode equals single-process attention over the whole cache.

    python examples/dcp_decode.py                  # 2 CPU processes over gloo
    python examples/dcp_decode.py --device cuda    # 2 GPUs over NCCL

Prints the largest difference from the single-process result and OK.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import set_cpu_threads  # noqa: E402

import torch_paged_attn as pa  # noqa: E402
from torch_paged_attn import distributed as dcp_lib  # noqa: E402

WORLD, BS = 2, 16  # ranks; block size of each rank's cache (the scheduler's blocks hold WORLD * BS)


def run(rank: int, port: int, device_type: str) -> None:
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    set_cpu_threads(device, processes=WORLD)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    dcp = dcp_lib.DCPGroup.from_group(interleave=1)  # token j lives on rank j % 2

    # The scheduler's view, the same on every rank: 3 sequences, 6 blocks of WORLD * BS tokens.
    g = torch.Generator().manual_seed(0)
    block_table = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    seq_lens = torch.tensor([40, 1, 0], dtype=torch.int32)
    query_start_loc = torch.arange(4, dtype=torch.int32)
    query = torch.randn(3, 8, 64, generator=g)
    key_cache = torch.randn(6, WORLD * BS, 2, 64, generator=g)  # what one GPU would hold
    value_cache = torch.randn(6, WORLD * BS, 2, 64, generator=g)

    # Each rank keeps its half of the tokens and derives its metadata (tensor ops, no host sync).
    local_k = dcp_lib.shard_cache(key_cache, rank, WORLD, dcp.interleave).to(device)
    local_v = dcp_lib.shard_cache(value_cache, rank, WORLD, dcp.interleave).to(device)
    meta = dcp_lib.local_metadata(block_table.to(device), seq_lens.to(device), query_start_loc.to(device),
                                  num_tokens=3, dcp=dcp, block_size=BS)
    out, lse = dcp_lib.dcp_paged_attention(query.to(device), local_k, local_v, meta, dcp, scale=0.125)

    want, want_lse = pa.paged_attention(query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
                                        scale=0.125, return_lse=True)
    err = (out.cpu() - want).abs().max().item()
    ok = err < 1e-4 and torch.equal(lse.cpu().isinf(), want_lse.isinf())
    if rank == 0:
        print(f"max |sharded - single| = {err:.2e}  {'OK' if ok else 'MISMATCH'}")
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, args.device), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
