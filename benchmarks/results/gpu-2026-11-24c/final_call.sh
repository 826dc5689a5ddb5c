export PYTHONPATH=$PWD
for m in 0 1; do TORCH_PAGED_ATTN_FAST_LAUNCH=$m python3 -m pytest -q -x -k "gluon_mla_graph" tests/test_triton_mla.py 2>&1 | tail -1 | sed "s/^/fast=$m graph: /"; done
python3 -m pytest -q -rf -n 8 -k "gluon" tests/test_triton_prefill.py > $OUT/pytest-gluon-prefill.log 2>&1; tail -1 $OUT/pytest-gluon-prefill.log
timeout 330 python3 -m pytest -q -rf -n 14 -m fuzz -k gluon_mla tests/test_triton_mla.py > $OUT/pytest-gluon-mla-fuzz.log 2>&1; tail -3 $OUT/pytest-gluon-mla-fuzz.log
python3 benchmarks/mla_decode.py --shapes '*H128*,mtp*' --providers 'torch_paged_attn' --out $OUT 2>&1 | grep -v "^  [A-Za-z0-9_]*: " > $OUT/mla_decode-after-launcher.txt; grep -E "^[Bm ]" $OUT/mla_decode-after-launcher.txt | grep "us\|eager" | head -12
