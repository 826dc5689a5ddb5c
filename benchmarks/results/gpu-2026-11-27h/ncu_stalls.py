"""Warp-stall samples of an Nsight Compute source-page export (``ncu -i R --page source --csv
--print-source sass``, gzipped) summed by instruction class and by stall reason: where a kernel's
warps wait. A sample counts against the instruction the warp waits to issue.

    python3 ncu_stalls.py logs/call4/ncu-fp8-sass.csv.gz logs/call4/ncu-fp8-groups-sass.csv.gz
"""

import collections
import csv
import gzip
import io
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
# instruction classes: (prefix of the opcode, class name), first match wins; the rest is "other"
CLASSES = [("HMMA", "HMMA"), ("F2FP.F16.E4M3", "F2FP (fp8 cvt)"), ("IMAD.MOV.U32", "IMAD.MOV"),
           ("LDSM.16.MT", "LDSM.T (V fp16)"), ("LDSM", "LDSM"), ("LDS", None), ("STS", None), ("BAR", "BAR"),
           ("MUFU", "MUFU"), ("LDGSTS", "LDGSTS"), ("DEPBAR", "DEPBAR"), ("SHFL", "SHFL")]


def load(path: str) -> tuple[list[str], list[dict]]:
    rows = list(csv.reader(io.TextIOWrapper(gzip.open(path), "utf-8")))
    header = rows[1]
    return header, [dict(zip(header, r)) for r in rows[2:] if len(r) >= len(header) - 1]


def opcode(source: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())  # drop a predicate
    return text.split()[0] if text else "?"


def opclass(source: str) -> str:
    op = opcode(source)
    for prefix, name in CLASSES:
        if op.startswith(prefix):
            return name or op
    return "other"


def count(value: str) -> int:
    return int(value or 0)


def main(paths: list[str]) -> None:
    for path in paths:
        header, data = load(path)
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(count(d[SAMPLES]) for d in data)
        by_class, by_reason = collections.Counter(), collections.Counter()
        class_reasons = collections.defaultdict(collections.Counter)
        other_ops = collections.Counter()
        for d in data:
            n, c = count(d[SAMPLES]), opclass(d["Source"])
            by_class[c] += n
            if c == "other":
                other_ops[opcode(d["Source"])] += n
            for r in reasons:
                by_reason[r] += count(d[r])
                class_reasons[c][r] += count(d[r])
        pct = lambda n: n / total * 100  # noqa: E731
        print(f"{path}: {total} samples")
        for c, n in by_class.most_common(16):
            top = ", ".join(f"{r[6:]} {pct(v):.1f}" for r, v in class_reasons[c].most_common(3) if v)
            print(f"  {c:18s} {pct(n):5.1f} %   ({top})")
        print("  reasons:", ", ".join(f"{r[6:]} {pct(v):.1f}" for r, v in by_reason.most_common(8)))
        print("  'other' by opcode:", ", ".join(f"{op} {pct(v):.1f}" for op, v in other_ops.most_common(14)))


if __name__ == "__main__":
    main(sys.argv[1:])
