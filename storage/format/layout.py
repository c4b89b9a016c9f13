"""The dataset layout on the store (see docs/dataset-format.md), and the rule that keeps paths
inside it.

Every object a manifest names is *content-addressed*: its name carries the first 16 hex
digits of its sha256, so the same bytes always get the same name (reruns stay byte-identical)
and different bytes never overwrite a name that a committed manifest uses. ``manifest.json``
is the only name that changes meaning; ``_versions/`` keeps an immutable copy of each manifest
committed, for admin tools (``python -m storage inspect|gc``); readers never list it.
"""

from __future__ import annotations

import posixpath
import re

MANIFEST = "manifest.json"
#: the tokenizer's name in datasets written before names were content-addressed
TOKENIZER = "tokenizer.json"
SHARDS_DIR = "shards"
QUARANTINE_DIR = "quarantine"
#: the binary row-group index of a v2 manifest (``storage.format.index``): ``index/<sha16>.sfidx``
INDEX_DIR = "index"
#: a view's keep-masks objects (``storage.format.view``): ``masks/<sha16>.sfmask``
MASKS_DIR = "masks"
#: a source's registry of the views that select from it (``storage.admin.view_pins``): one
#: ``<view name>.json`` pin per view, read by ``gc`` so it never removes what a view names
VIEWS_DIR = "_views"
#: per-document token counts of a shard, cached by ``select`` (``storage.format.view``):
#: ``_doclens/<shard file stem>.u4``, kept by gc while the shard is
DOCLENS_DIR = "_doclens"
#: each version's dataset card (``pipeline.output.card``): ``card/<manifest sha16>/README.md``
#: and its PNGs, derived from that version and keyed by it (gc keeps a kept version's card)
CARD_DIR = "card"
#: each partition's record of the documents the run left out (``pipeline.lineage.records``):
#: ``lineage/part-00007-steps-<sha16>.jsonl.gz`` (dropped by a step) and ``...-dups-...``
#: (duplicates, with the kept document's place), named by the manifest like the quarantine
LINEAGE_DIR = "lineage"
#: each version's decontamination report (``pipeline.output.contamination``):
#: ``contamination/<sha16>.json``, content-addressed and named by the manifest's ``reports``
CONTAMINATION_DIR = "contamination"
#: immutable copies of every committed manifest: ``<sequence>-<manifest sha16>.json``
VERSIONS_DIR = "_versions"
#: a run's scratch files (``pipeline.tasks.work``), removed once it commits
WORK_DIR = "_work"
#: the writer lease of the output (``storage.io.lease``): one run writes a dataset at a time
LEASE = "_lease.json"
#: ``<prefix><stale run id>.json``: the token one candidate creates to take over a stale lease
LEASE_TAKEOVER_PREFIX = "_lease-takeover-"
#: hex digits of the sha256 that name an object
NAME_HASH = 16

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEX = re.compile(rf"^[0-9a-f]{{{NAME_HASH},}}$")
_CARD_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VERSION = re.compile(rf"^(\d{{8,}})-([0-9a-f]{{{NAME_HASH}}})\.json$")


class UnsafePathError(ValueError):
    """A manifest named a path that would leave the dataset root."""


def _tag(sha256: str) -> str:
    if not isinstance(sha256, str) or not _HEX.match(sha256):
        raise ValueError(f"not a hex sha256: {sha256!r}")
    return sha256[:NAME_HASH]


def shard_name(index: int, sha256: str) -> str:
    """``shards/part-00007-<sha16>.parquet``: partition order for people, content for safety."""
    return f"{SHARDS_DIR}/part-{index:05d}-{_tag(sha256)}.parquet"


def quarantine_name(index: int, sha256: str) -> str:
    return f"{QUARANTINE_DIR}/part-{index:05d}-{_tag(sha256)}.jsonl"


def index_name(sha256: str) -> str:
    """The row-group index object: named by its content, like every object a manifest names."""
    return f"{INDEX_DIR}/{_tag(sha256)}.sfidx"


