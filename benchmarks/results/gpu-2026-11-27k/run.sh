# GPU calls of 2026-11-27 (eighteenth session), one H100 machine (logs/callN/).
#   bash run.sh OUT PART...   PART: tests (the native pinned launch's, launcher, plan-cache,
#       compile/export and attention test files, GPU tier) | fuzz-attn (the attention fuzz, all
#       40 families) | rows (overhead.py's rows ROWS, ROUNDS processes in turn, rows_summary.py over
#       them) | interleaved (../gpu-2026-11-27j/probe_rows.py: the host-time rows interleaved in one
#       process, native and Python pin; its paged_attention_out passes an lse, pinned since 7d63d30) |
#       writes (probe_writes.py: the cache writes' eager entries against the usual path, interleaved) |
#       writes-tests (the files that write caches: native launch, launcher, kernel, model, serving, transformers)
# Calls, in order (one H100 80GB HBM3 machine, main 7d63d30):
#   1 `tests interleaved`: 210 passed, 90 skipped; probe_rows.py, 40 rounds (the host quick in rounds 1-23);
#   2 `fuzz-attn`: 40 families passed (2,000 configurations), 313 s;
#   3 `rows` (ROUNDS=5): overhead.py's host-time rows, five processes;
#   4 `../gpu-2026-11-27j/run.sh mla`: the MLA files, 180 passed; then `rows` (ROUNDS=4), a slow stretch;
#   5-7 staging: `stash-a` (carry .fa4a1), `stash-fa4 stage` (.fa4a2 .fa4b), `stash-b` (.fibA);
#   8 `stash-fi site rows` (carry .fibB .fib2; ROUNDS=5, ROWS with "flashinfer decode run()" and
#     "flashinfer decode run() (tensor cores)" added): the rows against FlashInfer's run(), five processes;
#   then, on e4dd039 (the cache writes' eager entries), a second machine:
#   9 `writes-tests writes` (ROUNDS=30): 175 passed, 22 skipped, 2 xfailed; probe_writes.py with a usual-path row
#     that remembered (and pinned) every call (logs/call9/writes-remembering.txt);
#   10 `writes` (ROUNDS=30), then `rows` (ROUNDS=3, ROWS: null, add_, paged_attention, _out, both cache
#     writes): the usual-path row still pinned a launch a call;
#   11 `writes` (ROUNDS=30), a third machine: the usual-path row as the calls went before the entries;
#   12 `tests` and `../gpu-2026-11-27j/run.sh mla` on the final tree, a fourth machine: 216 passed, 92 skipped;
#     the MLA files 180 passed, 30 skipped;
#   13 `../gpu-2026-11-27j/run.sh native` after the review's kv_cache change, a fifth machine: cut by its
#     200-s limit after 69 passes (the first calls build the extension and compile); then
#     `python3 -m pytest -n 8 tests/test_triton_kv_cache.py tests/test_cache.py`: 49 passed, 22 skipped;
#   14 `python3 -m pytest -n 10 tests/test_native_launch.py tests/test_fast_launch.py`, the same machine: 70 passed.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
prev="$here/../gpu-2026-11-27j"
ROWS=${ROWS:-"null kernel, cached launch;torch add_ (1 element);paged_attention;paged_attention_out;paged_attention_out (no lse)"}
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
tests) t tests 520 -n 10 -m "not fuzz" tests/test_native_launch.py tests/test_fast_launch.py tests/test_plan_cache.py \
        tests/test_compile_export.py tests/test_triton_paged_attention.py ;;
writes-tests) t writes-tests 420 -n 10 -m "not fuzz" tests/test_native_launch.py tests/test_fast_launch.py \
        tests/test_triton_kv_cache.py tests/test_cache.py tests/test_kernel_writes.py tests/test_model_integration.py \
        tests/test_serving.py tests/test_transformers.py ;;
fuzz-attn) t fuzz-attn 560 -n 14 -m fuzz tests/test_triton_paged_attention.py ;;
rows) rows 120 "^(op |null kernel, cached|torch add_|paged_attention|flashinfer)" "$prev/rows_summary.py" ;;  # ../gpu_run.sh
writes) timeout 300 python3 "$here/probe_writes.py" > "$out/writes.txt" 2>&1; grep -v Warn "$out/writes.txt" | tail -24 ;;
interleaved) timeout 300 python3 "$prev/probe_rows.py" > "$out/interleaved.txt" 2>&1; grep -v Warn "$out/interleaved.txt" | tail -16 ;;
*) echo "unknown part $part" ;;
esac
done
