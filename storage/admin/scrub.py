"""``verify`` and ``repair``: every replica against the newest committed version, fixed forward.

Which version that is comes from the history (:mod:`storage.admin.newest`): the highest-ranked
manifest, recorded under ``_versions/`` or live, whose manifest and index verify. Never the
first replica's manifest: a replica that missed a commit would otherwise be taken as the truth
and its older manifest copied over the newer ones.

Verification checks, on every replica: each object of that version the way a reader uses it,
streamed in bounded memory (:mod:`storage.admin.verify`: size, sha256, each row group's digest, the
footer, the decoded token counts); ``manifest.json`` is that version's (or names which older
one it serves); the version's record under ``_versions/`` is there; and no degraded-write
marker (:mod:`storage.io.degraded`) is still open. A newer manifest that does not verify is
reported (``unreadable``), never served.

Repair moves replicas forward only: it copies missing or corrupt objects from a replica whose
copy verifies, writes the version's record, then ``manifest.json`` last (a replica never shows
a manifest whose objects are not all in place), and removes a marker only once every replica
it names holds what it missed. A replica that serves a *newer* manifest than the target (one
that does not verify) is left alone and reported: rolling a replica back is an operator's
decision. A second repair finds nothing to do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from storage.admin.newest import Candidate, Choice, ReplicaView, choose
from storage.admin.verify import check_object
from storage.admin.view_check import check_view
from storage.format import tokens
from storage.format.checksums import PIECE_DIGEST, SHA256, digest_bytes
from storage.format.index import IndexShards, digest_algorithm
from storage.format.layout import MANIFEST, version_name
from storage.format.manifest import DatasetNotFoundError, Manifest, ShardInfo
from storage.io.atomic import write_atomic
from storage.io.degraded import Marker
from storage.io.index_store import shards_of
from storage.io.replicas.replica_set import Replica, ReplicaError, ReplicaSet
from storage.io.urls import display_url


@dataclass
class Problem:
    replica: str
    path: str
    #: missing | corrupt | unreachable | stale-manifest | unreadable (a newer version, or the
    #: index) | degraded (an open marker)
    kind: str
    detail: str = ""


@dataclass
class ScrubReport:
    objects: int
    replicas: int
    problems: list[Problem] = field(default_factory=list)
    repaired: list[Problem] = field(default_factory=list)
    unrepairable: list[Problem] = field(default_factory=list)
    #: the version checked against: ``version 3`` (or ``unrecorded manifest <tag>``)
    version: str = ""
    #: facts that are not problems (a live manifest without a record: the next commit adds it)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        of = f" of {self.version}" if self.version else ""
        lines = [f"checked {self.objects} objects{of} x {self.replicas} replicas"]
        for p in self.problems:
            lines.append(f"  {p.kind:14} {p.path}  on {p.replica}  {p.detail}".rstrip())
        for p in self.repaired:
            lines.append(f"  repaired       {p.path}  on {p.replica}")
        for p in self.unrepairable:
            lines.append(f"  UNREPAIRABLE   {p.path}  on {p.replica}  {p.detail}".rstrip())
        lines += [f"  note: {n}" for n in self.notes]
        if self.ok:
            lines.append("OK: every object present with the right checksum")
        elif self.repaired and not self.unrepairable:
            lines.append(f"{len(self.problems)} problem(s) found, all repaired")
        else:
            lines.append(f"{len(self.problems)} problem(s) found, "
                         f"{len(self.unrepairable)} not repaired")
        return "\n".join(lines)


@dataclass
class _Plan:
    """The target version's objects with what a check needs for each."""

    objects: list[tuple[str, int, str]]
    #: a shard by path: ``IndexShards.get`` for a v2 dataset (each ``ShardInfo`` built when its
    #: shard is checked, not all held: ~46 GB at 100 TB), a dict's for a v1 one
    shard: Callable[[str], ShardInfo | None]
    algorithm: str
    encoding: str


