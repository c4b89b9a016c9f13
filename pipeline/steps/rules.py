"""The published heuristic rule sets as steps: ``gopher_repetition``, ``gopher_quality``,
``c4``, ``fineweb`` (:mod:`pipeline.web.gopher`, :mod:`pipeline.web.c4`,
:mod:`pipeline.web.fineweb`), with datatrove's defaults and reason names; their options are
the rule set's thresholds.

``filter`` mode drops a document at the first rule it fails (counted ``<name>.<reason>``).
``annotate`` mode measures every signal the rules look at and writes them as columns
(``<name>.<signal>``), dropping nothing; a rule set's ``judge`` decides from those signals
exactly what filter mode decides (tested on every rule set), so a threshold can be tried
again on the columns without a rebuild.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Any

from infra.config import CommaList, JsonObject, comma_list, json_object_text
from pipeline.config_field import flag
from pipeline.steps.contract import Doc
from pipeline.web.c4 import C4Quality
from pipeline.web.option_types import typed_option
from pipeline.web.steps import RULE_SETS
from pipeline.web.text import Text


@dataclass
class RuleSetFlags:
    """The rule-set steps as ``pipeline run`` flags: which run in filter mode, which in
    annotate mode, and their thresholds."""

    filters: CommaList = flag((), "heuristic rule sets to apply, comma-separated: gopher "
                        "(gopher_repetition + gopher_quality), c4, fineweb; drops are counted "
                        "as <rule set>.<reason>", manifest=False)
    filter_options: JsonObject = flag(
        None, "thresholds of the rule sets, a JSON object, e.g. "
        '\'{"gopher_quality.min_doc_words": 100, "c4.filter_no_terminal_punct": false}\'',
        manifest=False)
    annotate: CommaList = flag((), "rule sets to measure without dropping anything, "
                               "comma-separated (gopher, c4, fineweb, as --filters): every signal "
                               "their rules look at becomes a column <rule set>.<signal> beside "
                               "input_ids", manifest=False)

    def check_rule_set_flags(self) -> None:
        """Values given in Python as text (``filters="gopher,c4"``) take the flags' grammar;
        the names and options themselves are checked with the recipe."""
        self.filters = comma_list(self.filters)
        self.annotate = comma_list(self.annotate)
        if self.filter_options is not None:
            try:
                self.filter_options = json_object_text(self.filter_options)
            except ValueError as exc:
                raise ValueError(f"filter_options: {exc}") from None

def view(doc: Doc) -> Text:
    """The document's :class:`Text` (its word split), shared by consecutive rule sets while
    the text is unchanged."""
    cached = doc._view
    if cached is None or cached.text is not doc.text:
        cached = doc._view = Text(doc.text)
    return cached


def signal_types(rule: Any) -> dict[str, type]:
    """The signals a configured rule set measures (name -> type)."""
    found = getattr(rule, "signals", None)
    if callable(found):
        return dict(found())
    return dict(getattr(rule, "SIGNALS", {}))


class RuleStep:
    """One rule set (``rule_set``: its name in :data:`RULE_SETS`) in filter or annotate mode;
    the options are its dataclass's fields, checked and typed."""

    version = "1"
    modes = ("filter", "annotate")
    #: reasons are counted as returned: ``<name>.<reason>``, and ``empty`` (c4 removed every
    #: line) as it always was; ``name`` is the recipe's (the registry sets it)
    qualified_reasons = True

    def __init__(self, rule_set: str, mode: str = "filter", **options: Any) -> None:
        cls = RULE_SETS[rule_set]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
        typed = {k: typed_option(f"{rule_set}.{k}", v, cls) for k, v in options.items()}
        self.rule = replace(cls(), **typed)
        self.name = rule_set
        self.annotate = mode == "annotate"
        self.is_c4 = cls is C4Quality
        self.changed: Counter[str] = Counter()
        self.signals = signal_types(self.rule) if self.annotate else {}

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        if self.annotate:
            if self.is_c4:
                _, measured = self.rule.measure(doc.text)
            else:
                measured = self.rule.measure(view(doc))
            doc.signals.update(measured)
            return doc
        if self.is_c4:
            new, reason = self.rule(doc.text)
            if reason is not None:
                return None, f"{self.name}.{reason}"
            if new != doc.text:
                self.changed[f"{self.name}.lines_removed"] += 1
                if not new:
                    return None, "empty"
                doc.text = new
            return doc
        reason = self.rule(view(doc))
        return doc if reason is None else (None, f"{self.name}.{reason}")


def _rule_class(rule_set: str) -> type:
    """A step class for one rule set, named as it is (the registry lists these)."""

    def __init__(self: RuleStep, mode: str = "filter", **options: Any) -> None:
        RuleStep.__init__(self, rule_set, mode, **options)

    return type(f"{rule_set.title().replace('_', '')}Step", (RuleStep,), {
        "__init__": __init__, "name": rule_set, "rule_set": rule_set,
        "__doc__": SUMMARIES[rule_set]})


#: what each rule set looks at (``python -m pipeline steps`` prints it)
SUMMARIES = {
    "gopher_repetition": "Gopher's repetition rules: duplicate lines and paragraphs (by count "
                         "and by characters), the most frequent 2-4-grams, duplicated 5-10-grams.",
    "gopher_quality": "Gopher's quality rules: word count, mean word length, '#' and ellipsis "
                      "ratios, bullet and ellipsis lines, words with letters, stop words.",
    "c4": "C4's rules: lines without end punctuation or with few words removed; pages with "
          "lorem ipsum, curly brackets, javascript or policy lines, or few sentences dropped.",
    "fineweb": "FineWeb's rules: lines ending in punctuation, short lines, duplicated "
               "characters, list-like pages (newlines per word).",
}


RULE_STEPS: dict[str, type] = {name: _rule_class(name) for name in RULE_SETS}
