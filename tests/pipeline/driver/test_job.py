"""The pipeline end to end on small real inputs, on a real Dask LocalCluster."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from pipeline.cleaning import Cleaner
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.output.shards import encode_table
from pipeline.planning.discovery import discover
from pipeline.planning.plan import plan_partitions, task_groups
from pipeline.readers import ReadOptions, read_partition
from pipeline.records import Document
from storage import FORMAT_V2, ShardInfo, index_name, read_manifest, shards_of, tokens
from storage.format.index import build_index, index_ref


def rows(dataset: str) -> list[tuple[str, list[int]]]:
    m = read_manifest(dataset)
    out = []
    for shard in shards_of(dataset, m):
        table = pq.read_table(Path(dataset) / shard.path)
        docs = tokens.documents(table.column("input_ids"), m.schema["input_ids"])
        out += list(zip(table.column("doc_id").to_pylist(), [d.tolist() for d in docs],
                        strict=True))
    return out


def decoded(dataset: str) -> list[tuple[str, str]]:
    m = read_manifest(dataset)
    tok = Tokenizer.from_file(str(Path(dataset) / m.tokenizer.path))
    eos = m.eos_id
    out = []
    for doc, ids in rows(dataset):
        assert ids[-1] == eos and eos not in ids[:-1]
        out.append((doc, tok.decode(ids[:-1])))
    return out


def _cfg(inputs: list[str], out: Path, **kw: object) -> PipelineConfig:
    return PipelineConfig(inputs=inputs, output=str(out), workers=kw.pop("workers", 1),
                          dashboard_address="127.0.0.1:0", **kw)  # type: ignore[arg-type]


def test_manifest_counts_match_the_shards(tiny_dataset: str) -> None:
    m = read_manifest(tiny_dataset)
    assert m.vocab_size == 50257 and m.eos_id == 50256
    assert m.schema["input_ids"] == "binary<uint16le>"  # GPT-2's ids fit in 16 bits
    counted = 0
    shards = shards_of(tiny_dataset, m)
    assert m.format == FORMAT_V2 and not m.shards and m.index is not None
    assert m.counts.shards == len(shards) and m.counts.row_groups == sum(
        len(s.row_groups) for s in shards)
    for shard in shards:
        path = Path(tiny_dataset) / shard.path
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256
        assert path.stat().st_size == shard.bytes
        pf = pq.ParquetFile(path)
        assert pf.num_row_groups == len(shard.row_groups) >= 1
        for i, group in enumerate(shard.row_groups):
            column = pf.read_row_group(i, columns=["input_ids"]).column(0)
            ids = tokens.documents(column, m.schema["input_ids"])
            assert len(ids) == group.rows
            assert sum(map(len, ids)) == group.tokens
            counted += group.tokens
    assert counted == m.total_tokens == m.stats["tokens"] > 100_000
    assert m.stats["documents_out"] == m.total_rows
    assert m.stats["dropped"]["empty"] == 1 and m.stats["dropped"]["duplicate"] > 10
    assert m.stats["documents_in"] == m.total_rows + sum(m.stats["dropped"].values())
    assert not (Path(tiny_dataset) / "_work").exists()  # scratch removed after the commit


def test_every_shard_is_the_canonical_encoding_of_its_rows(tiny_dataset: str) -> None:
    """Shards copied from phase 1 and shards re-encoded after dedup drops are alike: bytes and
    manifest entry are what encoding the shard's rows gives (so neither path can drift)."""
    m = read_manifest(tiny_dataset)
    dtype = tokens.dtype_of(m.schema["input_ids"])
    infos = []
    for shard in shards_of(tiny_dataset, m):
        table = pq.read_table(Path(tiny_dataset) / shard.path)
        data, info = encode_table(table, dtype, 8192, shard.path)
        assert _as_indexed(info) == shard
        assert data == (Path(tiny_dataset) / shard.path).read_bytes()
        infos.append(info)
    # The index is the canonical index of those shards, under its content-addressed name.
    index = build_index(infos)
    assert m.index == index_ref(index_name(hashlib.sha256(index).hexdigest()), index, "blake3")
    assert (Path(tiny_dataset) / m.index.path).read_bytes() == index


