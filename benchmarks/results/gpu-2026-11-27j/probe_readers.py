"""2 tokens a sequence at 16 heads: the planner's 32-row programs (a sequence's two tokens in one
program, split over the keys) against 16-row programs (a token a program, the two programs of a
sequence reading the same pages, the second mostly from L2), forced by ``mla._SHORT_SPLITS = 1``;
timed as ``mla_probe.compare`` times them (CUDA-graph replays, the variants alternated round by
round, each output checked against a float32 gather-einsum).

    python3 probe_readers.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402

PLANNED = P.tmla._SHORT_SPLITS


def short_splits(value: int):
    def switch():
        P.tmla._SHORT_SPLITS = value
    return switch


def main():
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192)]
    P.compare(shapes, {"planned": short_splits(PLANNED), "readers": short_splits(1)}, 3,
              lambda plan: f"splits {P.splits(plan)} block_q {plan.get('block_q')}")
    short_splits(PLANNED)()


if __name__ == "__main__":
    main()
