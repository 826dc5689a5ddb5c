# GPU calls of 2026-11-27 (eleventh session).
#   bash run.sh OUT PART...   PART: probe-fold (probe_fold.py with fold.patch applied for it: the
#       narrow MLA kernel's splits merged by each query block's last split against the combine
#       kernel) | variant-fold (fold.patch applied for the parts after it) | probe-direct
#       (probe_direct.py: the 2-token grid without its empty programs) | probe-lsum (probe_lsum.py:
#       the narrow kernel with its row sums added once after its key loop, against the package's) | probe-ksplit
#       (probe_ksplit.py: mla_sm90_ksplit against the narrow and pair kernels) | ksplit-tests (the
#       pair kernel's tests and fuzz with mla_sm90_ksplit's kernel in its place, ksplit_plugin.py) | mla (the MLA test
#       files) | fuzz-narrow (the narrow bf16 and fp8 MLA kernels' fuzz) | fuzz-wide (the wide
#       and pair kernels' fuzz) | bench-mla (mla_decode.py, overhead.py; FlashAttention-4 and
#       FlashInfer on PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh and
#       flashinfer-bundle.sh carried over several calls, FA4's install.sh run, the FlashInfer wheels
#       unzipped to /tmp/site, PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD)
#       | compile (the compile / export / CUDA-graph tests) | alloc (alloc_cost.py: paged_attention's
#       output allocations against the rest of its eager host time)
# Calls, in order, all on the tree of main 5f17277 (the package unchanged): probe-fold mla with
# fold.patch's first version applied by hand (its merge loading one split's chunk at a time; the
# call's first try stopped at a missing argument of the unfolded launches; logs/probe-fold-1.txt,
# pytest-mla-fold-1.log); then the same with fold.patch as committed (logs/probe-fold.txt,
# pytest-mla-fold.log); then probe-direct (logs/probe-direct.txt); then, with PROBE_ROUNDS=2,
# probe-ksplit ksplit-tests (logs/probe-ksplit.txt, pytest-ksplit.log); then probe-lsum mla with
# the row-sum change applied to the package (the code probe_lsum.py now builds as "after"; the
# probe then loaded main 66e3aec's module as "before"; logs/probe-lsum.txt, pytest-mla-lsum.log).
# then alloc, and `python3 benchmarks/overhead.py` in the same call (logs/alloc-cost.txt,
# logs/overhead/); then, once the four probes shared _probe.py, `PROBE_ROUNDS=1
# PROBE_SHAPES=mtp2_B64_ctx4096_H16` probe-fold probe-direct probe-lsum probe-ksplit
# (logs/probes-smoke.txt); then, once every probe of 2026-11-27 used benchmarks/mla_probe.py,
# smoke.sh (logs/smoke/; right.txt copied from the call's output, the file itself not returned). A
# machine a call, each started fresh (nine calls); no FlashInfer or FlashAttention-4 staged.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
case "$part" in
probe-fold)
    git apply "$here/fold.patch"
    timeout 300 python3 "$here/probe_fold.py" > "$out/probe-fold.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-fold.txt"
    git apply -R "$here/fold.patch" ;;
variant-fold) git apply "$here/fold.patch" ;;
probe-ksplit) timeout 400 python3 "$here/probe_ksplit.py" > "$out/probe-ksplit.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-ksplit.txt" ;;
ksplit-tests) export PYTHONPATH=$PYTHONPATH:$here; t ksplit 500 -n 14 -p ksplit_plugin -k "pair" tests/test_triton_mla.py ;;
probe-lsum) timeout 300 python3 "$here/probe_lsum.py" > "$out/probe-lsum.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-lsum.txt" ;;
alloc) timeout 120 python3 "$here/alloc_cost.py" > "$out/alloc-cost.txt" 2>&1; cat "$out/alloc-cost.txt" | tail -12 ;;
probe-direct) timeout 300 python3 "$here/probe_direct.py" > "$out/probe-direct.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-direct.txt" ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-narrow) t fuzz-narrow 400 -n 14 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
fuzz-wide) t fuzz-wide 540 -n 14 -m fuzz -k "kernel_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
compile) t compile 300 -n 8 tests/test_compile_export.py tests/test_mla_module.py ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
