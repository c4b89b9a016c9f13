"""A recipe: the steps a run applies between reading and tokenizing, in order, with options.

Given in the config file as ``steps``, a list of tables (TOML ``[[steps]]``, or the same list
in YAML/JSON)::

    [[steps]]
    use = "gopher_quality"       # a built-in step's name, or "module:Class"
    mode = "annotate"            # filters only: "filter" (default) or "annotate"
    min_doc_words = 30           # the step's options: the other keys

    [[steps]]
    use = "mypkg.quality:MyTagger"
    name = "mine"                # prefix of its signals and drop reasons (default: its own)

Or built from today's flags (:func:`pipeline.config.PipelineConfig.recipe`): the default
recipe. A recipe is small, frozen and JSON-able: it travels with every phase-1 task and is
recorded, resolved, in the manifest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any

from cyclopts import Parameter

from pipeline.config_field import NOT_A_FLAG, flag

#: the keys of a recipe entry that are not the step's options
ENTRY_KEYS = ("use", "name", "mode")
MODES = ("filter", "annotate")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_USE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")
#: the most steps a recipe may have (a list that long is a mistake, not a recipe)
MAX_STEPS = 256


@dataclass
class RecipeFlags:
    """The recipe as ``pipeline run`` takes it: ``--steps`` (or ``[[steps]]`` tables in the
    ``--config`` file), and whether the inputs are web pages (set by the job, not a flag)."""

    steps: Annotated[str | None, Parameter(metavar="JSON")] = flag(
        None, "the recipe: the steps between reading and tokenizing, a JSON list of "
        "{use, name, mode, options...}; usually [[steps]] tables in the --config file (README, "
        "'Recipes'; `python -m pipeline steps` lists them). Replaces the step flags "
        "(--filters, --annotate, --languages, --url-blocklist, --pii, the cleaning flags)",
        manifest=False)
    web_inputs: Annotated[bool, NOT_A_FLAG] = flag(
        False, "set by the job when any input is WARC/WET", manifest=False, cli=False)


@dataclass(frozen=True)
class StepSpec:
    """One entry: which step (``use``), under which ``name``, in which ``mode``, with which
    options (sorted ``(key, value)`` pairs of JSON values, so that the spec hashes and
    pickles the same everywhere)."""

    use: str
    name: str
    mode: str = "filter"
    options: tuple[tuple[str, Any], ...] = ()

    def kwargs(self) -> dict[str, Any]:
        return {k: _thawed(v) for k, v in self.options}

    def as_dict(self) -> dict[str, Any]:
        """The entry as written in a config file (and in the manifest)."""
        return {"use": self.use, "name": self.name, "mode": self.mode, **self.kwargs()}


@dataclass(frozen=True)
class Recipe:
    """The steps, and whether the web metadata columns (url, date, source, lang, lang_score)
    are written beside ``input_ids``."""

    steps: tuple[StepSpec, ...]
    metadata: bool = False

    def as_list(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.steps]

    def names(self) -> list[str]:
        return [s.name for s in self.steps]


def _frozen(value: Any) -> Any:
    """A JSON value as a hashable one (lists -> tuples, objects -> sorted pair tuples)."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return ("__object__", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == "__object__":
            return {k: _thawed(v) for k, v in value[1]}
        return [_thawed(v) for v in value]
    return value


def spec(use: str, name: str | None = None, mode: str = "filter", **options: Any) -> StepSpec:
    """A :class:`StepSpec` from Python values (the flags' shorthand builds these)."""
    return StepSpec(use, name or default_name(use), mode,
                    tuple(sorted((k, _frozen(v)) for k, v in options.items())))


def default_name(use: str) -> str:
    """A step's name when its entry gives none: a built-in's own name, or a user class's
    ``name`` attribute (read when the step is loaded; here the class name in snake case)."""
    if ":" not in use:
        return use
    cls = use.rpartition(":")[2]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls).lower()


def parse_entries(entries: Any, where: str = "steps") -> tuple[StepSpec, ...]:
    """The config file's ``steps`` list as specs, each entry checked: a table with a ``use``
    string, a ``name`` fit for a column prefix, a known ``mode``, JSON-able options, names
    unique. Every error names the entry (``steps[2]``) and what is wrong."""
    if not isinstance(entries, list):
        raise ValueError(f"{where} must be a list of tables ([[steps]] in TOML), not "
                         f"{type(entries).__name__}")
    if len(entries) > MAX_STEPS:
        raise ValueError(f"{where}: {len(entries)} steps, more than {MAX_STEPS}")
    out: list[StepSpec] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be a table with a 'use' key, not "
                             f"{type(entry).__name__}")
        use = entry.get("use")
        if not isinstance(use, str) or not _USE.match(use):
            raise ValueError(f"{at}: 'use' must be a built-in step's name or 'module:Class', "
                             f"not {str(use)[:80]!r}")
        name = entry.get("name", default_name(use))
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{at}: 'name' must be letters, digits and '_' (it prefixes "
                             f"column names), not {str(name)[:80]!r}")
        mode = entry.get("mode", "filter")
        if mode not in MODES:
            raise ValueError(f"{at}: 'mode' must be 'filter' or 'annotate', not "
                             f"{str(mode)[:40]!r}")
        options = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
        try:
            json.dumps(options, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{at}: options must be JSON values ({exc})"[:300]) from None
        out.append(spec(use, name, mode, **options))
    names = [s.name for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{where}: step name {twice[0]!r} is used twice; give one a "
                         "different 'name'")
    return tuple(out)


def parse_recipe_json(text: str) -> tuple[StepSpec, ...]:
    """``--steps`` (JSON; the config file's ``[[steps]]`` arrive as the same JSON)."""
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"steps: not JSON: {str(exc)[:200]}") from None
    return parse_entries(entries)
