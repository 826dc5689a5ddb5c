"""Shared machinery of the benchmarks: the copy-bandwidth yardstick, timing, tables and JSON.

Timing (``bench``):
- CUDA, first choice: warm up on a side stream, capture ``calls`` launches in one CUDA graph and
  time each replay with CUDA events; one sample = replay time / ``calls``. Host launch cost is
  out of the measurement, as it is in a serving engine that replays graphs.
- CUDA, eager (``use_graph=False``: calls as most PyTorch code makes them, host cost included
  wherever the host is slower than the kernel), and when capture fails (a contender that
  synchronises, say): CUDA events around each call, with the L2 cache flushed (a 256 MiB memset)
  before every call, as ``triton.testing.do_bench``.
- CPU (smoke runs only): ``time.perf_counter`` around each call.

The cache must not flatter small shapes: a contender gets several independent copies of its
inputs, enough that the bytes they hold exceed 4x the L2 cache (``rotations``), and successive
calls cycle through them. Reported: p20/p50/p80 of the per-call samples, in microseconds.

Copy bandwidth: ``dst.copy_(src)`` of 1 GiB on the device, bytes read + bytes written over the
median time. Every GB/s figure is also given as a percentage of it, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import fnmatch
import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

GB = 1e9
# Bytes the rotated input copies of one contender should hold, as a multiple of the L2 size.
L2_MULTIPLE = 4
MAX_ROTATIONS = 128
# Buffer zeroed before each call by the event-timing fallback: larger than any L2 so far (H100: 50 MiB).
FLUSH_BYTES = 256 * 2**20
# One graph replay lasts at least this long, so event resolution (~1 us) stays below 1 %.
GRAPH_REPLAY_US = 2000.0
MAX_CALLS_PER_GRAPH = 1000


def progress(msg: str) -> None:
    """One progress line on stderr (stdout carries only the tables)."""
    print(msg, file=sys.stderr, flush=True)


# -- the device -------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)`` with an index on CUDA ("cuda" -> the current device), made current."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 32 * 2**20
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def package_version(module: str, distribution: str | None = None) -> str | None:
    """Installed version of ``distribution`` (pip name), else ``module.__version__``; None if absent."""
    if distribution is not None:
        try:
            from importlib.metadata import version

            return version(distribution)
        except Exception:  # not installed as a distribution (e.g. put on PYTHONPATH by hand)
            pass
    try:
        mod = __import__(module)
    except Exception:  # a broken optional install reads as absent
        return None
    return str(getattr(mod, "__version__", "unknown"))


def device_info(device: torch.device) -> dict[str, Any]:
    """GPU (or CPU) name, library versions and the date, for the JSON header."""
    info: dict[str, Any] = {
        "device": device.type,
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "python": platform.python_version(),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            l2_mib=round(l2_bytes(device) / 2**20, 1),
            cuda=torch.version.cuda,
        )
    else:
        info["gpu"] = platform.processor() or platform.machine() or "cpu"
    return info


def cuda_alive(device: torch.device) -> str | None:
    """None while the CUDA context works; else why not (an illegal access poisons the process)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except Exception as e:  # sticky CUDA errors surface on any later call
        return f"CUDA context lost: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def backend_of(call: Callable[[], Any]) -> tuple[Any, str]:
    """Run ``call`` once; also name the torch_paged_attn backends ``lowering.select`` picked for
    it ("backend: triton" or "backend: reference"), so that a row measured on the reference
    fallback cannot pass for a Triton measurement."""
    from torch_paged_attn import lowering

    seen: list[str] = []
    select = lowering.select

    def spy(op, facts):
        backend = select(op, facts)
        seen.append(backend.__name__.replace("torch_paged_attn.lowering.", ""))
        return backend

    lowering.select = spy
    try:
        out = call()
    finally:
        lowering.select = select
    return out, ("backend: " + ",".join(sorted(set(seen)))) if seen else ""


# -- timing -----------------------------------------------------------------------------------


@dataclass
class Timing:
    p20_us: float
    p50_us: float
    p80_us: float
    method: str  # "cuda-graph", "events+l2-flush" or "wall"
    samples: int
    calls_per_sample: int
    rotations: int


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _timing(samples_us: list[float], method: str, calls: int, rotations: int) -> Timing:
    return Timing(
        p20_us=percentile(samples_us, 20),
        p50_us=percentile(samples_us, 50),
        p80_us=percentile(samples_us, 80),
        method=method,
        samples=len(samples_us),
        calls_per_sample=calls,
        rotations=rotations,
    )