def _as_indexed(info: ShardInfo) -> ShardInfo:
    """A shard as the index keeps it: each row group's digest is its BLAKE3's first 128 bits."""
    groups = tuple(replace(g, blake3=g.blake3[:32]) for g in info.row_groups)
    return replace(info, row_groups=groups)


def test_output_is_the_cleaned_first_occurrences_in_order(tiny_dataset: str,
                                                          corpus_dir: Path) -> None:
    """Independent oracle: read, clean, keep first occurrences, in file order — in-process."""
    cleaner = Cleaner()
    seen: set[str] = set()
    expected = []
    for part in plan_partitions(discover([str(corpus_dir / "*.txt")]), 16 << 20):
        for doc in read_partition(part, ReadOptions()):
            assert isinstance(doc, Document)
            text = cleaner(doc.text)
            if text is not None and text not in seen:
                seen.add(text)
                expected.append((doc.doc_id, text))
    assert decoded(tiny_dataset) == expected
    messy = [t for d, t in expected if d.startswith("zz_messy.txt")]
    assert messy == ["Caf\u00e9 au lait, served hot.\nsecond line with a bell", "The end."]


def _recording_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the tasks that the job's (real) cluster runs, from Dask's task stream."""
    from distributed import get_task_stream

    import pipeline.driver.job

    keys: list[str] = []
    real = pipeline.driver.job.dask_client

    @contextlib.contextmanager
    def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **kwargs) as client, get_task_stream(client) as stream:
            yield client
        keys.extend(str(t["key"]) for t in stream.data)

    monkeypatch.setattr(pipeline.driver.job, "dask_client", recording)
    return keys


def test_rerun_with_other_worker_count_is_byte_identical(
        tiny_dataset: str, corpus_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg([str(corpus_dir / "*.txt")], tmp_path / "again", row_group_tokens=8192,
               partition_bytes=40_000, dedup_buckets=3)  # other partitions: other shards
    ran = _recording_tasks(monkeypatch)
    run(cfg, progress=False)
    # The tail's steps go a group of partitions to a task: the dedup shuffle's by key count
    # (all of this corpus's keys make one group), phase 2's links by task_groups (one worker).
    parts = read_manifest(str(tmp_path / "again")).stats["partitions"]
    reencoded = sum(bool(re.fullmatch(r"phase2-\d+-[0-9a-f]{8}", k)) for k in ran)
    assert sum(k.startswith("phase1-") for k in ran) == parts >= 8
    assert sum(k.startswith("bucket-keys-") for k in ran) == 1
    assert reencoded >= 1  # the corpus repeats documents: some partitions lose rows
    assert sum(k.startswith("drops-of-") for k in ran) == 1
    assert sum(k.startswith("phase2-") for k in ran) == \
        reencoded + len(task_groups(parts - reencoded, 1))
    assert read_manifest(str(tmp_path / "again")).total_tokens == \
        read_manifest(tiny_dataset).total_tokens
    assert [t for _, t in decoded(str(tmp_path / "again"))] == \
        [t for _, t in decoded(tiny_dataset)]
    cfg = _cfg([str(corpus_dir / "*.txt")], tmp_path / "same", row_group_tokens=8192,
               dedup_buckets=2, files_per_partition=1)  # as tiny_dataset was made
    run(cfg, progress=False)
    first = (Path(tiny_dataset) / "manifest.json").read_bytes()
    assert (tmp_path / "same" / "manifest.json").read_bytes() == first
    m = read_manifest(tiny_dataset)
    for path, _size, _sha in [*m.objects(), *((s.path, 0, "") for s in shards_of(
            tiny_dataset, m))]:
        assert (tmp_path / "same" / path).read_bytes() == (Path(tiny_dataset) / path).read_bytes()


def test_bad_input_is_quarantined_and_every_good_record_kept(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    good = [f"good record number {i} with some words" for i in range(300)]
    lines = [json.dumps({"body": t}).encode() for t in good[:100]]
    lines[10:10] = [b"{oops", b'{"body": null}', b'{"body": ["list"]}', b'{"body": "\xff"}',
                    b'{"body": "' + b"h" * 3000 + b'"}']
    (raw / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    gz = gzip.compress(b"".join(json.dumps({"body": t}).encode() + b"\n" for t in good[100:]))
    (raw / "b.jsonl.gz").write_bytes(gz[: len(gz) * 2 // 3])
    (raw / "c.jsonl.gz").write_bytes(b"not gzip")
    out = tmp_path / "ds"
    summary = run(_cfg([str(raw / "*")], out, text_field="body", max_record_bytes=2000,
                       partition_bytes=4000), progress=False)
    q = summary.quarantined
    assert q.pop("truncated_input") == 1 and q.pop("malformed_json") in (1, 2)
    assert q == {"missing_field": 1, "wrong_type": 1, "invalid_utf8": 1,
                 "record_too_large": 1, "unreadable_file": 1}
    texts = [t for _, t in decoded(str(out))]
    assert texts[:100] == good[:100] and len(texts) > 150
    assert texts[100:] == good[100:len(texts)]  # what the broken gzip held, up to the break
    m = read_manifest(str(out))
    records = []
    for q_obj in m.quarantine:
        data = (out / q_obj.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == q_obj.sha256
        records += [json.loads(line) for line in data.decode().splitlines()]
    by_reason = {r["reason"]: r for r in records}
    assert by_reason["missing_field"]["source"] == "a.jsonl:12"
    assert by_reason["invalid_utf8"]["raw"] == '{"body": "\\xff"}'
    assert by_reason["record_too_large"]["file"].endswith("a.jsonl")
    assert by_reason["unreadable_file"]["source"].startswith("c.jsonl.gz")


def test_near_dup_flag_removes_near_duplicates(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Across partitions (one per file), verified on the sketches phase 1 kept; a run
    stopped after phase 1 is resumed, and a partition whose sketches were torn is redone."""
    import pipeline.driver.job
    from pipeline.tasks import work

    base = " ".join(f"w{i}" for i in range(300))
    docs = [base, " ".join(f"v{i}" for i in range(300)), base.replace("w150", "x"), base]
    for name, part in (("a", docs[:2]), ("b", docs[2:])):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in part))
    cfg = _cfg([str(tmp_path / "*.jsonl")], tmp_path / "ds", near_dup=True,
               files_per_partition=1)  # small files are packed by default

    def stopped(*args: Any, **kw: Any) -> None:
        raise RuntimeError("driver stopped after phase 1")

    with monkeypatch.context() as m:
        m.setattr(pipeline.driver.job.shuffle, "run", stopped)
        with pytest.raises(RuntimeError, match="stopped after phase 1"):
            run(cfg, progress=False)
    sketches = sorted((tmp_path / "ds" / work.WORK_DIR / "p1").glob("*.sketch.npy"))
    assert len(sketches) == 2  # one per partition
    sketches[0].write_bytes(sketches[0].read_bytes()[:-100])  # torn by a power loss
    summary = run(cfg, progress=False)
    assert summary.resumed == 1  # the intact partition reused, the torn one redone
    assert summary.dropped == {"duplicate": 1, "near_duplicate": 1}
    assert [t for _, t in decoded(str(tmp_path / "ds"))] == [docs[0], docs[1]]


