# GPU calls of 2026-11-28 (twenty-second session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: cluster (probe_cluster.py: the narrow MLA kernel as a 2-CTA cluster sharing
#       each tile through TMA multicast, a token a CTA, and as a pair of CTAs each a half of the keys, rank 1's
#       state merged by rank 0 (fold), against the package's plan) | fold (the narrow kernel's GPU tests, the
#       fold's and its fuzz) |
#       mla | fuzz-mla | bench-mla (as in ../gpu-2026-11-27m/run.sh), and the staging parts of ../gpu_run.sh
# Calls, in order (each a fresh machine unless it says otherwise; "warm" the machine of the call before):
#   on the tree of d662c97 with probe_cluster.py (its versions as they grew; the last is this folder's):
#   1 `cluster`, the first version: package and the multicast cluster only, on mtp2 B64 x 4096, B32 x 8192,
#     B128 x 4096 and B16 x 4096 (PROBE_SHAPES and PROBE_ROUNDS unset, three rounds);
#   2 `cluster` (B64 x 4096, five rounds: package, fold, cluster, tok);
#   3 PROBE_SHAPES=mtp2_B64_ctx4096_H16,mtp2_B64_ctx8192_H16,mtp2_B48_ctx4096_H16,B64_ctx4096_H16,B48_ctx4096_H16
#     PROBE_VARIANTS=package,fold PROBE_ROUNDS=3 `cluster` (the fold's grid was wrong for one token a
#     program: B64_ctx4096_H16's fold hit an illegal address and ended the process; mended in call 4's version);
#   4 the same with PROBE_SHAPES=mtp2_B64_ctx4096_H16,mtp2_B60_ctx4096_H16,mtp2_B56_ctx4096_H16,B64_ctx4096_H16,
#     B60_ctx4096_H16,B56_ctx4096_H16,B48_ctx4096_H16 (the fold's rank 1 loads issued before any use);
#   then the package with the fold (cb54507 and its tests as they grew):
#   5 `fold`: 75 passed, 1 failed (the unpaired test's second case planned mla_sm90_pair: block 16);
#   6 `pytest -n 8 -k "fold_cuda or fold_unpaired"` (logs/call6/pytest-fold2.log): 7 passed, the unpaired
#     test failed again (its first case: block 16 as well); 7 (warm) `pytest -k fold_unpaired`: passed;
#   8 `stash-a`, 9 `stash-fa4 stage`, 10 `stash-b`, 11 `stash-fi site bench-mla` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28-c.* (cb54507: its eager rows through
#     Triton's launcher, see RESULTS.md);
#   12 `mla` (warm): 18 failed (test_gluon_mla_cuda's pre-encoded descriptor check: the same cause), 194 passed;
#   on 11b51fa (the cached launch kept with the package's stage hook):
#   13 `site bench-mla` (a fresh machine: FlashInfer not staged), then `pytest -n 12 -k "test_gluon_mla_cuda or
#     fast_launch or native_launch or fold_cuda" tests/test_triton_mla.py tests/test_fast_launch.py
#     tests/test_native_launch.py`: 96 passed;
#   14 `stash-a`, 15 `stash-fa4 stage`, 16 `stash-b`, 17 `stash-fi site bench-mla` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-28-d.*;
#   18 (warm) `pytest -n 14 -m fuzz -k narrow_fuzz tests/test_triton_mla.py`: 20 passed.
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
cluster) PROBE_SHAPES=${PROBE_SHAPES:-mtp2_B64_ctx4096_H16} PROBE_ROUNDS=${PROBE_ROUNDS:-5} timeout 420 python3 "$here/probe_cluster.py" > "$out/probe-cluster.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-cluster.txt" | tail -60 ;;
fold) t fold 500 -n 12 -k "narrow_cuda or fold_cuda or fold_unpaired or fold_fuzz" tests/test_triton_mla.py ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz or fold_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 360 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
*) echo "unknown part $part" ;;
esac
done