def rotations(bytes_per_call: int, device: torch.device) -> int:
    """Input copies to cycle through so that together they hold ``L2_MULTIPLE`` x the L2 size."""
    if device.type != "cuda":
        return 1
    want = L2_MULTIPLE * l2_bytes(device)
    return max(1, min(MAX_ROTATIONS, math.ceil(want / max(1, bytes_per_call))))


def _events_us(fn: Callable[[], Any], reps: int) -> float:
    """Median microseconds of ``fn`` by CUDA events, no flush (a first estimate)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return percentile(times, 50)


def _graph_calls(fns: Sequence[Callable[[], Any]], quick: bool) -> int:
    """Calls one graph captures: about ``GRAPH_REPLAY_US`` of work a replay, each copy at least once."""
    n = len(fns)
    estimate = _events_us(lambda: [f() for f in fns], 3) / n
    target = GRAPH_REPLAY_US / (4 if quick else 1)
    return max(n, min(MAX_CALLS_PER_GRAPH, math.ceil(target / max(estimate, 1e-3))))


def _capture(fns: Sequence[Callable[[], Any]], calls: int) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fns[j % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _bench_graph(fns: Sequence[Callable[[], Any]], samples: int, quick: bool) -> Timing:
    calls = _graph_calls(fns, quick)
    graph = _capture(fns, calls)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e3 / calls for s, e in zip(starts, ends)]
    del graph
    return _timing(times, "cuda-graph", calls, len(fns))


def bench_pair(
    a: Sequence[Callable[[], Any]], b: Sequence[Callable[[], Any]], device: torch.device, *, quick: bool = False,
    use_graph: bool = True,
) -> dict[str, float]:
    """Two contenders timed side by side: in alternation, ``a`` first in even rounds and ``b``
    first in odd ones, each sample timed by events, as ``bench`` times one contender: a CUDA-graph
    replay of each (captured once, the same number of calls), or (``use_graph`` False) one eager
    call with the L2 flushed before it. A slow drift of the GPU's clocks (power, temperature)
    between two contenders timed one after the other moves the ratio of their separate medians by
    a few percent on some shapes; here it moves both samples of a round alike. Returns the median,
    20th and 80th percentiles of the per-round ratio ``b / a`` (above 1: ``a`` is faster) and each
    side's median µs a call."""
    if device.type != "cuda":
        raise ValueError("bench_pair times CUDA events")
    rounds = 10 if quick else 60
    for f in (*a, *b):  # warm-up (compilation, allocator growth)
        f()
    torch.cuda.synchronize(device)
    sides = (a, b)
    if use_graph:
        calls = max(_graph_calls(a, quick), _graph_calls(b, quick))
        graphs = tuple(_capture(fns, calls) for fns in sides)
        runs = tuple(g.replay for g in graphs)
    else:
        calls = 1
        flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
              for _ in sides]
    for k in range(rounds):
        for side in ((0, 1) if k % 2 == 0 else (1, 0)):
            start, end = events[side][k]
            if not use_graph:
                flush.zero_()
            start.record()
            if use_graph:
                runs[side]()
            else:
                sides[side][k % len(sides[side])]()
            end.record()
    torch.cuda.synchronize(device)
    us = [[s.elapsed_time(e) * 1e3 / calls for s, e in side] for side in events]
    ratios = [tb / ta for ta, tb in zip(*us)]
    return {"ratio_p50": percentile(ratios, 50), "ratio_p20": percentile(ratios, 20),
            "ratio_p80": percentile(ratios, 80), "a_us": percentile(us[0], 50), "b_us": percentile(us[1], 50),
            "rounds": rounds, "calls": calls, "method": "cuda-graph" if use_graph else "events+l2-flush"}


def paired_into(row: "Row", key: str, label: str, a: Sequence[Callable[[], Any]], b: Sequence[Callable[[], Any]],
                device: torch.device, *, quick: bool = False, use_graph: bool = True) -> None:
    """``bench_pair(a, b)`` into ``row.extra[key]``, and a note ``paired <ratio>x <label> (p20-p80)``
    on the row; a failure becomes a note instead (the paired figure is extra: the row stays)."""
    try:
        r = bench_pair(a, b, device, quick=quick, use_graph=use_graph)
        text = f"paired {r['ratio_p50']:.3f}x {label} ({r['ratio_p20']:.3f}-{r['ratio_p80']:.3f})"
        row.extra[key] = r
    except Exception as e:
        text = f"paired timing failed: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"
    row.extra["note"] = "; ".join(x for x in (row.extra.get("note", ""), text) if x)


