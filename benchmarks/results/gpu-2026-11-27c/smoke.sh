# Every probe of the 2026-11-27 runs once (one round, one shape) after they moved onto
# benchmarks/mla_probe.py: bash benchmarks/results/gpu-2026-11-27c/smoke.sh (logs/smoke/).
set -u
export PROBE_ROUNDS=1
o=$OUT/x; mkdir -p $o
r=benchmarks/results
PROBE_SHAPES=fp8_B128_ctx4096_H16 timeout 120 python3 $r/gpu-2026-11-27/probe_fp8.py > $o/fp8.txt 2>&1; tail -3 $o/fp8.txt
git apply $r/gpu-2026-11-27/left.patch  # (logs/smoke/rescale.txt ran before the patch: the same module as a file)
PROBE_SHAPES=B8_ctx8192_H128 timeout 200 python3 $r/gpu-2026-11-27/probe_rescale.py > $o/rescale.txt 2>&1; tail -6 $o/rescale.txt
git apply -R $r/gpu-2026-11-27/left.patch
PROBE_SHAPES=B8_ctx8192_H128 timeout 120 python3 $r/gpu-2026-11-27b/probe_right.py > $o/right.txt 2>&1; tail -3 $o/right.txt
PROBE_SHAPES=mtp2_B64_ctx4096_H16 timeout 120 python3 $r/gpu-2026-11-27b/probe_qblocks.py tree > $o/qblocks.txt 2>&1; tail -2 $o/qblocks.txt
PROBE_SHAPES=mtp2_B64_ctx4096_H16 PROBE_TIME=1 timeout 120 python3 $r/gpu-2026-11-27b/probe_mtp.py > $o/mtp.txt 2>&1; tail -2 $o/mtp.txt
PROBE_SHAPES=mtp2_B64_ctx4096_H16 bash $r/gpu-2026-11-27c/run.sh $o probe-fold probe-direct probe-lsum probe-ksplit 2>&1 | tail -12
