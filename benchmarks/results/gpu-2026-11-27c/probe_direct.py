"""What the empty programs of the 2-token grid cost: the narrow MLA kernel as the package launches
it (``T // BLOCK_Q + B + 1`` query blocks a split, found by a binary search of
``query_start_loc``, those past a sequence's blocks exiting: half of them on a uniform 2-token
batch) against the same kernel with program s taking sequence s's one block directly, on ``B +
1`` blocks a split (a measurement only: it covers a batch only where no sequence has more than
``BLOCK_Q`` tokens, which the probe's uniform batches satisfy); the variant built from the
package's module by ``_DIRECT``'s replacements, both timed as ``mla_probe.compare`` times them.

    python3 probe_direct.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

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


def main():
    direct = P.module_from_source("mla_sm90_narrow", P.replaced(mla_sm90_narrow, _DIRECT))
    m = {s.name: s for s in P.md.SHAPES}["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128)]
    P.compare(shapes, {"search": P.swap("mla_sm90_narrow", mla_sm90_narrow),
                       "direct": P.swap("mla_sm90_narrow", direct)}, 3)
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()


if __name__ == "__main__":
    main()
