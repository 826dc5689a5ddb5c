"""One eager call of the package's Triton decode kernel on the benchmark's B64 x 4096 shape, bf16 and
e4m3 caches, for Nsight Compute (run.sh part ncu-triton): is the fp8 loop bound by instruction issue?"""

import math
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import paged_attention as bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402

dev = torch.device("cuda")
for name in ("decode_B64_ctx4096", "decode_fp8_B64_ctx4096"):
    s = next(x for x in bench.SHAPES if x.name == name)
    b = bench.paged_inputs(s, dev, 0)
    for _ in range(2):  # the first call compiles; ncu profiles both
        tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True, k_scale=b.k_scale,
                            v_scale=b.v_scale, max_query_len=1)
    torch.cuda.synchronize()
    print(name, "done", flush=True)
    del b
