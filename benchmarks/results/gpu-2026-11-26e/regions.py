"""Stall samples of one kernel's SASS by instruction and by region, from
``ncu -i REPORT --page source --csv --print-source sass`` (run.sh, part source-SHAPE): python3 regions.py
CSV [TOP]

Prints the total, then each region (the instructions after one barrier-like instruction up to and
including the next: BAR, SYNCS wait/arrive, WARPGROUP.DEPBAR, USETMAXREG) with at least 0.4 % of
the samples, then the TOP instructions by samples with their leading stall reasons."""
import csv
import re
import sys


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    text = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith('"') and "Source" in line)
    rows = list(csv.DictReader(text[start:]))
    cols = rows[0].keys()
    src = next(c for c in cols if c.strip() == "Source")
    addr = next((c for c in cols if c.strip() == "Address"), None)
    total_col = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
    reasons = [c for c in cols if c.startswith("stall_") or (c.endswith("(All Samples)") and c != total_col)]

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0
    samples = [num(r[total_col]) for r in rows]
    total = sum(samples) or 1.0
    print(f"{path}: {len(rows)} instructions, {total:.0f} samples")
    cum = acc = 0.0
    for i, r in enumerate(rows):
        acc += samples[i]
        cum += samples[i]
        s = r[src].strip()
        if re.search(r"\b(BAR\.|SYNCS\.|WARPGROUP\.DEPBAR|USETMAXREG|EXIT)", s) or i == len(rows) - 1:
            if acc / total >= 0.004:
                print(f"  {i:5d} cum {100 * cum / total:5.1f}%  + {100 * acc / total:4.1f}%  up to {s[:70]}")
            acc = 0.0
    print(f"\ntop {top} instructions")
    order = sorted(range(len(rows)), key=lambda i: -samples[i])[:top]
    for i in sorted(order):
        r = rows[i]
        why = sorted(((num(r[c]), c) for c in reasons), reverse=True)[:3]
        whys = ", ".join(f"{re.sub(r' ?[(].*', '', c)} {v:.0f}" for v, c in why if v)
        print(f"  {i:5d} {r[addr] if addr else '':>6s} {100 * samples[i] / total:5.2f}%  {r[src].strip()[:60]:60s} {whys}")


if __name__ == "__main__":
    main()
