# GPU calls of 2026-11-27 (nineteenth session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: sms (probe_sms.py: the GPCs by cluster launches, and the narrow
#       MLA programs' tile times by SM over replays)
# Calls, in order (main ca2b607, the package unchanged):
#   1 `sms`, an H100 80GB HBM3 machine (A): the GPC map; four narrow-kernel shapes, eight replays each;
#   2 `sms` with the end-offset correlations, the last enders' entries and the idle and fastest SMs
#     printed, and 2 tokens B32 x 8192 added, a second machine (B).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
sms) timeout 420 python3 "$here/probe_sms.py" > "$out/probe-sms.txt" 2>&1; echo "exit $?"; grep -v Warn "$out/probe-sms.txt" | tail -90 ;;
*) echo "unknown part $part" ;;
esac
done
