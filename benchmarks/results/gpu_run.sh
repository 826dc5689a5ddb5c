# What every results/gpu-*/run.sh since 2026-11-26b starts with, sourced by them (bash):
#   . "$(dirname "$0")/../gpu_run.sh"
# takes the output folder from the caller's $1 (shifted off, so the caller's "$@" is its parts),
# sets ``here`` (the caller's folder) and the Python path (the checkout), and defines
#   t NAME SECONDS PYTEST-ARGS...   a pytest run, its log in $out/pytest-NAME.log, its summary on stdout
out=${1:?out dir}; shift
mkdir -p "$out"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
t() {  # t NAME SECONDS PYTEST-ARGS...: a pytest run, its log in $out, its summary on stdout
    local name=$1 secs=$2; shift 2
    timeout "$secs" python3 -m pytest -q -rf -p no:cacheprovider "$@" > "$out/pytest-$name.log" 2>&1
    echo "pytest $name exit $?"; grep -E "^FAILED|^ERROR" "$out/pytest-$name.log" | head -20; tail -1 "$out/pytest-$name.log"
}
