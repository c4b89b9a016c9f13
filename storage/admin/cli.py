"""``python -m storage``: ``verify`` scrubs every replica, ``repair`` fixes what verify finds,
``inspect`` lists a dataset's versions, ``gc`` removes old ones, ``upgrade`` gives a v1 dataset
its binary row-group index, ``unlock`` shows the writer lease and breaks one no live writer
holds."""

from __future__ import annotations

import sys
from typing import Annotated, Any

from cyclopts import Parameter

from infra.config import ConfigFlag, make_app, parse
from storage.admin.gc import DEFAULT_MIN_AGE_S, GcError, collect
from storage.admin.scrub import repair, verify
from storage.admin.unlock import unlock
from storage.admin.upgrade import UpgradeError, upgrade
from storage.admin.versions import history, render_history
from storage.format.manifest import DatasetNotFoundError, ManifestError
from storage.io.degraded import describe as describe_degraded
from storage.io.replicas.flags import ReplicaFlags
from storage.io.replicas.leases import hold_replicas
from storage.io.replicas.replica_set import ReplicaError, ReplicaSet
from storage.io.retry import is_store_error

app = make_app(
    "python -m storage", component="storage",
    help="Check, repair, list, garbage-collect, upgrade and unlock replicated Shardflow "
         "datasets.")

#: the dataset's first replica (positional, optional: --replica-config may name them all)
Url = Annotated[str | None, Parameter(name="URL", help="the dataset (first replica)")]
#: an on-only switch (--dry-run, not --no-dry-run)
Switch = Parameter(negative="", show_default=False)
#: --wait of the commands that write
Wait = Annotated[bool, Switch, Parameter(help=(
    "when another writer (a pipeline run, another admin command) holds the dataset's writer "
    "lease, wait for it instead of failing at once"))]
#: --config of every command
Config = Annotated[ConfigFlag, Parameter(help=(
    "TOML, YAML or JSON file of flag values (keys: the flags' names, dashes or underscores); "
    "flags win over it, it wins over SHARDFLOW_STORAGE_<FLAG> environment variables"))]


#: the commands that write a dataset, and so hold its writer lease (storage.io.lease) while they
#: do: one writer at a time, pipeline runs included (a gc during a run would remove the shards
#: the run wrote and no manifest names yet; a repair could race a commit)
WRITERS = ("repair", "gc", "upgrade")


@app.command(name="verify")
def verify_(url: Url = None, /, *, where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
            config: Config = None) -> int:
    """Check every replica against the newest committed version.

    Check every replica against the newest committed version (the highest _versions/
    sequence whose manifest and index verify): every object as a reader uses it (sizes,
    checksums, row-group digests, footers, index values), streamed in bounded memory,
    manifest.json, its record and open degraded-write markers; exit 1 when anything is wrong.
    """
    store = where.store(url)
    # Which version is current is the history's decision (storage.admin.newest), not the
    # first replica's manifest: a replica that missed a commit must not be taken as the truth.
    report = verify(store)
    print(report.render())
    return 0 if report.ok else 1


@app.command(name="repair")
def repair_(url: Url = None, /, *, where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
            wait: Wait = False, config: Config = None) -> int:
    """Move every replica forward to the newest committed version.

    Move every replica forward to the newest committed version: re-copy missing or corrupt
    objects from a good replica, then manifest.json; never rolls a replica back; idempotent.
    """
    def run(store: ReplicaSet) -> int:
        report = repair(store)
        print(report.render())
        return 1 if report.unrepairable else 0

    return _writing("repair", where.store(url), wait, run)


@app.command(name="inspect")
def inspect_(url: Url = None, /, *, where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
             config: Config = None) -> int:
    """List the dataset's versions.

    List the dataset's versions (sequence, manifest sha256, shards, tokens, commit time),
    which one is current, and any degraded write a replica missed.
    """
    store = where.store(url)
    entries = history(store)
    print(render_history(entries))
    tags = {e.version.tag: e.version.sequence for e in entries if e.version}
    for line in describe_degraded(store, tags):
        print(line)
    return 0


