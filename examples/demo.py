"""Paged decode over a few sequences, checked against dense attention.

Writes each sequence's prompt keys/values into a shared paged cache with ``reshape_and_cache``
(blocks scattered across the cache, as an allocator leaves them), then runs decode steps: each
step appends one token per sequence and attends with ``paged_attention``. Every step's output is
compared with ``torch.nn.functional.scaled_dot_product_attention`` over the same keys kept
densely per sequence. Runs on the GPU when there is one (Triton backend), else on the CPU
(reference backend).

    python examples/demo.py [--steps 8] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import positive_int, set_cpu_threads  # noqa: E402

import torch_paged_attn as pa  # noqa: E402


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One decode token ``q [Hq, D]`` over ``k, v [n, Hkv, D]`` with GQA, in float32."""
    group = q.shape[0] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
    v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    return F.scaled_dot_product_attention(q.float()[:, None], k, v)[:, 0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    set_cpu_threads(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prompt_lens = [37, 5, 120, 64]
    num_heads, num_kv_heads, head_size, block_size = 8, 2, 64, 16
    max_len = max(prompt_lens) + args.steps
    max_blocks = math.ceil(max_len / block_size)
    num_seqs = len(prompt_lens)
    num_blocks = num_seqs * max_blocks + 5
    g = torch.Generator().manual_seed(0)

    # A shared cache and a block table whose blocks are scattered over it.
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, generator=g).to(device, dtype)
    value_cache = torch.randn_like(key_cache)
    perm = torch.randperm(num_blocks, generator=g)[: num_seqs * max_blocks]
    block_table = perm.view(num_seqs, max_blocks).to(device, torch.int32)
    print(f"torch_paged_attn demo on {device} ({dtype}): {num_seqs} sequences, prompts {prompt_lens}, "
          f"{num_heads} query / {num_kv_heads} kv heads, head size {head_size}, block size {block_size}")

    def slots(seq: int, positions: torch.Tensor) -> torch.Tensor:
        blocks = block_table[seq].long()[positions // block_size]
        return blocks * block_size + positions % block_size

    # Prefill the cache: every prompt token's key/value through one reshape_and_cache call.
    dense_k = [torch.randn(n, num_kv_heads, head_size, generator=g).to(device, dtype) for n in prompt_lens]
    dense_v = [torch.randn(n, num_kv_heads, head_size, generator=g).to(device, dtype) for n in prompt_lens]
    slot_mapping = torch.cat([slots(i, torch.arange(n, device=device)) for i, n in enumerate(prompt_lens)])
    pa.reshape_and_cache(torch.cat(dense_k), torch.cat(dense_v), key_cache, value_cache, slot_mapping)
    print(f"cached {sum(prompt_lens)} prompt tokens into {num_blocks} blocks")

    lens = list(prompt_lens)
    worst = 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        # One new token per sequence: write its key/value, then attend over the whole sequence.
        k_new = torch.randn(num_seqs, num_kv_heads, head_size, generator=g).to(device, dtype)
        v_new = torch.randn(num_seqs, num_kv_heads, head_size, generator=g).to(device, dtype)
        q = torch.randn(num_seqs, num_heads, head_size, generator=g).to(device, dtype)
        new_slots = torch.stack([slots(i, torch.tensor([n], device=device))[0] for i, n in enumerate(lens)])
        pa.reshape_and_cache(k_new, v_new, key_cache, value_cache, new_slots)
        for i in range(num_seqs):
            dense_k[i] = torch.cat([dense_k[i], k_new[i : i + 1]])
            dense_v[i] = torch.cat([dense_v[i], v_new[i : i + 1]])
        lens = [n + 1 for n in lens]
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
        out, lse = pa.paged_attention(
            q, key_cache, value_cache, block_table, seq_lens, query_start_loc, max_query_len=1, return_lse=True
        )
        expected = torch.stack([dense_attention(q[i], dense_k[i], dense_v[i]) for i in range(num_seqs)])
        err = (out.float() - expected).abs().max().item()
        worst = max(worst, err)
        print(f"step {step + 1}/{args.steps}: seq_lens {lens}, max |out - dense| = {err:.2e}", flush=True)
    elapsed = time.perf_counter() - start
    budget = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ok = worst <= budget and bool(torch.isfinite(lse).all())
    print(f"{args.steps} decode steps in {elapsed * 1e3:.1f} ms; worst error {worst:.2e} "
          f"(budget {budget:.0e}): {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
