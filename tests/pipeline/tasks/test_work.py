"""Work markers: a resumed run finds what is done; a fresh one reads nothing to learn that."""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tasks import work
from storage import ObjectInfo, ReplicaSet, RowGroupInfo, ShardInfo
from storage.format.layout import shard_name


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The markers that ``work.markers`` really reads (one GET each on an object store)."""
    read: list[str] = []
    real = work.get_json

    def get_json(store: ReplicaSet, relative: str) -> dict | None:
        read.append(relative)
        return real(store, relative)

    monkeypatch.setattr(work, "get_json", get_json)
    return read


def _check(store: ReplicaSet, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [work.done1_path(f"k{i}") for i in range(6)] + \
        [work.done2_path("run", i) for i in range(4)]
    read = _counting(monkeypatch)
    assert work.markers(store, paths) == [None] * len(paths)
    assert read == []  # a fresh run: the folders are listed, no marker is asked for

    for i in (1, 4):
        work.put_json(store, work.done1_path(f"k{i}"), {"index": i})
    work.put_json(store, work.done2_path("run", 2), {"index": 2})
    work.put_json(store, work.done1_path("other"), {"index": 99})  # not asked for
    got = work.markers(store, paths)
    assert [g and g["index"] for g in got] == [None, 1, None, None, 4, None, None, None, 2, None]
    assert sorted(read) == sorted([work.done1_path("k1"), work.done1_path("k4"),
                                   work.done2_path("run", 2)])


def test_markers_read_only_what_exists_locally(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _check(ReplicaSet.from_urls([str(tmp_path / "ds")]), monkeypatch)


def test_markers_read_only_what_exists_on_s3(s3_bucket, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    store = ReplicaSet.from_urls([f"{s3_bucket.url}/ds"],
                                 storage_options=s3_bucket.storage_options)
    _check(work.work_store(store), monkeypatch)


def test_markers_are_read_one_by_one_where_a_folder_cannot_be_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    work.put_json(store, work.done1_path("k1"), {"index": 1})
    fs = store.replicas[0].loc.fs

    def refuse(*args: object, **kwargs: object) -> dict:
        raise PermissionError("ListObjectsV2 denied")

    monkeypatch.setattr(fs, "find", refuse)
    read = _counting(monkeypatch)
    got = work.markers(store, [work.done1_path("k0"), work.done1_path("k1")])
    assert [g and g["index"] for g in got] == [None, 1]
    assert len(read) == 2


def test_a_listing_that_times_out_is_raised_not_read_around(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    fs = store.replicas[0].loc.fs

    def hang(*args: object, **kwargs: object) -> dict:
        raise TimeoutError("read timeout on ListObjectsV2")

    monkeypatch.setattr(fs, "find", hang)
    read = _counting(monkeypatch)
    with pytest.raises(TimeoutError):
        work.markers(store, [work.done1_path(f"k{i}") for i in range(100)])
    assert read == []  # not 100 reads that would each wait for the same store


def test_ledgers_replace_marker_reads(tmp_path, monkeypatch) -> None:
    """A rerun reads one ledger per batch of finished tasks plus the loose markers no ledger
    holds, not every marker; what it finds is every marker, ledgered or loose."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    ledger = work.Compactor(store, work.DONE1_DIR, batch=4)
    for i in range(10):
        one = work.PhaseOne(i, f"k{i}", rows=i)
        work.put_json(store, work.done1_path(one.key), work.marker(one))  # the task's marker
        if i < 9:  # the driver saw 9 finish, then died before its next ledger
            ledger.add(work.done1_path(one.key), one)
    assert ledger.written == 2 and len(ledger.pending) == 1
    read: list[str] = []
    real = work.get_json
    monkeypatch.setattr(work, "get_json", lambda s, p: read.append(p) or real(s, p))
    state = work.read_state(store, work.DONE1_DIR)
    assert state is not None
    assert {p: d["rows"] for p, d in state.items()} == {
        work.done1_path(f"k{i}"): i for i in range(10)}
    assert len(read) == 2 + 2  # two ledgers, the pending k8 and the unledgered k9
    assert work.read_state(store, f"{work.WORK_DIR}/nothing") == {}


