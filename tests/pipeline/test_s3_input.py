"""Inputs read from S3 globs on a real S3 server (SeaweedFS/MinIO on loopback), nothing mocked.

A mixed corpus — JSONL, gzipped JSONL, CSV, Parquet, and one JSONL file large enough to be cut
into several byte-range partitions — is uploaded to a bucket. The pipeline reads it through
``s3://`` globs and writes the dataset to the same bucket; the same files copied to local disk
go through the same pipeline into a local directory. Every good record must arrive exactly
once, the two datasets must hold the same bytes, and the credentials must appear nowhere.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem
from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.planning.discovery import discover
from pipeline.planning.plan import plan_partitions
from storage import Manifest, ShardInfo, read_manifest, resolve, tokens
from storage.format.index import read_index, shards_from_columns

PARTITION = 16_000  # big.jsonl (~60 KB) becomes 4 byte ranges; the others one each


def _text(kind: str, i: int) -> str:
    # Plain ASCII, single spaces: cleaning leaves it as it is, and no two records are equal.
    return f"{kind} record {i} says the quick brown fox number {i * 7 + 3} jumps over it"


def _corpus() -> tuple[dict[str, bytes], list[str], int]:
    """``({name: bytes}, every good text, number of bad records)``."""
    files: dict[str, bytes] = {}
    good: list[str] = []

    small = [_text("small", i) for i in range(40)]
    files["small.jsonl"] = "".join(json.dumps({"text": t}) + "\n" for t in small).encode()
    good += small

    gz = [_text("gzip", i) for i in range(60)]
    files["packed.jsonl.gz"] = gzip.compress(
        "".join(json.dumps({"text": t}) + "\n" for t in gz).encode(), mtime=0)
    good += gz

    rows = [_text("csv", i) for i in range(30)]
    files["table.csv"] = ("id,text\n" + "".join(f"{i},\"{t}\"\n" for i, t in enumerate(rows))
                          ).encode()
    good += rows

    pq_texts = [_text("parquet", i) for i in range(300)]
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": pq_texts, "n": list(range(300))}), sink, row_group_size=100)
    files["columns.parquet"] = sink.getvalue()
    good += pq_texts

    big = [_text("big", i) for i in range(700)]
    lines = [json.dumps({"text": t}) for t in big]
    lines[350:350] = ["{this is not json", json.dumps({"other": "no text field"})]
    files["big.jsonl"] = ("\n".join(lines) + "\n").encode()
    good += big
    return files, good, 2


@pytest.fixture(scope="module")
def corpus() -> tuple[dict[str, bytes], list[str], int]:
    return _corpus()


def _shards(fs, root: str, m: Manifest) -> tuple[ShardInfo, ...]:  # noqa: ANN001
    """The shards a v2 manifest's index names (read straight from the filesystem)."""
    assert m.index is not None
    data = fs.cat_file(f"{root}/{m.index.path}")
    return shards_from_columns(read_index(data, m.index.header_sha256))


def _decoded(fs, root: str) -> tuple[Manifest, list[tuple[str, str]]]:  # noqa: ANN001
    m = Manifest.from_json(fs.cat_file(f"{root}/manifest.json").decode())
    tok = Tokenizer.from_str(fs.cat_file(f"{root}/{m.tokenizer.path}").decode())
    out = []
    for shard in _shards(fs, root, m):
        table = pq.read_table(io.BytesIO(fs.cat_file(f"{root}/{shard.path}")))
        for doc_id, ids in zip(table.column("doc_id").to_pylist(),
                               tokens.documents(table.column("input_ids"),
                                                m.schema["input_ids"]), strict=True):
            assert ids[-1] == m.eos_id
            out.append((doc_id, tok.decode(ids[:-1].tolist())))
    return m, out


def _without_locations(m: Manifest) -> dict:
    """The manifest minus what names where the inputs were: the globs, the quarantine (whose
    records name their file by its full URL) and the lineage's hash of the input listing."""
    d = json.loads(m.to_json())
    d["config"].pop("inputs")
    d.pop("quarantine")
    listing = d["lineage"]["inputs"]  # its hash covers the inputs' URLs (and versions)
    assert len(listing.pop("sha256")) == 64, listing
    return d


def _quarantined(fs, root: str, m: Manifest) -> list[dict]:  # noqa: ANN001
    return [json.loads(line) for obj in m.quarantine
            for line in fs.cat_file(f"{root}/{obj.path}").decode().splitlines()]


