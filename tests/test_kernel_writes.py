"""Inductor's analysis of the Triton kernels counts no op input as written.

A read-only input counted as written is cloned and copied back around each launch in compiled
code, and makes ``mode="reduce-overhead"`` skip CUDA graphs for mutating a graph input. The
analysis runs on TTIR for a CUDA target (``tests/_kernel_writes.py``), so it runs on the CPU.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

HERE = os.path.dirname(os.path.abspath(__file__))


def test_no_kernel_writes_an_input_it_only_reads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, os.path.join(HERE, "_kernel_writes.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    launches = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    # every kernel of the package, split-KV paths and fp8 caches included
    assert {(x["op"], x["kernel"]) for x in launches} == {
        ("paged_attention", "_attention_kernel"), ("paged_attention", "_combine_kernel"),
        ("paged_attention fp8", "_attention_kernel"), ("mla_decode fp8", "_mla_kernel"),
        ("mla_decode", "_mla_kernel"), ("mla_decode", "_combine_kernel"),
        ("reshape_and_cache", "_cache_write_kernel"), ("concat_and_cache_mla", "_cache_write_kernel"),
        ("gather_cache", "_gather_cache_kernel"), ("merge_attn_states", "_merge_attn_states_kernel"),
        ("merge_attn_states_n", "_merge_attn_states_n_kernel"),
    }
    wrong = [x for x in launches if x["reads_counted_as_writes"]]
    assert not wrong, wrong
