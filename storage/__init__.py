"""Storage: URLs, the dataset layout and manifest, checksums. Imports nothing of ours."""

from storage import tokens
from storage.checksums import digest_bytes, digest_stream
from storage.index import IndexFormatError, objects_of, shards_of, write_index
from storage.layout import (
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
from storage.manifest import (
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
    read_manifest,
    write_atomic,
    write_manifest,
)
from storage.replicas import (
    ChecksumMismatchError,
    QuorumError,
    ReplicaError,
    ReplicaSet,
)
from storage.urls import Location, display_url, redact, resolve
from storage.versions import Version, commit, store_versions

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