def test_run_key_streams() -> None:
    keys = [f"{i:024x}" for i in range(50)]
    import hashlib
    assert work.run_key(iter(keys)) == \
        hashlib.sha256("\n".join(keys).encode()).hexdigest()[:24]


_reasons = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 5), max_size=2)


@given(st.lists(st.tuples(st.integers(0, 2**33), st.integers(0, 9), st.integers(0, 99),
                          _reasons, _reasons, st.booleans(), st.booleans()),
                min_size=1, max_size=30), st.randoms())
@settings(max_examples=100, deadline=None)
def test_phase_one_results_fold_what_the_objects_held(rows: list, rnd) -> None:  # noqa: ANN001
    """The driver's compact phase-1 results, fed in any completion order, give what a
    PhaseOne kept per partition gave: rows by partition, sums, quarantines in order."""
    from storage import ObjectInfo

    ones = [work.PhaseOne(i, f"k{i}", docs_in=d, rows=r, tokens=t, dropped=dr,
                          quarantined=q, resumed=res,
                          quarantine=ObjectInfo(f"quarantine/{i}.jsonl", 1, "0" * 64)
                          if has_q else None)
            for i, (r, d, t, dr, q, res, has_q) in enumerate(rows)]
    got = work.PhaseOneResults(len(ones))
    for one in rnd.sample(ones, len(ones)):
        got.add(one)
    assert got.rows.tolist() == [o.rows for o in ones]
    assert (got.docs_in, got.tokens, got.resumed) == (
        sum(o.docs_in for o in ones), sum(o.tokens for o in ones), sum(o.resumed for o in ones))
    dropped: Counter[str] = Counter()
    quarantined: Counter[str] = Counter()
    for o in ones:  # as build_manifest summed them (update: a 0 count stays listed)
        dropped.update(o.dropped)
        quarantined.update(o.quarantined)
    assert got.dropped == dropped
    assert got.quarantines() == tuple(o.quarantine for o in ones if o.quarantine)
    total = got.total()
    assert total.quarantined == dict(quarantined)
    assert total.quarantine == next((o.quarantine for o in ones if o.quarantine), None)


def test_load_one_reads_the_marker_or_names_it(tmp_path: Path) -> None:
    store = ReplicaSet.from_urls([str(tmp_path)])
    one = work.PhaseOne(3, "abc", docs_in=2, rows=1, tokens=7)
    work.put_json(work.work_store(store), work.done1_path("abc"), work.marker(one))
    assert work.load_one(store, "abc") == work.PhaseOne(3, "abc", docs_in=2, rows=1, tokens=7,
                                                        resumed=True)
    with pytest.raises(FileNotFoundError, match="done1/zzz.done.json"):
        work.load_one(store, "zzz")


def _shard(index: int, groups: int, salt: int = 0) -> ShardInfo:
    """A partition's shard of ``groups`` row groups, under its content-addressed name."""
    sha = hashlib.sha256(f"{index}-{salt}".encode()).hexdigest()
    rgs = tuple(RowGroupInfo(rows=4, tokens=1000 + g, offset=g * 100, length=100,
                             sha256=hashlib.sha256(f"{index}-{g}".encode()).hexdigest(),
                             blake3=hashlib.blake2s(f"{index}-{g}".encode()).hexdigest())
                for g in range(groups))
    return ShardInfo(shard_name(index, sha), rows=4 * groups, tokens=sum(g.tokens for g in rgs),
                     bytes=100 * groups, sha256=sha, row_groups=rgs)


