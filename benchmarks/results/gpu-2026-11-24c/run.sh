#!/bin/bash
# This session's GPU runs (H100, 2026-11-24): bash benchmarks/results/gpu-2026-11-24c/run.sh PART
# Logs land in $OUT (committed here afterwards).
set -u
D=benchmarks/results/gpu-2026-11-24c
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
case "$1" in
  probe)  # the Gluon MLA kernel against the Triton one, then one ncu profile of each at B64 H128
    python3 $D/mla_probe.py 2>&1 | tee "$OUT/mla-probe-$2.txt"
    ncu --profile-from-start off --kernel-name regex:_mla_sm90 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        python3 $D/mla_probe.py --ncu ${3:-} > "$OUT/ncu-mla-gluon-B64-H128-$2.txt" 2>&1
    grep -E "Duration|Throughput|Spilling|Eligible|Registers" "$OUT/ncu-mla-gluon-B64-H128-$2.txt" ;;
  source)  # where the Gluon MLA kernel's warps stall, per SASS instruction (B64 H128)
    ncu --profile-from-start off --kernel-name regex:_mla_sm90 --launch-count 1 --import-source no \
        --section SourceCounters --section WarpStateStats -o "$OUT/mla-gluon" -f \
        python3 $D/mla_probe.py --ncu > "$OUT/ncu-source.log" 2>&1
    ncu -i "$OUT/mla-gluon.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-mla-gluon-sass.csv" 2>&1
    head -c 3000 "$OUT/ncu-mla-gluon-sass.csv"; ls -la "$OUT" ;;
  gluon-tests)  # the Gluon MLA kernel's GPU tests and its fuzz (500 configurations)
    python3 -m pytest -q -rf -n 8 ${3:-tests/test_triton_mla.py tests/test_mla_module.py} > "$OUT/pytest-mla-$2.log" 2>&1
    tail -8 "$OUT/pytest-mla-$2.log"
    python3 -m pytest -q -rf -n 12 -m fuzz -k gluon_mla tests/test_triton_mla.py > "$OUT/pytest-gluon-mla-fuzz-$2.log" 2>&1
    tail -25 "$OUT/pytest-gluon-mla-fuzz-$2.log" ;;
  stage-fi)  # FlashInfer from the carried wheel pieces (no unzip on the host: python's zipfile)
    cat /root/stash/fiwhl.aa .fib2b/fiwhl.ab .fib2b/fiwhl.ac > /root/stash/fi.whl
    mkdir -p /tmp/site
    python3 -m zipfile -e /root/stash/fi.whl /tmp/site
    for w in .fib2/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
    python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" ;;
esac
