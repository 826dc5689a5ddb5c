# GPU calls of 2026-11-27 (tenth session).
#   bash run.sh OUT PART...   PART: mla (the MLA test files) | fuzz-wide (the wide and pair MLA
#       kernels' fuzz) | fuzz-narrow (the narrow bf16 and fp8 MLA kernels' fuzz) | probe-right
#       (probe_right.py: the wide kernel's right warpgroup rescaling by one exp2 a pair against
#       main fd6dc21's code, which it rebuilds from the package's module) | bench-mla
#       (mla_decode.py, overhead.py;
#       FlashAttention-4 and FlashInfer on PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh
#       and flashinfer-bundle.sh carried over several calls, FA4's install.sh run, the FlashInfer
#       wheels unzipped to /tmp/site, PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD)
#       | qblocks (probe_qblocks.py: the tree's narrow, pair and fp8 kernel modules against the
#       same with qblocks.patch applied, whose query blocks are numbered first blocks first with a
#       block's splits consecutive in launch order) | variant-qblocks (qblocks.patch applied to the
#       package for the parts after it)
#       | ncu-mtp (Nsight Compute, full set, of probe_mtp.py's narrow-kernel and combine launches:
#       2 tokens B64 and B128 x 4096 H16, 1 token B128 and B64 x 4096 H16; details, per-SASS-line samples)
# Calls, in order, all on the tree of main fd6dc21 with mla_sm90's right warpgroup rescaling by one
# exp2 (the next commit's kernel): probe-right mla (logs/probe-right.txt, pytest-mla.log); fuzz-wide
# (logs/pytest-fuzz-wide.log); fuzz-narrow (logs/pytest-fuzz-narrow.log); bench-mla (logs/bench/;
# its output is benchmarks/results/{mla_decode,overhead}-NVIDIA-H100-80GB-HBM3-2026-11-27-b.*), then
# PROBE_SHAPES=B64_ctx4096_H128,B8_ctx8192_H128 probe-right (logs/probe-right-2.txt); then
# `python3 benchmarks/mla_decode.py --shapes B64_ctx4096_H128` twice (logs/bench-b64-{1,2}/); then,
# on a fresh machine without the bundles, `PROBE_TIME=1 python3 probe_mtp.py` (its stdout, the
# call's output, is logs/probe-mtp.txt) and ncu-mtp (logs/ncu-mtp*); then, on another fresh machine,
# `python3 benchmarks/overhead.py` twice (logs/overhead-{1,2}/); then, on a third fresh machine,
# the MLA tests with qblocks.patch applied and the qblocks comparison (logs/pytest-mla-qblocks.log,
# logs/probe-qblocks.txt), run from a branch that held the patched modules, with main a27bacb's
# copied in for "before": what `variant-qblocks mla` and then `qblocks` on main's tree do.
# FlashAttention-4 and FlashInfer were staged over the first four calls (carry .fa4a, .fibA,
# .fibB and .fib2, .fa4b, as in gpu-2026-11-27/run.sh).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
case "$part" in
probe-right) timeout 300 python3 "$here/probe_right.py" > "$out/probe-right.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-right.txt" ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-narrow) t fuzz-narrow 400 -n 14 -m fuzz -k "narrow_fuzz or narrow_fp8_fuzz" tests/test_triton_mla.py ;;
fuzz-wide) t fuzz-wide 540 -n 14 -m fuzz -k "kernel_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
ncu-mtp)  # Nsight Compute, full set, of probe_mtp.py's launches (the narrow kernel and the combine)
    PYTHONPATH=$PWD timeout 400 ncu --set full --import-source no --kernel-name regex:"_mla_narrow_kernel|_combine_kernel" \
        -f -o "$out/ncu-mtp" python3 "$here/probe_mtp.py" > "$out/ncu-mtp.log" 2>&1
    tail -5 "$out/ncu-mtp.log"
    ncu -i "$out/ncu-mtp.ncu-rep" --print-details all > "$out/ncu-mtp-details.txt" 2>&1
    ncu -i "$out/ncu-mtp.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$out/ncu-mtp-sass.csv.gz"
    grep -E "^  [_a-z]|Duration|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Registers Per" "$out/ncu-mtp-details.txt" | head -40 ;;
qblocks)  # probe_qblocks.py, the tree's modules and the patched ones alternated, two rounds, one process
    # each; the tree's modules are restored after
    mods="mla_sm90_narrow mla_sm90_pair mla_sm90_fp8"
    mkdir -p "$out/qb-tree" "$out/qb-after"
    for m in $mods; do cp "torch_paged_attn/lowering/triton/$m.py" "$out/qb-tree/"; done
    git apply "$here/qblocks.patch"
    for m in $mods; do cp "torch_paged_attn/lowering/triton/$m.py" "$out/qb-after/"; done
    for r in 1 2; do
        cp "$out"/qb-tree/*.py torch_paged_attn/lowering/triton/
        timeout 60 python3 "$here/probe_qblocks.py" before >> "$out/probe-qblocks.txt" 2>&1
        cp "$out"/qb-after/*.py torch_paged_attn/lowering/triton/
        timeout 60 python3 "$here/probe_qblocks.py" after >> "$out/probe-qblocks.txt" 2>&1
    done
    cp "$out"/qb-tree/*.py torch_paged_attn/lowering/triton/
    grep -E "graph|Error" "$out/probe-qblocks.txt" ;;
variant-qblocks)  # qblocks.patch applied to the package's narrow, pair and fp8 modules for the parts after it
    git apply "$here/qblocks.patch" ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
*) echo "unknown part $part" ;;
esac
done