def test_state_is_streamed_a_few_ledgers_ahead(tmp_path: Path, monkeypatch) -> None:
    """A rerun's reader of the markers holds a few ledgers, not all: reads run at most
    ``ahead`` ledgers ahead of the pair being folded; the pairs are every ledger's in order,
    then the loose markers no ledger holds; the last pair per path is what read_state keeps."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    ledger = work.Compactor(store, work.DONE1_DIR, batch=2)
    for i in range(24):
        one = work.PhaseOne(i, f"k{i:02d}", rows=i)
        work.put_json(store, work.done1_path(one.key), work.marker(one))
        if i < 22:
            ledger.add(work.done1_path(one.key), one)
    assert ledger.written == 11
    read = _counting(monkeypatch)
    stream = work.stream_state(store, work.DONE1_DIR, ahead=2)
    assert stream is not None and read == []  # nothing read before the first pair is asked
    first = next(stream)
    time.sleep(0.2)  # what the read threads would do if they were let
    assert first[0] == work.done1_path("k00") and len(read) <= 3, read
    pairs = [first, *stream]
    assert [p for p, _ in pairs] == [work.done1_path(f"k{i:02d}") for i in range(24)]
    assert len(read) == 11 + 2
    assert work.read_state(store, work.DONE1_DIR) == dict(pairs)


def test_phase_two_ledgers_are_cut_by_row_groups(tmp_path: Path) -> None:
    """A ledger holds at most ~``row_groups`` row groups of markers: 1,024 phase-2 markers of
    1 GiB partitions made a ~230 MB ledger, held as ~700 MB of dicts until it was written."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    ledger = work.Compactor(store, work.done2_dir("run"), row_groups=2_500)
    for i in range(7):
        ledger.add(work.done2_path("run", i), work.PhaseTwo(i, _shard(i, 1_000)))
    assert ledger.written == 2 and len(ledger.pending) == 1  # flushed at 3 and at 6 markers
    ledger.flush()
    state = work.read_state(store, work.done2_dir("run"))
    assert state is not None and sorted(state) == [work.done2_path("run", i) for i in range(7)]


def test_a_rerun_keeps_phase_one_markers_as_their_counts(tmp_path: Path) -> None:
    """The driver folds phase 1's counts: the state a rerun keeps per partition has no names,
    checksums or row groups, a fraction of the marker's dicts (the markers on the store keep
    everything: a task that verifies work files reads the whole one)."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    quarantine = ObjectInfo("quarantine/part-00003-ab.jsonl", 10, "ab" * 32)
    for i in range(200):
        one = work.PhaseOne(i, f"k{i}", docs_in=13, rows=12, tokens=3_000,
                            dropped={"empty": 1}, quarantined={"bad_utf8": 1},
                            quarantine=quarantine if i == 3 else None, shard=_shard(i, 8),
                            keys_sha256="cd" * 32, durable=i % 2 == 0)
        work.put_json(store, work.done1_path(f"k{i}"), work.marker(one))
    tracemalloc.start()
    try:
        stream = work.stream_state(store, work.DONE1_DIR)
        assert stream is not None
        kept = {path: work.counts_only(d) for path, d in stream}
        slim = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    tracemalloc.start()
    try:
        whole = work.read_state(store, work.DONE1_DIR)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept is not None and whole is not None
    k3 = kept[work.done1_path("k3")]
    assert (k3.index, k3.docs_in, k3.rows, k3.tokens, k3.durable, k3.resumed) == (
        3, 13, 12, 3_000, False, True)
    assert (k3.dropped, k3.quarantined, k3.quarantine) == ({"empty": 1}, {"bad_utf8": 1},
                                                           quarantine)
    assert (k3.shard, k3.key, k3.keys_sha256) == (None, "", "")
    ones, again = work.PhaseOneResults(200), work.PhaseOneResults(200)
    for path in sorted(kept):
        ones.add(kept[path])
        again.add(work.PhaseOne.from_dict(whole[path]))
    assert ones.total() == again.total() and (ones.rows == again.rows).all()
    assert slim * 5 < held, (slim, held)
    assert work.load_one(store, "k3").shard == _shard(3, 8)


def test_a_task_reads_the_whole_marker_it_verifies_or_redoes(tmp_path: Path) -> None:
    """A partition whose unsynced work files are verified on a rerun has its whole marker read
    by its task (row groups and checksums: the driver kept counts only); one that is gone, an
    older version's (rows but no shard entry) or unreadable to this version is redone."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    one = work.PhaseOne(2, "k2", rows=5, shard=_shard(2, 4), keys_sha256="cd" * 32,
                        durable=False)
    work.put_json(store, work.done1_path("k2"), work.marker(one))
    got = work.load_reusable(store, "k2")
    assert got is not None and got.shard == one.shard and got.keys_sha256 == one.keys_sha256
    assert work.load_reusable(store, "gone") is None
    older = {**work.marker(one), "shard": None}
    work.put_json(store, work.done1_path("k3"), older)
    assert work.load_reusable(store, "k3") is None
    work.put_json(store, work.done1_path("k4"), {**work.marker(one), "from_the_future": 1})
    assert work.load_reusable(store, "k4") is None
    work.put_json(store, work.done1_path("k5"), {**older, "rows": 0})
    assert work.load_reusable(store, "k5") is not None  # no rows, no shard: reusable


