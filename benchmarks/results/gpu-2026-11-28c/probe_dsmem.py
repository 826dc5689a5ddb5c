"""On the tree of b76ceee: the fold's handover through distributed shared memory (its mla_sm90_narrow: rank
1 stores its normalised O^T and log2 LSE into rank 0's shared memory, ``_cluster.remote_begin``)
against main e00295d's kernel (through ``out`` / ``lse`` in global memory: the package's source
with ``handover_l2.patch`` beside this file, ``git diff b76ceee e00295d`` of the kernel file, applied
by ``hunks``), alternated round by round in one process
(``mla_probe.compare``: CUDA-graph replays, p50 us, outputs checked against a float32
gather-einsum). ``PROBE_SHAPES`` / ``PROBE_ROUNDS`` as there."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import mla_probe as P  # noqa: E402

from torch_paged_attn.lowering.triton import mla_sm90_narrow as narrow  # noqa: E402


def hunks(path: str) -> tuple:
    """The hunks of the unified diff ``path`` as ``mla_probe.replaced``'s ``(old, new)`` pairs:
    each hunk's context and removed lines, and its context and added lines."""
    pairs = []
    with open(path) as f:
        for line in f.read().splitlines(keepends=True):
            if line.startswith("@@"):
                pairs.append(([], []))
            elif pairs and line[:1] in " -+":
                old, new = pairs[-1]
                if line[0] != "+":
                    old.append(line[1:])
                if line[0] != "-":
                    new.append(line[1:])
    return tuple(("".join(old), "".join(new)) for old, new in pairs)


def describe(plan: dict) -> str:
    return f"splits {P.splits(plan)} fold {plan.get('fold')} block_q {plan.get('block_q')}"


if __name__ == "__main__":
    os.environ.setdefault("PROBE_SHAPES", "mtp2_B64_ctx4096_H16,B64_ctx4096_H16,mtp2_B32_ctx8192_H16")
    main = P.module_from_source("mla_sm90_narrow",
                                P.replaced(narrow, hunks(os.path.join(HERE, "handover_l2.patch"))))
    P.compare(P.narrow_shapes(), {"main": P.swap("mla_sm90_narrow", main), "dsmem": P.swap("mla_sm90_narrow", narrow)},
              3, describe)
