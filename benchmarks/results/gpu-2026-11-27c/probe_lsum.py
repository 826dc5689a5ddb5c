"""The narrow MLA kernel with its row sums kept a key slot each and added over the keys once after
the key loop ("after": built from the package's ``mla_sm90_narrow`` by ``_AFTER``'s replacements
into a temporary file) against the package's kernel ("before": the sum down each tile's 64 keys
every tile, a cross-warp reduction with its CTA barriers). One process, CUDA-graph replays (p50 us;
benchmarks/_harness.py), alternated for PROBE_ROUNDS rounds, each output checked against a float32
gather-einsum (after a run into a NaN-filled output).

    python3 probe_lsum.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import importlib.util
import os
import sys
import tempfile
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
from torch_paged_attn.lowering.triton import mla_sm90, mla_sm90_narrow  # noqa: E402

PKG = "torch_paged_attn.lowering.triton"
NAME = f"{PKG}.mla_sm90_narrow"
# (the variant's code, the package's)
_AFTER = (
    ("""        # the row sums kept a key slot each ([64, ROWS], rescaled with O^T) and added over the keys
        # after the loop: a sum down the columns a tile crosses the warps (shared memory and CTA
        # barriers, which both warpgroups of a 32-row program meet)
        l_keys = o0
""", ""),
    ("""            m_i = m_new
            a = gl.expand_dims(alpha, 0)
            l_keys = l_keys * a + p
""", """            l_i = l_i * alpha + gl.sum(p, 0)
            m_i = m_new
            a = gl.expand_dims(alpha, 0)
"""),
    ("""        l_i = gl.sum(l_keys, 0)
""", ""),
)


def _after_module():
    with open(mla_sm90_narrow.__file__) as f:
        src = f.read()
    anchor = "        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(ROWS, acc_layout)\n"
    signal = "            _signal_dependents()\n\n        # -- epilogue"
    assert src.count(anchor) == 1 and src.count(signal) == 1
    src = src.replace(anchor, anchor + _AFTER[0][0]).replace(signal, signal.replace("\n\n", "\n" + _AFTER[2][0] + "\n"))
    new, old = _AFTER[1]
    assert src.count(old) == 1, f"not in mla_sm90_narrow.py once: {old!r}"
    src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "mla_sm90_narrow_lsum.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = PKG
    saved = sys.modules[NAME]
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    sys.modules[NAME] = saved
    return module


def main():
    device = torch.device("cuda")
    variants = {"after": _after_module(), "before": mla_sm90_narrow}
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    one = replace(m, name="B64_ctx4096_H16", q_len=1)
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128), one, by["B32_ctx8192_H16"],
              by["B128_ctx4096_H16"]]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "3"))):
            for name, module in variants.items():
                sys.modules[NAME] = pkg.mla_sm90_narrow = module
                mla_sm90._LAUNCHERS.clear()
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
                fns[0]().fill_(float("nan"))
                got = fns[0]().float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:6s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}", flush=True)
    sys.modules[NAME] = pkg.mla_sm90_narrow = mla_sm90_narrow


if __name__ == "__main__":
    main()
