"""Shared pytest setup: one intra-op thread on CPU-only machines, and a header line that says
which backends this run exercises."""

import os

import torch

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    # Interpreter runs exist to test the Triton kernels: a missing triton (or the numpy its
    # interpreter needs) must fail the run, not skip every kernel test.
    import numpy  # noqa: F401
    import triton  # noqa: F401

if not torch.cuda.is_available():
    # The tests run many tiny reference calls; on a 2-core machine intra-op threading makes each
    # one about 40x slower (2.7 ms with 1 thread, 108 ms with 2).
    torch.set_num_threads(1)


def pytest_report_header(config):
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    interpret = os.environ.get("TRITON_INTERPRET", "0")
    return f"torch {torch.__version__}, triton {triton_version}, CUDA device: {cuda}, TRITON_INTERPRET={interpret}"
