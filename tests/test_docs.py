"""The docs stay true to the code: the README's commands and flags exist, docs/modules.md's
module map names every module of the packages, every module path the docs, docstrings, comments
and pyproject.toml name exists, and docs/design.md stays short and free of commit hashes."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def commands() -> dict[tuple[str, str | None], set[str]]:
    """(module, subcommand) -> the option strings its parser accepts."""
    from loopback_s3.__main__ import app as testing_app
    from pipeline.cli import app as pipeline_app
    from storage.admin.cli import app as storage_app
    from trainer.config import app as trainer_app
    from trainer.plot import app as plot_app

    out: dict[tuple[str, str | None], set[str]] = {}
    for module, app in (("pipeline", pipeline_app), ("storage", storage_app),
                        ("trainer", trainer_app), ("loopback_s3", testing_app)):
        for name, options in _app_commands(app).items():
            out[(module, name)] = options
    out[("trainer", "plot")] = _app_options(plot_app)
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


# -- every module path the docs, docstrings, comments and pyproject.toml name exists ----------

OURS = ("infra", "storage", "pipeline", "loaders", "trainer", "loopback_s3")
#: folders whose paths are checked when named (``pkg/sub/mod.py``, ``pkg/sub/``)
PATH_ROOTS = (*OURS, "tests", "benchmarks", "docs")
#: made when a script or a run needs them, never committed
GENERATED = ("benchmarks/.peers-venv", "benchmarks/results/", "benchmarks/data/")
_PATH = re.compile(rf"(?<![\w./@:-])((?:{'|'.join(PATH_ROOTS)})/[\w./-]*)")
_DOTTED = re.compile(rf"^(?:{'|'.join(OURS)})(?:\.\w+)+$")
_CODE = re.compile(r"``([^`\n]+)``|`([^`\n]+)`")
#: a dotted name ending so is a file name (``trainer.json``), not a module
_FILE_ENDINGS = {"json", "jsonl", "md", "py", "txt", "toml", "yaml", "png", "log", "npy",
                 "parquet", "sfidx", "sfmask", "csv", "gz", "zst"}


def _named_paths(text: str) -> set[str]:
    """``pkg/sub/mod.py`` and ``pkg/sub/`` as a text names them (placeholders left out)."""
    out = set()
    for path in _PATH.findall(text):
        path = path.rstrip(".,;:)-")
        if re.search(r"[A-Z]{3,}|NNN|\*|\.\.\.", path) or path.startswith(GENERATED):
            continue  # a placeholder (benchmarks/NAME.py) or what a run writes
        if path.endswith("/") or re.search(r"\.\w+$", path):  # a folder or a file, not "docs/s"
            out.add(path)
    return out


def _named_modules(text: str) -> set[str]:
    """Dotted names of ours in code spans and roles (``pipeline.tasks.stages``,
    :mod:`storage.io.urls`, `storage.format.layout.safe_relative`)."""
    spans = [a or b for a, b in _CODE.findall(text)]
    names = {s.strip().removesuffix("()") for s in spans}
    return {n for n in names if _DOTTED.match(n) and n.rsplit(".", 1)[1] not in _FILE_ENDINGS}


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolves(name: str) -> bool:
    """The longest module prefix of ``name`` exists as a file, and the next part, if any, is
    an attribute of that module (imported to ask; where it cannot be imported here, a name
    its source defines)."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        source = _module_file(parts[:cut])
        if source is None:
            continue
        if cut == len(parts):
            return True
        attr = parts[cut]
        try:
            return hasattr(importlib.import_module(".".join(parts[:cut])), attr)
        except ImportError:  # an optional dependency missing here
            return re.search(rf"^\s*(?:def |class |async def )?{re.escape(attr)}\b",
                             source.read_text(), re.M) is not None
    return False


def _missing(text: str) -> list[str]:
    """What ``text`` names that does not exist: paths, and dotted names that do not resolve."""
    gone = [p for p in _named_paths(text) if not (ROOT / p).exists()]
    gone += [n for n in _named_modules(text) if not _resolves(n)]
    return sorted(gone)


