"""The wide MLA kernel (``mla_sm90``) with its right warpgroup's output rescaled by one exp2 a
pair (exp2(m - m_1), the left warpgroup's value), against the kernel before (main fd6dc21's
code: exp2(m - m_0) * exp2(m_0 - m_1); built from the package's module by ``_BEFORE``'s three
replacements, into a temporary file). One process,
CUDA-graph replays (p50 us; benchmarks/_harness.py), the two alternated for PROBE_ROUNDS rounds,
each output checked against a float32 gather-einsum.

    python3 probe_right.py   # PROBE_ROUNDS=6, PROBE_SHAPES=name,...
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
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402

PKG = "torch_paged_attn.lowering.triton"
# (44a7add's right warpgroup, fd6dc21's): the one change between the two kernels' code
_BEFORE = (
    ("            a = gl.exp2(m_i - m_ref1)  # the left warpgroup's rescale of the pair, the same value\n",
     "            scale0 = gl.exp2(m_i - _finite(m_new0))\n            scale1 = gl.exp2(m_new0 - m_ref1)\n"),
    ("            l_i = l_i * a + gl.sum(p, 1)\n            _zero_rows(kv_smem, st1 * CHUNKS,",
     "            l_i = l_i * (scale0 * scale1) + gl.sum(p, 1)\n            _zero_rows(kv_smem, st1 * CHUNKS,"),
    ("            a = gl.expand_dims(a, 1)\n            o0, o1, o2, o3 = o0 * a,",
     "            a = gl.expand_dims(scale0 * scale1, 1)\n            o0, o1, o2, o3 = o0 * a,"),
)


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"{PKG}.{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = PKG
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _before_source() -> str:
    """fd6dc21's mla_sm90: the package's module with the right warpgroup's two exp2 put back."""
    with open(mla_sm90.__file__) as f:
        src = f.read()
    for new, old in _BEFORE:
        assert src.count(new) == 1, f"not in mla_sm90.py once: {new!r}"
        src = src.replace(new, old)
    return src


def main():
    device = torch.device("cuda")
    path = os.path.join(tempfile.mkdtemp(), "mla_sm90_before.py")
    with open(path, "w") as f:
        f.write(_before_source())
    before = _load("mla_sm90_before", path)
    variants = {"after": mla_sm90, "before": before}
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
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "6"))):
            for name, module in variants.items():
                pkg.mla_sm90 = module
                module._LAUNCHERS.clear()
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
                print(f"{s.name:28s} round {rnd} {name:6s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}", flush=True)
    pkg.mla_sm90 = mla_sm90


if __name__ == "__main__":
    main()
