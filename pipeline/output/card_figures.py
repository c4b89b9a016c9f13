"""The dataset card's figures, gathered from what a version already records (pure).

Why apart from reading and rendering: every number the card shows comes from here, from the
manifest's stats and config and from column samples handed in, so a test checks the numbers
without a store, matplotlib or Markdown, and the card text and its pictures can never
disagree (both draw from one :class:`Figures`).

Where each figure comes from:

- documents through the steps (:func:`flow`): ``stats.documents_in``, each drop reason of
  ``stats.dropped`` and quarantine reason of ``stats.quarantined`` put on the recipe step
  (``config.steps``) that counts it (``<name>`` or ``<name>.<reason>``; the built-ins' bare
  reason names through :data:`BARE_REASONS`), dedup's ``duplicate``/``near_duplicate`` after
  the steps, ``stats.documents_out`` and ``stats.tokens`` at the end. Tokens exist only after
  the last step (the steps see text), so tokens are given in and out of tokenizing only;
- languages: the ``lang`` column's values; lengths: tokens per document (the ``input_ids``
  offsets of the sampled row groups, never the ids themselves); near-duplicate clusters: the
  ``dedup.cluster_size`` column; all three from the same evenly spaced sample of documents;
- decontamination: the manifest's ``decontaminate.<set>`` counts and ``contamination.json``
  (whatever its writer puts there: read leniently, see :func:`contamination`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storage import Manifest

#: the built-in steps' reasons that carry no ``<name>.`` prefix (they kept their names from
#: before steps), by the ``use`` of the step that counts them
BARE_REASONS: dict[str, tuple[str, ...]] = {
    "clean": ("empty", "too_short", "too_long", "low_alpha", "repeated_lines"),
    "url_blocklist": ("url_blocked",),
    "extract": ("not_html", "extract_failed", "extract_empty", "extract_too_complex"),
    "langid": ("language", "lang_score"),
    "length": ("too_few_words", "too_many_words"),
}
#: dedup's drop reasons (the shuffle, after every step)
DEDUP_REASONS = ("duplicate", "near_duplicate")
#: the prefix of decontamination's drop reasons: ``decontaminate.<eval set>``
DECONTAMINATE = "decontaminate"
#: percentiles of tokens per document the card lists
PERCENTILES = (1, 10, 25, 50, 75, 90, 99)
#: languages and drop reasons listed by name (the rest are summed as "other")
TOP_LANGUAGES = 20
TOP_CLUSTER_SIZES = 15


@dataclass(frozen=True)
class Stage:
    """One row of the documents' way through the dataset: ``docs_in`` reached it, ``dropped``
    and ``quarantined`` (by ``reasons``) did not pass it, ``docs_out`` did."""

    name: str
    kind: str
    docs_in: int
    dropped: int = 0
    quarantined: int = 0
    reasons: tuple[tuple[str, int], ...] = ()

    @property
    def docs_out(self) -> int:
        return self.docs_in - self.dropped - self.quarantined


@dataclass(frozen=True)
class Flow:
    """Documents read, the stages in order, and what the manifest says came out; ``gap`` is
    ``documents_out`` minus what the stages leave (0 when every count is attributed)."""

    documents_in: int
    stages: tuple[Stage, ...]
    documents_out: int
    tokens: int

    @property
    def gap(self) -> int:
        left = self.stages[-1].docs_out if self.stages else self.documents_in
        return self.documents_out - left


@dataclass(frozen=True)
class Lengths:
    """Tokens per document over ``documents`` sampled: percentiles, min, max, mean, and a
    histogram (``edges`` log-spaced, ``counts``) for the picture."""

    documents: int
    minimum: int = 0
    maximum: int = 0
    mean: float = 0.0
    percentiles: tuple[tuple[int, float], ...] = ()
    edges: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set's decontamination: documents dropped (or flagged) in the manifest,
    and what the report adds (documents hit, n-grams matched, a few examples)."""

    name: str
    dropped: int | None = None
    documents: int | None = None
    ngrams: int | None = None
    examples: tuple[str, ...] = ()
    #: examples in the evaluation set (the report's ``eval_examples``)
    eval_examples: int | None = None


