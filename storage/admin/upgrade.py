"""``upgrade``: give a ``shardflow.dataset/1`` dataset its binary row-group index (format 2),
and any dataset's index its shards' codecs.

A v1 manifest lists every shard and row group inline (~150 bytes per row group: 128 MB of JSON
at 768 k row groups, parsed by every rank). Upgrading writes the index of those same shards
(``index/<sha16>.sfidx``, content-addressed, the store's quorum put), then swaps in the v2
manifest that names it, through :func:`storage.admin.versions.commit` (the live v1 manifest is
recorded under ``_versions/`` first when it has no record, the new one after): the swap is the
one atomic step, and shards are neither read nor written. A reader that opened the v1 manifest
finishes on it; gc keeps what the v1 version names for as long as it keeps that version.

An index written before it recorded each shard's codec (``shard_codec``) makes every reader
fetch and keep each shard's footer (:mod:`storage.format.chunk_footer`). Upgrading reads each
such footer once (a ranged GET of its recorded bytes, checked against its sha256; 16 at a
time), checks it against the index (as many row groups, each token chunk where the index
places it) and records the codec where the chunks allow a footer-free decode, then writes the
new index and swaps the manifest the same way; shards are not touched.

Idempotent: a v2 dataset whose shards' codecs are recorded (or cannot be: ``list<int32>``
shards, whose footers are then not read at all) is left alone. Deterministic: the same v1
manifest always gives the same index and manifest bytes. Not a compare-and-swap: the
manifest is read again right before the swap and the upgrade stops if it changed (a rebuild
committed meanwhile), which narrows but cannot close the window on a store without
conditional writes; do not run it during a rebuild of the same dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TextIO

from storage.admin.versions import Version, commit
from storage.format.chunk_footer import footerless_codec
from storage.format.index import with_index
from storage.format.manifest import FORMAT_V2, IndexRef, Manifest, ManifestError, ShardInfo
from storage.format.tokens import LEGACY_LIST, dtype_of, footer_disagreement, parse_footer
from storage.io.index_store import shards_of, write_index
from storage.io.replicas.replica_set import ReplicaError, ReplicaSet

#: footers read at once (each a small ranged GET: latency-bound)
FOOTER_READS = 16


class UpgradeError(RuntimeError):
    """The dataset cannot be upgraded (old locations missing, changed under us)."""


@dataclass(frozen=True)
class UpgradeResult:
    url: str
    before: str  # the format found
    index: IndexRef | None
    row_groups: int
    manifest_bytes_before: int
    manifest_bytes_after: int
    version: Version | None = None
    #: shards whose codec this upgrade recorded (their footers read once)
    codecs: int = 0

    @property
    def changed(self) -> bool:
        return self.before != FORMAT_V2 or self.codecs > 0

    def render(self) -> str:
        if not self.changed:
            where = f" (index {self.index.path})" if self.index else ""
            return (f"{self.url}: already {FORMAT_V2}{where}; nothing to do "
                    f"({self.row_groups:,} row groups, manifest.json "
                    f"{self.manifest_bytes_after:,} bytes)")
        assert self.index is not None
        version = f"; version {self.version.sequence} ({self.version.path})" if self.version \
            else ""
        codecs = (f"; recorded the codec of {self.codecs:,} shards (readers decode them "
                  "without their footers now)" if self.codecs else "")
        if self.before == FORMAT_V2:
            return (f"{self.url}: wrote {self.index.path} ({self.index.bytes:,} bytes, "
                    f"{self.row_groups:,} row groups){codecs}; shards untouched{version}")
        return (f"{self.url}: upgraded {self.before} -> {FORMAT_V2}{codecs}: wrote "
                f"{self.index.path} "
                f"({self.index.bytes:,} bytes, {self.row_groups:,} row groups); manifest.json "
                f"{self.manifest_bytes_before:,} -> {self.manifest_bytes_after:,} bytes; shards "
                f"untouched{version}")


def _check_locations(manifest: Manifest) -> None:
    """A v1 manifest from before row-group locations were recorded cannot be indexed."""
    for i, shard in enumerate(manifest.shards):
        if not shard.footer_length or not shard.footer_sha256:
            raise UpgradeError(f"shards[{i}] ({shard.path}) has no footer location: the dataset "
                               "predates row-group locations; rebuild it with the pipeline")
        for j, g in enumerate(shard.row_groups):
            if not g.length or not (g.sha256 or g.blake3):
                raise UpgradeError(f"shards[{i}].row_groups[{j}] ({shard.path}) has no byte "
                                   "range or checksum; rebuild the dataset with the pipeline")


def _codec_of(store: ReplicaSet, shard: ShardInfo) -> str:
    """The codec ``shard``'s footer names for footer-free decoding (``""``: none), after
    checking the footer against the index."""
    import pyarrow as pa

    start = shard.bytes - shard.footer_length
    try:
        meta = parse_footer(store.get(shard.path, shard.footer_sha256, start, shard.bytes))
    except (ReplicaError, OSError, pa.ArrowException) as exc:
        raise UpgradeError(f"{shard.path}: its footer cannot be read ({exc}); run `storage "
                           "verify`") from None
    problem = footer_disagreement(meta, [(g.offset, g.length) for g in shard.row_groups])
    if problem is not None:
        raise UpgradeError(f"{shard.path}: {problem}; run `storage verify`")
    return footerless_codec(meta)


def _with_codecs(store: ReplicaSet, shards: Sequence[ShardInfo],
                 log: TextIO | None) -> tuple[list[ShardInfo], int]:
    """``shards`` with the codec of each that lacks one, from its footer; and how many got
    one."""
    todo = [i for i, s in enumerate(shards) if not s.codec and s.footer_length]
    out = list(shards)
    if not todo:
        return out, 0
    if log is not None:
        print(f"reading {len(todo):,} shard footers for their codecs", file=log, flush=True)
    with ThreadPoolExecutor(FOOTER_READS) as pool:
        codecs = pool.map(lambda i: _codec_of(store, shards[i]), todo)
        for done, (i, codec) in enumerate(zip(todo, codecs, strict=True), 1):
            out[i] = replace(shards[i], codec=codec)
            if log is not None and done % 1000 == 0:
                print(f"  {done:,} / {len(todo):,} footers", file=log, flush=True)
    return out, sum(1 for i in todo if out[i].codec)


def upgrade(store: ReplicaSet, log: TextIO | None = None) -> UpgradeResult:
    """Upgrade the dataset of ``store`` to ``shardflow.dataset/2``, its index with the shards'
    codecs (see the module doc)."""
    url = store.url
    manifest = store.read_manifest()
    before = manifest.to_json().encode("utf-8")
    counts = manifest.counts
    if not manifest.is_v2:
        _check_locations(manifest)
    shards = shards_of(store, manifest)
    codecs = 0
    # list<int32> token columns (from long before) always decode under their footers: no
    # codec to record, so none of their footers is read (every run would read them all)
    if dtype_of(manifest.schema.get("input_ids", LEGACY_LIST)) is not None:
        shards, codecs = _with_codecs(store, shards, log)
    if manifest.is_v2 and not codecs:
        return UpgradeResult(url, manifest.format, manifest.index, counts.row_groups,
                             len(before), len(before))
    ref = write_index(store, shards)
    upgraded = with_index(manifest, shards, ref)
    if store.read_manifest() != manifest:
        raise UpgradeError(f"{url}: manifest.json changed while upgrading (a rebuild "
                           "committed?); nothing swapped, run upgrade again")
    version = commit(store, upgraded, log)
    after = upgraded.to_json().encode("utf-8")
    return UpgradeResult(url, manifest.format, ref, counts.row_groups, len(before), len(after),
                         version, codecs)


__all__ = ["ManifestError", "UpgradeError", "UpgradeResult", "upgrade"]