def _bench_events(fns: Sequence[Callable[[], Any]], samples: int, device: torch.device) -> Timing:
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    for i in range(samples):
        flush.zero_()
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return _timing(times, "events+l2-flush", 1, len(fns))


def _bench_wall(fns: Sequence[Callable[[], Any]], samples: int) -> Timing:
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        times.append((time.perf_counter() - t0) * 1e6)
    return _timing(times, "wall", 1, len(fns))


def bench(
    fns: Sequence[Callable[[], Any]],
    device: torch.device,
    *,
    quick: bool = False,
    use_graph: bool = True,
) -> Timing:
    """Time one contender. ``fns[i]`` runs it on the ``i``-th copy of its inputs.

    Warm-up: every copy runs twice (JIT compilation, autotuning, allocator growth) before any
    sample. On CUDA the warm-up runs on a side stream, as graph capture requires.
    """
    samples = 5 if quick else 30
    if device.type != "cuda":
        for f in fns[:2]:
            f()
        return _bench_wall(fns, samples)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            for f in fns:
                f()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    if use_graph:
        try:
            return _bench_graph(fns, samples, quick)
        except Exception as e:  # capture refused: time eagerly instead
            progress(f"    graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); timing eagerly")
            try:
                torch.cuda.synchronize(device)
            except Exception:
                pass
    return _bench_events(fns, samples, device)


def copy_bandwidth(device: torch.device, *, quick: bool = False) -> tuple[float, Timing]:
    """GB/s of a large device-to-device copy: (bytes read + bytes written) / median time."""
    nbytes = 2**30 if device.type == "cuda" else 64 * 2**20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    fns = [lambda: dst.copy_(src)]
    if device.type == "cuda":
        for _ in range(3):
            fns[0]()
        torch.cuda.synchronize(device)
        samples = 5 if quick else 25
        times = [_events_us(fns[0], 1) for _ in range(samples)]
        timing = _timing(times, "events", 1, 1)
    else:
        timing = bench(fns, device, quick=True)
    del src, dst
    return 2 * nbytes / (timing.p50_us * 1e-6) / GB, timing


# -- results ----------------------------------------------------------------------------------


