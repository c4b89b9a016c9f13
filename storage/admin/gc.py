"""``gc``: remove old versions and the objects no kept version names.

What is kept, on every replica:

- ``manifest.json`` and every object it names (whatever its age);
- the last ``keep`` version records, the record of the current manifest, and any version that
  was superseded less than ``min_age_s`` ago (a reader that opened it may still be mid-epoch),
  with every object each of them names;
- any object written less than ``min_age_s`` ago: a rebuild in progress has written objects
  that no manifest names yet;
- ``_work/`` while any of its objects is younger than ``min_age_s`` (a run in progress);
- multipart uploads that never completed (S3; a cancelled or killed write's parts, listed by
  no object listing: :mod:`storage.io.multipart`) of a path gc may remove are aborted once
  started longer ago than ``min_age_s`` (a writer may still be sending one);
- every version a view selects from, with all it names, while the view uses it (the pins
  under ``_views/``: :mod:`storage.admin.view_pins`); a pin no view uses any more and older
  than ``min_age_s`` is removed;
- anything gc does not know (``_degraded/``, foreign files): it only removes under
  ``shards/``, ``quarantine/``, ``index/``, ``masks/`` (a view's own), ``_versions/``,
  ``_work/``, root ``tokenizer*.json`` files, stale pins, ``_doclens/`` token counts of
  shards no kept version names (``select``'s cache), the cards of versions it does not
  keep (``card/<manifest sha16>/<file>``: a kept version keeps its card), the
  ``contamination/`` reports and ``lineage/`` drop records no kept version names, and leftover
  ``.tmp-*`` files of interrupted local writes.

A local replica holding a symlink anywhere in the dataset is refused whole, naming the link:
the listing does not descend into a symlinked folder, so the objects behind it would look
unnamed or absent, and gc neither follows a link out of the dataset nor guesses what one is for
(:mod:`storage.io.local.paths`).

Version records go first, data objects after: a record that is still listed always names
objects that are all there. Each candidate is stat'ed again right before it is removed, so an
object a rebuild has just (re)written under the same content-addressed name survives. gc needs
every replica reachable: an unreachable replica's manifest may name objects that ``repair``
would copy from the others.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from storage.admin import view_pins
from storage.admin.versions import manifest_tag
from storage.format.layout import (
    CONTAMINATION_DIR,
    DOCLENS_DIR,
    INDEX_DIR,
    LINEAGE_DIR,
    MANIFEST,
    MASKS_DIR,
    NAME_HASH,
    QUARANTINE_DIR,
    SHARDS_DIR,
    WORK_DIR,
    card_tag,
    doclens_shard,
    is_tokenizer_name,
    parse_version_name,
)
from storage.format.manifest import Manifest, ManifestError
from storage.io import multipart
from storage.io.index_store import drop_records_of, shard_paths_of
from storage.io.listing import list_tree, mtime_of
from storage.io.replicas.replica_set import Replica, ReplicaSet

DEFAULT_MIN_AGE_S = 3600.0
_BATCH = 500


class GcError(RuntimeError):
    """gc cannot tell safely what is in use (unreachable replica, unreadable manifest)."""


@dataclass(frozen=True)
class Removal:
    replica: str
    path: str
    bytes: int


@dataclass
class GcReport:
    replicas: int
    keep: int
    min_age_s: float
    dry_run: bool
    kept_versions: list[int] = field(default_factory=list)
    versions: list[Removal] = field(default_factory=list)
    objects: list[Removal] = field(default_factory=list)
    work: list[Removal] = field(default_factory=list)
    #: open multipart uploads aborted (their ``bytes``: 0, S3 does not list them cheaply)
    uploads: list[Removal] = field(default_factory=list)
    #: open multipart uploads left alone: started less than ``min_age_s`` ago
    young_uploads: int = 0
    #: unreferenced objects left alone because they are younger than ``min_age_s``
    young: int = 0
    #: candidates found younger on the second look, right before removal
    rewritten: int = 0
    work_in_progress: bool = False

    @property
    def removed(self) -> list[Removal]:
        return [*self.versions, *self.objects, *self.work]

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed)

    def render(self, verbose: bool = True) -> str:
        verb = "would remove" if self.dry_run else "removed"
        lines = []
        if verbose:
            lines += [f"  {verb} {r.path}  ({r.bytes:,} bytes, {r.replica})"
                      for r in self.removed]
            lines += [f"  {'would abort' if self.dry_run else 'aborted'} {r.path}  ({r.replica})"
                      for r in self.uploads]
        kept = ", ".join(map(str, self.kept_versions)) or "none recorded"
        lines.append(f"kept versions: {kept} (--keep {self.keep}; plus any superseded less "
                     f"than {self.min_age_s:g} s ago)")
        if self.young or self.rewritten:
            lines.append(f"left {self.young + self.rewritten} unreferenced object(s) younger "
                         f"than {self.min_age_s:g} s (a rebuild in progress may need them)")
        if self.uploads or self.young_uploads:
            verb_up = "would abort" if self.dry_run else "aborted"
            lines.append(f"{verb_up} {len(self.uploads)} unfinished multipart upload(s)"
                         + (f", left {self.young_uploads} started less than "
                            f"{self.min_age_s:g} s ago" if self.young_uploads else ""))
        if self.work_in_progress:
            lines.append(f"left {WORK_DIR}/ alone: a run wrote to it less than "
                         f"{self.min_age_s:g} s ago")
        lines.append(f"{verb} {len(self.versions)} version record(s), {len(self.objects)} "
                     f"object(s), {len(self.work)} work file(s): {len(self.removed)} in all, "
                     f"{self.bytes:,} bytes, on {self.replicas} replica(s)")
        return "\n".join(lines)


@dataclass
class _Replica:
    replica: Replica
    tree: dict[str, dict[str, Any]]
    manifest: Manifest | None
    manifest_tag: str | None
    uploads: list[multipart.Upload] = field(default_factory=list)


def _scan(replica: Replica) -> _Replica:
    loc = replica.loc
    try:
        tree = list_tree(loc)
        links = sorted(rel for rel, info in tree.items() if info.get("islink"))
        if links:
            raise GcError(_symlinks(replica, links))
        data = loc.fs.cat_file(loc.path(MANIFEST)) if MANIFEST in tree else None
        uploads = multipart.open_uploads(loc)
    except GcError:
        raise
    except Exception as exc:
        raise GcError(f"gc needs every replica, and {replica.name} cannot be listed "
                      f"({type(exc).__name__}: {exc})"[:500]) from None
    manifest = None
    if data is not None:
        manifest = _parse(data, f"{replica.name}: {MANIFEST}")
    return _Replica(replica, tree, manifest, manifest_tag(data) if data is not None else None,
                    uploads)


def _symlinks(replica: Replica, links: list[str]) -> str:
    """Why gc stops at a symlink in a local dataset: a link the listing does not descend
    into hides what the manifest names behind it, so removing it (as an unnamed object) would
    take the dataset's objects away, and following it would remove files outside the dataset
    (see :mod:`storage.io.local.paths`)."""
    shown = "; ".join(f"{rel} is a symlink to "
                      f"{os.path.realpath(replica.loc.path(rel))}" for rel in links[:5])
    more = f" (and {len(links) - 5} more)" if len(links) > 5 else ""
    return (f"{replica.name}: {shown}{more}. gc neither follows nor removes symlinks in a "
            "dataset, so it removes nothing: replace each link with the real folder or file")


def _parse(data: bytes, source: str) -> Manifest:
    try:
        return Manifest.from_json(data.decode("utf-8"), source=source)
    except (ManifestError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
        raise GcError(f"{source} cannot be read ({exc}); gc cannot tell what it names, so it "
                      "removes nothing") from None


def _names(store: ReplicaSet, manifest: Manifest, source: str) -> set[str]:
    """Every object path a version uses: what its manifest names, and (v2) its index's shards."""
    names = {path for path, _size, _sha in manifest.objects()} | {manifest.tokenizer.path}
    try:
        names |= {o.path for o in drop_records_of(store, manifest)}
    except (OSError, ValueError) as exc:
        listed = manifest.drops.path if manifest.drops is not None else "?"
        raise GcError(f"{source}: its list of drop records {listed} cannot be read "
                      f"({type(exc).__name__}: {exc})"[:500] + "; gc cannot tell which "
                      "records it names, so it removes nothing") from None
    if manifest.index is not None:
        try:
            names |= set(shard_paths_of(store, manifest))
        except (OSError, ValueError) as exc:
            raise GcError(f"{source}: its index {manifest.index.path} cannot be read "
                          f"({type(exc).__name__}: {exc})"[:500] + "; gc cannot tell which "
                          "shards it names, so it removes nothing") from None
    return names


