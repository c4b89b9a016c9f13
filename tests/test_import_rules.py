"""DESIGN.md's import rules, checked on the source and in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"storage", "pipeline", "loaders", "trainer"}
ALLOWED = {"storage": set(), "pipeline": {"storage"}, "loaders": {"storage"},
           "trainer": {"loaders", "storage"}}
FORBIDDEN_THIRD_PARTY = {"loaders": {"dask", "distributed"}, "trainer": {"dask", "distributed"}}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_design_allows(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        if package == "storage" and "testing" in path.parts:
            continue  # the test-server helper is for tests and demos, not the data path
        used = _imports(path)
        bad = (used & OURS) - ALLOWED[package] - {package}
        bad |= used & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_a_training_job_imports_loaders_without_dask() -> None:
    code = ("import sys, loaders, trainer; "
            "bad = [m for m in ('dask', 'distributed', 'pipeline') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