@dataclass
class Row:
    """One (shape, contender) measurement, or the reason it is missing (``status`` "n/a")."""

    shape: str
    provider: str
    dtype: str
    status: str = "ok"
    reason: str = ""
    p20_us: float | None = None
    p50_us: float | None = None
    p80_us: float | None = None
    bytes: int | None = None
    bytes_formula: str = ""
    gbps: float | None = None
    pct_copy: float | None = None
    flops: int | None = None
    tflops: float | None = None
    vs_fa4: float | None = None
    vs_flashinfer: float | None = None  # FlashInfer's p50 / this row's p50, same mode (> 1: faster)
    mode: str = ""  # "graph" (CUDA-graph replays), "eager" (one call per sample, L2 flushed), "" (one)
    timing: str = ""
    rotations: int | None = None
    calls_per_sample: int | None = None
    samples: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def fill(self, t: Timing, copy_gbps: float | None) -> "Row":
        """Timing columns and the figures derived from ``bytes`` / ``flops``."""
        self.p20_us, self.p50_us, self.p80_us = t.p20_us, t.p50_us, t.p80_us
        self.timing, self.samples = t.method, t.samples
        self.rotations, self.calls_per_sample = t.rotations, t.calls_per_sample
        if self.bytes is not None and t.p50_us > 0:
            self.gbps = self.bytes / (t.p50_us * 1e-6) / GB
            if copy_gbps:
                self.pct_copy = 100.0 * self.gbps / copy_gbps
        if self.flops is not None and t.p50_us > 0:
            self.tflops = self.flops / (t.p50_us * 1e-6) / 1e12
        return self


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def print_table(rows: Sequence[Row], title: str = "") -> None:
    """A fixed-width table on stdout: one line per row, n/a rows with their reason."""
    modes = any(r.mode for r in rows)
    flashinfer = any(r.vs_flashinfer is not None for r in rows)
    headers = ("shape", "provider", *(("mode",) if modes else ()), "p50 us", "p20-p80 us", "GB/s", "% copy",
               "TFLOP/s", "vs FA4", *(("vs FI",) if flashinfer else ()), "note")
    lines = []
    for r in rows:
        mode = (r.mode,) if modes else ()
        if r.status != "ok":
            lines.append((r.shape, r.provider, *mode, "n/a", "", "", "", "", "", *(("",) if flashinfer else ()),
                          r.reason[:100]))
            continue
        spread = f"{r.p20_us:.1f}-{r.p80_us:.1f}"
        note = r.reason or str(r.extra.get("note", ""))
        lines.append(
            (
                r.shape,
                r.provider,
                *mode,
                f"{r.p50_us:.2f}",
                spread,
                _fmt(r.gbps, ".0f"),
                _fmt(r.pct_copy, ".1f"),
                _fmt(r.tflops, ".1f") if r.flops is not None else "",
                _fmt(r.vs_fa4, ".2f") + "x" if r.vs_fa4 is not None else "",
                *((_fmt(r.vs_flashinfer, ".2f") + "x" if r.vs_flashinfer is not None else "",) if flashinfer else ()),
                note[:100],
            )
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    previous = None
    for line in lines:
        shape = line[0] if line[0] != previous else ""
        previous = line[0]
        print("  ".join(c.ljust(w) for c, w in zip((shape,) + line[1:], widths)).rstrip())
    sys.stdout.flush()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "unknown"


def json_path(name: str, meta: dict[str, Any], out_dir: str) -> str:
    """``<out_dir>/<name>-<gpu>-<date>.json``; a numeric suffix keeps earlier runs of the day."""
    os.makedirs(out_dir, exist_ok=True)
    stem = f"{name}-{_slug(str(meta.get('gpu', 'unknown')))}-{_dt.date.today().isoformat()}"
    path = os.path.join(out_dir, stem + ".json")
    k = 2
    while os.path.exists(path):
        path = os.path.join(out_dir, f"{stem}-{k}.json")
        k += 1
    return path


def write_json(path: str, name: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """The header (``meta``: GPU, versions, date, copy bandwidth) and one object per row."""
    doc = {"benchmark": name, **meta, "rows": [_row_dict(r) for r in rows]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_finite(doc), f, indent=1, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: a figure that failed is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _row_dict(r: Row) -> dict[str, Any]:
    return dataclasses.asdict(r)


def selected(name: str, patterns: list[str] | None) -> bool:
    """Whether ``name`` matches one of the comma-separated ``--shapes``/``--providers`` patterns
    (globs, or substrings when a pattern has no glob character); no patterns select everything."""
    if not patterns:
        return True
    return any(fnmatch.fnmatch(name, p if any(c in p for c in "*?[") else f"*{p}*") for p in patterns)


def split_patterns(value: str | None) -> list[str] | None:
    return [p.strip() for p in value.split(",") if p.strip()] if value else None


def parse_cli(
    description: str,
    shapes: Sequence[Any],
    tiny: Callable[[Any], Any],
    example: str,
    default_out: str,
    argv: list[str] | None = None,
    extra_args: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[argparse.Namespace, torch.device, list[Any]]:
    """The command line every benchmark shares: ``--shapes --providers --quick --device --tiny
    --out`` (``--contenders`` is ``--providers``), plus what ``extra_args(parser)`` adds. Returns the
    arguments, the device and the selected shapes (``tiny`` stand-ins with ``--tiny``; a CPU device
    runs only those)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", help=f"comma-separated names or globs (substring match), e.g. {example}")
    ap.add_argument("--providers", "--contenders", dest="providers",
                    help="comma-separated contender names or globs (substring match), e.g. flashinfer,torch_paged_attn")
    ap.add_argument("--quick", action="store_true", help="5 samples per contender instead of 30")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small stand-in shapes (smoke runs)")
    ap.add_argument("--out", default=default_out, help="directory of the JSON results")
    if extra_args is not None:
        extra_args(ap)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if device.type == "cpu" and not args.tiny:
        ap.error("--device cpu runs only the --tiny stand-in shapes")
    chosen = [tiny(s) if args.tiny else s for s in shapes if selected(s.name, split_patterns(args.shapes))]
    if not chosen:
        ap.error(f"--shapes {args.shapes!r} matches none of: {', '.join(s.name for s in shapes)}")
    return args, device, chosen
