"""DESIGN.md's import rules, checked on the source and in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"infra", "storage", "pipeline", "loaders", "trainer", "loopback_s3"}
#: infra (shared machinery: the config mechanism, user files, processes, energy) is below all
ALLOWED = {"infra": set(), "storage": {"infra"}, "pipeline": {"storage", "infra"},
           "loaders": {"storage", "infra"}, "trainer": {"loaders", "storage", "infra"},
           # the loopback S3 servers (tests and demos, not in the wheel): infra's config
           # mechanism for `python -m loopback_s3`'s flags, nothing else of ours
           "loopback_s3": {"infra"}}
FORBIDDEN_THIRD_PARTY = {"loaders": {"dask", "distributed"}, "trainer": {"dask", "distributed"}}

#: storage's subpackages and which of them each may import (docs/design.md, "Packages")
STORAGE_LAYERS = {"format": {"format"}, "io": {"format", "io"},
                  "admin": {"format", "io", "admin"}}


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
        used = _imports(path)
        bad = (used & OURS) - ALLOWED[package] - {package}
        bad |= used & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_a_training_job_imports_loaders_without_dask() -> None:
    code = ("import sys, loaders, trainer; "
            "bad = [m for m in ('dask', 'distributed', 'pipeline') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- inside storage: format < io < admin, and no import loops --------------------------------

def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(root: Path, name: str) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def package_imports(root: Path, package: str) -> dict[str, list[tuple[str, str, int]]]:
    """Every module of ``package`` under ``root`` -> the modules of the package it imports
    (at any level: a function-level import is still a dependency), as (imported module, the
    name imported, line). ``from a.b import c`` counts as importing ``a.b.c`` when that is a
    module, else ``a.b``. Imports under ``if TYPE_CHECKING:`` are left out."""
    graph: dict[str, list[tuple[str, str, int]]] = {}
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        found: list[tuple[str, str, int]] = []
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                found += [(a.name, a.name, node.lineno) for a in node.names
                          if a.name.split(".")[0] == package]
            elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                  and node.module.split(".")[0] == package):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.append((sub if _is_module(root, sub) else node.module, a.name,
                                  node.lineno))
        graph[_module_name(root, path)] = found
    return graph


def import_cycles(graph: dict[str, list[tuple[str, str, int]]]) -> list[list[str]]:
    """The import loops of ``graph`` (each as the modules around it, first one repeated)."""
    edges = {m: sorted({t for t, _, _ in targets if t in graph and t != m})
             for m, targets in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return cycles


def layering_violations(graph: dict[str, list[tuple[str, str, int]]]) -> list[str]:
    """Imports that break storage's layering: a subpackage importing a later one (format <
    io < admin) or the package's top level (``from storage import ...``: the public API,
    which imports all of them), and any import of another module's private name."""
    bad = []
    for module, targets in graph.items():
        parts = module.split(".")
        layer = parts[1] if len(parts) > 2 and parts[1] in STORAGE_LAYERS else None
        for target, name, line in targets:
            where = f"{module} (line {line}) imports {name} from {target}"
            tparts = target.split(".")
            if name.startswith("_") and not name.startswith("__") and target != module:
                bad.append(f"{where}: a private name")
            if layer is None:
                continue
            tlayer = tparts[1] if len(tparts) > 1 else None
            if tlayer not in STORAGE_LAYERS[layer]:
                bad.append(f"{where}: storage/{layer}/ may import only "
                           f"{sorted(STORAGE_LAYERS[layer])} of storage")
    return bad


def test_storage_subpackages_keep_their_layers() -> None:
    graph = package_imports(ROOT, "storage")
    assert {m.split(".")[1] for m in graph if m.count(".") >= 2} <= set(STORAGE_LAYERS)
    bad = layering_violations(graph)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", sorted(OURS))
def test_no_package_has_import_loops(package: str) -> None:
    cycles = import_cycles(package_imports(ROOT, package))
    assert not cycles, f"import loops in {package}: " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_the_checks_catch_a_loop_a_layer_breach_and_a_private_import(tmp_path: Path) -> None:
    """The two checks above fail where they should (on a small package made for it)."""
    pkg = tmp_path / "storage"
    for sub in ("", "format", "io"):
        (pkg / sub).mkdir(exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "io" / "urls.py").write_text("from storage.io.clients import client\n")
    (pkg / "io" / "clients.py").write_text(
        "def client():\n    from storage.io.urls import _fs\n    return _fs\n")
    (pkg / "format" / "manifest.py").write_text(
        "from storage.io import urls\nfrom storage import resolve\n")
    (pkg / "format" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from storage.io import urls\n")
    graph = package_imports(tmp_path, "storage")
    assert [set(c) for c in import_cycles(graph)] == [{"storage.io.clients", "storage.io.urls"}]
    bad = layering_violations(graph)
    assert len(bad) == 3, bad
    assert any("private" in b and "_fs" in b for b in bad)
    assert sum("storage/format/ may import only ['format']" in b for b in bad) == 2
