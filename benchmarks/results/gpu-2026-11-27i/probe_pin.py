"""Eager host time of paged_attention and paged_attention_out with and without the pinned launch
(``ops/paged_attention._PIN``), in one process, in turn over ROUNDS rounds: overhead.py's one-token
decode inputs, CUDA events over 1000 back-to-back calls (median of 3), and in each round the null
kernel's cached launch and a one-element torch add_ beside them (the host's state)."""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..", "..", "..")]
import torch  # noqa: E402

import overhead as O  # noqa: E402
from torch_paged_attn import lowering  # noqa: E402
from torch_paged_attn.ops import paged_attention as P  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "8"))
device = torch.device("cuda")
ops = O.op_calls(device)
null = O.null_kernel(cached=True)
one = torch.zeros(1, device=device)
rows = {"null kernel, cached launch": null, "torch add_ (1 element)": lambda: one.add_(1)}
got: dict[str, list[float]] = {}
for r in range(ROUNDS):
    line = []
    for name, fn in rows.items():
        v = O.measure(fn, device, 1000, 3)["events_us"]
        got.setdefault(name, []).append(v)
        line.append(f"{name.split(',')[0]} {v:.1f}")
    for pin in (False, True) if r % 2 == 0 else (True, False):
        P._PIN = pin
        for name in ("paged_attention", "paged_attention_out"):
            lowering._CHOICES.clear()
            v = O.measure(ops[name], device, 1000, 3)["events_us"]
            key = f"{name} {'pinned' if pin else 'run'}"
            got.setdefault(key, []).append(v)
            line.append(f"{key} {v:.1f}")
    print(f"round {r}: " + " | ".join(line), flush=True)
print("\nCUDA events us per call, median (min) over rounds:")
for key, vs in got.items():
    print(f"  {key:<36} {statistics.median(vs):6.1f} ({min(vs):.1f})")
for name in ("paged_attention", "paged_attention_out"):
    d = [a - b for a, b in zip(got[f"{name} run"], got[f"{name} pinned"])]
    print(f"  {name}: run - pinned, paired: median {statistics.median(d):.2f} us, rounds {[round(x, 1) for x in d]}")
