# GPU calls of 2026-11-26 (sixth session): speculative tokens on the narrow Gluon MLA kernels in
# 16-row programs (mla._narrow_query_block), the combine's blocking after the narrow kernel; the
# attention kernel's in-program merge of several splits in one key loop.
#   bash run.sh OUT PART...   PART: probe-q1 / probe-q1-2 / probe-q1-3 (probe_q1.py, PROBE_SET 1, 2,
#       3: 32-row against 16-row programs) | probe-combine (probe_combine.py) | mla (the MLA test
#       files) | fuzz-narrow (the narrow kernels' fuzz, bf16 and fp8 caches) | attn (attention,
#       launcher, compile, plan-cache and merge tests) | fuzz-attn (the attention fuzz) | bench-mla
#       (mla_decode.py, overhead.py) | bench-attn (paged_attention.py); the bench parts with
#       FlashAttention-4 and FlashInfer on PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh
#       and flashinfer-bundle.sh carried over several calls (each under the 64 MiB a call may
#       carry), FA4's install.sh run, the FlashInfer wheels unzipped to /tmp/site,
#       PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# The probe-q1 parts ran on the tree before the rule (main 31ebc71 + the probes), probe-q1 with
# q1 = one token a program (the same programs as 16 rows at 16 heads).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe-q1) timeout 300 python3 "$here/probe_q1.py" > "$out/probe-q1.txt" 2>&1; grep graph "$out/probe-q1.txt" ;;
probe-q1-2) PROBE_SET=2 timeout 300 python3 "$here/probe_q1.py" > "$out/probe-q1-2.txt" 2>&1; grep graph "$out/probe-q1-2.txt" ;;
probe-q1-3) PROBE_SET=3 timeout 300 python3 "$here/probe_q1.py" > "$out/probe-q1-3.txt" 2>&1; grep graph "$out/probe-q1-3.txt" ;;
probe-combine) timeout 300 python3 "$here/probe_combine.py" > "$out/probe-combine.txt" 2>&1; tail -40 "$out/probe-combine.txt" ;;
mla) t mla 300 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-narrow) t fuzz-narrow 560 -n 12 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
fuzz-attn) t fuzz-attn 500 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
bench-attn)
    timeout 540 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv|paired" | head -80 ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
