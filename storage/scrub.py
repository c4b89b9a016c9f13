"""``verify`` and ``repair``: check every object of a manifest on every replica, fix the gaps.

Verification reads each object in full and compares its sha256 with the manifest's (for a v2
manifest: the index object's, and the shards' as the index, verified first, gives them). Repair
copies a missing or corrupt object from a replica whose copy verifies, writes the manifest
last, and clears degraded-write markers; a second repair finds nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.checksums import digest_bytes
from storage.index import objects_of
from storage.layout import MANIFEST
from storage.manifest import Manifest, write_atomic
from storage.replicas import DEGRADED_DIR, Replica, ReplicaSet


@dataclass
class Problem:
    replica: str
    path: str
    kind: str  # missing | corrupt | unreachable | stale-manifest | unreadable (the index)
    detail: str = ""


@dataclass
class ScrubReport:
    objects: int
    replicas: int
    problems: list[Problem] = field(default_factory=list)
    repaired: list[Problem] = field(default_factory=list)
    unrepairable: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [f"checked {self.objects} objects x {self.replicas} replicas"]
        for p in self.problems:
            lines.append(f"  {p.kind:14} {p.path}  on {p.replica}  {p.detail}".rstrip())
        for p in self.repaired:
            lines.append(f"  repaired       {p.path}  on {p.replica}")
        for p in self.unrepairable:
            lines.append(f"  UNREPAIRABLE   {p.path}  on {p.replica}  {p.detail}".rstrip())
        if self.ok:
            lines.append("OK: every object present with the right checksum")
        elif self.repaired and not self.unrepairable:
            lines.append(f"{len(self.problems)} problem(s) found, all repaired")
        else:
            lines.append(f"{len(self.problems)} problem(s) found, "
                         f"{len(self.unrepairable)} not repaired")
        return "\n".join(lines)


def _check(replica: Replica, path: str, sha256: str) -> Problem | None:
    try:
        data = replica.loc.fs.cat_file(replica.loc.path(path))
    except FileNotFoundError:
        return Problem(replica.name, path, "missing")
    except Exception as exc:
        return Problem(replica.name, path, "unreachable", f"{type(exc).__name__}: {exc}"[:200])
    actual = digest_bytes(data)
    if actual != sha256:
        return Problem(replica.name, path, "corrupt",
                       f"sha256 {actual[:12]}... != manifest {sha256[:12]}...")
    return None


def verify(store: ReplicaSet, manifest: Manifest | None = None) -> ScrubReport:
    """Every object of the manifest, on every replica: present, with the right checksum."""
    manifest = manifest or store.read_manifest()
    unreadable = None
    try:
        objects = objects_of(store, manifest)
    except (OSError, ValueError) as exc:  # no replica has a good index: check the rest
        objects = manifest.objects()
        unreadable = Problem("every replica", manifest.index.path if manifest.index else "",
                             "unreadable", f"{type(exc).__name__}: {exc}"[:200] +
                             " (its shards cannot be listed, so they were not checked)")
    manifest_bytes = manifest.to_json().encode("utf-8")
    report = ScrubReport(objects=len(objects) + 1, replicas=len(store.replicas))
    if unreadable is not None:
        report.problems.append(unreadable)
    for replica in store.replicas:
        for path, _size, sha in objects:
            problem = _check(replica, path, sha)
            if problem:
                report.problems.append(problem)
        problem = _check(replica, MANIFEST, digest_bytes(manifest_bytes))
        if problem:
            problem.kind = "stale-manifest" if problem.kind == "corrupt" else problem.kind
            report.problems.append(problem)
    return report


def _good_copy(store: ReplicaSet, path: str, sha256: str) -> bytes | None:
    for replica in store.replicas:
        try:
            data = replica.loc.fs.cat_file(replica.loc.path(path))
        except Exception:
            continue
        if digest_bytes(data) == sha256:
            return data
    return None


def repair(store: ReplicaSet, manifest: Manifest | None = None) -> ScrubReport:
    """Re-copy missing or corrupt objects from a good replica; the manifest goes last."""
    manifest = manifest or store.read_manifest()
    report = verify(store, manifest)
    by_name = {r.name: r for r in store.replicas}
    manifest_bytes = manifest.to_json().encode("utf-8")
    try:
        sums = {path: sha for path, _size, sha in objects_of(store, manifest)}
    except (OSError, ValueError):
        sums = {path: sha for path, _size, sha in manifest.objects()}
    sums[MANIFEST] = digest_bytes(manifest_bytes)
    # Data objects first, manifests after: a replica must never show a manifest whose
    # objects are not all in place.
    ordered = sorted(report.problems, key=lambda p: p.path == MANIFEST)
    for problem in ordered:
        if problem.replica not in by_name:
            report.unrepairable.append(problem)
            continue
        data = (manifest_bytes if problem.path == MANIFEST
                else _good_copy(store, problem.path, sums[problem.path]))
        if data is None:
            problem.detail = "no replica has a good copy"
            report.unrepairable.append(problem)
            continue
        try:
            write_atomic(by_name[problem.replica].loc, problem.path, data)
            report.repaired.append(problem)
        except Exception as exc:
            problem.detail = f"{type(exc).__name__}: {exc}"[:200]
            report.unrepairable.append(problem)
    if not report.unrepairable:
        _clear_degraded_markers(store)
    return report


def _clear_degraded_markers(store: ReplicaSet) -> None:
    for replica in store.replicas:
        fs, root = replica.loc.fs, replica.loc.path(DEGRADED_DIR)
        try:
            if fs.exists(root):
                fs.rm(root, recursive=True)
        except Exception:  # best effort: a later repair clears them
            continue
