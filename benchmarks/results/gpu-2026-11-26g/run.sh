# GPU calls of 2026-11-26 (seventh session).
#   bash run.sh OUT PART...   PART: probe-wide64 (probe_wide64.py: 64-row wide-kernel programs
#       against 32- and 16-row narrow ones on the same bytes) | probe-parts (probe_parts.py: the
#       narrow kernel's stage refilled in three parts against the whole stage) | probe-pair
#       (probe_pair.py: mla_sm90_pair against the narrow kernel's 32-row programs) |
#       probe-pair-3 (the same, PROBE_SET 2: the producer's rope chunks first) | probe-rule16
#       (probe_rule16.py: 16-row programs against 32-row pair-kernel ones at block size 16) | mla (the MLA test files) |
#       fuzz-narrow (the narrow kernels' fuzz) | fuzz-pair (mla_sm90_pair's fuzz) | attn (attention, launcher, compile, plan-cache and
#       merge tests) | fuzz-attn (the attention fuzz) | bench-mla (mla_decode.py, overhead.py) |
#       bench-attn (paged_attention.py); the bench parts with FlashAttention-4 and FlashInfer on
#       PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh and flashinfer-bundle.sh carried
#       over several calls (each under the 64 MiB a call may carry), FA4's install.sh run, the
#       FlashInfer wheels unzipped to /tmp/site,
#       PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# logs/probe-pair.txt ran the pair kernel before SCORES_FIRST (as pair0 now), logs/probe-pair-2.txt
# this probe_pair.py, both before mla._pair's rule (the pair kernel wherever it took the call, as
# the probe now forces); logs/probe-parts.txt (with pytest-mla-h200-parts.log: the MLA files on
# the parts kernel) ran on an H200; pytest-mla-pair-v1.log is the MLA files on the pair kernel before
# SCORES_FIRST and the rule, pytest-mla.log on the final tree. probe-pair-3 ran with a switch since
# taken out of mla_sm90_pair (ROPES_FIRST: _producer loading stage 1's rope chunk right after
# stage 0's, before stage 0's value chunks; measured no faster, logs/probe-pair-3.txt).
# pytest-mla-rule16.log: the MLA files after mla._narrow_query_block kept 32-row pair programs below
# block size 64 (one failure: test_public_op_cuda_and_compiled did not know the pair kernel's name;
# after it did, that test and the pair cases passed, pytest-rerun-rule16.txt).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe-pair) timeout 400 python3 "$here/probe_pair.py" > "$out/probe-pair.txt" 2>&1; grep -v "^ *$" "$out/probe-pair.txt" | grep -v Warn | tail -70 ;;
probe-pair-3) PROBE_SET=2 PROBE_SHAPES=mtp2_B64_ctx4096_H16,mtp2_B32_ctx8192_H16,mtp4_B32_ctx4096_H16,mtp2_B32_ctx4096_H12,mtp2_B64_ctx4096_H16_bs16 \
    timeout 400 python3 "$here/probe_pair.py" > "$out/probe-pair-3.txt" 2>&1; grep graph "$out/probe-pair-3.txt" ;;
probe-rule16) timeout 300 python3 "$here/probe_rule16.py" > "$out/probe-rule16.txt" 2>&1; grep graph "$out/probe-rule16.txt" ;;
probe-parts) timeout 300 python3 "$here/probe_parts.py" > "$out/probe-parts.txt" 2>&1; grep -v "^ *$" "$out/probe-parts.txt" | tail -40 ;;
probe-wide64) timeout 400 python3 "$here/probe_wide64.py" > "$out/probe-wide64.txt" 2>&1; grep -v "^ *$" "$out/probe-wide64.txt" | tail -60 ;;
mla) t mla 300 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-pair) t fuzz-pair 400 -n 12 -m fuzz -k "pair_fuzz" tests/test_triton_mla.py ;;
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
