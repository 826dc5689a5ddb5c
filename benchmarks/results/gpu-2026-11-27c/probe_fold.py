"""The narrow MLA kernel's splits merged by the last split of each query block (``mla.SM90_FOLD``,
``mla_sm90_narrow._fold``) against the combine kernel launched after them (the fold off). One
process, CUDA-graph replays (p50 us; benchmarks/_harness.py), the two alternated for PROBE_ROUNDS
rounds, each output checked against a float32 gather-einsum (after a run into a NaN-filled output); ``PROBE_FOLD_MAX`` sets
``mla._FOLD_MAX_SPLITS`` (the shapes that split more ways run the combine either way).

    git apply fold.patch && python3 probe_fold.py   # PROBE_ROUNDS=4, PROBE_SHAPES=name,..., PROBE_FOLD_MAX=8

It needs the package with ``fold.patch`` applied (``run.sh probe-fold`` applies it for the run and
takes it off after): the switch ``mla.SM90_FOLD`` and the fold are the patch's.
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
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402


def main():
    device = torch.device("cuda")
    tmla._FOLD_MAX_SPLITS = int(os.environ.get("PROBE_FOLD_MAX", "8"))
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    by = {s.name: s for s in md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    one = replace(m, name="B64_ctx4096_H16", q_len=1)
    shapes = [m, one, by["B32_ctx8192_H16"], replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(one, name="B16_ctx8192_H16", batch=16, seq_len=8192),
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16)]
    wanted = os.environ.get("PROBE_SHAPES")
    shapes = [s for s in shapes if not wanted or s.name in wanted.split(",")]
    for s in shapes:
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        want = md.gather_einsum_call(s, copies[0], torch.float32)
        for rnd in range(int(os.environ.get("PROBE_ROUNDS", "4"))):
            for name, fold in (("fold", True), ("combine", False)):
                tmla.SM90_FOLD = fold
                mla_sm90._LAUNCHERS.clear()
                lowering._CHOICES.clear()
                plans = []
                prepare = mla_sm90.prepare
                mla_sm90.prepare = lambda **k: plans.append(k) or prepare(**k)

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
                mla_sm90.prepare = prepare
                err = ((got - want).abs().max() / want.abs().max()).item()
                p = plans[-1] if plans else {}
                what = f"block_q {p.get('block_q')} splits {p['workspace'].shapes[0][1] if p.get('workspace') else 1}" \
                       f" fold {p.get('fold')}"
                t = H.bench(fns, device, use_graph=True)
                print(f"{s.name:28s} round {rnd} {name:7s} graph {t.p50_us:8.1f} us ({t.p20_us:.1f}-{t.p80_us:.1f})"
                      f"  max rel err {err:.2e}  {what}", flush=True)
    tmla.SM90_FOLD = True


if __name__ == "__main__":
    main()
