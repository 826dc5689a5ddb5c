"""Per-step latency of the example Llama-style model's decode step (``examples/llama.py``).

    python benchmarks/decode_step.py [--layers 2 16] [--batch 1 8 64] [--context 1024] [--out DIR]
    python benchmarks/decode_step.py --device cpu --quick          # smoke run, no GPU

For each (layers, batch): the model (bf16 on CUDA, fp32 on CPU) prefills ``batch`` sequences of
``context - 1`` tokens, appends one token each and builds the decode metadata once; every timed
call is then the same decode step (the new token's key and value written again to the same slot,
attention over ``context`` keys). Contenders:

    eager          the module called directly
    compile        torch.compile(fullgraph=True)
    compile+graphs torch.compile(mode="reduce-overhead", fullgraph=True): one CUDA graph per step
    compile+graphs (pipelined)
                   the same, steps issued back to back and one synchronisation after 20 of them
                   (a decode loop that keeps the next token on the GPU, as an engine with
                   asynchronous scheduling does): per step, the larger of host and device time
    captured step  the compiled step captured in a plain torch.cuda.CUDAGraph (what a serving
                   engine does with static metadata buffers), one replay per step, timed as above
    graph replay   the same graph replayed back to back, timed by CUDA events: kernels plus the
                   gaps between them, no host work
    kernel sum     the sum of the step's device activity (kernels, memcpy, memset) in
                   torch.profiler, per compiled step: the floor host overhead cannot go below

Timing: 3 warm-up calls (compilation and capture happen there), then per sample a device
synchronisation, ``perf_counter``, one call, a synchronisation. p20/p50/p80 in microseconds.
Targets (issue 5): compile+graphs at least 3x faster than eager at batch 1, and within 1.15x of
the kernel sum. JSON rows go to ``<out>/decode_step-<gpu>-<date>.json`` through ``_harness``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]  # the harness, and the checkout (also when not pip-installed)
import _harness as H  # noqa: E402

RESULTS = os.path.join(HERE, "results")
WARM_UP = 3


def load_example():
    spec = importlib.util.spec_from_file_location("_example_llama", os.path.join(ROOT, "examples", "llama.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def wall_samples(fn: Callable[[], Any], device: torch.device, samples: int) -> H.Timing:
    for _ in range(WARM_UP):
        fn()
    H.synchronize(device)
    times = []
    for _ in range(samples):
        H.synchronize(device)
        t0 = time.perf_counter()
        fn()
        H.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return H._timing(times, "wall+sync", 1, 1)


def pipelined_samples(fn: Callable[[], Any], device: torch.device, samples: int, steps: int = 20) -> H.Timing:
    """Per-step time of ``steps`` calls issued back to back, one synchronisation at the end."""
    for _ in range(WARM_UP):
        fn()
    times = []
    for _ in range(samples):
        H.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        H.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e6 / steps)
    return H._timing(times, "wall, pipelined", steps, 1)


def capture(fn: Callable[[], Any], device: torch.device) -> torch.cuda.CUDAGraph:
    """``fn`` (warmed up on a side stream) captured in a plain ``torch.cuda.CUDAGraph``: a step
    whose inputs live in static buffers (the metadata builder writes them in place) replays it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARM_UP):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize(device)
    return graph


def graph_replay_us(graph: torch.cuda.CUDAGraph, device: torch.device, replays: int) -> float:
    """Device time of one replay, replays back to back (CUDA events around all of them): the
    step's kernels and the gaps between them, without any host-side work."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def kernel_sum_us(fn: Callable[[], Any], device: torch.device, steps: int) -> tuple[float, float]:
    """Device time of all activities (kernels, copies, memsets) per call of ``fn``, by
    torch.profiler, and the number of those activities per call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARM_UP):
        fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(device)
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in device_events) / steps, len(device_events) / steps


