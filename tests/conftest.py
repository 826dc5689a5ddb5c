"""Shared pytest setup: a header line that says which backends this run exercises."""

import os

import torch


def pytest_report_header(config):
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    interpret = os.environ.get("TRITON_INTERPRET", "0")
    return f"torch {torch.__version__}, triton {triton_version}, CUDA device: {cuda}, TRITON_INTERPRET={interpret}"
