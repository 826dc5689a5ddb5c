# GPU calls of 2026-11-27 (nineteenth session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: sms (probe_sms.py: the GPCs by cluster launches, and the narrow
#       MLA programs' tile times by SM over replays) | timeline (../gpu-2026-11-27e/probe_timeline.py,
#       2 tokens B64 x 4096) | signal (probe_signal.py: the combine kernel signalling its dependents) |
#       boundary (probe_boundary.py: the attention kernel's and the combine's stamps in one call) |
#       combine (probe_combine.py: the combine's heads a program for the MLA split calls) | combine-pkg (the
#       same, the package's rule against one head a program) | mla (the MLA test files, GPU tier) | fuzz-mla (the
#       narrow bf16 and pair MLA kernels' fuzz) | bench-mla (mla_decode.py, FlashInfer staged by the staging parts
#       of ../gpu_run.sh) | clocks (mla_decode.py on B64 x 4096 H128, or the shapes CLOCK_SHAPES names, with
#       nvidia-smi's SM clock and power every 50 ms, clocks_summary.py by phase; FlashInfer staged)
# Calls, in order (main ca2b607, the package unchanged):
#   1 `sms`, an H100 80GB HBM3 machine (A): the GPC map; four narrow-kernel shapes, eight replays each;
#   2 `sms` with the end-offset correlations, the last enders' entries and the idle and fastest SMs
#     printed, and 2 tokens B32 x 8192 added, a second machine (B);
#   3 `timeline sms` after probe_timeline.py's capture became its stamped_graph (the same commands), a third machine;
#   4 `signal`; 5 `boundary`; 6 `combine`, then `COMBINE_TILE=2048 PROBE_SHAPES=mtp2_B64_ctx4096_H16,B64_ctx4096_H16
#     boundary` (each a fresh machine);
#   then on 33ba71b (the narrow kernels' combine up to four heads a program), one machine:
#   7 `stash-a combine-pkg mla` (carry .fa4a1): the MLA files 181 passed, 31 skipped;
#   8 `stash-fa4 stage fuzz-mla` (carry .fa4a2 .fa4b): 32 passed; 9 `stash-b` (carry .fibA);
#   10 `stash-fi site bench-mla` (carry .fibB .fib2): benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-27-l.*;
#   11 `python3 probe_heads8.py` and 12 `python3 probe_warps.py`, run from this folder (logs/call11, call12;
#     probe_heads8.py's docstring and its last line, which resets the tile, were added after call 11).
#   13 `python3 -m pytest -q -rf -p no:cacheprovider -n 12 -m "not fuzz" tests/test_triton_paged_attention.py
#     tests/test_triton_merge.py` on 554c696 (the attention combine's blocking untouched by the new `tile`), a fresh
#     machine: 143 passed, 63 skipped (logs/call13).
#   then another machine: 14 `stash-a`, 15 `stash-fa4 stage`, 16 `stash-b`, 17 `stash-fi site clocks` (B64 x 4096
#     H128 alone; the part then had no --out), 18 `CLOCK_SHAPES=_ site clocks` (every shape; `_` matches them all).
# probe_sms.py and probe_boundary.py import probe_timeline.py by its folder on sys.path since these calls
# (they loaded it through importlib); nothing else changed.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
timeline) PROBE_SHAPES=mtp2_B64_ctx4096_H16 timeout 300 python3 "$here/../gpu-2026-11-27e/probe_timeline.py" \
        > "$out/probe-timeline.txt" 2>&1; echo "exit $?"; grep -v Warn "$out/probe-timeline.txt" | tail -12 ;;
signal) timeout 480 python3 "$here/probe_signal.py" > "$out/probe-signal.txt" 2>&1; echo "exit $?"; grep -v Warn "$out/probe-signal.txt" | tail -50 ;;
boundary) timeout 420 python3 "$here/probe_boundary.py" > "$out/probe-boundary$COMBINE_TILE.txt" 2>&1; echo "exit $?"
        grep -v Warn "$out/probe-boundary$COMBINE_TILE.txt" | tail -40 ;;
combine) timeout 480 python3 "$here/probe_combine.py" > "$out/probe-combine.txt" 2>&1; echo "exit $?"; grep -v Warn "$out/probe-combine.txt" | tail -60 ;;
combine-pkg) PROBE_PACKAGE=1 timeout 420 python3 "$here/probe_combine.py" > "$out/probe-combine-pkg.txt" 2>&1; echo "exit $?"
        grep -v Warn "$out/probe-combine-pkg.txt" | tail -40 ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 360 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
clocks)  # mla_decode.py on B64 x 4096 H128 with the SM clock and power sampled every 50 ms
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > "$out/clocks.csv" &
    smi=$!
    timeout 240 python3 benchmarks/mla_decode.py --shapes "${CLOCK_SHAPES:-B64_ctx4096_H128}" --providers "torch_paged_attn,flashinfer_mla" \
        --out "$out" 2>&1 > "$out/clocks-bench.txt" | while IFS= read -r l; do echo "$(date +%H:%M:%S.%N) $l"; done > "$out/clocks-progress.txt"
    kill $smi; python3 "$here/clocks_summary.py" "$out" | tee "$out/clocks-summary.txt"; grep -E "B64|paired" "$out/clocks-bench.txt" | head -12
    gzip -f "$out/clocks.csv" ;;
sms) timeout 420 python3 "$here/probe_sms.py" > "$out/probe-sms.txt" 2>&1; echo "exit $?"; grep -v Warn "$out/probe-sms.txt" | tail -90 ;;
*) echo "unknown part $part" ;;
esac
done
