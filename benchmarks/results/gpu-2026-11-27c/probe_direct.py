"""What the empty programs of the 2-token grid cost: the narrow MLA kernel as the package launches
it (``T // BLOCK_Q + B + 1`` query blocks a split, found by a binary search of
``query_start_loc``, those past a sequence's blocks exiting: half of them on a uniform 2-token
batch) against the same kernel with program s taking sequence s's one block directly, on ``B +
1`` blocks a split (a measurement only: it covers a batch only where no sequence has more than
``BLOCK_Q`` tokens, which the probe's uniform batches satisfy). The variant is built from the
package's module by ``_DIRECT``'s two replacements into a temporary file. One process, CUDA-graph
replays (p50 us; benchmarks/_harness.py), alternated for PROBE_ROUNDS rounds, each output checked
against a float32 gather-einsum (after a run into a NaN-filled output).

    python3 probe_direct.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
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
_DIRECT = (
    ("""            lo = pid_q * 0
            hi = num_seqs + 1
            while lo < hi:
                mid = (lo + hi) // 2
                below = gl.load(query_start_loc_ptr + mid * stride_qsl) // BLOCK_Q + mid <= pid_q
                lo = gl.where(below, mid + 1, lo)
                hi = gl.where(below, hi, mid)
            seq = gl.maximum(lo - 1, 0)
""", """            seq = pid_q  # (probe_direct.py: sequence pid_q's one block; B: the padding rows)
"""),
    ("""            q_block_start = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q
""", """            q_block_start = pid_q * 0
"""),
    ("""    return num_tokens if block_q == 1 else num_tokens // block_q + num_seqs + 1
""", """    return num_tokens if block_q == 1 else num_seqs + 1
"""),
)


def _direct_module():
    with open(mla_sm90_narrow.__file__) as f:
        src = f.read()
    for old, new in _DIRECT:
        assert src.count(old) == 1, f"not in mla_sm90_narrow.py once: {old!r}"
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "mla_sm90_narrow_direct.py")
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
    variants = {"search": mla_sm90_narrow, "direct": _direct_module()}
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128)]
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
