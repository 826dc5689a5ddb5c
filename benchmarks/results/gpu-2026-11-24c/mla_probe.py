"""The Gluon sm_90 MLA kernel (mla_sm90) against the Triton MLA kernel, B x ctx x H shapes of
benchmarks/mla_decode.py, CUDA-graph replays of 20 calls (median of 15 replays, us a call), with
a few of the kernel's constants changed (consumer registers). Whether the public op ran
the Gluon kernel is counted (its ``prepare`` patched).

    python benchmarks/results/gpu-2026-11-24c/mla_probe.py [--ncu]
"""
import os
import re
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import mla_decode as M  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla, mla_sm90  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as tpa_k  # noqa: E402
import torch_paged_attn as tpa  # noqa: E402

dev = torch.device("cuda")
REGS = mla_sm90.REGS_CONSUMER
calls = []
real_prepare = mla_sm90.prepare
mla_sm90.prepare = lambda **k: calls.append(k) or real_prepare(**k)


def graph_us(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)


def run_shape(s):
    x = M.make_inputs(s, dev, 0)
    sc = M._scale(s)
    flops = M.mla_flops(s)
    T = x.q_latent.shape[0]
    out = torch.empty(T, s.num_heads, s.latent, dtype=s.dtype, device=dev)
    lse = torch.empty(T, s.num_heads, device=dev, dtype=torch.float32)
    res = {}
    tmla.SM90_GLUON = False
    lowering._CHOICES.clear()
    ref = tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale)[0]
    for gl_on in (False, True):
        tmla.SM90_GLUON = gl_on
        lowering._CHOICES.clear()
        calls.clear()
        fn = lambda: tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale)
        us = graph_us(fn)
        res["gluon" if gl_on else "triton"] = (us, len(calls), calls[-1]["split_tokens"] if calls else None)
    got = tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale)[0]
    gerr = (got.float() - ref.float()).abs().max().item()
    print(f"{s.name:22s} triton {res['triton'][0]:7.1f} us  public+gluon {res['gluon'][0]:7.1f} us "
          f"(gluon plans {res['gluon'][1]}, split {res['gluon'][2]})  {flops / res['triton'][0] / 1e6:.0f} / "
          f"{flops / res['gluon'][0] / 1e6:.0f} TFLOP/s  max err {gerr:.3g}", flush=True)
    if s.num_heads % 64 or s.cache_dtype != torch.bfloat16:
        return
    for regs in (208, 224):
        mla_sm90.REGS_CONSUMER = regs
        try:
            fn = lambda: mla_sm90.launch(*x.args(), out, lse, sc, True, tpa_k._NO_SPLIT)
            us = graph_us(fn)
            err = (out.float() - ref.float()).abs().max().item()
            print(f"    direct launch, unsplit, REGS={regs}: {us:7.1f} us  "
                  f"{flops / us / 1e6:.0f} TFLOP/s  max err {err:.3g}", flush=True)
        except Exception as e:
            print(f"    REGS={regs}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    mla_sm90.REGS_CONSUMER = REGS


if "--ncu" in sys.argv:
    s = M.Shape("B64_ctx4096_H128", 64, 4096, 128)
    x = M.make_inputs(s, dev, 0)
    out = torch.empty(64, 128, 512, dtype=s.dtype, device=dev)
    lse = torch.empty(64, 128, device=dev)
    for _ in range(2):
        mla_sm90.launch(*x.args(), out, lse, M._scale(s), True, tpa_k._NO_SPLIT)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    mla_sm90.launch(*x.args(), out, lse, M._scale(s), True, tpa_k._NO_SPLIT)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    sys.exit(0)

for s in (M.Shape("B64_ctx4096_H128", 64, 4096, 128), M.Shape("B128_ctx4096_H64", 128, 4096, 64),
          M.Shape("B64_ctx4096_H64", 64, 4096, 64), M.Shape("B64_ctx1024_H128", 64, 1024, 128),
          M.Shape("B132_ctx4096_H64", 132, 4096, 64), M.Shape("B1_ctx32768_H128", 1, 32768, 128),
          M.Shape("B8_ctx8192_H128", 8, 8192, 128), M.Shape("B128_ctx4096_H16", 128, 4096, 16),
          M.Shape("B64_ctx256_H128", 64, 256, 128), M.Shape("B64_ctx512_H128", 64, 512, 128),
          M.Shape("mtp2_B64_ctx4096_H128", 64, 4096, 128, q_len=2)):
    if re.search(os.environ.get("PROBE_SHAPES", "."), s.name):
        run_shape(s)
