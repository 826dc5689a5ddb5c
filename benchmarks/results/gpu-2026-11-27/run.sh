# GPU calls of 2026-11-27 (ninth session).
#   bash run.sh OUT PART...   PART: probe-rescale (probe_rescale.py: the wide MLA kernel's left
#       warpgroup rescaling its output once a pair against twice) | mla (the MLA test files) |
#       fuzz-wide (the wide and pair MLA kernels' fuzz) | fuzz-fp8 (the fp8 narrow kernels' fuzz) | bench-mla (mla_decode.py, overhead.py;
#       FlashAttention-4 and FlashInfer on PYTHONPATH: the bundles of ../shared/tools/fa4-bundle.sh
#       and flashinfer-bundle.sh carried over several calls, FA4's install.sh run, the FlashInfer
#       wheels unzipped to /tmp/site, PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD)
#       | ncu-wide VARIANT (Nsight Compute, full set, of one launch of the wide kernel at B64 x 4096
#       H128 with the probe switch at VARIANT: two, one or one_ovl; details and per-SASS-line samples)
#       | probe-fp8 (probe_fp8.py: the fp8 MLA kernel's producer looking its page up before its
#       wait, against 5070d8c's, which it rebuilds from the package's module) | variant N (left.patch
#       applied, at switch N, for the parts after it)
# left.patch turns the package's mla_sm90 (as of main bf1ff7c; `git apply` it at that commit) into
# main 2aa1788's with the probe switch PAGED_ATTN_PROBE_MLA_LEFT (the file the calls below loaded
# as mla_sm90_left.py, byte for byte); switch values 0, 1, 2, 3, 4 = two, one, one_ovl, swap,
# one_prod (probe_rescale.py says what each does); at 0 it compiles
# to main 2aa1788's sm_90 SASS, at 1 to the SASS of the commit that took variant 1 into mla_sm90
# (B64 x 4096 H128, B1 x 32768 H128, block sizes 16 and 128, Triton 3.6). Each pytest log's first
# line names the switch it ran with.
# Calls, in order: probe-rescale (logs/probe-rescale.txt: two, one, one_ovl), mla, fuzz-wide,
# bench-mla (logs/bench/), ncu-wide two, ncu-wide one, all with the switch at 0 in the package's
# mla_sm90 (main's SASS); PROBE_VARIANTS=two,one,swap probe-rescale (logs/probe-rescale-2.txt);
# variant 1 mla (logs/pytest-mla-one.log), variant 1 fuzz-wide (logs/pytest-fuzz-wide-one.log);
# then on 0aac713 (variant 1 in mla_sm90): mla (logs/pytest-mla-final.log), bench-mla
# (its output is benchmarks/results/{mla_decode,overhead}-NVIDIA-H100-80GB-HBM3-2026-11-27.*, its
# progress log logs/bench-final/); PROBE_VARIANTS=two,one,one_prod probe-rescale (logs/probe-rescale-3.txt);
# then on 5070d8c with the fp8 producer's lookup before its wait (the next commit's kernels):
# probe-fp8 mla fuzz-fp8 (logs/probe-fp8.txt, pytest-mla-fp8.log, pytest-fuzz-fp8.log);
# then (same tree) ncu-wide one_prod (logs/ncu-wide-one_prod-*), PROBE_SHAPES=B64_ctx4096_H128,
# B8_ctx8192_H128 PROBE_VARIANTS=one,one_prod PROBE_ROUNDS=6 probe-rescale (logs/probe-rescale-4.txt),
# variant 4 mla (logs/pytest-mla-one-prod.log), variant 4 fuzz-wide (logs/pytest-fuzz-wide-one-prod.log).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
t() {  # gpu_run.sh's t, its log headed by the probe switch it ran under
    local name=$1 secs=$2; shift 2
    echo "PAGED_ATTN_PROBE_MLA_LEFT=${PAGED_ATTN_PROBE_MLA_LEFT:-0}" > "$out/pytest-$name.log"
    timeout "$secs" python3 -m pytest -q -rf -p no:cacheprovider "$@" >> "$out/pytest-$name.log" 2>&1
    echo "pytest $name exit $?"; grep -E "^FAILED|^ERROR" "$out/pytest-$name.log" | head -20; tail -1 "$out/pytest-$name.log"
}
while [ $# -gt 0 ]; do
part=$1; shift
case "$part" in
probe-rescale)
    git apply "$here/left.patch"
    timeout 330 python3 "$here/probe_rescale.py" > "$out/probe-rescale.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-rescale.txt"
    git apply -R "$here/left.patch" ;;
probe-fp8) timeout 300 python3 "$here/probe_fp8.py" > "$out/probe-fp8.txt" 2>&1; grep -E "graph|copy|Error" "$out/probe-fp8.txt" ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-fp8) t fuzz-fp8 300 -n 14 -m fuzz -k "narrow_fp8_fuzz" tests/test_triton_mla.py ;;
fuzz-wide) t fuzz-wide 540 -n 14 -m fuzz -k "kernel_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 330 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -44
    timeout 120 python3 benchmarks/overhead.py --out "$out" > "$out/overhead.txt" 2>&1; tail -22 "$out/overhead.txt" ;;
ncu-wide)
    v=$1; shift
    git apply "$here/left.patch"
    PROBE_NCU=1 PROBE_ROUNDS=1 PROBE_SHAPES=B64_ctx4096_H128 PROBE_VARIANTS=$v timeout 280 \
        ncu --set full --import-source no --kernel-name regex:_mla_sm90_kernel --launch-count 1 -f -o "$out/ncu-wide-$v" \
        python3 "$here/probe_rescale.py" > "$out/ncu-wide-$v.log" 2>&1
    git apply -R "$here/left.patch"
    ncu -i "$out/ncu-wide-$v.ncu-rep" --print-details all > "$out/ncu-wide-$v-details.txt" 2>&1
    ncu -i "$out/ncu-wide-$v.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$out/ncu-wide-$v-sass.csv.gz"
    grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|Warp Cycles Per Issued|Registers Per" "$out/ncu-wide-$v-details.txt" | head -12 ;;
variant)  # variant N: left.patch applied to the package's mla_sm90, at switch N, for the parts after it
    git apply "$here/left.patch"
    export PAGED_ATTN_PROBE_MLA_LEFT=$1; shift ;;
*) echo "unknown part $part" ;;
esac
done
