"""The local disk cache of verified pieces: hits skip the store, limits hold, rot is refetched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loaders import build_dataloader
from loaders.cache import LOW_WATER, ChunkCache, Entry, choose_evictions
from storage import digest_bytes, read_manifest, resolve, shards_of
from storage.format.checksums import piece_key, piece_matches
from tests.loaders._crafted import without_codecs

ROOT = Path(__file__).resolve().parents[2]
SEQ = 64
BATCH = 8


def _loader(url: str, **kw):
    return build_dataloader(url, BATCH, SEQ, rank=0, world_size=1, return_sample_id=True, **kw)


def _epoch(loader, epoch: int) -> tuple[list[int], torch.Tensor]:
    loader.set_epoch(epoch)
    ids, inputs = [], []
    for batch in loader:
        ids += batch["sample_id"].tolist()
        inputs.append(batch["input_ids"])
    return ids, torch.cat(inputs)


def _same(a: tuple[list[int], torch.Tensor], b: tuple[list[int], torch.Tensor]) -> bool:
    return a[0] == b[0] and torch.equal(a[1], b[1])


def _used_pieces(dataset: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(key, length) of the row groups an epoch reads (the index's 128-bit BLAKE3 digest,
    tagged: the cache key) and (sha256, length) of their shards' footers."""
    groups, footers = [], []
    for shard in shards_of(dataset, read_manifest(dataset)):
        used = [(piece_key(g.blake3, "blake3"), g.length) for g in shard.row_groups
                if g.tokens >= SEQ + 1]
        groups += used
        if used:
            footers.append((shard.footer_sha256, shard.footer_length))
    return groups, footers


def _upload(local: str, bucket) -> str:  # type: ignore[no-untyped-def]
    url = f"{bucket.url}/tiny"
    loc = resolve(url, bucket.storage_options)
    files = sorted(p for p in Path(local).rglob("*") if p.is_file())
    for path in sorted(files, key=lambda p: p.name == "manifest.json"):  # manifest last
        loc.fs.pipe_file(loc.path(path.relative_to(local).as_posix()), path.read_bytes())
    return url


def _placed(dataset: str) -> list[tuple[str, int, int, str]]:
    """(shard file key, offset, length, piece key) of the row groups an epoch reads: where the
    cache places them."""
    out = []
    for shard in shards_of(dataset, read_manifest(dataset)):
        out += [(ChunkCache.shard_key(shard.sha256), g.offset, g.length,
                 piece_key(g.blake3, "blake3"))
                for g in shard.row_groups if g.tokens >= SEQ + 1]
    return out


def _check_directory(cache_dir: Path, limit: int, dataset: str | None = None,
                     placed_ok: bool = False) -> int:
    """Every entry is intact and named by its content (in a shard file, every piece written
    there is the piece its place names), no temp file is left, the counter is exact and the
    total within the limit. Returns the number of entries."""
    cache = ChunkCache(cache_dir, limit)
    entries = cache.scan()
    placed = _placed(dataset) if dataset else []
    for e in entries:
        data = cache.path(e.key).read_bytes()
        if not e.key.startswith("s-"):
            assert piece_matches(e.key, data)
            continue
        if placed_ok:
            continue
        assert dataset is not None, "shard files are checked against their dataset"
        pieces = [(o, n, k) for s, o, n, k in placed if s == e.key]
        assert pieces, f"{e.key} is no shard of the dataset"
        for offset, length, key in pieces:
            piece = data[offset:offset + length]
            assert piece_matches(key, piece) or not piece.strip(b"\0")  # the piece, or a hole
    assert not list((cache_dir / "tmp").iterdir())
    total = sum(e.size for e in entries)
    assert int((cache_dir / ".size").read_text()) == total <= limit
    return len(entries)


