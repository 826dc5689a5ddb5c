# GPU calls of 2026-11-27 (twelfth session, second part).
#   bash run.sh OUT PART...   PART: timeline (probe_timeline.py: the narrow MLA kernel's programs
#       stamping %globaltimer at each phase, the last of a graph's back-to-back calls) | qfirst
#       (probe_qfirst.py: the narrow kernel's query loads issued before its first tiles' copies) | mla
#       (the MLA test files) | fuzz-narrow (the narrow bf16 and fp8 MLA kernels' fuzz)
# Calls, in order, each on a fresh machine: `timeline` on main 78f47e8 (a first run's stamps were
# written 8 bytes apart instead of 64 and overlapped; fixed, then logs/probe-timeline.txt); `qfirst`
# with a first probe_qfirst.py (queries first for every program, built from 78f47e8's module:
# logs/probe-qfirst.txt); then, on the tree of the next commit (_QUERIES_FIRST 16), `qfirst mla
# fuzz-narrow` (logs/probe-qfirst-2.txt, pytest-mla.log, pytest-fuzz-narrow.log).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
case "$part" in
timeline) timeout 300 python3 "$here/probe_timeline.py" > "$out/probe-timeline.txt" 2>&1; cat "$out/probe-timeline.txt" | tail -80 ;;
qfirst) timeout 400 python3 "$here/probe_qfirst.py" > "$out/probe-qfirst-2.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-qfirst-2.txt" ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-narrow) t fuzz-narrow 400 -n 14 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
*) echo "unknown part $part" ;;
esac
done