def masks_name(sha256: str) -> str:
    """A view's keep-masks object, content-addressed like every object a manifest names."""
    return f"{MASKS_DIR}/{_tag(sha256)}.sfmask"


def drops_list_name(sha256: str) -> str:
    """The list of a version's per-partition drop records (``storage.format.object_list``),
    content-addressed, beside the records in ``lineage/``."""
    return f"{LINEAGE_DIR}/drops-{_tag(sha256)}.jsonl"


def contamination_name(sha256: str) -> str:
    """A version's decontamination report, content-addressed: a rerun with other eval sets
    writes another name, so every kept version keeps the report it was made with."""
    return f"{CONTAMINATION_DIR}/{_tag(sha256)}.json"


def doclens_name(shard_path: str) -> str:
    """The token-count cache of the shard at ``shard_path`` (named after its file, so its
    content is fixed by the shard's: shard names are content-addressed)."""
    stem = posixpath.basename(shard_path).rsplit(".", 1)[0]
    return f"{DOCLENS_DIR}/{stem}.u4"


def doclens_shard(relative: str) -> str | None:
    """The shard path a token-count cache belongs to; ``None`` for anything else."""
    head, _, name = relative.rpartition("/")
    if head != DOCLENS_DIR or not name.endswith(".u4") or not name[:-3]:
        return None
    return f"{SHARDS_DIR}/{name[:-3]}.parquet"


def tokenizer_name(sha256: str) -> str:
    return f"tokenizer-{_tag(sha256)}.json"


def version_name(sequence: int, manifest_sha256: str) -> str:
    """The immutable record of the ``sequence``-th committed manifest (1, 2, ...)."""
    if sequence < 1:
        raise ValueError(f"version sequence must be >= 1, got {sequence}")
    return f"{VERSIONS_DIR}/{sequence:08d}-{_tag(manifest_sha256)}.json"


def parse_version_name(relative: str) -> tuple[int, str] | None:
    """``(sequence, manifest sha16)`` of a version record's path, ``None`` for anything else."""
    head, _, name = relative.rpartition("/")
    found = _VERSION.match(name) if head == VERSIONS_DIR else None
    return (int(found.group(1)), found.group(2)) if found else None


def card_name(manifest_sha256: str, file: str) -> str:
    """``card/<manifest sha16>/<file>``: one file of the card of the version whose manifest
    has this sha256 (the tag its ``_versions/`` record carries)."""
    if not _CARD_FILE.match(file) or file.strip(".") == "":
        raise ValueError(f"not a card file name: {file!r}")
    return f"{CARD_DIR}/{_tag(manifest_sha256)}/{file}"


def card_tag(relative: str) -> str | None:
    """The version tag (manifest sha16) of a card file's path, ``None`` for anything else."""
    parts = relative.split("/")
    if len(parts) == 3 and parts[0] == CARD_DIR and re.fullmatch(
            rf"[0-9a-f]{{{NAME_HASH}}}", parts[1]) and _CARD_FILE.match(parts[2]):
        return parts[1]
    return None


def is_tokenizer_name(relative: str) -> bool:
    """A tokenizer file at the dataset root, either naming scheme."""
    return "/" not in relative and relative.startswith("tokenizer") and relative.endswith(".json")


def safe_relative(path: str) -> str:
    """Validate a dataset-relative path and return it normalised.

    Paths come from manifests that anyone may have written; a path that is absolute, carries
    a URL scheme, or climbs out with ``..`` could make a reader fetch or a repair overwrite
    objects outside the dataset, so it is refused rather than cleaned up.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError(f"empty or non-string path in manifest: {path!r}")
    if "\\" in path or "\x00" in path:
        raise UnsafePathError(f"path {path!r} contains a backslash or NUL")
    if _SCHEME.match(path) or path.startswith("/"):
        raise UnsafePathError(f"path {path!r} is absolute; manifest paths must be relative")
    parts = path.split("/")
    if any(part in ("..", ".", "") for part in parts):
        raise UnsafePathError(f"path {path!r} is not a plain relative path inside the dataset")
    return posixpath.normpath(path)
