"""Does the fp8 decode kernels' speed depend on where their inputs lie? B64 x 4096 e4m3 (the
benchmark's shape): inputs A allocated first in the process, B after a 4 GiB filler, C after A is
freed (the allocator may hand A's memory back); each timed eagerly (CUDA events over 20
back-to-back calls, median of 5 rounds) with the Gluon kernel (decode_sm90_fp8) and the Triton one.
With NCU=1: one call of each kernel on A and on B only (for ``ncu``), no timing.
"""

import math
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import paged_attention as bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as pa  # noqa: E402

dev = torch.device("cuda")
s = next(x for x in bench.SHAPES if x.name == "decode_fp8_B64_ctx4096")
nbytes, _ = bench.attention_bytes(s)
NCU = os.environ.get("NCU") == "1"


def call(b, gluon: bool):
    if pa.SM90_FP8_DECODE != gluon:
        pa.SM90_FP8_DECODE = gluon
        lowering._CHOICES.clear()
    return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True, k_scale=b.k_scale,
                               v_scale=b.v_scale, max_query_len=1)[0]


def timed(b, gluon: bool) -> float:
    call(b, gluon)
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(20):
            call(b, gluon)
        en.record()
        torch.cuda.synchronize()
        rounds.append(st.elapsed_time(en) * 1e3 / 20)
    return sorted(rounds)[2]


def report(name, b):
    ptr = b.key_cache.data_ptr()
    if NCU:
        for gluon in (True, False):
            call(b, gluon)
        torch.cuda.synchronize()
        print(f"{name}: key cache at {ptr:#x}", flush=True)
        return
    g, t = timed(b, True), timed(b, False)
    print(f"{name}: key cache at {ptr:#x} (2 MiB-aligned: {ptr % 2**21 == 0}); gluon {g:.1f} us "
          f"({nbytes / g / 1e3:.0f} GB/s), triton {t:.1f} us ({nbytes / t / 1e3:.0f} GB/s)", flush=True)


a = bench.paged_inputs(s, dev, 0)
report("A (first)", a)
filler = torch.empty(4 * 2**30, dtype=torch.uint8, device=dev)
b = bench.paged_inputs(s, dev, 1)
report("B (after a 4 GiB filler)", b)
if not NCU:
    report("A again", a)
    del a
    torch.cuda.empty_cache()
    c = bench.paged_inputs(s, dev, 2)
    report("C (after A freed)", c)
    del filler
    torch.cuda.empty_cache()
    d = bench.paged_inputs(s, dev, 3)
    report("D (after the filler freed)", d)
