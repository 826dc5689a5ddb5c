"""One benchmark shape's op, run under Nsight Compute: the kernel-level cause of a gap.

    ncu --profile-from-start off --kernel-name regex:_mla_kernel --launch-count 1 \\
        --section SpeedOfLight ... python benchmarks/ncu_profile.py B64_ctx4096_H128
    python benchmarks/ncu_profile.py B64_ctx4096_H128 --sweep mla_h128 --candidate 8   # a tune.py tile

Builds the op exactly as ``benchmarks/tune.py`` times it (a shape of ``paged_attention.py`` or
``mla_decode.py``; with ``--sweep``/``--candidate``, one of that sweep's candidate tiles in place
of the table's entry), warms it up (JIT compilation, plans) outside the profiled range, then runs
it ``--repeat`` times between ``cudaProfilerStart`` and ``cudaProfilerStop``, so ``ncu
--profile-from-start off`` sees only warm launches. Nothing is timed here: ``ncu`` replays each
kernel with its caches flushed (``--cache-control all``, its default), the cold-L2 case the
benchmarks' eager rows time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import tune  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", help="a shape name of benchmarks/paged_attention.py or benchmarks/mla_decode.py")
    ap.add_argument("--sweep", help="a tune.py sweep whose candidate replaces the table entry")
    ap.add_argument("--candidate", type=int, default=0, help="index into the sweep's candidates")
    ap.add_argument("--repeat", type=int, default=1, help="profiled calls")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile.py needs CUDA", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    fn, nbytes, formula = tune._call(args.shape, device, tiny=False)
    if args.sweep:
        sweep = tune.SWEEPS[args.sweep]
        if sweep.shape != args.shape:
            raise SystemExit(f"sweep {args.sweep} runs shape {sweep.shape}, not {args.shape}")
        value = sweep.candidates[args.candidate]
        print(f"{args.sweep} candidate {args.candidate}: {value}", flush=True)
        ctx = tune._candidate(sweep, value)
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        for _ in range(3):  # compile, plan, allocate
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for _ in range(args.repeat):
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"{args.shape}: {nbytes / 1e6:.1f} MB moved ({formula})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
