# GPU calls of 2026-11-26 (fifth session): the wide and fp8 Gluon MLA kernels' queries in one
# allocation a chunk, the eager host path's pieces, the wide kernel's source-level profile.
#   bash run.sh OUT PART...   PART: probe (probe.py: the tree's wide and fp8 MLA kernels against
#       main e3e94b3's) | probe-mtp (probe_mtp.py, on commit 86e8123's tree) | probe-rows
#       (probe_rows.py: mla_sm90_rows.py against the narrow kernel at 32 rows) | narrow (the narrow and
#       fp8 kernels' tests) | host (host_probe.py) | kernels (kernels.py: each kernel's time in a
#       call) | tune-combine (tune.py's combine sweeps of MLA B1 x 32768 H128) | tune-decode
#       (tune.py's attn_mha and attn_b64 sweeps) |
#       launch (the cached launcher's, plan-cache and merge tests) | mla (the MLA test files) | fuzz-wide / fuzz-narrow (the
#       Gluon MLA fuzzes: the wide kernel's; the narrow kernel's on bf16 and fp8 caches) | fuzz-attn (the attention fuzz) | attn (attention, launcher,
#       compile, plan-cache and merge tests) | memcheck (the fp8 cases, NaN scales and bad block
#       ids under compute-sanitizer) | source-SHAPE (Nsight Compute, the kernel of KERNEL (regex)
#       on SHAPE, its SASS with stall samples, regions.py's summary) | bench-attn (paged_attention.py)
#       | bench-mla (mla_decode.py, overhead.py); the bench parts with FlashAttention-4 and
#       FlashInfer on PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh and
#       flashinfer-bundle.sh carried over several calls (each under the 64 MiB a call may carry),
#       FA4's install.sh run, the FlashInfer wheels unzipped to /tmp/site,
#       PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# In logs/, a part run again has its log renamed: probe-2.txt, kernels-2.txt (after the combine
# change), host-probe-2.txt / -3.txt, pytest-mla-final.log (the final tree); the narrow part's log is
# pytest-narrow-paired.log (commit 86e8123's tree). b8-flash-rerun.txt is no part (its header has the
# command).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe) timeout 300 python3 "$here/probe.py" > "$out/probe.txt" 2>&1; tail -18 "$out/probe.txt" ;;
probe-rows) timeout 400 python3 "$here/probe_rows.py" > "$out/probe-rows.txt" 2>&1; tail -14 "$out/probe-rows.txt" ;;
probe-mtp) timeout 300 python3 "$here/probe_mtp.py" > "$out/probe-mtp.txt" 2>&1; tail -14 "$out/probe-mtp.txt" ;;
narrow) t narrow 300 -n 8 -m "not fuzz" -k "narrow or declines or bad_block or graph or fp8 or nan or strided or e4m3 or e5m2" \
        tests/test_triton_mla.py ;;
kernels) timeout 200 python3 "$here/kernels.py" > "$out/kernels.txt" 2>&1; tail -8 "$out/kernels.txt" ;;
tune-decode) timeout 560 python3 benchmarks/tune.py --sweeps attn_mha,attn_b64 --out "$out" > "$out/tune-decode.txt" 2>&1
    tail -16 "$out/tune-decode.txt" ;;
tune-combine) timeout 300 python3 benchmarks/tune.py --sweeps combine_mla_rows,combine_mla_b1 --out "$out" > "$out/tune-combine.txt" 2>&1
    tail -16 "$out/tune-combine.txt" ;;
launch) t launch 300 -n 8 -m "not fuzz" tests/test_fast_launch.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
host) timeout 200 python3 "$here/host_probe.py" > "$out/host-probe.txt" 2>&1; head -48 "$out/host-probe.txt" ;;
mla) t mla 500 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-wide) t fuzz-wide 500 -n 12 -m fuzz -k kernel_fuzz tests/test_triton_mla.py ;;
fuzz-narrow) t fuzz-narrow 560 -n 12 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
fuzz-attn) t fuzz-attn 500 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
memcheck)
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
        tests/test_triton_mla.py -k "(test_gluon_mla_narrow_cuda and (e4m3 or e5m2)) or nan_kv_scale_cuda or test_gluon_mla_bad_block_ids_cuda" \
        > "$out/memcheck-mla.log" 2>&1
    echo "memcheck exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck-mla.log" | tail -3 ;;
source-*)
    shape=${part#source-}
    timeout 300 ncu --profile-from-start off --kernel-name "regex:${KERNEL:-_mla_sm90_kernel}" --launch-count 1 --set full \
        --import-source yes -f -o "$out/full-$shape" python3 benchmarks/ncu_profile.py "$shape" > "$out/full-$shape.log" 2>&1
    echo "ncu exit $?"; tail -3 "$out/full-$shape.log"
    ncu -i "$out/full-$shape.ncu-rep" --page source --csv --print-source sass > "$out/source-$shape.csv" 2>&1
    ncu -i "$out/full-$shape.ncu-rep" --page details > "$out/details-$shape.txt" 2>&1
    rm -f "$out/full-$shape.ncu-rep"
    python3 "$here/regions.py" "$out/source-$shape.csv" 40 > "$out/regions-$shape.txt" 2>&1; head -70 "$out/regions-$shape.txt"
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy" "$out/details-$shape.txt" | head -8 ;;
bench-attn)
    timeout 540 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv|paired" | head -80 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
