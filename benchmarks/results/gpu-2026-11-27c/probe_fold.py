"""The narrow MLA kernel's splits merged by the last split of each query block (``mla.SM90_FOLD``,
``mla_sm90_narrow._fold``) against the combine kernel launched after them (the fold off), as
``mla_probe.compare`` times them; ``PROBE_FOLD_MAX`` sets ``mla._FOLD_MAX_SPLITS`` (shapes that split
more ways run the combine either way).

    git apply fold.patch && python3 probe_fold.py   # PROBE_ROUNDS=4, PROBE_SHAPES=name,..., PROBE_FOLD_MAX=8

It needs the package with ``fold.patch`` applied (``run.sh probe-fold`` applies it for the run and
takes it off after): the switch ``mla.SM90_FOLD`` and the fold are the patch's.
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402


def main():
    tmla = P.tmla
    tmla._FOLD_MAX_SPLITS = int(os.environ.get("PROBE_FOLD_MAX", "8"))
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    one = replace(m, name="B64_ctx4096_H16", q_len=1)
    shapes = [m, one, by["B32_ctx8192_H16"], replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192),
              replace(one, name="B16_ctx8192_H16", batch=16, seq_len=8192),
              replace(m, name="mtp2_B64_ctx4096_H16_bs16", block_size=16)]

    def fold(on: bool):
        return lambda: setattr(tmla, "SM90_FOLD", on)

    P.compare(shapes, {"fold": fold(True), "combine": fold(False)}, 4,
              lambda p: f"block_q {p.get('block_q')} splits {P.splits(p)} fold {p.get('fold')}")
    tmla.SM90_FOLD = True


if __name__ == "__main__":
    main()
