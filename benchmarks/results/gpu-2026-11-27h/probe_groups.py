"""Decode with key groups (``KEY_GROUPS``: one softmax state a warp) against the one-state loop, the
same Triton kernel otherwise: CUDA-graph replays alternated in one process (``_harness.bench_pair``),
with the copy bandwidth measured first.

    python3 probe_groups.py [SHAPE...]   (default: every shape below)

Needs the key groups, which are not in the package: key_groups.diff, written against main bd9efba
(``git apply key_groups.diff`` there; the kernel and its tests).
"""

import math
import os
import sys
from dataclasses import replace

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import _harness as H  # noqa: E402
import paged_attention as bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as pa  # noqa: E402

dev = torch.device("cuda")
fp8 = next(s for s in bench.SHAPES if s.name == "decode_fp8_B64_ctx4096")
bf16 = next(s for s in bench.SHAPES if s.name == "decode_B64_ctx4096")
SHAPES = {
    "fp8_B64x4096": fp8,
    "fp8_B1x32768": replace(fp8, name="decode_fp8_B1_ctx32768", batch=1, seq_len=32768),
    "fp8_B8x8192_Hq64": replace(fp8, name="decode_fp8_B8_ctx8192_Hq64", batch=8, seq_len=8192, num_heads=64),
    "fp8_B256x1024": replace(fp8, name="decode_fp8_B256_ctx1024", batch=256, seq_len=1024),
    "bf16_B64x4096": bf16,
    "bf16_B1x32768": next(s for s in bench.SHAPES if s.name == "decode_B1_ctx32768"),
}
names = sys.argv[1:] or list(SHAPES)
copy_gbps, _ = H.copy_bandwidth(dev)
print(f"copy {copy_gbps:.0f} GB/s", flush=True)


def use(groups: int) -> None:
    if (pa._FP8_DECODE_KEY_GROUPS, pa._DECODE_KEY_GROUPS) != (groups, groups):
        pa._FP8_DECODE_KEY_GROUPS = pa._DECODE_KEY_GROUPS = groups
        lowering._CHOICES.clear()


def fns(s, copies, groups: int):
    def make(b):
        def run():
            use(groups)
            return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True,
                                       k_scale=b.k_scale, v_scale=b.v_scale, max_query_len=1)[0]
        return run
    return [make(b) for b in copies]


for name in names:
    s = SHAPES[name]
    nbytes, _ = bench.attention_bytes(s)
    copies = [bench.paged_inputs(s, dev, i) for i in range(H.rotations(nbytes, dev))]
    a, b = fns(s, copies, 4), fns(s, copies, 1)
    ga, gb = a[0](), b[0]()
    torch.cuda.synchronize()
    err = (ga.float() - gb.float()).abs().max().item()
    # each graph keeps the kernel its capture planned (the functions switch the constants when called)
    r = H.bench_pair(a, b, dev)
    pct = lambda t: nbytes / (t * 1e-6) / 1e9 / copy_gbps * 100  # noqa: E731
    print(f"{name}: groups {r['a_us']:.1f} us ({pct(r['a_us']):.1f} % copy), one state {r['b_us']:.1f} us "
          f"({pct(r['b_us']):.1f} %), one/groups p50 {r['ratio_p50']:.3f} (p20 {r['ratio_p20']:.3f}, "
          f"p80 {r['ratio_p80']:.3f}); max |groups - one| {err:.3g}", flush=True)
