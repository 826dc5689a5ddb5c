"""What the fold's handover costs (mla_sm90_narrow FOLD), on main e00295d's kernel, variants built
from its source by ``mla_probe.replaced``, alternated round by round in one process
(``mla_probe.compare``: CUDA-graph replays, p50 us):

- ``main``: the package;
- ``bound``: rank 1 writes nothing and rank 0 merges nothing (rank 1 still arrives, rank 0 still
  waits): wrong results, the most a cheaper handover (distributed shared memory) could save;
- ``r0more`` / ``r0less``: rank 0 takes one tile more / fewer than half of the block's tiles.

``PROBE_SHAPES`` / ``PROBE_ROUNDS`` as there (default: the two shapes the fold runs on)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402

from torch_paged_attn.lowering.triton import mla_sm90_narrow as narrow  # noqa: E402

RANK1 = '''                _write(out_ptr, lse_ptr, o0, o1, o2, o3, o4, o5, o6, o7, m_i, l_i, 1.0, r_c, t_c, q_start,
                       q_block_start, q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS,
                       BLOCK_Q, ROWS, VCH, False, True, 1.0, WARPS)
                cluster_fence(pid_q)
'''
RANK0 = '''                cluster_fence(pid_q)
                m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _merge_pair(
                    out_ptr, lse_ptr, m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7, r_c, t_c, q_start, q_block_start,
                    q_len, stride_o_tok, stride_o_head, stride_lse_tok, stride_lse_head, HEADS, BLOCK_Q, VCH,
                    acc_layout)
'''
HALF = "half = gl.where(paired != 0, (n_tiles + 1) // 2, n_tiles)"


def variant(replacements):
    return P.swap("mla_sm90_narrow", P.module_from_source("mla_sm90_narrow", P.replaced(narrow, replacements)))


def describe(plan: dict) -> str:
    return f"splits {P.splits(plan)} fold {plan.get('fold')} block_q {plan.get('block_q')}"


if __name__ == "__main__":
    os.environ.setdefault("PROBE_SHAPES", "mtp2_B64_ctx4096_H16,B64_ctx4096_H16")
    variants = {
        "main": P.swap("mla_sm90_narrow", narrow),
        "bound": variant(((RANK1, ""), (RANK0, ""))),
        "r0more": variant(((HALF, "half = gl.where(paired != 0, gl.minimum((n_tiles + 1) // 2 + 1, n_tiles), n_tiles)"),)),
        "r0less": variant(((HALF, "half = gl.where(paired != 0, gl.maximum((n_tiles + 1) // 2 - 1, 0), n_tiles)"),)),
    }
    P.compare(P.narrow_shapes(), variants, 3, describe)
