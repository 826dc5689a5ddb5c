"""Speculative tokens (MTP) on the narrow Gluon MLA kernels: a sequence's query tokens in
programs of up to 32 rows (``q-block``: at 16 heads 2 tokens a program, split-KV to fill the
SMs, the combine kernel after) against programs of up to 16 rows (``q1``: at 16 heads one token
a program, the programs of a sequence reading the same pages, all but the first mostly from L2;
on fp8 caches ``mla_sm90_fp8`` instead of the narrow kernel's fp8 path). CUDA-graph replays and
L2-flushed eager calls (p50 us; benchmarks/_harness.py), one process, each output checked
against a float32 gather-einsum first.

    python3 probe_q1.py   # PROBE_ROUNDS=2; PROBE_SET=2: fp8 caches and small bf16 batches; 3: more

The eager figures include the planning of every call (``mla_decode`` plans each call): compare
them with each other only. logs/probe-q1.txt (PROBE_SET 1) ran with q1 as one token a program
for every head count (the same programs as 16 rows at 16 heads, the only head count there).
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
from torch_paged_attn.lowering.triton import mla_sm90 as wide  # noqa: E402

_QUERY_BLOCK = tmla._query_block


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by_name = {s.name: s for s in md.SHAPES}
    m0 = by_name["mtp2_B64_ctx4096_H16"]
    shapes = [m0, replace(m0, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m0, name="mtp2_B128_ctx4096_H16", batch=128),
              replace(m0, name="mtp2_B16_ctx4096_H16", batch=16),
              replace(m0, name="mtp4_B32_ctx4096_H16", batch=32, q_len=4),
              replace(m0, name="mtp2_fp8_B64_ctx4096_H16", cache_dtype=md.FP8)]
    if os.environ.get("PROBE_SET") == "2":  # fp8 caches and small bf16 batches
        f0 = replace(m0, cache_dtype=md.FP8)
        shapes = [replace(f0, name="mtp2_fp8_B128_ctx4096_H16", batch=128),
                  replace(f0, name="mtp2_fp8_B32_ctx8192_H16", batch=32, seq_len=8192),
                  replace(f0, name="mtp2_fp8_B16_ctx4096_H16", batch=16),
                  replace(f0, name="mtp2_fp8_B4_ctx16384_H16", batch=4, seq_len=16384),
                  replace(f0, name="mtp4_fp8_B32_ctx4096_H16", batch=32, q_len=4),
                  replace(m0, name="mtp2_B8_ctx4096_H16", batch=8),
                  replace(m0, name="mtp2_B4_ctx16384_H16", batch=4, seq_len=16384),
                  replace(m0, name="mtp2_B1_ctx32768_H16", batch=1, seq_len=32768),
                  replace(m0, name="mtp2_B24_ctx4096_H16", batch=24)]
    if os.environ.get("PROBE_SET") == "3":  # more tokens, other head counts, the threshold's batches
        f0 = replace(m0, cache_dtype=md.FP8)
        shapes = [replace(m0, name="mtp4_B8_ctx4096_H16", batch=8, q_len=4),
                  replace(m0, name="mtp4_B4_ctx16384_H16", batch=4, seq_len=16384, q_len=4),
                  replace(m0, name="mtp4_B8_ctx4096_H8", batch=8, q_len=4, num_heads=8),
                  replace(m0, name="mtp2_B8_ctx4096_H12", batch=8, num_heads=12),
                  replace(m0, name="mtp3_B8_ctx4096_H16", batch=8, q_len=3),
                  replace(m0, name="mtp2_B12_ctx4096_H16", batch=12),
                  replace(m0, name="mtp2_B20_ctx4096_H16", batch=20),
                  replace(m0, name="mtp2_B16_ctx8192_H16", batch=16, seq_len=8192),
                  replace(f0, name="mtp4_fp8_B8_ctx4096_H8", batch=8, q_len=4, num_heads=8),
                  replace(f0, name="mtp4_fp8_B8_ctx4096_H16", batch=8, q_len=4),
                  replace(f0, name="mtp2_fp8_B1_ctx32768_H16", batch=1, seq_len=32768)]
    only = os.environ.get("PROBE_SHAPES")
    if only:
        shapes = [s for s in shapes if s.name in only.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name in ("q-block", "q1"):
                if name == "q1":  # at most 16 rows a program: one token a program at 16 heads
                    tmla._query_block = lambda heads, num_tokens, num_seqs, max_query_len, max_rows: _QUERY_BLOCK(
                        heads, num_tokens, num_seqs, max_query_len, min(max_rows, 16))
                else:
                    tmla._query_block = _QUERY_BLOCK
                wide._LAUNCHERS.clear()
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
                err = ((got - want).abs().max() / want.abs().max()).item()
                for use_graph in (True, False):
                    t = H.bench(fns, device, use_graph=use_graph)
                    pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
                    mode = "graph" if use_graph else "eager"
                    print(f"{s.name:26s} round {rnd} {name:7s} {mode} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                          f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
                if rnd == 0:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            fns[0]()
                        torch.cuda.synchronize()
                    ks = [f"{e.key} {e.device_time / e.count:.1f} us x{e.count // 5}"
                          for e in prof.key_averages() if e.device_time > 0]
                    print(f"{s.name:26s}   {name}: " + ", ".join(ks), flush=True)
    tmla._query_block = _QUERY_BLOCK


if __name__ == "__main__":
    main()
