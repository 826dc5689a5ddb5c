# GPU calls of 2026-11-26 (second session): the narrow Gluon MLA kernel (mla_sm90_narrow), the
# eager chunked-prefill probe, then the benchmarks against FlashInfer and FlashAttention-4.
#   bash run.sh OUT PART...   PART: narrow (the narrow kernel's tests) | probe-mla (mla_decode.py,
#       ours against our Triton kernel, the 16-head shapes) | eager (eager_probe.py) | mla (MLA test
#       files) | gluon (Gluon, sm90 and launcher tests) | attn (attention, launcher, compile tests)
#       | fuzz-mla (the Gluon MLA fuzz, both kernels) | bench-attn | bench-mla (FlashAttention-4
#       and FlashInfer staged first, PYTHONPATH exported)
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
narrow) t narrow 300 -n 8 -m "not fuzz" -k "narrow or declines or bad_block or graph_and_compile" tests/test_triton_mla.py ;;
probe-mla)
    timeout 300 python3 benchmarks/mla_decode.py --shapes H16 --providers torch_paged_attn --out "$out" \
        2> "$out/probe-mla-progress.log" | tee "$out/probe-mla.txt" | tail -14 ;;
eager) timeout 200 python3 "$here/eager_probe.py" > "$out/eager-probe.txt" 2>&1; head -60 "$out/eager-probe.txt" ;;
mla) t mla 500 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
gluon) t gluon 330 -n 10 -m "not fuzz" -k "gluon or sm90 or fast" tests/test_triton_mla.py tests/test_triton_prefill.py \
        tests/test_fast_launch.py ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
fuzz-mla) t fuzz-mla 500 -n 12 -m fuzz -k gluon tests/test_triton_mla.py ;;
bench-attn)
    timeout 525 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv" | head -80 ;;
bench-mla)
    timeout 300 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -40
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
