"""What a writer lease file holds, read with bounds and judged without trusting it.

Why: ``_lease.json`` lies on a store that anyone with write access may edit, and a writer that
trusted it could be blocked for ever: an expiry of 1e18 or NaN never passes, a pid of 2**70
crashed the liveness check, JSON nested 100,000 deep or a 1 GB file crashed or exhausted the
reader, a folder in its place made every attempt an error blamed on the store, and bytes that
do not parse, dated 2100, looked forever a TTL young. So here every field is checked for type
and range (:meth:`Holder.from_bytes`), the file is read with a size bound and opened as what
it must be (:func:`read_lease`), and whatever is no valid lease is an :class:`InvalidLease`
that names the fault and is treated as stale a TTL after this process first saw it
(:func:`invalid_blocker`): a writer that waits gets through; ``python -m storage unlock``
(:mod:`storage.admin.unlock`) removes it at once.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import math
import os
import re
import socket
import stat
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from storage.io.urls import Location

FORMAT = "shardflow.lease/1"
#: a lease is ~250 bytes; a file larger than this is not one (and is never read whole)
MAX_LEASE_BYTES = 16 * 1024
#: the longest TTL a lease may claim (and ``--lease-ttl`` may ask for)
MAX_TTL_S = 24 * 3600.0
#: how far ahead of this host's clock a holder's clock may run: an expiry later than the
#: lease's own TTL plus this from now was not written by a holder renewing it
CLOCK_SLACK_S = 60.0
#: wall-clock bounds of any time in a lease (1970 .. year 5138): printable, comparable
_LATEST = 1e11
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MAX_HOST = 255


class InvalidLeaseError(ValueError):
    """The bytes are not a valid lease; the message says why in a few safe words."""


def when(t: float) -> str:
    """A wall-clock time for messages (never raises: a bad time is shown as a number)."""
    try:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"time {show(t)}"


def show(value: Any, limit: int = 40) -> str:
    """A value from an untrusted file, for a message: ASCII, no control characters, short."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        text = f"an integer of {value.bit_length()} bits"  # its digits could run to thousands
    else:
        text = ascii(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def pid_namespace() -> int:
    """The pid namespace's inode (0 where unknown): a pid means something only inside it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def positive_seconds(name: str, value: Any, maximum: float = MAX_TTL_S) -> float:
    """``value`` as a finite number of seconds in ``(0, maximum]``, else a ``ValueError``
    naming ``name``: a NaN TTL would make every expiry comparison false, an infinite one a
    lease that never expires."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds, not {show(value)}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 < seconds <= maximum:
        raise ValueError(f"{name} must be a finite number of seconds, more than 0 and at "
                         f"most {maximum:g}, not {show(value)}")
    return seconds


def _depth_within(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests at most ``limit`` levels (strings skipped): checked
    before parsing, so no nesting costs more than one pass over at most
    :data:`MAX_LEASE_BYTES`."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _no_constants(name: str) -> Any:
    raise InvalidLeaseError(f"it holds {name}, which no lease field may be")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidLeaseError(f"it names {show(key)} twice")
        out[key] = value
    return out


_TIMES = {"started": "start time", "expires": "expiry"}


def _time(d: dict[str, Any], key: str) -> float:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidLeaseError(f"its {_TIMES[key]} is {show(value)}, not a time")
    if not math.isfinite(value) or not 0 <= value <= _LATEST:
        raise InvalidLeaseError(f"its {_TIMES[key]} {show(value)} is out of range")
    return float(value)


def _integer(d: dict[str, Any], key: str, low: int, high: int, default: Any = None) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidLeaseError(f"its {key} is {show(value)}, not a valid {key}")
    return value


def _text(d: dict[str, Any], key: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise InvalidLeaseError(f"its {key} is {show(value)}, not a string")
    return value


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as stored in ``_lease.json``."""

    host: str
    pid: int
    run_id: str
    started: float  # wall-clock seconds
    expires: float  # wall-clock seconds
    ttl_s: float
    pidns: int = 0
    format: str = FORMAT

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder:
        """Parse and check a lease; :class:`InvalidLeaseError` (a ``ValueError``, and the
        only error raised) when it is not a valid one: torn, foreign, too big, nested, a
        field of the wrong type or out of range, a newer format."""
        if len(data) > MAX_LEASE_BYTES:
            raise InvalidLeaseError(f"it is larger than {MAX_LEASE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidLeaseError("it is not UTF-8 text") from None
        if not _depth_within(text, 1):
            raise InvalidLeaseError("it nests deeper than a lease's one JSON object")
        try:
            d = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
        except InvalidLeaseError:
            raise
        except (ValueError, RecursionError) as exc:  # JSONDecodeError; an int of 5,000 digits
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
            raise InvalidLeaseError(f"it is not JSON ({show(reason, 60)})") from None
        if not isinstance(d, dict):
            raise InvalidLeaseError("it is not a JSON object")
        if d.get("format") != FORMAT:
            raise InvalidLeaseError(f"its format is {show(d.get('format'))}, not {FORMAT}")
        host, run_id = _text(d, "host"), _text(d, "run_id")
        if not 0 < len(host) <= _MAX_HOST or not host.isprintable():
            raise InvalidLeaseError(f"its host {show(host)} is no host name")
        if not _RUN_ID.fullmatch(run_id):
            raise InvalidLeaseError(f"its run_id {show(run_id)} is no run id")
        ttl_s = d.get("ttl_s")
        try:
            ttl_s = positive_seconds("ttl_s", ttl_s)
        except ValueError:
            raise InvalidLeaseError(f"its ttl_s {show(ttl_s)} is no TTL") from None
        holder = cls(host=host, pid=_integer(d, "pid", 1, 2**31 - 1), run_id=run_id,
                     started=_time(d, "started"), expires=_time(d, "expires"), ttl_s=ttl_s,
                     pidns=_integer(d, "pidns", 0, 2**64 - 1, default=0))
        if holder.started > holder.expires:
            raise InvalidLeaseError("it expires before it started")
        return holder

    def implausible(self, now: float) -> str:
        """Why this lease's expiry could not have been written by a holder renewing it
        (``""``: it could): no holder sets it more than its TTL ahead of its clock."""
        ahead = self.expires - now
        if ahead > self.ttl_s + CLOCK_SLACK_S:
            return (f"it expires {when(self.expires)}, {ahead:.0f} s from now, more than its "
                    f"TTL of {self.ttl_s:g} s ahead")
        return ""

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        left = self.expires - now
        state = (f"expires {when(self.expires)} (in {left:.0f} s) unless renewed" if left > 0
                 else f"expired {when(self.expires)} ({-left:.0f} s ago)")
        return (f"host {self.host}, pid {self.pid}, run {self.run_id}, since "
                f"{when(self.started)} ({max(0.0, now - self.started):.0f} s ago), {state}")

    def is_local_process(self) -> bool:
        return (self.host == socket.gethostname() and self.pidns == pid_namespace()
                and self.pidns != 0)

    def confirmed_dead(self) -> bool:
        """A process of this host (same pid namespace) that no longer exists."""
        if not self.is_local_process() or self.pid == os.getpid():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # PermissionError: alive, someone else's
            return False
        return False

    def stale(self, now: float) -> bool:
        """Expired, or a process of this host (same pid namespace) that no longer exists."""
        return self.expires <= now or self.confirmed_dead()


@dataclass(frozen=True)
class Found:
    """What the store holds at a lease's name, read once.

    ``identity``: what was read (``None``: nothing there), compared to see whether it changed;
    ``holder``: the parsed holder when the bytes are one (even if ``invalid`` says its expiry
    is implausible); ``invalid``: why it is no valid lease (``""``: it is); ``folder``: a
    folder (a prefix on an object store) in its place; ``age_s``: how long ago it was written
    by the store's clock (``None``: unknown, or dated in the future).
    """

    identity: bytes | None
    holder: Holder | None = None
    invalid: str = ""
    folder: bool = False
    age_s: float | None = None

    @property
    def absent(self) -> bool:
        return self.identity is None

    @property
    def valid(self) -> Holder | None:
        return self.holder if self.holder is not None and not self.invalid else None

    @property
    def tag(self) -> str:
        """One name per thing found, for take-over tokens: its content's digest."""
        return hashlib.sha256(self.identity or b"").hexdigest()[:16]


ABSENT = Found(None)


def judge(data: bytes, now: float, age_s: float | None = None) -> Found:
    """A :class:`Found` for the bytes ``data``: valid, or invalid with the reason."""
    try:
        holder = Holder.from_bytes(data)
    except InvalidLeaseError as exc:
        return Found(data, invalid=str(exc), age_s=age_s)
    return Found(data, holder, holder.implausible(now), age_s=age_s)


def _age(mtime: float | None, now: float) -> float | None:
    if mtime is None or not math.isfinite(mtime) or mtime > now + CLOCK_SLACK_S:
        return None  # dated in the future: it says nothing about how old it is
    return max(0.0, now - mtime)


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _read_local(path: str, now: float) -> Found:
    """Open ``path`` as what a lease must be (a regular file, not followed if a link, never
    blocking on a pipe) and read at most one byte more than a lease may hold."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC",
                                                                                 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM):
            raise  # the store itself failing (EIO...): its error, not the lease's
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return ABSENT
        reason = (f"it cannot be read ({os.strerror(exc.errno)})"
                  if exc.errno in (errno.EACCES, errno.EPERM) else f"it is {_kind(st.st_mode)}")
        return Found(f"\0{reason}".encode(), invalid=reason + ", not a lease file",
                     age_s=_age(st.st_mtime, now))
    try:
        st = os.fstat(fd)
        age = _age(st.st_mtime, now)
        if stat.S_ISDIR(st.st_mode):
            return Found(b"\0folder", invalid="it is a folder, not a lease file", folder=True,
                         age_s=age)
        if not stat.S_ISREG(st.st_mode):
            reason = f"it is {_kind(st.st_mode)}"
            return Found(f"\0{reason}".encode(), invalid=reason + ", not a lease file",
                         age_s=age)
        chunks, left = [], MAX_LEASE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return judge(b"".join(chunks), now, age)
    finally:
        os.close(fd)


def _read_store(loc: Location, path: str, now: float) -> Found:
    """A lease on an object store, never from a cache: its metadata, then its first
    :data:`MAX_LEASE_BYTES` + 1 bytes (a ranged read: a huge object is never fetched). A
    prefix in its place (objects under ``_lease.json/``, beside which some stores let no
    lease be created) is a folder."""
    from storage.io.listing import mtime_of

    fs = getattr(loc.fs, "fsspec", loc.fs)
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return ABSENT
    if info.get("type") == "directory":
        return Found(b"\0folder", invalid="it is a folder (objects under its name), not a "
                     "lease object", folder=True)
    age = _age(mtime_of(info), now)
    if not info.get("size"):
        return judge(b"", now, age)  # a ranged read of an empty object is refused (416)
    try:
        data = loc.fs.cat_file(path, start=0, end=MAX_LEASE_BYTES + 1)
    except FileNotFoundError:
        return ABSENT  # removed between the two requests
    except OSError:
        fs.invalidate_cache(path)
        if fs.info(path).get("size"):
            raise
        data = b""  # emptied between the two requests (its range refused)
    return judge(bytes(data), now, age)


def read_lease(loc: Location, relative: str) -> Found:
    """What is at ``relative`` under ``loc``, read with bounds (see :class:`Found`); errors
    are the store's (unreachable, refusing), never the content's."""
    now = time.time()
    path = loc.path(relative)
    return _read_local(path, now) if loc.is_local else _read_store(loc, path, now)


@dataclass(frozen=True)
class InvalidLease:
    """Something at the lease's name that is no valid lease, blocking writers until
    ``stale_in`` seconds have passed (a TTL after this process first saw it)."""

    url: str
    reason: str
    tag: str
    stale_in: float
    ttl_s: float

    @property
    def run_id(self) -> str:
        """The name its take-over token carries (one per thing found)."""
        return f"invalid-{self.tag}"

    def describe(self, now: float | None = None) -> str:
        state = (f"treated as stale in {self.stale_in:.0f} s (a TTL of {self.ttl_s:g} s after "
                 "this process first saw it)" if self.stale_in > 0 else "treated as stale")
        return (f"an invalid lease ({self.reason}), which is that file's fault, not the "
                f"store's; {state}")


#: (url, tag) -> when this process first saw that invalid lease (``time.monotonic``)
_first_seen: dict[tuple[str, str], float] = {}
_first_seen_lock = threading.Lock()
#: entries kept at most (oldest dropped): a process sees few invalid leases
_FIRST_SEEN_MAX = 4096


def invalid_blocker(url: str, found: Found, ttl_s: float) -> InvalidLease:
    """``found`` (invalid) as an :class:`InvalidLease`: stale once it is ``ttl_s`` old by the
    store's clock, or ``ttl_s`` after this process first saw these very bytes, whichever
    comes first. A store's date in the future counts for nothing, so a file dated 2100 ages
    from when it was first seen; a holder that still renews changes its bytes, so it never
    ages here."""
    key = (url, found.tag)
    now = time.monotonic()
    with _first_seen_lock:
        seen = _first_seen.setdefault(key, now)
        if len(_first_seen) > _FIRST_SEEN_MAX:
            for old in sorted(_first_seen, key=_first_seen.__getitem__)[:len(_first_seen) // 2]:
                if old != key:
                    del _first_seen[old]
    waited = max(now - seen, found.age_s or 0.0)
    return InvalidLease(url, found.invalid, found.tag, max(0.0, ttl_s - waited), ttl_s)
