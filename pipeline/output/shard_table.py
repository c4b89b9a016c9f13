"""Phase 2's shard records as the driver keeps them: on local disk, as they arrive, with a few
numbers per partition in memory.

Every partition's shard record is needed at the commit, in partition order, to write the
row-group index; results arrive in completion order over hours. Held as ``ShardInfo`` objects
they cost ~510 bytes a row group (~48 GB at 100 TB of text: ~90 M row groups of 262,144
tokens); as NumPy records in memory ~51, and ~124 at the peak while the index was built in
memory (4.6 / 11.2 GB at 100 TB). Now each result is appended, as it is folded in (a fresh
task's, or a rerun's marker), to one temporary file as a block: a fixed record of the shard's
fields, its path, and one 52-byte record per row group (rows, tokens and length as uint32,
offset as uint64, the first 16 bytes of its BLAKE3 and of its SHA-256). Memory keeps where each
partition's block is (16 bytes a partition) and running totals; a later result for a
partition makes its block dead (read back once to take it out of the totals).

At the commit, :meth:`ShardTable.build_index` reads the live blocks in partition order (runs
of neighbouring blocks in one read) and appends the index's columns to their own files
(:mod:`pipeline.output.index_file`), so the driver holds a chunk of the index, never all of it. The
bytes are those of :func:`storage.format.index.build_index` of the ``ShardInfo`` objects in
partition order (``tests/pipeline/output/test_shard_table.py``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np

from pipeline.output.index_file import IndexFile, SpilledColumns
from pipeline.planning.filetable import pread_exact
from storage import ShardInfo
from storage.format.checksums import PIECE_DIGEST, SHA256
from storage.format.chunk_footer import CODECS, NO_CODEC
from storage.format.index import DIGEST_BYTES, raw_digest
from storage.format.manifest import Totals

#: one row group as the driver keeps it
GROUP = np.dtype([("rows", "<u4"), ("tokens", "<u4"), ("length", "<u4"), ("offset", "<u8"),
                  ("blake3", f"V{DIGEST_BYTES}"), ("sha256", f"V{DIGEST_BYTES}")])
#: one shard's own fields, at the start of its block (its path and row groups follow)
SHARD = np.dtype([("rows", "<u8"), ("tokens", "<u8"), ("bytes", "<u8"), ("sha256", "V32"),
                  ("footer_length", "<u8"), ("footer_sha256", "V32"), ("codec", "u1"),
                  ("all_blake3", "u1"), ("path_bytes", "<u4"), ("groups", "<u8")])
#: blocks read back in one ``pread`` when they lie side by side, up to this many bytes
READ_BYTES = 4 << 20
#: row groups gathered before they are appended to the index's column files
CHUNK_GROUPS = 1 << 16


class ShardTable:
    """The shards of a run by partition index (a partition without rows has none)."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None  # made at the first shard
        self._end = 0
        #: by partition index: where its block starts (-1: no shard) and its length
        self._start = np.full(0, -1, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)
        self._shards = self._groups = self._rows = self._tokens = self._bytes = 0
        self._without_blake3 = 0  # live shards with a row group that has no BLAKE3

    def __len__(self) -> int:
        return self._shards

    def add(self, index: int, shard: ShardInfo) -> None:
        """Fold in partition ``index``'s shard (the object can be dropped after); a shard
        folded before for ``index`` is replaced."""
        block = _block(shard)
        self.discard(index)
        if self._file is None:
            try:
                self._file = tempfile.TemporaryFile(prefix="shardflow-shards-")  # noqa: SIM115
            except OSError as exc:
                raise _disk_error(exc) from None
        try:  # at its recorded offset, whatever a failed write before left past it
            written = os.pwrite(self._file.fileno(), block, self._end)
            while written < len(block):
                written += os.pwrite(self._file.fileno(), block[written:], self._end + written)
        except OSError as exc:
            raise _disk_error(exc) from None
        if index >= len(self._start):
            size = max(index + 1, len(self._start) + len(self._start) // 8, 1024)
            self._start = np.concatenate([self._start, np.full(size - len(self._start), -1,
                                                               dtype=np.int64)])
            self._length.resize(size, refcheck=False)
        self._start[index], self._length[index] = self._end, len(block)
        self._end += len(block)
        self._count(shard.rows, shard.tokens, shard.bytes, len(shard.row_groups),
                    all(g.blake3 for g in shard.row_groups), +1)

    def discard(self, index: int) -> None:
        """Forget partition ``index``'s shard, if it has one."""
        if index >= len(self._start) or self._start[index] < 0:
            return
        head = np.frombuffer(self._read(int(self._start[index]), SHARD.itemsize), SHARD)[0]
        self._count(int(head["rows"]), int(head["tokens"]), int(head["bytes"]),
                    int(head["groups"]), bool(head["all_blake3"]), -1)
        self._start[index] = -1

    def _count(self, rows: int, tokens: int, nbytes: int, groups: int, all_blake3: bool,
               sign: int) -> None:
        self._shards += sign
        self._rows += sign * rows
        self._tokens += sign * tokens
        self._bytes += sign * nbytes
        self._groups += sign * groups
        self._without_blake3 += sign * (not all_blake3)

    @property
    def disk_bytes(self) -> int:
        """The records' file so far (dead blocks included)."""
        return self._end

    def totals(self) -> Totals:
        return Totals(self._shards, self._groups, self._rows, self._tokens, self._bytes)

    def digest_algorithm(self) -> str:
        """BLAKE3 when every row group has one, else SHA-256
        (:func:`storage.format.index.digest_algorithm`)."""
        return PIECE_DIGEST if self._groups and not self._without_blake3 else SHA256

    def build_index(self) -> IndexFile:
        """The index of the shards, in partition order, in a temporary file
        (:mod:`pipeline.output.index_file`); the caller puts it and closes it."""
        digest = self.digest_algorithm()
        field = "blake3" if digest == PIECE_DIGEST else "sha256"
        columns = SpilledColumns(["rows", "tokens", "offset", "length", "digest",
                                  "first_group", "shard_rows", "shard_tokens", "shard_bytes",
                                  "shard_sha256", "footer_length", "footer_sha256",
                                  "path_end", "paths", "shard_codec"])
        try:
            columns.extend("first_group", [0])
            columns.extend("path_end", [0])
            groups_so_far = path_so_far = 0
            heads: list[np.ndarray] = []
            paths: list[bytes] = []
            groups: list[np.ndarray] = []
            pending = 0

            def flush() -> None:
                nonlocal groups_so_far, path_so_far, pending
                if not heads:
                    return
                h = np.concatenate(heads)
                g = np.concatenate(groups) if groups else np.zeros(0, GROUP)
                for name in ("rows", "tokens", "offset", "length"):
                    columns.extend(name, g[name])
                columns.extend("digest", g[field])
                for name in ("rows", "tokens", "bytes", "sha256"):
                    columns.extend(f"shard_{name}", h[name])
                for name in ("footer_length", "footer_sha256"):
                    columns.extend(name, h[name])
                columns.extend("shard_codec", h["codec"])
                columns.extend("first_group", groups_so_far + np.cumsum(h["groups"]))
                ends = np.cumsum([len(p) for p in paths], dtype=np.uint64)
                columns.extend("path_end", path_so_far + ends)
                columns.extend("paths", np.frombuffer(b"".join(paths), dtype=np.uint8))
                groups_so_far += int(h["groups"].sum())
                path_so_far += int(ends[-1])
                heads.clear()
                paths.clear()
                groups.clear()
                pending = 0

            for block in self._blocks():
                head = np.frombuffer(block, SHARD, count=1)
                path_bytes = int(head["path_bytes"][0])
                heads.append(head)
                paths.append(bytes(block[SHARD.itemsize:SHARD.itemsize + path_bytes]))
                groups.append(np.frombuffer(block, GROUP, offset=SHARD.itemsize + path_bytes))
                pending += len(groups[-1]) + 1
                if pending >= CHUNK_GROUPS:
                    flush()
            flush()
            return columns.finish(self._groups, self._shards, digest)
        finally:
            columns.close()

    def _blocks(self) -> Iterator[memoryview]:
        """Each live partition's block, in partition order; neighbouring blocks (the usual
        case: results arrive roughly in order) come from one read of up to READ_BYTES."""
        live = np.flatnonzero(self._start >= 0)
        i = 0
        while i < len(live):
            lo = int(self._start[live[i]])
            hi, j = lo + int(self._length[live[i]]), i + 1
            while (j < len(live) and int(self._start[live[j]]) == hi
                   and hi - lo + int(self._length[live[j]]) <= READ_BYTES):
                hi += int(self._length[live[j]])
                j += 1
            run = memoryview(self._read(lo, hi - lo))
            at = 0
            for k in live[i:j]:
                n = int(self._length[k])
                yield run[at:at + n]
                at += n
            i = j

    def _read(self, offset: int, nbytes: int) -> bytearray:
        assert self._file is not None
        return pread_exact(self._file.fileno(), nbytes, offset, "shard table")

    def close(self) -> None:
        """Free the file's space now (else when the table is collected)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._start = np.full(0, -1, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)


def _block(shard: ShardInfo) -> bytes:
    """Shard ``shard``'s block: its :data:`SHARD` record, its path, its :data:`GROUP`
    records."""
    gs = shard.row_groups
    groups = np.zeros(len(gs), dtype=GROUP)
    for name in ("rows", "tokens", "length", "offset"):
        values = [getattr(g, name) for g in gs]
        if name != "offset" and values and max(values) >= 1 << 32:
            raise ValueError(f"{shard.path}: a row group's {name} does not fit in 32 bits")
        groups[name] = values
    for name in ("blake3", "sha256"):
        raw = b"".join(raw_digest(getattr(g, name), DIGEST_BYTES) for g in gs)
        groups[name] = np.frombuffer(raw, dtype=f"V{DIGEST_BYTES}")
    path = shard.path.encode()
    head = np.zeros(1, dtype=SHARD)
    head[0] = (shard.rows, shard.tokens, shard.bytes, raw_digest(shard.sha256, 32),
               shard.footer_length, raw_digest(shard.footer_sha256, 32),
               CODECS.get(shard.codec, NO_CODEC), all(g.blake3 for g in gs), len(path), len(gs))
    return head.tobytes() + path + groups.tobytes()


def _disk_error(exc: OSError) -> OSError:
    return OSError(f"shard table: cannot write its temporary file under "
                   f"{tempfile.gettempdir()} ({type(exc).__name__}: {exc}); set TMPDIR to a "
                   "local folder with room (~60 bytes a row group)")