def test_a_missing_tokenizer_fails_before_anything_is_touched(tiny_dataset: str,
                                                              tmp_path: Path) -> None:
    """A bad path is caught before the cluster starts and before an earlier dataset at the
    output is un-committed; a file that is not a tokenizer fails from the background load."""
    before = (Path(tiny_dataset) / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="expected 'gpt2', 'train:VOCAB' or the path"):
        run(_cfg([tiny_dataset + "/*.parquet"], Path(tiny_dataset),
                 tokenizer=str(tmp_path / "missing.json")), progress=False)
    assert (Path(tiny_dataset) / "manifest.json").read_bytes() == before
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    text = tmp_path / "in.txt"
    text.write_text("one document\n")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        run(_cfg([str(text)], tmp_path / "out", tokenizer=str(bad)), progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_input_probe_samples_from_a_bounded_spread_of_the_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's candidates: every URL of a small table, an even spread of at most
    PROBE_CANDIDATES of a big one (the job once listed every file as a string for it)."""
    from pipeline.driver import job
    from pipeline.planning.filetable import FORMAT_CODES, TableBuilder

    def table(n: int):  # noqa: ANN202
        b = TableBuilder()
        for lo in range(0, n, 500):
            urls = [f"/d/{i:07d}.txt" for i in range(lo, min(n, lo + 500))]
            b.add_page(urls, [1] * len(urls), None, [FORMAT_CODES.index("txt")] * len(urls),
                       [0] * len(urls), tags=["t"] * len(urls))
        return b.finish()

    monkeypatch.setattr(job, "PROBE_CANDIDATES", 2000)
    small = table(1000)
    assert job._probe_candidates(small) == [small.url(i) for i in range(1000)]
    big = table(2500)
    picks = job._probe_candidates(big)
    assert len(picks) == job.PROBE_CANDIDATES
    assert picks[0] == big.url(0) and picks[-1] > big.url(job.PROBE_CANDIDATES)
    assert picks == sorted(set(picks))


def test_shard_compression_lz4_and_none_hold_the_same_tokens(
        tiny_dataset: str, corpus_dir: Path, tmp_path: Path) -> None:
    """``--shard-compression``: phase 1's shards and phase 2's re-encoded ones are all in the
    codec, the manifest records it, the tokens are zstd's, and the loader and `storage verify`
    read them as they read zstd's."""
    import torch

    from loaders import build_dataloader
    from storage import ReplicaSet
    from storage.admin.scrub import verify

    def epoch(dataset: str) -> torch.Tensor:
        loader = build_dataloader(dataset, 8, 64, rank=0, world_size=1)
        loader.set_epoch(0)
        return torch.cat([b["input_ids"] for b in loader])

    want, want_epoch = rows(tiny_dataset), epoch(tiny_dataset)
    assert read_manifest(tiny_dataset).config.get("shard_compression") is None  # zstd: unsaid
    # each shard's codec is in the index, so readers decode without fetching its footer
    assert {s.codec for s in shards_of(tiny_dataset, read_manifest(tiny_dataset))} == {"ZSTD"}
    for codec, name in (("lz4", "LZ4"), ("none", "UNCOMPRESSED")):
        out = tmp_path / codec
        run(_cfg([str(corpus_dir / "*.txt")], out, row_group_tokens=8192,
                 files_per_partition=1, shard_compression=codec), progress=False)
        m = read_manifest(str(out))
        assert m.config["shard_compression"] == codec and m.stats["dropped"]["duplicate"] > 10
        for shard in shards_of(str(out), m):
            meta = pq.ParquetFile(out / shard.path).metadata
            assert {meta.row_group(i).column(j).compression for i in range(meta.num_row_groups)
                    for j in range(meta.num_columns)} == {name}, shard.path
            assert shard.codec == {"LZ4": "LZ4_RAW"}.get(name, name)
        assert rows(str(out)) == want
        assert torch.equal(epoch(str(out)), want_epoch)  # under footers made from the index
        assert verify(ReplicaSet.from_urls([str(out)])).ok


def _marker_variants(index: int, salt: int) -> list[Any]:
    """Markers a phase-2 path may hold: usable ones (with a shard, or none for a partition
    without rows) and unusable ones (another index, a misnamed shard, not a dict)."""
    from pipeline.tasks import work
    from storage import RowGroupInfo
    from storage.format.layout import shard_name

    sha = hashlib.sha256(f"{index}-{salt}".encode()).hexdigest()
    shard = ShardInfo(shard_name(index, sha), rows=salt + 1, tokens=10 * (salt + 1), bytes=50,
                      sha256=sha, row_groups=(RowGroupInfo(salt + 1, 10 * (salt + 1), 4, 50,
                                                           sha),))
    def stored(two: work.PhaseTwo) -> dict[str, Any]:
        return json.loads(json.dumps(work.marker(two)))  # as a ledger holds it

    good = stored(work.PhaseTwo(index, shard, {"exact": salt}))
    return [good, stored(work.PhaseTwo(index, None)),
            {**good, "index": index + 1}, {**good, "shard": {**good["shard"], "path": "x"}},
            {**good, "index": True}, None, [good], {}]


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(0, 3)),
                max_size=30))
