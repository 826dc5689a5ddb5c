# GPU calls of 2026-11-24 (second part): the Gluon sm_90 prefill kernel.
#   bash run.sh OUT PART      PART: gluon (its tests, then both prefill kernels timed) | tests | fuzz | bench |
#                                   sweep (gluon_sweep.py)
out=${1:?out dir}; part=${2:?part}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
case "$part" in
gluon)
    timeout 300 python3 -m pytest -q -ra -p no:cacheprovider -n 6 -k "gluon" tests/test_triton_prefill.py > "$out/pytest-gluon.log" 2>&1
    echo "gluon tests exit $?"; grep -E "passed|failed|Error|error" "$out/pytest-gluon.log" | tail -15
    timeout 200 python3 benchmarks/paged_attention.py --shapes prefill_B4_q2048,chunked_prefill_B4_q512_ctx4096 \
        --providers torch_paged_attn --out "$out" 2>"$out/bench-gluon-progress.log" | tee "$out/bench-gluon.txt" | grep -E "prefill" | head -20 ;;
tests)
    timeout 560 python3 -m pytest -q -ra -p no:cacheprovider -n 8 -m "not fuzz" -k "not aoti" tests/test_triton_prefill.py \
        tests/test_triton_paged_attention.py tests/test_compile_export.py > "$out/pytest-tests.log" 2>&1
    echo "tests exit $?"; tail -4 "$out/pytest-tests.log" ;;
fuzz)
    timeout 570 python3 -m pytest -q -ra -p no:cacheprovider -n 12 -m fuzz tests > "$out/pytest-fuzz.log" 2>&1
    echo "fuzz exit $?"; tail -4 "$out/pytest-fuzz.log" ;;
bench)
    timeout 560 python3 benchmarks/paged_attention.py --shapes prefill --out "$out" 2>"$out/bench-progress.log" \
        | tee "$out/paged_attention-prefill.txt" | grep -E "prefill" | head -40 ;;
sweep)
    timeout 200 python3 benchmarks/results/gpu-2026-11-24b/gluon_sweep.py > "$out/gluon-sweep.txt" 2>"$out/gluon-sweep.err"
    echo "sweep exit $?"; cat "$out/gluon-sweep.txt"; tail -3 "$out/gluon-sweep.err" ;;
esac
