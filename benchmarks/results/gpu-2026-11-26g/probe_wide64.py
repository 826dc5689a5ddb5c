"""Is a 64-row program of the wide Gluon MLA kernel (mla_sm90, the paired-tile "seesaw") faster
than the narrow kernel's 32-row programs where both read the same bytes? 64 heads of one token
(the wide kernel) against 2 tokens x 16 heads (the narrow kernel, 32 rows a program) and 1 token x
16 heads (16 rows), same batch and context: the same cache bytes, the wide programs doing twice
(against 32 rows) the tensor-core work a tile. CUDA-graph replays and L2-flushed eager calls (p50
us; benchmarks/_harness.py), one process, each output checked against a float32 gather-einsum
first; the per-kernel device times of five calls from the profiler.

    python3 probe_wide64.py   # PROBE_ROUNDS=2
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


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    m0 = {s.name: s for s in md.SHAPES}["mtp2_B64_ctx4096_H16"]
    shapes = []
    for batch, ctx in ((64, 4096), (32, 8192), (128, 4096), (16, 4096)):
        b = replace(m0, batch=batch, seq_len=ctx)
        shapes += [replace(b, name=f"mtp2_B{batch}_ctx{ctx}_H16"),
                   replace(b, name=f"H64_B{batch}_ctx{ctx}", q_len=1, num_heads=64),
                   replace(b, name=f"H16_B{batch}_ctx{ctx}", q_len=1)]
    shapes.append(replace(m0, name="mtp4_B32_ctx4096_H16", batch=32, q_len=4))
    shapes.append(replace(m0, name="mtp2_B32_ctx4096_H32", batch=32, num_heads=32))
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
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
                print(f"{s.name:26s} round {rnd} {mode} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
            if rnd == 0:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fns[0]()
                    torch.cuda.synchronize()
                ks = [f"{e.key} {e.device_time / e.count:.1f} us x{e.count // 5}"
                      for e in prof.key_averages() if e.device_time > 0]
                print(f"{s.name:26s}   " + ", ".join(ks), flush=True)


if __name__ == "__main__":
    main()