def test_folding_phase_two_markers_as_they_stream_is_folding_the_last_per_path(
        entries: list[tuple[int, int, int]]) -> None:
    """A rerun folds an earlier phase 2's markers ledger by ledger (a later marker for a
    path replacing an earlier, even an unusable one): the partitions done, their duplicates
    and shards are those of folding only the last marker per path, as the whole dict did."""
    from pipeline.driver.job import _named, fold_phase_two
    from pipeline.tasks import work

    n = 5  # index 5 is outside the run: its markers never count
    pairs = [(work.done2_path("rk", i), _marker_variants(i, salt)[v]) for i, v, salt in entries]
    streamed = work.PhaseTwoResults()
    fold_phase_two(iter(pairs), "rk", n, streamed)
    last = dict(pairs)
    expected = work.PhaseTwoResults()
    for path, d in last.items():  # the fold before streaming, over the dict of every marker
        if (isinstance(d, dict) and type(d.get("index")) is int and 0 <= d["index"] < n
                and path == work.done2_path("rk", d["index"]) and _named(d.get("shard"),
                                                                         d["index"])):
            expected.add(work.PhaseTwo.from_dict(d))
    assert streamed.done == expected.done
    assert streamed.duplicates == expected.duplicates
    assert streamed.shards.totals() == expected.shards.totals()
    with streamed.shards.build_index() as got, expected.shards.build_index() as want:
        assert got.ref == want.ref and got.read_bytes() == want.read_bytes()


