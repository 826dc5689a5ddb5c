"""The narrow Gluon MLA kernel refilling a stage in three parts (the rope chunk once the scores
are done, each half of the value chunks once its products are done: ``PARTS`` 3; ``narrow_parts.py``, the
kernel module as it ran) against the whole stage after the products (the package's
mla_sm90_narrow.py, main 555f005), in one process: the launcher's kernel swapped between rounds. CUDA-graph replays (p50 us;
benchmarks/_harness.py), each output checked against a float32 gather-einsum first.

    python3 probe_parts.py   # PROBE_ROUNDS=2
"""
import importlib.util
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
from torch_paged_attn.lowering.triton import mla_sm90_narrow as narrow  # noqa: E402

_spec = importlib.util.spec_from_file_location("torch_paged_attn.lowering.triton._narrow_parts",
                                               os.path.join(HERE, "narrow_parts.py"))
parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parts)
KERNELS = {"parts": parts._mla_narrow_kernel, "base": narrow._mla_narrow_kernel}


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    m0 = {s.name: s for s in md.SHAPES}["mtp2_B64_ctx4096_H16"]
    shapes = [m0, replace(m0, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m0, name="mtp2_B128_ctx4096_H16", batch=128),
              replace(m0, name="H16_B128_ctx4096", q_len=1, batch=128),
              replace(m0, name="H16_B32_ctx8192", q_len=1, batch=32, seq_len=8192),
              replace(m0, name="H16_B64_ctx4096", q_len=1),
              replace(m0, name="mtp2_B1_ctx32768_H16", batch=1, seq_len=32768),
              replace(m0, name="mtp4_B32_ctx4096_H16", batch=32, q_len=4),
              replace(m0, name="mtp2_B16_ctx4096_H16", batch=16)]
    only = os.environ.get("PROBE_SHAPES")
    if only:
        shapes = [s for s in shapes if s.name in only.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name, kernel in KERNELS.items():
                narrow._mla_narrow_kernel = kernel
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
                t = H.bench(fns, device, use_graph=True)
                pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
                print(f"{s.name:24s} round {rnd} {name:5s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    narrow._mla_narrow_kernel = KERNELS["base"]


if __name__ == "__main__":
    main()
