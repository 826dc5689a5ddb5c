"""The wide and fp8 Gluon MLA kernels of this tree (queries in one shared-memory allocation a
chunk) against those of main e3e94b3 on the shapes of benchmarks/mla_decode.py: CUDA-graph
replays (p50 us; benchmarks/_harness.py), one process, each output checked against a float32
gather-einsum first.

    python3 probe.py        # PROBE_SHAPES=H128 (name substrings), PROBE_ROUNDS=2

Variants: ``base`` (mla_sm90_base.py and mla_sm90_fp8_base.py: the kernels of main e3e94b3) and
``tree`` (this tree's mla_sm90 / mla_sm90_fp8). Rounds repeat the variants in turn, to show the
run-to-run spread beside the differences.
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
from torch_paged_attn.lowering.triton import mla_sm90_fp8 as fp8  # noqa: E402

PKG = "torch_paged_attn.lowering.triton"


def _load(stem):
    spec = importlib.util.spec_from_file_location(f"{PKG}.{stem}", os.path.join(HERE, f"{stem}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"{PKG}.{stem}"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    wb = _load("mla_sm90_base")
    fb = _load("mla_sm90_fp8_base")
    kernels = {"base": (wb._mla_sm90_kernel, fb._mla_fp8_kernel, fb.constants),
               "tree": (wide._mla_sm90_kernel, fp8._mla_fp8_kernel, fp8.constants)}

    def use(which):
        wide._mla_sm90_kernel, fp8._mla_fp8_kernel, fp8.constants = kernels[which]
        wide._LAUNCHERS.clear()
        lowering._CHOICES.clear()

    by_name = {s.name: s for s in md.SHAPES}
    f0 = by_name["fp8_B128_ctx4096_H16"]
    shapes = [by_name["B1_ctx32768_H128"], by_name["B64_ctx4096_H128"], f0,
              replace(f0, name="fp8_B32_ctx8192_H16", batch=32, seq_len=8192)]
    only = os.environ.get("PROBE_SHAPES")
    for s in shapes:
        if only and not any(k in s.name for k in only.split(",")):
            continue
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name in ("base", "tree"):
                use(name)

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
                print(f"{s.name:26s} round {rnd} {name:5s} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    use("tree")


if __name__ == "__main__":
    main()
