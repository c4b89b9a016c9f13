"""One writer per dataset output: a lease object, ``_lease.json``, on the store.

Why: two writers into one output share its ``_work/`` scratch; the first to commit removes it
under the other, which then fails half-way (and two commits would race for ``manifest.json``).
A writer therefore holds the output's lease from before its first write until after its commit.

The lease names its holder (host, pid, run id, start time) and an expiry (a wall-clock time,
``ttl_s`` after the last renewal). The holder renews it every third of the TTL from a
background thread; a second writer fails at once naming the holder, or polls until the lease is
free (:meth:`Lease.acquire` with ``wait``).

Protocol, using one atomic primitive, *create if absent*:

- acquire: create ``_lease.json`` if absent, then read it back (it must hold our run id);
- a lease is *stale* when its expiry has passed, or when its holder runs on this host (same
  hostname and pid namespace) and its pid is gone. Whatever is no valid lease (every field is
  checked, the file read with a bound and opened as a regular file:
  :mod:`storage.io.lease_record`) is an *invalid lease*, reported as that file's fault and
  stale a TTL after this process first saw it (or once the store dates it a TTL old);
  ``python -m storage unlock`` (:mod:`storage.admin.unlock`) removes one at once, and every
  "held by" message names that command;
- take-over of a stale lease: create ``_lease-takeover-<stale run id>.json`` if absent; only one
  candidate can, for one stale holder. The winner reads the lease again, checks that it still
  names the stale holder, replaces it with its own and removes the token. A candidate that
  creates a token only after the winner removed it reads the winner's lease, not the stale one,
  and backs off;
- renew: only while our own expiry has not passed (by our clock), after reading the lease back
  as ours; a renewal that finds another holder, or that could not happen before our expiry,
  marks the lease *lost*. Renewal and take-over thus need disjoint times (clocks of hosts
  sharing an output must agree to well within the TTL);
- :meth:`Lease.check`, right before a commit: raises :class:`LeaseLostError` when the lease was
  lost, is within a sixth of the TTL of expiring, or the store names another holder;
- release: delete the lease if it still names us (also after a failure).

*Create if absent* where the store offers it: on a local (or network) filesystem the lease is
written complete to a temporary file and hard-linked to its name (``link`` fails with EEXIST
when the name exists: atomic, and a reader never sees a half-written lease); on S3 a
conditional ``PutObject`` with ``If-None-Match: *`` (AWS, SeaweedFS, recent MinIO). Whether an
S3 endpoint honours it is probed once per process and bucket (a second conditional create of a
probe object must be refused). Fallback, for stores that ignore the condition or lack it (other
fsspec filesystems): create when absent, then twice wait ``settle_s`` and read back. The last
writer's bytes win and every other creator reads foreign bytes and backs off. That is only as
safe as ``settle_s`` is longer than the store's write latency and visibility delay.

Readers and ``gc`` never see the lease: readers do not list, and gc removes only what it knows.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from storage.format.layout import LEASE, LEASE_TAKEOVER_PREFIX
from storage.io.atomic import write_atomic
from storage.io.lease_record import (
    FORMAT,
    MAX_TTL_S,
    Found,
    Holder,
    InvalidLease,
    invalid_blocker,
    pid_namespace,
    positive_seconds,
    read_lease,
    when,
)
from storage.io.retry import TIMEOUT, TRANSIENT, classify
from storage.io.urls import Location, display_url

__all__ = ["FORMAT", "MAX_TTL_S", "Holder", "InvalidLease", "Lease",
           "LeaseError", "LeaseHeldError", "LeaseLostError", "PrimaryUnavailableError",
           "StoreSilentError", "break_lease", "hold", "take", "unlock_command", "waiting_line"]

#: how long a lease lasts without renewal; its holder renews it every third of that
DEFAULT_TTL_S = 90.0
#: fallback create-if-absent: how long to wait before reading back who won
DEFAULT_SETTLE_S = 1.0
#: kept for callers of the names before :mod:`storage.io.lease_record` held them
_when, _pid_namespace = when, pid_namespace
#: a folder in a lease's place on an object store is removed only up to this many objects
MAX_FOLDER_OBJECTS = 1000


def unlock_command(url: str) -> str:
    """The command that shows a replica's lease and breaks it once its holder is gone."""
    return f"python -m storage unlock {shlex.quote(url)}"


class LeaseError(OSError):
    """The output's writer lease could not be taken or kept."""


