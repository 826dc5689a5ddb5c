# The failing kernels' PTX (from Triton 3.6, written by d40_ir.py into DIR) assembled by two ptxas
# versions, each SASS checked for reads of unwritten uniform registers. No GPU needed.
#   bash benchmarks/results/gpu-tests-2026-11-23-d/d40_ptxas.sh DIR PTXAS_A PTXAS_B
# e.g. PTXAS_A=/work/triton36/triton/backends/nvidia/bin/ptxas (12.8.93, Triton 3.6's),
#      PTXAS_B=<Triton 3.9's bundled ptxas> (12.9.86)
set -e
dir=$1; shift
cuobjdump=$(dirname "$1")/cuobjdump
for px in "$@"; do
  for k in D40_Dv24-_prefill_kernel D40_Dv24-_attention_kernel; do
    "$px" -lineinfo --gpu-name=sm_90a "$dir/$k.ptx" -o "$dir/$k.check.cubin"
    "$cuobjdump" -sass "$dir/$k.check.cubin" > "$dir/$k.check.sass"
    echo "$("$px" --version | tail -1): $(python3 benchmarks/sass_uniform_check.py "$dir/$k.check.sass" | sed -n 1p)"
  done
done
