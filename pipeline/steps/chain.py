"""A recipe's steps run on one document after another: the counts, the contract's checks,
and each kept document's metadata and signals for its shard's columns.

A step's result is checked here (the document, ``None`` or ``(None, "reason")``; a ``str``
text), so a step that breaks the contract is one :class:`StepError` naming it. A step that
raises on a document quarantines that document (:class:`Poisoned`: reason ``<name>.error``
and the exception), and the run goes on; ``--strict`` stops at it as at any bad record.

Drops are counted as ``<name>`` or ``<name>.<reason>`` (the built-ins keep their old
reason names); changes by the built-ins' own counters, and for other steps as ``<name>``
whenever the text they return differs from the text they got.

**Batches.** A step may also define ``batch(docs)``: the same results for a list of documents
in one call (a model scorer's one call into C++ for many texts). :meth:`StepChain.run` takes a
list of documents through the steps in order, each step on the ones still kept, by ``batch``
where the step has one and by ``__call__`` otherwise, so the results are the same as one
document at a time. A ``batch`` that raises does not say which document it failed on: that
step runs again one document at a time on the same documents (their text and signals as they
were before it), so exactly the failing ones are quarantined.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeline.steps.columns import META_COLUMNS, Columns
from pipeline.steps.contract import Doc, Poisoned, StepError
from pipeline.steps.recipe import Recipe, StepSpec
from pipeline.steps.registry import build, is_builtin

if TYPE_CHECKING:
    from pipeline.records import Document

#: the signal a user step in annotate mode writes: why it would have dropped the document
#: ("" when it keeps it)
DROP_SIGNAL = "drop"
#: the row of a document that was not kept
_NO_ROW: tuple[tuple[Any, ...], dict[str, Any]] = ((None,) * len(META_COLUMNS), {})


class _Link:
    """One step of the chain and how its results are read."""

    __slots__ = ("annotate_user", "batch", "builtin", "name", "qualified", "step")

    def __init__(self, spec: StepSpec, step: Any) -> None:
        self.step = step
        self.name = spec.name
        self.builtin = is_builtin(spec.use)
        self.qualified = bool(getattr(step, "qualified_reasons", False)) and self.builtin
        # a step without modes of its own in annotate mode: its drops become a signal
        self.annotate_user = spec.mode == "annotate" and getattr(step, "modes", None) is None
        batch = getattr(step, "batch", None)
        self.batch = batch if callable(batch) else None


class Outcome(NamedTuple):
    """What the steps made of one document: its text (``None``: dropped), or the
    :class:`Poisoned` that quarantines it; a kept one's metadata row and prefixed signals."""

    text: str | None
    poisoned: Poisoned | None
    row: tuple[tuple[Any, ...], dict[str, Any]]
    #: a dropped one's ``(step, reason)`` (the lineage's drop record keeps it)
    dropped: tuple[str, str] | None = None


def _doc(d: Document) -> Doc:
    """The step's view of a reader's document."""
    return Doc(d.doc_id, d.text, {"url": d.url, "date": d.date, "source": d.source,
                                  "kind": d.kind, "lang": None, "lang_score": None})


class _Raised(NamedTuple):
    """What a step raised on one document (never a step's own result)."""

    exc: Exception


