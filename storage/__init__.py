"""Storage: the dataset format (:mod:`storage.format`), moving bytes (:mod:`storage.io`) and
the admin tools (:mod:`storage.admin`). Imports nothing of ours.

The names below are the package's public API, re-exported from where they live; keep this list
to what a training job needs at import time (``import loaders`` loads it)."""

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
from storage.io.replicas import ChecksumMismatchError, QuorumError, ReplicaError, ReplicaSet
from storage.io.urls import Location, display_url, redact, resolve

__all__ = [
    "MANIFEST", "QUARANTINE_DIR", "SHARDS_DIR", "TOKENIZER", "ChecksumMismatchError",
    "DatasetNotFoundError", "Location", "Manifest", "ManifestError", "ObjectInfo", "QuorumError",
    "ReplicaError", "ReplicaSet", "RowGroupInfo", "ShardInfo", "TokenizerInfo", "UnsafePathError",
    "digest_bytes", "digest_stream", "display_url", "quarantine_name", "read_manifest", "redact",
    "resolve", "safe_relative", "shard_name", "tokens", "write_atomic", "write_manifest",
    "VERSIONS_DIR", "WORK_DIR", "Version", "commit", "store_versions", "tokenizer_name",
    "version_name", "FORMAT_V1", "FORMAT_V2", "INDEX_DIR", "IndexFormatError", "IndexRef",
    "Totals", "index_name", "objects_of", "shards_of", "write_index",
]
