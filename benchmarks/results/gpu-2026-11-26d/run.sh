# GPU calls of 2026-11-26 (fourth session): the Gluon MLA kernels' chunk buffers, paired timings.
#   bash run.sh OUT PART...   PART: probe (probe.py: the tree's Gluon MLA kernels against main 0ff2888's;
#       logs/probe.txt came from its first version, which compared the fp8 kernel with its row sums
#       reduced every tile and once after the loop) | narrow (the narrow and
#       fp8 kernels' tests and the fp8 / NaN / strided / graph tests) | fuzz-fp8 (the narrow fp8 fuzz) |
#       mla (the MLA test files) | fuzz-mla (the other Gluon MLA fuzzes) | memcheck (the fp8 cases, NaN scales and bad block ids under
#       compute-sanitizer) | bench-attn (paged_attention.py) | bench-mla (mla_decode.py, overhead.py);
#       the bench parts with FlashAttention-4 and FlashInfer on PYTHONPATH: the bundles of
#       ../shared/tools/fa4-bundle.sh and flashinfer-bundle.sh carried over three calls (each under
#       the 64 MiB a call may carry), FA4's install.sh run, the FlashInfer wheels unzipped to /tmp/site,
#       PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe) timeout 260 python3 "$here/probe.py" > "$out/probe.txt" 2>&1; tail -14 "$out/probe.txt" ;;
narrow) t narrow 300 -n 8 -m "not fuzz" -k "narrow or declines or bad_block or graph or fp8 or nan or strided or e4m3 or e5m2" \
        tests/test_triton_mla.py ;;
fuzz-fp8) t fuzz-fp8 300 -n 10 -m fuzz -k narrow_fp8 tests/test_triton_mla.py ;;
mla) t mla 500 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 500 -n 12 -m fuzz -k "gluon and not fp8" tests/test_triton_mla.py ;;
memcheck)
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
        tests/test_triton_mla.py -k "(test_gluon_mla_narrow_cuda and (e4m3 or e5m2)) or nan_kv_scale_cuda or test_gluon_mla_bad_block_ids_cuda" \
        > "$out/memcheck-fp8.log" 2>&1
    echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck-fp8.log" | tail -3 ;;
bench-attn)
    timeout 540 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv|paired" | head -80 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
