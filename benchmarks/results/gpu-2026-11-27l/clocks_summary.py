"""The GPU's SM clock and power during each phase of a benchmark run: ``clocks.csv`` (``nvidia-smi
--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50``) against
``clocks-progress.txt`` (the benchmark's progress lines on stderr, each prefixed with the wall time
``%H:%M:%S.%N``). A sample belongs to the last progress line before it. Prints, per phase, the
samples' count and median SM clock (MHz), power (W) and temperature (C).

    python3 clocks_summary.py OUT_DIR
"""
import statistics
import sys
from datetime import datetime


def seconds(hms: str) -> float:
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s[:12])


def main():
    out = sys.argv[1]
    phases = []
    with open(f"{out}/clocks-progress.txt") as f:
        for line in f:
            stamp, _, text = line.rstrip("\n").partition(" ")
            phases.append((seconds(stamp), text.strip()))
    samples = []
    with open(f"{out}/clocks.csv") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 4:
                continue
            try:
                t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
                clock, power, temp = float(parts[1].split()[0]), float(parts[2].split()[0]), float(parts[3])
            except ValueError:
                continue
            samples.append((t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6, clock, power, temp))
    print(f"{'phase':60s} {'samples':>7s} {'SM MHz':>7s} {'W':>6s} {'C':>4s}")
    for i, (start, text) in enumerate(phases):
        end = phases[i + 1][0] if i + 1 < len(phases) else float("inf")
        got = [x for x in samples if start <= x[0] < end]
        if not got:
            print(f"{text[:60]:60s} {0:7d}")
            continue
        med = lambda k: statistics.median(x[k] for x in got)  # noqa: E731
        print(f"{text[:60]:60s} {len(got):7d} {med(1):7.0f} {med(2):6.0f} {med(3):4.0f}")


if __name__ == "__main__":
    main()
