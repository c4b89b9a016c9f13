"""The docs stay true to the code: the README's commands and flags exist, docs/modules.md's
module map names every module of the packages, every module path the docs, docstrings, comments
and pyproject.toml name exists, and docs/design.md stays short and free of commit hashes."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
MODULE_MAP = ROOT / "docs" / "modules.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PACKAGES = ("infra", "storage", "pipeline", "loaders", "trainer")

#: flags of other tools that the README mentions (torchrun's, pip's, `dask worker`'s)
FOREIGN_FLAGS = {"--nproc-per-node", "--max-restarts", "--nnodes", "--rdzv-backend",
                 "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--no-deps", "--nthreads"}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _app_options(app) -> set[str]:  # noqa: ANN001 - a cyclopts App
    """The option strings a cyclopts command accepts (what the user can type)."""
    return {name for arg in app.assemble_argument_collection() if arg.parse
            for name in arg.names if name.startswith("-")} | {"--help", "-h"}


def _app_commands(app) -> dict[str | None, set[str]]:  # noqa: ANN001 - a cyclopts App
    """None -> the app's own options; each subcommand -> its options."""
    out: dict[str | None, set[str]] = {None: {"--help", "-h"}}
    subs = [name for name in app if not name.startswith("-")]
    if not subs:
        out[None] = _app_options(app)
    for name in subs:
        out[name] = _app_options(app[name])
    return out


def _plot_parser() -> argparse.ArgumentParser:
    """``python -m trainer plot``'s parser is built inside its ``main``: catch it there."""
    from trainer import plot

    caught: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        caught.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            plot.main(["x"])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return caught[0]


@pytest.fixture(scope="module")
def commands() -> dict[tuple[str, str | None], set[str]]:
    """(module, subcommand) -> the option strings its parser accepts."""
    from loopback_s3.__main__ import _parser as testing_parser
    from pipeline.cli import app as pipeline_app
    from storage.admin.cli import app as storage_app
    from trainer.config import app as trainer_app

    out: dict[tuple[str, str | None], set[str]] = {}
    for module, parser in (("loopback_s3", testing_parser()),):
        out[(module, None)] = _options(parser)
        for name, sub in _subcommands(parser).items():
            out[(module, name)] = _options(sub)
    for module, app in (("pipeline", pipeline_app), ("storage", storage_app),
                        ("trainer", trainer_app)):
        for name, options in _app_commands(app).items():
            out[(module, name)] = options
    out[("trainer", "plot")] = _options(_plot_parser())
    return out


def _blocks(text: str) -> tuple[list[str], str]:
    """The shell code blocks' lines (continuations joined, comments dropped), and the text
    outside any code block."""
    shell: list[str] = []
    prose: list[str] = []
    lang = None  # None: outside a block
    for line in text.splitlines():
        if line.startswith("```"):
            lang = line[3:].strip() if lang is None else None
        elif lang is None:
            prose.append(line)
        elif lang in ("bash", "sh", ""):
            shell.append(line)
    joined = "\n".join(shell).replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in joined.splitlines()], "\n".join(prose)


def _command_lines(text: str) -> list[str]:
    """Every shell line that runs ``-m <one of ours>``: in code blocks and in inline code."""
    shell, prose = _blocks(text)
    ours = re.compile(r"-m (pipeline|storage|trainer|loopback_s3)\b")
    return ([line for line in shell if ours.search(line)]
            + [c for c in re.findall(r"`([^`\n]+)`", prose) if ours.search(c)])


def _parse(line: str) -> tuple[str, str | None, list[str]]:
    """(module, subcommand or None, the flags given to it)."""
    words = shlex.split(line)
    i = words.index("-m")
    module = words[i + 1]
    rest = words[i + 2:]
    sub = rest[0] if rest and not rest[0].startswith("-") else None
    return module, sub, [w.split("=")[0] for w in rest if w.startswith("--")]


def test_the_introspection_can_fail(commands) -> None:
    """The parsers' flags are really read: a flag none has is missing, every real one found."""
    assert "--text-field" in commands[("pipeline", "run")]
    assert "--no-fix-mojibake" in commands[("pipeline", "run")]
    assert "-o" in commands[("pipeline", "run")] and "--json" in commands[("pipeline", "inspect")]
    assert "--checkpoint-dir" in commands[("trainer", None)]
    assert {"--keep", "--min-age", "--dry-run", "-q", "--wait"} <= commands[("storage", "gc")]
    assert "--no-dry-run" not in commands[("storage", "gc")]
    assert "--no-compile" not in commands[("trainer", None)]
    assert "--empty-inputs" not in commands[("pipeline", "run")]  # not a flag (parse=False)
    assert not any("--no-such-flag" in flags for flags in commands.values())


