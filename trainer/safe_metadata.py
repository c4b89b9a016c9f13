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

Memory is bounded before anything is unpickled: CPython's unpickler grows its memo table to
twice the largest index a ``PUT`` names and zero-fills it, so a 14-byte pickle naming index
1.5 G asks for ~24 GB (the test suite's fuzzer found this: a flipped bit in a real file got the
test process OOM-killed). :func:`_check_opcodes` walks the opcodes first (``pickletools``,
which parses and executes nothing) and admits only memo indices a pickler would write: each
store takes the next index, each fetch names one already stored.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

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

#: What a storage entry may name: a file directly in the checkpoint directory.
_PLAIN_FILE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,255}$")


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint's metadata asks for something a checkpoint never needs."""


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits :data:`ALLOWED_GLOBALS` only."""

    def __init__(self, file: Any, source: str = ".metadata") -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise UnsafeCheckpointError(
                f"{self.source}: refers to {module!r}.{name!r}, which a checkpoint never needs; "
                "refusing to load it")
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


_STORES = {"PUT", "BINPUT", "LONG_BINPUT"}
_FETCHES = {"GET", "BINGET", "LONG_BINGET"}


def _check_opcodes(data: bytes, source: str) -> None:
    """Refuse memo indices out of sequence (see the module doc) and anything ``pickletools``
    cannot parse, before the unpickler allocates for them."""
    stored = 0
    try:
        for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
            if op.name == "MEMOIZE":
                stored += 1
            elif op.name in _STORES:
                if not isinstance(arg, int) or arg > stored:
                    raise UnsafeCheckpointError(
                        f"{source}: memo index {arg} out of sequence (next is {stored}); "
                        "refusing to load it")
                stored = max(stored, arg + 1)
            elif op.name in _FETCHES and (not isinstance(arg, int) or arg >= stored):
                raise UnsafeCheckpointError(f"{source}: fetches memo index {arg}, never stored")
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # malformed opcodes or arguments
        raise UnsafeCheckpointError(f"{source}: unreadable DCP metadata "
                                    f"({type(exc).__name__}: {exc})"[:500]) from None


def load_metadata(data: bytes, source: str = ".metadata") -> Metadata:
    """The :class:`Metadata` in ``data``; :class:`UnsafeCheckpointError` for anything else.

    Every failure a hostile or damaged pickle can provoke (unknown opcodes, wrong argument
    types for an admitted class, truncation) comes out as this one error type, naming
    ``source``.
    """
    _check_opcodes(data, source)
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
    _check_storage(metadata, source)
    return metadata
