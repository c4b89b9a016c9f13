"""Dataset versions: the manifest swap that commits one, and the history admin tools list.

A committed version is immutable: every object its manifest names is content-addressed (see
:mod:`storage.format.layout`), so a rebuild writes new names next to the old ones and the one atomic
put of ``manifest.json`` is what switches readers over; a reader that opened the old manifest
finishes on the old objects. After each swap an immutable copy of the manifest is kept as
``_versions/<sequence>-<manifest sha16>.json`` (none when the manifest is the latest one's:
an identical rerun adds no version). The manifest itself holds no timestamp or counter, so it
stays byte-identical across reruns; a version's commit time is its record's mtime.

Only admin tools and the writer list ``_versions/``; readers never list anything.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TextIO

from storage.format.checksums import digest_bytes
from storage.format.layout import (
    MANIFEST,
    NAME_HASH,
    VERSIONS_DIR,
    parse_version_name,
    version_name,
)
from storage.format.manifest import Manifest, ManifestError
from storage.io.listing import list_tree, mtime_of
from storage.io.replicas.replica_set import ReplicaSet
from storage.io.urls import Location


@dataclass(frozen=True)
class Version:
    """One record under ``_versions/``: the ``sequence``-th manifest committed."""

    sequence: int
    tag: str  # the manifest's sha256, first 16 hex digits
    path: str
    bytes: int
    mtime: float | None  # commit time, where the store reports one


def list_versions(loc: Location) -> list[Version]:
    """The version records of one replica, oldest first."""
    out = []
    for rel, info in list_tree(loc, VERSIONS_DIR).items():
        parsed = parse_version_name(rel)
        if parsed:
            out.append(Version(parsed[0], parsed[1], rel, int(info.get("size") or 0),
                               mtime_of(info)))
    return sorted(out, key=lambda v: (v.sequence, v.tag))


def store_versions(store: ReplicaSet) -> list[Version]:
    """The version records of the first replica that can be listed."""
    errors = []
    for replica in store.read_order():
        try:
            return list_versions(replica.loc)
        except Exception as exc:
            errors.append(f"{replica.name}: {type(exc).__name__}: {exc}"[:300])
    raise OSError("cannot list versions on any replica: " + "; ".join(errors))


def union_versions(store: ReplicaSet) -> list[Version]:
    """The version records of every replica that can be listed, merged (oldest first).

    A record write that missed a replica leaves that replica's history short; numbering the
    next version from it alone would give two different manifests the same sequence. Raises
    like :func:`store_versions` when no replica can be listed."""
    found: dict[tuple[int, str], Version] = {}
    errors = []
    for replica in store.read_order():
        try:
            for v in list_versions(replica.loc):
                found.setdefault((v.sequence, v.tag), v)
        except Exception as exc:
            errors.append(f"{replica.name}: {type(exc).__name__}: {exc}"[:300])
    if errors and len(errors) == len(store.replicas):
        raise OSError("cannot list versions on any replica: " + "; ".join(errors))
    return sorted(found.values(), key=lambda v: (v.sequence, v.tag))


def manifest_tag(data: bytes) -> str:
    return digest_bytes(data)[:NAME_HASH]


def _record(store: ReplicaSet, history: list[Version], data: bytes) -> Version | None:
    """Add ``data`` as the next version unless it is the latest one already."""
    tag = manifest_tag(data)
    if history and history[-1].tag == tag:
        return None
    sequence = history[-1].sequence + 1 if history else 1
    path = version_name(sequence, digest_bytes(data))
    store.put(path, data)
    version = Version(sequence, tag, path, len(data), None)
    history.append(version)
    return version


def commit(store: ReplicaSet, manifest: Manifest, log: TextIO | None = None) -> Version | None:
    """Commit ``manifest``: swap ``manifest.json`` (one atomic put), then record the version.

    A live manifest that has no record yet (a dataset written before versions were recorded,
    or a commit whose record was lost) is recorded first, so that its history, and gc's
    protection of a version superseded moments ago, cover it too. Returns the new record, or
    ``None`` when the manifest is the latest version's already. A failure to record is
    reported on ``log`` and not raised: the dataset *is* committed; the next commit records it.

    A swap that met the write quorum but missed a replica is reported on ``log`` as one
    warning line naming the replicas (they keep serving the previous version to readers that
    try them first until ``python -m storage repair`` moves them forward); the put left a
    ``_degraded/`` marker saying so. Versions are numbered from the records of every replica
    (:func:`union_versions`), so a replica that missed a record cannot make a number repeat.
    """
    data = manifest.to_json().encode("utf-8")
    history: list[Version] | None = None
    try:
        history = union_versions(store)
        live = store.get(MANIFEST)
        if manifest_tag(live) not in {v.tag for v in history}:
            _record(store, history, live)
    except FileNotFoundError:
        pass  # the first commit
    except OSError as exc:
        _warn(log, f"the live version could not be recorded before the swap: {exc}")
    missed = store.put(MANIFEST, data)  # the commit: what readers see changes here and only here
    try:
        recorded = _record(store, union_versions(store) if history is None else history, data)
    except OSError as exc:
        _warn(log, f"committed, but the version record was not written: {exc}")
        recorded = None
    if missed:
        what = f"version {recorded.sequence}" if recorded else "the new manifest"
        _warn(log, f"degraded commit: {', '.join(missed)} missed {MANIFEST} of {what} "
                   f"({len(store.replicas) - len(missed)} of {len(store.replicas)} replicas "
                   "written); run python -m storage repair")
    return recorded


def _warn(log: TextIO | None, message: str) -> None:
    if log is not None:
        print(f"warning: {message}", file=log)


@dataclass(frozen=True)
class HistoryEntry:
    """A version as ``inspect`` shows it."""

    version: Version | None  # None: the current manifest has no record (older dataset)
    current: bool
    shards: int = 0
    tokens: int = 0
    error: str = ""


def history(store: ReplicaSet) -> list[HistoryEntry]:
    """Every recorded version with its size, oldest first, and which one is current."""
    try:
        current = manifest_tag(store.get(MANIFEST))
    except FileNotFoundError:
        current = None
    out: list[HistoryEntry] = []
    for v in store_versions(store):
        try:
            m = Manifest.from_json(store.get(v.path).decode("utf-8"), source=v.path)
            out.append(HistoryEntry(v, v.tag == current, m.counts.shards, m.total_tokens))
        except (OSError, ManifestError, UnicodeDecodeError) as exc:
            out.append(HistoryEntry(v, v.tag == current, error=f"{type(exc).__name__}: {exc}"))
    if current and not any(e.current for e in out):
        m = store.read_manifest()
        out.append(HistoryEntry(None, True, m.counts.shards, m.total_tokens))
    return out


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_history(entries: list[HistoryEntry]) -> str:
    lines = [f"{'version':>8}  {'manifest':16}  {'shards':>6}  {'tokens':>15}  "
             f"{'committed':23}"]
    for e in entries:
        seq = str(e.version.sequence) if e.version else "-"
        tag = e.version.tag if e.version else "(no record)"
        mark = "  <- current" if e.current else ""
        detail = (f"unreadable: {e.error}"[:120] if e.error
                  else f"{e.shards:>6,}  {e.tokens:>15,}")
        lines.append(f"{seq:>8}  {tag:16}  {detail}  "
                     f"{_when(e.version.mtime if e.version else None):23}{mark}".rstrip())
    if not entries:
        lines.append("  (no committed version)")
    return "\n".join(lines)

