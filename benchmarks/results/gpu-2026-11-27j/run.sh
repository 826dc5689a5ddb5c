# GPU calls of 2026-11-27 (seventeenth session), one H100 machine (logs/callN/).
#   bash run.sh OUT PART...   PART: native (the native pinned launch's and the launcher's test files) |
#       tests (the launcher, plan-cache, compile/export and attention test files,
#       GPU tier) | readers (probe_readers.py: 2 tokens a sequence, 32-row programs against a token a
#       program) | rows (overhead.py's rows ROWS, ROUNDS processes in turn, rows_summary.py over them) | interleaved (probe_rows.py: those rows, their repetitions interleaved in one
#       process) | mla (the MLA test files, GPU tier) |
#       fuzz-attn (the attention fuzz) | fuzz-mla (the fp8 narrow and the wide MLA kernels' fuzz; or each alone: fuzz-fp8, fuzz-wide)
# Calls, in order (H100 80GB HBM3 each; calls 1-4 on main c978c0a, 5-9 with the native pinned launch):
#   1 `tests readers rows` (ROUNDS=3): the GPU tests of the final Python pin, 197 passed; probe_readers.py;
#     overhead.py's rows, three processes;
#   2 `rows mla` (ROUNDS=9), the same host: nine processes; the MLA files, 180 passed;
#   3 `interleaved fuzz-mla` (ROUNDS=40), another host: probe_rows.py before its native rows existed;
#     the fp8-narrow and wide fuzz cut by the part's limit at 26 of 40 families (all passed);
#   4 `fuzz-fp8 fuzz-wide`: 20 + 20 families passed (1,000 configurations);
#   5 `native interleaved tests` (the native launch before a Pinned kept its binary's owner): 62 passed; probe_rows.py
#     failed (a _CHOICES value that is not a list), fixed; the GPU tests, 197 passed;
#   6 `interleaved` (ROUNDS=30), the same host: native against the Python pin;
#   7 `native rows interleaved` (ROUNDS=5) on 2c553e9, another host: 62 passed;
#   8 `interleaved` (ROUNDS=40) and `rows` (ROUNDS=7), another host;
#   9 `fuzz-attn`, the same host: 39 of 40 families passed, the 40th cut by the part's limit (380 s).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
ROWS=${ROWS:-"null kernel, cached launch;torch add_ (1 element);paged_attention;paged_attention_out"}
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
native) t native 200 -n 4 tests/test_native_launch.py tests/test_fast_launch.py ;;
tests) t tests 330 -n 10 -m "not fuzz" tests/test_fast_launch.py tests/test_plan_cache.py tests/test_compile_export.py \
        tests/test_triton_paged_attention.py ;;
readers) timeout 200 python3 "$here/probe_readers.py" > "$out/readers.txt" 2>&1; grep -v Warn "$out/readers.txt" | tail -16 ;;
rows) rows 100 "^(op |null kernel, cached|torch add_|paged_attention)" "$here/rows_summary.py" ;;  # ../gpu_run.sh
interleaved) timeout 200 python3 "$here/probe_rows.py" > "$out/interleaved.txt" 2>&1; grep -v Warn "$out/interleaved.txt" | tail -16 ;;
mla) t mla 250 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fp8_fuzz or kernel_fuzz" tests/test_triton_mla.py ;;
fuzz-attn) t fuzz-attn 380 -n 12 -m fuzz tests/test_triton_paged_attention.py ;;
fuzz-fp8) t fuzz-fp8 290 -n 14 -m fuzz -k narrow_fp8_fuzz tests/test_triton_mla.py ;;
fuzz-wide) t fuzz-wide 290 -n 14 -m fuzz -k kernel_fuzz tests/test_triton_mla.py ;;
*) echo "unknown part $part" ;;
esac
done
