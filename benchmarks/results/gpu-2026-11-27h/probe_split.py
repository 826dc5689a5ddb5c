"""fp8 decode B64 x 4096 (512 programs: 1.94 waves of the 264 resident slots) unsplit, as planned,
against the same call split in 2 and 4 (1024 / 2048 programs through the workspace and the combine
kernel, which PDL launches behind the attention kernel): does a finer grid shorten the last wave's
tail more than the combine costs? CUDA-graph replays alternated (``_harness.bench_pair``).

    python3 probe_split.py
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
real_plan = pa._plan_splits
state = {"split": None}


def plan(device, programs_per_split, programs_per_sm, capacity, tile_n, partial_bytes, split_tokens):
    return real_plan(device, programs_per_split, programs_per_sm, capacity, tile_n, partial_bytes,
                     state["split"] if split_tokens is None else split_tokens)


pa._plan_splits = plan


def fns(copies, split):
    def make(b):
        def run():
            if state["split"] != split:
                state["split"] = split
                lowering._CHOICES.clear()
            return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True,
                                       k_scale=b.k_scale, v_scale=b.v_scale, max_query_len=1)[0]
        return run
    return [make(b) for b in copies]


nbytes, _ = bench.attention_bytes(s)
copies = [bench.paged_inputs(s, dev, i) for i in range(H.rotations(nbytes, dev))]
pct = lambda t: nbytes / (t * 1e-6) / 1e9 / copy_gbps * 100  # noqa: E731
for split in (2048, 1024):
    a, b = fns(copies, split), fns(copies, None)
    ga, gb = a[0](), b[0]()
    torch.cuda.synchronize()
    err = (ga.float() - gb.float()).abs().max().item()
    r = H.bench_pair(a, b, dev)
    print(f"split {split}: {r['a_us']:.1f} us ({pct(r['a_us']):.1f} % copy), unsplit {r['b_us']:.1f} us "
          f"({pct(r['b_us']):.1f} %), unsplit/split p50 {r['ratio_p50']:.3f} (p20 {r['ratio_p20']:.3f}, "
          f"p80 {r['ratio_p80']:.3f}); max |split - unsplit| {err:.3g}", flush=True)
