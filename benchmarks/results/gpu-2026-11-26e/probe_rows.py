"""2 query tokens a sequence of 16 heads (32 rows a program): the narrow kernel against
``mla_sm90_rows.py`` (its two warpgroups in their own partitions, 16 rows each, every tile, and a
producer warp) launched in its place. CUDA-graph replays (p50 us), one process, each output
checked against a float32 gather-einsum first.

    python3 probe_rows.py        # PROBE_ROUNDS=2, PROBE_REGS=224 (each consumer partition's registers)
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


def _load(stem):
    spec = importlib.util.spec_from_file_location(f"probe_{stem}", os.path.join(HERE, f"{stem}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    rows = _load("mla_sm90_rows")
    tree = (narrow._mla_narrow_kernel, narrow.constants)

    def rows_constants(num_heads, block_q, pdl, latent, fp8):
        c = tree[1](num_heads, block_q, pdl, latent, fp8)
        if c["ROWS"] == 32 and not fp8:
            c.update(num_warps=4, CONSUMER_REGS=int(os.environ.get("PROBE_REGS", "224")))
        return c

    def use(name):
        if name == "narrow":
            narrow._mla_narrow_kernel, narrow.constants = tree
        else:
            narrow._mla_narrow_kernel, narrow.constants = rows._mla_rows_kernel, rows_constants
        wide._LAUNCHERS.clear()
        lowering._CHOICES.clear()

    by_name = {s.name: s for s in md.SHAPES}
    m0 = by_name["mtp2_B64_ctx4096_H16"]
    shapes = [m0, replace(m0, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m0, name="mtp2_B128_ctx4096_H16", batch=128)]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
            for name in ("narrow", "rows"):
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
                print(f"{s.name:26s} round {rnd} {name:6s} {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  {pct:5.1f} % copy  max rel err {err:.2e}", flush=True)
    use("narrow")


if __name__ == "__main__":
    main()
