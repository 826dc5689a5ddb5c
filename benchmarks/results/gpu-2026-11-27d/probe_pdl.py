"""The narrow MLA kernels (``mla_sm90_narrow``, ``mla_sm90_fp8``, ``mla_sm90_pair``) launched with
programmatic dependent launch as the package launches them ("wait": ``launch_pdl``, the kernel's
first instruction ``griddepcontrol.wait``; ``paged_attention.pdl_options``) against the same
kernels launched without it ("plain": no ``launch_pdl``, so the wait returns at once, as main
b2d35d6 launched them), timed as ``mla_probe.compare`` times them: CUDA-graph replays of
back-to-back calls, where the kernel ahead of each narrow launch is the previous call's combine
kernel (split shapes) or narrow kernel (unsplit).

    python3 probe_pdl.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_fp8, mla_sm90_narrow, mla_sm90_pair  # noqa: E402

_KERNELS = (mla_sm90_narrow, mla_sm90_fp8, mla_sm90_pair)
_PACKAGE = mla_sm90_narrow.pdl_options


def launch(with_pdl: bool):
    """A variant: the package's launch constants, or the same without ``launch_pdl``."""
    def switch():
        for kernel in _KERNELS:
            kernel.pdl_options = _PACKAGE if with_pdl else (lambda pdl: {"USE_PDL": bool(pdl)})
    return switch


def main():
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = P.narrow_shapes() + [
        by["mtp4_B32_ctx4096_H16"], replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16),
        by["fp8_B128_ctx4096_H16"], by["mtp2_fp8_B64_ctx4096_H16"],
        replace(by["fp8_B128_ctx4096_H16"], name="fp8_B8_ctx4096_H16", batch=8)]
    P.compare(shapes, {"wait": launch(True), "plain": launch(False)}, 3, lambda plan: f"splits {P.splits(plan)}")
    launch(True)()


if __name__ == "__main__":
    main()
