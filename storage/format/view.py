"""Views: a dataset whose documents are a subset of another dataset's, with no token copied.

A view's ``manifest.json`` is a ``shardflow.dataset/2`` manifest with a ``view`` record
(:class:`ViewRef`): the *source* dataset it selects from, named as a sibling folder (one path
component: ``web`` for a view at ``.../web-en`` of ``.../web``), the source version it was
selected from (that manifest's sha256), the ``where`` expression, and its keep-masks object.
Its index is the source index with each row group's and shard's ``rows`` and ``tokens`` made
the *kept* counts (offsets, lengths, digests and shard paths are the source's, so every
physical check a reader makes holds as it is); shard paths resolve under the source's root.

The keep-masks object (``masks/<sha16>.sfmask``, the view's own, content-addressed) holds per
row group of the index the source's row count and token count, and one bit per source
document (1: kept), each row group's bits padded to whole bytes::

    b"SFMASK\\x01\\0"  u8 header length  header (JSON)  padding to 8
    source_rows u4[G]  source_tokens u4[G]  bits u1[sum(ceil(rows / 8))]

At 50 % selectivity and the default row groups (~262 k tokens, a few hundred documents) the
view's own objects are a few hundred bytes per row group of ~0.5 MB: far under 1 % of the
source. Everything here is pure: bytes in, arrays out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.format.fields import FieldError, Fields
from storage.format.layout import UnsafePathError, safe_relative

MAGIC = b"SFMASK\x01\x00"
FORMAT = "shardflow.masks/1"
#: a shard's per-document token counts (``_doclens/``): magic, u8 count, u4 per document
LENGTHS_MAGIC = b"SFLENS\x01\x00"


class MaskFormatError(ValueError):
    """A keep-masks object that cannot be trusted (bad magic, header or sizes)."""


def source_name(value: str) -> str:
    """A view's ``source``: one plain path component, the source's folder beside the view's.

    A view manifest is untrusted input like any manifest: a source named ``../x``, ``a/b``,
    an absolute path or another bucket's URL would let its author point readers, ``verify``
    and ``gc`` at objects outside the two datasets, so anything but a sibling's name is
    refused."""
    name = safe_relative(value)
    if "/" in name:
        raise UnsafePathError(f"view source {value!r} is not one folder name: a view's source "
                              "lives beside it (same parent folder, same store)")
    return name


@dataclass(frozen=True)
class ViewRef:
    """What a view's manifest records about where its documents come from."""

    #: the source dataset's folder name, beside the view's (:func:`source_name`)
    source: str
    #: sha256 of the source manifest the view was selected from (the version it pins)
    source_version: str
    #: the selection, as SQL WHERE text over the source's columns (a view of a view: both,
    #: ANDed)
    where: str
    #: the keep-masks object: path (the view's own), bytes, sha256
    masks_path: str
    masks_bytes: int
    masks_sha256: str
    #: the source version's documents and tokens (what the view keeps is its totals)
    source_rows: int
    source_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "source_version": self.source_version,
                "where": self.where, "source_rows": self.source_rows,
                "source_tokens": self.source_tokens,
                "masks": {"path": self.masks_path, "bytes": self.masks_bytes,
                          "sha256": self.masks_sha256}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | Fields) -> ViewRef:
        f = d if isinstance(d, Fields) else Fields(d, "view")
        try:
            source = source_name(f.string("source"))
        except UnsafePathError as exc:
            raise UnsafePathError(f"{f.where}.source: {exc}") from None
        masks = f.child("masks")
        try:
            path = safe_relative(masks.string("path"))
        except UnsafePathError as exc:
            raise UnsafePathError(f"{masks.where}.path: {exc}") from None
        return cls(source, f.hex_digest("source_version"), f.string("where"), path,
                   masks.integer("bytes", minimum=1), masks.hex_digest("sha256"),
                   f.integer("source_rows"), f.integer("source_tokens"))


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % 8)


def bytes_per_group(rows: np.ndarray) -> np.ndarray:
    """Bytes of each row group's bits (``ceil(rows / 8)``)."""
    return (np.asarray(rows, dtype=np.int64) + 7) // 8


