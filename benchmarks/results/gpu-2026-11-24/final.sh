# The closing GPU check of 2026-11-24, in parts that each fit one 10-minute call:
#   bash final.sh OUT PART      PART: tests1 tests2 fuzz bench-attn bench-mla sweeps
# FlashAttention-4 and FlashInfer staged first (README: carrying FA4 and FlashInfer), with
# PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD exported by the caller.
out=${1:?out dir}; part=${2:?part}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
py() { python3 "$@"; }
case "$part" in
tests1)  # every non-fuzz test file but the four largest
    files=(); for f in tests/test_*.py; do case $f in
        tests/test_triton_paged_attention.py|tests/test_validation.py|tests/test_transformers.py|tests/test_flash_backend.py|tests/test_triton_prefill.py) ;;
        *) files+=("$f");; esac; done
    timeout 560 python3 -m pytest -q -ra -p no:cacheprovider -n 8 -m "not fuzz" -k "not aoti and not test_sm90_plans_prefill_kernel_cuda" "${files[@]}" > "$out/pytest-tests1.log" 2>&1
    echo "tests1 exit $?"; tail -4 "$out/pytest-tests1.log" ;;
tests2)
    timeout 500 python3 -m pytest -q -ra -p no:cacheprovider -n 8 -m "not fuzz" -k "not aoti and not test_sm90_plans_prefill_kernel_cuda" \
        tests/test_triton_paged_attention.py tests/test_validation.py tests/test_transformers.py tests/test_flash_backend.py tests/test_triton_prefill.py > "$out/pytest-tests2.log" 2>&1
    echo "tests2 exit $?"; tail -4 "$out/pytest-tests2.log"
    timeout 60 python3 -m pytest -q -p no:cacheprovider -k test_sm90_plans_prefill_kernel_cuda tests > "$out/pytest-sm90-plans.log" 2>&1
    echo "sm90 plans exit $?"; tail -1 "$out/pytest-sm90-plans.log" ;;
fuzz)
    timeout 570 python3 -m pytest -q -ra -p no:cacheprovider -n 12 -m fuzz tests > "$out/pytest-fuzz.log" 2>&1
    echo "fuzz exit $?"; tail -4 "$out/pytest-fuzz.log" ;;
bench-attn)
    timeout 560 python3 benchmarks/paged_attention.py --out "$out" 2>"$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv" | head -80 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2>"$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
sweeps)
    timeout 500 python3 benchmarks/tune.py --sweeps "${SWEEPS:-attn_mha,attn_b64,attn_fp8,attn_b1,mla_b1_h128}" --out "$out" > "$out/tune.txt" 2>"$out/tune-progress.log"
    cat "$out/tune.txt" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