class _State:
    """One document on its way through the steps."""

    __slots__ = ("doc", "dropped", "poisoned", "reason", "signals", "text")

    def __init__(self, doc: Doc) -> None:
        self.doc = doc
        self.text = doc.text  # the text as the last step left it (a step's "before")
        self.signals: dict[str, Any] = {}
        self.dropped = False
        self.reason: tuple[str, str] | None = None
        self.poisoned: Poisoned | None = None

    @property
    def live(self) -> bool:
        return not self.dropped and self.poisoned is None

    def outcome(self) -> Outcome:
        if self.poisoned is not None:
            return Outcome(None, self.poisoned, _NO_ROW)
        if self.dropped:
            return Outcome(None, None, _NO_ROW, self.reason)
        meta = self.doc.meta
        return Outcome(self.doc.text, None,
                       (tuple(meta[k] for k in META_COLUMNS), self.signals))


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
        self.last: tuple[tuple[Any, ...], dict[str, Any]] = _NO_ROW
        #: the last document dropped: ``(step, reason)``, for the lineage's drop record
        self.last_drop: tuple[str, str] | None = None

    def warm_up(self) -> None:
        """Load what steps load on first use (a parser, a model) before the first record, so
        that a record's CPU time is its own."""
        for link in self.links:
            warm = getattr(link.step, "warm_up", None)
            if warm is not None:
                warm()

    @property
    def batched(self) -> bool:
        """Whether a step has a ``batch`` method (phase 1 then hands it documents in groups)."""
        return any(link.batch is not None for link in self.links)

    def __call__(self, document: Document) -> str | None:
        """The document's text after every step, or ``None`` when one drops it (what
        :meth:`run` gives for a list of one, without building the lists)."""
        state = _State(_doc(document))
        for link in self.links:
            try:
                out = link.step(state.doc)
            except StepError:
                raise
            except Exception as exc:
                out = _Raised(exc)
            self._settle(link, state, out)
            if state.dropped:
                self.last_drop = state.reason
                return None
            if state.poisoned is not None:
                raise state.poisoned
        meta = state.doc.meta
        self.last = (tuple(meta[k] for k in META_COLUMNS), state.signals)
        return state.doc.text

    def settle(self, outcome: Outcome) -> str | None:
        """One document's :class:`Outcome` as :meth:`__call__` gives it: its row becomes
        :attr:`last`; a poisoned document raises."""
        if outcome.poisoned is not None:
            raise outcome.poisoned
        if outcome.text is not None:
            self.last = outcome.row
        else:
            self.last_drop = outcome.dropped
        return outcome.text

    def run(self, documents: list[Document]) -> list[Outcome]:
        """Every document through the steps, in order; one :class:`Outcome` each."""
        states = [_State(_doc(d)) for d in documents]
        for link in self.links:
            alive = [s for s in states if s.live]
            if not alive:
                break
            for state, out in zip(alive, self._apply(link, alive), strict=True):
                self._settle(link, state, out)
        return [s.outcome() for s in states]

    def _apply(self, link: _Link, alive: list[_State]) -> list[Any]:
        """``link``'s results for the documents in ``alive``: by its ``batch`` method when it
        has one and there is more than one document, else (or when the batch raised) one
        document at a time, a raised exception standing for that document's result."""
        if link.batch is not None and len(alive) > 1:
            texts = [s.doc.text for s in alive]
            try:
                outs = list(link.batch([s.doc for s in alive]))
            except StepError:
                raise
            except Exception:
                outs = None
                for state, text in zip(alive, texts, strict=True):
                    state.doc.text, state.doc.signals = text, {}
            if outs is not None:
                if len(outs) != len(alive):
                    raise StepError(f"step {link.name!r}'s batch returned {len(outs)} results "
                                    f"for {len(alive)} documents: one result a document")
                return outs
        results: list[Any] = []
        for state in alive:
            try:
                results.append(link.step(state.doc))
            except StepError:
                raise
            except Exception as exc:
                results.append(_Raised(exc))
        return results

    def _settle(self, link: _Link, state: _State, out: Any) -> None:
        """Read one step's result for one document: kept (its signals taken, its text
        checked), dropped (counted) or poisoned."""
        doc = state.doc
        before = state.text
        if type(out) is _Raised:
            exc = out.exc
            state.poisoned = exc if isinstance(exc, Poisoned) else Poisoned(
                f"{link.name}.error", f"{type(exc).__name__}: {exc}"[:500])
            return
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
                state.signals[f"{link.name}.{key}"] = value
            doc.signals = {}
        if link.annotate_user:
            doc.text = before
            state.signals[f"{link.name}.{DROP_SIGNAL}"] = reason
            return
        if reason:
            self.dropped[reason] += 1
            state.dropped = True
            state.reason = (link.name, reason)
            return
        if doc.text is not before:
            if not isinstance(doc.text, str):
                raise StepError(f"step {link.name!r} set the text to a "
                                f"{type(doc.text).__name__}, not a str")
            if not link.builtin and doc.text != before:
                self._changed[link.name] += 1
            state.text = doc.text

    @property
    def changed(self) -> Counter[str]:
        out = Counter(self._changed)
        for link in self.links:
            own = getattr(link.step, "changed", None) if link.builtin else None
            if own:
                out.update(own)
        return out

    def reports(self) -> dict[str, dict[str, Any]]:
        """The built-in steps' reports (``report()``, see :mod:`pipeline.steps.contract`) by
        step name, empty ones left out."""
        out: dict[str, dict[str, Any]] = {}
        for link in self.links:
            report = getattr(link.step, "report", None) if link.builtin else None
            if callable(report):
                found = report()
                if found:
                    out[link.name] = found
        return out

    def columns(self) -> Columns:
        """A column gatherer for this chain's shard."""
        return Columns(self.recipe.metadata, self.declared)

    def close(self) -> None:
        for link in self.links:
            close = getattr(link.step, "close", None)
            if close is not None:
                close()
