# GPU calls of 2026-11-26 (third session): the narrow Gluon MLA kernel on fp8 caches.
#   bash run.sh OUT PART...   PART: probe (fp8_probe.py) | narrow (the narrow kernel's tests, fp8
#       cases among them, and the fp8 / NaN / strided / graph tests) | fuzz-fp8 (the narrow fp8
#       fuzz) | gluon (Gluon, sm90 and launcher tests) | attn (attention, launcher, compile, plan-cache,
#       merge, MLA-module files) | rest (every file but the three kernel files) | mla (MLA test files) | fuzz-mla (the other Gluon MLA fuzzes) | memcheck (the fp8
#       cases, NaN scales and bad block ids under compute-sanitizer) | bench-mla (mla_decode.py with
#       FlashInfer staged first, PYTHONPATH exported)
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe) timeout 240 python3 "$here/fp8_probe.py" > "$out/fp8-probe.txt" 2>&1; tail -12 "$out/fp8-probe.txt" ;;
narrow) t narrow 300 -n 8 -m "not fuzz" -k "narrow or declines or bad_block or graph or fp8 or nan or strided or e4m3 or e5m2" \
        tests/test_triton_mla.py ;;
fuzz-fp8) t fuzz-fp8 300 -n 10 -m fuzz -k narrow_fp8 tests/test_triton_mla.py ;;
gluon) t gluon 330 -n 6 -m "not fuzz" -k "gluon or sm90 or fast" tests/test_triton_mla.py tests/test_triton_prefill.py \
        tests/test_fast_launch.py ;;
attn) t attn 480 -n 8 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py tests/test_mla_module.py ;;
rest) t rest 480 -n 8 -m "not fuzz" --ignore=tests/test_triton_paged_attention.py --ignore=tests/test_triton_mla.py \
        --ignore=tests/test_triton_prefill.py tests ;;
mla) t mla 500 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 500 -n 12 -m fuzz -k "gluon and not fp8" tests/test_triton_mla.py ;;
memcheck)
    timeout 420 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
        tests/test_triton_mla.py -k "(test_gluon_mla_narrow_cuda and (e4m3 or e5m2)) or nan_kv_scale_cuda or test_gluon_mla_bad_block_ids_cuda" \
        > "$out/memcheck-fp8.log" 2>&1
    echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck-fp8.log" | tail -3 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40 ;;
*) echo "unknown part $part" ;;
esac
done
