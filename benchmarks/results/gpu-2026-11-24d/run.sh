# GPU calls of 2026-11-24 (fourth run): the Gluon MLA kernel's paired-tile schedule.
#   bash run.sh OUT PART    PART: gluon (the Gluon MLA tests, then seesaw_probe.py) | mla (MLA test files)
#                                 | fuzz (the whole fuzz) | rest (every other test file)
out=${1:?out dir}; part=${2:?part}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
here=benchmarks/results/gpu-2026-11-24d
case "$part" in
gluon)
    timeout 240 python3 -m pytest -q -rf -p no:cacheprovider -n 10 -x -k "gluon_mla and not fuzz" tests/test_triton_mla.py > "$out/pytest-gluon-mla.log" 2>&1
    echo "gluon mla tests exit $?"; grep -E "passed|failed|Error" "$out/pytest-gluon-mla.log" | tail -8
    REGS=${REGS:-224,240} timeout 300 python3 $here/seesaw_probe.py $SHAPES > "$out/seesaw-probe.txt" 2>&1
    echo "probe exit $?"; cat "$out/seesaw-probe.txt" | tail -40 ;;
mla)
    timeout 560 python3 -m pytest -v -rf -p no:cacheprovider -n 10 tests/test_triton_mla.py tests/test_mla_module.py > "$out/pytest-mla.log" 2>&1
    echo "mla tests exit $?"; grep -E "FAILED|ERROR" "$out/pytest-mla.log" | head; tail -2 "$out/pytest-mla.log" ;;
fuzz)
    timeout 570 python3 -m pytest -v -rf -p no:cacheprovider -n 14 -m fuzz tests > "$out/pytest-fuzz.log" 2>&1
    echo "fuzz exit $?"; grep -E "FAILED|ERROR" "$out/pytest-fuzz.log" | head; tail -2 "$out/pytest-fuzz.log" ;;
rest)
    timeout 570 python3 -m pytest -v -rf -p no:cacheprovider -n 14 -m "not fuzz" --ignore=tests/test_triton_mla.py \
        --ignore=tests/test_mla_module.py tests > "$out/pytest-rest.log" 2>&1
    echo "rest exit $?"; grep -E "FAILED|ERROR" "$out/pytest-rest.log" | head; tail -2 "$out/pytest-rest.log" ;;
esac
case "$part" in
ncu)  # one launch of the Gluon MLA kernel, B64 x 4096 H128: throughput sections, then stalls per SASS instruction
    ncu --profile-from-start off --kernel-name regex:_mla_sm90 --launch-count 1 --import-source no \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters \
        -o "$out/mla-seesaw${TAG:-}" -f python3 $here/seesaw_probe.py --ncu > "$out/ncu-run.log" 2>&1
    ncu -i "$out/mla-seesaw${TAG:-}.ncu-rep" --page details > "$out/ncu-mla-seesaw-B64-H128${TAG:-}.txt" 2>&1
    ncu -i "$out/mla-seesaw${TAG:-}.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$out/ncu-mla-seesaw${TAG:-}-sass.csv.gz"
    rm -f "$out/mla-seesaw${TAG:-}.ncu-rep"
    grep -E "Duration|Throughput|Spilling|Eligible|Issued Warp|No Eligible|Busy" "$out/ncu-mla-seesaw-B64-H128${TAG:-}.txt" ;;
esac