@dataclass(frozen=True)
class Figures:
    """Everything the card says, as numbers and short strings."""

    title: str
    version: str  # the manifest's sha256
    format: str
    documents: int
    tokens: int
    bytes: int
    shards: int
    row_groups: int
    tokenizer: dict[str, Any]
    flow: Flow | None  # None: a view (its documents were chosen by select, not steps)
    dropped: tuple[tuple[str, str, int], ...]  # reason, stage, documents
    quarantined: tuple[tuple[str, str, int], ...]
    changed: tuple[tuple[str, int], ...]
    sampled: int  # documents the column figures are from
    languages: tuple[tuple[str, int, int], ...] | None  # lang, documents, tokens
    lengths: Lengths
    clusters: tuple[tuple[int, int], ...] | None  # cluster size, kept documents (clusters)
    exact_counts: tuple[tuple[int, int], ...] | None
    signals: tuple[str, ...]  # the signal columns (their summaries: signal_summary)
    decontamination: tuple[EvalSet, ...] | None
    recipe: tuple[dict[str, Any], ...]
    config: dict[str, Any] = field(default_factory=dict)
    view: dict[str, Any] | None = None
    #: why ``contamination.json`` could not be used (``None``: absent, or used)
    report_problem: str | None = None


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def _counts(d: Any) -> dict[str, int]:
    """A ``{reason: count}`` of the manifest (untrusted: non-int counts read as 0)."""
    return {str(k): _int(v) for k, v in d.items()} if isinstance(d, dict) else {}


def stage_of(reason: str, steps: Sequence[Mapping[str, Any]]) -> str:
    """The stage that counts ``reason``: the recipe step it names (``<name>`` or
    ``<name>.<reason>``), the first step whose built-in claims a bare reason, ``dedup`` for
    dedup's, ``decontaminate`` for decontamination's; else the reason's prefix, or
    ``other``."""
    head = reason.split(".", 1)[0]
    names = [str(s.get("name")) for s in steps]
    if head in names:
        return head
    for s in steps:
        if reason in BARE_REASONS.get(str(s.get("use")), ()):
            return str(s.get("name"))
    if reason in DEDUP_REASONS:
        return "dedup"
    if head == DECONTAMINATE:
        return DECONTAMINATE
    for use, reasons in BARE_REASONS.items():  # a step the recipe does not list (old runs)
        if reason in reasons:
            return use
    return head if head != reason else "other"


def flow(stats: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], dedup: str) -> Flow:
    """The documents' way: read (the quarantines no step counts), each recipe step in order,
    any stage a reason names that the recipe does not (decontamination, an old run's
    built-ins), dedup, in that order."""
    dropped = _counts(stats.get("dropped"))
    quarantined = _counts(stats.get("quarantined"))
    names = [str(s.get("name")) for s in steps]
    by_stage: dict[str, list[tuple[str, int, bool]]] = {}
    for reasons, is_drop in ((dropped, True), (quarantined, False)):
        for reason, n in reasons.items():
            stage = stage_of(reason, steps)
            if not is_drop and stage not in names:
                stage = "read"  # the reader's and the record limits' quarantines
            by_stage.setdefault(stage, []).append((reason, n, is_drop))
    order = ["read", *names]
    order += sorted(s for s in by_stage if s not in order and s not in ("dedup", "other"))
    order += [s for s in ("other", "dedup") if s in by_stage or s == "dedup"]
    kinds = {str(s.get("name")): f"{s.get('use')} v{s.get('version')}, {s.get('mode')}"
             for s in steps}
    kinds |= {"read": "reader", "dedup": f"dedup {dedup}", DECONTAMINATE: "decontamination",
              "other": "not attributed"}
    stages = []
    left = _int(stats.get("documents_in"))
    for name in order:
        found = by_stage.get(name, [])
        d = sum(n for _, n, drop in found if drop)
        q = sum(n for _, n, drop in found if not drop)
        reasons = tuple(sorted(((r, n) for r, n, _ in found), key=lambda rn: (-rn[1], rn[0])))
        stage = Stage(name, kinds.get(name, "step"), left, d, q, reasons)
        stages.append(stage)
        left = stage.docs_out
    return Flow(_int(stats.get("documents_in")), tuple(stages),
                _int(stats.get("documents_out")), _int(stats.get("tokens")))


def reasons_table(counts: Mapping[str, Any], steps: Sequence[Mapping[str, Any]],
                  quarantine: bool = False) -> tuple[tuple[str, str, int], ...]:
    """``(reason, stage, count)``, most first (ties by reason); a quarantine no step counts
    is the reader's (``read``), as in :func:`flow`."""
    names = {str(s.get("name")) for s in steps}

    def stage(reason: str) -> str:
        found = stage_of(reason, steps)
        return "read" if quarantine and found not in names else found

    return tuple(sorted(((r, stage(r), n) for r, n in _counts(counts).items()),
                        key=lambda t: (-t[2], t[0])))


