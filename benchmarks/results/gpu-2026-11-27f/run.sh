# GPU calls of 2026-11-27 (thirteenth session).
#   bash run.sh OUT PART...   PART: stash-a | stash-b | stash-c | stage (FlashAttention-4 and FlashInfer
#       carried in four calls and installed, as in ../gpu-2026-11-27d/run.sh) | site (the staged packages
#       on PYTHONPATH again, for a later call on the same machine) | attn (the attention test files) |
#       probe-eager (probe_eager_pair.py: eager samples of the flash backend and of FlashAttention-4
#       called directly, decode B8 x 8192 Hq64) | bench-mla (mla_decode.py, overhead.py) | bench-b8
#       (paged_attention.py, the decode B8 x 8192 Hq64 shape alone) | stash-fa4 (carrying .fa4a2: FlashAttention-4's
#       bundle joined without FlashInfer's, for `stage` in the same call, carrying .fa4b) | flash (the flash
#       backend's test file) | overhead (overhead.py) | stash-fi (FlashInfer's wheels joined and unpacked,
#       carrying .fibB and .fib2 after stash-b) | bench-attn (paged_attention.py) | fuzz-attn (the attention
#       kernels' fuzz)
# Calls, in order (the tree of each named): on the tree of the eager lse change (the [0] lse a view of an
# unresizable empty storage), one machine: `stash-a attn` (logs/pytest-attn.log), `stash-b`, `stash-c`,
# `stage probe-eager bench-mla` (logs/probe-eager-before.txt; logs/bench-mla/: mla_decode.py and
# overhead.py, copied to ../{mla_decode,overhead}-NVIDIA-H100-80GB-HBM3-2026-11-27-f.* for mla_decode);
# then, with the flash backend calling FA4's compiled kernel directly, a second machine: `stash-a`,
# `stash-fa4 stage flash probe-eager` (carrying .fa4a2 and .fa4b; logs/pytest-flash.log,
# logs/probe-eager.txt), `site overhead bench-b8` (logs/overhead-1/, logs/bench-b8/; no FlashInfer yet),
# `stash-b`, `stash-fi site bench-attn` (logs/bench-attn/, copied to
# ../paged_attention-NVIDIA-H100-80GB-HBM3-2026-11-27-f.*), `site overhead` (logs/overhead/, copied to
# ../overhead-NVIDIA-H100-80GB-HBM3-2026-11-27-f.*); then, with the direct call taking an LSE too, a third
# machine: `stash-a`, `stash-fa4 stage flash probe-eager` (logs/pytest-flash-lse.log,
# logs/probe-eager-lse.txt), `site overhead` (logs/overhead-2/); on the final tree (3ede1ea), a fourth
# machine: `fuzz-attn` (logs/pytest-fuzz-attn.log). Each call wrote under $OUT/logs.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
bench-attn)
    mkdir -p "$out/bench-attn"
    timeout 560 python3 benchmarks/paged_attention.py --out "$out/bench-attn" 2> "$out/bench-attn/progress.log" \
        | tee "$out/bench-attn/paged_attention.txt" | grep -E "torch_paged_attn|flashinfer|flash_attn_4|paired" | head -90 ;;
attn) t attn 420 -n 10 -m "not fuzz" tests/test_triton_paged_attention.py tests/test_fast_launch.py \
        tests/test_compile_export.py tests/test_plan_cache.py tests/test_triton_merge.py ;;
flash) t flash 400 -n 4 tests/test_flash_backend.py ;;
fuzz-attn) t fuzz-attn 500 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
overhead) mkdir -p "$out/overhead"; timeout 150 python3 benchmarks/overhead.py --out "$out/overhead" > "$out/overhead/overhead.txt" 2>&1; tail -22 "$out/overhead/overhead.txt" ;;
probe-eager) timeout 300 python3 "$here/probe_eager_pair.py" > "$out/probe-eager.txt" 2>&1; grep -v Warn "$out/probe-eager.txt" | tail -40 ;;
bench-mla)
    mkdir -p "$out/bench"
    timeout 330 python3 benchmarks/mla_decode.py --out "$out/bench" 2> "$out/bench/bench-mla-progress.log" | tee "$out/bench/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out/bench" > "$out/bench/overhead.txt" 2>&1; tail -22 "$out/bench/overhead.txt" ;;
bench-b8)
    mkdir -p "$out/bench-b8"
    timeout 300 python3 benchmarks/paged_attention.py --shapes decode_B8_ctx8192_Hq64 --out "$out/bench-b8" \
        2> "$out/bench-b8/progress.log" | tee "$out/bench-b8/paged_attention.txt" | grep -E "torch_paged_attn|flashinfer|flash_attn_4" | head -40 ;;
*) echo "unknown part $part" ;;
esac
done
