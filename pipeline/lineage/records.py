"""The per-partition record of documents a run left out: what ``trace --dropped`` reads.

Quarantined records are already in ``quarantine/`` (with source and reason); what the dataset
did not keep anywhere is *which step dropped which document* and *which kept document a
duplicate duplicates*. Phase 1 writes the first (one line per dropped document: its source,
the step and the reason), phase 2 the second (its source, ``duplicate`` or
``near_duplicate``, its row in phase 1's rows, and the phase-1 place ``[partition, row]`` of
the document it duplicates; :mod:`pipeline.lineage.locate` turns that into a doc id). Only
partitions that left something out get a record, and those whose shard was ordered by a
column (``--cluster-by``): their record's ``order`` line says where phase 1's rows went.

The lines are gzip-compressed JSON (no timestamp in the header, so the same drops give the same
bytes and the same content-addressed name): the sources of one file share a long prefix and
compress ~10x.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from storage import ObjectInfo, ReplicaSet, digest_bytes
from storage.format.layout import LINEAGE_DIR, NAME_HASH

#: the two kinds of record a partition may have
STEPS, DUPS = "steps", "dups"


def record_name(index: int, kind: str, sha256: str) -> str:
    """``lineage/part-00007-steps-<sha16>.jsonl.gz``: partition order, then content."""
    return f"{LINEAGE_DIR}/part-{index:05d}-{kind}-{sha256[:NAME_HASH]}.jsonl.gz"


def encode(lines: Iterable[dict[str, Any]]) -> bytes:
    """JSON lines, gzip-compressed with ``mtime=0``: deterministic bytes."""
    body = "".join(json.dumps(line, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
                   + "\n" for line in lines)
    return gzip.compress(body.encode("utf-8"), compresslevel=6, mtime=0)


#: the most a record may hold decompressed: a partition of a few million documents' lines,
#: with room; a record is named by a manifest, input from outside, and gzip can be a bomb
MAX_RECORD_BYTES = 1 << 30


def decode(data: bytes, name: str = "drop record") -> Iterator[dict[str, Any]]:
    """The lines of a record (:func:`encode`'s inverse), decompressed to a bound; a record
    that is no gzip of JSON lines, or holds more than :data:`MAX_RECORD_BYTES`, is a
    ``ValueError`` naming ``name``."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            body = f.read(MAX_RECORD_BYTES + 1)
        if len(body) > MAX_RECORD_BYTES:
            raise ValueError(f"{name}: more than {MAX_RECORD_BYTES:,} bytes decompressed")
        text = body.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: not a gzip of UTF-8 JSON lines ({type(exc).__name__})"
                         ) from None
    for n, line in enumerate(text.splitlines(), 1):
        if line:
            try:
                yield json.loads(line)
            except ValueError:
                raise ValueError(f"{name} line {n}: not JSON") from None


def put_record(store: ReplicaSet, index: int, kind: str,
               lines: list[dict[str, Any]]) -> ObjectInfo | None:
    """Write partition ``index``'s record of ``kind`` (``None``: nothing left out)."""
    if not lines:
        return None
    data = encode(lines)
    sha = digest_bytes(data)
    info = ObjectInfo(path=record_name(index, kind, sha), bytes=len(data), sha256=sha)
    store.put(info.path, data)
    return info


def step_line(source: str, step: str, reason: str) -> dict[str, Any]:
    """A document a step dropped: ``{"s": source, "t": step, "r": reason}``."""
    return {"s": source, "t": step, "r": reason}


def dup_line(source: str, kind: str, pos: int, keep_part: int, keep_pos: int
             ) -> dict[str, Any]:
    """A duplicate: its source, kind, phase-1 row, and the phase-1 place of the document it
    duplicates."""
    return {"s": source, "r": kind, "p": pos, "k": [keep_part, keep_pos]}


def order_line(rows: Any) -> dict[str, Any]:
    """A clustered shard's order (``--cluster-by``): ``rows[j]``, the shard row of the
    ``j``-th document phase 2 kept, in phase 1's order (a duplicate's record names the
    document it duplicates by its phase-1 row)."""
    return {"order": [int(r) for r in rows]}


def order_of(lines: list[dict[str, Any]], name: str = "drop record") -> list[int] | None:
    """The ``order`` line's rows among a duplicates record's ``lines`` (``None``: none, the
    shard keeps phase 1's order). A record is input from outside: anything but a list of
    distinct row numbers is a ``ValueError`` naming ``name``."""
    order = next((line["order"] for line in lines if "order" in line), None)
    if order is None:
        return None
    if not isinstance(order, list) or not all(
            type(r) is int and 0 <= r < len(order) for r in order) \
            or len(set(order)) != len(order):
        raise ValueError(f"{name}: its order line is not a permutation of row numbers (a "
                         "damaged or crafted drop record)")
    return order


def partition_of(path: str) -> int:
    """The partition index in a record's (or shard's, or quarantine file's) name."""
    stem = path.rpartition("/")[2]
    return int(stem.split("-")[1])


def kind_of(path: str) -> str:
    return path.rpartition("/")[2].split("-")[2]
