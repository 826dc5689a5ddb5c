#!/usr/bin/env bash
# The GPU check in one command: the whole test suite on the GPU (fuzz included), a memcheck of
# the planted-bad-table tests, then the benchmarks (paged attention, eager overhead, MLA decode, the
# example model's decode step) and the plot.
# Logs and JSON go to $1 (default benchmarks/results). FlashAttention-4 rows appear when
# flash_attn.cute is importable (see the README's benchmark section for how to carry it).
#   bash benchmarks/run_all.sh [OUT_DIR] [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results}"; shift || true
mkdir -p "$out"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$out/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$out/env.txt" 2>&1

echo "== pytest (GPU) =="
python3 -m pytest tests -q -ra -p no:cacheprovider --durations=20 "$@" 2>&1 | tee "$out/pytest-gpu.log" | tail -40

echo "== compute-sanitizer memcheck: planted bad block tables and slots =="
compute-sanitizer --tool memcheck --error-exitcode 7 python3 -m pytest -q -p no:cacheprovider \
  tests/test_triton_paged_attention.py tests/test_triton_kv_cache.py tests/test_triton_mla.py -k "bad or garbage or out_of_range" \
  > "$out/memcheck.log" 2>&1
echo "memcheck exit code: $? (0 = no errors)" | tee -a "$out/memcheck.log"
tail -5 "$out/memcheck.log"

echo "== benchmarks =="
python3 benchmarks/paged_attention.py --out "$out" 2>"$out/bench-progress.log" | tee "$out/bench.txt"
python3 benchmarks/overhead.py --out "$out" 2>&1 | tee "$out/overhead.txt"
python3 benchmarks/mla_decode.py --out "$out" 2>"$out/mla-progress.log" | tee "$out/mla_decode.txt"
python3 benchmarks/decode_step.py --out "$out" 2>"$out/decode-step-progress.log" | tee "$out/decode_step.txt"
python3 benchmarks/plot.py "$(ls -t "$out"/paged_attention-*.json | head -1)" -o "$out/paged_attention.png" 2>&1 | tail -2
