"""A recipe's steps run on one document after another: the counts, the contract's checks,
and each kept document's metadata and signals for its shard's columns.

A step's result is checked here (the document, ``None`` or ``(None, "reason")``; a ``str``
text), so a step that breaks the contract is one :class:`StepError` naming it. A step that
raises on a document quarantines that document (:class:`Poisoned`: reason ``<name>.error``
and the exception), and the run goes on; ``--strict`` stops at it as at any bad record.

Drops are counted as ``<name>`` or ``<name>.<reason>`` (the built-ins keep their old
reason names); changes by the built-ins' own counters, and for other steps as ``<name>``
whenever the text they return differs from the text they got.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from pipeline.steps.columns import META_COLUMNS, Columns
from pipeline.steps.contract import Doc, Poisoned, StepError
from pipeline.steps.recipe import Recipe, StepSpec
from pipeline.steps.registry import build, is_builtin

if TYPE_CHECKING:
    from pipeline.records import Document

#: the signal a user step in annotate mode writes: why it would have dropped the document
#: ("" when it keeps it)
DROP_SIGNAL = "drop"


class _Link:
    """One step of the chain and how its results are read."""

    __slots__ = ("annotate_user", "builtin", "name", "qualified", "step")

    def __init__(self, spec: StepSpec, step: Any) -> None:
        self.step = step
        self.name = spec.name
        self.builtin = is_builtin(spec.use)
        self.qualified = bool(getattr(step, "qualified_reasons", False)) and self.builtin
        # a step without modes of its own in annotate mode: its drops become a signal
        self.annotate_user = spec.mode == "annotate" and getattr(step, "modes", None) is None


def declared_signals(links: list[_Link]) -> dict[str, type]:
    """The signal columns the steps declare, prefixed, in step order."""
    out: dict[str, type] = {}
    for link in links:
        for key, kind in dict(getattr(link.step, "signals", None) or {}).items():
            out[f"{link.name}.{key}"] = kind
        if link.annotate_user:
            out[f"{link.name}.{DROP_SIGNAL}"] = str
    return out


class StepChain:
    """The steps of ``recipe``, built once per process (a worker's task, or the isolation
    child), run on each document by :meth:`__call__`."""

    def __init__(self, recipe: Recipe, storage_options: dict[str, Any] | None = None) -> None:
        self.recipe = recipe
        self.links: list[_Link] = []
        try:
            for spec in recipe.steps:
                self.links.append(_Link(spec, build(spec, storage_options)))
        except BaseException:
            self.close()
            raise
        self.declared = declared_signals(self.links)
        self.dropped: Counter[str] = Counter()
        self._changed: Counter[str] = Counter()
        #: the last document that passed: its metadata row and its prefixed signals
        self.last: tuple[tuple[Any, ...], dict[str, Any]] = ((None,) * len(META_COLUMNS), {})

    def warm_up(self) -> None:
        """Load what steps load on first use (a parser, a model) before the first record, so
        that a record's CPU time is its own."""
        for link in self.links:
            warm = getattr(link.step, "warm_up", None)
            if warm is not None:
                warm()

    def __call__(self, document: Document) -> str | None:
        """The document's text after every step, or ``None`` when one drops it."""
        doc = Doc(document.doc_id, document.text, {
            "url": document.url, "date": document.date, "source": document.source,
            "kind": document.kind, "lang": None, "lang_score": None})
        signals: dict[str, Any] = {}
        for link in self.links:
            before = doc.text
            try:
                out = link.step(doc)
            except (Poisoned, StepError):
                raise
            except Exception as exc:
                raise Poisoned(f"{link.name}.error",
                               f"{type(exc).__name__}: {exc}"[:500]) from None
            if out is doc:
                reason = ""
            elif out is None:
                reason = link.name
            elif type(out) is tuple and len(out) == 2 and out[0] is None \
                    and isinstance(out[1], str) and out[1]:
                reason = out[1] if link.qualified else f"{link.name}.{out[1]}"
            else:
                raise StepError(f"step {link.name!r} returned {type(out).__name__}: a step "
                                "returns the document, None or (None, 'reason')")
            if doc.signals:
                for key, value in doc.signals.items():
                    signals[f"{link.name}.{key}"] = value
                doc.signals = {}
            if link.annotate_user:
                doc.text = before
                signals[f"{link.name}.{DROP_SIGNAL}"] = reason
                continue
            if reason:
                self.dropped[reason] += 1
                return None
            if doc.text is not before:
                if not isinstance(doc.text, str):
                    raise StepError(f"step {link.name!r} set the text to a "
                                    f"{type(doc.text).__name__}, not a str")
                if not link.builtin and doc.text != before:
                    self._changed[link.name] += 1
        meta = doc.meta
        self.last = (tuple(meta[k] for k in META_COLUMNS), signals)
        return doc.text

    @property
    def changed(self) -> Counter[str]:
        out = Counter(self._changed)
        for link in self.links:
            own = getattr(link.step, "changed", None) if link.builtin else None
            if own:
                out.update(own)
        return out

    def columns(self) -> Columns:
        """A column gatherer for this chain's shard."""
        return Columns(self.recipe.metadata, self.declared)

    def close(self) -> None:
        for link in self.links:
            close = getattr(link.step, "close", None)
            if close is not None:
                close()
