"""The wide MLA kernel (``mla_sm90``) with its right warpgroup's output rescaled by one exp2 a
pair (exp2(m - m_1), the left warpgroup's value), against the kernel before (main fd6dc21's
code: exp2(m - m_0) * exp2(m_0 - m_1); built from the package's module by ``_BEFORE``'s three
replacements), timed as ``mla_probe.compare`` times them.

    python3 probe_right.py   # PROBE_ROUNDS=6, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402

# (44a7add's right warpgroup, fd6dc21's): the one change between the two kernels' code
_BEFORE = (
    ("            a = gl.exp2(m_i - m_ref1)  # the left warpgroup's rescale of the pair, the same value\n",
     "            scale0 = gl.exp2(m_i - _finite(m_new0))\n            scale1 = gl.exp2(m_new0 - m_ref1)\n"),
    ("            l_i = l_i * a + gl.sum(p, 1)\n            _zero_rows(kv_smem, st1 * CHUNKS,",
     "            l_i = l_i * (scale0 * scale1) + gl.sum(p, 1)\n            _zero_rows(kv_smem, st1 * CHUNKS,"),
    ("            a = gl.expand_dims(a, 1)\n            o0, o1, o2, o3 = o0 * a,",
     "            a = gl.expand_dims(scale0 * scale1, 1)\n            o0, o1, o2, o3 = o0 * a,"),
)


def main():
    before = P.module_from_source("mla_sm90_before", P.replaced(mla_sm90, _BEFORE))
    by = {s.name: s for s in P.md.SHAPES}
    h = by["B64_ctx4096_H128"]
    shapes = [h, by["B1_ctx32768_H128"], replace(h, name="B8_ctx8192_H128", batch=8, seq_len=8192),
              replace(h, name="B64_ctx4096_H128_bs16", block_size=16)]
    P.compare(shapes, {"after": P.swap("mla_sm90", mla_sm90), "before": P.swap("mla_sm90", before)}, 6)
    P.swap("mla_sm90", mla_sm90)()


if __name__ == "__main__":
    main()
