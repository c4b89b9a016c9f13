"""``python -m storage``: ``verify`` scrubs every replica, ``repair`` fixes what verify finds."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from storage.manifest import DatasetNotFoundError, ManifestError
from storage.replica_config import ReplicaConfig, load_replica_config
from storage.replicas import ReplicaError, ReplicaSet
from storage.scrub import repair, verify


def json_object(text: str) -> dict[str, Any]:
    """argparse type for options given as a JSON object (shared by every CLI)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"anon\": false}'")
    return value


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that name a replicated dataset (shared with the pipeline's CLI)."""
    parser.add_argument("--replica", action="append", default=[], metavar="URL",
                        help="another copy of the dataset (repeatable); reads fail over to it")
    parser.add_argument("--replica-config", metavar="FILE",
                        help="TOML/JSON file with [[replica]] url, profile, storage_options "
                             "per replica and write_quorum (see storage/replica_config.py)")
    parser.add_argument("--storage-options", type=json_object, default={}, metavar="JSON",
                        help="fsspec options shared by all replicas (prefer AWS_* environment "
                             "variables for credentials)")


def replica_spec(args: argparse.Namespace, url: str | None) -> ReplicaConfig:
    """The replicas named by ``url``, ``--replica`` and ``--replica-config``, in that order."""
    urls = ([url] if url else []) + list(args.replica)
    options: list[dict[str, Any] | None] = [None] * len(urls)
    quorum = getattr(args, "write_quorum", None)
    if args.replica_config:
        cfg = load_replica_config(args.replica_config)
        urls += cfg.urls
        options += cfg.options
        quorum = quorum if quorum is not None else cfg.write_quorum
    if not urls:
        raise ValueError("no dataset URL given")
    return ReplicaConfig(urls, options, quorum)


def store_from_args(args: argparse.Namespace, url: str | None) -> ReplicaSet:
    spec = replica_spec(args, url)
    return ReplicaSet.from_urls(spec.urls, args.storage_options, spec.options,
                                write_quorum=spec.write_quorum)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m storage",
                                     description="Check and repair replicated Shardflow datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("verify", "check every object of the manifest on every replica; "
                                  "exit 1 when anything is missing or corrupt"),
                       ("repair", "re-copy missing or corrupt objects from a good replica; "
                                  "idempotent")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("url", nargs="?", help="the dataset (first replica)")
        add_replica_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = store_from_args(args, args.url)
        manifest = store.read_manifest()
        report = verify(store, manifest) if args.command == "verify" else repair(store, manifest)
    except (DatasetNotFoundError, ManifestError, ReplicaError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    if args.command == "verify":
        return 0 if report.ok else 1
    return 1 if report.unrepairable else 0