def test_a_rerun_reuses_only_markers_of_this_version() -> None:
    """An earlier phase-1 marker is kept as its counts when reusable; one with rows but no
    shard entry (an older version), or without sketches for a near-dup run, is redone."""
    from pipeline.cleaning import CleaningConfig
    from pipeline.driver.job import reusable_phase_one
    from pipeline.tasks import work
    from pipeline.tasks.stages import StageParams

    def params(near_dup: bool) -> StageParams:
        return StageParams(ReadOptions(), CleaningConfig(), True, near_dup, (128, 16, 5),
                           "0" * 64, 50257, 50256, 64, 1 << 18, False)

    shard = {"path": "_work/p1/k.rows.parquet", "rows": 5, "tokens": 9, "bytes": 10,
             "sha256": "ab" * 32, "row_groups": [{"rows": 5, "tokens": 9}]}
    marker = json.loads(json.dumps(work.marker(work.PhaseOne(4, "k", docs_in=6, rows=5,
                                                            tokens=9))))
    kept = reusable_phase_one({**marker, "shard": shard}, params(False))
    assert kept is not None and (kept.index, kept.rows, kept.shard, kept.key) == (4, 5, None, "")
    assert reusable_phase_one(marker, params(False)) is None  # rows, no shard entry
    assert reusable_phase_one({**marker, "rows": 0}, params(False)) is not None  # no rows
    assert reusable_phase_one({**marker, "shard": shard}, params(True)) is None  # no sketches
    assert reusable_phase_one({**marker, "shard": shard, "sketches_sha256": "cd" * 32},
                              params(True)) is not None
    assert reusable_phase_one(None, params(False)) is None
    assert reusable_phase_one([marker], params(False)) is None


def test_a_marker_this_version_cannot_read_is_redone_not_a_crash() -> None:
    """A phase-1 marker with fields this version does not know (a newer writer, a damaged
    file) counts as not done: the partition is redone rather than the rerun failing."""
    from pipeline.cleaning import CleaningConfig
    from pipeline.driver.job import reusable_phase_one
    from pipeline.tasks import work
    from pipeline.tasks.stages import StageParams

    params = StageParams(ReadOptions(), CleaningConfig(), True, False, (128, 16, 5), "0" * 64,
                         50257, 50256, 64, 1 << 18, False)
    marker = json.loads(json.dumps(work.marker(work.PhaseOne(1, "k", rows=0))))
    assert reusable_phase_one(marker, params) is not None
    assert reusable_phase_one({**marker, "from_the_future": 1}, params) is None
    assert reusable_phase_one({**marker, "quarantine": {"path": "q"}}, params) is None


