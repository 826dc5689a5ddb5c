"""Where an eager Gluon MLA call spends its time (B64 x 4096 H128, B1 x 32768 H128): host time
of a call (perf_counter over 50 calls, no sync between), GPU time per call (events, synced), and
the parts of the launch (the TMA descriptor, the kernel launch itself)."""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import mla_decode as M  # noqa: E402
import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn.lowering.triton import _sm90, mla_sm90  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpk  # noqa: E402

dev = torch.device("cuda")


def host_us(fn, n=50):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    h = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return h


def gpu_us(fn, n=30):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


for s in (M.Shape("B64_ctx4096_H128", 64, 4096, 128), M.Shape("B1_ctx32768_H128", 1, 32768, 128)):
    x = M.make_inputs(s, dev, 0)
    sc = M._scale(s)
    T = x.q_latent.shape[0]
    out = torch.empty(T, s.num_heads, s.latent, dtype=s.dtype, device=dev)
    lse = torch.empty(T, s.num_heads, device=dev)
    op = lambda: tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=None)
    direct = lambda: mla_sm90.launch(*x.args(), out, lse, sc, True, tpk._NO_SPLIT)
    desc = lambda: _sm90.descriptor(x.kv_cache, 64)
    print(f"{s.name}: op host {host_us(op):.1f} us, GPU (events, synced) {gpu_us(op):.1f} us; "
          f"direct launch host {host_us(direct):.1f} us, GPU {gpu_us(direct):.1f} us; "
          f"descriptor host {host_us(desc):.1f} us", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            op()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12), flush=True)
