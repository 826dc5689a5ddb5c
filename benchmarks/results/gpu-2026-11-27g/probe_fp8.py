"""fp8 decode: the Gluon sm_90 kernel (decode_sm90_fp8, archived here: restore.diff puts it back)
against the Triton kernel, CUDA-graph replays alternated in one process, with the copy bandwidth
measured first.

    python3 probe_fp8.py [SHAPE...]   (default: the benchmark's decode_fp8_B64_ctx4096 and variants)
"""

import math
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import _harness as H  # noqa: E402
import paged_attention as bench  # noqa: E402
from dataclasses import replace  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as pa  # noqa: E402

dev = torch.device("cuda")
base = next(s for s in bench.SHAPES if s.name == "decode_fp8_B64_ctx4096")
SHAPES = {
    "B64x4096": base,
    "B1x32768": replace(base, name="decode_fp8_B1_ctx32768", batch=1, seq_len=32768),
    "B8x8192_Hq64": replace(base, name="decode_fp8_B8_ctx8192_Hq64", batch=8, seq_len=8192, num_heads=64),
    "B256x1024": replace(base, name="decode_fp8_B256_ctx1024", batch=256, seq_len=1024),
    "B128x2048": replace(base, name="decode_fp8_B128_ctx2048", batch=128, seq_len=2048),
    "B512x512": replace(base, name="decode_fp8_B512_ctx512", batch=512, seq_len=512),
}
names = sys.argv[1:] or list(SHAPES)
copy_gbps, _ = H.copy_bandwidth(dev)
print(f"copy {copy_gbps:.0f} GB/s", flush=True)


def fns(s, copies, gluon: bool):
    def make(b):
        def run():
            if pa.SM90_FP8_DECODE != gluon:
                pa.SM90_FP8_DECODE = gluon
                lowering._CHOICES.clear()
            return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True,
                                       k_scale=b.k_scale, v_scale=b.v_scale, max_query_len=1)[0]
        return run
    return [make(b) for b in copies]


for name in names:
    s = SHAPES[name]
    nbytes, _ = bench.attention_bytes(s)
    copies = [bench.paged_inputs(s, dev, i) for i in range(H.rotations(nbytes, dev))]
    a, b = fns(s, copies, True), fns(s, copies, False)
    # both right on the first copy: the Gluon output against the Triton one (both checked by the tests)
    ga, gb = a[0](), b[0]()
    torch.cuda.synchronize()
    err = (ga.float() - gb.float()).abs().max().item()
    # paired (_harness.bench_pair: one call count for both graphs, the samples alternated); each
    # graph keeps the kernel its capture planned (the functions switch SM90_FP8_DECODE when called).
    # Calls 1-3 and 6 ran a hand-written loop instead, which captured each graph with its own
    # estimate of the call count and divided both by a third: those figures are not per-call times
    # (B256 x 1024 at 135.8 % of copy)
    r = H.bench_pair(a, b, dev)
    pct = lambda t: nbytes / (t * 1e-6) / 1e9 / copy_gbps * 100  # noqa: E731
    print(f"{name}: gluon {r['a_us']:.1f} us ({pct(r['a_us']):.1f} % copy), triton {r['b_us']:.1f} us "
          f"({pct(r['b_us']):.1f} %), triton/gluon p50 {r['ratio_p50']:.3f} (p20 {r['ratio_p20']:.3f}, "
          f"p80 {r['ratio_p80']:.3f}); max |gluon - triton| {err:.3g}", flush=True)
