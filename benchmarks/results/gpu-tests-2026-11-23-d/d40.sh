# one process per variant; prints the verdict line of each
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
run() { timeout 60 python3 benchmarks/results/gpu-tests-2026-11-23-d/d40_diag.py cuda "$@" 2>&1 | grep -E "out max err|Error" | tail -2; }
run sm1
TORCH_PAGED_ATTN_FAST_LAUNCH=0 run sm1
TORCH_PAGED_ATTN_FAST_LAUNCH=check run sm1
TORCH_PAGED_ATTN_FAST_LAUNCH=0 run shared
OVERRIDE='{"head_size_v": 32}' run sm1
OVERRIDE='{"head_size_v": None}' run sm1
OVERRIDE='{"head_size": 32}' run sm1
OVERRIDE='{"num_heads": 4}' run sm1
OVERRIDE='{"block_size": 16}' run sm1
OVERRIDE='{"block_size": 32}' run sm1
CUDA_LAUNCH_BLOCKING=1 run sm1
timeout 120 compute-sanitizer --tool memcheck --print-limit 4 python3 benchmarks/results/gpu-tests-2026-11-23-d/d40_diag.py cuda sm1 2>&1 | grep -E "=====|out max err" | head -12
