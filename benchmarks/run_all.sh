#!/usr/bin/env bash
# The GPU check: the whole test suite on the GPU (fuzz included), a memcheck of the planted-bad-
# table tests, then the benchmarks (paged attention, eager overhead, MLA decode, the example
# model's decode step) and the plot. Logs and JSON go to OUT_DIR (default benchmarks/results).
# FlashAttention-4 rows appear when flash_attn.cute is importable (see the README's benchmark
# section for how to carry it).
#
#   bash benchmarks/run_all.sh [OUT_DIR] [PART ...]
#
# Without PART every part runs, in this order. Each part fits in one 10-minute call on one H100 or
# H200 (2026-11 timings in brackets), for machines lent that long a call:
#   tests-a      every test file but the six below, fuzz excluded, with pytest-xdist [~6 min
#                serially before the Gluon kernels' tests; not timed since]
#   tests-b      paged attention grid, validation, transformers, FlashAttention backend [~8 min]
#   tests-mla    the MLA kernels' and layer's files, fuzz excluded (with pytest-xdist: PYTEST_N
#                workers, default 8; 353 s at 10 workers, H100, 2026-11-24)
#   fuzz-a fuzz-b fuzz-c   attention fuzz families 0-12, 13-25, 26-39 (2,000 configurations) [~8 min each]
#   fuzz-prefill the Triton and Gluon prefill kernels' fuzz, 40 families (with pytest-xdist)
#   fuzz-mla     the Gluon MLA kernel's fuzz, 20 families, 500 configurations (with pytest-xdist:
#                254 s at 14 workers, H100, 2026-11-24)
#   memcheck     compute-sanitizer over the planted-bad-table tests         [~3 min]
#   attention    benchmarks/paged_attention.py (every contender, FlashInfer included, CUDA-graph and
#                eager timing), then the plot [~5 min before FlashInfer and eager rows; not yet
#                timed since: FlashInfer's first JIT compilation adds minutes, cached after]
#   other        overhead.py (FlashInfer run() rows when it imports; then --null-launch: the
#                package's host code alone), mla_decode.py,
#                decode_step.py --layers 2 16 --batch 1 8 [~8 min]
#   sweeps-a sweeps-b   tune.py tile sweeps: MLA MTP (both score orientations), fp8 decode (attention,
#                MLA); prefill, chunked prefill,
#                MLA H128 and B1 x 32768 H128 (not in the default list: run them after a kernel change)
#   ncu          Nsight Compute on every shape that misses its target: one warm launch each
#                (benchmarks/ncu_profile.py), speed of light, memory, warp states; not in the default list
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results}"; shift || true
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests-a tests-b tests-mla fuzz-a fuzz-b fuzz-c fuzz-prefill fuzz-mla memcheck attention other)
mkdir -p "$out"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$out/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$out/env.txt" 2>&1

SEPARATE=(tests/test_triton_paged_attention.py tests/test_validation.py tests/test_transformers.py tests/test_flash_backend.py
          tests/test_triton_mla.py tests/test_mla_module.py)
# pytest-xdist workers for the parts that use them (more than about 10 on one GPU made tests that
# time or capture CUDA graphs fail by contention, 2026-11-24)
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n "${PYTEST_N:-8}")
ATTENTION_FUZZ=tests/test_triton_paged_attention.py::test_attention_fuzz_cuda

pytest_log() {  # pytest_log NAME ARGS...: the run's log under $out, its last lines on stdout
    local name=$1; shift
    echo "== pytest $name =="
    python3 -m pytest -q -ra -p no:cacheprovider --durations=10 "$@" > "$out/pytest-$name.log" 2>&1
    echo "pytest $name exit code: $?"
    tail -5 "$out/pytest-$name.log"
}

fuzz() {  # fuzz NAME FIRST LAST: the attention fuzz families FIRST..LAST
    local ids=()
    for f in $(seq "$2" "$3"); do ids+=("$ATTENTION_FUZZ[$f]"); done
    pytest_log "$1" "${ids[@]}"
}

