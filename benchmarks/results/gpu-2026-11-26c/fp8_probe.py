"""The Gluon MLA kernels on fp8 caches (mla_sm90_fp8 where it takes the call, the narrow kernel's own
fp8 path) against the Triton kernel, CUDA-graph replays (p50 us; benchmarks/_harness.py), one process.

    python3 fp8_probe.py    # PROBE_SHAPES=fp8_B (name substrings), PROBE_NO_TRITON=1 (no Triton
                            # kernel), PROBE_NO_ONE=1 (no narrow-kernel fp8 path on 16 rows)

logs/probe-*.txt ran it with variants of a kernel module in place (described in RESULTS.md,
"H100, 2026-11-26 (third run)").

Shapes of benchmarks/mla_decode.py (16 heads, latent 512 + rope 64, block 64) on an e4m3 cache
(B128 x 4096, B32 x 8192, 2 tokens B64 x 4096) and, for reference, the bf16 B128 x 4096 shape;
"% copy" is the cache bytes over the device-to-device copy bandwidth of the same run. Each fp8
result is checked against a float32 gather-einsum of the same inputs first.
"""
import os
import sys
from dataclasses import replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by_name = {s.name: s for s in md.SHAPES}
    fp8 = by_name["fp8_B128_ctx4096_H16"]
    shapes = [fp8, replace(fp8, name="fp8_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(fp8, name="fp8_mtp2_B64_ctx4096_H16", batch=64, q_len=2), by_name["B128_ctx4096_H16"]]
    only = os.environ.get("PROBE_SHAPES")
    for s in shapes:
        if only and not any(k in s.name for k in only.split(",")):
            continue
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        for narrow, two in ((True, True), (True, False), (False, False)):
            if not narrow and os.environ.get("PROBE_NO_TRITON"):
                continue
            if s.cache_dtype != s.dtype and not two and s.q_len == 1 and os.environ.get("PROBE_NO_ONE"):
                continue
            tmla.SM90_NARROW, tmla.SM90_FP8 = narrow, two
            lowering._CHOICES.clear()

            def make(x):
                out = torch.empty_like(x.q_latent)
                lse = torch.empty(x.q_latent.shape[:2], device=device)

                def run():
                    tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=x.kv_scale,
                                    max_query_len=s.q_len)
                    return out
                return run

            fns = [make(x) for x in copies]
            got = fns[0]().float()
            want = md.gather_einsum_call(s, copies[0], torch.float32)
            err = (got - want).abs().max().item()
            t = H.bench(fns, device, use_graph=True)
            pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
            kernel = "mla_sm90_fp8" if narrow and two and s.cache_dtype != s.dtype and s.q_len == 1 else \
                "narrow" if narrow else "triton"
            print(f"{s.name:26s} {kernel:13s} {t.p50_us:8.1f} us  {pct:5.1f} % copy  max|err| {err:.2e}", flush=True)
        tmla.SM90_NARROW, tmla.SM90_FP8 = True, True


if __name__ == "__main__":
    main()
