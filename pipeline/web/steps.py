"""The web flags' configuration: which web steps a run applies (:class:`WebConfig`), and
``--filters`` / ``--filter-options`` parsed and checked. The steps themselves are
:mod:`pipeline.steps.web` and :mod:`pipeline.steps.rules`; :mod:`pipeline.steps.shorthand`
makes the recipe these flags describe.

Rule sets (``--filters``): ``gopher`` (= ``gopher_repetition`` + ``gopher_quality``), ``c4``,
``fineweb``; they always run in that order (FineWeb's), whatever order they are named in.
Their thresholds are datatrove's defaults, each overridable by ``--filter-options``
(``{"gopher_quality.min_doc_words": 100, "c4.filter_no_terminal_punct": false}``). A drop is
counted as ``<rule set>.<reason>`` with datatrove's reason names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from infra.config import json_object_text
from pipeline.web.c4 import C4Quality
from pipeline.web.fineweb import FineWebQuality
from pipeline.web.gopher import GopherQuality, GopherRepetition
from pipeline.web.option_types import typed_option

#: rule sets in the order they run
RULE_SETS: dict[str, type] = {
    "gopher_repetition": GopherRepetition,
    "gopher_quality": GopherQuality,
    "c4": C4Quality,
    "fineweb": FineWebQuality,
}
ALIASES = {"gopher": ("gopher_repetition", "gopher_quality")}
#: the metadata columns written beside ``input_ids`` (pipeline.output.shards.META_SCHEMA)
META_COLUMNS = ("url", "date", "source", "lang", "lang_score")


def parse_filters(spec: str | Iterable[str], what: str = "filter") -> tuple[str, ...]:
    """``("gopher", "c4")`` (the typed ``--filters``) or ``"gopher,c4"`` -> the rule sets to
    run, in their running order (``what``: how an unknown name is called in the error:
    ``--filters``' or ``--annotate``'s)."""
    names: set[str] = set()
    for raw in spec.split(",") if isinstance(spec, str) else spec:
        name = raw.strip().lower()
        if not name or name == "none":
            continue
        if name in ALIASES:
            names.update(ALIASES[name])
        elif name in RULE_SETS:
            names.add(name)
        else:
            known = ", ".join([*ALIASES, *RULE_SETS])
            raise ValueError(f"unknown {what} {name!r} (known: {known})")
    return tuple(n for n in RULE_SETS if n in names)


def parse_filter_options(text: str | dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """``--filter-options`` (the typed flag's object, or its JSON text) -> sorted
    ``((rule_set.field, value), ...)``, each checked against the rule set's fields (an
    unknown name is an error naming it) and their types (:mod:`pipeline.web.option_types`)."""
    if not text:
        return ()
    try:
        raw = json_object_text(text)  # the flag's grammar (infra/config.py)
    except ValueError as exc:
        raise ValueError(f"filter_options: {exc}") from None
    out = []
    for key, value in sorted(raw.items()):
        rule, _, name = key.partition(".")
        if rule not in RULE_SETS or name not in {f.name for f in fields(RULE_SETS[rule])}:
            raise ValueError(f"filter_options: unknown option {key!r}")
        # of the field's type, here in the driver: not a traceback per task on the workers
        out.append((key, typed_option(key, value, RULE_SETS[rule])))
    return tuple(out)


@dataclass(frozen=True)
class WebConfig:
    """What the web steps do (small, pickled with every phase-1 task)."""

    filters: tuple[str, ...] = ()
    filter_options: tuple[tuple[str, Any], ...] = ()
    languages: tuple[str, ...] = ()
    min_lang_score: float = 0.65
    #: identify every document's language (for the ``lang`` column) even without a filter
    identify: bool = False
    url_blocklist: str | None = None
    pii: bool = False
    #: write the metadata columns beside ``input_ids``
    metadata: bool = False

    def rules(self) -> list[tuple[str, Any]]:
        out = []
        for name in self.filters:
            prefix = name + "."
            opts = {k[len(prefix):]: v for k, v in self.filter_options if k.startswith(prefix)}
            out.append((name, replace(RULE_SETS[name](), **opts)))
        return out
