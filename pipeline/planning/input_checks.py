"""An input is read only as what it was listed as: a regular file of its listed size.

Two ways an input used to go wrong before a single record was read:

- **Not a regular file.** A FIFO among the inputs (listed in ``--inputs-from`` or matched by a
  glob) blocked the worker that opened it, and the run with it, without a word; a device
  (a symlink ``x.jsonl -> /dev/zero``) was read forever. A local input is ``stat``-ed before
  it is opened; anything but a regular file is quarantined as ``not_a_regular_file``, never
  opened.
- **Not its listed size.** The plan cuts an uncompressed JSONL or text file into byte ranges
  of its listed size; a file listed with size 10 that holds 1,410 documents gave 1 of them
  and exit 0. Where the size decides what is read (such a file's byte ranges, packed or
  not), the real size (``stat`` for a local file, the opened object's for a remote one) is
  compared with the listed one, and a file that differs is quarantined whole as
  ``size_mismatch`` (both sizes in the detail), never cut: the list is wrong or the file
  changed since it was listed (its resume key, ``SIZE:VERSION``, names another version), so
  the fix is to correct the list and rerun; the rerun redoes that file's partitions only.
  Compressed, CSV, WARC and Parquet inputs are read whole whatever their size (Parquet by its
  footer's row groups), so their listed size only weighs them in the plan.

Either reject is given once per file, by its piece that starts at byte 0; its other pieces
yield nothing.
"""

from __future__ import annotations

import os
from typing import Any

from infra.user_files import kind_of
from pipeline.records import Rejected

#: formats whose byte ranges come from the listed size (pipeline.planning.plan.SPLITTABLE)
_RANGED = ("jsonl", "txt")


def listed_size(version: str) -> int | None:
    """The size the plan used, from a partition's ``version`` (always ``SIZE:TAG``, see
    :mod:`pipeline.planning.discovery`); ``None`` when it holds none."""
    head = version.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def _ranged(part: Any) -> bool:
    return part.fmt in _RANGED and part.compression is None and part.end >= 0


def _mismatch(part: Any, real: int) -> tuple[str, str] | None:
    listed = listed_size(part.version)
    if listed is None or listed == real:
        return None
    return ("size_mismatch", f"listed as {listed:,} bytes, the file has {real:,}: not read "
            "(correct its size in the input list, or list it again, and rerun)")


def before_open(part: Any, path: str, local: bool) -> tuple[str, str] | None:
    """``(reason, detail)`` when the local input ``path`` must not be opened (see the
    module's text); ``None``: open it. A path that cannot be stat-ed is left to the open,
    whose error becomes ``unreadable_file`` as before."""
    if not local:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    kind = kind_of(st.st_mode)
    if kind is not None:
        return "not_a_regular_file", f"{kind}: not opened"
    return _mismatch(part, st.st_size) if _ranged(part) else None


def after_open(part: Any, fh: Any) -> tuple[str, str] | None:
    """``(reason, detail)`` when a remote input's opened object is not its listed size
    (fsspec's files know it from the open: no extra request); ``None`` otherwise."""
    size = getattr(fh, "size", None)
    if not _ranged(part) or type(size) is not int:
        return None
    return _mismatch(part, size)


def rejects(part: Any, found: tuple[str, str], name: str, shown: str) -> list[Rejected]:
    """The one reject of a refused input: from its piece that starts at byte 0 (a ranged
    file's other pieces give none)."""
    reason, detail = found
    return [Rejected(name, reason, detail, file=shown)] if part.start <= 0 else []
