"""``python -m storage``: ``verify`` scrubs every replica, ``repair`` fixes what verify finds,
``inspect`` lists a dataset's versions, ``gc`` removes old ones, ``upgrade`` gives a v1 dataset
its binary row-group index."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from storage.admin.gc import DEFAULT_MIN_AGE_S, GcError, collect
from storage.admin.scrub import repair, verify
from storage.admin.upgrade import UpgradeError, upgrade
from storage.admin.versions import history, render_history
from storage.format.manifest import DatasetNotFoundError, ManifestError
from storage.io.degraded import describe as describe_degraded
from storage.io.lease import hold
from storage.io.replica_config import ReplicaConfig, load_replica_config
from storage.io.replicas import ReplicaError, ReplicaSet
from storage.io.retry import is_store_error

#: the default of every ``--storage-options`` flag: JSON or ``@FILE``, like the flag
STORAGE_OPTIONS_ENV = "SHARDFLOW_STORAGE_OPTIONS"

STORAGE_OPTIONS_HELP = (
    "fsspec options shared by all replicas, as a JSON object or @FILE (a file holding one); "
    f"default: ${STORAGE_OPTIONS_ENV}, same syntax. Secrets given inline are visible to every "
    "local user in the process list (/proc/PID/cmdline): put them in a file (@FILE), in "
    f"${STORAGE_OPTIONS_ENV}, or in AWS_* environment variables")


class _FromEnvironment(str):
    """A default taken from ``$SHARDFLOW_STORAGE_OPTIONS``; argparse parses it like the flag."""

    __slots__ = ()


def json_object(text: str) -> dict[str, Any]:
    """argparse type for options given as a JSON object, or as ``@FILE`` holding one.

    Shared by every CLI. Errors name the file or variable but never echo the value: it may
    hold credentials.
    """
    where = f"${STORAGE_OPTIONS_ENV}" if isinstance(text, _FromEnvironment) else "value"
    if text.startswith("@"):
        path = os.path.expanduser(text[1:])
        where = f"{where} @{path}" if isinstance(text, _FromEnvironment) else f"file {path}"
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"cannot read {where}: {exc.strerror or type(exc).__name__}") from None
        except UnicodeDecodeError:
            raise argparse.ArgumentTypeError(f"{where} is not UTF-8 text") from None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else "nested too deeply"
        raise argparse.ArgumentTypeError(f"{where} is not valid JSON ({reason})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"{where} must be a JSON object, e.g. '{{\"anon\": false}}', not "
            f"{type(value).__name__}")
    return value


def storage_options_default(fallback: Any = None) -> Any:
    """The default of a ``--storage-options`` flag: ``$SHARDFLOW_STORAGE_OPTIONS`` when set
    (argparse then parses it with :func:`json_object`), else ``fallback``."""
    value = os.environ.get(STORAGE_OPTIONS_ENV)
    return _FromEnvironment(value) if value else fallback


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that name a replicated dataset (shared with the pipeline's CLI)."""
    parser.add_argument("--replica", action="append", default=[], metavar="URL",
                        help="another copy of the dataset (repeatable); reads fail over to it")
    parser.add_argument("--replica-config", metavar="FILE",
                        help="TOML/JSON file with [[replica]] url, profile, storage_options "
                             "per replica and write_quorum (see storage/replica_config.py)")
    parser.add_argument("--storage-options", type=json_object,
                        default=storage_options_default({}), metavar="JSON|@FILE",
                        help=STORAGE_OPTIONS_HELP)


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
    parser = argparse.ArgumentParser(
        prog="python -m storage",
        description="Check, repair, list, garbage-collect and upgrade replicated Shardflow "
                    "datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("verify", "check every replica against the newest committed version (the "
                                  "highest _versions/ sequence whose manifest and index "
                                  "verify): every object as a reader uses it (sizes, "
                                  "checksums, row-group digests, footers, index values), "
                                  "streamed in bounded memory, manifest.json, its record and "
                                  "open degraded-write markers; exit 1 when anything is wrong"),
                       ("repair", "move every replica forward to the newest committed version: "
                                  "re-copy missing or corrupt objects from a good replica, "
                                  "then manifest.json; never rolls a replica back; idempotent"),
                       ("inspect", "list the dataset's versions (sequence, manifest sha256, "
                                   "shards, tokens, commit time), which one is current, and "
                                   "any degraded write a replica missed"),
                       ("gc", "remove version records older than the last --keep N and every "
                              "object under shards/, quarantine/ and tokenizer files that no "
                              "kept version or the current manifest.json names and that is "
                              "older than --min-age; a run's _work/ goes once all of it is "
                              "older than --min-age. Never removes what a kept version names; "
                              "idempotent"),
                       ("upgrade", "write the binary row-group index (index/<sha16>.sfidx) of a "
                                   "shardflow.dataset/1 dataset and swap in a "
                                   "shardflow.dataset/2 manifest that names it, so that "
                                   "manifest.json stays a few KB and ranks read only the index "
                                   "columns they need. Shards are not touched; the manifest "
                                   "swap is the one atomic step, recorded under _versions/ "
                                   "like a commit. Idempotent: a v2 dataset is left alone. Do "
                                   "not run it while a rebuild of the same dataset commits")):
        p = sub.add_parser(name, help=text.split(";")[0].split(". ")[0], description=text)
        p.add_argument("url", nargs="?", help="the dataset (first replica)")
        add_replica_arguments(p)
        if name in WRITERS:
            p.add_argument("--wait", action="store_true",
                           help="when another writer (a pipeline run, another admin command) "
                                "holds the dataset's writer lease, wait for it instead of "
                                "failing at once")
        if name == "gc":
            p.add_argument("--keep", type=int, required=True, metavar="N",
                           help="versions to keep, newest first (>= 1; the current one is "
                                "always kept)")
            p.add_argument("--min-age", type=float, default=DEFAULT_MIN_AGE_S, metavar="SECONDS",
                           help="grace period: nothing written, and no version superseded, "
                                "less than this long ago is removed, so a rebuild in progress "
                                "keeps the objects it has written and a reader that opened "
                                "the previous version can finish its epoch; make it longer "
                                "than your longest rebuild and epoch (default: %(default)g)")
            p.add_argument("--dry-run", action="store_true",
                           help="print what would be removed, remove nothing")
            p.add_argument("--quiet", "-q", action="store_true",
                           help="print the totals only, not every object")
    return parser


