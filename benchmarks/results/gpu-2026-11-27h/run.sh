# GPU calls of 2026-11-27 (fifteenth session), one H100 machine each (logs/callN/).
#   bash run.sh OUT PART...   PART: fp8-attn (the attention file's fp8, key-group and batched-score tests) |
#       probe (probe_groups.py) | split (probe_split.py) | unroll (probe_unroll.py) | qb (probe_qb.py) |
#       qb-shapes (probe_qb_shapes.py) | ncu-fp8 (Nsight Compute, full set and per-SASS-line samples, of the fp8
#       decode kernel; TAG names the variant) | groups-on / groups-off (key_groups.diff applied / removed) |
#       attn (the attention test files) | fuzz, fuzz-short (the attention fuzz, 2,000 configurations) |
#       bench-fp8 (paged_attention.py --shapes decode_fp8) | bench-decode, bench-attn, sass | staging parts of ../gpu_run.sh
# Calls, in order:
#   1 `fp8-attn probe` with key groups in the package (key_groups.diff on main bd9efba): one test failed on its
#     own helper (a NaN fill of a cross-layer fp8 cache; the case now takes the HND view), the probe slower;
#   2 `split`, 3 `unroll` (the UNROLL switch of unroll.diff), on bd9efba's kernels;
#   4 `ncu-fp8 groups-on`, then `TAG=-groups ncu-fp8 groups-off`, on bd9efba;
#   5 `qb`, 6 `qb-shapes`: the scores' dot batched over the warps, behind a switch then named _QB;
#   7 `attn fuzz` and 8 `bench-fp8 fuzz-short` on the final tree (fp8 decode batched by default); call 7's
#     fuzz stopped at the call's 600 s after 38 of its 40 families had passed, call 8's passed all 40;
#   9 `tiles` (probe_tiles.py: three other tiles with batched scores, all slower).
#   After the run the probes' shared code moved to _variants.py (the same calls, timing and output; imports
#   checked on the CPU, not re-run on a GPU: the session's device time was spent).
#   Call 4's -details.txt files are committed gzipped; logs/call4/stalls.txt is ncu_stalls.py on its -sass.csv.gz.
#   Call 8's bench-fp8/ folder did not come back from the machine (left out for its depth): its stdout is
#   logs/call8/bench-fp8-stdout.txt.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
fp8-attn) t fp8-attn 300 -n 8 -m "not fuzz" -k "fp8 or e4m3 or e5m2 or groups" tests/test_triton_paged_attention.py ;;
split) timeout 300 python3 "$here/probe_split.py" > "$out/split.txt" 2>&1; grep -v Warn "$out/split.txt" | tail -8 ;;
unroll) timeout 400 python3 "$here/probe_unroll.py" > "$out/unroll.txt" 2>&1; grep -v Warn "$out/unroll.txt" | tail -8 ;;
ncu-fp8)  # Nsight Compute, full set and per-SASS-line samples, of the fp8 decode kernel (B64 x 4096, its second
    # call; ../gpu-2026-11-27g/probe_ncu_triton.py runs bf16 then e4m3, two calls each); TAG names the variant
    timeout 400 ncu --set full --import-source no -k regex:_attention_kernel --launch-skip 3 --launch-count 1 \
        -f -o "$out/ncu-fp8${TAG:-}" python3 "$here/../gpu-2026-11-27g/probe_ncu_triton.py" > "$out/ncu-fp8${TAG:-}.log" 2>&1
    tail -3 "$out/ncu-fp8${TAG:-}.log"
    ncu -i "$out/ncu-fp8${TAG:-}.ncu-rep" --print-details all > "$out/ncu-fp8${TAG:-}-details.txt" 2>&1
    ncu -i "$out/ncu-fp8${TAG:-}.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$out/ncu-fp8${TAG:-}-sass.csv.gz"
    rm -f "$out/ncu-fp8${TAG:-}.ncu-rep"
    grep -E "Duration|DRAM Throughput|Registers Per|Shared Memory Configuration Size|Block Limit|Achieved Occupancy|Issued Warp" "$out/ncu-fp8${TAG:-}-details.txt" | head -20 ;;
groups-on) git apply --include='torch_paged_attn/*' "$here/key_groups.diff" && echo "key groups applied" ;;
groups-off) git apply -R --include="torch_paged_attn/*" "$here/key_groups.diff" && echo "key groups removed" ;;
qb) timeout 300 python3 "$here/probe_qb.py" > "$out/qb.txt" 2>&1; grep -v Warn "$out/qb.txt" | tail -8 ;;
qb-shapes) timeout 500 python3 "$here/probe_qb_shapes.py" $PROBE > "$out/qb-shapes.txt" 2>&1; grep -v Warn "$out/qb-shapes.txt" | tail -12 ;;
probe) timeout 300 python3 "$here/probe_groups.py" $PROBE > "$out/probe.txt" 2>&1; grep -v Warn "$out/probe.txt" | tail -20 ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
fuzz) t fuzz 500 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
bench-decode)
    mkdir -p "$out/bench-decode"
    timeout 400 python3 benchmarks/paged_attention.py --shapes decode --out "$out/bench-decode" \
        --contenders torch_paged_attn \
        2> "$out/bench-decode/progress.log" | tee "$out/bench-decode/paged_attention.txt" | grep -E "torch_paged_attn|copy" | head -60 ;;
bench-fp8)  # the fp8 decode shape alone (default, batch-invariant and auto), this project's contenders
    mkdir -p "$out/bench-fp8"
    timeout 200 python3 benchmarks/paged_attention.py --shapes decode_fp8 --out "$out/bench-fp8" --contenders torch_paged_attn \
        2> "$out/bench-fp8/progress.log" | tee "$out/bench-fp8/paged_attention.txt" | grep -E "torch_paged_attn|copy" | head -20 ;;
fuzz-short) t fuzz 290 -n 14 -m fuzz tests/test_triton_paged_attention.py ;;
tiles) timeout 200 python3 "$here/probe_tiles.py" > "$out/tiles.txt" 2>&1; grep -v Warn "$out/tiles.txt" | tail -6 ;;
tune-fp8b)  # tune.py's attn_fp8_batched sweep (the fp8 tile's candidates with batched scores)
    mkdir -p "$out/tune-fp8b"
    timeout 240 python3 benchmarks/tune.py --sweeps attn_fp8_batched --out "$out/tune-fp8b" > "$out/tune-fp8b.txt" 2>&1
    grep -E "attn_fp8|copy|Error" "$out/tune-fp8b.txt" | head -30 ;;
bench-attn)
    mkdir -p "$out/bench-attn"
    timeout 560 python3 benchmarks/paged_attention.py --out "$out/bench-attn" 2> "$out/bench-attn/progress.log" \
        | tee "$out/bench-attn/paged_attention.txt" | grep -E "torch_paged_attn|flashinfer|flash_attn_4|paired" | head -90 ;;
sass) timeout 300 python3 benchmarks/sass_report.py --shapes decode --out "$out/sass" > "$out/sass.txt" 2>&1; tail -30 "$out/sass.txt" ;;
*) echo "unknown part $part" ;;
esac
done