def languages(lang: Sequence[Any], lengths: Sequence[int] | None = None
              ) -> tuple[tuple[str, int, int], ...]:
    """``(lang, documents, tokens)`` most documents first (ties by name); a null is
    ``"(none)"``; past :data:`TOP_LANGUAGES` the rest summed as ``"(other)"``. ``tokens`` is
    0 without ``lengths``."""
    docs: Counter[str] = Counter()
    toks: Counter[str] = Counter()
    for i, v in enumerate(lang):
        key = "(none)" if v is None else str(v)
        docs[key] += 1
        if lengths is not None:
            toks[key] += int(lengths[i])
    ranked = sorted(docs, key=lambda k: (-docs[k], k))
    out = [(k, docs[k], toks[k]) for k in ranked[:TOP_LANGUAGES]]
    rest = ranked[TOP_LANGUAGES:]
    if rest:
        out.append(("(other)", sum(docs[k] for k in rest), sum(toks[k] for k in rest)))
    return tuple(out)


def lengths(values: Sequence[int] | np.ndarray, bins: int = 40) -> Lengths:
    """The length figures of tokens-per-document ``values`` (histogram bins log-spaced from
    the shortest to past the longest, as lengths span orders of magnitude, on whole numbers
    so no bin falls between two lengths and shows a false gap)."""
    x = np.asarray(values, dtype=np.int64)
    if len(x) == 0:
        return Lengths(0)
    lo = float(max(1, int(x.min())))
    hi = max(lo + 1, float(x.max()) + 1)
    edges = np.unique(np.ceil(np.geomspace(lo, hi, bins + 1)))
    counts, _ = np.histogram(np.maximum(x, 1), bins=edges)
    pct = tuple((p, float(np.percentile(x, p))) for p in PERCENTILES)
    return Lengths(len(x), int(x.min()), int(x.max()), float(x.mean()), pct,
                   tuple(float(e) for e in edges), tuple(int(c) for c in counts))


def size_counts(values: Sequence[Any] | np.ndarray) -> tuple[tuple[int, int], ...]:
    """``(size, kept documents with it)`` by size; nulls left out."""
    c = Counter(int(v) for v in values if v is not None)
    return tuple(sorted(c.items()))


def contamination(stats: Mapping[str, Any], report: Any) -> tuple[EvalSet, ...] | None:
    """Each evaluation set's hits: ``decontaminate.<set>`` drop counts of ``stats.dropped``,
    the documents found per ``<step>.<set>`` of ``stats.contamination.documents`` (filter
    and annotate mode alike), and a ``contamination.json`` ``report`` read leniently:
    ``{"sets": {name: {...}}}``, ``{name: {...}}``, ``{step: {name: {...}}}`` or
    ``[{"name": ..., ...}]``, each set's documents hit under ``documents`` (or
    ``documents_hit``, ``hits``), n-grams under ``ngrams`` (or ``matched_ngrams``,
    ``ngrams_matched``), and up to three examples from ``examples`` (strings, or dicts
    whose ``ngrams``/``matched``/``text`` say what matched, with their ``id``).
    ``None``: no decontamination recorded."""
    dropped: dict[str, int] = {}
    for reason, n in _counts(stats.get("dropped")).items():
        head, _, name = reason.partition(".")
        if head == DECONTAMINATE and name:
            dropped[name] = dropped.get(name, 0) + n
    found: dict[str, int] = {}
    recorded = stats.get("contamination")
    if isinstance(recorded, dict):
        for key, n in _counts(recorded.get("documents")).items():
            name = key.partition(".")[2] or key
            found[name] = found.get(name, 0) + n
    sets = _report_sets(report)
    if not dropped and not found and not sets:
        return None
    out = []
    for name in sorted(set(dropped) | set(found) | set(sets)):
        d = sets.get(name, {})
        hit = _first_int(d, ("documents", "documents_hit", "hits", "docs"))
        out.append(EvalSet(name, dropped.get(name), hit if hit is not None else found.get(name),
                           _first_int(d, ("ngrams", "matched_ngrams", "ngrams_matched")),
                           tuple(_example(e) for e in _list(d.get("examples"))[:3]),
                           _first_int(d, ("eval_examples",))))
    return tuple(out)


_SET_KEYS = ("documents", "documents_hit", "hits", "docs", "examples", "ngrams")


def _report_sets(report: Any) -> dict[str, dict[str, Any]]:
    """The report's sets by name, whichever of the shapes :func:`contamination` reads, the
    run's own first (``{"format": "shardflow.contamination/1", "steps": {step: {"sets":
    {name: {...}}}}}``: :mod:`pipeline.output.contamination`)."""
    if isinstance(report, dict) and isinstance(report.get("steps"), dict):
        out: dict[str, dict[str, Any]] = {}
        for entry in report["steps"].values():
            if isinstance(entry, dict) and isinstance(entry.get("sets"), dict):
                out.update({str(n): d for n, d in entry["sets"].items() if isinstance(d, dict)})
        return out
    inner = report.get("sets", report.get("eval_sets", report)) if isinstance(report, dict) \
        else report
    if isinstance(inner, list):
        return {str(v.get("name", i)): v for i, v in enumerate(inner) if isinstance(v, dict)}
    if not isinstance(inner, dict):
        return {}
    sets: dict[str, dict[str, Any]] = {}
    for k, v in inner.items():
        if not isinstance(v, dict):
            continue
        if any(key in v for key in _SET_KEYS) or not v:
            sets[str(k)] = v
        else:  # one level per step: {step: {set: {...}}}
            sets.update({str(n): d for n, d in v.items() if isinstance(d, dict)})
    return sets


