"""The README's commands and examples are the ones that run."""

import doctest
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    commands = _fenced("bash")
    assert len(commands) == 2, "README shows exactly two commands: the demo and the tests"
    test_command = commands[1].strip()
    assert "pytest" in test_command and "TRITON_INTERPRET=1 python -m pytest tests" in test_command
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == test_command, f".ci/run's last command is not the README's test command {test_command!r}"
    assert not any("TRITON_INTERPRET" in line for line in ci[:-1]), "the README's line alone sets TRITON_INTERPRET"
    torch_install = [i for i, line in enumerate(ci) if "pip install" in line and "torch==" in line]
    assert torch_install and torch_install[0] < len(ci) - 1, ".ci/run installs torch before the test command"


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
    """The README's demo script, shortened (float32, CPU): one PASS verdict per mode and overall
    (teacher-forced logits against the float64 truth), every greedy token equal to eager's, and
    no rate for a run too short to time."""
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
    verdicts = re.findall(r"^ +(PASS|FAIL): logits vs float64.*equal to eager's: ([\d.]+)%$", proc.stdout, flags=re.M)
    assert verdicts == [("PASS", "100.0"), ("PASS", "100.0")], proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("PASS")
    assert proc.stdout.count("too short to time") == 2 and "tokens/s" not in proc.stdout
    assert "compiling" in proc.stderr  # the silent first compile says what it does


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_demo_check_fails_logits_off_by_more_than_the_precision():
    """The demo's verdict is not vacuous: eager's logits pass against the float64 truth, the same
    logits shifted by a few bf16 roundings (or float32's budget) fail, and a mode whose error is
    three times eager's fails."""
    L = _example("llama")
    cfg = L.LlamaConfig(num_layers=1, vocab_size=64, dim=64, num_heads=4, num_kv_heads=2, head_size=16,
                        ffn_dim=64, max_positions=64)
    model = L.Llama(cfg, num_blocks=8).eval()
    L.init_weights(model, 3)
    prompts = L.random_prompts(2, 9, cfg.vocab_size, 3)
    gen = L.Generator(model, 2, 16)
    with torch.no_grad():
        gen.prefill(prompts)
        fed, logits = gen.decode(model, 4)
    fed, logits = torch.stack(fed), torch.stack(logits)
    eager = L.check_mode(model, prompts, fed, logits, torch.float32, None, None)
    assert eager.ok and eager.error > 0
    off = logits + eager.budget * 1.5 * torch.sign(torch.randn_like(logits))
    assert not L.check_mode(model, prompts, fed, off, torch.float32, None, None).ok
    worse = logits + (logits - L.truth_for(model, prompts, fed).float()) * 2  # 3x eager's error
    assert not L.check_mode(model, prompts, fed, worse, torch.float32, eager, fed).ok


@pytest.mark.parametrize("script,args", [
    ("llama", ["--batch", "0"]), ("llama", ["--steps", "-3"]), ("llama", ["--layers", "x"]),
    ("demo", ["--steps", "0"]), ("hf_generate", ["--new-tokens", "0"]),
])
def test_examples_reject_non_positive_sizes(script, args, capsys):
    main = _example(script).main
    with pytest.raises(SystemExit) as e:
        main(args) if script == "llama" else _with_argv(main, args)
    assert e.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def _with_argv(main, args):
    saved = sys.argv
    sys.argv = ["example", *args]
    try:
        return main()
    finally:
        sys.argv = saved


def test_small_demo_checks_itself():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "2", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
