"""The Gluon MLA kernels' split-KV partial outputs in the query's dtype (bf16, "query") against
float32 ("fp32", as before), switched by ``mla._GLUON_PARTIALS_IN_QUERY_DTYPE`` (as run in call 4; every Gluon kernel; the
package now keeps it to the narrow kernels as ``_NARROW_PARTIALS_IN_QUERY_DTYPE``), timed as
``mla_probe.compare`` times them (CUDA-graph replays, the variants alternated round by round, each
output checked against a float32 gather-einsum): every split shape of the narrow, pair, fp8 and wide
kernels the benchmarks have.

    python3 probe_partials.py   # PROBE_ROUNDS=3, PROBE_SHAPES=name,...
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import mla_probe as P  # noqa: E402


def partials(in_query_dtype: bool):
    def switch():
        P.tmla._GLUON_PARTIALS_IN_QUERY_DTYPE = in_query_dtype  # (now _NARROW_PARTIALS_IN_QUERY_DTYPE)
    return switch


def main():
    by = {s.name: s for s in P.md.SHAPES}
    m = by["mtp2_B64_ctx4096_H16"]
    shapes = [m, replace(m, name="mtp2_B32_ctx8192_H16", batch=32, seq_len=8192), by["B32_ctx8192_H16"],
              replace(by["B32_ctx8192_H16"], name="B16_ctx8192_H16", batch=16), by["B1_ctx32768_H128"],
              by["mtp4_B32_ctx4096_H16"], by["mtp2_fp8_B64_ctx4096_H16"]]
    P.compare(shapes, {"query": partials(True), "fp32": partials(False)}, 3, lambda plan: f"splits {P.splits(plan)}")
    partials(True)()


if __name__ == "__main__":
    main()