class LeaseHeldError(LeaseError):
    """Another writer holds the output's lease, or an invalid lease is in its place (not yet
    stale); ``holder`` says which. Every message names ``python -m storage unlock``."""

    def __init__(self, url: str, holder: Holder | InvalidLease, hint: str = "") -> None:
        self.url, self.holder = url, holder
        hint = f"; {hint}" if hint else ""
        if isinstance(holder, InvalidLease):
            message = (f"{url} has {holder.describe()}{hint}; to remove it now: "
                       f"{unlock_command(url)}")
        else:
            message = (f"{url} is being written by another run: {holder.describe()}{hint}; "
                       f"if that writer is gone: {unlock_command(url)}")
        super().__init__(message)


class LeaseLostError(LeaseError):
    """Our lease expired or another writer took it over: we must not commit."""


class BrokenLeaseError(LeaseError):
    """An invalid lease that is stale could not be cleared away (a folder of too many
    objects): the lease's fault, said so, never blamed on the store."""


def _precondition_failed(exc: BaseException) -> bool:
    """An S3 conditional write refused: 412 PreconditionFailed, or MinIO's 409 for a
    conditional write racing another (s3fs re-raises these as ``OSError`` with the botocore
    ``ClientError`` as cause)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412,
                                                                                         409):
                return True
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return False


def _writer_fs(loc: Location) -> Any:
    """The filesystem that writes: s3fs behind an obstore read client, else ``loc.fs``."""
    return getattr(loc.fs, "fsspec", loc.fs)


def _is_s3(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", ())
    return bool({"s3", "s3a"} & set([protocol] if isinstance(protocol, str) else protocol))


#: a PutObject that fails when the key exists (passed to botocore by s3fs's ``pipe_file``;
#: s3fs's own ``mode="create"`` is the same header, in s3fs 2024.12 and later only)
_IF_ABSENT = {"IfNoneMatch": "*"}
_conditional: dict[str, bool] = {}
_conditional_lock = threading.Lock()


def conditional_creates(loc: Location) -> bool:
    """Whether ``loc``'s store refuses a second create-if-absent of one name.

    Local filesystems do (``link``). S3 endpoints are probed once per process and bucket: an
    endpoint that ignores ``If-None-Match`` would let two writers both "create" the lease.
    """
    if loc.is_local:
        return True
    fs = _writer_fs(loc)
    if not _is_s3(fs):
        return False
    key = f"{getattr(fs, 'endpoint_url', '')}|{loc.root.split('/', 1)[0]}"
    with _conditional_lock:
        if key in _conditional:
            return _conditional[key]
    probe = loc.path(f"{LEASE_TAKEOVER_PREFIX}probe-{uuid.uuid4().hex}.json")
    try:
        fs.pipe_file(probe, b"{}", **_IF_ABSENT)
    except Exception as exc:
        boto = sys.modules.get("botocore.exceptions")
        if boto is None or not isinstance(exc, boto.ParamValidationError):
            raise
        honoured = False  # a botocore without conditional writes: the fallback
    else:
        try:
            fs.pipe_file(probe, b"{}", **_IF_ABSENT)
            honoured = False
        except OSError as exc:
            if not _precondition_failed(exc):
                raise
            honoured = True
    finally:
        with contextlib.suppress(Exception):
            fs.rm_file(probe)
    with _conditional_lock:
        _conditional[key] = honoured
    return honoured


def create_if_absent(loc: Location, relative: str, data: bytes,
                     settle_s: float = DEFAULT_SETTLE_S, conditional: bool | None = None) -> bool:
    """Create ``relative`` holding ``data`` unless it exists; True when this call created it.

    Atomic where the store offers it (see the module docstring); ``conditional=False`` forces
    the fallback (create when absent, then twice wait ``settle_s`` and read back).
    """
    if conditional is None:
        conditional = conditional_creates(loc)
    path = loc.path(relative)
    if loc.is_local and conditional:
        return _link_new(path, data)
    fs = _writer_fs(loc)
    if conditional:
        try:
            fs.pipe_file(path, data, **_IF_ABSENT)
        except OSError as exc:
            if _precondition_failed(exc):
                return False
            raise
        return True
    if _read(loc, relative) is not None:
        return False
    write_atomic(loc, relative, data)
    # Two looks a settle time apart: a racer whose write lands late (after our first look)
    # overwrites ours, and we must see that before we call the object ours.
    for _ in range(2):
        time.sleep(settle_s)
        if _read(loc, relative) != data:
            return False
    return True


def _link_new(path: str, data: bytes) -> bool:
    """Write ``data`` to a synced temporary file and hard-link it to ``path`` (EEXIST: False)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".lease")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            return _exclusive_open(path, data)  # a filesystem without hard links
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _exclusive_open(path: str, data: bytes) -> bool:
    """``O_CREAT | O_EXCL``: atomic, but a reader may see the file before its bytes (such a
    lease does not parse and counts as held until it is a TTL old)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def _read(loc: Location, relative: str) -> bytes | None:
    """What is at ``relative`` (at most a lease's size and one byte, never from a cache; a
    folder or special file as a marker of its kind); ``None`` when absent."""
    return read_lease(loc, relative).identity


def _age_s(loc: Location, relative: str, now: float) -> float:
    """How long ago the object was last written (0 where the store does not say)."""
    from storage.io.listing import mtime_of

    path = loc.path(relative)
    with contextlib.suppress(Exception):
        loc.fs.invalidate_cache(path)
        t = mtime_of(loc.fs.info(path))
        if t is not None:
            return max(0.0, now - t)
    return 0.0


def _delete(loc: Location, relative: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _writer_fs(loc).rm_file(loc.path(relative))


def _clear(loc: Location, found: Found) -> str:
    """Remove the invalid or stale thing ``found`` at the lease's name; returns a note for
    the user (``""``: nothing to say).

    A folder in its place is moved aside on a local filesystem (one rename, nothing lost:
    its contents were never ours to judge) and its objects removed on an object store (no
    rename there; some stores let no lease be created beside them, and keep the emptied
    folder until it is removed by name). Anything else is removed like a lease."""
    if not found.folder:
        _delete(loc, LEASE)
        return ""
    path = loc.path(LEASE)
    if loc.is_local:
        aside = f"{LEASE}.invalid-{uuid.uuid4().hex[:8]}"
        os.rename(path, loc.path(aside))
        return f"the folder {LEASE} was moved aside to {aside}"
    fs = _writer_fs(loc)
    fs.invalidate_cache(path)
    objects = [p for p in fs.find(path + "/") if p.rstrip("/") != path.rstrip("/")]
    if len(objects) > MAX_FOLDER_OBJECTS:
        raise BrokenLeaseError(
            f"{display_url(loc.url)}: a folder of {len(objects)} objects lies where its "
            f"writer lease {LEASE} belongs; remove {LEASE}/ by hand (more than "
            f"{MAX_FOLDER_OBJECTS} objects are not removed for you)")
    if objects:
        fs.rm(objects)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path + "/")  # the emptied folder itself, where the store keeps one
    fs.invalidate_cache(path)
    return f"the {len(objects)} objects under {LEASE}/ were removed"


def _with_token(loc: Location, blocker_id: str, found: Found, ttl_s: float,
                create: Callable[[str, bytes], bool], token_bytes: bytes,
                act: Callable[[], None]) -> bool:
    """Run ``act`` once no other candidate can act on the same stale or invalid lease, and
    only if the store still holds exactly ``found``: the take-over protocol of the module
    docstring, shared by a writer taking a lease over and by ``storage unlock``."""
    token = f"{LEASE_TAKEOVER_PREFIX}{blocker_id}.json"
    if not create(token, token_bytes):
        # A token older than a TTL is a candidate that died mid-take-over: without this
        # the stale lease could never be taken over. Removing it races only with another
        # such cleanup, and :meth:`Lease.check` catches the rare double holder that follows.
        if _age_s(loc, token, time.time()) <= ttl_s:
            return False
        _delete(loc, token)
        if not create(token, token_bytes):
            return False
    try:
        if read_lease(loc, LEASE).identity != found.identity:
            return False  # another candidate took it over (and removed its token)
        act()
        return True
    finally:
        _delete(loc, token)


def _blocker_id(found: Found) -> str:
    """The name of ``found``'s take-over token: its holder's run id, or one per invalid
    thing (its digest), so that one candidate alone acts on it."""
    valid = found.valid
    return valid.run_id if valid is not None else f"invalid-{found.tag}"


def break_lease(loc: Location, found: Found, ttl_s: float = DEFAULT_TTL_S) -> tuple[bool, str]:
    """Remove the lease ``found`` at ``loc`` if the store still holds it unchanged, under the
    take-over protocol (so no writer taking it over at the same time is undone); returns
    (removed, a note for the user). The caller decides that it may be broken."""
    notes: list[str] = []
    now = time.time()
    token = Holder(socket.gethostname(), os.getpid(), f"unlock-{uuid.uuid4().hex[:12]}", now,
                   now + ttl_s, ttl_s, pid_namespace()).to_bytes()
    done = _with_token(loc, _blocker_id(found), found, ttl_s,
                       lambda name, data: create_if_absent(loc, name, data), token,
                       lambda: notes.append(_clear(loc, found)))
    return done, "".join(notes)


class Lease:
    """The writer lease of the dataset at ``loc`` for one run (see the module docstring).

    ``with lease:`` acquires it (failing at once when held), renews it in the background and
    releases it at the end, also on failure.
    """

    def __init__(self, loc: Location, ttl_s: float = DEFAULT_TTL_S, run_id: str | None = None,
                 settle_s: float = DEFAULT_SETTLE_S, conditional: bool | None = None) -> None:
        ttl_s = positive_seconds("the lease TTL", ttl_s)
        settle_s = positive_seconds("the lease settle time", settle_s)
        self.loc, self.ttl_s, self.settle_s = loc, ttl_s, settle_s
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self._conditional = conditional
        now = time.time()
        self.holder = Holder(socket.gethostname(), os.getpid(), self.run_id, now, now + ttl_s,
                             self.ttl_s, pid_namespace())
        self.held = False
        #: why the lease was lost (``""``: not lost)
        self.lost = ""
        #: the stale holder (or invalid lease) this run took the lease over from, if any
        self.took_over: Holder | InvalidLease | None = None
        #: what taking over an invalid lease did beyond replacing it (a folder moved aside)
        self.cleared = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return display_url(self.loc.url)

    def _fresh_holder(self) -> Holder:
        now = time.time()
        return Holder(self.holder.host, self.holder.pid, self.run_id, self.holder.started,
                      now + self.ttl_s, self.ttl_s, self.holder.pidns)

    def _create(self, relative: str, data: bytes) -> bool:
        if self._conditional is None:
            self._conditional = conditional_creates(self.loc)
        return create_if_absent(self.loc, relative, data, self.settle_s, self._conditional)

    def look(self) -> Found:
        """What the store holds at the lease's name now (read with bounds, judged)."""
        return read_lease(self.loc, LEASE)

    def current(self) -> tuple[Holder | None, bytes | None]:
        """The holder the store names now (``None`` when what is there does not parse as a
        lease) and what was read (``None``: no lease)."""
        found = self.look()
        return found.holder, found.identity

    def try_acquire(self) -> Holder | InvalidLease | None:
        """Take the lease if it is free or stale; returns ``None`` when taken, else what is in
        the way: a live holder, or an invalid lease not yet stale."""
        for _ in range(8):  # each pass either decides or saw the lease change under it
            mine = self._fresh_holder()
            if self._create(LEASE, mine.to_bytes()):
                return self._confirm(mine)
            found = self.look()
            if found.absent:
                continue  # released between our create and our read: try again
            if found.holder is not None and found.holder.run_id == self.run_id:
                return self._confirm(mine)
            other: Holder | InvalidLease
            valid = found.valid
            if valid is not None:
                if not valid.stale(time.time()):
                    return valid
                other = valid
            elif found.holder is not None and found.holder.confirmed_dead():
                other = found.holder  # an implausible expiry, but its holder is gone
            else:
                other = invalid_blocker(self.url, found, self.ttl_s)
                if other.stale_in > 0:
                    return other
            if self._take_over(found):
                self.took_over = other
                return self._confirm(self.holder)
            if self.look().identity == found.identity:
                return other  # another candidate's take-over is under way (or died: its
                # token expires after a TTL)
        raise LeaseError(f"the lease on {self.url} kept changing while we tried to take it")

    def _confirm(self, mine: Holder) -> Holder | None:
        other, _ = self.current()
        if other is not None and other.run_id == self.run_id:
            self.holder, self.held, self.lost = other, True, ""
            return None
        return other or mine  # lost a fallback race: whoever is there now holds it

    def _take_over(self, found: Found) -> bool:
        """Replace the stale or invalid lease ``found`` by ours, if no other candidate does it
        first."""
        def replace() -> None:
            self.cleared = _clear(self.loc, found) if found.folder else ""
            self.holder = self._fresh_holder()
            write_atomic(self.loc, LEASE, self.holder.to_bytes())

        return _with_token(self.loc, _blocker_id(found), found, self.ttl_s, self._create,
                           self._fresh_holder().to_bytes(), replace)

    def acquire(self, wait: bool = False, poll_s: float = 5.0,
                on_wait: Callable[[Holder | InvalidLease], None] | None = None,
                hint: str = "", answer_s: float | None = None) -> None:
        """Take the lease; when held, raise :class:`LeaseHeldError` at once, or with ``wait``
        call ``on_wait(holder)`` and poll every ``poll_s`` until it is free or stale.

        ``answer_s``: each attempt must finish within that many seconds, else
        :class:`StoreSilentError`; a store that accepts connections but never answers (a
        hung server) would otherwise hold the caller for as long as its client retries."""
        poll_s = positive_seconds("the lease poll interval", poll_s)
        if answer_s is not None:
            answer_s = positive_seconds("the lease answer time", answer_s)
        while True:
            other = (self.try_acquire() if answer_s is None else
                     call_within(answer_s, self.try_acquire, f"the lease on {self.url}",
                                 on_late=self._let_go_if_taken))
            if other is None:
                return
            if not wait:
                raise LeaseHeldError(self.url, other, hint)
            if on_wait is not None:
                on_wait(other)
            time.sleep(poll_s)

    def _let_go_if_taken(self, other: Holder | InvalidLease | None) -> None:
        """An attempt given up on (the store was silent) took the lease after all: release it
        rather than leave it to block every other writer until it expires."""
        if other is None:
            self.release()

    def _lost_to(self, other: Holder | None, data: bytes | None) -> str:
        return ("taken over by " + other.describe() if other else
                "removed from the store" if data is None else
                "overwritten by something that is not a lease")

    def renew(self) -> None:
        """Extend our expiry; marks the lease lost when another holder is there or our expiry
        passed first. Store errors are raised (the next renewal tries again)."""
        with self._lock:
            if self.lost:
                return
            if time.time() >= self.holder.expires:
                self.lost = (f"not renewed before it expired at {when(self.holder.expires)} "
                             "(the store did not answer in time)")
                return
            other, data = self.current()
            if other is None or other.run_id != self.run_id:
                self.lost = self._lost_to(other, data)
                return
            fresh = self._fresh_holder()
            write_atomic(self.loc, LEASE, fresh.to_bytes())
            self.holder = fresh

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless we certainly still hold the lease: call it
        right before committing."""
        if not self.held:
            raise LeaseLostError(f"the writer lease on {self.url} is not held by this run")
        if not self.lost and self.holder.expires - time.time() < self.ttl_s / 6:
            self.renew()  # close to expiry (renewals failing): one more try, or lost
        if not self.lost:
            other, data = self.current()
            if other is None or other.run_id != self.run_id:
                self.lost = self._lost_to(other, data)
        if self.lost:
            raise LeaseLostError(f"lost the writer lease on {self.url} ({self.lost}); another "
                                 "run may be writing it, so this one stops before its commit")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with contextlib.suppress(Exception):  # a failed renewal is retried; expiry decides
                self.renew()
            if self.lost:
                return

    def start_renewing(self) -> None:
        """Renew every third of the TTL in a daemon thread until :meth:`release`."""
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name="shardflow-lease")
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease if it still names us (best effort: a lease left
        behind expires)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if not self.held:
            return
        self.held = False
        with contextlib.suppress(Exception):
            other, _ = self.current()
            if other is not None and other.run_id == self.run_id:
                _delete(self.loc, LEASE)

    def __enter__(self) -> Lease:
        self.acquire()
        self.start_renewing()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StoreSilentError(TimeoutError):
    """A store did not answer a lease request in time (hung, not refusing)."""


def call_within(seconds: float, fn: Callable[[], Any], what: str,
                on_late: Callable[[Any], None] | None = None) -> Any:
    """``fn()``'s result, or :class:`StoreSilentError` when it has not returned within
    ``seconds``; the call then goes on in a daemon thread, and ``on_late(result)`` is called
    there if it returns after all (an error then is dropped)."""
    box: dict[str, Any] = {}
    lock = threading.Lock()
    done = threading.Event()

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the caller below, unless it gave up
            box["error"] = exc
            done.set()
            return
        with lock:
            box["value"] = value
            late = box.get("gave_up", False)
        done.set()
        if late and on_late is not None:
            with contextlib.suppress(Exception):
                on_late(value)

    threading.Thread(target=run, daemon=True, name="shardflow-lease-call").start()
    if not done.wait(seconds):
        with lock:
            if "value" not in box:
                box["gave_up"] = True
        if box.get("gave_up"):
            raise StoreSilentError(f"no answer from the store in {seconds:.0f} s ({what})")
    done.wait()
    if "error" in box:
        raise box["error"]
    return box["value"]


class PrimaryUnavailableError(OSError):
    """The primary replica cannot hold the writer lease: unreachable or refusing."""


#: how often ``wait`` asks again, and how often it says that it still waits
WAIT_POLL_S, WAIT_SAY_S = 5.0, 30.0


#: how long a store gets to answer one attempt to take a lease (a create, a read or two)
ANSWER_S = 15.0


def waiting_line(url: str, holder: Holder | InvalidLease) -> str:
    """What a writer that waits for the lease on ``url`` says, naming ``storage unlock``."""
    if isinstance(holder, InvalidLease):
        return (f"waiting for the writer lease on {url}: it is {holder.describe()}; to remove "
                f"it now: {unlock_command(url)}")
    return (f"waiting for the writer lease on {url}, held by {holder.describe()}; if that "
            f"writer is gone: {unlock_command(url)}")


def take(loc: Location, what: str, ttl_s: float = DEFAULT_TTL_S, wait: bool = False,
         log: TextIO | None = None, run_id: str | None = None,
         answer_s: float = ANSWER_S) -> Lease:
    """The writer lease of one replica at ``loc``, taken for ``what`` ("run", "gc", ...) and
    renewed until :meth:`Lease.release`: :class:`LeaseHeldError` at once when another writer
    holds it, or with ``wait`` a line on ``log`` and a poll until free; a store that fails or
    is silent for ``answer_s`` raises its error. ``run_id``: a new one by default."""
    log = log or sys.stderr
    lease = Lease(loc, ttl_s=ttl_s, run_id=run_id)
    said: list[tuple[str, float]] = []

    def waiting(holder: Holder | InvalidLease) -> None:
        if not said or said[-1][0] != holder.run_id or time.monotonic() - said[-1][1] > WAIT_SAY_S:
            said.append((holder.run_id, time.monotonic()))
            print(f"shardflow: {waiting_line(lease.url, holder)}", file=log, flush=True)

    lease.acquire(wait=wait, poll_s=min(WAIT_POLL_S, ttl_s / 3), on_wait=waiting,
                  hint=f"a {what} takes the lease on every replica; run again with --wait to "
                       "wait for it (a writer that died leaves a lease that is taken over once "
                       "it expires)", answer_s=answer_s)
    if isinstance(lease.took_over, InvalidLease):
        print(f"shardflow: took over {lease.took_over.describe()}"
              f"{'; ' + lease.cleared if lease.cleared else ''}", file=log)
    elif lease.took_over is not None:
        print(f"shardflow: took over the stale writer lease of {lease.took_over.describe()}",
              file=log)
    lease.start_renewing()
    return lease


def hold(loc: Location, name: str, what: str, ttl_s: float = DEFAULT_TTL_S, wait: bool = False,
         log: TextIO | None = None, run_id: str | None = None,
         answer_s: float = ANSWER_S) -> Lease:
    """:func:`take` on the primary replica (named ``name``), which must answer.

    Taking the lease is the writer's first request to the primary, so a primary that is down
    or silent fails here in one line (:class:`PrimaryUnavailableError`), whatever a write
    quorum allows: a run's scratch (``_work/``) lives there alone. Writers take the lease on
    every replica through :func:`storage.io.replicas.leases.hold_replicas`, which calls this
    for the primary.
    """
    ttl_s = positive_seconds("the lease TTL", ttl_s)  # a bad number is the caller's error
    answer_s = positive_seconds("the lease answer time", answer_s)
    try:
        return take(loc, what, ttl_s, wait, log, run_id, answer_s)
    except (LeaseHeldError, BrokenLeaseError):
        raise  # the lease's doing, not the store's
    except Exception as exc:
        state = ("is unreachable" if classify(exc) in (TRANSIENT, TIMEOUT)
                 or isinstance(exc, StoreSilentError)
                 else f"refused the {what}'s writer lease")
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise PrimaryUnavailableError(
            f"primary {name} {state} ({detail[:300]}): a {what} takes its writer lease there "
            "first, and a run keeps its scratch (_work/) on the primary replica alone, so it "
            "needs the primary whatever --write-quorum allows; bring it back, or list a "
            "reachable replica first") from None