def _first_int(d: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, list):  # a list of hits: its length
            return len(v)
    return None


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _example(e: Any) -> str:
    if isinstance(e, dict):
        for k in ("ngrams", "matched", "matched_ngrams", "ngram", "text"):
            if k in e:
                v = e[k]
                text = " | ".join(map(str, v[:3])) if isinstance(v, list) else str(v)
                doc = e.get("doc_id", e.get("document", e.get("id")))
                return f"{doc}: {text}" if doc is not None else text
        return str(e)
    return str(e)


#: the columns the card samples: a web run's language, dedup's cluster size and exact count
LANG, CLUSTER_SIZE, EXACT_COUNT = "lang", "dedup.cluster_size", "dedup.exact_count"
#: the tokens-per-document column the card's reader makes of ``input_ids``
TOKENS = "tokens"


def gather(manifest: Manifest, version: str, title: str, columns: Mapping[str, Any],
           sampled: int, report: Any = None, report_problem: str | None = None) -> Figures:
    """The card's figures of ``manifest`` (whose bytes have sha256 ``version``) from the
    sampled ``columns`` (``tokens`` per document; ``lang``, ``dedup.cluster_size``,
    ``dedup.exact_count`` where the dataset has them: pyarrow arrays or sequences, one value
    per sampled document) and the ``contamination.json`` ``report`` (``None``: none)."""
    st = manifest.stats
    cfg = manifest.config if isinstance(manifest.config, dict) else {}
    steps = [s for s in cfg.get("steps") or [] if isinstance(s, dict)]
    toks = _ints(columns.get(TOKENS))
    lang = columns.get(LANG)
    lang_values = lang.to_pylist() if hasattr(lang, "to_pylist") else lang
    view = None
    if manifest.view is not None:
        v = manifest.view
        view = {"source": v.source, "source_version": v.source_version, "where": v.where,
                "source_rows": v.source_rows, "source_tokens": v.source_tokens}
    dedup = str(cfg.get("dedup", "exact")) + (" + near-dup" if cfg.get("near_dup") else "")
    counts = manifest.counts
    return Figures(
        title=title, version=version, format=manifest.format,
        documents=manifest.total_rows, tokens=manifest.total_tokens,
        bytes=manifest.total_bytes, shards=counts.shards, row_groups=counts.row_groups,
        tokenizer={"name": manifest.tokenizer.name, "vocab_size": manifest.vocab_size,
                   "eos_id": manifest.eos_id, "eos_token": manifest.tokenizer.eos_token},
        flow=None if view is not None else flow(st, steps, dedup),
        dropped=reasons_table(st.get("dropped") or {}, steps),
        quarantined=reasons_table(st.get("quarantined") or {}, steps, quarantine=True),
        changed=tuple(sorted(_counts(st.get("changed")).items(),
                             key=lambda rn: (-rn[1], rn[0]))),
        sampled=sampled,
        languages=None if lang_values is None else languages(lang_values, toks),
        lengths=lengths(toks if toks is not None else []),
        clusters=(None if columns.get(CLUSTER_SIZE) is None
                  else size_counts(_ints(columns[CLUSTER_SIZE], nulls=True) or [])),
        exact_counts=(None if columns.get(EXACT_COUNT) is None
                      else size_counts(_ints(columns[EXACT_COUNT], nulls=True) or [])),
        signals=tuple((st.get("signals") or {}).keys()),
        decontamination=contamination(st, report),
        recipe=tuple(steps), config=cfg, view=view, report_problem=report_problem)


def _ints(values: Any, nulls: bool = False) -> Any:
    """A column's values as a list (``nulls``: ``None`` kept) or an int64 array."""
    if values is None:
        return None
    if nulls:
        return values.to_pylist() if hasattr(values, "to_pylist") else list(values)
    if hasattr(values, "to_numpy"):
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64) \
            if hasattr(values, "null_count") and values.null_count == 0 else \
            np.asarray([v for v in values.to_pylist() if v is not None], dtype=np.int64)
    return np.asarray(list(values), dtype=np.int64)
