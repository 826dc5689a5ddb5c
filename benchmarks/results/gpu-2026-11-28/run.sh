# GPU calls of 2026-11-28 (twenty-first session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: prefetch (probe_prefetch.py: the wide MLA kernel's L2 prefetch and its
#       launch with programmatic dependent launch, each on and off) | lines (the same probe: the late chunk groups'
#       segments prefetched by prefetch.global.L2, against none and the bulk prefetch) | pdl0 (the bulk prefetch
#       of the pair being loaded with and without PDL) | half (one tile of each pair prefetched, the head groups'
#       programs alternating, against both and none, H64-H256) | final (the package's kernel against the variants'
#       file without prefetch) | narrow (probe_narrow.py: the narrow kernel's L2 prefetch, 32-row programs and a
#       token a program) | wide (the wide kernel's GPU tests and fuzz) |
#       mla | fuzz-mla | bench-mla (as in ../gpu-2026-11-27m/run.sh), and the staging parts of ../gpu_run.sh
# Calls, in order (each a fresh machine unless it says otherwise; "warm" the machine of the call before):
#   1 `prefetch` on the tree of f8e8ec6's parent with the variants of mla_sm90_variants.py in the package and
#     mla.py planning the wide kernel's launch with PDL where mla_sm90.PDL said so (probe_prefetch.py's docstring);
#   2 `lines`; 3 `pdl0` (warm); 4 `half`;
#   then on the final tree (f8e8ec6 and the docs after it):
#   5 `stash-a`, 6 `stash-fa4 stage`, 7 `stash-b`, 8 `stash-fi site bench-mla final` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28.* (its output, kept there only) and
#     logs/call8/probe-final.txt;
#   9 `wide` (warm): 58 passed, 1 skipped (the pytest process cut at its timeout after the summary);
#   10 `mla` (warm): 183 passed, 32 skipped;
#   11 `narrow` (probe_narrow.py); 12 `stash-a`, 13 `stash-fa4 stage`, 14 `stash-b`, 15 `stash-fi site bench-mla`
#     (warm): benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28-b.* (its output kept there only).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
prefetch) timeout 540 python3 "$here/probe_prefetch.py" > "$out/probe-prefetch.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-prefetch.txt" | tail -130 ;;
pdl0) PROBE_PDL0=1 timeout 540 python3 "$here/probe_prefetch.py" > "$out/probe-pdl0.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-pdl0.txt" | tail -60 ;;
half) PROBE_HALF=1 timeout 540 python3 "$here/probe_prefetch.py" > "$out/probe-half.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-half.txt" | tail -60 ;;
final) PROBE_FINAL=1 timeout 400 python3 "$here/probe_prefetch.py" > "$out/probe-final.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-final.txt" | tail -40 ;;
narrow) timeout 400 python3 "$here/probe_narrow.py" > "$out/probe-narrow.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-narrow.txt" | tail -80 ;;
lines) PROBE_LINES=1 timeout 540 python3 "$here/probe_prefetch.py" > "$out/probe-lines.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-lines.txt" | tail -60 ;;
wide) t wide 330 -n 12 -k "gluon_mla_kernel_fuzz or gluon_mla_cuda or bad_block or declines_cuda or reads_inputs or graph_and_compile" \
        tests/test_triton_mla.py ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 360 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
*) echo "unknown part $part" ;;
esac
done
