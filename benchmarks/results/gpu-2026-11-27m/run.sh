# GPU calls of 2026-11-27 (twentieth session), H100 (logs/callN/).
#   bash run.sh OUT PART...   PART: order (probe_order.py: the wide and narrow MLA kernels' grid orders) |
#       dram (ncu: each launch's duration and DRAM bytes of the wide kernel at B64 x 4096 H128 in both grid
#       orders, eight launches each, the GPU's own clocks and caches) | n256 (probe_n256.py: the wide kernel's
#       value products one wgmma of N = L / 2 against main's four of N = 64, each with either grid order) |
#       wide (the wide kernel's GPU tests and fuzz) | final (probe_final.py: the package's wide kernel against
#       main's) | regs (probe_regs.py: the right warpgroup's registers) | power (probe_power.py: ours, main's
#       wide kernel and FlashInfer under sustained load, with the SM clock and power; FlashInfer staged) |
#       mla | fuzz-mla | bench-mla (as in ../gpu-2026-11-27l/run.sh)
# Calls, in order (each a fresh machine unless it says otherwise; "warm" the machine of the call before):
#   1 `order dram` on main 66aefd2 (the package unchanged);
#   2 `n256 wide`: the value products one wgmma of N = L / 2 (probe_n256.py ran on that tree, before the grid
#     order landed: "n256" is that tree, "n256h" and "mainh" the head groups first by probe_order.py's
#     replacements); the wide kernel's tests and fuzz 58 passed, 1 skipped;
#   3 `stash-a final wide` (carry .fa4a1) on the tree with both changes (the value operand a reinterpret of its
#     first [64, 64] chunk): 58 passed, 1 skipped; 4 `stash-fa4 stage mla`, a fresh machine (the stash gone:
#     install.sh failed; the MLA files 182 passed, 32 skipped);
#   5 `stash-a`, 6 `stash-fa4 stage`, 7 `stash-b`, 8 `stash-fi site bench-mla power` (warm): mla_decode.py
#     (logs/call8) and probe_power.py, whose FlashInfer graph failed at its first replay
#     (cudaErrorInvalidAddressSpace; the benchmark's own FlashInfer graphs ran);
#   9-11 the staging again (the machine had gone back), 12 `stash-fi site power bench-mla` (probe_power.py with
#     _harness's side-stream warm-up: the same failure; mla_decode.py in logs/call12);
#   13 `regs`;
#   then on the final tree (the chunks of both stages first, the rope chunks last, so that the value view is a
#   reinterpret of the whole buffer, which Triton 3.9 also accepts):
#   14 `wide mla`: 58 passed, 1 skipped; 182 passed, 32 skipped;
#   15 `stash-a`, 16 `stash-fa4 stage`, 17 `stash-b`, 18 `stash-fi site bench-mla final` (warm):
#     benchmarks/results/mla_decode-NVIDIA-H100-80GB-HBM3-2026-11-27-m.* and logs/call18/probe-final.txt;
#   19 `stash-a`, 20 `stash-fa4 stage`, 21 `stash-b`, 22 `stash-fi site power` (warm), probe_power.py keeping each
#     contender's calls alive while its graph lives (calls 8 and 12 dropped them: the failure there).
. "$(dirname "$0")/../gpu_run.sh"  # out (from $1), here, PYTHONPATH, t()
while [ $# -gt 0 ]; do
part=$1; shift
staging "$part" && continue  # ../gpu_run.sh
case "$part" in
n256) timeout 420 python3 "$here/probe_n256.py" > "$out/probe-n256.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-n256.txt" | tail -90 ;;
wide) t wide 330 -n 12 -k "gluon_mla_kernel_fuzz or gluon_mla_cuda or bad_block or declines_cuda or reads_inputs or graph_and_compile" \
        tests/test_triton_mla.py ;;
power) timeout 300 python3 "$here/probe_power.py" > "$out/probe-power.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-power.txt" | tail -40 ;;
final) timeout 420 python3 "$here/probe_final.py" > "$out/probe-final.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-final.txt" | tail -70 ;;
regs) timeout 300 python3 "$here/probe_regs.py" > "$out/probe-regs.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-regs.txt" | tail -30 ;;
order) timeout 480 python3 "$here/probe_order.py" > "$out/probe-order.txt" 2>&1; echo "exit $?"
    grep -v Warn "$out/probe-order.txt" | tail -70 ;;
dram) PROBE_DRAM=1 timeout 300 ncu --clock-control none --cache-control none --kernel-name regex:_mla_sm90_kernel \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_op_read_hit_rate.pct,sm__cycles_elapsed.avg.per_second \
        --csv python3 "$here/probe_order.py" > "$out/ncu-dram.csv" 2> "$out/ncu-dram.log"; echo "exit $?"
    grep -v '^==' "$out/ncu-dram.csv" | python3 -c "
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
head, rows = rows[0], rows[1:]
i, m, v = head.index('ID'), head.index('Metric Name'), head.index('Metric Value')
by = {}
for r in rows:
    by.setdefault(r[i], {})[r[m]] = r[v]
for k in sorted(by, key=int):
    print(k, by[k])
" ; tail -3 "$out/ncu-dram.log" ;;
mla) t mla 300 -n 12 -m "not fuzz" tests/test_triton_mla.py tests/test_mla_module.py ;;
fuzz-mla) t fuzz-mla 330 -n 14 -m fuzz -k "narrow_fuzz or pair_fuzz" tests/test_triton_mla.py ;;
bench-mla)
    timeout 360 python3 benchmarks/mla_decode.py --out "$out" 2> "$out/bench-mla-progress.log" | tee "$out/mla_decode.txt" | tail -46 ;;
*) echo "unknown part $part" ;;
esac
done