@app.command(name="gc")
def gc_(url: Url = None, /, *,
        keep: Annotated[int, Parameter(metavar="N", help=(
            "versions to keep, newest first (>= 1; the current one is always kept)"))],
        min_age: Annotated[float, Parameter(metavar="SECONDS", help=(
            "grace period: nothing written, and no version superseded, less than this long "
            "ago is removed, so a rebuild in progress keeps the objects it has written and a "
            "reader that opened the previous version can finish its epoch; make it longer "
            "than your longest rebuild and epoch"))] = DEFAULT_MIN_AGE_S,
        dry_run: Annotated[bool, Switch, Parameter(help=(
            "print what would be removed, remove nothing (takes no lease)"))] = False,
        quiet: Annotated[bool, Switch, Parameter(name=["--quiet", "-q"], help=(
            "print the totals only, not every object"))] = False,
        where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
        wait: Wait = False, config: Config = None) -> int:
    """Remove old versions and the objects only they name.

    Remove version records older than the last --keep N and every object under shards/,
    quarantine/ and tokenizer files that no kept version or the current manifest.json names
    and that is older than --min-age; a run's _work/ goes once all of it is older than
    --min-age. Never removes what a kept version names; idempotent.
    """
    def run(store: ReplicaSet) -> int:
        print(collect(store, keep, min_age, dry_run=dry_run).render(verbose=not quiet))
        return 0

    store = where.store(url)
    return run(store) if dry_run else _writing("gc", store, wait, run)


@app.command(name="upgrade")
def upgrade_(url: Url = None, /, *, where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
             wait: Wait = False, config: Config = None) -> int:
    """Give a shardflow.dataset/1 dataset its binary row-group index, any index its codecs.

    Write the binary row-group index (index/<sha16>.sfidx) of a shardflow.dataset/1 dataset
    and swap in a shardflow.dataset/2 manifest that names it, so that manifest.json stays a
    few KB and ranks read only the index columns they need. An index written before it
    recorded each shard's codec gets them (each shard's footer read once and checked), so
    readers decode without fetching or keeping footers. Shards are not touched; the
    manifest swap is the one atomic step, recorded under _versions/ like a commit.
    Idempotent: a dataset already upgraded is left alone. Do not run it while a rebuild of
    the same dataset commits.
    """
    def run(store: ReplicaSet) -> int:
        print(upgrade(store, sys.stderr).render())
        return 0

    return _writing("upgrade", where.store(url), wait, run)


@app.command(name="unlock")
def unlock_(url: Url = None, /, *,
            force: Annotated[bool, Switch, Parameter(help=(
                "also break a lease whose holder cannot be confirmed dead (a fresh lease of a "
                "writer on another host, or one whose process still runs here), with a "
                "warning: if that writer still runs, it stops at its commit check"))] = False,
            dry_run: Annotated[bool, Switch, Parameter(help=(
                "show each replica's lease and what would be done; break nothing"))] = False,
            where: ReplicaFlags = ReplicaFlags(),  # noqa: B008
            config: Config = None) -> int:
    """Show each replica's writer lease; break it when no live writer holds it.

    Show the writer lease (_lease.json) of every replica: its holder's host, pid and run id,
    since when and until when, or why it is invalid. Break it where no live writer can hold
    it: an invalid lease (damaged, crafted, a folder in its place), an expired one, or one
    whose holder ran on this host and is gone. A fresh lease of a writer on another host is
    left alone unless --force. Exit 0 when no lease is left in the way, 1 when one was left
    alone (or changed meanwhile), 2 when a replica could not be read.
    """
    report = unlock(where.store(url), force=force, dry_run=dry_run)
    print(report.render())
    for line in report.warnings:
        print(f"warning: {line}", file=sys.stderr)
    return report.exit_code


def _writing(command: str, store: ReplicaSet, wait: bool, run: Any) -> int:
    """``run(store)`` holding the dataset's writer lease (taken at once or, with --wait,
    when its holder lets go), released also when ``run`` fails."""
    lease = hold_replicas(store, command, wait=wait)
    try:
        return run(store)
    finally:
        lease.release()


def main(argv: list[str] | None = None) -> int:
    command, bound = parse(app, sys.argv[1:] if argv is None else argv)
    try:
        return command(*bound.args, **bound.kwargs)
    except (DatasetNotFoundError, ManifestError, ReplicaError, GcError, UpgradeError,
            ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_store_error(exc):
            raise  # a bug: its traceback is what a report needs
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