def setup(L, layers: int, batch: int, context: int, device: torch.device, quick: bool):
    """The model and the inputs of one decode step at ``context`` keys per sequence."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    small = dict(dim=128, ffn_dim=256, vocab_size=256) if quick else {}
    cfg = L.LlamaConfig(num_layers=layers, max_positions=context + 8, **small)
    max_len = context + 1
    num_blocks = batch * math.ceil(max_len / cfg.block_size) + 1
    model = L.Llama(cfg, num_blocks, dtype=dtype, device=device).eval()
    L.init_weights(model, seed=0)
    gen = L.Generator(model, batch, max_len)
    prompts = L.random_prompts(batch, context - 1, cfg.vocab_size, seed=1)
    prompts = [p + [0] * (context - 1 - len(p)) for p in prompts]  # every sequence at full context
    with torch.no_grad():
        gen.prefill(prompts)
    for seq in range(batch):
        gen.allocator.append(seq)
    md = gen.builder.build(list(range(batch)))
    return model, L.step_inputs(gen.tokens, md), dtype


def run_shape(L, layers, batch, context, device, modes, quick) -> list[H.Row]:
    shape = f"L{layers}_B{batch}_ctx{context}"
    model, inputs, dtype = setup(L, layers, batch, context, device, quick)
    dname = str(dtype).replace("torch.", "")
    samples = 5 if quick else 50
    rows = []
    timings: dict[str, float] = {}
    compiled: dict[str, Any] = {}  # one compilation serves every mode of its kind

    def compiled_step(kind: str):
        if kind not in compiled:
            torch._dynamo.reset()
            compiled.clear()
            options = {"mode": "reduce-overhead"} if kind == "reduce-overhead" else {}
            compiled[kind] = torch.compile(model, fullgraph=True, **options)
        return compiled[kind]

    graph = None  # the plain CUDA graph of the compiled step, shared by its two modes
    for mode in modes:
        H.progress(f"{shape}: {mode}")
        row = H.Row(shape, mode, dname)
        if device.type != "cuda" and mode not in ("eager", "compile"):
            row.status, row.reason = "n/a", "needs CUDA"
            rows.append(row)
            continue
        if mode == "eager":
            step = model
        elif mode.startswith("compile+graphs"):
            step = compiled_step("reduce-overhead")
        else:
            step = compiled_step("default")
        try:
            with torch.no_grad():
                if mode == "kernel sum":
                    us, count = kernel_sum_us(lambda: step(*inputs, max_query_len=1), device, 10 if quick else 50)
                    t = H._timing([us], "torch.profiler", 1, 1)
                    row.extra["activities_per_step"] = count
                elif mode in ("graph replay", "captured step"):
                    if graph is None:
                        graph = capture(lambda: step(*inputs, max_query_len=1), device)
                    if mode == "graph replay":
                        t = H._timing([graph_replay_us(graph, device, 20 if quick else 200)], "cuda-graph events", 1, 1)
                    else:  # timed like every other step: synchronise, replay, synchronise
                        t = wall_samples(graph.replay, device, samples)
                else:
                    timer = pipelined_samples if mode.endswith("(pipelined)") else wall_samples
                    t = timer(lambda: step(*inputs, max_query_len=1), device, samples)
        except Exception as e:  # one contender failing must not lose the others' rows
            row.status, row.reason = "n/a", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            continue
        row.fill(t, None)
        if mode not in ("kernel sum", "graph replay"):
            row.extra["tokens_per_s"] = batch / (t.p50_us * 1e-6)
        timings[mode] = t.p50_us
        rows.append(row)
    del graph
    compiled.clear()
    torch._dynamo.reset()
    for row in rows:
        if row.status == "ok" and "eager" in timings and row.provider != "eager":
            row.extra["speedup_vs_eager"] = timings["eager"] / row.p50_us
        if row.provider in ("compile+graphs", "compile+graphs (pipelined)", "captured step", "graph replay") and row.status == "ok" and "kernel sum" in timings:
            row.extra["vs_kernel_sum"] = row.p50_us / timings["kernel sum"]
        notes = []
        if "speedup_vs_eager" in row.extra:
            notes.append(f"{row.extra['speedup_vs_eager']:.2f}x eager")
        if "vs_kernel_sum" in row.extra:
            notes.append(f"{row.extra['vs_kernel_sum']:.2f}x kernel sum")
        if "activities_per_step" in row.extra:
            notes.append(f"{row.extra['activities_per_step']:.0f} device activities a step")
        if "tokens_per_s" in row.extra:
            notes.append(f"{row.extra['tokens_per_s']:.0f} tok/s")
        row.extra["note"] = ", ".join(notes)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="default: 2 16 (quick: 2)")
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="default: 1 8 64 (quick: 1 8)")
    ap.add_argument("--context", type=int, default=None, help="keys per sequence (default 1024, quick: 64)")
    modes = ["eager", "compile", "compile+graphs", "compile+graphs (pipelined)", "captured step", "graph replay",
             "kernel sum"]
    ap.add_argument("--modes", nargs="+", default=modes, choices=modes)
    ap.add_argument("--quick", action="store_true", help="a small model, few samples: a smoke run")
    ap.add_argument("--out", default=RESULTS, help="directory of the JSON results")
    args = ap.parse_args(argv)
    device = H.resolve_device(args.device)
    if device.type == "cpu":
        # CPU runs are smoke runs of small steps: a second intra-op thread only adds
        # synchronisation (2 cores, L2_B1_ctx64 eager: 96 ms per step with 2 threads, 13 ms with 1)
        torch.set_num_threads(1)
    layers = args.layers or ([2] if args.quick else [2, 16])
    batches = args.batch or ([1, 8] if args.quick else [1, 8, 64])
    context = args.context or (64 if args.quick else 1024)
    L = load_example()
    meta = H.device_info(device)
    meta.update(context=context, warm_up=WARM_UP, quick=args.quick)
    rows: list[H.Row] = []
    for n_layers in layers:
        for batch in batches:
            rows += run_shape(L, n_layers, batch, context, device, args.modes, args.quick)
            lost = H.cuda_alive(device)
            if lost:
                H.progress(lost)
                break
    path = H.json_path("decode_step", meta, args.out)
    H.write_json(path, "decode_step", rows, meta)
    H.print_table(rows, f"decode step latency ({meta['gpu']}, context {context})")
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
