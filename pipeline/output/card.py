"""The dataset card of a version: ``card/<manifest sha16>/README.md`` and its PNGs, built from
the version (its manifest, a sample of its shards' columns, ``contamination.json``) and put
on the store beside it.

Why keyed by the manifest's sha16 (the tag its ``_versions/`` record carries) and not named
by the manifest: the card describes the manifest, so the manifest cannot name it without
the card depending on itself; and a default run's manifest keeps its bytes. So versions stay
immutable (a rebuild's card goes under its own manifest's tag, never over the live one's),
``storage gc`` keeps the card of every version it keeps and removes the others
(:mod:`storage.admin.gc`), and ``verify``/``repair`` ignore it (it names no object a reader
trusts). ``python -m pipeline card`` rewrites the current version's card in place: its bytes
are a function of the version (and of ``contamination.json``), so a rebuild writes the same
bytes unless the code or the report changed.

Parts: :mod:`pipeline.output.card_figures` (the numbers, pure), :mod:`pipeline.output.
card_markdown` (the text, pure), :mod:`pipeline.output.card_plots` (the pictures); here the
reading (one evenly spaced sample of documents for every column figure: their token counts
from ``input_ids``' offsets, ``lang``, the signal columns; ``signal_summary.read_columns``)
and the writes (the store's put, README last, so a README means a complete card).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import pyarrow as pa

from pipeline.output import card_figures, card_markdown, card_plots
from pipeline.output import signal_summary as sig
from storage import Manifest, ReplicaSet, display_url, tokens
from storage.format.checksums import digest_bytes
from storage.format.layout import card_name, safe_relative

README = "README.md"
#: the decontamination report a run may leave in the dataset (read leniently, bounded)
REPORT = "contamination.json"
REPORT_MAX_BYTES = 8 << 20
#: documents whose columns (token counts, ``lang``, signals) the figures are drawn from
DEFAULT_SAMPLE_ROWS = 100_000


@dataclass(frozen=True)
class Card:
    """A version's card: its files by name (``README.md`` and the PNGs) and, without
    pictures, why."""

    version: str  # the manifest's sha256
    files: dict[str, bytes]
    text_only: str | None
    sampled: int

    @property
    def readme(self) -> str:
        return card_name(self.version, README)

    @property
    def pictures(self) -> list[str]:
        return [n for n in self.files if n != README]

    def describe(self) -> str:
        pics = (f"{len(self.pictures)} pictures" if self.pictures
                else f"text only: {self.text_only}")
        return f"{self.readme} ({len(self.files[README]):,} bytes; {pics})"


def version_of(manifest: Manifest) -> str:
    """The sha256 of the manifest's bytes as committed (``to_json`` is canonical: a manifest
    read back re-serialises to the bytes it was read from)."""
    return digest_bytes(manifest.to_json().encode("utf-8"))


def title_of(url: str) -> str:
    """The dataset's folder name, the card's title."""
    return display_url(url).rstrip("/").rsplit("/", 1)[-1] or display_url(url)


@dataclass(frozen=True)
class Report:
    """``contamination.json``: its content (``None``: absent or unreadable) and, when it
    cannot be used, why (the card says so rather than failing)."""

    content: Any = None
    problem: str | None = None


def read_report(store: ReplicaSet, manifest: Manifest) -> Report:
    """The decontamination report of this version: the one ``stats.contamination`` names
    (``pipeline.output.contamination``: ``report``, its ``sha256``; ``contamination/<sha16>.json``,
    or the root's ``contamination.json`` in datasets written before reports were versioned),
    read to a bound (it is untrusted input) and checked against that sha256 (the root file is
    whichever run wrote it last). Nothing recorded: no report, whatever file lies there."""
    recorded = manifest.stats.get("contamination")
    if not isinstance(recorded, dict):
        return Report()
    name, sha = recorded.get("report", REPORT), recorded.get("sha256")
    label = REPORT  # what the messages call it: the manifest's name once it is a safe one
    try:
        label = path = safe_relative(name) if isinstance(name, str) else REPORT
        data = store.get(path, start=0, end=REPORT_MAX_BYTES + 1)
    except FileNotFoundError:
        return Report(problem=f"{label}, which the manifest names, is missing")
    except (OSError, ValueError) as exc:
        return Report(problem=f"{label} cannot be read ({type(exc).__name__})")
    if len(data) > REPORT_MAX_BYTES:
        return Report(problem=f"{label} is larger than {REPORT_MAX_BYTES:,} bytes; not read")
    if isinstance(sha, str) and digest_bytes(data) != sha:
        return Report(problem=f"{label} is not this version's (its sha256 is not the one the "
                              "manifest records: a later run's, or damaged); not read")
    try:
        return Report(json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError):
        return Report(problem=f"{label} is not JSON; not read")


def _token_counts(encoding: str) -> Any:
    def convert(table: pa.Table) -> pa.Table:
        if "input_ids" not in table.column_names:
            return table
        counts = tokens.lengths(table.column("input_ids"), encoding)
        return table.drop_columns(["input_ids"]).append_column(
            card_figures.TOKENS, pa.array(counts, type=pa.int64()))
    return convert


def sample(store: ReplicaSet, manifest: Manifest, rows: int = DEFAULT_SAMPLE_ROWS
           ) -> tuple[dict[str, pa.ChunkedArray], sig.SignalSample]:
    """One evenly spaced sample of at most ``rows`` documents: their token counts, ``lang``
    (a web run's), and every signal column; only those columns' bytes are read."""
    signals = sig.signal_columns(manifest)
    types: dict[str, pa.DataType] = {card_figures.TOKENS: pa.int64()}
    if card_figures.LANG in manifest.schema:
        types[card_figures.LANG] = pa.string()
    types |= {c: sig.arrow_type(v["type"]) for c, v in signals.items()}
    reads = ["input_ids", *(c for c in types if c != card_figures.TOKENS)]
    columns, read = sig.read_columns(store, manifest, types, rows,
                                     convert=_token_counts(manifest.schema["input_ids"]),
                                     source_columns=reads)
    sample_ = sig.SignalSample({c: columns[c] for c in signals}, read, manifest.total_rows,
                               {c: v["type"] for c, v in signals.items()},
                               {c: v["step"] for c, v in signals.items()})
    return columns, sample_


def build(store: ReplicaSet, manifest: Manifest, rows: int = DEFAULT_SAMPLE_ROWS,
          report: Report | None = None) -> Card:
    """The card of ``manifest`` (a version of the dataset at ``store``) from a sample of at
    most ``rows`` documents and the decontamination ``report`` (:func:`read_report`;
    ``None``: none). The card names the dataset by its primary replica's URL as the store
    resolves it (absolute, no credentials), so the job, ``pipeline card`` and ``export``
    write the same text however the URL was spelled."""
    report = report or Report()
    url = store.replicas[0].loc.url
    version = version_of(manifest)
    columns, signal_sample = sample(store, manifest, rows)
    figures = card_figures.gather(manifest, version, title_of(url), columns,
                                  signal_sample.rows, report.content, report.problem)
    lines = sig.render(signal_sample.summaries(), signal_sample.rows,
                       signal_sample.documents) if figures.signals else []
    why = card_plots.available()
    pictures: dict[str, bytes] = {}
    if why is None:
        title = title_of(url)
        shown = _plotted(signal_sample)
        pictures = card_plots.draw(figures, (lambda buf: sig.plot(shown, buf, title))
                                   if shown.columns else None)
    order = [n for n in card_markdown.PICTURES if n in pictures]
    text = card_markdown.render(figures, order, display_url(url), lines, why)
    files = {README: text.encode("utf-8"), **{n: pictures[n] for n in order}}
    return Card(version, files, why, signal_sample.rows)


#: signal columns the card draws no histogram of: an id says nothing as a distribution
NOT_PLOTTED = ("dedup.cluster_id",)


def _plotted(sample_: sig.SignalSample) -> sig.SignalSample:
    keep = [c for c in sample_.columns if c not in NOT_PLOTTED]
    return sig.SignalSample({c: sample_.columns[c] for c in keep}, sample_.rows,
                            sample_.documents, {c: sample_.types[c] for c in keep},
                            {c: sample_.steps[c] for c in keep})


def write(store: ReplicaSet, card: Card) -> list[str]:
    """Put the card's files (pictures first, ``README.md`` last) under ``card/<sha16>/``,
    removing pictures an earlier card of the version had and this one has not (a rebuild
    without matplotlib); returns the replicas any put missed (recorded for ``storage
    repair`` by the put)."""
    missed: list[str] = []
    for name in card.pictures:
        missed += store.put(card_name(card.version, name), card.files[name])
    for name in card_markdown.PICTURES:
        if name not in card.files:
            store.delete(card_name(card.version, name))
    missed += store.put(card_name(card.version, README), card.files[README])
    return sorted(set(missed))


def write_at_commit(store: ReplicaSet, manifest: Manifest, log: TextIO) -> None:
    """What the job does before its commit: build and put the card of the version it is about
    to commit, saying where and how long it took. A card that cannot be made never stops
    a commit: one warning line, and ``python -m pipeline card`` makes it later."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        # as readers will see it: read back from its bytes (its dicts in the JSON's sorted
        # order, not the order the run filled them in), so `pipeline card` writes the same
        manifest = Manifest.from_json(manifest.to_json())
        card = build(store, manifest, report=read_report(store, manifest))
        write(store, card)
    except Exception as exc:  # the dataset matters more than its card
        print(f"shardflow: warning: the dataset card was not written ({type(exc).__name__}: "
              f"{exc}); `python -m pipeline card` writes it", file=log)
        return
    print(f"card: {card.describe()} in {time.perf_counter() - start:.2f} s "
          f"({time.process_time() - cpu:.2f} s CPU)", file=log)


@dataclass(frozen=True)
class CardSummary:
    url: str
    card: Card
    wall_s: float
    missed: tuple[str, ...] = ()

    def render(self) -> str:
        lines = [f"card of {self.url}: {self.card.describe()}",
                 f"  from {self.card.sampled:,} documents' columns in {self.wall_s:.2f} s"]
        if self.missed:
            lines.append(f"  degraded: {', '.join(self.missed)} missed a write; run python -m "
                         "storage repair")
        return "\n".join(lines)


def rebuild(store: ReplicaSet, url: str, rows: int = DEFAULT_SAMPLE_ROWS, wait: bool = False,
            log: TextIO | None = None) -> CardSummary:
    """``python -m pipeline card``: the current version's card, built and written under the
    dataset's writer lease (the writes of a dataset are one writer's at a time)."""
    from storage.io.replicas.leases import hold_replicas

    if rows < 0:
        raise ValueError(f"--sample-rows must be 0 or more, not {rows}")
    start = time.perf_counter()
    lease = hold_replicas(store, "card", wait=wait, log=log or sys.stderr)
    try:
        manifest = store.read_manifest()
        card = build(store, manifest, rows, read_report(store, manifest))
        lease.check()
        missed = write(store, card)
    finally:
        lease.release()
    return CardSummary(display_url(url), card, time.perf_counter() - start, tuple(missed))


def hub_readme(card: Card, front_matter: str) -> bytes:
    """The card as a Hub folder's ``README.md``: ``front_matter`` (the YAML block that tells
    ``datasets`` where the files are) before it."""
    return front_matter.encode("utf-8") + card.files[README]

