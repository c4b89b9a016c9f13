"""The ``manifest.json`` format: what a reader opens first, and all it trusts.

Readers never list the store: the manifest (and the index it names) says where everything is.
Two formats load:

- ``shardflow.dataset/2`` (written now): the per-shard and per-row-group facts live in a binary
  row-group index object (:mod:`storage.format.index`, ~36 bytes per row group) that the manifest
  names and anchors with ``index`` (path, bytes, sha256 of the object and of its header);
  ``totals`` gives the counts (shards, row groups, rows, tokens, bytes). The manifest stays a
  few KB whatever the dataset's size.
- ``shardflow.dataset/1``: the shards, with their row groups, inline (~150 bytes per row
  group). Still read; ``python -m storage upgrade`` rewrites one as v2 without touching its
  shards. ``Manifest.shards`` is empty for a v2 manifest: ``storage.io.index_store.shards_of``
  gives the shards of either.

Serialisation is canonical (sorted keys, fixed indentation) so that the same dataset always
produces the same bytes; a v1 manifest re-serialises to the bytes it was read from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.format.checksums import PIECE_ALGORITHMS, SHA256
from storage.format.chunk_footer import CODECS
from storage.format.fields import FieldError, Fields
from storage.format.layout import MANIFEST, UnsafePathError, safe_relative
from storage.format.view import ViewRef

FORMAT_V1 = "shardflow.dataset/1"
FORMAT_V2 = "shardflow.dataset/2"
#: what new datasets are written as
FORMAT = FORMAT_V2
FORMATS = (FORMAT_V1, FORMAT_V2)


class DatasetNotFoundError(FileNotFoundError):
    """No committed dataset at a URL: the manifest, written last, is absent."""


class ManifestError(ValueError):
    """A manifest that cannot be trusted: wrong format, unsafe paths, inconsistent counts."""


def _path(f: Fields) -> str:
    """A dataset-relative path field, refused when it would leave the dataset root."""
    value = f.string("path")
    try:
        return safe_relative(value)
    except UnsafePathError as exc:
        raise UnsafePathError(f"{f.where}.path: {exc}") from None


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
    #: BLAKE3 of the same bytes: the digest a v2 index keeps when every row group has one
    #: (``storage.format.checksums``); absent from datasets written before it
    blake3: str = ""

    @classmethod
    def from_dict(cls, g: dict[str, Any] | Fields) -> RowGroupInfo:
        f = g if isinstance(g, Fields) else Fields(g, "row_group")
        return cls(f.integer("rows"), f.integer("tokens"), f.integer("offset", 0),
                   f.integer("length", 0), f.hex_digest("sha256", ""),
                   f.hex_digest("blake3", ""))


@dataclass(frozen=True)
class ObjectInfo:
    """Any other object of the dataset (tokenizer, quarantine files) with its checksum."""

    path: str
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, d: dict[str, Any] | Fields) -> ObjectInfo:
        f = d if isinstance(d, Fields) else Fields(d, "object")
        return cls(_path(f), f.integer("bytes"), f.hex_digest("sha256"))


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
    #: the Parquet codec of the ``input_ids`` chunks (``storage.format.chunk_footer.CODECS``)
    #: when a reader can decode them without the shard's footer; ``""``: read the footer
    #: (datasets written before it was recorded)
    codec: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | Fields) -> ShardInfo:
        f = d if isinstance(d, Fields) else Fields(d, "shard")
        return cls(
            path=_path(f),
            rows=f.integer("rows"),
            tokens=f.integer("tokens"),
            bytes=f.integer("bytes"),
            sha256=f.hex_digest("sha256"),
            row_groups=tuple(RowGroupInfo.from_dict(g) for g in f.objects("row_groups")),
            footer_length=f.integer("footer_length", 0),
            footer_sha256=f.hex_digest("footer_sha256", ""),
            codec=f.choice("codec", ("", *CODECS), ""),
        )


@dataclass(frozen=True)
class IndexRef:
    """What a v2 manifest records about its row-group index object: where it is, its size,
    the sha256 of the whole object and of its header (which holds every column's sha256),
    and the algorithm of its row-group ``digest`` column (``storage.format.checksums``: ``blake3``
    for datasets written now; absent, hence ``sha256``, in older manifests, which therefore
    re-serialise to the same bytes)."""

    path: str
    bytes: int
    sha256: str
    header_sha256: str
    digest: str = SHA256

    def to_dict(self) -> dict[str, Any]:
        out = {"path": self.path, "bytes": self.bytes, "sha256": self.sha256,
               "header_sha256": self.header_sha256}
        if self.digest != SHA256:
            out["digest"] = self.digest
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | Fields) -> IndexRef:
        f = d if isinstance(d, Fields) else Fields(d, "index")
        return cls(_path(f), f.integer("bytes", minimum=1), f.hex_digest("sha256"),
                   f.hex_digest("header_sha256"), f.choice("digest", PIECE_ALGORITHMS, SHA256))


@dataclass(frozen=True)
class Totals:
    """The dataset's counts, in a v2 manifest (a v1 manifest's are summed from its shards)."""

    shards: int
    row_groups: int
    rows: int
    tokens: int
    bytes: int

    @classmethod
    def from_dict(cls, d: dict[str, Any] | Fields) -> Totals:
        f = d if isinstance(d, Fields) else Fields(d, "totals")
        return cls(f.integer("shards"), f.integer("row_groups"), f.integer("rows"),
                   f.integer("tokens"), f.integer("bytes"))

    @classmethod
    def of(cls, shards: tuple[ShardInfo, ...] | list[ShardInfo]) -> Totals:
        return cls(len(shards), sum(len(s.row_groups) for s in shards),
                   sum(s.rows for s in shards), sum(s.tokens for s in shards),
                   sum(s.bytes for s in shards))


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
    #: ``""``: inferred, v2 when ``index`` is given, else v1
    format: str = ""
    #: v2 only: the row-group index object and the dataset's counts
    index: IndexRef | None = None
    totals: Totals | None = None
    #: a view (``storage.format.view``): its source, the expression and its keep-masks;
    #: ``None`` for a dataset that holds its own shards (absent from its JSON)
    view: ViewRef | None = None
    #: what made this version (``pipeline.lineage.provenance``): each step's name, version,
    #: options and their ``config_sha256``, the tokenizer, the inputs' listing hash, the code
    #: version; ``{}`` (absent from the JSON) in manifests written before it
    lineage: dict[str, Any] = field(default_factory=dict)
    #: the list of each partition's record of the documents the run left out
    #: (``pipeline.lineage``): one object, ``lineage/drops-<sha16>.jsonl``
    #: (``storage.format.object_list``), so a run of a million partitions keeps a small
    #: manifest; ``None`` (absent from the JSON) when nothing was left out or before lineage
    drops: ObjectInfo | None = None
    #: reports the run wrote about this version (its decontamination report,
    #: ``contamination/<sha16>.json``), verified, repaired and kept by gc like every object it
    #: names; ``()`` (absent from the JSON) in manifests written before them
    reports: tuple[ObjectInfo, ...] = ()

    def __post_init__(self) -> None:
        if not self.format:
            object.__setattr__(self, "format", FORMAT_V2 if self.index is not None
                               else FORMAT_V1)
        if self.format == FORMAT_V2:
            if self.index is None or self.totals is None or self.shards:
                raise ValueError(f"a {FORMAT_V2} manifest has an index and totals, and no "
                                 "inline shards")
        elif self.format == FORMAT_V1:
            if self.index is not None or self.totals is not None:
                raise ValueError(f"a {FORMAT_V1} manifest lists its shards inline; it has "
                                 "no index or totals")
        else:
            raise ValueError(f"unknown manifest format {self.format!r}")
        if self.view is not None and (self.format != FORMAT_V2 or self.quarantine):
            raise ValueError(f"a view is a {FORMAT_V2} manifest without a quarantine")

    @property
    def is_v2(self) -> bool:
        return self.format == FORMAT_V2

    @property
    def counts(self) -> Totals:
        """Shards, row groups, rows, tokens, bytes: from ``totals`` (v2) or the shards (v1)."""
        return self.totals if self.totals is not None else Totals.of(self.shards)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_id

    def objects(self) -> list[tuple[str, int, str]]:
        """The objects this manifest names itself: ``(path, bytes, sha256)``, manifest aside.

        For v2 that is the index object, the tokenizer, the quarantine, the reports and the
        drop records' list; the shards are named by the index and the drop records by their
        list (``storage.io.index_store.objects_of`` lists them all, for either
        format). A view's own objects are its index and keep-masks: its tokenizer and shards
        are its source's (:meth:`source_objects`).
        """
        if self.view is not None:
            assert self.index is not None
            return [(self.index.path, self.index.bytes, self.index.sha256),
                    (self.view.masks_path, self.view.masks_bytes, self.view.masks_sha256)]
        out = [(s.path, s.bytes, s.sha256) for s in self.shards]
        if self.index is not None:
            out.append((self.index.path, self.index.bytes, self.index.sha256))
        if self.tokenizer.bytes:
            out.append((self.tokenizer.path, self.tokenizer.bytes, self.tokenizer.sha256))
        out += [(q.path, q.bytes, q.sha256) for q in self.quarantine]
        if self.drops is not None:  # the list; the records it names: ``objects_of``
            out.append((self.drops.path, self.drops.bytes, self.drops.sha256))
        out += [(r.path, r.bytes, r.sha256) for r in self.reports]
        return out

    @property
    def total_tokens(self) -> int:
        return self.counts.tokens

    @property
    def total_rows(self) -> int:
        return self.counts.rows

    @property
    def total_bytes(self) -> int:
        return self.counts.bytes

    def source_objects(self) -> list[tuple[str, int, str]]:
        """What a view names in its source besides the shards (its index names those): the
        tokenizer. Empty for a dataset that is not a view."""
        if self.view is None or not self.tokenizer.bytes:
            return []
        return [(self.tokenizer.path, self.tokenizer.bytes, self.tokenizer.sha256)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.view is None:
            del d["view"]  # a dataset's JSON is what it was before views existed
        else:
            d["view"] = self.view.to_dict()
        for optional in ("lineage", "drops", "reports"):  # older manifests keep their bytes
            if not d[optional]:
                del d[optional]
        if self.is_v2:
            del d["shards"]
        else:  # exactly the v1 layout, so a v1 manifest re-serialises to its own bytes
            del d["index"], d["totals"]
            for shard in d["shards"]:
                if not shard["codec"]:
                    del shard["codec"]
                for group in shard["row_groups"]:
                    if not group["blake3"]:
                        del group["blake3"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, source: str = MANIFEST) -> Manifest:
        """Parse and validate: every field's type, every path, every count.

        Errors name ``source`` and the field (``shards[3].row_groups[0].tokens``); a path that
        would leave the dataset root raises :class:`UnsafePathError` naming both as well.
        """
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{source}: not valid JSON ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{source}: not UTF-8 text ({exc})") from None
        try:
            return cls._from_fields(Fields(d))
        except FieldError as exc:
            raise ManifestError(f"{source}: {exc}") from None
        except UnsafePathError as exc:
            raise UnsafePathError(f"{source}: {exc}") from None

    @classmethod
    def _from_fields(cls, f: Fields) -> Manifest:
        fmt = f.value.get("format")
        if fmt not in FORMATS:
            raise FieldError(f"format is {fmt!r}, expected one of {', '.join(map(repr, FORMATS))}"
                             " (a newer Shardflow wrote it?)")
        v2 = fmt == FORMAT_V2
        if v2 and "shards" in f.value:
            raise FieldError(f"shards: a {FORMAT_V2} manifest names its shards in its index, "
                             "not inline")
        if "view" in f.value and (not v2 or f.value.get("quarantine")):
            raise FieldError(f"view: a view is a {FORMAT_V2} manifest without a quarantine")
        tok = f.child("tokenizer")
        index = IndexRef.from_dict(f.child("index")) if v2 else None
        totals = Totals.from_dict(f.child("totals")) if v2 else None
        if v2 and totals is not None and totals.shards > totals.row_groups:
            raise FieldError("totals: more shards than row groups")
        manifest = cls(
            tokenizer=TokenizerInfo(
                name=tok.string("name"), path=_path(tok), sha256=tok.hex_digest("sha256"),
                vocab_size=tok.integer("vocab_size", minimum=1),
                eos_id=tok.optional_integer("eos_id"), eos_token=tok.optional_string("eos_token"),
                bytes=tok.integer("bytes", 0),
            ),
            shards=() if v2 else tuple(ShardInfo.from_dict(s) for s in f.objects("shards")),
            schema=f.string_mapping("schema"),
            config=f.mapping("config", {}),
            stats=f.mapping("stats", {}),
            quarantine=tuple(ObjectInfo.from_dict(q) for q in f.objects("quarantine", [])),
            format=fmt,
            index=index,
            totals=totals,
            view=ViewRef.from_dict(f.child("view")) if "view" in f.value else None,
            lineage=f.mapping("lineage", {}),
            drops=ObjectInfo.from_dict(f.child("drops")) if "drops" in f.value else None,
            reports=tuple(ObjectInfo.from_dict(o) for o in f.objects("reports", [])),
        )
        for i, shard in enumerate(manifest.shards):
            if sum(g.tokens for g in shard.row_groups) != shard.tokens:
                raise FieldError(f"shards[{i}] ({shard.path}): row-group tokens do not add up")
            if sum(g.rows for g in shard.row_groups) != shard.rows:
                raise FieldError(f"shards[{i}] ({shard.path}): row-group rows do not add up")
        return manifest
