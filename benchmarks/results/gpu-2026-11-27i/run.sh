# GPU calls of 2026-11-27 (sixteenth session), one H100 machine each (logs/callN/).
#   bash run.sh OUT PART...   PART: ab (eager host time, this tree against the tree before pin.diff: overhead.py's
#       rows ROWS in turn, three rounds, each tree in its own process) | overhead (overhead.py, every row) |
#       probe (probe_pin.py: the pinned launch against the runner in one process, in turn) |
#       probe2 (probe_pin2.py: host time piece by piece; pinned and runner in alternating windows) |
#       partials (probe_partials.py: the Gluon MLA kernels' split partials in the query's dtype against float32) |
#       mla (the MLA test files, GPU tier) |
#       bench-mla (mla_decode.py; FlashAttention-4 and FlashInfer staged by the staging parts) |
#       fuzz-mla (the narrow bf16 and pair MLA kernels' fuzz) |
#       tests (the launcher, plan-cache, compile/export and attention test files, GPU tier) | staging parts of
#       ../gpu_run.sh
# Calls, in order, each on the tree of its commit (the package as 8ae594a):
#   1 `ab overhead` (8ae594a): overhead.py's rows for both trees in turn, then every row; a noisy host (the null
#     kernel's cached launch 8.8-11.7 us by events); only 8 files came back (the rest left out by count);
#   2 `probe tests`: probe_pin.py (8 rounds, CUDA events), then the GPU tests: 197 passed, 90 skipped;
#   3 `WINDOWS=60 probe2`: probe_pin2.py (the figures RESULTS.md's sixteenth run takes);
#   4 `partials mla` on 3408556 (every Gluon MLA kernel's split partials in bf16): probe_partials.py, the MLA
#     files 178 passed;
#   then one machine, on 97744f3 (the narrow kernels' partials in bf16, the wide kernel's float32): 5 `stash-a`,
#   6 `stash-fa4 stage`, 7 `stash-b mla` (180 passed), 8 `stash-fi site bench-mla` (its output is
#   benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-27-i.*), 9 `site overhead`
#   (benchmarks/results/overhead-NVIDIA-H100-80GB-HBM3-2026-11-27-i.*), 10 `WINDOWS=60 probe2`;
#   11 `fuzz-mla` on 4e9dae8 (the package as 97744f3), another machine: 32 passed.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
ROWS=${ROWS:-"null kernel, cached launch;torch add_ (1 element);paged_attention;paged_attention_out;mla_decode"}
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
ab)
    rm -rf /tmp/base && mkdir -p /tmp/base && cp -r torch_paged_attn benchmarks /tmp/base/ \
        && (cd /tmp/base && git apply -R "$OLDPWD/$here/pin.diff") && echo "base tree: pin.diff removed"
    for round in 1 2 3; do
        for tree in base new; do
            root=$PWD; [ $tree = base ] && root=/tmp/base
            (cd "$root" && PYTHONPATH=$root timeout 120 python3 benchmarks/overhead.py --rows "$ROWS" \
                --out "$out/ab-$tree-$round" > "$out/ab-$tree-$round.txt" 2>&1)
            echo "== $tree round $round"; grep -E "^(null kernel, cached|torch add_|paged_attention|mla_decode)" "$out/ab-$tree-$round.txt"
        done
    done ;;
overhead)
    timeout 200 python3 benchmarks/overhead.py --out "$out/overhead" > "$out/overhead.txt" 2>&1
    grep -v Warn "$out/overhead.txt" | tail -22 ;;
probe) timeout 300 python3 "$here/probe_pin.py" > "$out/probe.txt" 2>&1; grep -v Warn "$out/probe.txt" | tail -20 ;;
probe2) timeout 300 python3 "$here/probe_pin2.py" > "$out/probe2.txt" 2>&1; grep -v Warn "$out/probe2.txt" | tail -20 ;;
partials) timeout 330 python3 "$here/probe_partials.py" > "$out/partials.txt" 2>&1; grep -v Warn "$out/partials.txt" | tail -45 ;;
mla) t mla 250 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
bench-mla)
    timeout 340 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
fuzz-mla) t fuzz-mla 300 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
tests) t tests 330 -n 10 -m "not fuzz" tests/test_fast_launch.py tests/test_plan_cache.py tests/test_compile_export.py \
        tests/test_triton_paged_attention.py ;;
*) echo "unknown part $part" ;;
esac
done
