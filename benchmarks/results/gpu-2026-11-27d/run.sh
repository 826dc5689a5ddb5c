# GPU calls of 2026-11-27 (twelfth session).
#   bash run.sh OUT PART...   PART: stash-a (the first 40 MiB of FlashAttention-4's .fa4a bundle part,
#       carried as .fa4a1, to /root/stash) | stash-b (the first part of the FlashInfer wheel, carried as
#       .fibA) | stash-c (carrying .fibB, .fa4a2 and .fib2: the rest of both, each joined) | stage
#       (carrying .fa4b: FA4's install.sh, the FlashInfer wheels unzipped to /tmp/site, on PYTHONPATH
#       for the parts after it) | probe-deep (probe_deep.py: the narrow MLA kernel's first chunks a
#       stage deeper, against DEEP 0) | mla (the MLA test files) | fuzz-narrow (the narrow bf16 and
#       fp8 MLA kernels' fuzz) | fuzz-wide (the wide and pair MLA kernels' fuzz) | compile (the
#       compile/export and model files) | bench-mla (mla_decode.py, overhead.py) | probe-fill (probe_fill.py:
#       the MLA decode on 60-132 sequences, the grids of 120-264 programs) | variant-deep (deep.patch
#       applied to the package for the parts after it: probe_deep.py needs it) | probe-pdl
#       (probe_pdl.py: the narrow MLA kernel launched with programmatic dependent launch, its first
#       instruction the grid dependency wait)
# The bundles are split so that each call's carry and the tree stay under 64 MiB (the tree is 17).
# Calls, in order: `stash-a probe-deep` with deep.patch applied to the tree of main b2d35d6
# (logs/probe-deep.txt; the patch was then taken back out of the package); `probe-fill` on b2d35d6
# (logs/probe-fill.txt); `probe-pdl` on b2d35d6 with a first probe_pdl.py that built the waiting
# narrow module from the package's by replacements (logs/probe-pdl.txt); then, on the tree of the
# next commit (the narrow kernels launched with PDL), one machine: `stash-a probe-pdl mla
# fuzz-narrow` (logs/probe-pdl-2.txt, pytest-mla.log, pytest-fuzz-narrow.log), `stash-b fuzz-wide`
# (pytest-fuzz-wide.log), `stash-c`, `stage bench-mla` (its output is
# benchmarks/results/{mla_decode,overhead}-NVIDIA-H100-80GB-HBM3-2026-11-27-d.*; logs/bench/), `compile`
# (pytest-compile.log). Each call wrote under $OUT/logs.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
probe-deep) timeout 420 python3 "$here/probe_deep.py" > "$out/probe-deep.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-deep.txt" ;;
probe-fill) timeout 400 python3 "$here/probe_fill.py" > "$out/probe-fill.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-fill.txt" ;;
probe-pdl) timeout 400 python3 "$here/probe_pdl.py" > "$out/probe-pdl.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-pdl.txt" ;;
variant-deep) git apply "$here/deep.patch" ;;  # deep.patch applied to the package for the parts after it
fuzz-wide) t fuzz-wide 540 -n 14 -m fuzz -k "kernel_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
compile) t compile 400 -n 12 tests/test_compile_export.py tests/test_model_integration.py ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-narrow) t fuzz-narrow 400 -n 14 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
