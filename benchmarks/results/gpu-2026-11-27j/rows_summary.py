"""overhead.py's rows over the rounds of a ``run.sh rows`` part: each row's figures per round (one
process a round, the rows in turn within it) and their median and minimum over the rounds.

    python3 rows_summary.py OUT   # reads OUT/rows-*/overhead-*.json
"""
import glob
import json
import os
import statistics
import sys


def main(out: str) -> None:
    rounds = sorted(glob.glob(os.path.join(out, "rows-*", "overhead-*.json")),
                    key=lambda p: int(p.split(os.sep)[-2].split("-")[1]))
    figures: dict[str, dict[str, list[float]]] = {}
    for path in rounds:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                if row["status"] != "ok":
                    continue
                for col in ("events_us", "host_us", "call_us", "wall_us"):
                    value = row["extra"].get(col)
                    if value is not None:
                        figures.setdefault(row["provider"], {}).setdefault(col, []).append(value)
    print(f"{len(rounds)} rounds; per row and figure: median / min over the rounds, then each round (us)")
    for provider, cols in figures.items():
        for col, values in cols.items():
            each = " ".join(f"{v:.1f}" for v in values)
            print(f"{provider:28s} {col:10s} {statistics.median(values):6.1f} / {min(values):6.1f}   {each}")


if __name__ == "__main__":
    main(sys.argv[1])
