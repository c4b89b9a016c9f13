"""Every ``SHARDFLOW_*`` environment variable is a config field's override
(``SHARDFLOW_<COMPONENT>_<FLAG>``) or registered in :mod:`infra.environment`, read through it
and listed in the README's configuration section."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from infra import environment

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("infra", "storage", "pipeline", "loaders", "trainer", "loopback_s3")
#: where a variable may be named: our code, its tests and benchmarks, the docs
TEXTS = (*PACKAGES, "tests", "benchmarks", "docs")
#: a name, or a prefix written as a pattern (SHARDFLOW_PIPELINE_<FLAG>, SHARDFLOW_TRAINER_*)
NAME = re.compile(r"SHARDFLOW_[A-Z0-9_]*")


def _sources(*packages: str) -> list[Path]:
    return [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))
            if "__pycache__" not in p.parts]


def _flag_overrides() -> dict[str, set[str]]:
    """component -> the environment names of its commands' flags (what cyclopts' Env source
    of :func:`infra.config.make_app` reads)."""
    from pipeline.cli import app as pipeline_app
    from storage.admin.cli import app as storage_app
    from trainer.config import app as trainer_app

    out: dict[str, set[str]] = {}
    for component, app in (("pipeline", pipeline_app), ("trainer", trainer_app),
                           ("storage", storage_app)):
        apps = [app[name] for name in app if not name.startswith("-")]
        apps += [app] if app.default_command is not None else []
        names = out.setdefault(component, set())
        for one in apps:
            for argument in one.assemble_argument_collection():
                names |= {f"SHARDFLOW_{component.upper()}_{n[2:].upper().replace('-', '_')}"
                          for n in argument.names
                          if n.startswith("--") and not n.startswith("--no-")}
    return out


def _env_reads(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every ``os.environ.get(X)``, ``os.environ[X]``, ``os.getenv(X)``,
    ``X in os.environ`` whose ``X`` is a ``SHARDFLOW_*`` string (a literal or a module-level
    constant)."""
    tree = ast.parse(path.read_text(), str(path))
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}

    def name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    def environ(node: ast.AST) -> bool:
        return ast.unparse(node).split(".")[-1] == "environ"

    out = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func.endswith("getenv") or (isinstance(node.func, ast.Attribute)
                                           and node.func.attr in ("get", "pop", "setdefault")
                                           and environ(node.func.value)):
                key = name(node.args[0])
        elif isinstance(node, ast.Subscript) and environ(node.value):
            key = name(node.slice)
        elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
            key = name(node.left)
        if key is not None and key.startswith("SHARDFLOW_"):
            out.append((node.lineno, key))
    return out


def test_no_shardflow_variable_is_read_around_the_registry() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: {key}" for p in _sources(*PACKAGES)
           if p != ROOT / "infra" / "environment.py" for line, key in _env_reads(p)]
    assert not bad, ("SHARDFLOW_* variables read directly (make each a config field, or "
                     "register it in infra/environment.py and read it with value()):\n"
                     + "\n".join(bad))


def test_the_read_check_finds_a_direct_read(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nVAR = "SHARDFLOW_X"\nos.environ.get(VAR)\n'
                     'os.getenv("SHARDFLOW_Y", "1")\nos.environ["SHARDFLOW_Z"]\n'
                     '"SHARDFLOW_W" in os.environ\nos.environ.get("HOME")\n')
    assert [k for _, k in _env_reads(probe)] == sorted(
        ["SHARDFLOW_X", "SHARDFLOW_Y", "SHARDFLOW_Z", "SHARDFLOW_W"],
        key=["SHARDFLOW_X", "SHARDFLOW_Y", "SHARDFLOW_Z", "SHARDFLOW_W"].index)


def test_every_variable_named_anywhere_is_a_flag_or_registered() -> None:
    """A name in code, tests, benchmarks or docs that is neither a registered variable nor a
    real flag's override is a typo or a variable read behind the registry's back."""
    overrides = _flag_overrides()
    known = set(environment.VARIABLES).union(*overrides.values())
    prefixes = {"SHARDFLOW"} | {f"SHARDFLOW_{c.upper()}" for c in overrides}
    files = [p for d in TEXTS for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")
             and "__pycache__" not in p.parts and p != Path(__file__)]
    bad = []
    for path in [*files, ROOT / "README.md", ROOT / "Makefile"]:
        text = path.read_text()
        for match in NAME.finditer(text):
            name = match.group()
            if name.endswith("_") or text[match.end():match.end() + 1] in ("<", "*"):
                if name.rstrip("_") not in prefixes:  # a prefix: SHARDFLOW_PIPELINE_<FLAG>
                    bad.append(f"{path.relative_to(ROOT)}: {name}...")
            elif name not in known:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "unknown SHARDFLOW_* names (not a flag's override, not registered):\n" + \
        "\n".join(sorted(set(bad)))


def _configuration_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Configuration")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("name", sorted(environment.VARIABLES))
def test_every_registered_variable_is_documented(name: str) -> None:
    variable = environment.VARIABLES[name]
    section = _configuration_section()
    assert f"`{name}`" in section, f"README's configuration section does not list {name}"
    assert (ROOT / variable.read_by).is_file()
    assert name in (ROOT / variable.read_by).read_text(), f"{variable.read_by} never names it"
    assert variable.meaning and not variable.name.startswith(
        tuple(f"SHARDFLOW_{c}_" for c in ("PIPELINE", "TRAINER"))), \
        "a component's prefix belongs to its config fields"


def test_value_is_the_default_when_unset_or_empty() -> None:
    assert environment.value("SHARDFLOW_S3_CLIENT", {}) == "auto"
    assert environment.value("SHARDFLOW_S3_CLIENT", {"SHARDFLOW_S3_CLIENT": ""}) == "auto"
    assert environment.value("SHARDFLOW_S3_CLIENT", {"SHARDFLOW_S3_CLIENT": "s3fs"}) == "s3fs"
    with pytest.raises(KeyError):
        environment.value("SHARDFLOW_NOT_REGISTERED", {})
