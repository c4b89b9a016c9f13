"""``python -m pipeline inspect``'s signals section: what the steps' signal columns hold.

Three parts, kept apart:

- pure summaries of one column's values (:func:`summarize`): numeric (``int64``, ``double``):
  min / median / max, nulls and NaNs counted, never summarised; ``bool``: the share true;
  ``string``: the most common values with their counts (ties by value). Their text lines
  (:func:`render`) and JSON (:func:`to_json`). :func:`sample_plan` chooses which row groups to
  read, deterministically and evenly spaced, for at most a given number of rows;
- reading (:func:`read_signals`): only the signal columns of the chosen row groups, one
  ranged read per row group under the shard's footer (fetched and checked against the
  ``footer_sha256`` the index records; a shard without one is read whole and checked
  against its sha256). The signal column chunks themselves have no digest of their own:
  a summary is for looking, the shards' checks are ``storage verify``'s;
- a plot (:func:`plot`): one panel per signal in a grid, matplotlib's Agg backend, imported
  only when a plot is asked for (matplotlib comes with the ``plot`` extra).

A column a shard lacks (possible for a user's step) reads as nulls for that shard's rows.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage import Manifest, ReplicaSet, ShardInfo, shards_of, tokens
from storage.io.range_file import RangeFile
from storage.io.view_store import read_masks, source_store

NUMERIC = ("int64", "double")
TYPES = ("int64", "double", "bool", "string")
#: string values shown per column in the text and JSON (the plot shows ``PLOT_TOP``)
TOP = 5
PLOT_TOP = 10
DEFAULT_ROWS = 1_000_000
_ARROW = {"int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
          "string": pa.string()}


# -- pure: one column's summary ---------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    """One signal column over the rows read: ``rows`` values, ``nulls`` of them null."""

    column: str
    type: str
    step: str
    rows: int = 0
    nulls: int = 0
    #: numeric: NaNs (doubles), left out of min / median / max like the nulls
    nans: int = 0
    minimum: int | float | None = None
    median: float | None = None
    maximum: int | float | None = None
    #: bool: how many are true and false
    true: int = 0
    false: int = 0
    #: string: the most common values, ``(value, count)``, most common first, ties by value
    top: tuple[tuple[str, int], ...] = ()
    distinct: int = 0

    @property
    def true_share(self) -> float | None:
        known = self.true + self.false
        return self.true / known if known else None


def _values(values: pa.Array | pa.ChunkedArray | Sequence[Any], kind: str) -> pa.ChunkedArray:
    if isinstance(values, pa.ChunkedArray):
        out = values
    elif isinstance(values, pa.Array):
        out = pa.chunked_array([values])
    else:
        out = pa.chunked_array([pa.array(list(values), type=_ARROW.get(kind))],
                               type=_ARROW.get(kind))
    want = _ARROW.get(kind)
    return out if want is None or out.type == want else out.cast(want)


def numeric_summary(values: pa.Array | pa.ChunkedArray | Sequence[Any],
                    kind: str = "double") -> dict[str, Any]:
    """``{"nulls", "nans", "min", "median", "max"}`` of an ``int64`` or ``double`` column:
    nulls and NaNs are counted and left out; the median interpolates between the two middle
    values (numpy's); ``None`` for all three when no value is left. ``int64``'s min and max
    stay ints."""
    col = _values(values, kind)
    nans = int(pc.sum(pc.is_nan(col)).as_py() or 0) if pa.types.is_floating(col.type) else 0
    left = len(col) - col.null_count - nans
    if left == 0:
        return {"nulls": col.null_count, "nans": nans, "min": None, "median": None,
                "max": None}
    lo_hi = pc.min_max(col)  # Arrow's min/max and quantile skip nulls and NaNs
    median = pc.quantile(col, q=0.5, interpolation="linear")[0].as_py()
    return {"nulls": col.null_count, "nans": nans, "min": lo_hi["min"].as_py(),
            "median": float(median), "max": lo_hi["max"].as_py()}


def bool_summary(values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> dict[str, int]:
    """``{"true", "false", "nulls"}`` of a ``bool`` column."""
    col = _values(values, "bool")
    true = int(pc.sum(col.cast(pa.int64())).as_py() or 0)
    return {"true": true, "false": len(col) - col.null_count - true, "nulls": col.null_count}


def top_values(values: pa.Array | pa.ChunkedArray | Sequence[Any],
               k: int = TOP) -> tuple[list[tuple[str, int]], int, int]:
    """The ``k`` most common non-null values of a ``string`` column with their counts (most
    common first, ties by value), the number of distinct values and of nulls."""
    col = _values(values, "string")
    counts = pc.value_counts(col.drop_null())
    pairs = sorted(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(),
                       strict=True), key=lambda vc: (-vc[1], vc[0]))
    return [(v, int(c)) for v, c in pairs[:k]], len(pairs), col.null_count


def summarize(column: str, kind: str, step: str,
              values: pa.Array | pa.ChunkedArray | Sequence[Any], k: int = TOP) -> Summary:
    """The summary of one signal column's values, by its type (``int64``, ``double``,
    ``bool``, ``string``; another type gets only its row and null counts)."""
    col = _values(values, kind)
    base = {"column": column, "type": kind, "step": step, "rows": len(col),
            "nulls": col.null_count}
    if kind in NUMERIC:
        s = numeric_summary(col, kind)
        return Summary(**base, nans=s["nans"], minimum=s["min"], median=s["median"],
                       maximum=s["max"])
    if kind == "bool":
        b = bool_summary(col)
        return Summary(**base, true=b["true"], false=b["false"])
    if kind == "string":
        top, distinct, _ = top_values(col, k)
        return Summary(**base, top=tuple(top), distinct=distinct)
    return Summary(**base)


# -- pure: text and JSON ----------------------------------------------------------------------

def _number(x: int | float, kind: str) -> str:
    """An int64 value with thousands separators (a median between two ints gets one decimal);
    a double in 4 significant digits (whole numbers past that with separators)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if kind == "int64" or (isinstance(x, int) and not isinstance(x, bool)):
        return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"
    text = f"{x:.4g}"
    return f"{x:,.0f}" if "e+" in text else text


