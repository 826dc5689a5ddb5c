# What every results/gpu-*/run.sh since 2026-11-26b starts with, sourced by them (bash):
#   . "$(dirname "$0")/../gpu_run.sh"
# takes the output folder from the caller's $1 (shifted off, so the caller's "$@" is its parts),
# sets ``here`` (the caller's folder) and the Python path (the checkout), and defines
#   t NAME SECONDS PYTEST-ARGS...   a pytest run, its log in $out/pytest-NAME.log, its summary on stdout
#   rows SECONDS PATTERN SUMMARY     overhead.py's rows $ROWS in ${ROUNDS:-3} processes in turn (each
#                                    SECONDS at most; lines matching PATTERN shown), summarised by the
#                                    script SUMMARY (gpu-2026-11-27j/rows_summary.py), then packed
#   staging PART                     FlashAttention-4 and FlashInfer carried onto the machine and installed
#                                    (below); false for any other PART
out=${1:?out dir}; shift
mkdir -p "$out"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
t() {  # t NAME SECONDS PYTEST-ARGS...: a pytest run, its log in $out, its summary on stdout
    local name=$1 secs=$2; shift 2
    timeout "$secs" python3 -m pytest -q -rf -p no:cacheprovider "$@" > "$out/pytest-$name.log" 2>&1
    echo "pytest $name exit $?"; grep -E "^FAILED|^ERROR" "$out/pytest-$name.log" | head -20; tail -1 "$out/pytest-$name.log"
}
rows() {  # rows SECONDS PATTERN SUMMARY: see above
    local secs=$1 pattern=$2 summary=$3 round
    for round in $(seq 1 "${ROUNDS:-3}"); do
        timeout "$secs" python3 benchmarks/overhead.py --rows "$ROWS" --out "$out/rows-$round" > "$out/rows-$round.txt" 2>&1
        echo "== round $round"; grep -E "$pattern" "$out/rows-$round.txt"
    done
    python3 "$summary" "$out" | tee "$out/rows-summary.txt"
    (cd "$out" && tar czf rows.tar.gz rows-[0-9]* && rm -rf rows-[0-9]*)  # few files come back
}

# The bundles of ../shared/tools/fa4-bundle.sh and flashinfer-bundle.sh, split so that each call's carry
# and the tree stay under 64 MiB (the tree is 17): FA4 in .fa4a1 + .fa4a2 (the CuTe DSL library, cut in
# two) and .fa4b (its wheels and install.sh); FlashInfer in .fibA + .fibB (its wheel, cut in two) and
# .fib2 (the rest). Parts, each a call carrying what it names, in order:
#   stash-a (.fa4a1) | stash-b (.fibA) | stash-c (.fibB .fa4a2 .fib2: both joined) or, for FA4 alone,
#   stash-fa4 (.fa4a2) | stage (.fa4b: FA4 installed in /tmp/site, every stashed wheel unpacked there,
#   /tmp/site on PYTHONPATH for the parts after it) | stash-fi (.fibB .fib2 after stash-b, once FA4 is
#   staged: FlashInfer's wheels joined and unpacked) | site (/tmp/site on PYTHONPATH again, in a later
#   call on the same machine)
site() { export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH; }
unpack() { for w in /root/stash/*.whl; do
    [ -e "$w" ] || continue
    python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" "$w"; done; }
staging() {
    case "$1" in
    stash-a) mkdir -p /root/stash && cp .fa4a1/* /root/stash/ && echo stashed fa4a1 ;;
    stash-b) mkdir -p /root/stash && cp .fibA/* /root/stash/ && echo stashed fibA ;;
    stash-c)
        cat /root/stash/fa4part.aa .fa4a2/fa4part.ab > /root/stash/cutlass_ir.so.xz
        cat /root/stash/fipart.aa .fibB/fipart.ab > "/root/stash/$(cat .fibB/name.txt)"
        cp .fib2/*.whl /root/stash/ && rm -f /root/stash/fa4part.aa /root/stash/fipart.aa && ls -la /root/stash ;;
    stash-fa4) cat /root/stash/fa4part.aa .fa4a2/fa4part.ab > /root/stash/cutlass_ir.so.xz \
        && rm -f /root/stash/fa4part.aa && ls -la /root/stash ;;
    stash-fi) cat /root/stash/fipart.aa .fibB/fipart.ab > "/root/stash/$(cat .fibB/name.txt)" \
        && cp .fib2/*.whl /root/stash/ && rm -f /root/stash/fipart.aa && unpack && ls /root/stash ;;
    stage) bash .fa4b/install.sh > "$out/stage.log" 2>&1; echo "install.sh exit $?"; unpack; site ;;
    site) site ;;
    *) return 1 ;;
    esac
    return 0  # a staging part, whatever its commands' status (their output says)
}
