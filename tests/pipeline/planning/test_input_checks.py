"""Inputs are read only as what they were listed as (pipeline/planning/input_checks.py): a FIFO or a
device among the inputs, listed or matched by a glob, is quarantined as
``not_a_regular_file`` without being opened; a file whose real size differs from its listed
one is quarantined whole as ``size_mismatch``, never cut to the listed size."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.planning.discovery import discover_table
from pipeline.planning.plan import Partition
from pipeline.readers import ReadOptions, read_partition
from pipeline.records import Document, Rejected
from tests._within import within
from tests.pipeline._procs import ENV, REPO, kill_tree, pipeline_cmd

DOCS = 1410


def _jsonl(path: Path, n: int, tag: str) -> int:
    path.write_text("".join(json.dumps({"text": f"{tag} document number {i} says hello"})
                            + "\n" for i in range(n)))
    return path.stat().st_size


def _read(part: Partition, options: dict | None = None) -> list[Document | Rejected]:
    return list(read_partition(part, ReadOptions(), options))


def test_listed_size_is_the_versions_size() -> None:
    from pipeline.planning.input_checks import listed_size

    assert listed_size("10:etag1") == 10 and listed_size("10:None") == 10
    assert listed_size("None:abc") is None and listed_size("") is None


def test_a_file_listed_smaller_is_quarantined_whole_not_cut(tmp_path: Path) -> None:
    """The code before read the range [0, 10) of the listed size: 1 of 1,410 documents."""
    path = tmp_path / "a.jsonl"
    real = _jsonl(path, DOCS, "a")
    got = _read(Partition(0, str(path), "jsonl", None, 0, 10, "10:None"))
    assert [(type(r).__name__, getattr(r, "reason", "")) for r in got] == [
        ("Rejected", "size_mismatch")], got[:3]
    assert f"listed as 10 bytes, the file has {real:,}" in got[0].detail  # type: ignore
    assert got[0].file == str(path)  # type: ignore[union-attr]
    # a later piece of the same file gives nothing (the file is one reject, not one a piece)
    assert _read(Partition(1, str(path), "jsonl", None, 5, 10, "10:None")) == []
    # listed larger: quarantined too (another version than the one listed)
    got = _read(Partition(0, str(path), "jsonl", None, 0, real + 1, f"{real + 1}:None"))
    assert [getattr(r, "reason", "") for r in got] == ["size_mismatch"]
    # its real size: every document
    assert len(_read(Partition(0, str(path), "jsonl", None, 0, real, f"{real}:None"))) == DOCS


def test_whole_file_formats_are_read_whatever_their_listed_size(tmp_path: Path) -> None:
    """A compressed (or CSV, WARC) file is read to its end: its size only weighs it."""
    import gzip

    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "one"}\n{"text": "two"}\n'))
    got = _read(Partition(0, str(path), "jsonl", "gzip", 0, -1, "10:None"))
    assert [d.text for d in got] == ["one", "two"]  # type: ignore[union-attr]


def test_fifos_and_devices_are_quarantined_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO (named pipe)"), (tmp_path / "zero.jsonl",
                                                         "a character device")):
        got, _ = within(10, _read, Partition(0, str(path), "jsonl", None, 0, 100, "100:None"))
        assert [(r.reason, r.detail) for r in got] == [  # type: ignore[union-attr]
            ("not_a_regular_file", f"{kind}: not opened")]


def test_a_remote_file_not_of_its_listed_size_is_quarantined(
        s3_bucket, tmp_path: Path) -> None:  # noqa: ANN001 - loopback_s3's fixture
    """The size comes from the opened object (s3fs knows it from the open)."""
    import fsspec

    local = tmp_path / "a.jsonl"
    real = _jsonl(local, 50, "s3")
    url = f"{s3_bucket.url}/in/a.jsonl"
    fs = fsspec.filesystem("s3", **s3_bucket.storage_options)
    fs.put_file(str(local), url)
    opts = s3_bucket.storage_options
    got = _read(Partition(0, url, "jsonl", None, 0, 10, "10:etag"), opts)
    assert [getattr(r, "reason", "") for r in got] == ["size_mismatch"], got[:3]
    assert len(_read(Partition(0, url, "jsonl", None, 0, real, f"{real}:etag"), opts)) == 50


def test_a_run_quarantines_a_file_listed_too_small_and_reads_the_rest(tmp_path: Path) -> None:
    good, short = tmp_path / "good.jsonl", tmp_path / "short.jsonl"
    good_size = _jsonl(good, 40, "good")
    _jsonl(short, DOCS, "short")
    listing = tmp_path / "list.txt"
    listing.write_text(f"{good} {good_size}\n{short} 10\n")
    summary = run(PipelineConfig(inputs_from=str(listing), output=str(tmp_path / "ds"),
                                 workers=1, dashboard_address="127.0.0.1:0"), progress=False)
    assert summary.quarantined == {"size_mismatch": 1}, summary.render()
    assert summary.docs_out == 40


def test_a_run_over_fifos_and_devices_quarantines_them_and_ends(tmp_path: Path) -> None:
    """A FIFO matched by a glob (a .jsonl and a .parquet: discovery reads Parquet footers)
    and a FIFO and a device listed in --inputs-from: the code before blocked on the first
    one it opened, forever, without a word."""
    d = tmp_path / "in"
    d.mkdir()
    good_size = _jsonl(d / "good.jsonl", 30, "good")
    os.mkfifo(d / "pipe.jsonl")
    os.mkfifo(d / "pipe.parquet")
    os.mkfifo(tmp_path / "listed.txt")
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path / 'listed.txt'} 100\n{tmp_path / 'zero.jsonl'} 100\n"
                       f"{d / 'good.jsonl'} {good_size}\n")
    cmd = pipeline_cmd(str(d / "*.jsonl"), str(d / "*.parquet"), "--inputs-from",
                       str(listing), "-o", str(tmp_path / "ds"), "--workers", "1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        pytest.fail("the run blocked on a FIFO")
    assert proc.returncode == 0, err[-3000:]
    assert "quarantined  not_a_regular_file=4" in out, out
    assert "documents    34 in, 30 out" in out, out


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_discovery_never_opens_a_fifo(tmp_path: Path, fmt: str) -> None:
    os.mkfifo(tmp_path / f"p.{fmt}")
    got, took = within(10, discover_table, [str(tmp_path / f"*.{fmt}")])
    assert not isinstance(got, BaseException), got
    assert len(got) == 1 and took < 10  # type: ignore[arg-type]