def encode_masks(source_rows: Sequence[int] | np.ndarray,
                 source_tokens: Sequence[int] | np.ndarray,
                 keep: Sequence[np.ndarray]) -> bytes:
    """The keep-masks object of row groups with ``source_rows`` documents and
    ``source_tokens`` tokens, ``keep[g]`` a bool array per row group (its length that
    group's rows). Deterministic: the same masks give the same bytes."""
    rows = np.asarray(source_rows, dtype=np.uint32)
    toks = np.asarray(source_tokens, dtype=np.uint32)
    if not len(rows) == len(toks) == len(keep):
        raise ValueError("one row count, token count and mask per row group")
    parts = []
    for g, mask in enumerate(keep):
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != int(rows[g]):
            raise ValueError(f"row group {g}: a mask of {len(mask)} rows for {rows[g]}")
        parts.append(np.packbits(mask, bitorder="little"))
    bits = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    header = json.dumps({"format": FORMAT, "row_groups": len(rows), "bits": int(bits.nbytes)},
                        sort_keys=True).encode()
    head = MAGIC + np.uint64(len(header)).tobytes() + header
    head += b"\0" * (_padded(len(head)) - len(head))
    return head + rows.astype("<u4").tobytes() + toks.astype("<u4").tobytes() + bits.tobytes()


