"""The narrow MLA kernel with its row sums kept a key slot each and added over the keys once after
the key loop ("after": built from the package's ``mla_sm90_narrow`` by ``_AFTER``'s replacements)
against the package's kernel ("before": the sum down each tile's 64 keys every tile, a cross-warp
reduction with its CTA barriers), timed as ``mla_probe.compare`` times them.

    python3 probe_lsum.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

_AFTER = (
    ("""        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(ROWS, acc_layout)
""", """        m_i, l_i, o0, o1, o2, o3, o4, o5, o6, o7 = _empty_state(ROWS, acc_layout)
        # the row sums kept a key slot each ([64, ROWS], rescaled with O^T) and added over the keys
        # after the loop: a sum down the columns a tile crosses the warps (shared memory and CTA
        # barriers, which both warpgroups of a 32-row program meet)
        l_keys = o0
"""),
    ("""            l_i = l_i * alpha + gl.sum(p, 0)
            m_i = m_new
            a = gl.expand_dims(alpha, 0)
""", """            m_i = m_new
            a = gl.expand_dims(alpha, 0)
            l_keys = l_keys * a + p
"""),
    ("""            _signal_dependents()

        # -- epilogue""", """            _signal_dependents()
        l_i = gl.sum(l_keys, 0)

        # -- epilogue"""),
)


def main():
    after = P.module_from_source("mla_sm90_narrow", P.replaced(mla_sm90_narrow, _AFTER))
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(m, name="mtp2_B128_ctx4096_H16", batch=128), replace(m, name="B64_ctx4096_H16", q_len=1),
              by["B32_ctx8192_H16"], by["B128_ctx4096_H16"]]
    P.compare(shapes, {"after": P.swap("mla_sm90_narrow", after),
                       "before": P.swap("mla_sm90_narrow", mla_sm90_narrow)}, 3)
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()


if __name__ == "__main__":
    main()
