"""The narrow MLA kernel's query loads issued before its first tiles' copies or after them, by its
rows: the package's ``_QUERIES_FIRST`` (16: programs of one warpgroup first) against 0 ("tiles":
every program copies first, as main 78f47e8 did) and 32 ("queries": every program loads its
queries first), each built from the package's ``mla_sm90_narrow`` by one replacement, timed as
``mla_probe.compare`` times them. probe_timeline.py measured main's order: a program's queries
land in shared memory 5-8 us after it starts, after its first tile (the first tile's wait then
takes 0.03-0.3 us). logs/probe-qfirst.txt is a first version on 78f47e8 (queries first for every
program, against main), logs/probe-qfirst-2.txt this one on the package that took its result.

    python3 probe_qfirst.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90_narrow  # noqa: E402

_PACKAGE = "    _QUERIES_FIRST = gl.constexpr(16)\n"


def rows_first(rows: int):
    """The package's module with queries first in programs of at most ``rows`` rows."""
    source = P.replaced(mla_sm90_narrow, ((_PACKAGE, f"    _QUERIES_FIRST = gl.constexpr({rows})\n"), ))
    return P.module_from_source("mla_sm90_narrow", source)


def main():
    shapes = P.narrow_shapes()
    P.compare(shapes, {"package": P.swap("mla_sm90_narrow", mla_sm90_narrow),
                       "tiles": P.swap("mla_sm90_narrow", rows_first(0)),
                       "queries": P.swap("mla_sm90_narrow", rows_first(32))}, 3,
              lambda plan: f"splits {P.splits(plan)}")
    P.swap("mla_sm90_narrow", mla_sm90_narrow)()


if __name__ == "__main__":
    main()