def test_folding_an_earlier_runs_phase_two_holds_a_ledger_at_a_time(tmp_path: Path) -> None:
    """Folding phase 2's ledgers as they are read peaks at a few ledgers' dicts; the dict of
    every marker (what a rerun built before) holds all of them: ~700 bytes a row group, ~70 GB
    at 100 TB."""
    from pipeline.driver.job import fold_phase_two

    store = ReplicaSet.from_urls([str(tmp_path)])
    n, groups = 40, 2_000
    ledger = work.Compactor(store, work.done2_dir("run"), row_groups=2 * groups)
    for i in range(n):
        ledger.add(work.done2_path("run", i), work.PhaseTwo(i, _shard(i, groups)))
    ledger.flush()

    def peak(fold) -> tuple[int, work.PhaseTwoResults]:  # noqa: ANN001
        twos = work.PhaseTwoResults()
        tracemalloc.start()
        try:
            fold(twos)
            return tracemalloc.get_traced_memory()[1], twos
        finally:
            tracemalloc.stop()

    streamed, twos = peak(lambda t: fold_phase_two(
        work.stream_state(store, work.done2_dir("run"), ahead=2), "run", n, t))
    whole, twos_whole = peak(lambda t: fold_phase_two(
        work.read_state(store, work.done2_dir("run")).items(), "run", n, t))
    assert len(twos) == n and twos.shards.totals() == twos_whole.shards.totals()
    assert twos.shards.totals().row_groups == n * groups
    assert streamed * 3 < whole, (streamed, whole)  # measured 11.6 vs 49.8 MB


def test_a_damaged_ledger_is_read_around(tmp_path: Path) -> None:
    """A ledger that is not a dict of markers (torn by a crash, overwritten) costs reads, not
    the rerun: its markers are read loose, as if it had never been written."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    ledger = work.Compactor(store, work.DONE1_DIR, batch=3)
    for i in range(6):
        one = work.PhaseOne(i, f"k{i}", rows=i)
        work.put_json(store, work.done1_path(one.key), work.marker(one))
        ledger.add(work.done1_path(one.key), one)
    assert ledger.written == 2
    names = sorted(p.name for p in (tmp_path / work.DONE1_DIR).iterdir()
                   if p.name.startswith(work.LEDGER_PREFIX))
    (tmp_path / work.DONE1_DIR / names[0]).write_text("[1, 2, 3]")
    (tmp_path / work.DONE1_DIR / names[1]).write_text('{"torn": ')
    state = work.read_state(store, work.DONE1_DIR)
    assert state is not None
    assert {p: d["rows"] for p, d in state.items()} == {
        work.done1_path(f"k{i}"): i for i in range(6)}