def describe(s: Summary) -> str:
    """The summary part of a signal's line: ``min 3  median 245  max 12,034``, ``true 43.2%
    (12 of 36)``, ``"en" 30, "de" 4``; nulls (and NaNs) after it when any."""
    if s.rows == 0:
        return "(not read)"
    if s.type in NUMERIC:
        text = ("no values" if s.minimum is None else
                f"min {_number(s.minimum, s.type)}  median {_number(s.median, s.type)}  "  # type: ignore[arg-type]
                f"max {_number(s.maximum, s.type)}")  # type: ignore[arg-type]
        if s.nans:
            text += f"  NaN {s.nans:,}"
    elif s.type == "bool":
        share = s.true_share
        text = ("no values" if share is None else
                f"true {100 * share:.1f}% ({s.true:,} of {s.true + s.false:,})")
    elif s.type == "string":
        shown = ", ".join(f"{_short(v)} {c:,}" for v, c in s.top)
        more = f" ({s.distinct:,} distinct)" if s.distinct > len(s.top) else ""
        text = (shown + more) if shown else "no values"
    else:
        text = "(not summarised)"
    return text + (f"  nulls {s.nulls:,}" if s.nulls else "")


def _short(value: str, width: int = 30) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 4] + '..."'


def heading(columns: int, rows: int, documents: int) -> str:
    """The section's first line: how many columns, and from how many documents."""
    plural = "s" if columns != 1 else ""
    if rows < documents:
        return f"signals     {columns} column{plural} (from {rows:,} of {documents:,} documents)"
    return f"signals     {columns} column{plural} ({documents:,} documents)"


def render(summaries: Sequence[Summary], rows: int, documents: int) -> list[str]:
    """The section's lines: the heading, then one aligned line per signal: name, type, step,
    summary."""
    name = max((len(s.column) for s in summaries), default=0)
    step = max((len(s.step) for s in summaries), default=0)
    kind = max((len(s.type) for s in summaries), default=0)
    return [heading(len(summaries), rows, documents),
            *(f"  {s.column:<{name}}  {s.type:<{kind}}  {s.step:<{step}}  {describe(s)}"
              for s in summaries)]