def _plan(store: ReplicaSet, target: Candidate) -> _Plan:
    m = target.manifest
    assert m is not None
    shards = shards_of(store, m)
    algorithm = (m.index.digest if m.index is not None
                 else digest_algorithm(m.shards) if m.shards else SHA256)
    shard = (shards.get if isinstance(shards, IndexShards)
             else {s.path: s for s in shards}.get)
    return _Plan(target.objects, shard, algorithm,
                 m.schema.get("input_ids", tokens.LEGACY_LIST))


def _check(replica: Replica, plan: _Plan, path: str, size: int, sha: str) -> Problem | None:
    finding = check_object(replica.loc, path, size, sha, plan.shard(path),
                           plan.algorithm if plan.algorithm in (PIECE_DIGEST, SHA256)
                           else SHA256, plan.encoding)
    return None if finding is None else Problem(replica.name, path, finding.kind,
                                                finding.detail)


def _manifest_problem(choice: Choice, view: ReplicaView) -> Problem | None:
    target = choice.target
    assert target is not None
    name = view.replica.name
    if view.live_tag == target.tag:
        return None
    if view.live_tag is None:
        kind = "missing" if view.live_error == "missing" else "unreachable"
        return Problem(name, MANIFEST, kind, "" if kind == "missing" else view.live_error)
    live = next(c for c in choice.candidates if c.tag == view.live_tag)
    if choice.rank(view.live_tag) < choice.rank(target.tag):
        return Problem(name, MANIFEST, "unreadable",
                       f"serves {live.label}, newer than {target.label} but it does not "
                       f"verify: {live.error}"[:300])
    return Problem(name, MANIFEST, "stale-manifest",
                   f"serves {live.label}; the newest committed is {target.label}")


def _record_problem(choice: Choice, view: ReplicaView) -> Problem | None:
    """The target's record under ``_versions/`` on this replica (the manifest -> index ->
    _versions chain), where the dataset keeps records at all."""
    target = choice.target
    assert target is not None
    if not choice.has_records or not view.listed:
        return None
    if target.sequence is None:
        return None  # a note (see _verify): readable, and the next commit records it
    if view.replica.index in target.records:
        return None
    return Problem(view.replica.name, version_name(target.sequence, digest_bytes(target.data)),
                   "missing", f"the record of {target.label}")


def _open_markers(store: ReplicaSet, choice: Choice) -> list[tuple[Marker, Replica]]:
    """(marker, replica it names) pairs whose replica does not yet hold what it missed."""
    target = choice.target
    out = []
    for m in choice.markers:
        for r in store.replicas:
            if not m.names_replica(r.index, r.loc.url):
                continue
            if m.path == MANIFEST:
                view = choice.views[r.index]
                serves = choice.rank(view.live_tag)
                if target is not None and view.live_tag == target.tag and \
                        choice.rank(m.sha256[:16]) >= serves:
                    continue  # it serves the target, at least as new as what it missed
                if view.live_tag is not None and serves <= choice.rank(m.sha256[:16]):
                    continue
                out.append((m, r))
                continue
            if _holds(r, m.path, m.sha256):
                continue
            out.append((m, r))
    return out


def _obsolete(store: ReplicaSet, m: Marker) -> bool:
    """A marker whose object no replica holds with those bytes any more (scratch under
    ``_work/`` removed after its run, an object gc removed): nothing left to repair."""
    return m.path != MANIFEST and bool(m.sha256) and not any(
        _holds(r, m.path, m.sha256) for r in store.replicas)


def _holds(replica: Replica, path: str, sha256: str) -> bool:
    if not sha256:  # an old marker: the object must be there at least
        try:
            return bool(replica.loc.fs.exists(replica.loc.path(path)))
        except Exception:
            return False
    try:
        info = replica.loc.fs.info(replica.loc.path(path))
    except Exception:
        return False
    return check_object(replica.loc, path, int(info.get("size") or 0), sha256) is None


