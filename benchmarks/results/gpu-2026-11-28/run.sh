# GPU calls of 2026-11-28 (twenty-first session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: prefetch (probe_prefetch.py: the wide MLA kernel's L2 prefetch and its
#       launch with programmatic dependent launch, each on and off) | lines (the same probe: the late chunk groups'
#       segments prefetched by prefetch.global.L2, against none and the bulk prefetch) | pdl0 (the bulk prefetch
#       of the pair being loaded with and without PDL) | half (one tile of each pair prefetched, the head groups'
#       programs alternating, against both and none, H64-H256) | final (the package's kernel against the variants'
#       file without prefetch) | wide (the wide kernel's GPU tests and fuzz) |
#       mla | fuzz-mla | bench-mla (as in ../gpu-2026-11-27m/run.sh), and the staging parts of ../gpu_run.sh
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
