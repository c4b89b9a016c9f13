"""The files a user names on the command line, opened as what they must be and read bounded.

``--config``, ``@FILE`` storage options, ``--replica-config``, ``--inputs-from``, a carbon
signal: each is read by the command before any work starts. Opened naively, a FIFO blocks the
command forever without a word, and ``/dev/zero`` (or a multi-gigabyte file named by
mistake) is read into memory until the process dies. So a path named here is:

1. ``stat``-ed first: anything but a regular file (a FIFO, socket, device, directory) is
   refused without being opened (opening a FIFO blocks; opening some devices acts on them);
2. opened with ``O_NONBLOCK`` and ``fstat``-ed again, so a path swapped for a FIFO between the
   two steps cannot block either;
3. read up to a limit: a longer file is refused, naming it and the limit, never cut.

Every error is a :class:`UserFileError` (a ``ValueError``: the CLIs print it as one
``error:`` line) naming what the file is for and its path. Symlinks are followed: a link to
a regular file is that file. Remote files (fsspec URLs) are not special files; callers bound
their reads with :func:`read_bounded` and :func:`bounded_lines`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import IO, Any

#: ``--config`` files (they may list many inputs)
CONFIG_LIMIT = 16 << 20
#: ``@FILE`` storage options and ``--replica-config`` files
OPTIONS_LIMIT = 1 << 20
#: a line of a file read line by line (``--inputs-from``: a URL, a size, a version)
LINE_LIMIT = 64 << 10


class UserFileError(ValueError):
    """A file named by the user that is not a regular file, cannot be read, or is too long;
    the message names what it is for and its path, never its content."""


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str | None:
    """What a ``st_mode`` is when it is not a regular file (``None``: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str) -> str | None:
    """Why ``path`` may not be opened as a file (``"a FIFO (named pipe)"``, ...), or ``None``
    for a regular file. A path that cannot be stat-ed raises ``OSError``."""
    return kind_of(os.stat(path).st_mode)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def open_regular(path: str, what: str) -> IO[bytes]:
    """``path`` opened for reading in binary mode, known to be a regular file (see the
    module's steps 1 and 2); :class:`UserFileError` naming ``what`` and the path otherwise."""
    try:
        kind = not_regular(path)
    except OSError as exc:
        raise UserFileError(f"{what} {path}: cannot read ({_reason(exc)})") from None
    if kind is not None:
        raise UserFileError(f"{what} {path}: is {kind}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserFileError(f"{what} {path}: cannot read ({_reason(exc)})") from None
    try:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind is not None:  # swapped since the stat
            raise UserFileError(f"{what} {path}: is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(fh: IO[bytes], limit: int, what: str, path: str) -> bytes:
    """At most ``limit`` bytes of ``fh``, all of it; a longer stream is an error (read
    ``limit + 1`` bytes at most to find out)."""
    try:
        data = fh.read(limit + 1)
    except OSError as exc:
        raise UserFileError(f"{what} {path}: cannot read ({_reason(exc)})") from None
    if len(data) > limit:
        raise UserFileError(f"{what} {path}: longer than {limit:,} bytes, the most read "
                            f"for {what}")
    return bytes(data)


def read_regular(path: str, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (else an error)."""
    with open_regular(path, what) as fh:
        return read_bounded(fh, limit, what, path)


def read_text(path: str, what: str, limit: int) -> str:
    """:func:`read_regular` decoded as UTF-8 (bytes that are not: an error naming the
    byte offset)."""
    data = read_regular(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{what} {path}: not UTF-8 text (byte {exc.start:,})") from None


def bounded_lines(fh: IO[bytes] | Any, what: str, path: str,
                  limit: int = LINE_LIMIT) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a binary stream, each decoded as UTF-8 without its line
    end; a line longer than ``limit`` bytes, or not UTF-8, is an error naming the file and
    the line (at most ``limit + 1`` bytes of it are ever held)."""
    n = 0
    while True:
        try:
            raw = fh.readline(limit + 1)
        except OSError as exc:
            raise UserFileError(f"{what} {path}, line {n + 1}: cannot read "
                                f"({_reason(exc)})") from None
        if not raw:
            return
        n += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise UserFileError(f"{what} {path}, line {n}: longer than {limit:,} bytes")
        try:
            line = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserFileError(f"{what} {path}, line {n}: not UTF-8 text (byte "
                                f"{exc.start:,} of the line)") from None
        yield n, line.rstrip("\r\n")


def special_files(root: str, *, depth: int = 2) -> list[tuple[str, str]]:
    """``(path, kind)`` of every entry under the local folder ``root`` (``depth`` levels) that
    is neither a regular file nor a folder: what a reader of that folder must refuse before
    opening anything in it (a FIFO planted as a checkpoint's shard would block its load)."""
    found: list[tuple[str, str]] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        try:
            mode = entry.stat().st_mode  # follows a link: a link to a FIFO is a FIFO
        except OSError:
            continue  # a dangling link: reading it fails with its own clear error
        if stat.S_ISDIR(mode):
            if depth > 1:
                found.extend(special_files(entry.path, depth=depth - 1))
        elif not stat.S_ISREG(mode):
            found.append((entry.path, kind_of(mode) or "not a regular file"))
    return sorted(found)


def read_file_of(fs: Any, path: str, what: str, limit: int, *, local: bool) -> bytes:
    """At most ``limit`` bytes of ``path`` on the fsspec filesystem ``fs``, all of them (else
    an error): a local path opened as :func:`read_regular` does (no FIFO, no device), a remote
    one read with the same bound. A missing file raises ``FileNotFoundError``."""
    if local:
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        return read_regular(path, what, limit)
    with fs.open(path, "rb") as fh:
        return read_bounded(fh, limit, what, path)
