"""Reading DCP's ``.metadata`` pickle without running code from it.

A checkpoint directory is input from outside (``--resume PATH``, ``--resume auto`` over a
prefix that others can write), and DCP stores its metadata as a pickle, which may name any
importable callable and call it. So the unpickler here admits an exact list of
``(module, qualified name)`` pairs: the classes DCP itself writes and a few torch value types.
Anything else — a dotted name (``os.system`` asked from an allowed module), ``builtins``, a
module merely sharing a prefix — is refused before it is imported. What the pickle may do
with the admitted names is bounded too: the classes are plain data holders, the one function
(``torch.serialization._get_layout``) only looks names up in a table of layouts, and the
result must be a :class:`~torch.distributed.checkpoint.metadata.Metadata` whose storage
entries name plain files inside the checkpoint directory.

Time, stack and memory are bounded before anything is unpickled: the file is at most
:data:`MAX_METADATA_BYTES`, and :func:`trainer.checkpoint.pickle_guard.check_pickle` walks its
opcodes
(``pickletools``, which parses and executes nothing) and refuses memo DAGs whose hashing is
exponential, nesting that would overflow the C stack, memory out of proportion to the file,
memo indices out of sequence (CPython zero-fills a memo table of twice the largest index: the
fuzz test once got OOM-killed on 14 bytes), and ``BUILD`` on anything but a fresh instance of
DCP's metadata dataclasses (:data:`BUILDABLE`): ``BUILD`` on an admitted class or function
would change process-wide state (``PosixPath.__truediv__``) even when the load is refused.

Hash flooding is bounded too. A dict key's hash decides how long inserting it takes, and
the keys DCP writes besides strings, ``MetadataIndex(fqn, offset)`` of ``storage_data``, hash
as the tuple ``(fqn, offset)``, which a file can make collide for any number of distinct
offsets (tuple hashes are a fixed function of their items', ints' are the ints): 4,000 such
entries (276 KB) took 3.2 s to load, and the time grows with their square (a 40 MB file: hours,
on every rank). So the walk admits only strings and ``MetadataIndex`` as keys, the unpickler
makes each ``MetadataIndex`` as :class:`_UnpickledIndex`, whose hash is keyed with this
process's secret, and :func:`_real_keys` then counts the real hashes (linear) and refuses more
than :data:`MAX_SHARED_HASH` entries sharing one before ``storage_data`` is rebuilt with
DCP's own class (which DCP's lookups need).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import secrets
import stat
import threading
from collections import Counter, OrderedDict
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from trainer.checkpoint.pickle_guard import PickleBombError, check_pickle

_DCP = "torch.distributed.checkpoint.metadata"
#: Exactly the globals DCP's metadata pickles refer to (torch 2.4-2.13), nothing else.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    (_DCP, "Metadata"), (_DCP, "MetadataIndex"), (_DCP, "StorageMeta"),
    (_DCP, "TensorProperties"), (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"), (_DCP, "ChunkStorageMetadata"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
}) | frozenset(("torch", name) for name, value in vars(torch).items()
               if isinstance(value, torch.dtype))

#: The classes whose instances ``BUILD`` may set the state of: DCP's metadata dataclasses, never
#: a class or function object (BUILD on ``PosixPath`` itself would rewrite its methods).
BUILDABLE: frozenset[tuple[str, str]] = frozenset({
    (_DCP, "Metadata"), (_DCP, "MetadataIndex"), (_DCP, "StorageMeta"),
    (_DCP, "TensorProperties"), (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"), (_DCP, "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
})

#: The classes whose instances may be dict keys (besides strings): unpickled with a secret hash.
KEY_CLASSES: frozenset[tuple[str, str]] = frozenset({(_DCP, "MetadataIndex")})

#: Most ``storage_data`` entries admitted with one (real) hash. Distinct DCP keys share a
#: 64-bit hash by accident about never; a file made to flood has thousands.
MAX_SHARED_HASH = 16

#: Largest ``.metadata`` read, refused unread when its file says it is larger (a hostile one
#: under it costs at most ``pickle_guard.MEMORY_PER_BYTE`` (24) times its size to refuse, a
#: real one 11-15x to load). DCP writes ~170 bytes per tensor chunk (measured: our GPT with
#: AdamW under FSDP2 over 8 ranks, 1,308 chunks: 241,815 bytes; the same re-sharded over 64 and
#: 1,024 ranks: 170.2 and 170.5 bytes a chunk; 140 for a 1B GPT over 64 ranks), and FSDP makes
#: a chunk per rank of every parameter and both AdamW moments: 3 x ranks x ~170 bytes per
#: parameter tensor. 256 MiB holds ~1.6 M chunks: a 70B Llama-shaped model (723 parameter
#: tensors) fully sharded over ~730 ranks; a lower cap would refuse real checkpoints of that.
MAX_METADATA_BYTES = 256 << 20

#: What a storage entry may name: a file directly in the checkpoint directory.
_PLAIN_FILE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,255}$")


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint's metadata asks for something a checkpoint never needs."""


