"""% of copy bandwidth against context length, one line per contender, from a results JSON.

    python benchmarks/plot.py [RESULTS.json] [-o OUT.png]

Without a file, plots the newest ``benchmarks/results/paged_attention-*.json``. Decode shapes only
(prefill is compute-bound: see its TFLOP/s in the table); the fp8-cache shape is drawn apart, as
hollow markers, since its bytes are half as many. Needs matplotlib; without it, says so and exits 0.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def series(doc: dict) -> dict[str, list[tuple[int, float, str]]]:
    """provider (plus " fp8", plus " eager" for eager-mode rows) -> [(context length, % of copy
    bandwidth, shape name)], sorted."""
    out: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
    for r in doc["rows"]:
        extra = r.get("extra") or {}
        if r.get("status") != "ok" or extra.get("kind") != "decode" or r.get("pct_copy") is None:
            continue
        key = r["provider"] + (" fp8" if "float8" in r.get("dtype", "") else "")
        key += " eager" if r.get("mode") == "eager" else ""
        out[key].append((int(extra["seq_len"]), float(r["pct_copy"]), r["shape"]))
    return {k: sorted(v) for k, v in sorted(out.items())}


def _label(shape: str) -> str:
    parts = [p for p in shape.split("_") if p.startswith(("B", "Hq")) or p in ("mha", "fp8")]
    return " ".join(parts)


def plot(doc: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    data = series(doc)
    if not data:
        print("no decode rows with a bandwidth figure: no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(10, 5))
    colors: dict[str, str] = {}
    ticks: dict[int, list[str]] = defaultdict(list)
    for name, points in data.items():
        base = name.removesuffix(" fp8")
        color = colors.setdefault(base, f"C{len(colors) % 10}")
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if name.endswith(" fp8"):
            ax.scatter(xs, ys, facecolors="none", edgecolors=color, s=70, label=name, zorder=3)
        else:
            ax.plot(xs, ys, marker="o", color=color, label=name)
        for x, _, shape in points:
            if _label(shape) not in ticks[x]:
                ticks[x].append(_label(shape))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([f"{x}\n" + "\n".join(ticks[x]) for x in sorted(ticks)], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("context length (keys per sequence) and batch")
    ax.set_ylabel("% of copy bandwidth")
    ax.set_ylim(0, 105)
    ax.axhline(100, color="gray", lw=0.5)
    ax.grid(True, alpha=0.3)
    copy = doc.get("copy_gbps")
    ax.set_title(
        f"paged attention decode, {doc.get('gpu', '?')}"
        + (f", copy {copy:.0f} GB/s" if copy else "")
        + f"\ntorch {doc.get('torch')}, triton {doc.get('triton')}, {str(doc.get('date', ''))[:10]}",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", help="a paged_attention-*.json (default: the newest)")
    ap.add_argument("-o", "--output", help="PNG path (default: the JSON's path with .png)")
    args = ap.parse_args(argv)
    path = args.results
    if path is None:
        found = sorted(glob.glob(os.path.join(RESULTS, "paged_attention-*.json")), key=os.path.getmtime)
        if not found:
            ap.error(f"no paged_attention-*.json in {RESULTS}; run benchmarks/paged_attention.py first")
        path = found[-1]
    with open(path) as f:
        doc = json.load(f)
    out = args.output or os.path.splitext(path)[0] + ".png"
    if plot(doc, out):
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
