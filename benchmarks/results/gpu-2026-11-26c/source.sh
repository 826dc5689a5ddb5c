# A full Nsight Compute report of one warm narrow-kernel launch (SHAPE) and its SASS with the
# stall samples of each instruction: bash source.sh OUT_DIR SHAPE
out=${1:?out dir}; shape=${2:?shape}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
timeout 300 ncu --profile-from-start off --kernel-name "regex:${KERNEL:-_mla_narrow|_mla_fp8}" --launch-count 1 --set full \
    --import-source yes -f -o "$out/full-$shape" python3 benchmarks/ncu_profile.py "$shape" > "$out/full-$shape.log" 2>&1
echo "ncu exit $?"
ncu -i "$out/full-$shape.ncu-rep" --page source --csv --print-source sass > "$out/source-$shape.csv" 2>&1
echo "source exit $? $(wc -l < "$out/source-$shape.csv") lines"
ncu -i "$out/full-$shape.ncu-rep" --page details > "$out/details-$shape.txt" 2>&1
