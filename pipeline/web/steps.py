"""The web steps of phase 1, in FineWeb's order: URL block-list, HTML -> main text, (the
cleaner), language ID, the heuristic rule sets, PII masking. Each step counts what it drops
and why (``dropped``: the run summary's and the manifest's ``stats.dropped``) and what it
changed (``changed``), the way :class:`pipeline.cleaning.Cleaner` does.

Rule sets (``--filters``): ``gopher`` (= ``gopher_repetition`` + ``gopher_quality``), ``c4``,
``fineweb``; they always run in that order (FineWeb's), whatever order they are named in.
Their thresholds are datatrove's defaults, each overridable by ``--filter-options``
(``{"gopher_quality.min_doc_words": 100, "c4.filter_no_terminal_punct": false}``). A drop is
counted as ``<rule set>.<reason>`` with datatrove's reason names.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from pipeline.web.c4 import C4Quality
from pipeline.web.fineweb import FineWebQuality
from pipeline.web.gopher import GopherQuality, GopherRepetition
from pipeline.web.option_types import typed_option
from pipeline.web.text import Text

if TYPE_CHECKING:
    from pipeline.cleaning import Cleaner
    from pipeline.records import Document

#: rule sets in the order they run
RULE_SETS: dict[str, type] = {
    "gopher_repetition": GopherRepetition,
    "gopher_quality": GopherQuality,
    "c4": C4Quality,
    "fineweb": FineWebQuality,
}
ALIASES = {"gopher": ("gopher_repetition", "gopher_quality")}
#: the metadata columns written beside ``input_ids`` (pipeline.shards.META_SCHEMA)
META_COLUMNS = ("url", "date", "source", "lang", "lang_score")


def parse_filters(spec: str) -> tuple[str, ...]:
    """``"gopher,c4"`` -> the rule sets to run, in their running order."""
    names: set[str] = set()
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name or name == "none":
            continue
        if name in ALIASES:
            names.update(ALIASES[name])
        elif name in RULE_SETS:
            names.add(name)
        else:
            known = ", ".join([*ALIASES, *RULE_SETS])
            raise ValueError(f"unknown filter {name!r} (known: {known})")
    return tuple(n for n in RULE_SETS if n in names)


def parse_filter_options(text: str | None) -> tuple[tuple[str, Any], ...]:
    """``--filter-options`` JSON -> sorted ``((rule_set.field, value), ...)``, each checked
    against the rule set's fields (an unknown name is an error naming it) and their types
    (:mod:`pipeline.web.option_types`)."""
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"filter_options: not JSON: {str(exc)[:200]}") from None
    if not isinstance(raw, dict):
        raise ValueError("filter_options: expected a JSON object "
                         '{"rule_set.option": value, ...}')
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


class WebSteps:
    """Run the web steps on documents, keeping counts and each kept document's metadata."""

    def __init__(self, cfg: WebConfig, storage_options: dict[str, Any] | None = None) -> None:
        from pipeline.web.urls import load_blocklist

        self.cfg = cfg
        self.rules = cfg.rules()
        self.blocklist = (load_blocklist(cfg.url_blocklist, storage_options)
                          if cfg.url_blocklist else frozenset())
        self.languages = frozenset(cfg.languages)
        self.dropped: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()
        self._last: tuple[Any, ...] = (None,) * len(META_COLUMNS)
        self._columns: list[list[Any]] = [[] for _ in META_COLUMNS]

    def __call__(self, doc: Document, cleaner: Cleaner) -> str | None:
        """The document's text after every step, or ``None`` when a step drops it."""
        from pipeline.web.urls import blocked

        if self.blocklist and blocked(doc.url, self.blocklist):
            return self._drop("url_blocked")
        text: str | None = doc.text
        if doc.kind.startswith("other"):
            return self._drop("not_html")
        if doc.kind == "html":
            from pipeline.web.extract import html_to_text

            try:
                text = html_to_text(doc.text)
            except Exception:  # a page the parser cannot take: counted, never fatal
                return self._drop("extract_failed")
            if not text:
                return self._drop("extract_empty")
            self.changed["extracted"] += 1
        text = cleaner(text)
        if text is None:
            return None
        lang, score = None, None
        if self.languages or self.cfg.identify:
            from pipeline.web.langid import identify

            lang, score = identify(text)
            if self.languages:
                if lang not in self.languages:
                    return self._drop("language")
                if score < self.cfg.min_lang_score:
                    return self._drop("lang_score")
        if self.rules:
            view = Text(text)
            for name, rule in self.rules:
                if name == "c4":
                    new, reason = rule(view.text)
                    if reason is None and new != view.text:
                        self.changed["c4.lines_removed"] += 1
                        view = Text(new)
                else:
                    reason = rule(view)
                if reason is not None:
                    return self._drop(f"{name}.{reason}")
            text = view.text
            if not text:
                return self._drop("empty")
        if self.cfg.pii:
            from pipeline.web.pii import mask

            text, n_email, n_ip = mask(text)
            if n_email:
                self.changed["pii_emails_masked"] += n_email
            if n_ip:
                self.changed["pii_ips_masked"] += n_ip
        self._last = (doc.url, doc.date, doc.source, lang, score)
        return text

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        return None

    def keep(self) -> None:
        """The last document that passed is kept: its metadata goes to the next batch."""
        for column, value in zip(self._columns, self._last, strict=True):
            column.append(value)

    def take(self) -> dict[str, list[Any]] | None:
        """The metadata columns of the documents kept since the last call."""
        if not self.cfg.metadata:
            for column in self._columns:
                column.clear()
            return None
        out = dict(zip(META_COLUMNS, self._columns, strict=True))
        self._columns = [[] for _ in META_COLUMNS]
        return out
