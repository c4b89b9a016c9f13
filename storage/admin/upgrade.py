"""``upgrade``: give a ``shardflow.dataset/1`` dataset its binary row-group index (format 2).

A v1 manifest lists every shard and row group inline (~150 bytes per row group: 128 MB of JSON
at 768 k row groups, parsed by every rank). Upgrading writes the index of those same shards
(``index/<sha16>.sfidx``, content-addressed, the store's quorum put), then swaps in the v2
manifest that names it, through :func:`storage.admin.versions.commit` (the live v1 manifest is
recorded under ``_versions/`` first when it has no record, the new one after): the swap is the
one atomic step, and shards are neither read nor written. A reader that opened the v1 manifest
finishes on it; gc keeps what the v1 version names for as long as it keeps that version.

Idempotent: a v2 dataset is left alone. Deterministic: the same v1 manifest always gives the
same index and manifest bytes. Not a compare-and-swap: the manifest is read again right before
the swap and the upgrade stops if it changed (a rebuild committed meanwhile), which narrows
but cannot close the window on a store without conditional writes; do not run it during a
rebuild of the same dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from storage.admin.versions import Version, commit
from storage.format.index import with_index
from storage.format.manifest import FORMAT_V2, IndexRef, Manifest, ManifestError
from storage.io.index_store import write_index
from storage.io.replicas import ReplicaSet


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

    @property
    def changed(self) -> bool:
        return self.before != FORMAT_V2

    def render(self) -> str:
        if not self.changed:
            where = f" (index {self.index.path})" if self.index else ""
            return (f"{self.url}: already {FORMAT_V2}{where}; nothing to do "
                    f"({self.row_groups:,} row groups, manifest.json "
                    f"{self.manifest_bytes_after:,} bytes)")
        assert self.index is not None
        version = f"; version {self.version.sequence} ({self.version.path})" if self.version \
            else ""
        return (f"{self.url}: upgraded {self.before} -> {FORMAT_V2}: wrote {self.index.path} "
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


def upgrade(store: ReplicaSet, log: TextIO | None = None) -> UpgradeResult:
    """Upgrade the dataset of ``store`` to ``shardflow.dataset/2`` (see the module doc)."""
    url = store.url
    manifest = store.read_manifest()
    before = manifest.to_json().encode("utf-8")
    counts = manifest.counts
    if manifest.is_v2:
        return UpgradeResult(url, manifest.format, manifest.index, counts.row_groups,
                             len(before), len(before))
    _check_locations(manifest)
    ref = write_index(store, manifest.shards)
    upgraded = with_index(manifest, manifest.shards, ref)
    if store.read_manifest() != manifest:
        raise UpgradeError(f"{url}: manifest.json changed while upgrading (a rebuild "
                           "committed?); nothing swapped, run upgrade again")
    version = commit(store, upgraded, log)
    after = upgraded.to_json().encode("utf-8")
    return UpgradeResult(url, manifest.format, ref, counts.row_groups, len(before), len(after),
                         version)


__all__ = ["ManifestError", "UpgradeError", "UpgradeResult", "upgrade"]