def verify(store: ReplicaSet, manifest: Manifest | None = None) -> ScrubReport:
    """Every replica against the newest committed version that verifies (see the module).

    ``manifest`` is accepted for compatibility and ignored: which version is current is the
    history's decision, not the caller's (a caller's manifest is one replica's view)."""
    del manifest
    return _verify(store, choose(store))


def _verify(store: ReplicaSet, choice: Choice) -> ScrubReport:
    if not choice.candidates and all(v.listed for v in choice.views):
        raise DatasetNotFoundError(
            f"no dataset at {display_url(store.url)}: {MANIFEST} is missing and no version is "
            "recorded on any replica")
    blind = [v for v in choice.views
             if not v.listed or (v.live_error and v.live_error != "missing")]
    if not choice.candidates and blind:
        # Nothing could be read to decide on: that is a store failure (one error line, rc 2),
        # not a dataset found damaged.
        raise ReplicaError("cannot read the dataset on any replica: " + "; ".join(
            f"{v.replica.name}: {v.list_error or v.live_error}" for v in blind))
    report = ScrubReport(objects=0, replicas=len(store.replicas))
    for c in choice.newer_invalid:
        where = (", ".join(store.replicas[i].name for i in c.live_on) or
                 ", ".join(store.replicas[i].name for i in c.records))
        report.problems.append(Problem(where, MANIFEST if c.live_on else
                                       next(iter(c.records.values())).path, "unreadable",
                                       f"{c.label}: {c.error}"[:300]))
    if choice.undecided or choice.target is None:
        detail = choice.undecided or "no replica holds a manifest that verifies"
        report.problems.append(Problem("every replica", MANIFEST, "unreadable", detail))
        return report
    target = choice.target
    report.version = target.label
    if target.sequence is None and choice.has_records:
        report.notes.append(f"manifest.json ({target.label}) has no record under _versions/; "
                            "the next commit records it")
    plan = _plan(store, target)
    report.objects = len(plan.objects) + 1
    for view in choice.views:
        for path, size, sha in plan.objects:
            problem = _check(view.replica, plan, path, size, sha)
            if problem:
                report.problems.append(problem)
        for problem in (_manifest_problem(choice, view), _record_problem(choice, view)):
            if problem:
                report.problems.append(problem)
    if target.manifest is not None and target.manifest.view is not None:
        # a view: the source objects it names and its keep-masks (storage.admin.view_check)
        checked, found = check_view(store, target.manifest)
        report.objects += checked
        report.problems += [Problem(p.replica, p.path, p.kind, p.detail) for p in found]
    seen = {(p.path, p.replica) for p in report.problems}
    for m, r in _open_markers(store, choice):
        if (m.path, r.name) not in seen and not _obsolete(store, m):
            report.problems.append(Problem(r.name, m.path, "degraded",
                                           f"missed this write ({m.name})"))
    return report


def _good_copy(store: ReplicaSet, plan: _Plan | None, path: str, size: int | None,
               sha256: str) -> bytes | None:
    """The object's bytes from a replica whose copy verifies (streamed first)."""
    for replica in store.replicas:
        try:
            if size is None:
                size = int(replica.loc.fs.info(replica.loc.path(path)).get("size") or 0)
            ok = (check_object(replica.loc, path, size, sha256) if plan is None
                  else _check(replica, plan, path, size, sha256))
            if ok is not None:
                continue
            data = bytes(replica.loc.fs.cat_file(replica.loc.path(path)))
        except Exception:
            continue
        if digest_bytes(data) == sha256:
            return data
    return None


