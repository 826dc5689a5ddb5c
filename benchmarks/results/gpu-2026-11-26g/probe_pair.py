"""32-row MLA programs on bf16 caches: ``mla_sm90_pair`` (each tile's scores by one warpgroup
for all 32 rows, the values split by latent columns; ``mla.SM90_PAIR``) against the narrow
kernel's two warpgroups on the same tile (``pair`` / ``narrow``; ``pair0``: the pair kernel with
the right warpgroup's scores after its values of the pair's first tile, ``SCORES_FIRST`` off), in
one process, the switches flipped between rounds. CUDA-graph replays and L2-flushed eager calls (p50 us;
benchmarks/_harness.py), each output checked against a float32 gather-einsum first; the kernels'
device times from the profiler (five calls).

    python3 probe_pair.py   # PROBE_ROUNDS=2
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
from torch_paged_attn.lowering.triton import mla_sm90_pair as pair  # noqa: E402



_PAIR = tmla._pair
# PROBE_SET=2: "ropes", the pair kernel's producer loading both stages' rope chunks first
# (ROPES_FIRST), against "pair" and "narrow" (logs/probe-pair-3.txt)
pair.ROPES_FIRST = False
VARIANTS = ("ropes", "pair", "narrow") if os.environ.get("PROBE_SET") == "2" else ("pair", "pair0", "narrow")


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    m0 = {s.name: s for s in md.SHAPES}["mtp2_B64_ctx4096_H16"]
    shapes = [m0, replace(m0, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m0, name="mtp2_B128_ctx4096_H16", batch=128),
              replace(m0, name="H32_B64_ctx4096", q_len=1, num_heads=32),
              replace(m0, name="mtp4_B32_ctx4096_H16", batch=32, q_len=4),
              replace(m0, name="mtp2_B24_ctx4096_H16", batch=24),
              replace(m0, name="mtp2_B32_ctx4096_H12", batch=32, num_heads=12),
              replace(m0, name="mtp2_B64_ctx4096_H16_bs16", block_size=16),
              replace(m0, name="H16_B64_ctx4096", q_len=1)]
    only = os.environ.get("PROBE_SHAPES")
    if only:
        shapes = [s for s in shapes if s.name in only.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name in VARIANTS:
                tmla.SM90_PAIR = name != "narrow"
                pair.SCORES_FIRST = name != "pair0"
                pair.ROPES_FIRST = name == "ropes"
                # the pair kernel wherever it takes the call (as it ran, before mla._pair's rule)
                tmla._pair = lambda ql, qr, kv, block_q, *a: tmla.SM90_PAIR and pair.declines(ql, qr, kv, block_q) is None
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
                for use_graph in (True, False) if s is shapes[0] else (True, ):
                    t = H.bench(fns, device, use_graph=use_graph)
                    pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
                    mode = "graph" if use_graph else "eager"
                    print(f"{s.name:26s} round {rnd} {name:6s} {mode} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                          f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
                if rnd == 0:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            fns[0]()
                        torch.cuda.synchronize()
                    ks = [f"{e.key} {e.device_time_total / 5:.1f} us"
                          for e in prof.key_averages() if e.device_time_total > 0]
                    print(f"{s.name:26s}   {name}: " + ", ".join(ks), flush=True)
    tmla.SM90_PAIR = True
    pair.SCORES_FIRST = True
    pair.ROPES_FIRST = False
    tmla._pair = _PAIR


if __name__ == "__main__":
    main()
