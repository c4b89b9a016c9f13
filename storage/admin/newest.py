"""Which version is current, decided by the version history, for admin tools.

Replicas can disagree about ``manifest.json``: a commit that met its write quorum but missed
a replica leaves that replica on the older version. Taking the first replica's manifest as
the truth (what ``ReplicaSet.read_manifest`` does for readers) would then let ``repair`` copy
the *older* manifest over the replicas that hold the newer one: a committed version rolled
back and orphaned. So admin tools (``verify``, ``repair``) decide by the history instead:

- every version record under ``_versions/`` on every replica that can be listed, and every
  replica's live ``manifest.json``, is a candidate;
- a recorded manifest ranks by its highest sequence; a live manifest that no replica has a
  record of ranks above every record (``commit`` records the live manifest before each swap,
  so an unrecorded live one was committed after the last record, whose own write failed);
  several such are ordered by a degraded-write marker naming one (the writer's own word that
  it is the newer), then by how many replicas serve it;
- the highest-ranked candidate whose manifest parses and whose index verifies (checksums and
  every value, :func:`storage.format.index.check_values`) is the *target*: the version every
  replica must serve. A replica is only ever moved forward to it; a newer candidate that does
  not verify is reported, not served.

When a replica cannot be read or listed at all and a candidate newer than the best valid one
failed, nothing is decided (``undecided``): that replica might hold what makes it valid.

Readers keep ``ReplicaSet.read_manifest`` (the first valid manifest, no listing: readers never
list the store), which serves a lagging primary's older version until ``repair`` runs; the
pipeline reports a degraded commit so that it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.admin.verify import read_small
from storage.admin.versions import Version, list_versions
from storage.format.checksums import digest_bytes
from storage.format.layout import MANIFEST, NAME_HASH, UnsafePathError
from storage.format.manifest import Manifest, ManifestError
from storage.io.degraded import Marker, all_markers
from storage.io.index_store import objects_of
from storage.io.replicas.replica_set import Replica, ReplicaSet
from storage.io.retry import TIMEOUT, classify


@dataclass
class Candidate:
    """One manifest some replica serves or records."""

    tag: str  # sha256 of the manifest bytes, first 16 hex digits
    sequence: int | None  # None: no replica has a record of it
    records: dict[int, Version] = field(default_factory=dict)  # replica index -> its record
    live_on: list[int] = field(default_factory=list)  # replicas serving it as manifest.json
    marked: bool = False  # a degraded-write marker names these bytes for manifest.json
    data: bytes = b""
    manifest: Manifest | None = None
    objects: list[tuple[str, int, str]] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        return f"version {self.sequence}" if self.sequence else f"unrecorded manifest {self.tag}"


@dataclass
class ReplicaView:
    replica: Replica
    live_tag: str | None = None  # None: no readable manifest.json
    live_error: str = ""  # "missing", or why it could not be read
    listed: bool = True
    list_error: str = ""


@dataclass
class Choice:
    """What the admin tools act on: ``target`` (None when no version verifies, or when it
    could not be decided), the candidates newest first, each replica's view, the markers."""

    target: Candidate | None
    candidates: list[Candidate]
    views: list[ReplicaView]
    markers: list[Marker]
    undecided: str = ""

    def rank(self, tag: str | None) -> int:
        """Position from the newest (0); unknown tags rank last."""
        for i, c in enumerate(self.candidates):
            if c.tag == tag:
                return i
        return len(self.candidates)

    @property
    def newer_invalid(self) -> list[Candidate]:
        """Candidates newer than the target that do not verify."""
        if self.target is None:
            return [c for c in self.candidates if c.error]
        return [c for c in self.candidates[:self.rank(self.target.tag)] if c.error]

    @property
    def has_records(self) -> bool:
        return any(c.records for c in self.candidates)


def _tag(data: bytes) -> str:
    return digest_bytes(data)[:NAME_HASH]


def _load(store: ReplicaSet, c: Candidate) -> None:
    """Fetch the candidate's bytes (a live copy or a record whose bytes hash to its tag),
    then parse it and verify its index; sets ``error`` when it does not verify."""
    sources = [(i, MANIFEST) for i in c.live_on] + [(i, v.path) for i, v in c.records.items()]
    problems = []
    for i, path in sources:
        try:
            data = read_small(store.replicas[i].loc, path)
        except Exception as exc:
            problems.append(f"{path} on replica {i}: {type(exc).__name__}: {exc}"[:200])
            continue
        if _tag(data) != c.tag:
            problems.append(f"{path} on replica {i}: its bytes do not hash to {c.tag}")
            continue
        c.data = data
        break
    if not c.data:
        c.error = "; ".join(problems) or "no copy found"
        return
    try:
        c.manifest = Manifest.from_json(c.data, source=f"{MANIFEST} ({c.label})")
        # for v2, from its index: read, verified (checksums, values, the manifest's totals)
        # and cached for the scrub that follows
        c.objects = objects_of(store, c.manifest)
    except (ManifestError, UnsafePathError, ValueError, OSError) as exc:
        c.error = f"{type(exc).__name__}: {exc}"[:300]
        c.manifest = None


def choose(store: ReplicaSet) -> Choice:
    """The newest committed version that verifies, and what each replica holds."""
    views: list[ReplicaView] = []
    by_tag: dict[str, Candidate] = {}
    for replica in store.replicas:
        view = ReplicaView(replica)
        views.append(view)
        try:
            for v in list_versions(replica.loc):
                c = by_tag.setdefault(v.tag, Candidate(v.tag, v.sequence))
                c.sequence = max(c.sequence or 0, v.sequence)
                c.records[replica.index] = v
        except Exception as exc:
            view.listed, view.list_error = False, f"{type(exc).__name__}: {exc}"[:200]
            if classify(exc) == TIMEOUT:  # hung: asking it again only adds another timeout
                view.live_error = view.list_error
                continue
        try:
            data = read_small(replica.loc, MANIFEST)
        except FileNotFoundError:
            view.live_error = "missing"
            continue
        except Exception as exc:
            view.live_error = f"{type(exc).__name__}: {exc}"[:200]
            continue
        view.live_tag = _tag(data)
        c = by_tag.setdefault(view.live_tag, Candidate(view.live_tag, None))
        c.live_on.append(replica.index)
    hung = frozenset(v.replica.index for v in views if not v.listed and v.live_error)
    markers, _errors = all_markers(store, hung)
    for m in markers:
        if m.path == MANIFEST and m.sha256[:NAME_HASH] in by_tag:
            by_tag[m.sha256[:NAME_HASH]].marked = True
    top = max((c.sequence or 0 for c in by_tag.values()), default=0)
    candidates = sorted(by_tag.values(), key=lambda c: (
        c.sequence if c.sequence is not None else top + 1, c.marked, len(c.live_on),
        -min(c.live_on, default=len(views))), reverse=True)
    blind = [v for v in views if not v.listed or (v.live_error and v.live_error != "missing")]
    choice = Choice(None, candidates, views, markers)
    for c in candidates:
        _load(store, c)
        if not c.error:
            choice.target = c
            break
        if blind:
            choice.undecided = (f"{c.label} does not verify ({c.error}) and "
                                f"{blind[0].replica.name} cannot be read "
                                f"({blind[0].list_error or blind[0].live_error}): not deciding "
                                "which version is current")
            return choice
    return choice
