# Warp stall reasons, DRAM throughput and duration of the narrow MLA kernel (and the combine kernel
# after it) on the 16-head shapes, one warm launch each: bash stalls.sh OUT_DIR
out=${1:?out dir}
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard short_scoreboard mio_throttle wait math_pipe_throttle dispatch_stall \
         no_instruction not_selected selected lg_throttle membar branch_resolving sleeping; do
    M=$M,smsp__warp_issue_stalled_${r}_per_warp_active.pct
done
for shape in B128_ctx4096_H16 B32_ctx8192_H16 mtp2_B64_ctx4096_H16; do
    timeout 200 ncu --profile-from-start off --kernel-name "regex:_mla_narrow|_combine" --launch-count 2 --metrics "$M" \
        python3 benchmarks/ncu_profile.py "$shape" > "$out/stalls-narrow-$shape.txt" 2>&1
    echo "== $shape (exit $?)"
    grep -E "^  _|^\s+(gpu__|dram__|sm__|smsp__)" "$out/stalls-narrow-$shape.txt" | sed 's/_per_warp_active.pct//; s/smsp__warp_issue_stalled_//' \
        | awk '{print "  " $1, $NF}' | head -40
done
