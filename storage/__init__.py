"""Storage: the dataset format (:mod:`storage.format`), moving bytes (:mod:`storage.io`) and
the admin tools (:mod:`storage.admin`). Imports nothing of ours.

The names below are the package's public API, re-exported from where they live. They are
loaded on first use (PEP 562 module ``__getattr__``): ``from storage import ReplicaSet`` imports
the replica set's modules and no others, so a training job's ``import loaders`` does not pay
for the admin tools, listings or writers it never calls (``tests/loaders/test_imports.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module it lives in (``tokens`` is itself a module)
_WHERE = {
    "Version": "storage.admin.versions", "commit": "storage.admin.versions",
    "store_versions": "storage.admin.versions",
    "digest_bytes": "storage.format.checksums", "digest_stream": "storage.format.checksums",
    "IndexFormatError": "storage.format.index",
    **dict.fromkeys(("INDEX_DIR", "MANIFEST", "QUARANTINE_DIR", "SHARDS_DIR", "TOKENIZER",
                     "VERSIONS_DIR", "WORK_DIR", "UnsafePathError", "index_name",
                     "quarantine_name", "safe_relative", "shard_name", "tokenizer_name",
                     "version_name"), "storage.format.layout"),
    **dict.fromkeys(("FORMAT_V1", "FORMAT_V2", "DatasetNotFoundError", "IndexRef", "Manifest",
                     "ManifestError", "ObjectInfo", "RowGroupInfo", "ShardInfo",
                     "TokenizerInfo", "Totals"), "storage.format.manifest"),
    "write_atomic": "storage.io.atomic",
    "objects_of": "storage.io.index_store", "shards_of": "storage.io.index_store",
    "write_index": "storage.io.index_store",
    "read_manifest": "storage.io.manifest_store", "write_manifest": "storage.io.manifest_store",
    **dict.fromkeys(("ChecksumMismatchError", "QuorumError", "ReplicaError", "ReplicaSet"),
                    "storage.io.replicas.replica_set"),
    **dict.fromkeys(("Location", "display_url", "redact", "resolve"), "storage.io.urls"),
}
_MODULES = {"tokens": "storage.format.tokens"}

__all__ = [
    "ChecksumMismatchError", "commit", "DatasetNotFoundError", "digest_bytes", "digest_stream",
    "display_url", "FORMAT_V1", "FORMAT_V2", "INDEX_DIR", "index_name", "IndexFormatError",
    "IndexRef", "Location", "MANIFEST", "Manifest", "ManifestError", "ObjectInfo", "objects_of",
    "QUARANTINE_DIR", "quarantine_name", "QuorumError", "read_manifest", "redact", "ReplicaError",
    "ReplicaSet", "resolve", "RowGroupInfo", "safe_relative", "shard_name", "ShardInfo",
    "SHARDS_DIR", "shards_of", "store_versions", "TOKENIZER", "tokenizer_name", "TokenizerInfo",
    "tokens", "Totals", "UnsafePathError", "Version", "version_name", "VERSIONS_DIR", "WORK_DIR",
    "write_atomic", "write_index", "write_manifest",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what a type checker and an IDE see: the same names, eagerly
    from storage.admin.versions import Version, commit, store_versions
    from storage.format import tokens
    from storage.format.checksums import digest_bytes, digest_stream
    from storage.format.index import IndexFormatError
    from storage.format.layout import (
        INDEX_DIR,
        MANIFEST,
        QUARANTINE_DIR,
        SHARDS_DIR,
        TOKENIZER,
        VERSIONS_DIR,
        WORK_DIR,
        UnsafePathError,
        index_name,
        quarantine_name,
        safe_relative,
        shard_name,
        tokenizer_name,
        version_name,
    )
    from storage.format.manifest import (
        FORMAT_V1,
        FORMAT_V2,
        DatasetNotFoundError,
        IndexRef,
        Manifest,
        ManifestError,
        ObjectInfo,
        RowGroupInfo,
        ShardInfo,
        TokenizerInfo,
        Totals,
    )
    from storage.io.atomic import write_atomic
    from storage.io.index_store import objects_of, shards_of, write_index
    from storage.io.manifest_store import read_manifest, write_manifest
    from storage.io.replicas.replica_set import (
        ChecksumMismatchError,
        QuorumError,
        ReplicaError,
        ReplicaSet,
    )
    from storage.io.urls import Location, display_url, redact, resolve
