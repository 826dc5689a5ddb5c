"""The combine kernel signalling its dependents (``griddepcontrol.launch_dependents``) once its
wait for the attention kernel returns, against the package's combine, which does not: the MLA
split launches' combine is launched with programmatic dependent launch, and so is the narrow
kernel of the call after it, which waits for the combine's end as its first instruction; without a
signal that kernel is launched only when the combine has finished. ``mla_probe.compare`` times the
package's MLA decode in CUDA-graph replays of back-to-back calls, each variant's output checked
against a float32 gather-einsum.

    python3 probe_signal.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import paged_attention  # noqa: E402

SIGNAL = ((
    """    if USE_PDL:  # everything above reads the call's inputs; the partials are the attention kernel's
        gdc_wait()
""", """    if USE_PDL:  # everything above reads the call's inputs; the partials are the attention kernel's
        gdc_wait()
        gdc_launch_dependents()
"""), )


def main():
    signalling = P.module_from_source("paged_attention", P.replaced(paged_attention, SIGNAL))
    package = P.tmla._combine_kernel

    def use(kernel):
        return lambda: setattr(P.tmla, "_combine_kernel", kernel)

    named = {s.name: s for s in P.narrow_shapes()}
    by = {s.name: s for s in P.md.SHAPES}
    shapes = [named["mtp2_B64_ctx4096_H16"], named["mtp2_B32_ctx8192_H16"], named["B64_ctx4096_H16"],
              named["B32_ctx8192_H16"], named["B16_ctx8192_H16"], named["B128_ctx4096_H16"],
              by["mtp4_B32_ctx4096_H16"]]
    P.compare(shapes, {"signal": use(signalling._combine_kernel), "package": use(package)}, 3,
              lambda p: f"block_q {p.get('block_q')} splits {P.splits(p)} pair {p.get('pair')}")
    use(package)()


if __name__ == "__main__":
    main()
