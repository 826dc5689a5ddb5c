"""fp8 decode B64 x 4096 with batched scores (the package's default): other tiles against the planned
(16, 128, 4 warps, 3 stages), CUDA-graph replays alternated (``_harness.bench_pair``), each pair
printed as it is measured. sm_90 SASS of the candidates (registers / shared memory / instructions a
warp a tile; ``sass_report.py --sweeps attn_fp8_batched``): (16, 128, 8, 3): 128 / 100 KiB / 658;
(16, 128, 8, 2): 128 / 68 KiB / 645; (16, 64, 4, 3): 180 / 50 KiB / 636; the planned 206 / 100 KiB / 1033.

    python3 probe_tiles.py
"""

import math
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import _harness as H  # noqa: E402
import paged_attention as bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as pa  # noqa: E402

dev = torch.device("cuda")
s = next(s for s in bench.SHAPES if s.name == "decode_fp8_B64_ctx4096")
copy_gbps, _ = H.copy_bandwidth(dev)
print(f"copy {copy_gbps:.0f} GB/s", flush=True)
PLANNED = (16, 128, 4, 3, 4)
CANDIDATES = [(16, 128, 8, 3, 2), (16, 128, 8, 2, 2), (16, 64, 4, 3, 4)]
state = {"cfg": None}


def fns(copies, cfg):
    def make(b):
        def run():
            if state["cfg"] != cfg:
                state["cfg"] = cfg
                pa._FP8_DECODE_CONFIGS[128] = cfg
                lowering._CHOICES.clear()
            return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True,
                                       k_scale=b.k_scale, v_scale=b.v_scale, max_query_len=1)[0]
        return run
    return [make(b) for b in copies]


nbytes, _ = bench.attention_bytes(s)
copies = [bench.paged_inputs(s, dev, i) for i in range(H.rotations(nbytes, dev))]
pct = lambda t: nbytes / (t * 1e-6) / 1e9 / copy_gbps * 100  # noqa: E731
for cfg in CANDIDATES:
    a, b = fns(copies, cfg), fns(copies, PLANNED)
    ga, gb = a[0](), b[0]()
    torch.cuda.synchronize()
    err = (ga.float() - gb.float()).abs().max().item()
    r = H.bench_pair(a, b, dev)
    print(f"{cfg}: {r['a_us']:.1f} us ({pct(r['a_us']):.1f} % copy), planned {r['b_us']:.1f} us "
          f"({pct(r['b_us']):.1f} %), planned/candidate p50 {r['ratio_p50']:.3f} (p20 {r['ratio_p20']:.3f}, "
          f"p80 {r['ratio_p80']:.3f}); max |candidate - planned| {err:.3g}", flush=True)
