# GPU calls of 2026-11-26: programmatic dependent launch of the combine kernel, the Gluon MLA
# kernel's planned launch, then the benchmarks against FlashInfer and FlashAttention-4.
#   bash run.sh OUT PART...   PART: pdl (tune.py's PDL sweeps) | sweeps (MLA H16 split
#       counts) | gluon (the Gluon MLA and launcher tests) | attn (attention, launcher and
#       compile tests) | mla (MLA test files) | fuzz (the attention kernel's 40 fuzz families,
#       2,000 configurations)
#       | bench-attn (paged_attention.py) | bench-mla (mla_decode.py, overhead.py); FlashAttention-4 and
#       FlashInfer staged first (../shared/tools/fa4-bundle.sh, flashinfer-bundle.sh), PYTHONPATH exported
out=${1:?out dir}; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
t() {  # t NAME SECONDS PYTEST-ARGS...: a pytest run, its log in $out, its summary on stdout
    local name=$1 secs=$2; shift 2
    timeout "$secs" python3 -m pytest -q -rf -p no:cacheprovider "$@" > "$out/pytest-$name.log" 2>&1
    echo "pytest $name exit $?"; grep -E "^FAILED|^ERROR" "$out/pytest-$name.log" | head -20; tail -1 "$out/pytest-$name.log"
}
for part in "$@"; do
case "$part" in
pdl)
    timeout 300 python3 benchmarks/tune.py --sweeps ${PDL_SWEEPS:-pdl_b1,pdl_b8,pdl_mla_h16,pdl_mla_b32} --out "$out" \
        2> "$out/tune-pdl-progress.log" | tee "$out/tune-pdl.txt" | grep -v "^$" ;;
sweeps)
    timeout 240 python3 benchmarks/tune.py --sweeps mla_h16_splits,mla_b32_splits --out "$out" \
        2> "$out/tune-mla-progress.log" | tee "$out/tune-mla.txt" | grep -v "^$" ;;
gluon) t gluon 330 -n 10 -m "not fuzz" -k "gluon or sm90 or fast" tests/test_triton_mla.py tests/test_triton_prefill.py \
        tests/test_fast_launch.py ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
mla) t mla 500 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz) t fuzz 570 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
bench-attn)
    timeout 525 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv" | head -80 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