class Masks:
    """A parsed keep-masks object: per row group its source rows and tokens, its kept bits.

    Parsing checks what a reader relies on (sizes agree with the header, no bit set past a
    group's rows), so a crafted object fails here with one :class:`MaskFormatError`."""

    def __init__(self, data: bytes | memoryview, where: str = "masks") -> None:
        data = memoryview(data)
        if bytes(data[:8]) != MAGIC or len(data) < 16:
            raise MaskFormatError(f"{where}: not a shardflow keep-masks object (bad magic)")
        length = int(np.frombuffer(data[8:16], dtype="<u8")[0])
        if 16 + length > len(data):
            raise MaskFormatError(f"{where}: header truncated")
        try:
            h = Fields(json.loads(bytes(data[16:16 + length])), where)
            if h.string("format") != FORMAT:
                raise MaskFormatError(f"{where}: format {h.value.get('format')!r}, expected "
                                      f"{FORMAT!r}")
            groups, nbits = h.integer("row_groups"), h.integer("bits")
        except (FieldError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise MaskFormatError(f"{where}: bad header ({exc})") from None
        at = _padded(16 + length)
        if len(data) != at + 8 * groups + nbits:
            raise MaskFormatError(f"{where}: {len(data)} bytes, the header says "
                                  f"{at + 8 * groups + nbits}")
        self.source_rows = np.frombuffer(data[at:at + 4 * groups], dtype="<u4")
        self.source_tokens = np.frombuffer(data[at + 4 * groups:at + 8 * groups], dtype="<u4")
        self.bits = np.frombuffer(data[at + 8 * groups:], dtype=np.uint8)
        self.ends = np.zeros(groups + 1, dtype=np.int64)
        np.cumsum(bytes_per_group(self.source_rows), out=self.ends[1:])
        if int(self.ends[-1]) != nbits:
            raise MaskFormatError(f"{where}: {nbits} bytes of bits for row groups that need "
                                  f"{int(self.ends[-1])}")
        spare = (-self.source_rows.astype(np.int64)) % 8  # padding bits of each group's last byte
        last = self.ends[1:][spare > 0] - 1
        if len(last):
            high = self.bits[last] >> (8 - spare[spare > 0]).astype(np.uint8)
            if np.any(high):
                g = int(np.flatnonzero(spare > 0)[np.flatnonzero(high)[0]])
                raise MaskFormatError(f"{where}: row group {g} keeps documents past its "
                                      f"{int(self.source_rows[g])} rows")

    def __len__(self) -> int:
        return len(self.source_rows)

    def group(self, g: int) -> np.ndarray:
        """Row group ``g``'s mask: a bool per source document (True: kept)."""
        raw = self.bits[int(self.ends[g]):int(self.ends[g + 1])]
        return np.unpackbits(raw, bitorder="little", count=int(self.source_rows[g])
                             ).astype(bool)

    def keeps_all(self, g: int) -> bool:
        """Does the view keep every document of row group ``g``? (A view of a source
        clustered by the column it selects on keeps most row groups whole: a reader then
        takes the decoded tokens as they are, with no mask to unpack.) From the group's own
        bytes of bits, a few dozen: nothing the size of the masks is made, in a loader's
        every process."""
        raw = self.bits[int(self.ends[g]):int(self.ends[g + 1])]
        if not len(raw):
            return True  # no documents: all of none
        rest = int(self.source_rows[g]) % 8  # bits used in the last byte (0: all 8)
        last = 0xFF if rest == 0 else (1 << rest) - 1
        return bool(raw[-1] == last and np.all(raw[:-1] == 0xFF))

    def kept_rows(self) -> np.ndarray:
        """Documents kept per row group (int64)."""
        counts = np.unpackbits(self.bits).reshape(-1, 8).sum(axis=1) if len(self.bits) else \
            np.zeros(0, dtype=np.int64)
        out = np.zeros(len(self), dtype=np.int64)
        nonempty = self.ends[1:] > self.ends[:-1]
        if np.any(nonempty):
            out[nonempty] = np.add.reduceat(counts, self.ends[:-1][nonempty])
        return out


def kept_counts(masks: Masks, lengths: Sequence[np.ndarray | None]) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Kept rows and tokens per row group, ``lengths[g]`` the token count of each source
    document of group ``g`` (``None``: the group keeps all or none of its documents, so its
    tokens are the source's or 0)."""
    rows = masks.kept_rows()
    toks = np.zeros(len(masks), dtype=np.int64)
    for g, lens in enumerate(lengths):
        if lens is None:
            toks[g] = int(masks.source_tokens[g]) if rows[g] else 0
        else:
            toks[g] = int(np.asarray(lens, dtype=np.int64)[masks.group(g)].sum())
    return rows, toks


def kept_tokens(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The tokens of the kept documents of a row group, in order: ``ids`` all its documents'
    tokens end to end, ``lengths`` each document's count, ``keep`` a bool per document.

    Consecutive kept documents are one run, copied as one slice (a run that is the whole
    group, or the only one, is returned as a view of ``ids``, no copy): ~35 us for a
    256 k-token row group that keeps half its ~240 documents at random, where a token-level
    mask (``np.repeat`` of ``keep``, then one boolean index) took ~75 us, and ~90 vs ~155 us
    in the loader right after the decode; Arrow's ``filter`` of the binary column and a
    second unpack took ~5.8 ms (``benchmarks/view_loader.py``)."""
    keep = np.asarray(keep, dtype=bool)
    if keep.all():
        return ids
    n = len(keep)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
    padded = np.zeros(n + 2, dtype=np.int8)  # keep, with a dropped document either side
    padded[1:-1] = keep
    # the documents where a run of kept ones starts or ends, in turn (np.diff with prepend
    # and append cost more than the copies at ~60 runs a row group)
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    bounds = offsets[edges].tolist()  # token offsets: start, end of each run in turn
    if len(bounds) == 2:
        return ids[bounds[0]:bounds[1]]
    if not bounds:
        return ids[:0]
    return np.concatenate([ids[lo:hi] for lo, hi in zip(bounds[0::2], bounds[1::2],
                                                        strict=True)])


def encode_lengths(lengths: np.ndarray) -> bytes:
    """A shard's per-document token counts as ``select`` caches them (``_doclens/``)."""
    counts = np.asarray(lengths, dtype=np.int64)
    if len(counts) and (counts.min() < 0 or counts.max() >= 1 << 32):
        raise ValueError("a document's token count does not fit in 32 bits")
    return LENGTHS_MAGIC + np.uint64(len(counts)).tobytes() + counts.astype("<u4").tobytes()


def decode_lengths(data: bytes, group_rows: np.ndarray, group_tokens: np.ndarray
                   ) -> list[np.ndarray] | None:
    """Cached token counts split by row group, or ``None`` when they cannot be the shard's:
    another magic or size, or a row group whose counts do not add up to the tokens the index
    records for it (the cache is a store object anyone may have written; what it can still
    get wrong while adding up is caught where the counts are used: the loader checks each row
    group's kept tokens against the view's index, and so does ``verify``)."""
    rows = np.asarray(group_rows, dtype=np.int64)
    if len(data) < 16 or data[:8] != LENGTHS_MAGIC:
        return None
    n = int(np.frombuffer(data[8:16], dtype="<u8")[0])
    if n != int(rows.sum()) or len(data) != 16 + 4 * n:
        return None
    counts = np.frombuffer(data, dtype="<u4", offset=16).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(rows)])
    out = [counts[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if any(int(x.sum()) != int(t) for x, t in zip(out, group_tokens, strict=True)):
        return None
    return out
