"""The narrow MLA kernel with its first chunks a stage deeper (``mla_sm90_narrow.deep_chunks``:
tile j + 3's first chunks copied once tile j is done) against the same kernel without
(``DEEP_CHUNKS`` off: sm_90 SASS byte-identical to main e00295d's), alternated round by round in
one process (``mla_probe.compare``: CUDA-graph replays, p50 us, each output checked against a
float32 gather-einsum). ``PROBE_SHAPES`` / ``PROBE_ROUNDS`` as there."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402

from torch_paged_attn.lowering.triton import mla_sm90_narrow as narrow  # noqa: E402


def switch(on: bool):
    def use():
        narrow.DEEP_CHUNKS = on
    return use


def describe(plan: dict) -> str:
    return f"splits {P.splits(plan)} fold {plan.get('fold')} block_q {plan.get('block_q')}"


if __name__ == "__main__":
    P.compare(P.narrow_shapes(), {"main": switch(False), "deep": switch(True)}, 3, describe)
