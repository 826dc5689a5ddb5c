"""The narrow Gluon MLA kernel's split sizes, CUDA-graph replays (p50 us; benchmarks/_harness.py).

    python3 narrow_probe.py

For the 16-head shapes of benchmarks/mla_decode.py that split (B32 x 8192, 2 tokens B64 x 4096),
the narrow kernel and the Triton kernel (as planned), in one process; ``PROBE_SPLITS=1`` adds
forced split sizes and one program a token for the speculative shape. (logs/narrow-probe-5.txt
compared a variant since removed, ``early``: each chunk of a stage refilled as soon as its product
was done, one CTA barrier a chunk; slower on all three shapes.)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..")
sys.path[:0] = [BENCH, os.path.join(BENCH, "..")]
import _harness as H  # noqa: E402
import mla_decode as md  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.lowering.triton import mla as tmla  # noqa: E402


def main():
    device = torch.device("cuda")
    copy_gbps, _ = H.copy_bandwidth(device)
    print(f"copy {copy_gbps:.0f} GB/s")
    for s in md.SHAPES:
        if s.name not in ("B32_ctx8192_H16", "mtp2_B64_ctx4096_H16", "B128_ctx4096_H16"):
            continue
        nbytes, _ = md.cache_bytes(s)
        per = nbytes + 2 * s.batch * s.q_len * s.num_heads * (2 * s.latent + s.rope)
        copies = [md.make_inputs(s, device, i) for i in range(H.rotations(per, device))]
        block_q = tmla._query_block
        variants = [(True, None, False), (False, None, False)]
        if os.environ.get("PROBE_SPLITS"):
            variants += [(True, None, True), (True, 4096, False), (True, 2048, False), (True, 1024, False)]
        for narrow, split, one in variants:
            if (s.name == "B128_ctx4096_H16" or s.q_len == 1) and (split is not None or one):
                continue
            tmla.SM90_NARROW = narrow
            # one: a program a token (16 rows), the two tokens of a sequence in adjacent programs
            tmla._query_block = (lambda *a: 1) if one else block_q
            lowering._CHOICES.clear()

            def make(x):
                out = torch.empty_like(x.q_latent)
                lse = torch.empty(x.q_latent.shape[:2], device=device)
                return lambda: tmla.mla_decode(*x.args(), out, lse, scale=md._scale(s), causal=True, kv_scale=None,
                                               max_query_len=s.q_len, split_tokens=split)

            fns = [make(x) for x in copies]
            t = H.bench(fns, device, use_graph=True)
            pct = 100 * nbytes / (t.p50_us * 1e-6) / (copy_gbps * 1e9)
            print(f"{s.name:24s} narrow={narrow!s:5s} split={split!s:5s} token_programs={one!s:5s} {t.p50_us:8.1f} us"
                  f"  {pct:5.1f} % copy", flush=True)
        tmla.SM90_NARROW = True
        tmla._query_block = block_q


if __name__ == "__main__":
    main()
