"""The ``manifest.json`` format: the one index of a dataset.

Readers never list the store; everything they need (shards, row groups with their token
counts, checksums, the tokenizer) is here. Serialisation is canonical (sorted keys, fixed
indentation) so that the same dataset always produces the same bytes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.layout import MANIFEST, safe_relative
from storage.urls import Location, resolve

FORMAT = "shardflow.dataset/1"


class DatasetNotFoundError(FileNotFoundError):
    """No committed dataset at a URL: the manifest, written last, is absent."""


class ManifestError(ValueError):
    """A manifest that cannot be trusted: wrong format, unsafe paths, inconsistent counts."""


@dataclass(frozen=True)
class RowGroupInfo:
    """One row group; ``offset``/``length``/``sha256`` locate and check its token column chunk.

    With them a reader fetches exactly the bytes it needs in one ranged GET and verifies them
    before decoding, so a corrupt replica is caught at row-group granularity, not per shard.
    """

    rows: int
    tokens: int
    offset: int = 0
    length: int = 0
    sha256: str = ""

    @classmethod
    def from_dict(cls, g: dict[str, Any]) -> RowGroupInfo:
        return cls(int(g["rows"]), int(g["tokens"]), int(g.get("offset", 0)),
                   int(g.get("length", 0)), str(g.get("sha256", "")))


@dataclass(frozen=True)
class ObjectInfo:
    """Any other object of the dataset (tokenizer, quarantine files) with its checksum."""

    path: str
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ObjectInfo:
        return cls(safe_relative(d["path"]), int(d["bytes"]), str(d["sha256"]))


@dataclass(frozen=True)
class ShardInfo:
    path: str
    rows: int
    tokens: int
    bytes: int
    sha256: str
    row_groups: tuple[RowGroupInfo, ...]
    footer_length: int = 0
    footer_sha256: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardInfo:
        return cls(
            path=safe_relative(d["path"]),
            rows=int(d["rows"]),
            tokens=int(d["tokens"]),
            bytes=int(d["bytes"]),
            sha256=str(d["sha256"]),
            row_groups=tuple(RowGroupInfo.from_dict(g) for g in d["row_groups"]),
            footer_length=int(d.get("footer_length", 0)),
            footer_sha256=str(d.get("footer_sha256", "")),
        )


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    path: str
    sha256: str
    vocab_size: int
    eos_id: int | None
    eos_token: str | None
    bytes: int = 0


@dataclass(frozen=True)
class Manifest:
    tokenizer: TokenizerInfo
    shards: tuple[ShardInfo, ...]
    schema: dict[str, str]
    config: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    quarantine: tuple[ObjectInfo, ...] = ()
    format: str = FORMAT

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_id

    def objects(self) -> list[tuple[str, int, str]]:
        """Every object the manifest vouches for: ``(path, bytes, sha256)``, manifest aside."""
        out = [(s.path, s.bytes, s.sha256) for s in self.shards]
        if self.tokenizer.bytes:
            out.append((self.tokenizer.path, self.tokenizer.bytes, self.tokenizer.sha256))
        out += [(q.path, q.bytes, q.sha256) for q in self.quarantine]
        return out

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def total_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = MANIFEST) -> Manifest:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{source}: not valid JSON ({exc})") from None
        if d.get("format") != FORMAT:
            raise ManifestError(f"{source}: format {d.get('format')!r}, expected {FORMAT!r}")
        try:
            tok = d["tokenizer"]
            manifest = cls(
                tokenizer=TokenizerInfo(
                    name=str(tok["name"]), path=safe_relative(tok["path"]),
                    sha256=str(tok["sha256"]), vocab_size=int(tok["vocab_size"]),
                    eos_id=None if tok.get("eos_id") is None else int(tok["eos_id"]),
                    eos_token=tok.get("eos_token"), bytes=int(tok.get("bytes", 0)),
                ),
                shards=tuple(ShardInfo.from_dict(s) for s in d["shards"]),
                schema=dict(d["schema"]),
                config=dict(d.get("config", {})),
                stats=dict(d.get("stats", {})),
                quarantine=tuple(ObjectInfo.from_dict(q) for q in d.get("quarantine", [])),
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"{source}: missing or malformed field {exc}") from None
        for shard in manifest.shards:
            if sum(g.tokens for g in shard.row_groups) != shard.tokens:
                raise ManifestError(f"{source}: {shard.path}: row-group tokens do not add up")
            if sum(g.rows for g in shard.row_groups) != shard.rows:
                raise ManifestError(f"{source}: {shard.path}: row-group rows do not add up")
        return manifest


def read_manifest(url: str | Location, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of the dataset at ``url``.

    Raises :class:`DatasetNotFoundError` when there is none: a dataset whose manifest has not
    been committed does not exist for readers, whatever shards may already be there.
    """
    loc = url if isinstance(url, Location) else resolve(url, storage_options)
    path = loc.path(MANIFEST)
    try:
        text = loc.fs.cat_file(path).decode("utf-8")
    except FileNotFoundError:
        raise DatasetNotFoundError(
            f"no dataset at {loc.url}: {MANIFEST} is missing (an unfinished or failed run "
            "leaves none; rerun the pipeline to commit it)") from None
    return Manifest.from_json(text, source=loc.child_url(MANIFEST))


def write_atomic(loc: Location, relative: str, data: bytes) -> None:
    """Write one object so that readers see either nothing or all of it.

    An object-store PUT is atomic by itself; on a local or network filesystem we write a
    temporary file next to the target and rename it over, which POSIX makes atomic.
    """
    path = loc.path(relative)
    if loc.is_local:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    else:
        loc.fs.pipe_file(path, data)


def write_manifest(loc: Location, manifest: Manifest) -> None:
    """Commit a dataset: the manifest is written last and atomically."""
    write_atomic(loc, MANIFEST, manifest.to_json().encode("utf-8"))
