"""The narrow MLA kernel with its first cache chunks one stage deeper (``mla_sm90_narrow.deep_chunks``:
those chunks of tile ``j + 3`` are issued when tile ``j``'s products are done, the rest of tile ``j +
2`` as before) against the same kernel with every chunk two stages deep (``DEEP`` 0: main 5f17277's
loop), and with a middle count; timed as ``mla_probe.compare`` times them. Needs ``deep.patch``
applied to the package (``run.sh`` part ``variant-deep``): ``deep_chunks`` and the kernel's
``DEEP`` are the patch's.

    git apply deep.patch && python3 probe_deep.py   # PROBE_ROUNDS=2, PROBE_SHAPES=name,...
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow as narrow  # noqa: E402

_PLANNED = narrow.deep_chunks


def deep(count):
    """A variant: ``count(rows, latent, fp8)`` chunks deeper (None: the package's count)."""
    def switch():
        narrow.deep_chunks = _PLANNED if count is None else count
    return switch


def main():
    named = {s.name: s for s in P.narrow_shapes()}
    shapes = [named[n] for n in ("mtp2_B64_ctx4096_H16", "mtp2_B32_ctx8192_H16", "mtp2_B128_ctx4096_H16",
                                 "B16_ctx8192_H16", "B64_ctx4096_H16", "B32_ctx8192_H16", "B128_ctx4096_H16")]
    P.compare(shapes, {"deep": deep(None),
                       "half": deep(lambda r, latent, fp8: 0 if fp8 else min(3, _PLANNED(r, latent, fp8))),
                       "two": deep(lambda r, latent, fp8: 0)},
              2, lambda plan: f"splits {P.splits(plan)} deep {narrow.deep_chunks(32, 512, False)}/"
                              f"{narrow.deep_chunks(16, 512, False)}")
    deep(None)()


if __name__ == "__main__":
    main()
