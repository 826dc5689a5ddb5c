"""What this run's probes share: a decode shape of ``benchmarks/paged_attention.py`` on its inputs
(rotated over the L2), the public op called on them with a setting of the Triton lowering applied
first (a setting that differs from the last one drops the remembered plans, so each CUDA graph keeps
the kernel its capture planned), and two settings timed side by side in CUDA-graph replays
(``_harness.bench_pair``: one call count for both graphs, the samples alternated), printed as each
pair is measured.
"""

import math
import os
import sys
from dataclasses import replace
from typing import Callable

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]
import _harness as H  # noqa: E402
import paged_attention as bench  # noqa: E402

import torch_paged_attn as tpa  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention as pa  # noqa: E402

__all__ = ["DEVICE", "FP8_B64", "SHAPES", "calls", "compare", "copy_bandwidth", "pa", "shape"]

DEVICE = torch.device("cuda")
FP8_B64 = "decode_fp8_B64_ctx4096"


def shape(base: str, **changes):
    """The benchmark's shape named ``base``, with ``changes`` (a new ``name`` among them) if any."""
    s = next(x for x in bench.SHAPES if x.name == base)
    return replace(s, **changes) if changes else s


# the shapes the decode probes run: the benchmark's decode shapes, and its fp8 shape at their sizes
SHAPES = {
    "fp8_B64x4096": shape(FP8_B64),
    "fp8_B1x32768": shape(FP8_B64, name="decode_fp8_B1_ctx32768", batch=1, seq_len=32768),
    "fp8_B8x8192_Hq64": shape(FP8_B64, name="decode_fp8_B8_ctx8192_Hq64", batch=8, seq_len=8192, num_heads=64),
    "fp8_B256x1024": shape(FP8_B64, name="decode_fp8_B256_ctx1024", batch=256, seq_len=1024),
    "bf16_B64x4096": shape("decode_B64_ctx4096"),
    "bf16_B1x32768": shape("decode_B1_ctx32768"),
    "bf16_B8x8192_Hq64": shape("decode_B8_ctx8192_Hq64"),
    "bf16_B256x1024": shape("decode_B256_ctx1024"),
    "bf16_mha_B32x2048": shape("decode_mha_B32_ctx2048"),
}


def copy_bandwidth() -> float:
    gbps, _ = H.copy_bandwidth(DEVICE)
    print(f"copy {gbps:.0f} GB/s", flush=True)
    return gbps


_applied: list = [None]


def calls(s, copies, setting, apply: Callable[[object], None]) -> list[Callable[[], torch.Tensor]]:
    """One decode call of ``s`` a copy of its inputs, each applying ``setting`` (``apply(setting)``)
    first when the last call applied another one."""
    def make(b):
        def run():
            if _applied[0] != setting:
                apply(setting)
                _applied[0] = setting
                lowering._CHOICES.clear()
            return tpa.paged_attention(*b.args(), scale=1.0 / math.sqrt(s.head_size), causal=True,
                                       k_scale=b.k_scale, v_scale=b.v_scale, max_query_len=1)[0]
        return run
    return [make(b) for b in copies]


def compare(label: str, s, gbps: float, a, b, apply: Callable[[object], None], names=("candidate", "planned")):
    """Settings ``a`` and ``b`` on shape ``s``, timed side by side; prints µs, % of ``gbps``, the
    ratio b / a (above 1: ``a`` faster) and the largest difference of their first outputs."""
    nbytes, _ = bench.attention_bytes(s)
    copies = [bench.paged_inputs(s, DEVICE, i) for i in range(H.rotations(nbytes, DEVICE))]
    fa, fb = calls(s, copies, a, apply), calls(s, copies, b, apply)
    out_a, out_b = fa[0](), fb[0]()
    torch.cuda.synchronize()
    err = (out_a.float() - out_b.float()).abs().max().item()
    r = H.bench_pair(fa, fb, DEVICE)
    pct = lambda t: nbytes / (t * 1e-6) / 1e9 / gbps * 100  # noqa: E731
    na, nb = names
    print(f"{label}: {na} {r['a_us']:.1f} us ({pct(r['a_us']):.1f} % copy), {nb} {r['b_us']:.1f} us "
          f"({pct(r['b_us']):.1f} %), {nb}/{na} p50 {r['ratio_p50']:.3f} (p20 {r['ratio_p20']:.3f}, "
          f"p80 {r['ratio_p80']:.3f}); max |{na} - {nb}| {err:.3g}", flush=True)
    del copies