def repair(store: ReplicaSet, manifest: Manifest | None = None) -> ScrubReport:
    """Move every replica forward to the newest committed version (see the module)."""
    del manifest
    choice = choose(store)
    report = _verify(store, choice)
    target = choice.target
    if target is None or choice.undecided:
        report.unrepairable.extend(report.problems)
        return report
    plan = _plan(store, target)
    sizes = {path: (size, sha) for path, size, sha in plan.objects}
    by_name = {r.name: r for r in store.replicas}
    blocked: set[str] = set()  # replicas whose manifest must not be written
    manifests: list[Problem] = []
    for problem in report.problems:
        replica = by_name.get(problem.replica)
        if replica is None:
            report.unrepairable.append(problem)
            continue
        if problem.path == MANIFEST and problem.kind in ("stale-manifest", "missing",
                                                         "degraded"):
            manifests.append(problem)
            continue
        if problem.path == MANIFEST and problem.kind != "degraded":
            # a newer manifest that does not verify, or an unreachable one
            problem.detail += " (left as it is: repair never rolls a replica back)"
            report.unrepairable.append(problem)
            blocked.add(replica.name)
            continue
        if problem.path in sizes:
            size, sha = sizes[problem.path]
            data = _good_copy(store, plan, problem.path, size, sha)
        elif target.sequence and problem.path == version_name(target.sequence,
                                                              digest_bytes(target.data)):
            data = target.data
        else:
            data = None  # a degraded marker's object outside the version: handled below
            if problem.kind == "degraded":
                continue
        if data is None:
            problem.detail = "no replica has a good copy"
            report.unrepairable.append(problem)
            blocked.add(replica.name)
            continue
        if _write(replica, problem, data, report):
            continue
        blocked.add(replica.name)
    # the manifests: last, once the objects are in
    for problem in manifests:
        replica = by_name[problem.replica]
        if replica.name in blocked:
            problem.detail += " (not written: its objects could not all be repaired)"
            report.unrepairable.append(problem)
            continue
        view = choice.views[replica.index]
        if view.live_tag is not None and choice.rank(view.live_tag) < choice.rank(target.tag):
            report.unrepairable.append(problem)  # newer, invalid: never rolled back
            continue
        if problem.kind == "degraded" and view.live_tag == target.tag:
            continue
        _write(replica, problem, target.data, report)
    _resolve_markers(store, report)
    return report


def _write(replica: Replica, problem: Problem, data: bytes, report: ScrubReport) -> bool:
    try:
        write_atomic(replica.loc, problem.path, data)
    except Exception as exc:
        problem.detail = f"{type(exc).__name__}: {exc}"[:200]
        report.unrepairable.append(problem)
        return False
    if problem not in report.repaired:
        report.repaired.append(problem)
    return True


def _resolve_markers(store: ReplicaSet, report: ScrubReport) -> None:
    """Copy what open markers say was missed (objects outside the version too: an older
    version's record, a shard), then remove every marker whose replicas all hold it now.

    A marker whose object no replica holds with those bytes any more (scratch under
    ``_work/`` removed after its run, an object gc removed) names nothing to repair: it is
    removed too, and reported."""
    choice = choose(store)  # after the repairs above: what each replica holds now
    open_pairs = _open_markers(store, choice)
    for m, r in open_pairs:
        if m.path == MANIFEST:
            continue
        data = _good_copy(store, None, m.path, None, m.sha256) if m.sha256 else None
        if data is None:
            continue
        _write(r, Problem(r.name, m.path, "degraded"), data, report)
    still = {m.name for m, _r in _open_markers(store, choose(store))}
    for m in choice.markers:
        if m.name in still and not _obsolete(store, m):
            continue
        for replica in store.replicas:
            fs = replica.loc.fs
            try:
                path = replica.loc.path(m.name)
                if fs.exists(path):
                    fs.rm_file(path)
            except Exception:  # best effort: the next repair removes it
                continue
    for replica in store.replicas:  # an empty _degraded/ folder (local filesystems)
        fs, root = replica.loc.fs, replica.loc.path("_degraded")
        try:
            if replica.loc.is_local and fs.exists(root) and not fs.ls(root):
                fs.rmdir(root)
        except Exception:
            continue

