"""What our code takes from other people's packages: only their public names (no ``_private``
module or name, which a minor release may move), and only packages the wheel declares (a
module imported by the base packages is in the base ``dependencies``: a training image
without the pipeline extra must still import it)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
OURS = {"infra", "storage", "pipeline", "loaders", "trainer", "loopback_s3", "benchmarks",
        "tests"}
#: the packages a base install (no extra) must be able to import
BASE = ("infra", "storage", "loaders", "trainer")


def _sources(*packages: str) -> list[Path]:
    return [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))
            if "__pycache__" not in p.parts]


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in OURS and top not in sys.stdlib_module_names and not top.startswith("_")


def _private_imports(path: Path) -> list[str]:
    """``from lib._x import y``, ``from lib import _y``, ``import lib._x``: each as text."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and _third_party(node.module):
            names = [a.name for a in node.names
                     if a.name not in KNOWN_PRIVATE.get(node.module, ())]
            parts = node.module.split(".") + names
            if names and any(p.startswith("_") and not p.startswith("__") for p in parts):
                out.append(f"line {node.lineno}: from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name) and any(
                        p.startswith("_") for p in alias.name.split(".")[1:]):
                    out.append(f"line {node.lineno}: import {alias.name}")
    return out


#: private names we take knowingly, each because the library offers no public one; a new
#: entry needs the same reason (and a fallback or a test that notices when it moves)
KNOWN_PRIVATE = {
    # DCP's fsspec storage reader and writer (checkpoints on s3://): not exported by
    # torch.distributed.checkpoint, the only DCP storage for fsspec URLs
    "torch.distributed.checkpoint._fsspec_filesystem": {"FsspecReader", "FsspecWriter"},
    # a delta's storage records and its planner's slicing: the DCP internals a delta
    # checkpoint must match byte for byte (tests/trainer/checkpoint pin them)
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint._traverse": {"set_element"},
    "torch.distributed._shard._utils": {"narrow_tensor_by_index"},
    # the reader behind pq.ParquetFile, which takes a memory pool (guarded: the public reader
    # when it moves), and footer metadata rebuilt from bytes without a file
    "pyarrow._parquet": {"ParquetReader", "_reconstruct_filemetadata"},
}


def test_no_private_imports_from_other_libraries() -> None:
    bad = [f"{p.relative_to(ROOT)} {line}" for p in _sources(*OURS)
           for line in _private_imports(p)]
    assert not bad, "private modules or names of other libraries imported:\n" + "\n".join(bad)


def test_the_check_finds_a_private_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from cyclopts.argument._collection import update_argument_collection\n"
                     "from yaml import _private\nimport numpy._core\nfrom os import _exit\n"
                     "from infra._x import y\n")
    assert len(_private_imports(probe)) == 3  # not the standard library's, not ours
    probe.write_text("from pyarrow._parquet import ParquetReader, _other\n")
    assert _private_imports(probe) == ["line 1: from pyarrow._parquet import _other"]


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a ``try:`` whose handler catches ImportError: an optional
    import, whose code runs without the package (matplotlib for plots, NVML for GPU energy)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b",
                                                 ast.unparse(h.type)) for h in node.handlers):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imported_modules(path: Path) -> dict[str, bool]:
    """Third-party top-level modules imported -> whether an import of it is guarded (the
    code checks that it is there before it uses it)."""
    tree = ast.parse(path.read_text(), str(path))
    guarded = _guarded(tree)
    out: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module.split(".")[0]]
        else:
            continue
        for name in names:
            if _third_party(name):
                out[name] = out.get(name, False) or id(node) in guarded
    return out


#: import names that another distribution than the installed one provides (``pynvml``: the
#: ``gpu-energy`` extra's nvidia-ml-py; a deprecated ``pynvml`` wrapper may be installed)
ALSO_FROM = {"pynvml": {"nvidia-ml-py"}}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_base_packages_import_only_declared_dependencies() -> None:
    """Every third-party module that infra/, storage/, loaders/ and trainer/ import (at any
    level: a function-level import runs too) comes from a distribution in the base
    dependencies, or, for an import guarded by ``except ImportError``, from one of the
    extras; import names are mapped to distributions by the installed metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {_requirement_name(r) for group in project["optional-dependencies"].values()
              for r in group}
    distributions = packages_distributions()
    bad = []
    for path in _sources(*BASE):
        for module, guarded in sorted(_imported_modules(path).items()):
            names = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
            names |= ALSO_FROM.get(module, set())
            if not names & (base | extras if guarded else base):
                where = "any extra" if guarded else "the base dependencies"
                bad.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(names))}) "
                           f"not in {where}")
    assert not bad, "imported but not in pyproject.toml's base dependencies:\n" + "\n".join(bad)
