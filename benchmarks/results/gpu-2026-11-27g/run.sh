# GPU calls of 2026-11-27 (fourteenth session).
#   bash run.sh OUT PART...   PART: fp8-tests (the Gluon fp8 decode kernel's test file and the attention
#       file's fp8 tests) | probe (probe_fp8.py: the Gluon kernel against the Triton kernel, graph replays
#       alternated) | attn (the attention test files) | fuzz (the fuzz of both kernels' files) |
#       bench-attn (paged_attention.py) | fuzz-fp8 (the Gluon kernel's fuzz) | bench-decode (paged_attention.py,
#       decode shapes, this project's contenders) | bench-fp8 (the fp8 decode shape alone) | staging parts of ../gpu_run.sh
# Calls, in order, one machine each unless said (logs/callN/): 1 `fp8-tests probe fp8-attn` (the first kernel:
# K and V to fp16 tiles, two programs an SM); 2 `fp8-tests probe` (K as a register operand, three programs an
# SM: the committed kernel; -x stopped at a test's stale expectation); 3 `attn probe` (PROBE=B256x1024
# B128x2048 B512x512 B64x4096); 4 `fp8-tests fuzz`; 5 `fuzz-fp8 bench-decode` (same machine as 4); 6 `bench-fp8`,
# then probe_fp8.py B64x4096 B256x1024 B64x4096 (same machine; stdout in logs/call6/probe-stdout.txt); on
# the tree with the kernel switched off by default and tests switching it on (not kept), 7 `fuzz-fp8 attn`; 8 `place ncu-place`
# (probe_place.py: eager timings on inputs allocated at four places, then Nsight Compute). The probe figures of
# calls 1-3 and 6 are not per-call times (each graph captured its own estimate of the call count, both divided
# by a third; probe_fp8.py now times the pair with _harness.bench_pair): see ../../RESULTS.md, fourteenth run.
# After call 8 the kernel left the package; it is archived here (decode_sm90_fp8.py, test_decode_sm90_fp8.py,
# restore.diff), and the parts that need it (fp8-tests, fuzz-fp8, probe, place, ncu-place) need it restored.
# Then, on the package as it stands, 9 `ncu-triton` (the Triton decode kernel, bf16 and e4m3, under Nsight Compute),
# 10 `tune-fp8` (tune.py's attn_fp8 sweep, all 23 candidates); on 15dcf49 (flash._recorded_forward's arguments
# reshaped), 11 `stash-a` and 12 `stash-fa4 stage flash` (logs/call12/pytest-flash.log).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
fp8-tests) t fp8 400 -n 8 -x -m "not fuzz" tests/test_decode_sm90_fp8.py ;;
fp8-attn) t fp8-attn 300 -n 8 -m "not fuzz" -k "fp8 or e4m3 or e5m2" tests/test_triton_paged_attention.py ;;
probe) timeout 300 python3 "$here/probe_fp8.py" $PROBE > "$out/probe.txt" 2>&1; grep -v Warn "$out/probe.txt" | tail -20 ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py tests/test_decode_sm90_fp8.py ;;
fuzz) t fuzz 500 -n 12 -m fuzz tests/test_triton_paged_attention.py tests/test_decode_sm90_fp8.py ;;
fuzz-fp8) t fuzz-fp8 400 -n 12 -m fuzz tests/test_decode_sm90_fp8.py ;;
bench-decode)
    mkdir -p "$out/bench-decode"
    timeout 400 python3 benchmarks/paged_attention.py --shapes decode --out "$out/bench-decode" \
        --contenders torch_paged_attn \
        2> "$out/bench-decode/progress.log" | tee "$out/bench-decode/paged_attention.txt" | grep -E "torch_paged_attn|copy" | head -60 ;;
bench-attn)
    mkdir -p "$out/bench-attn"
    timeout 560 python3 benchmarks/paged_attention.py --out "$out/bench-attn" 2> "$out/bench-attn/progress.log" \
        | tee "$out/bench-attn/paged_attention.txt" | grep -E "torch_paged_attn|flashinfer|flash_attn_4|paired" | head -90 ;;
bench-fp8)  # the fp8 decode shape alone, in a fresh process (the Gluon kernel on by default at the time)
    mkdir -p "$out/bench-fp8"
    timeout 200 python3 benchmarks/paged_attention.py --shapes decode_fp8 --out "$out/bench-fp8" --contenders torch_paged_attn \
        2> "$out/bench-fp8/progress.log" | tee "$out/bench-fp8/paged_attention.txt" | grep -E "torch_paged_attn|copy" | head -20 ;;
place) timeout 200 python3 "$here/probe_place.py" > "$out/place.txt" 2>&1; grep -v Warn "$out/place.txt" | tail -8 ;;
ncu-place)  # the same kernels on inputs A and B under Nsight Compute (clocks left alone)
    NCU=1 timeout 400 ncu --clock-control none -k "regex:_decode_fp8_kernel|_attention_kernel" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,lts__t_sectors_op_read.sum,lts__t_requests_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
        python3 "$here/probe_place.py" > "$out/ncu-place.txt" 2>&1; grep -E "key cache|_kernel|duration|dram__|lts__|xbar|warps_active" "$out/ncu-place.txt" | head -60 ;;
ncu-triton)  # the package's Triton decode kernel, bf16 and fp8, B64 x 4096 (probe_ncu_triton.py), last call of each
    timeout 400 ncu --clock-control none -k regex:_attention_kernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
        python3 "$here/probe_ncu_triton.py" > "$out/ncu-triton-bf16.txt" 2>&1
    timeout 400 ncu --clock-control none -k regex:_attention_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
        python3 "$here/probe_ncu_triton.py" > "$out/ncu-triton-fp8.txt" 2>&1
    for f in bf16 fp8; do echo "== $f"; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Stall|Block Limit" "$out/ncu-triton-$f.txt" | head -30; done ;;
tune-fp8)  # tune.py's attn_fp8 sweep: every candidate of the fp8 decode tile, the Triton kernel
    mkdir -p "$out/tune-fp8"
    timeout 560 python3 benchmarks/tune.py --sweeps attn_fp8 --out "$out/tune-fp8" > "$out/tune-fp8/tune.txt" 2>&1
    grep -E "attn_fp8|copy|Error" "$out/tune-fp8/tune.txt" | head -40 ;;
flash) t flash 400 -n 4 tests/test_flash_backend.py ;;
*) echo "unknown part $part" ;;
esac
done
