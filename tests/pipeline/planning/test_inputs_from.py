"""``--inputs-from`` (pipeline/planning/discovery.py's read_inputs_from) is read as a regular file,
a line at a time, each line bounded, each size checked: ``/dev/zero`` took the driver to
17.9 GB, a FIFO hung it without a word, a 200 MB line cost 1.75 GB, and a size of 10^26 was
a traceback. Each is now one error naming the file (and line); arbitrary bytes in a list
give the table or such an error, nothing else."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.planning.discovery import discover_table, read_inputs_from
from pipeline.records import InputError
from tests.pipeline._procs import ENV, REPO

#: the child's address space (the code before read /dev/zero until it had no memory left)
MEMORY_CAP = 3 << 30


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", *args],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout,
                         preexec_fn=_cap_memory)
    return out, time.monotonic() - start


def _one_error_line(out: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr[-2000:]
    for part in parts:
        assert part in out.stderr, (part, out.stderr)


def test_dev_zero_as_the_list_is_refused_unread(tmp_path: Path) -> None:
    out, _ = _run("--inputs-from", "/dev/zero", "-o", str(tmp_path / "ds"))
    _one_error_line(out, "--inputs-from /dev/zero: is a character device, not a regular file")


def test_a_fifo_as_the_list_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "list.txt"
    os.mkfifo(fifo)
    out, took = _run("--inputs-from", str(fifo), "-o", str(tmp_path / "ds"), timeout=60)
    _one_error_line(out, f"--inputs-from {fifo}: is a FIFO (named pipe)")


def test_a_huge_line_is_an_error_naming_it_in_bounded_memory(tmp_path: Path) -> None:
    """50 MB of one line: the code before held it (and its split) whole."""
    listing = tmp_path / "list.txt"
    with open(listing, "wb") as fh:
        fh.write(b"s3://b/a.jsonl 10\n" + b"x" * (50 << 20) + b" 10\n")
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"list.txt, line 2: longer than 65,536 bytes"):
            list(read_inputs_from(str(listing)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


@pytest.mark.parametrize("name, text, expect", [
    ("list.txt", "s3://b/a.jsonl 10\ns3://b/b.jsonl " + "1" + "0" * 26 + "\n",
     r"list.txt, line 2: size 1000+ is not a file size \(0 to 281,474,976,710,656 bytes\)"),
    ("list.csv", "url,size\ns3://b/a.jsonl,-5\n", r"list.csv, line 2: size -5 is not a file"),
    ("list.jsonl", '{"url": "s3://b/a.jsonl", "size": 1e30}\n',
     r"list.jsonl, line 1: expected URL SIZE \[VERSION\]: url must be a string and size a "
     r"whole number"),
    ("list.jsonl", '{"url": 5, "size": 10}\n', r"line 1: .*url must be a string"),
    ("list.jsonl", '{"url": "\\ud800.jsonl", "size": 10}\n', r"line 1: .*not text"),
    ("list.jsonl", "[" * 30_000 + "\n", r"line 1: expected URL SIZE .*not a JSON object"),
    ("list.txt", "s3://b/a.jsonl ten\n", r"line 1: expected URL SIZE \[VERSION\]: size 'ten'"),
    ("list.txt", "s3://b/a.jsonl 1 2 3\n", r"line 1: expected URL SIZE \[VERSION\]$"),
])
def test_bad_lines_are_errors_naming_file_and_line(tmp_path: Path, name: str, text: str,
                                                   expect: str) -> None:
    """Sizes past 2^63 were an OverflowError traceback in the table's int64 column."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match=expect):
        discover_table([], inputs_from=str(path))


def test_a_size_of_10_to_the_26_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text(f"{tmp_path / 'a.jsonl'} 1{'0' * 26}\n")
    out, _ = _run("--inputs-from", str(listing), "-o", str(tmp_path / "ds"))
    _one_error_line(out, f"--inputs-from {listing}, line 1: size 1{'0' * 26} is not a file")


def test_the_largest_listed_size_is_accepted(tmp_path: Path) -> None:
    from pipeline.planning.discovery import MAX_LISTED_SIZE

    path = tmp_path / "list.txt"
    path.write_text(f"s3://b/a.jsonl.gz {MAX_LISTED_SIZE}\n")
    assert [f.size for f in discover_table([], inputs_from=str(path))] == [MAX_LISTED_SIZE]


_PIECES = st.sampled_from([
    b"s3://b/a.jsonl", b"/x/y.txt", b"c.csv.gz", b" ", b"\t", b",", b"\n", b"\r\n", b"#",
    b"10", b"-1", b"1" + b"0" * 30, b"1e3", b"etag", b'{"url": ', b'"size": ', b"}", b'"',
    b"url,size\n", b"[", b"\xff", b"\x00", b"\\ud800", b"null", b"true", b'"version": '])
_BYTES = st.lists(st.one_of(_PIECES, st.binary(max_size=10)), max_size=30).map(b"".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=_BYTES, suffix=st.sampled_from([".txt", ".csv", ".jsonl"]))
def test_any_bytes_as_an_input_list_give_files_or_an_input_error_naming_it(
        tmp_path: Path, data: bytes, suffix: str) -> None:
    """An InputError is what ``pipeline run`` prints as one ``error:`` line with rc 2."""
    path = tmp_path / f"list{suffix}"
    path.write_bytes(data)
    try:
        table = discover_table([], inputs_from=str(path))
    except InputError as exc:
        assert str(path) in str(exc) or "unsupported input format" in str(exc), exc
        return
    assert all(0 <= f.size <= 2**48 for f in table)  # pipeline.planning.discovery.MAX_LISTED_SIZE
