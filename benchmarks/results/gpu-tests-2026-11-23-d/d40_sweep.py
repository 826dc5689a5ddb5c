"""Both attention kernels compiled for sm_90 (Triton on PYTHONPATH, no GPU) on the D40/Dv24 case's
shape with other head sizes, each cubin checked for uniform registers read before any write
(``benchmarks/sass_uniform_check.py``):

    env -u TRITON_INTERPRET PYTHONPATH=/work/triton36:$PWD python benchmarks/results/gpu-tests-2026-11-23-d/d40_sweep.py [D:Dv ...]
"""
import os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..")]
import d40_ir
import sass_report
import sass_uniform_check

PAIRS = [(40, 24), (24, 40), (48, 24), (72, 40), (40, 16), (80, 48), (96, 64), (128, 64), (64, 128), (112, 64),
         (128, 96), (64, 32), (32, 64), (40, 40), (40, 32), (32, 24)]


def sass_of(compiled):
    return sass_report.cuobjdump(compiled, "-sass")


def main(pairs):
    for d, dv in pairs:
        for label, shared, sms in (("prefill", False, 1), ("shared", True, 1), ("shared-132", True, 132)):
            with sass_report.captured_launches(sms=sms) as launches:
                d40_ir.plan(d, dv, shared)
            for kernel, kwargs in launches:
                bad = sass_uniform_check.check(sass_of(d40_ir.compile_launch(kernel, kwargs)))
                print(f"D{d:<4}Dv{dv:<4}{label:<11}{kernel.__name__:<22}D_PAD {kwargs.get('D_PAD')} DV_PAD "
                      f"{kwargs.get('DV_PAD')} TILE_N {kwargs.get('TILE_N')}: {len(bad)} unwritten uniform reads"
                      + "".join(f"\n      {b}" for b in bad[:4]), flush=True)


if __name__ == "__main__":
    main([tuple(map(int, a.split(":"))) for a in sys.argv[1:]] or PAIRS)
