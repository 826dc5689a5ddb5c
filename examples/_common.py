"""What the example scripts share: argument types, the CPU thread count, timing lines, progress."""

from __future__ import annotations

import argparse
import os
import sys

import torch

# Below this many timed steps (or 50 ms) a rate says more about timer noise and one-off costs
# than about the model: the examples print "too short to time" instead.
MIN_TIMED_STEPS = 5
MIN_TIMED_SECONDS = 0.05


def _int_at_least(lowest: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


# argparse types: ``--batch 0`` is an error, not an empty run
positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "a non-negative integer")


def set_cpu_threads(device: torch.device, processes: int = 1) -> None:
    """On the CPU, at most 4 intra-op threads, and no more than this process's share of the CPUs it
    may use (``processes`` processes share them).

    The examples' matrices are tiny: past a few threads PyTorch's intra-op pool adds
    synchronisation and nothing else, and when the machine is busy, threads beyond the free
    cores wait on one another, so the rate swings 10-20x with the machine's load (a 2-core CI
    machine shared with other jobs, 2026-11). ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` set
    by the user win."""
    if device.type != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, min(4, usable // processes, torch.get_num_threads())))


def rate(count: int, unit: str, steps: int, seconds: float) -> str:
    """``"123.4 tokens/s (8.10 ms/step)"``, or ``"too short to time"`` for a run under
    ``MIN_TIMED_STEPS`` steps or ``MIN_TIMED_SECONDS``."""
    if steps < MIN_TIMED_STEPS or seconds < MIN_TIMED_SECONDS:
        return f"too short to time ({steps} timed steps, {seconds * 1e3:.1f} ms)"
    return f"{count / seconds:9.1f} {unit}/s ({seconds / steps * 1e3:.2f} ms/step)"


_shown = [0]  # length of the progress line on screen


def progress(line: str) -> None:
    """Rewrite a progress line on stderr in place (stdout carries only the results)."""
    print(f"\r{line.ljust(_shown[0])}", end="", file=sys.stderr, flush=True)
    _shown[0] = len(line)


def end_progress() -> None:
    """End the progress line (the next one starts on a new line)."""
    if _shown[0]:
        print("", file=sys.stderr, flush=True)
    _shown[0] = 0