def _json_number(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


def to_json(summaries: Sequence[Summary], rows: int, documents: int) -> dict[str, Any]:
    """The section as JSON: ``{"documents", "rows_read", "sampled", "columns": {name: {...}}}``;
    each column has ``type``, ``step``, ``rows``, ``nulls`` and by type ``nans``, ``min``,
    ``median``, ``max`` (non-finite ones as strings: ``"inf"``), or ``true``, ``false``,
    ``true_share``, or ``top`` (``[[value, count], ...]``) and ``distinct``."""
    columns: dict[str, Any] = {}
    for s in summaries:
        d: dict[str, Any] = {"type": s.type, "step": s.step, "rows": s.rows, "nulls": s.nulls}
        if s.type in NUMERIC:
            d.update(nans=s.nans, min=_json_number(s.minimum), median=_json_number(s.median),
                     max=_json_number(s.maximum))
        elif s.type == "bool":
            d.update(true=s.true, false=s.false, true_share=s.true_share)
        elif s.type == "string":
            d.update(top=[[v, c] for v, c in s.top], distinct=s.distinct)
        columns[s.column] = d
    return {"documents": documents, "rows_read": rows, "sampled": rows < documents,
            "columns": columns}


# -- pure: which row groups to read -----------------------------------------------------------

def sample_plan(group_rows: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """Which row groups to read, ``(index, rows to take from its start)`` in index order, for
    ``min(limit, total)`` rows: every group when they fit; else the groups holding ``k``
    evenly spaced rows of the dataset (the middles of ``k`` equal slices; ``k`` grown until
    they hold ``limit`` rows), each cut to its share of ``limit``. So a sample spans the
    whole dataset, never its first ``limit`` rows, and reads about ``limit`` rows' worth of
    row groups. Deterministic: the same groups, the same plan."""
    import numpy as np

    rows = np.asarray(group_rows, dtype=np.int64)
    total = int(rows.sum()) if len(rows) else 0
    if limit <= 0 or total == 0:
        return []
    if total <= limit:
        return [(i, int(r)) for i, r in enumerate(rows) if r]
    ends = np.cumsum(rows)

    def groups_at(k: int) -> Any:
        middles = ((np.arange(k) + 0.5) * (total / k)).astype(np.int64)
        found = np.searchsorted(ends, np.minimum(middles, total - 1), side="right")
        return found[np.concatenate(([True], found[1:] != found[:-1]))]  # sorted: unique

    def rows_at(k: int) -> int:
        return int(rows[groups_at(k)].sum())

    # the fewest middles whose groups hold ``limit`` rows: a middle falls in a group in
    # proportion to its rows, so the groups hit hold sum(r^2) / total rows on average; start
    # below that, double until enough (k = total takes every group), then bisect
    hit = float((rows.astype(np.float64) ** 2).sum()) / total
    low = max(0, min(total, int(limit / hit)) - 1)  # rows_at(low) < limit, or low = 0
    high = max(1, low * 2)
    while high < total and rows_at(high) < limit:
        low, high = high, min(total, high * 2)
    while high - low > 1:
        middle = (low + high) // 2
        if rows_at(middle) >= limit:
            high = middle
        else:
            low = middle
    picked = groups_at(high)
    have = int(rows[picked].sum())
    takes = rows[picked] * limit // have  # each group's share, rounded down
    short = limit - int(takes.sum())
    for n in range(len(picked)):  # the rounding's rows, one each to the first with room
        if short == 0:
            break
        if takes[n] < rows[picked[n]]:
            takes[n] += 1
            short -= 1
    return [(int(i), int(t)) for i, t in zip(picked, takes, strict=True) if t]


# -- reading the shards -----------------------------------------------------------------------

@dataclass
class SignalSample:
    """The signal columns' values read (``columns``: name -> values in dataset order, each
    the manifest's type) from ``rows`` of the dataset's ``documents``."""

    columns: dict[str, pa.ChunkedArray]
    rows: int
    documents: int
    types: dict[str, str] = field(default_factory=dict)
    steps: dict[str, str] = field(default_factory=dict)

    def summaries(self, k: int = TOP) -> list[Summary]:
        return [summarize(c, self.types[c], self.steps[c], v, k)
                for c, v in self.columns.items()]


def signal_columns(manifest: Manifest) -> dict[str, dict[str, str]]:
    """``manifest.stats["signals"]``: column -> ``{"type", "step"}`` (empty: none)."""
    found = manifest.stats.get("signals") or {}
    return {c: {"type": str(v.get("type", "")), "step": str(v.get("step", c.partition(".")[0]))}
            for c, v in found.items()}


def read_signals(store: ReplicaSet, manifest: Manifest, limit: int = DEFAULT_ROWS,
                 threads: int = 8) -> SignalSample:
    """The signal columns of at most ``limit`` documents, from the row groups
    :func:`sample_plan` chooses; only those columns' byte ranges are read."""
    signals = signal_columns(manifest)
    types = {c: v["type"] for c, v in signals.items()}
    steps = {c: v["step"] for c, v in signals.items()}
    columns, rows = read_columns(store, manifest, {c: arrow_type(k) for c, k in types.items()},
                                 limit, threads)
    return SignalSample(columns, rows, manifest.total_rows, types, steps)


def read_columns(store: ReplicaSet, manifest: Manifest, types: Mapping[str, pa.DataType],
                 limit: int = DEFAULT_ROWS, threads: int = 8,
                 convert: Callable[[pa.Table], pa.Table] | None = None,
                 source_columns: Sequence[str] | None = None
                 ) -> tuple[dict[str, pa.ChunkedArray], int]:
    """Any columns (``types``: name -> the Arrow type they are returned as; one a shard lacks
    reads as nulls) of at most ``limit`` documents, from the row groups :func:`sample_plan`
    chooses, and how many documents that is. ``convert`` turns each row group's table as
    read (``source_columns``, default ``types``' names) into the one kept: the dataset card
    reads ``input_ids`` and keeps a token count per document, never the ids. A view reads
    its kept rows only."""
    names = list(types)
    reads = list(source_columns) if source_columns is not None else names
    empty = {c: pa.chunked_array([], type=types[c]) for c in names}
    if not names or limit <= 0 or manifest.total_rows == 0:
        return empty, 0
    shards = shards_of(store, manifest)
    # a view: the source's shards beside it, each row group masked (storage.format.view)
    data = source_store(store, manifest)
    masks = read_masks(store, manifest) if manifest.view is not None else None
    where: list[tuple[int, int]] = []  # flat row-group index -> (shard, group in the shard)
    rows: list[int] = []
    for s in range(len(shards)):
        for g, info in enumerate(shards[s].row_groups):
            where.append((s, g))
            rows.append(info.rows)
    plan = sample_plan(rows, limit)
    by_shard: dict[int, list[tuple[int, int, Any]]] = {}
    for i, take in plan:
        s, g = where[i]
        by_shard.setdefault(s, []).append((g, take, masks.group(i) if masks else None))
    jobs = [(shards[s], groups) for s, groups in by_shard.items()]
    parts: dict[str, list[pa.Array]] = {c: [] for c in names}

    def read(job: tuple[ShardInfo, list[tuple[int, int, Any]]]) -> list[pa.Table]:
        tables = read_shard(data, job[0], job[1], reads)
        return [convert(t) if convert is not None else t for t in tables]

    with ThreadPoolExecutor(max(1, min(threads, len(jobs)))) as pool:
        for tables in pool.map(read, jobs):
            for table in tables:
                for c in names:
                    parts[c].extend(_column(table, c, types[c]).chunks)
    return ({c: pa.chunked_array(parts[c], type=types[c]) for c in names},
            sum(t for _, t in plan))


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a manifest's type name (``int64``, ``double``, ``bool``, ``string``,
    any Arrow alias; ``string`` for anything else)."""
    if kind in _ARROW:
        return _ARROW[kind]
    try:
        return pa.type_for_alias(kind)
    except ValueError:
        return pa.string()


def _column(table: pa.Table, name: str, kind: pa.DataType) -> pa.ChunkedArray:
    if name not in table.column_names:  # a shard without this signal: nulls
        return pa.chunked_array([pa.nulls(table.num_rows, type=kind)], type=kind)
    col = table.column(name)
    return col if col.type == kind else col.cast(kind)


def read_shard(store: ReplicaSet, shard: ShardInfo, groups: list[tuple[int, int, Any]],
               names: list[str]) -> Iterator[pa.Table]:
    """``(group, rows, mask)`` of one shard: the first ``rows`` of each group's ``names``
    columns (those the shard has), of the documents ``mask`` keeps (a view's; ``None``:
    all). Public because ``pipeline trace`` finds documents with it too (by their id
    columns: :mod:`pipeline.lineage.locate`)."""
    if not (shard.footer_length and shard.footer_sha256):  # no footer recorded: the whole shard
        whole = pq.ParquetFile(io.BytesIO(store.get(shard.path, sha256=shard.sha256)))
        have = [c for c in names if c in whole.schema_arrow.names]
        for g, take, mask in groups:
            yield (_kept(whole.read_row_group(g, columns=have, use_threads=False), mask
                         ).slice(0, take) if have else pa.table({"_": pa.nulls(take)}))
        return
    footer = store.get(shard.path, sha256=shard.footer_sha256,
                       start=shard.bytes - shard.footer_length, end=shard.bytes)
    meta = tokens.parse_footer(footer)
    present = set(meta.schema.names)
    have = [c for c in names if c in present]
    for g, take, mask in groups:
        if not have:
            yield pa.table({"_": pa.nulls(take)})
            continue
        spans = [tokens.chunk_range(meta, g, c) for c in have]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        data = store.get(shard.path, start=lo, end=hi)
        source = RangeFile(shard.bytes, lo, data, f"{shard.path} row group {g}")
        table = pq.ParquetFile(source, metadata=meta).read_row_group(
            g, columns=have, use_threads=False)
        yield _kept(table, mask).slice(0, take)


def _kept(table: pa.Table, mask: Any) -> pa.Table:
    """A view's row group: its kept documents (``mask`` a bool per row; ``None``: all)."""
    return table if mask is None else table.filter(pa.array(mask))


# -- the plot ---------------------------------------------------------------------------------

def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` under the Agg backend (no display needed); a ``ValueError``
    naming the extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib, which comes with the 'plot' extra: pip "
                         "install 'shardflow[plot]' (or pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(sample: SignalSample, path: str | IO[bytes], title: str) -> int:
    """One panel per signal column in a grid, written as a PNG to ``path``: a histogram of a
    numeric column's finite values (integer-wide bins for an int64 column of a small range),
    a bool column's two bars, a string column's :data:`PLOT_TOP` most common values. Returns
    the number of panels."""
    import numpy as np

    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    names = list(sample.columns)
    if not names:
        raise ValueError("--plot: the dataset has no signal columns to plot")
    cols = min(4, len(names))
    grid = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(grid, cols, figsize=(4.2 * cols, 3.0 * grid + 0.8), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        kind, values = sample.types[name], sample.columns[name]
        ax.set_title(name, fontsize=9)
        if kind in NUMERIC:
            x = values.drop_null().to_numpy().astype(np.float64, copy=False)
            x = x[np.isfinite(x)]
            if len(x) == 0:
                ax.text(0.5, 0.5, "no values", ha="center", va="center",
                        transform=ax.transAxes)
            elif kind == "int64" and x.max() - x.min() <= 60:
                ax.hist(x, bins=np.arange(x.min(), x.max() + 2) - 0.5, color="tab:blue")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            else:
                ax.hist(x, bins=min(50, max(1, len(np.unique(x)))), color="tab:blue")
            ax.set_ylabel("documents", fontsize=8)
        elif kind == "bool":
            b = bool_summary(values)
            ax.bar(["false", "true"], [b["false"], b["true"]], color=["tab:gray", "tab:green"])
        else:
            top, _, _ = top_values(values.cast(pa.string()), PLOT_TOP)
            labels = [v if len(v) <= 24 else v[:21] + "..." for v, _ in top]
            ax.barh(labels[::-1], [c for _, c in top][::-1], color="tab:orange")
        ax.tick_params(labelsize=7)
    note = (f"from {sample.rows:,} of {sample.documents:,} documents"
            if sample.rows < sample.documents else f"{sample.documents:,} documents")
    fig.suptitle(f"{title}: signals ({note})", fontsize=12)
    # fixed margins in inches, not tight_layout: measuring every tick label of a grid of
    # dozens of panels was half the time of a plot (the dataset card draws one per version)
    width, height = 4.2 * cols, 3.0 * grid + 0.8
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.2 / width, bottom=0.45 / height,
                        top=1 - 0.85 / height, wspace=0.45, hspace=0.5)
    # no "Software" text chunk (matplotlib's version): the same figures, the same bytes
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return len(names)
