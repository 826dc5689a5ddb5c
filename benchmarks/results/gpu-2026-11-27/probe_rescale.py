"""The wide MLA kernel's left warpgroup four ways: ``mla_sm90_left.py`` (main 2aa1788's
``mla_sm90`` with a probe switch) loaded once for each value of ``PAGED_ATTN_PROBE_MLA_LEFT``:

- 0, "two" (main 2aa1788): P_0 relative to the left one's own max, O_L rescaled twice a pair;
- 1, "one": the left one waits for the right one's max of tile 2i + 1 before its softmax of tile
  2i, so that P_0 is relative to that max (what the right one multiplies) and O_L is rescaled once
  a pair;
- 2, "one_ovl": 1 with P_1 V_1L issued behind P_0 V_0L without a wait between them;
- 3, "swap": 1 with each warpgroup's two value products in the other order (the left one's P_1
  V_1L first, the right one's P_0 V_0R first), so that the chunk group of a stage freed last is
  freed by the warpgroup whose next scores take it last (the left one's scores take stage 0's right
  chunks, rope, then left chunks; the right one's stage 1's rope, left chunks, then right chunks),
  the producer loading in the new order of the frees;
- 4, "one_prod": 1 with the producer loading stage 1's right chunks before stage 0's left ones
  (the order 1 frees them in: its left warpgroup's P_0 V_0L waits for the right one's max).

One process, CUDA-graph replays (p50 us; benchmarks/_harness.py), the variants alternated for
PROBE_ROUNDS rounds, each output checked against a float32 gather-einsum.

    python3 probe_rescale.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,..., PROBE_VARIANTS=two,...
    PROBE_NCU=1: one eager call of each variant and shape, nothing timed (for ncu)
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
import torch_paged_attn.lowering.triton as pkg  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402

PKG = "torch_paged_attn.lowering.triton"


def _load(name: str, path: str, left: str):
    os.environ["PAGED_ATTN_PROBE_MLA_LEFT"] = left
    spec = importlib.util.spec_from_file_location(f"{PKG}.{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = PKG
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main():
    device = torch.device("cuda")
    path = os.path.join(HERE, "mla_sm90_left.py")  # main 2aa1788's mla_sm90 with the probe switch
    variants = {"two": _load("mla_sm90_two", path, "0"), "one": _load("mla_sm90_one", path, "1"),
                "one_ovl": _load("mla_sm90_one_ovl", path, "2"), "swap": _load("mla_sm90_swap", path, "3"),
                "one_prod": _load("mla_sm90_one_prod", path, "4")}
    picked = os.environ.get("PROBE_VARIANTS")
    variants = {k: v for k, v in variants.items() if not picked or k in picked.split(",")}
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by = {s.name: s for s in md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, by["B1_ctx32768_H128"], replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192),
              replace(h, name="B64_ctx4096_H128_bs16", block_size=16)]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "3"))):
            for name, wide in variants.items():
                pkg.mla_sm90 = wide
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
                if os.environ.get("PROBE_NCU"):
                    print(f"{s.name} {name}: one call", flush=True)
                    continue
                err = ((got - want).abs().max() / want.abs().max()).item()
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:8s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}  launchers {len(wide._LAUNCHERS)}", flush=True)
    pkg.mla_sm90 = mla_sm90


if __name__ == "__main__":
    main()
