"""The loader on a view (``python -m pipeline select``): its samples are windows of the kept
documents' tokens only, and it keeps every guarantee a dataset has: the same global batches
on any world size and worker count, equal batches per rank, exact resume on another world
size, failover between replicas (each view replica reading the source beside it), and the
same epoch from S3 through either read client."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loaders import build_dataloader
from pipeline.select.build import select, view_replicas
from storage import ReplicaSet, read_manifest, shards_of, tokens
from storage.io.clients import CLIENT_ENV
from tests.pipeline.select import web_views

SEQ = 16


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("loader-views")
    web = web_views.build(root, shared=tmp_path_factory)
    out = root / "web-en"
    select(ReplicaSet.from_urls([str(web)]), "lang = 'en'", ReplicaSet.from_urls([str(out)]),
           progress=False)
    return str(out)


def _kept_windows(view: str) -> list[list[int]]:
    """Every window of ``SEQ + 1`` tokens of the English documents, row group by row group,
    read from the source's shards by pyarrow: the samples a view must give, in id order."""
    web = Path(view).parent / "web"
    m = read_manifest(str(web))
    out = []
    for shard in shards_of(str(web), m):
        parquet = pq.ParquetFile(web / shard.path)
        for g in range(parquet.num_row_groups):
            t = parquet.read_row_group(g, columns=["input_ids", "lang"])
            t = t.filter(pc.equal(t.column("lang"), "en"))
            ids = tokens.unpack(t.column("input_ids"), m.schema["input_ids"])
            out += [ids[k * (SEQ + 1):(k + 1) * (SEQ + 1)].tolist()
                    for k in range(len(ids) // (SEQ + 1))]
    return out


def _loader(ds: str, batch: int, rank: int = 0, world: int = 1, workers: int = 0):  # type: ignore[no-untyped-def]
    return build_dataloader(ds, batch, SEQ, num_workers=workers, rank=rank, world_size=world,
                            return_sample_id=True, seed=3)


def test_samples_are_windows_of_the_kept_documents_only(view: str) -> None:
    want = _kept_windows(view)
    loader = _loader(view, 4)
    assert loader.source.n_samples == len(want) > 100
    seen = set()
    for batch in loader:
        for sid, x, y in zip(batch["sample_id"].tolist(), batch["input_ids"].tolist(),
                             batch["labels"].tolist(), strict=True):
            assert x + y[-1:] == want[sid]
            seen.add(sid)
    assert seen == set(range(len(want)))


def _global(ds: str, world: int, workers: int = 0, state: dict | None = None,
            limit: int | None = None) -> tuple[list[list[int]], dict]:
    loaders = [_loader(ds, 8 // world, r, world, workers) for r in range(world)]
    per_rank = []
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
        per_rank.append([np.asarray(b["sample_id"]).tolist()
                         for b in itertools.islice(ld, limit)])
    assert len({len(b) for b in per_rank}) == 1  # equal batches on every rank
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)
    return [sorted(x for r in range(world) for x in per_rank[r][k])
            for k in range(len(per_rank[0]))], states[0]


@pytest.mark.parametrize("world,workers", [(2, 0), (4, 1)])
def test_global_batches_are_the_same_on_any_world_size(view: str, world: int,
                                                       workers: int) -> None:
    ref, _ = _global(view, 1)
    assert _global(view, world, workers)[0] == ref and len(ref) > 10


def test_resume_on_another_world_size_continues_the_same_global_batches(view: str) -> None:
    ref, _ = _global(view, 1)
    head, state = _global(view, 2, limit=5)
    tail, _ = _global(view, 4, state=json.loads(json.dumps(state)))
    assert head + tail == ref


def _epoch(url: str, **kw) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [b["input_ids"].tolist() for b in build_dataloader(url, 4, SEQ, rank=0,
                                                              world_size=1, seed=3, **kw)]


def test_a_replicated_view_fails_over_to_the_source_beside_its_other_replica(
        view: str, tmp_path: Path) -> None:
    root = Path(view).parent
    for name in ("a", "b"):
        shutil.copytree(root / "web", tmp_path / name / "web")
    src = ReplicaSet.from_urls([str(tmp_path / "a" / "web"), str(tmp_path / "b" / "web")])
    select(src, "lang = 'en'", view_replicas(src, str(tmp_path / "a" / "web-en")),
           progress=False)
    assert (tmp_path / "b" / "web-en" / "manifest.json").is_file()  # beside the other one
    m = read_manifest(str(tmp_path / "a" / "web-en"))
    shard = shards_of(str(tmp_path / "a" / "web-en"), m)[0].path
    (tmp_path / "a" / "web" / shard).unlink()  # replica a's source lost a shard
    loader = build_dataloader(str(tmp_path / "a" / "web-en"), 4, SEQ, rank=0, world_size=1,
                              seed=3, replicas=[str(tmp_path / "b" / "web-en")])
    got = [b["input_ids"].tolist() for b in loader]
    assert got == _epoch(view)
    assert loader.source.metrics()["failovers"] > 0


def test_a_view_on_s3_reads_the_same_epoch_through_either_client(
        view: str, s3_bucket, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    root = Path(view).parent
    opts = s3_bucket.storage_options
    for name in ("web", "web-en"):
        store = ReplicaSet.from_urls([f"{s3_bucket.url}/data/{name}"], opts)
        for p in sorted((root / name).rglob("*")):
            if p.is_file():
                store.put(p.relative_to(root / name).as_posix(), p.read_bytes())
    want = _epoch(view)
    for client in ("obstore", "s3fs"):
        monkeypatch.setenv(CLIENT_ENV, client)
        assert _epoch(f"{s3_bucket.url}/data/web-en", storage_options=opts) == want, client
    # select itself on S3: the same view, its pin in the source there
    select(ReplicaSet.from_urls([f"{s3_bucket.url}/data/web"], opts), "lang = 'en'",
           ReplicaSet.from_urls([f"{s3_bucket.url}/data/en2"], opts), progress=False)
    assert _epoch(f"{s3_bucket.url}/data/en2", storage_options=opts) == want
    pins = ReplicaSet.from_urls([f"{s3_bucket.url}/data/web"], opts).primary
    assert pins.fs.ls(pins.path("_views/en2"))
