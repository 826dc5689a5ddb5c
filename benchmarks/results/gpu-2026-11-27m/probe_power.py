"""Our MLA decode against FlashInfer's on B64 x 4096 H128 under sustained load: each contender's
CUDA graph (``_harness``'s capture of back-to-back calls over the input copies) replayed without
pause for ``PROBE_SECONDS`` (3) seconds, in turn, three times over, with ``nvidia-smi`` sampling the
SM clock, power and throttle reasons every 20 ms. Per phase: µs a call (median of the replays, and
of its first and last ten), and the samples' median SM clock and power, so that a gap between
the two can be read at equal clocks. Contenders: the package (``ours``), main 66aefd2's wide
kernel (``main``, ``mla_sm90_main.py``), FlashInfer (``fi``, when importable).

    python3 probe_power.py   # PROBE_SHAPES (B64_ctx4096_H128), PROBE_SECONDS
"""
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
import _harness as H  # noqa: E402
import mla_probe as P  # noqa: E402
from torch_paged_attn.lowering.triton import mla_sm90  # noqa: E402


def sampler(samples: list, stop: threading.Event) -> None:
    cmd = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
           "--format=csv,noheader,nounits", "-lms", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    for line in proc.stdout:
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((time.time(), float(parts[0]), float(parts[1]), parts[2]))
        except (ValueError, IndexError):
            pass
        if stop.is_set():
            break
    proc.terminate()


def graph_of(fns):
    """``_harness.bench``'s warm-up (every copy twice, on a side stream) and graph capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns * 2:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    calls = H._graph_calls(fns, False)
    return H._capture(fns, calls), calls


def sustained(graph, calls: int, seconds: float) -> list[float]:
    times, end = [], time.time() + seconds
    while time.time() < end:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
        for a, b in evs:
            a.record()
            graph.replay()
            b.record()
        torch.cuda.synchronize()
        times += [a.elapsed_time(b) * 1e3 / calls for a, b in evs]
    return times


def main():
    device = torch.device("cuda")
    seconds = float(os.environ.get("PROBE_SECONDS", 3))
    by = {s.name: s for s in P.md.SHAPES}
    names = os.environ.get("PROBE_SHAPES", "B64_ctx4096_H128").split(",")
    main_mod = P.module_from_file("mla_sm90_main", os.path.join(HERE, "mla_sm90_main.py"))
    samples, stop = [], threading.Event()
    threading.Thread(target=sampler, args=(samples, stop), daemon=True).start()
    for name in names:
        s = by[name]
        copies = P.md.input_copies(s, device)
        graphs, kept = {}, []  # kept: each graph's calls, whose outputs and buffers the graph writes
        for label, module in (("ours", mla_sm90), ("main", main_mod)):
            P.swap("mla_sm90", module)()
            module._LAUNCHERS.clear()
            P.lowering._CHOICES.clear()
            kept.append([P.runner(s, x, device) for x in copies])
            graphs[label] = graph_of(kept[-1])
        P.swap("mla_sm90", mla_sm90)()
        try:
            kept.append(P.md.flashinfer_mla(s, copies, device).fns)
            graphs["fi"] = graph_of(kept[-1])
        except Exception as e:  # noqa: BLE001 - FlashInfer missing: ours alone
            print(f"flashinfer: {type(e).__name__}: {str(e)[:100]}")
        print(f"{name}: phase, us a call (median / first 10 / last 10), SM MHz, W (median of samples), throttle")
        for rnd in range(3):
            for label, (graph, calls) in graphs.items():
                t0 = time.time()
                times = sustained(graph, calls, seconds)
                t1 = time.time()
                got = [x for x in samples if t0 + 0.2 <= x[0] <= t1]
                clock = statistics.median(x[1] for x in got) if got else float("nan")
                power = statistics.median(x[2] for x in got) if got else float("nan")
                reasons = sorted({x[3] for x in got})
                print(f"  round {rnd} {label:5s} {statistics.median(times):7.1f} / {statistics.median(times[:10]):7.1f}"
                      f" / {statistics.median(times[-10:]):7.1f} us  {clock:6.0f} MHz {power:6.0f} W  {reasons}",
                      flush=True)
                time.sleep(1.0)
    stop.set()


if __name__ == "__main__":
    main()