for part in "${parts[@]}"; do
    case "$part" in
    tests-a)
        others=()
        for f in tests/test_*.py; do
            [[ " ${SEPARATE[*]} " == *" $f "* ]] || others+=("$f")
        done
        pytest_log tests-a "${workers[@]}" -m "not fuzz" "${others[@]}" ;;
    tests-b) pytest_log tests-b -m "not fuzz" "${SEPARATE[@]:0:4}" ;;
    tests-mla) pytest_log tests-mla "${workers[@]}" -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
    fuzz-a) fuzz fuzz-a 0 12 ;;
    fuzz-b) fuzz fuzz-b 13 25 ;;
    fuzz-c) fuzz fuzz-c 26 39 ;;
    fuzz-prefill) pytest_log fuzz-prefill "${workers[@]}" -m fuzz tests/test_triton_prefill.py ;;
    fuzz-mla) pytest_log fuzz-mla "${workers[@]}" -m fuzz tests/test_triton_mla.py ;;
    memcheck)
        echo "== compute-sanitizer memcheck: planted bad block tables and slots =="
        compute-sanitizer --tool memcheck --error-exitcode 7 python3 -m pytest -q -p no:cacheprovider \
          tests/test_triton_paged_attention.py tests/test_triton_kv_cache.py tests/test_triton_mla.py \
          -k "bad or garbage or out_of_range" > "$out/memcheck.log" 2>&1
        echo "memcheck exit code: $? (0 = no errors)" | tee -a "$out/memcheck.log"
        tail -5 "$out/memcheck.log" ;;
    attention)
        echo "== benchmarks/paged_attention.py =="
        python3 benchmarks/paged_attention.py --out "$out" 2>"$out/bench-progress.log" | tee "$out/bench.txt"
        python3 benchmarks/plot.py "$(ls -t "$out"/paged_attention-*.json | head -1)" -o "$out/paged_attention.png" 2>&1 | tail -2 ;;
    other)
        echo "== benchmarks: overhead, MLA decode, decode step =="
        python3 benchmarks/overhead.py --out "$out" 2>&1 | tee "$out/overhead.txt"
        python3 benchmarks/overhead.py --null-launch --out "$out" 2>&1 | tee "$out/overhead-null-launch.txt"
        python3 benchmarks/mla_decode.py --out "$out" 2>"$out/mla-progress.log" | tee "$out/mla_decode.txt"
        python3 benchmarks/decode_step.py --layers 2 16 --batch 1 8 --out "$out" 2>"$out/decode-step-progress.log" \
          | tee "$out/decode_step.txt" ;;
    sweeps-a | sweeps-b)
        sweeps=mla_mtp,attn_fp8,mla_fp8
        [ "$part" = sweeps-b ] && sweeps=attn_prefill,attn_chunked,mla_h128,mla_b1_h128
        echo "== benchmarks/tune.py --sweeps $sweeps =="
        python3 benchmarks/tune.py --sweeps "$sweeps" --out "$out" 2>"$out/$part-progress.log" | tee "$out/$part.txt" ;;
    ncu)  # the kernel-level profile of every shape that misses its target (benchmarks/ncu_profile.py)
        echo "== ncu =="
        profile() {  # profile NAME KERNEL_REGEX LAUNCHES SHAPE [profile.py options]
            local name=$1 regex=$2 count=$3; shift 3
            timeout 240 ncu --profile-from-start off --kernel-name "regex:$regex" --launch-count "$count" \
              --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
              --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
              --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
              python3 benchmarks/ncu_profile.py "$@" > "$out/ncu-$name.txt" 2>&1
            echo "ncu $name exit code: $?"
            grep -E "^  [_a-z]+kernel|Duration|DRAM Throughput|Compute \(SM\) Throughput|dram__bytes_read.sum|lts__t_sector_hit|Registers Per|Achieved Occupancy|Issue Slots Busy" "$out/ncu-$name.txt" | head -24
        }
        # on sm_90 the default prefill and 128-head MLA kernels are the Gluon ones (*_sm90_kernel)
        profile prefill "_prefill_kernel|_prefill_sm90_kernel" 1 prefill_B4_q2048
        profile chunked "_prefill_kernel|_prefill_sm90_kernel" 1 chunked_prefill_B4_q512_ctx4096
        profile mla-h128 "_mla_kernel|_mla_sm90_kernel" 1 B64_ctx4096_H128
        profile mla-h128-heads _mla_kernel 1 B64_ctx4096_H128 --sweep mla_h128 --candidate 8
        profile mla-b1-h128 "_mla_kernel|_mla_sm90_kernel|_combine_kernel" 2 B1_ctx32768_H128
        profile mla-mtp _mla_kernel 1 mtp2_B64_ctx4096_H16
        profile mla-fp8 _mla_kernel 1 fp8_B128_ctx4096_H16
        profile mla-h16 _mla_kernel 1 B128_ctx4096_H16
        profile decode-fp8 "_attention_kernel|_combine_kernel" 2 decode_fp8_B64_ctx4096
        profile decode-b1 "_attention_kernel|_combine_kernel" 2 decode_B1_ctx32768 ;;
    *) echo "unknown part $part (tests-a tests-b tests-mla fuzz-a fuzz-b fuzz-c fuzz-prefill fuzz-mla memcheck attention other sweeps-a sweeps-b ncu)"; exit 2 ;;
    esac
done