def _docstrings_and_comments(path: Path) -> str:
    """A source file's docstrings and comments: what it says in prose."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    out = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(out)


def _texts() -> dict[str, str]:
    """Every text that names our modules: the docs, pyproject.toml, and the docstrings and
    comments of the packages, tests and benchmarks."""
    docs = [README, *DOCS, ROOT / "benchmarks" / "README.md", ROOT / "trainer" / "README.md",
            ROOT / "pyproject.toml"]
    out = {p.relative_to(ROOT).as_posix(): p.read_text() for p in docs if p.exists()}
    for folder in (*OURS, "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[path.relative_to(ROOT).as_posix()] = _docstrings_and_comments(path)
    return out


def test_the_path_checker_finds_what_is_gone() -> None:
    """Planted stale names are found, real ones pass (the checker can fail)."""
    text = """See storage/clients.py and `pipeline/stages.py`; the layout is in
    `storage/format/layout.py` (storage/io/ holds the rest, storage/nothing/ does not).
    :mod:`storage.checksums`, ``pipeline.tasks.stages.no_such_function_here``,
    `storage.format.layout.safe_relative`, :func:`pipeline.tasks.stages`, `trainer.json`,
    `storage.tokens`, `storage.ReplicaSet`, benchmarks/NAME.py, the docs/s of a run,
    `benchmarks/results/x_quick.json`, ``loaders.plan.no_such_name``."""
    assert _missing(text) == ["loaders.plan.no_such_name",
                              "pipeline.tasks.stages.no_such_function_here", "pipeline/stages.py",
                              "storage.checksums", "storage/clients.py", "storage/nothing/"]
    assert "storage/io/" in _named_paths(text)


def test_every_module_path_named_exists() -> None:
    texts = _texts()
    assert len(texts) > 300 and "pyproject.toml" in texts and "docs/loader.md" in texts
    bad = [f"{where}: {name}" for where, text in texts.items() for name in _missing(text)]
    assert not bad, "names of modules or paths that do not exist:\n" + "\n".join(bad)


_COMMIT = re.compile(r"(?<![\w/#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def test_design_is_short_and_states_no_measurement_diary() -> None:
    """docs/design.md fits in a sitting; no doc under docs/ carries commit hashes or dates
    (measurements and their history live in benchmarks/README.md)."""
    lines = DESIGN.read_text().splitlines()
    assert len(lines) < 550, f"docs/design.md has {len(lines)} lines: move a deep dive out"
    for doc in DOCS:
        text = doc.read_text()
        assert not _COMMIT.findall(text), f"{doc.name} names commits {_COMMIT.findall(text)}"
        assert not _DATE.findall(text), f"{doc.name} carries dates {_DATE.findall(text)}"
    assert _COMMIT.findall("at 97866af on a quiet host, 1a58900") == ["97866af", "1a58900"]
    assert not _COMMIT.findall("deadbeef-free <sha16> 12345678 abcdefab")


def _slug(heading: str) -> str:
    """The anchor GitHub makes of a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_links_between_docs_resolve() -> None:
    """A relative link in the docs names a file that exists, and its #anchor a heading there."""
    bad = []
    for doc in (README, *DOCS, ROOT / "benchmarks" / "README.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{doc.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                heads = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                if anchor not in {_slug(h) for h in heads}:
                    bad.append(f"{doc.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_short_module_names_in_docs_exist() -> None:
    """A bare ``name.py`` in the docs (a deep dive's `plan.py`) is some module's file name."""
    names = {p.name for folder in (*OURS, "tests", "benchmarks")
             for p in (ROOT / folder).rglob("*.py")}
    bad = [f"{doc.name}: {name}" for doc in (README, *DOCS, ROOT / "benchmarks" / "README.md")
           for name in sorted(set(re.findall(r"(?<![\w/.-])(\w+\.py)\b", doc.read_text())))
           if name not in names]
    assert not bad, f"the docs name modules no package has: {bad}"
