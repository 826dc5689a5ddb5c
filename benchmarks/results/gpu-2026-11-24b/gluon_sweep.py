"""The Gluon sm_90 prefill kernel's constants on the two prefill shapes: K/V stages in flight and
the second consumer warpgroup's registers (setmaxnreg), the warpgroup ping-pong, against the Triton prefill kernel.
CUDA-graph replays of the public op, as tune.py times.

    python benchmarks/results/gpu-2026-11-24b/gluon_sweep.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import torch  # noqa: E402

import _harness as H  # noqa: E402
import tune  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import prefill, prefill_sm90  # noqa: E402

device = torch.device("cuda")
# gluon-sweep-persistent.txt also has rows "pingpong": the kernel then had a PINGPONG switch (each
# consumer warpgroup waiting through an mbarrier for the other's wgmma issue), measured slower and
# removed; this script no longer sweeps it.
variants = [(False, 3, 232, False)] + [(True, st, regs, False) for st in (2, 3, 4) for regs in (232, 240)]
for name in ("prefill_B4_q2048", "chunked_prefill_B4_q512_ctx4096"):
    fn, nbytes, _ = tune._call(name, device, tiny=False)
    for gluon, stages, regs, pp in variants:
        prefill.SM90_GLUON, prefill_sm90.STAGES, prefill_sm90.REGS_CONSUMER = gluon, stages, regs
        lowering._CHOICES.clear()
        t = H.bench([fn], device, quick=True)
        label = f"gluon STAGES {stages} regs {regs}{' pingpong' if pp else ''}" if gluon else "triton prefill kernel"
        print(f"{name:32s} {label:37s} {t.p50_us:8.2f} us", flush=True)
