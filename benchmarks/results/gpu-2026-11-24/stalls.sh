# Warp stall reasons (% of active warps stalled for each reason) and tensor-pipe activity of one
# warm launch per shape: bash stalls.sh OUT_DIR
out=${1:?out dir}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
M=sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard short_scoreboard mio_throttle wait math_pipe_throttle dispatch_stall \
         no_instruction not_selected selected lg_throttle membar branch_resolving drain imc_miss misc sleeping tex_throttle; do
    M=$M,smsp__warp_issue_stalled_${r}_per_warp_active.pct
done
stalls() {  # stalls NAME KERNEL_REGEX SHAPE [ncu_profile.py options]
    local name=$1 regex=$2; shift 2
    timeout 200 ncu --profile-from-start off --kernel-name "regex:$regex" --launch-count 1 --metrics "$M" \
        python3 benchmarks/ncu_profile.py "$@" > "$out/stalls-$name.txt" 2>&1
    echo "== $name (exit $?)"
    grep -E "^\s+(sm__|smsp__)" "$out/stalls-$name.txt" | sed 's/_per_warp_active.pct//; s/smsp__warp_issue_stalled_//' \
        | awk '{print "  " $1, $NF}' | sort -k2 -n -r | head -10
}
stalls prefill _prefill_kernel prefill_B4_q2048
stalls mla-h128 _mla_kernel B64_ctx4096_H128
stalls mla-fp8 _mla_kernel fp8_B128_ctx4096_H16
stalls mla-mtp _mla_kernel mtp2_B64_ctx4096_H16
stalls decode-fp8 _attention_kernel decode_fp8_B64_ctx4096
stalls mla-h16 _mla_kernel B128_ctx4096_H16
