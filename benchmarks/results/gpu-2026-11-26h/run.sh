# GPU calls of 2026-11-26 (eighth session).
#   bash run.sh OUT PART...   PART: probe-grid (probe_grid.py: the attention kernel's decode grid,
#       query blocks fastest against heads fastest) | tune-fp8 (tune.py's attn_fp8 sweep of the
#       fp8 decode tile) | attn (attention, launcher, compile, plan-cache and merge tests) |
#       fuzz-attn (the attention fuzz) | prefill (the prefill kernels' tests) | probe-page
#       (probe_page.py: the wide MLA kernel's page lookups before their waits, against
#       mla_sm90_before.py) | fuzz-wide (the wide and pair MLA kernels' fuzz) | mla (the MLA test files) | bench-attn (paged_attention.py)
#       | bench-b1 (paged_attention.py, the B1 x 32768 decode shape alone) | overhead (overhead.py)
#       | bench-mla (mla_decode.py, overhead.py); the bench parts with FlashAttention-4 and
#       FlashInfer on PYTHONPATH (the bundles of ../shared/tools/fa4-bundle.sh and
#       flashinfer-bundle.sh carried over several calls, FA4's install.sh run, the FlashInfer
#       wheels unzipped to /tmp/site, PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD)
# Trees: probe-grid (logs/probe-grid.txt) and the first tune-fp8 (logs/tune-fp8.txt) ran on main
# 8b9b995 with the HEADS_FASTEST switch added (_DECODE_GRID "queries"); logs/probe-grid-2.txt,
# pytest-attn.log, bench-attn/ and pytest-fuzz-attn.log on the kernels of c2eaaaa ("heads");
# tune-fp8-2, pytest-*-final.log, bench-b1/ (with overhead.py) on 8511617 (_position_mask).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
for part in "$@"; do
case "$part" in
probe-grid) timeout 290 python3 "$here/probe_grid.py" > "$out/probe-grid.txt" 2>&1; grep -v "^ *$" "$out/probe-grid.txt" | grep -v Warn | tail -40 ;;
tune-fp8) timeout 280 python3 benchmarks/tune.py --sweeps attn_fp8 --out "$out" > "$out/tune-fp8.txt" 2>&1; tail -25 "$out/tune-fp8.txt" ;;
prefill) t prefill 300 -n 10 -m "not fuzz" tests/test_triton_prefill.py ;;
probe-page) timeout 250 python3 "$here/probe_page.py" > "$out/probe-page.txt" 2>&1; grep graph "$out/probe-page.txt" ;;
fuzz-wide) t fuzz-wide 300 -n 12 -m fuzz -k "kernel_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
mla) t mla 300 -n 10 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
fuzz-attn) t fuzz-attn 500 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
bench-attn)
    timeout 540 python3 benchmarks/paged_attention.py --out "$out" 2> "$out/bench-attn-progress.log" | tee "$out/paged_attention.txt" \
        | grep -E "^[a-z_0-9]+ +torch_paged_attn +graph|flashinfer|flash_attn_4|\[flash\]|\[auto\]|batch-inv|paired" | head -80 ;;
bench-b1)  # the B1 x 32768 decode row alone (its eager pairs were disturbed in the bench-attn run)
    timeout 300 python3 benchmarks/paged_attention.py --shapes decode_B1_ctx32768 --out "$out" 2> "$out/bench-b1-progress.log" \
        | tee "$out/paged_attention-b1.txt" | grep -E "torch_paged_attn|flashinfer|flash_attn_4" | head -40 ;;
overhead) timeout 150 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