def _admit(module: str, name: str, source: str) -> None:
    if (module, name) not in ALLOWED_GLOBALS:
        raise UnsafeCheckpointError(
            f"{source}: refers to {module!r}.{name!r}, which a checkpoint never needs; "
            "refusing to load it")


_HASH_KEY = secrets.token_bytes(16)

#: SHA-256 digests of the pickles this process has walked and passed (the walk is a pure
#: function of the bytes): a resume reads the same ``.metadata`` two or three times
#: (``load_checkpoint``'s own check, DCP's read, a delta's base), and at ~1.2 us per byte one
#: walk of a 256 MiB file takes minutes, where hashing it takes under a second. Only passes are
#: kept (a refused file is walked again, and refused again, each time), the last few.
_PASSED: OrderedDict[bytes, None] = OrderedDict()
_PASSED_KEEP = 8
_PASSED_LOCK = threading.Lock()


def _walk_once(data: bytes, source: str) -> None:
    """:func:`check_pickle` of ``data``, unless these very bytes passed it in this process."""
    digest = hashlib.sha256(data).digest()
    with _PASSED_LOCK:
        if digest in _PASSED:
            _PASSED.move_to_end(digest)
            return
    try:
        check_pickle(data, BUILDABLE, source, on_global=lambda m, n: _admit(m, n, source),
                     key_classes=KEY_CLASSES)
    except PickleBombError as exc:
        raise UnsafeCheckpointError(str(exc)) from None
    with _PASSED_LOCK:
        _PASSED[digest] = None
        while len(_PASSED) > _PASSED_KEEP:
            _PASSED.popitem(last=False)