#: the commands that write a dataset, and so hold its writer lease (storage.io.lease) while they
#: do: one writer at a time, pipeline runs included (a gc during a run would remove the shards
#: the run wrote and no manifest names yet; a repair could race a commit)
WRITERS = ("repair", "gc", "upgrade")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        store = store_from_args(args, args.url)
        writes = args.command in WRITERS and not getattr(args, "dry_run", False)
        lease = (hold(store.primary, store.replicas[0].name, args.command, wait=args.wait)
                 if writes else None)
        try:
            return _command(args, store)
        finally:
            if lease is not None:
                lease.release()
    except (DatasetNotFoundError, ManifestError, ReplicaError, GcError, UpgradeError,
            ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_store_error(exc):
            raise  # a bug: its traceback is what a report needs
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _command(args: argparse.Namespace, store: ReplicaSet) -> int:
    if args.command == "gc":
        report = collect(store, args.keep, args.min_age, dry_run=args.dry_run)
        print(report.render(verbose=not args.quiet))
        return 0
    if args.command == "upgrade":
        print(upgrade(store, sys.stderr).render())
        return 0
    if args.command == "inspect":
        entries = history(store)
        print(render_history(entries))
        tags = {e.version.tag: e.version.sequence for e in entries if e.version}
        for line in describe_degraded(store, tags):
            print(line)
        return 0
    # Which version is current is the history's decision (storage.admin.newest), not the first
    # replica's manifest: a replica that missed a commit must not be taken as the truth.
    report = verify(store) if args.command == "verify" else repair(store)
    print(report.render())
    if args.command == "verify":
        return 0 if report.ok else 1
    return 1 if report.unrepairable else 0
