"""Degraded-write markers: which replica missed which object, until ``repair`` fills the gap.

A write that met the quorum but missed a replica (``ReplicaSet.put``) leaves a marker under
``_degraded/`` on every replica it reached. The marker names the object, the sha256 of the
bytes written and the replicas missed, by index *and* by URL (without credentials): the
admin command that reads it may list the replicas in another order than the writer did, so
the URL is what identifies a replica; the index is the fallback for markers written before
URLs were recorded. A marker is the only evidence of *which* copy is the newer one when two
replicas disagree, so it is removed only once every replica it names holds the object with
those bytes (or, for ``manifest.json``, a committed version at least as new).

Markers are named by the object's path and the bytes' sha256, so two degraded commits of
``manifest.json`` leave two markers, not one overwriting the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from storage.format.checksums import digest_bytes
from storage.io.atomic import write_atomic
from storage.io.urls import Location, display_url

if TYPE_CHECKING:
    from storage.io.replicas.replica_set import ReplicaSet

DEGRADED_DIR = "_degraded"
WORK_PREFIX = "_work/"
#: a marker is a few hundred bytes; anything larger is not one of ours and is not read
MAX_MARKER_BYTES = 64 << 10


@dataclass(frozen=True)
class Marker:
    """One degraded write: ``path`` (with bytes of ``sha256``, ``""`` in old markers) missed
    the replicas ``missing`` (writer's indices) / ``missing_urls`` (display URLs)."""

    name: str  # the marker's own path, ``_degraded/<...>.json``
    path: str
    sha256: str
    missing: tuple[int, ...]
    missing_urls: tuple[str, ...]

    def names_replica(self, index: int, url: str) -> bool:
        """Does this marker say the replica at ``url`` (``index`` in this set) missed it?"""
        if self.missing_urls:
            return display_url(url) in self.missing_urls
        return index in self.missing


def marker_name(relative: str, sha256: str) -> str:
    key = (relative + "\0" + sha256).encode()
    return f"{DEGRADED_DIR}/{digest_bytes(key)[:20]}.json"


def marker_bytes(relative: str, sha256: str, missing: list[tuple[int, str]]) -> bytes:
    """The marker for ``relative`` (bytes of ``sha256``) missed by ``missing`` (index, URL)."""
    return json.dumps({"path": relative, "sha256": sha256,
                       "missing": [i for i, _ in missing],
                       "missing_urls": [display_url(u) for _, u in missing]},
                      sort_keys=True).encode()


def record(reached: list[Location], relative: str, sha256: str,
           missing: list[tuple[int, str]]) -> list[tuple[Location, BaseException]]:
    """Write the marker to each replica ``reached``; returns the ones that failed (best
    effort: ``verify`` still finds the gap by comparing replicas)."""
    data = marker_bytes(relative, sha256, missing)
    name = marker_name(relative, sha256)
    failed = []
    for loc in reached:
        try:
            write_atomic(loc, name, data)
        except Exception as exc:
            failed.append((loc, exc))
    return failed


def _parse(name: str, data: bytes) -> Marker | None:
    try:
        d: Any = json.loads(data)
        path = d["path"]
        missing = tuple(int(i) for i in d.get("missing", []))
        urls = tuple(str(u) for u in d.get("missing_urls", []))
        sha = str(d.get("sha256", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(path, str):
        return None
    return Marker(name, path, sha, missing, urls)


def read_markers(loc: Location) -> list[Marker]:
    """The markers on one replica (unparseable ones are skipped: they name nothing usable).

    Raises ``OSError`` when the replica cannot be listed."""
    fs, top = loc.fs, loc.path(DEGRADED_DIR).rstrip("/")
    fs.invalidate_cache(top)
    try:
        found = fs.find(top, detail=True, withdirs=False)
    except FileNotFoundError:
        return []
    root = loc.root.rstrip("/") + "/"
    out = []
    for full, info in sorted(found.items()):
        full = full.rstrip("/")
        if not full.startswith(root) or not full.endswith(".json"):
            continue
        if int(info.get("size") or 0) > MAX_MARKER_BYTES:
            continue
        try:
            data = fs.cat_file(full)
        except FileNotFoundError:
            continue
        marker = _parse(full[len(root):], data)
        if marker is not None:
            out.append(marker)
    return out


def all_markers(store: ReplicaSet, skip: frozenset[int] = frozenset()
                ) -> tuple[list[Marker], list[str]]:
    """Markers on every replica that can be listed (deduplicated by marker name), and one
    line per replica that could not be. ``skip``: replicas (by index) known not to answer,
    which would only cost another timeout each."""
    seen: dict[str, Marker] = {}
    errors = []
    for replica in store.replicas:
        if replica.index in skip:
            continue
        try:
            for m in read_markers(replica.loc):
                seen.setdefault(m.name, m)
        except Exception as exc:
            errors.append(f"{replica.name}: {type(exc).__name__}: {exc}"[:300])
    return list(seen.values()), errors


def describe(store: ReplicaSet, versions: dict[str, int] | None = None) -> list[str]:
    """One line per degraded write still open, for ``inspect`` and the pipeline's summary:
    ``replica 1 (URL) missed manifest.json of version 2; run python -m storage repair``.

    ``versions``: manifest sha16 -> version sequence, to name a missed manifest's version.
    """
    markers, _errors = all_markers(store)
    lines = []
    for m in sorted(markers, key=lambda m: (m.path, m.name)):
        if m.path.startswith(WORK_PREFIX):
            continue  # a run's scratch, removed once it commits: nothing for readers to miss
        who = [r.name for r in store.replicas if m.names_replica(r.index, r.loc.url)]
        if not who:
            who = list(m.missing_urls) or [f"replica {i}" for i in m.missing]
        what = m.path
        seq = (versions or {}).get(m.sha256[:16]) if m.sha256 else None
        if seq is not None:
            what += f" of version {seq}"
        lines.append(f"degraded: {', '.join(who)} missed {what}; run python -m storage repair")
    return lines