def test_readme_commands_exist_with_their_flags(commands) -> None:
    lines = _command_lines(README.read_text())
    assert len(lines) >= 15, "the README's commands were not found: did its code blocks change?"
    bad = []
    for line in lines:
        module, sub, flags = _parse(line)
        if (module, None) not in commands:
            bad.append(f"{line!r}: no command python -m {module}")
            continue
        subs = _subcommands_of(commands, module)
        for one in (sub.split("|") if sub else [None]):  # `inspect|gc` names two
            if one is not None and subs and one not in subs:
                bad.append(f"{line!r}: python -m {module} has no subcommand {one!r}")
                continue
            known = commands[(module, one if one in subs else None)]
            bad += [f"{line!r}: python -m {module} {one or ''} has no {flag}" for flag in flags
                    if flag not in known]
    assert not bad, "\n".join(bad)


def _subcommands_of(commands: dict, module: str) -> set[str]:
    return {sub for (m, sub) in commands if m == module and sub is not None}


def test_every_flag_the_readme_names_exists(commands) -> None:
    """A flag named in prose (``--write-quorum N``) must exist on some command of ours."""
    ours = set().union(*commands.values())
    text = re.sub(r"\S+\.py( --[\w-]+)+", "", README.read_text())  # benchmark scripts' flags
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    stale = sorted(named - ours - FOREIGN_FLAGS)
    assert not stale, f"README names flags no command has: {stale}"


def _modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def _module_map() -> str:
    return MODULE_MAP.read_text()


def test_module_map_names_every_module() -> None:
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", _module_map(), re.M))
    missing = sorted(_modules() - mapped)
    assert not missing, f"docs/modules.md's module map lacks {missing}: add a row for each"
    assert "docs/modules.md" in DESIGN.read_text() or "(modules.md)" in DESIGN.read_text()


def test_docs_link_to_each_other_and_not_outside() -> None:
    readme = README.read_text()
    assert "docs/design.md" in readme and "benchmarks/README.md" in readme
    for doc in (README, DESIGN, ROOT / "benchmarks" / "README.md", ROOT / "trainer" / "README.md"):
        assert "shared/DESIGN.md" not in doc.read_text(), f"{doc.name} points outside the repo"


def _run_help() -> str:
    """``python -m pipeline run --help`` as a user reads it (wide: no suffix is wrapped)."""
    import io

    from rich.console import Console

    from pipeline.cli import app

    out = io.StringIO()
    app.help_print(["run"], console=Console(file=out, width=400))
    return out.getvalue()


def _names(suffix: str, text: str) -> bool:
    """``text`` names ``suffix`` on its own (``.json`` is not named by ``.jsonl``)."""
    return re.search(rf"(?<![\w.]){re.escape(suffix)}(?![\w])", text) is not None


def test_help_and_readme_name_every_input_format() -> None:
    """Every file name ending discovery accepts is in ``run --help`` and the README, WARC's
    compound endings included: the help once left WARC out, so users thought it unsupported."""
    from pipeline.planning.discovery import COMPRESSIONS, FORMATS, detect_format

    endings = [*FORMATS, *COMPRESSIONS, ".warc.gz", ".warc.wet.gz"]
    assert detect_format("x.warc.wet.gz") == ("warc", "gzip")
    for name, text in (("run --help", _run_help()), ("README.md", README.read_text())):
        missing = [e for e in endings if not _names(e, text)]
        assert not missing, f"{name} does not name the input endings {missing}"
    assert not _names(".wet", "x.warc.wet.gz") and not _names(".json", ".jsonl")


def test_warc_partitions_are_as_the_docs_say() -> None:
    """The docs once said "one partition per WARC file", and 23 small files became 2
    partitions: a WARC file is never split, and small ones are packed like any unsplit file
    (README's Common Crawl section: 23 files of about 80 KB are two partitions)."""
    from pipeline.planning.discovery import InputFile
    from pipeline.planning.plan import auto_partition_bytes, plan_partitions

    for doc in (README, *DOCS):
        stale = re.findall(r"[Oo]ne partition per (?:WARC )?file", doc.read_text())
        assert not stale, f"{doc.name} says {stale}"
    small = [InputFile(f"s3://b/{i:02d}.warc.gz", "warc", "gzip", 80_000) for i in range(23)]
    size = auto_partition_bytes(23 * 80_000)
    assert len(plan_partitions(small, size)) == 2
    assert len(plan_partitions(small, size, max_files=1)) == 23  # --files-per-partition 1
    big = InputFile("a.warc", "warc", None, 10 * size)  # even uncompressed: never split
    assert [(p.start, p.end) for p in plan_partitions([big], size)] == [(0, -1)]
