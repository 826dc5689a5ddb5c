"""Each kernel's GPU time within one MLA decode call (torch.profiler, CUDA activity, eager calls
after a warm-up; median over 20 calls) on the split shapes of benchmarks/mla_decode.py: what the
combine kernel costs beside the attention kernel.

    python3 kernels.py
"""
import os
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import mla_decode as md  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402


def main():
    device = torch.device("cuda")
    for s in md.SHAPES:
        x = md.make_inputs(s, device, 0)
        out = torch.empty_like(x.q_latent)
        lse = torch.empty(x.q_latent.shape[:2], device=device)

        def run():
            tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                            max_query_len=s.q_len)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                run()
            torch.cuda.synchronize()
        times = defaultdict(list)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                times[e.name].append(e.device_time)
        parts = ", ".join(f"{n[:40]} {statistics.median(v):.1f} us x{len(v) // 20}" for n, v in times.items())
        print(f"{s.name:26s} {parts}", flush=True)


if __name__ == "__main__":
    main()