def test_s3_globs_in_s3_out_match_local_run(s3_bucket, corpus, tmp_path: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    files, good, bad = corpus
    opts = s3_bucket.storage_options
    remote = resolve(s3_bucket.url, opts)
    local_raw = tmp_path / "raw"
    local_raw.mkdir()
    for name, data in files.items():
        remote.fs.pipe_file(remote.path(f"corpus/raw/{name}"), data)
        (local_raw / name).write_bytes(data)
    remote.fs.pipe_file(remote.path("corpus/other/ignored.jsonl"), b'{"text": "not mine"}\n')

    # Overlapping globs: a file matched twice is read once.
    globs = ["corpus/raw/*.jsonl.gz", "corpus/raw/*.jsonl*", "corpus/raw/*.csv",
             "corpus/raw/*.parquet"]
    remote_inputs = [f"{s3_bucket.url}/{g}" for g in globs]
    parts = plan_partitions(discover(remote_inputs, opts), PARTITION)
    assert [p.url.rsplit("/", 1)[1] for p in parts].count("big.jsonl") >= 3
    assert [p.url.rsplit("/", 1)[1] for p in parts].count("columns.parquet") >= 2

    out_url = f"{s3_bucket.url}/datasets/mixed"
    log = io.StringIO()
    summary = run(PipelineConfig(inputs=remote_inputs, output=out_url, storage_options=opts,
                                 workers=2, partition_bytes=PARTITION, row_group_tokens=4096,
                                 dashboard_address="127.0.0.1:0"), log=log, progress=False)
    local_out = tmp_path / "ds"
    run(PipelineConfig(inputs=[str(local_raw / g.rsplit("/", 1)[1]) for g in globs],
                       output=str(local_out), workers=1, partition_bytes=PARTITION,
                       row_group_tokens=4096, dashboard_address="127.0.0.1:0"),
        progress=False)

    # Every good record exactly once; the bad ones quarantined, none lost silently.
    m, docs = _decoded(remote.fs, remote.path("datasets/mixed"))
    assert sorted(t for _, t in docs) == sorted(good)
    assert len({d for d, _ in docs}) == len(docs)
    assert summary.partitions == len(parts)
    assert m.stats["documents_in"] == len(good) + bad
    assert sum(m.stats["quarantined"].values()) == bad
    q = _quarantined(remote.fs, remote.path("datasets/mixed"), m)
    assert sorted(r["reason"] for r in q) == ["malformed_json", "missing_field"]
    assert all(r["file"] == f"{s3_bucket.url}/corpus/raw/big.jsonl" for r in q)
    for r in q:  # a split file's records are named by their exact byte offset
        name, offset = r["source"].split("@")
        assert name == "big.jsonl" and int(offset) > PARTITION
        assert files["big.jsonl"][int(offset):].startswith(r["raw"].encode() + b"\n")
    remote.fs.invalidate_cache()
    stored_paths = remote.fs.find(remote.path("datasets/mixed"))
    assert not [p for p in stored_paths if "/_work/" in p]  # scratch removed after the commit

    # The same bytes as from local copies: doc ids name files by base name, so the shards are
    # byte-identical; the manifests differ only where they name the inputs' location.
    lm = read_manifest(str(local_out))
    assert _without_locations(lm) == _without_locations(m)
    lq = _quarantined(LocalFileSystem(), str(local_out), lm)
    assert [r["file"] for r in lq] == [str(local_raw / "big.jsonl")] * bad
    assert [{**r, "file": ""} for r in lq] == [{**r, "file": ""} for r in q]
    shards = _shards(remote.fs, remote.path("datasets/mixed"), m)
    assert len(shards) == len(parts)
    for shard in shards:
        assert remote.fs.cat_file(remote.path(f"datasets/mixed/{shard.path}")) == \
            (local_out / shard.path).read_bytes()
    assert m.config["inputs"] == remote_inputs

    # Credentials appear nowhere: not in the manifest, the quarantine, the summary, the run's
    # log, nor anything the driver or the worker processes printed.
    captured = capfd.readouterr()
    secret, key = opts["secret"], opts["key"]
    stored = b"".join(remote.fs.cat_file(p) for p in remote.fs.find(remote.path("datasets")))
    for text in (m.to_json(), stored.decode("utf-8", "replace"), summary.render(),
                 log.getvalue(), captured.out, captured.err):
        assert secret not in text and key not in text
    assert "dask: 2 workers" in log.getvalue()
