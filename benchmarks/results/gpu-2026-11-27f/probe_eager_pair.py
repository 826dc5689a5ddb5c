"""Eager calls of the ``flash`` backend and of FlashAttention-4 called directly, decode B8 x 8192
Hq64 (``paged_attention.py``'s shape, whose eager paired ratio missed issue 17's 0.97x three runs
running while the sequential one was 1.9x): where each sample's time goes.

Per call of each contender: its host time (``perf_counter`` around the call, the GPU idle before
it) and its GPU span (CUDA events, the L2 flushed before it, a 256 MiB memset), timed four ways:
  seq        ``_harness.bench``'s eager samples (no synchronisation between samples),
  seq-sync   the same with the device synchronised before each sample's flush,
  pair       ``_harness.bench_pair(use_graph=False)`` (the two alternated, no synchronisation),
  pair-sync  the same with the device synchronised before each sample's flush.
Printed: median and p20-p80 of each side's GPU span and host time, and the paired ratio."""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import _harness as H  # noqa: E402
import paged_attention as B  # noqa: E402

device = torch.device("cuda")
shape = next(s for s in B.SHAPES if s.name == "decode_B8_ctx8192_Hq64")
nbytes, _ = B.attention_bytes(shape)
copies = [B.paged_inputs(shape, device, seed) for seed in range(H.rotations(nbytes, device))]
sides = {"flash backend": B.ATTENTION["torch_paged_attn[flash]"](shape, copies, device),
         "FA4 direct": B.ATTENTION["flash_attn_4"](shape, copies, device)}
names = list(sides)
fns = [sides[n].fns for n in names]
for f in fns:
    for g in f:
        g()
torch.cuda.synchronize()
flush = torch.empty(H.FLUSH_BYTES, dtype=torch.uint8, device=device)


def q(xs):
    xs = sorted(xs)
    return f"{statistics.median(xs):7.1f} ({H.percentile(xs, 20):6.1f}-{H.percentile(xs, 80):6.1f})"


def samples(order, rounds, sync):
    """order(k) -> the sides of round k; each sample: [sync], flush, start, call, end."""
    gpu = {i: [] for i in range(2)}
    host = {i: [] for i in range(2)}
    ev = []
    for k in range(rounds):
        for i in order(k):
            if sync:
                torch.cuda.synchronize()
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            t0 = time.perf_counter()
            fns[i][k % len(fns[i])]()
            host[i].append((time.perf_counter() - t0) * 1e6)
            e.record()
            ev.append((i, s, e))
    torch.cuda.synchronize()
    for i, s, e in ev:
        gpu[i].append(s.elapsed_time(e) * 1e3)
    return gpu, host


def idle_host(i, n=60):
    xs = []
    for k in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fns[i][k % len(fns[i])]()
        xs.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return xs


for rep in range(2):
    print(f"-- repetition {rep}")
    for i in range(2):
        print(f"{names[i]:14s} host time, GPU idle before: {q(idle_host(i))} us")
    for label, sync in (("seq", False), ("seq-sync", True)):
        for i in range(2):
            gpu, host = samples(lambda k, i=i: (i,), 60, sync)
            print(f"{label:10s} {names[i]:14s} gpu {q(gpu[i])}  host {q(host[i])}")
    for label, sync in (("pair", False), ("pair-sync", True)):
        gpu, host = samples(lambda k: (0, 1) if k % 2 == 0 else (1, 0), 60, sync)
        ratios = [b / a for a, b in zip(gpu[0], gpu[1])]
        for i in range(2):
            print(f"{label:10s} {names[i]:14s} gpu {q(gpu[i])}  host {q(host[i])}")
        print(f"{label:10s} ratio FA4 / flash backend {q(ratios)}")
    r = H.bench_pair(fns[0], fns[1], device, use_graph=False)
    print(f"bench_pair eager (the benchmark's): ratio {r['ratio_p50']:.3f} ({r['ratio_p20']:.3f}-{r['ratio_p80']:.3f}),"
          f" flash backend {r['a_us']:.1f} us, FA4 direct {r['b_us']:.1f} us")