def _kept_versions(scans: list[_Replica], keep: int, cutoff: float) -> dict[str, int]:
    """``{record path: sequence}`` of the versions to keep (see the module docstring)."""
    records: dict[str, tuple[int, str, float | None]] = {}
    for s in scans:
        for rel, info in s.tree.items():
            parsed = parse_version_name(rel)
            if parsed is None:
                continue
            t = mtime_of(info)
            old = records.get(rel)
            if old is not None and old[2] is not None and (t is None or old[2] < t):
                t = old[2]  # the first commit time any replica saw
            records[rel] = (parsed[0], parsed[1], t)
    ordered = sorted(records.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    current = {s.manifest_tag for s in scans if s.manifest_tag}
    manifest_times = [mtime_of(s.tree[MANIFEST]) for s in scans if MANIFEST in s.tree]
    kept = {}
    for i, (rel, (seq, tag, _t)) in enumerate(ordered):
        if i + 1 < len(ordered):
            superseded = ordered[i + 1][1][2]
        elif tag in current:
            superseded = None  # still current
        else:
            superseded = max((t for t in manifest_times if t is not None), default=None)
        if (i >= len(ordered) - keep or tag in current or superseded is None
                or superseded > cutoff):
            kept[rel] = seq
    return kept


def _pins(store: ReplicaSet, scans: list[_Replica], cutoff: float) -> tuple[set[str], list[str]]:
    """The source versions (first 16 hex digits of their sha256) the views' pins keep, and the
    pins that are stale (:mod:`storage.admin.view_pins`)."""
    trees: dict[str, dict[str, Any]] = {}
    for s in scans:
        for rel, info in s.tree.items():
            if view_pins.is_pin_path(rel):
                trees.setdefault(rel, info)
    if not trees:
        return set(), []
    try:
        pins = view_pins.read_pins(store, trees)
    except (OSError, ManifestError) as exc:
        raise GcError(f"a view pin cannot be read ({exc}); gc cannot tell what the views use, "
                      "so it removes nothing") from None
    uses = {name: view_pins.view_versions(store, name) for name in {p.view for p in pins}}
    young = {rel for rel, info in trees.items()
             if (t := mtime_of(info)) is None or t >= cutoff}
    kept, stale = view_pins.decide(pins, uses, young)
    return {v[:NAME_HASH] for v in kept}, stale


def _collectable(rel: str) -> bool:
    top = rel.split("/", 1)[0]
    return (top in (SHARDS_DIR, QUARANTINE_DIR, INDEX_DIR, MASKS_DIR, DOCLENS_DIR, LINEAGE_DIR,
                    CONTAMINATION_DIR)
            or is_tokenizer_name(rel)
            or card_tag(rel) is not None or ("/" not in rel and rel.startswith(".tmp-")))


def collect(store: ReplicaSet, keep: int, min_age_s: float = DEFAULT_MIN_AGE_S,
            dry_run: bool = False, now: float | None = None) -> GcReport:
    """Remove what no kept version names and is older than ``min_age_s`` (see module doc)."""
    if keep < 1:
        raise ValueError(f"--keep must be >= 1 (the current version is always kept), got {keep}")
    if min_age_s < 0:
        raise ValueError(f"--min-age must be >= 0, got {min_age_s}")
    now = time.time() if now is None else now
    cutoff = now - min_age_s
    scans = [_scan(r) for r in store.replicas]
    kept = _kept_versions(scans, keep, cutoff)
    pinned, stale_pins = _pins(store, scans, cutoff)
    for s in scans:  # the versions a view selects from, kept whatever --keep says
        for rel in s.tree:
            parsed = parse_version_name(rel)
            if parsed is not None and parsed[1] in pinned:
                kept[rel] = parsed[0]

    named: set[str] = set()
    for s in scans:
        if s.manifest is not None:
            named |= _names(store, s.manifest, f"{s.replica.name}: {MANIFEST}")
    for rel in kept:
        holder = next(s for s in scans if rel in s.tree)
        try:
            data = holder.replica.loc.fs.cat_file(holder.replica.loc.path(rel))
        except Exception as exc:
            raise GcError(f"{holder.replica.name}: cannot read kept version {rel} "
                          f"({type(exc).__name__}: {exc})"[:500]) from None
        source = f"{holder.replica.name}: {rel}"
        named |= _names(store, _parse(data, source), source)

    # a version's card (card/<manifest sha16>/...) is named by its version's tag, not its manifest
    cards = {parsed[1] for rel in kept if (parsed := parse_version_name(rel))}
    cards |= {s.manifest_tag for s in scans if s.manifest_tag}
    report = GcReport(len(scans), keep, min_age_s, dry_run, sorted(set(kept.values())))
    plans: list[tuple[_Replica, list[str], list[str], list[str]]] = []
    for s in scans:
        versions = [rel for rel in s.tree if parse_version_name(rel) and rel not in kept]
        objects = []
        objects += [rel for rel in stale_pins if rel in s.tree]
        for rel, info in s.tree.items():
            if (not _collectable(rel) or rel in named or card_tag(rel) in cards
                    or doclens_shard(rel) in named):  # a named shard keeps its token counts
                continue
            t = mtime_of(info)
            if t is not None and t < cutoff:
                objects.append(rel)
            else:
                report.young += 1
        work = [rel for rel in s.tree if rel.startswith(WORK_DIR + "/")]
        times = [mtime_of(s.tree[rel]) for rel in work]
        if work and any(t is None or t >= cutoff for t in times):
            report.work_in_progress = True
            work = []
        plans.append((s, sorted(versions), sorted(objects), sorted(work)))

    for s, versions, _objects, _work in plans:  # records first: see the module docstring
        report.versions += _remove(s, versions, cutoff, dry_run, report, recheck=False)
    for s, _versions, objects, work in plans:
        report.objects += _remove(s, objects, cutoff, dry_run, report, recheck=True)
        report.work += _remove(s, work, cutoff, dry_run, report, recheck=True)
        if work and not dry_run:
            _remove_empty_dirs(s.replica, WORK_DIR)
        report.uploads += _abort_old_uploads(s, cutoff, dry_run, report)
    return report


def _abort_old_uploads(s: _Replica, cutoff: float, dry_run: bool,
                       report: GcReport) -> list[Removal]:
    out = []
    for upload in s.uploads:
        rel = upload.relative
        if not (_collectable(rel) or rel.startswith(WORK_DIR + "/") or parse_version_name(rel)):
            continue  # not gc's to remove (a foreign tool's upload), like a foreign file
        if upload.initiated >= cutoff:
            report.young_uploads += 1
            continue
        if not dry_run:
            multipart.abort(s.replica.loc, upload)
        out.append(Removal(s.replica.name, f"{upload.relative} (upload {upload.upload_id})", 0))
    return out


def _remove(s: _Replica, rels: list[str], cutoff: float, dry_run: bool, report: GcReport,
            recheck: bool) -> list[Removal]:
    loc = s.replica.loc
    out: list[Removal] = []
    for batch in _batches(rels, _BATCH):
        if recheck and not dry_run:
            batch = [rel for rel in batch if _still_old(s.replica, rel, cutoff, report)]
        if not batch:
            continue
        if not dry_run:
            loc.fs.rm([loc.path(rel) for rel in batch])
        out += [Removal(s.replica.name, rel, int(s.tree[rel].get("size") or 0)) for rel in batch]
    return out


def _still_old(replica: Replica, rel: str, cutoff: float, report: GcReport) -> bool:
    """A second look right before removal: a rebuild may have just rewritten this name."""
    path = replica.loc.path(rel)
    try:
        replica.loc.fs.invalidate_cache(path)
        t = mtime_of(replica.loc.fs.info(path))
    except FileNotFoundError:
        return False
    if t is None or t >= cutoff:
        report.rewritten += 1
        return False
    return True


def _remove_empty_dirs(replica: Replica, rel: str) -> None:
    """Directories left empty on a local filesystem (object stores have none); never a file,
    so a run that starts writing meanwhile loses nothing."""
    if not replica.loc.is_local:
        return
    top = replica.loc.path(rel)
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _batches(items: list[str], n: int) -> Iterable[list[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
