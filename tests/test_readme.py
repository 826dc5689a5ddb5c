"""The README's commands and examples are the ones that run."""

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = _fenced("bash")
    assert len(commands) == 2, "README shows exactly two commands: the demo and the tests"
    test_command = commands[1].strip()
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, f".ci/run does not run the README's test command {test_command!r}"


def test_readme_usage_example_runs():
    (code,) = _fenced("python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["out"].shape == (2, 8, 64)
    assert namespace["lse"].isfinite().all()


@pytest.mark.parametrize("module", ["paged_attention", "mla", "kv_cache", "merge"])
def test_docstring_examples_run(module):
    mod = importlib.import_module(f"torch_paged_attn.ops.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_demo_command_runs_and_checks_itself():
    """The README's demo script, shortened: compiled tokens must equal eager's (exit code 0)."""
    (script,) = re.findall(r"python (examples/\S+\.py)", _fenced("bash")[0])
    assert script == "examples/llama.py"
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), "--device", "cpu", "--layers", "1", "--batch", "2", "--steps", "4",
         "--prompt-len", "9", "--mode", "eager", "compile"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tokens equal to eager's" in proc.stdout


def test_small_demo_checks_itself():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "2", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