class _UnpickledIndex(MetadataIndex):
    """A ``MetadataIndex`` as read from a file, hashed with this process's secret key: equal
    to DCP's for the same ``(fqn, offset)``, but a file cannot choose its hash. Replaced by
    DCP's own class once the entries' real hashes are checked (:func:`_real_keys`)."""

    def __hash__(self) -> int:
        offset = None if self.offset is None else tuple(self.offset)
        digest = hashlib.blake2b(repr((self.fqn, offset)).encode(), digest_size=8,
                                 key=_HASH_KEY).digest()
        return int.from_bytes(digest, "little", signed=True)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled again: as DCP's own class
        return (MetadataIndex, (self.fqn, self.offset, self.index))


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits :data:`ALLOWED_GLOBALS` only, and
    makes ``MetadataIndex`` keys with a secret hash (:class:`_UnpickledIndex`)."""

    def __init__(self, file: Any, source: str = ".metadata") -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        _admit(module, name, self.source)
        if (module, name) == (_DCP, "MetadataIndex"):
            return _UnpickledIndex
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(f"{self.source}: persistent ids are not allowed")


def _check_storage(metadata: Metadata, source: str) -> None:
    for index, info in (metadata.storage_data or {}).items():
        path = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", 0), getattr(info, "length", 0)
        if not isinstance(path, str) or not _PLAIN_FILE.match(path):
            raise UnsafeCheckpointError(
                f"{source}: storage entry {getattr(index, 'fqn', '?')!r} names {path!r}, "
                "not a file inside the checkpoint directory")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in (offset, length)):
            raise UnsafeCheckpointError(f"{source}: storage entry with a bad byte range")


def _real_keys(storage: dict[Any, Any], source: str) -> dict[MetadataIndex, Any]:
    """``storage_data`` keyed by DCP's own ``MetadataIndex`` (whose hash is ``(fqn, offset)``'s),
    refused when more than :data:`MAX_SHARED_HASH` entries share one such hash: counting the
    hashes is linear, inserting keys that share one is quadratic."""
    shared = Counter()
    try:
        for index in storage:
            if not isinstance(index, MetadataIndex):
                raise UnsafeCheckpointError(f"{source}: a storage entry keyed by a "
                                            f"{type(index).__name__}, not a MetadataIndex")
            shared[MetadataIndex.__hash__(index)] += 1
        worst = max(shared.values(), default=0)
        if worst > MAX_SHARED_HASH:
            raise UnsafeCheckpointError(
                f"{source}: {worst:,} storage entries share one hash (keys made to collide: "
                "building DCP's index of them would take time quadratic in their number); "
                "refusing to load it")
        return {MetadataIndex(i.fqn, i.offset, i.index): info for i, info in storage.items()}
    except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
        # fields of the wrong type (an unhashable fqn, an offset torch.Size refuses)
        raise UnsafeCheckpointError(f"{source}: a storage entry's key does not hold "
                                    f"({type(exc).__name__}: {exc})"[:500]) from None


def _stated_size(f: Any) -> int | None:
    """The size the open file ``f`` states: a regular file's ``fstat``, an fsspec file's
    ``size``; None when it states none (a pipe, a stream)."""
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):
            return st.st_size
    except (AttributeError, OSError, ValueError):  # no descriptor (io.UnsupportedOperation)
        pass
    size = getattr(f, "size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _too_large(source: str, what: str, limit: int) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{source}: {what}, more than DCP metadata may take ({limit:,} bytes = "
        f"{limit / 2**20:,.0f} MiB, "
        "trainer.checkpoint.safe_metadata.MAX_METADATA_BYTES); refusing to "
        "load it")


def read_capped(f: Any, source: str, limit: int = MAX_METADATA_BYTES) -> bytes:
    """At most ``limit`` bytes of the open file ``f``; :class:`UnsafeCheckpointError` naming
    the file and the limit if it holds more: before reading anything when the file states its
    size (a 20 GB file costs nothing), else after one byte past the cap."""
    size = _stated_size(f)
    if size is not None and size > limit:
        raise _too_large(source, f"{size:,} bytes", limit)
    data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(source, f"more than {limit:,} bytes", limit)
    return bytes(data)


def load_metadata(data: bytes, source: str = ".metadata") -> Metadata:
    """The :class:`Metadata` in ``data``; :class:`UnsafeCheckpointError` for anything else.

    Every failure a hostile or damaged pickle can provoke (unknown opcodes, wrong argument
    types for an admitted class, truncation) comes out as this one error type, naming
    ``source``.
    """
    if len(data) > MAX_METADATA_BYTES:
        raise _too_large(source, f"{len(data):,} bytes", MAX_METADATA_BYTES)
    _walk_once(data, source)
    try:
        metadata = MetadataUnpickler(io.BytesIO(data), source).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # any malformed pickle: one clear error, not a stack from pickle
        raise UnsafeCheckpointError(f"{source}: unreadable DCP metadata "
                                    f"({type(exc).__name__}: {exc})"[:500]) from None
    if type(metadata) is not Metadata:
        raise UnsafeCheckpointError(f"{source}: holds a {type(metadata).__name__}, "
                                    "not DCP checkpoint metadata")
    if metadata.storage_data is not None:
        if not isinstance(metadata.storage_data, dict):
            raise UnsafeCheckpointError(f"{source}: storage_data is a "
                                        f"{type(metadata.storage_data).__name__}, not a dict")
        metadata.storage_data = _real_keys(metadata.storage_data, source)
    _check_storage(metadata, source)
    return metadata
