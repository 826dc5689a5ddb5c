"""DESIGN.md, the contract, stays in step with the code where that is mechanical: every op, backend
and environment variable the package has is in it, every section names a test that checks it,
every named test exists, and the README and the public docstrings point to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_paged_attn import _config
from torch_paged_attn.ops import _library

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "DESIGN.md").read_text()
TEST_REF = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", DESIGN, flags=re.M)[1:]
    return {part.splitlines()[0]: part for part in parts}


def test_every_op_is_in_the_contract():
    missing = [op for op in _library.OPS if f"`{op}`" not in DESIGN]
    assert not missing, f"DESIGN.md does not describe {missing}"


def test_every_backend_is_in_the_contract():
    table = _sections()["8. Backends"]
    missing = [name for name in _config.BACKENDS if f"| `{name}`" not in table]
    assert not missing, f"DESIGN.md's backend table lacks {missing}"


def test_every_environment_variable_is_in_the_contract():
    used = set()
    for path in (ROOT / "torch_paged_attn").rglob("*.py"):
        used |= set(re.findall(r"TORCH_PAGED_ATTN_[A-Z_]+", path.read_text()))
    missing = sorted(v for v in used if f"`{v}`" not in DESIGN)
    assert used and not missing, f"DESIGN.md does not describe {missing}"


@pytest.mark.parametrize("section", list(_sections()))
def test_every_section_names_a_test(section):
    assert TEST_REF.search(_sections()[section]), f"DESIGN.md section {section!r} names no test"


def test_every_error_rule_names_a_test():
    rules = re.split(r"^- \*\*", _sections()["7. Errors and edge rules"], flags=re.M)[1:]
    assert len(rules) >= 7
    for rule in rules:
        assert TEST_REF.search(rule), f"DESIGN.md rule {rule.split('**')[0]!r} names no test"


def test_every_named_test_exists():
    refs = TEST_REF.findall(DESIGN)
    assert refs
    missing = []
    for file, name in refs:
        path = ROOT / file
        if not path.exists() or not re.search(rf"^\s*def {name}\(", path.read_text(), flags=re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"DESIGN.md names tests that do not exist: {missing}"


def test_readme_and_docstrings_point_to_the_contract():
    assert "(DESIGN.md)" in (ROOT / "README.md").read_text()
    for module in ("paged_attention", "mla", "kv_cache", "merge"):
        text = (ROOT / "torch_paged_attn" / "ops" / f"{module}.py").read_text()
        assert "See DESIGN.md" in text, f"torch_paged_attn/ops/{module}.py's docstrings do not point to DESIGN.md"
