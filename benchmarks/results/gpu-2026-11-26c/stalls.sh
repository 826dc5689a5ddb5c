# Where the narrow MLA kernel's time goes on an fp8 cache (and bf16 for comparison): warp stall
# reasons, shared-memory and tensor-pipe utilisation, one warm launch each, then a full Nsight
# Compute report of the fp8 launch with per-instruction stall samples (source page, SASS).
#   bash stalls.sh OUT_DIR [SHAPE...]
out=${1:?out dir}; shift
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
M=$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,smsp__inst_executed.sum,sm__cycles_elapsed.avg,l1tex__throughput.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard short_scoreboard mio_throttle wait math_pipe_throttle dispatch_stall \
         no_instruction not_selected selected lg_throttle membar branch_resolving sleeping; do
    M=$M,smsp__warp_issue_stalled_${r}_per_warp_active.pct
done
[ $# -gt 0 ] || set -- fp8_B128_ctx4096_H16 B128_ctx4096_H16
for shape in "$@"; do
    timeout 200 ncu --profile-from-start off --kernel-name "regex:${KERNEL:-_mla_narrow|_mla_fp8}" --launch-count 1 --metrics "$M" \
        python3 benchmarks/ncu_profile.py "$shape" > "$out/stalls-$shape.txt" 2>&1
    echo "== $shape (exit $?)"
    grep -E "^\s+(gpu__|dram__|sm__|smsp__|l1tex__)" "$out/stalls-$shape.txt" | sed 's/_per_warp_active.pct//; s/smsp__warp_issue_stalled_//' \
        | awk '{print "  " $1, $NF}' | head -40
done
