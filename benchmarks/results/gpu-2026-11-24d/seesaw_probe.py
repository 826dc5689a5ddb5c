"""The Gluon MLA kernel's paired-tile ("seesaw") schedule against the one-tile-at-a-time kernel it
replaced (the kernel of main ef06909, written to ``mla_sm90_serial.py`` from git) and the Triton kernel: B x ctx x H
shapes of benchmarks/mla_decode.py, CUDA-graph replays of 20 calls (median of 15 replays, us a
call), each checked against the Triton kernel's output; consumer registers varied.

    python benchmarks/results/gpu-2026-11-24d/seesaw_probe.py [SHAPE_GLOB ...]
"""
import fnmatch
import importlib.util
import os
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

SERIAL = os.path.join(HERE, "mla_sm90_serial.py")  # the kernel of main ef06909, from git
if not os.path.exists(SERIAL):
    import subprocess

    with open(SERIAL, "w") as f:
        f.write(subprocess.run(["git", "show", "ef06909:torch_paged_attn/lowering/triton/mla_sm90.py"], cwd=ROOT,
                               check=True, capture_output=True, text=True).stdout)
spec = importlib.util.spec_from_file_location("torch_paged_attn.lowering.triton._serial", SERIAL)
serial = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serial)
serial.SPLIT_KEYS = serial.TILE_N  # how main ef06909 planned its splits
pkg = sys.modules["torch_paged_attn.lowering.triton"]

dev = torch.device("cuda")


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
    tmla.SM90_GLUON = False
    lowering._CHOICES.clear()
    ref = tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale)[0].float()
    t_triton = graph_us(lambda: tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale))
    row = [f"{s.name:24s} triton {t_triton:6.1f}"]
    for name, mod in (("serial", serial), ("seesaw", mla_sm90)):
        tmla.SM90_GLUON = True
        pkg.mla_sm90 = mod  # what mla.prepare_mla_decode's "from . import mla_sm90" finds
        lowering._CHOICES.clear()
        fn = lambda: tpa.mla_decode(*x.args(), scale=sc, causal=True, kv_scale=x.kv_scale)
        got = fn()[0].float()
        err = (got - ref).abs().max().item()
        us = graph_us(fn)
        row.append(f"{name} {us:6.1f} ({flops / us / 1e6:.0f} TF, err {err:.2g})")
    pkg.mla_sm90 = mla_sm90
    print("  ".join(row), flush=True)
    if s.num_heads % 64 == 0 and os.environ.get("REGS"):
        out = torch.empty(T, s.num_heads, s.latent, dtype=s.dtype, device=dev)
        lse = torch.empty(T, s.num_heads, device=dev, dtype=torch.float32)
        for regs in map(int, os.environ["REGS"].split(",")):
            mla_sm90.REGS_CONSUMER = regs
            try:
                us = graph_us(lambda: mla_sm90.launch(*x.args(), out, lse, sc, True, tpa_k._NO_SPLIT))
                err = (out.float() - ref).abs().max().item()
                print(f"    seesaw direct, unsplit, REGS={regs}: {us:6.1f} us {flops / us / 1e6:.0f} TF err {err:.2g}",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"    REGS={regs}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        mla_sm90.REGS_CONSUMER = 224


SHAPES = M.SHAPES + [
    M.Shape("B64_ctx4096_H64", 64, 4096, 64), M.Shape("B8_ctx8192_H128", 8, 8192, 128),
    M.Shape("B64_ctx1024_H128", 64, 1024, 128), M.Shape("B64_ctx512_H128", 64, 512, 128),
    M.Shape("mtp2_B64_ctx4096_H128", 64, 4096, 128, q_len=2), M.Shape("B64_ctx4000_H128_bs16", 64, 4000, 128, block_size=16),
]
if sys.argv[1:2] == ["--ncu"]:  # one launch of the kernel on B64 x 4096 H128, for Nsight Compute
    s = SHAPES[2]
    x = M.make_inputs(s, dev, 0)
    out = torch.empty_like(x.q_latent)
    lse = torch.empty(x.q_latent.shape[:2], device=dev)
    mla_sm90.launch(*x.args(), out, lse, M._scale(s), True, tpa_k._NO_SPLIT)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    mla_sm90.launch(*x.args(), out, lse, M._scale(s), True, tpa_k._NO_SPLIT)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    sys.exit(0)
pats = sys.argv[1:] or ["*H128*", "*H64*"]
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for s in SHAPES:
    if any(fnmatch.fnmatch(s.name, p) for p in pats):
        run_shape(s)