def _phase_one_variants(index: int, salt: int) -> list[Any]:
    """Phase-1 markers a path may hold: reusable ones (synced or not, with counts, reasons and
    a quarantine object) and ones that are not (an older version's, unknown fields)."""
    from pipeline.tasks import work
    from storage import ObjectInfo

    shard = {"path": f"_work/p1/{index}.rows.parquet", "rows": salt + 1, "tokens": 9,
             "bytes": 10, "sha256": "ab" * 32, "row_groups": []}
    one = work.PhaseOne(index, f"k{index}", docs_in=salt + 5, rows=salt + 1, tokens=9 * salt,
                        dropped={"empty": salt} if salt else {}, changed={"nfc": 1},
                        quarantined={"bad_utf8": salt + 2} if salt % 2 else {},
                        quarantine=ObjectInfo(f"q/{index}-{salt}", 3, "cd" * 32)
                        if salt % 2 else None, durable=salt % 3 != 0)
    good = {**json.loads(json.dumps(work.marker(one))), "shard": shard}
    return [good, {**good, "shard": None}, {**good, "rows": 0, "shard": None},
            {**good, "unknown_field": 1}, {**good, "index": index + 1}, None]


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 3)),
                max_size=30))
def test_phase_one_state_keeps_what_the_last_marker_per_path_gave(
        entries: list[tuple[int, int, int]]) -> None:
    """A rerun keeps an earlier phase 1's markers by partition, in arrays, as the ledgers
    stream: each partition's counts are what the last marker for its path gives (or nothing
    where that one is not reusable, or not a marker of this partition), as the dict of every
    marker gave."""
    from pipeline.cleaning import CleaningConfig
    from pipeline.driver.job import fold_phase_one, reusable_phase_one
    from pipeline.tasks import work
    from pipeline.tasks.stages import StageParams

    params = StageParams(ReadOptions(), CleaningConfig(), True, False, (128, 16, 5), "0" * 64,
                         50257, 50256, 64, 1 << 18, False)
    keys = [f"k{i}" for i in range(4)]  # partition 4's markers name no partition of this run
    pairs = [(work.done1_path(f"k{i}"), _phase_one_variants(i, salt)[v])
             for i, v, salt in entries]
    state = fold_phase_one(iter(pairs), keys, params)
    last = dict(pairs)
    for i, k in enumerate(keys):
        d = last.get(work.done1_path(k))
        # a last marker under another partition's index (damage) makes this one redone; the
        # dict fold used it, counts and all, as that other partition's
        want = None if isinstance(d, dict) and d.get("index") != i else reusable_phase_one(
            d, params)
        got = state.get(i)
        if want is None:
            assert got is None
            continue
        assert got is not None
        for name in ("index", "docs_in", "rows", "tokens", "dropped", "changed", "quarantined",
                     "quarantine", "durable", "resumed"):
            assert getattr(got, name) == getattr(want, name), name


def test_phase_one_state_is_tens_of_bytes_a_partition() -> None:
    """10,000 partitions' counts with three reasons and a quarantine object in one partition
    of 100: well under 100 bytes a partition (a PhaseOne of the counts with its path held
    ~700, the marker's dicts ~3,000 plus ~700 a row group)."""
    import tracemalloc

    from pipeline.tasks import work
    from storage import ObjectInfo

    n = 10_000
    tracemalloc.start()
    try:
        state = work.PhaseOneState(n)
        for i in range(n):
            state.put(i, work.PhaseOne(i, "", docs_in=9, rows=8, tokens=700,
                                       dropped={"empty": 1}, changed={"nfc": 2},
                                       quarantined={"bad_utf8": 1},
                                       quarantine=ObjectInfo(f"q/{i}", 1, "ab" * 32)
                                       if i % 100 == 0 else None))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held / n < 100, held / n
    assert state.get(200).quarantine == ObjectInfo("q/200", 1, "ab" * 32)
    assert (state.get(7).dropped, state.get(7).rows) == ({"empty": 1}, 8)