@pytest.mark.parametrize("codecs", ["recorded", "older index"])
def test_second_epoch_comes_from_the_cache_not_the_store(
        tiny_dataset: str, s3_bucket, tmp_path: Path,  # type: ignore[no-untyped-def]
        no_python_file_reads: None, codecs: str) -> None:
    if codecs == "older index":  # no shard_codec: the reader fetches (and caches) footers
        tiny_dataset = str(without_codecs(tiny_dataset, tmp_path))
    url = _upload(tiny_dataset, s3_bucket)
    opts = s3_bucket.storage_options
    plain = _loader(url, storage_options=opts)
    want = [_epoch(plain, e) for e in (0, 1)]
    groups, footers = _used_pieces(tiny_dataset)
    if codecs == "recorded":
        footers = []  # decoded under a footer made from the index: never fetched

    # One read thread: with more, threads that start on one shard together may each look up
    # its footer, and the counts below would depend on timing.
    cached = _loader(url, storage_options=opts, cache_dir=tmp_path / "cache", read_threads=1)
    assert _same(_epoch(cached, 0), want[0])
    first = cached.metrics()
    assert first["bytes_read"] > 0 and first["row_groups_read"] == len(groups)
    assert first["cache_misses"] == len(groups) + len(footers) and first["cache_hits"] == 0

    # A warm read is a local read: decoded from the mapped cache file, never through a Python
    # file object (which costs a GIL round trip per row group: no_python_file_reads).
    assert _same(_epoch(cached, 1), want[1])
    second = cached.metrics()
    assert second["bytes_read"] == first["bytes_read"]  # nothing more from the store
    assert second["row_groups_read"] == first["row_groups_read"]
    assert second["cache_hits"] == len(groups)  # footers stay parsed in the reader

    # Another loader (as another rank or a restarted job would be): footers hit as well.
    fresh = _loader(url, storage_options=opts, cache_dir=tmp_path / "cache", read_threads=1)
    assert _same(_epoch(fresh, 1), want[1])
    metrics = fresh.metrics()
    assert metrics["bytes_read"] == 0 and metrics["row_groups_read"] == 0
    assert metrics["cache_misses"] == 0 and metrics["cache_hits"] == len(groups) + len(footers)


def test_placed_pieces_sit_at_their_offsets_in_a_sparse_shard_file(tmp_path: Path) -> None:
    import blake3

    size, offset = 64 << 20, 40 << 20  # a piece deep inside a 64 MiB shard
    piece = os.urandom(300_000)
    key = piece_key(blake3.blake3(piece).hexdigest()[:32], "blake3")
    shard = ChunkCache.shard_key("ab" * 32)
    cache = ChunkCache(tmp_path, max_bytes=8 << 20)
    assert cache.get_placed(shard, size, offset, offset + len(piece), key) is None
    assert (cache.misses, cache.corrupt) == (1, 0)  # nothing there yet: a miss
    cache.put_placed(shard, size, offset, piece)
    mapped = cache.get_placed(shard, size, offset, offset + len(piece), key)
    assert mapped is not None and mapped[offset:offset + len(piece)] == piece
    st = cache.path(shard).stat()
    assert st.st_size == size and st.st_blocks * 512 < 1 << 20  # sparse: ~the piece on disk
    assert cache.total_bytes() == st.st_blocks * 512 <= 8 << 20  # counted by what it takes
    # Another piece of the shard, never written, is a hole: a miss, not corruption.
    assert cache.get_placed(shard, size, 0, len(piece), key) is None
    assert cache.corrupt == 0 and cache.hits == 1
    # Bytes that are not the piece (rot) are corruption, and a write puts the piece back.
    with open(cache.path(shard), "r+b") as fh:
        fh.seek(offset + 7)
        fh.write(bytes([piece[7] ^ 0xFF]))  # another byte (a fixed one was the piece's 1/256)
    assert cache.get_placed(shard, size, offset, offset + len(piece), key) is None
    assert cache.corrupt == 1
    cache.put_placed(shard, size, offset, piece)
    assert cache.get_placed(shard, size, offset, offset + len(piece), key) is not None
    # A file of another size under the name is not this shard's: a miss, then replaced.
    assert ChunkCache(tmp_path).get_placed(shard, size + 1, offset, offset + len(piece),
                                           key) is None
    cache.put_placed(shard, size + 1, offset, piece)
    assert cache.path(shard).stat().st_size == size + 1
    assert _check_directory(tmp_path, 8 << 20, None, placed_ok=True) == 1
    # A place past the end of the shard, or a name a manifest could steer, is never written.
    cache.put_placed(shard, size, size - 10, piece)
    cache.put_placed("s-../../etc", size, 0, piece)
    assert cache.errors == 0 and not (tmp_path / "etc").exists()


def test_eviction_choice_is_least_recently_used_first() -> None:
    entries = [Entry("a", 10, 3.0), Entry("b", 10, 1.0), Entry("c", 10, 2.0), Entry("d", 5, 4.0)]
    assert choose_evictions(entries, 35) == []
    assert choose_evictions(entries, 30) == ["b"]
    assert choose_evictions(entries, 15) == ["b", "c"]
    assert choose_evictions(entries, 14) == ["b", "c", "a"]
    assert choose_evictions(entries, 0) == ["b", "c", "a", "d"]


