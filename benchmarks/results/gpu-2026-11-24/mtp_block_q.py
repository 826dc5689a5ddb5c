"""MTP (2 query tokens a sequence, B64 x 4096 H16): the tokens of a sequence in one program
(BLOCK_Q 2, BLOCK_M 32, the default) against one program per token (BLOCK_Q 1, BLOCK_M 16: the
decode tile; the second token's program reads the latent pages the first just read, from L2).
Times the public op as tune.py does (CUDA-graph replays), % of copy on the cache bytes read once.

    python benchmarks/results/gpu-2026-11-24/mtp_block_q.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import torch  # noqa: E402

import _harness as H  # noqa: E402
import tune  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla  # noqa: E402

device = torch.device("cuda")
copy_gbps, _ = H.copy_bandwidth(device, quick=True)
for name in ("mtp2_B64_ctx4096_H16",):
    fn, nbytes, _ = tune._call(name, device, tiny=False)
    for max_block_m in (64, 16, 64, 16):
        mla._MAX_BLOCK_M = max_block_m
        lowering._CHOICES.clear()
        t = H.bench([fn], device, quick=True)
        gbps = nbytes / (t.p50_us * 1e-6) / H.GB
        print(f"{name} _MAX_BLOCK_M {max_block_m:3d}: {t.p50_us:8.2f} us  {100 * gbps / copy_gbps:5.1f} % of copy "
              f"({copy_gbps:.0f} GB/s)", flush=True)
mla._MAX_BLOCK_M = 64
