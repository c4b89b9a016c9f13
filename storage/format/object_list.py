"""A list of a version's objects kept outside its manifest: one JSON line
``{"path", "bytes", "sha256"}`` per object, in the order given.

Why: some objects come one or two per partition (each partition's drop record,
``pipeline.lineage.records``), and a 100 TB run has 10^5 to 10^6 partitions: named inline they
would make the manifest, which every reader and every rank fetches, tens of MB. The manifest
names this list instead (its size and sha256, like the index it names for the shards), and
only the tools that need every object (verify, repair, gc, trace) read it, verified.

Parsing is strict and bounded: the list is input from outside like the manifest, so every
path goes through :func:`storage.format.layout.safe_relative` and a line that is not an
object is an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from storage.format.fields import FieldError, Fields
from storage.format.manifest import ObjectInfo

#: the most objects a list may hold (a run's partitions times two kinds of record, with room)
MAX_OBJECTS = 10_000_000


def encode_objects(objects: Sequence[ObjectInfo]) -> bytes:
    """The list's bytes: deterministic (sorted keys, no spaces), so the same objects give the
    same content-addressed name on a rerun."""
    return "".join(json.dumps({"path": o.path, "bytes": o.bytes, "sha256": o.sha256},
                              sort_keys=True, separators=(",", ":")) + "\n"
                   for o in objects).encode("utf-8")


def parse_objects(data: bytes, source: str) -> tuple[ObjectInfo, ...]:
    """The objects of a list's bytes; a bad line is a :class:`FieldError` naming ``source``
    and the line, a path outside the dataset an ``UnsafePathError``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FieldError(f"{source}: not UTF-8 text") from None
    out: list[ObjectInfo] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if len(out) >= MAX_OBJECTS:
            raise FieldError(f"{source}: more than {MAX_OBJECTS:,} objects")
        try:
            value = json.loads(line)
        except ValueError:
            raise FieldError(f"{source} line {n}: not JSON") from None
        out.append(ObjectInfo.from_dict(Fields(value, f"{source} line {n}")))
    return tuple(out)