def test_a_hit_keeps_an_entry_from_eviction(tmp_path: Path) -> None:
    blobs = [bytes([i]) * 1000 for i in range(4)]
    keys = [digest_bytes(b) for b in blobs]
    cache = ChunkCache(tmp_path, max_bytes=3500)
    for i, (key, blob) in enumerate(zip(keys[:3], blobs[:3], strict=True)):
        cache.put(key, blob)
        os.utime(cache.path(key), (1000.0 + i, 1000.0 + i))  # written in the order 0, 1, 2
    assert cache.get(keys[0]) == blobs[0]  # used again: now the most recent
    cache.put(keys[3], blobs[3])  # 4000 > 3500: evict down to 0.9 * 3500
    assert cache.evictions == 1 and cache.get(keys[1]) is None
    assert all(cache.get(k) is not None for k in (keys[0], keys[2], keys[3]))
    assert _check_directory(tmp_path, 3500) == 3


def test_size_limit_holds_while_evicting(tiny_dataset: str, tmp_path: Path) -> None:
    want = _epoch(_loader(tiny_dataset), 0)
    groups, footers = _used_pieces(tiny_dataset)
    limit = sum(n for _sha, n in groups + footers) // 3
    loader = _loader(tiny_dataset, cache_dir=tmp_path / "cache", cache_bytes=limit)
    cache = loader.source.reader.cache
    assert cache is not None
    loader.set_epoch(0)
    ids, inputs = [], []
    for batch in loader:
        assert cache.total_bytes() <= limit
        ids += batch["sample_id"].tolist()
        inputs.append(batch["input_ids"])
    assert _same((ids, torch.cat(inputs)), want)
    assert cache.evictions > 0
    assert 0 < cache.total_bytes() <= limit
    _check_directory(tmp_path / "cache", limit, tiny_dataset)


def test_a_corrupted_cache_file_is_refetched_not_returned(tiny_dataset: str,
                                                          tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    want = _epoch(_loader(tiny_dataset, cache_dir=cache_dir), 0)
    shard, offset, length, key = _placed(tiny_dataset)[3]
    assert key.startswith("b3-")  # the pipeline's datasets verify pieces by BLAKE3
    path = cache_dir / shard[2:4] / shard  # row groups sit in a file shaped like their shard
    data = bytearray(path.read_bytes())
    assert piece_matches(key, data[offset:offset + length])
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))

    fresh = _loader(tiny_dataset, cache_dir=cache_dir)
    assert _same(_epoch(fresh, 0), want)
    metrics = fresh.metrics()
    assert metrics["cache_corrupt"] == 1
    assert metrics["row_groups_read"] == 1 and metrics["bytes_read"] == length  # only that one
    # The cache holds a good copy again, written over the bad one in place.
    assert piece_matches(key, path.read_bytes()[offset:offset + length])


_SHARER = """
import hashlib, json, sys
import loaders.reader as reader_module
from loaders import build_dataloader
url, cache_dir, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
digest, stats = hashlib.sha256(), {}
for epoch in range(3):
    loader = build_dataloader(url, 8, 64, rank=0, world_size=1, cache_dir=cache_dir,
                              cache_bytes=limit)
    loader.set_epoch(epoch % 2)
    for batch in loader:
        digest.update(batch["input_ids"].numpy().tobytes())
    for k, v in loader.source.reader.cache.stats().items():
        stats[k] = stats.get(k, 0) + v
print(json.dumps({"digest": digest.hexdigest(), **stats}))
"""


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_two_processes_share_one_cache_directory(tiny_dataset: str, tmp_path: Path,
                                                 fraction: float) -> None:
    """Two jobs read the same pieces at once, writing and (at half size) evicting the same
    entries: both get the right tokens, neither ever sees a torn or foreign entry."""
    loader = _loader(tiny_dataset)
    digest = hashlib.sha256()
    for epoch in range(3):
        digest.update(_epoch(loader, epoch % 2)[1].numpy().tobytes())
    groups, footers = _used_pieces(tiny_dataset)
    limit = int(sum(n for _sha, n in groups + footers) * fraction / LOW_WATER) + 1
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _SHARER, tiny_dataset, str(cache_dir),
                               str(limit)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["digest"] == digest.hexdigest()
        # A piece is written into its shard file in place, so the other job may meet one
        # half-written: verified, it counts as corrupt and is fetched (``corrupt`` may be
        # non-zero); what it returns is still only ever the right tokens (the digests above).
        assert result["errors"] == 0
    assert sum(r["hits"] for r in results) > 0
    if fraction < 1:
        assert sum(r["evictions"] for r in results) > 0
    assert _check_directory(cache_dir, limit, tiny_dataset) > 0
