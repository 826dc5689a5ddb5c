# GPU calls of 2026-11-28 (twenty-third session), H100 unless said (logs/callN/).
#   bash run.sh OUT PART...   PART: deep (probe_deep.py) | handover (probe_handover.py) | dsmem (probe_dsmem.py) |
#       mla | fold | fuzz-mla | bench-mla (as in ../gpu-2026-11-28b/run.sh), and the staging parts of ../gpu_run.sh
# Calls, in order ("warm": the machine of the call before):
#   1 `deep` on e00295d + deep.patch (DEEP_CHUNKS on / off in one process);
#   on e00295d (deep.patch taken back out):
#   2 (warm) `mla`: 214 passed, 32 skipped; then `pytest -n 8 -k "graph_and_compile or fold_launch or stage_hooks"
#     tests/test_triton_mla.py tests/test_fast_launch.py tests/test_cluster.py` (logs/call2/pytest-graph.log): 7 passed;
#   3 (warm) `fuzz-mla`: 44 passed;
#   4 `stash-a`, 5 `stash-fa4 stage`, 6 `stash-b`, 7 `stash-fi site bench-mla` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28-e.*;
#   8 `handover` (e00295d's kernel and variants of it);
#   on the shared-memory handover (b76ceee's kernel):
#   9 `dsmem fold` (on an H200: no kind named): the probe, then 83 passed;
#   10 `dsmem mla` (H100): the probe, then 214 passed, 32 skipped;
#   11 `stash-a`, 12 `stash-fa4 stage`, 13 `stash-b`, 14 `stash-fi site bench-mla` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28-f.*.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
deep) timeout ${PROBE_TIMEOUT:-480} python3 "$here/probe_deep.py" > "$out/probe-deep.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-deep.txt" | tail -60 ;;
handover) timeout ${PROBE_TIMEOUT:-300} python3 "$here/probe_handover.py" > "$out/probe-handover.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-handover.txt" | tail -40 ;;
dsmem) timeout ${PROBE_TIMEOUT:-300} python3 "$here/probe_dsmem.py" > "$out/probe-dsmem.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-dsmem.txt" | tail -40 ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fold) t fold 500 -n 12 -k "narrow_cuda or fold_cuda or fold_unpaired or fold_fuzz" tests/test_triton_mla.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz or fold_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 360 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
*) echo "unknown part $part" ;;
esac
done
