"""fp8 decode B64 x 4096: the key loop unrolled (``tl.range(..., loop_unroll_factor=UNROLL)``) with
smaller tiles or fewer stages, against the planned tile (16, 128, 4 warps, 3 stages), CUDA-graph
replays alternated (``_harness.bench_pair``). Candidates (tile, unroll) from sm_90 SASS of this
tree (registers / shared memory / instructions a 128 keys): (16, 128, 4, 2) x 2: 190 / 104 KiB /
1061; (16, 64, 4, 3) x 2: 186 / 55 KiB / 1352; (16, 32, 4, 3) x 4: 154 / 46 KiB / 1615 (three
programs an SM); (16, 64, 4, 2) x 2: 185 / 55 KiB / 1415; the planned tile 166 / 104 KiB / 1104.

    python3 probe_unroll.py

Needs the ``UNROLL`` switch, which is not in the package: call 3 ran it on main bd9efba with the
change unroll.diff makes (unroll.diff itself is written against this run's final tree, where the
fp8 tile's scores are batched over the warps).
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
PLANNED = ((16, 128, 4, 3, 4), 1)
CANDIDATES = [((16, 128, 4, 2, 4), 2), ((16, 64, 4, 3, 4), 2), ((16, 32, 4, 3, 4), 4), ((16, 64, 4, 2, 4), 2)]
state = {"cfg": None}


def fns(copies, cfg):
    def make(b):
        def run():
            if state["cfg"] != cfg:
                state["cfg"] = cfg
                pa._FP8_DECODE_CONFIGS[128], pa._UNROLL = cfg
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
