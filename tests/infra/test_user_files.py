"""Files a user names are opened as regular files and read bounded (infra/user_files.py):
a FIFO is refused at once (never opened, never waited on), a device unopened, a long file or
line refused naming the file (and line), never cut and never read whole."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from infra.user_files import (
    UserFileError,
    bounded_lines,
    not_regular,
    open_regular,
    read_file_of,
    read_regular,
    read_text,
    special_files,
)
from tests._within import within


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    path = str(tmp_path / "fifo.toml")
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_without_waiting_for_a_writer(fifo: str) -> None:
    # a stall bound: an open that waited for a writer would never return (ms here)
    got, _ = within(30, read_regular, fifo, "--config", 1 << 20)
    assert isinstance(got, UserFileError), got
    assert str(got) == f"--config {fifo}: is a FIFO (named pipe), not a regular file"


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"),
                                        ("/", "a directory")])
def test_devices_and_folders_are_refused_unopened(path: str, kind: str) -> None:
    with pytest.raises(UserFileError, match=f"^@opts {path}: is {kind}, not a regular file$"):
        read_regular(path, "@opts", 1 << 20)
    assert not_regular(path) == kind


def test_a_file_over_the_limit_is_refused_and_one_at_it_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(b"x" * 100)
    assert read_regular(str(path), "--config", 100) == b"x" * 100
    with pytest.raises(UserFileError, match=r"c.toml: longer than 99 bytes"):
        read_regular(str(path), "--config", 99)


def test_missing_unreadable_and_non_utf8_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(UserFileError, match=r"--config .*/nope: cannot read \(No such file"):
        read_text(str(tmp_path / "nope"), "--config", 10)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(UserFileError, match=r"bad.json: not UTF-8 text \(byte 7\)"):
        read_text(str(bad), "--config", 100)


def test_a_symlink_to_a_regular_file_is_that_file_and_to_a_fifo_is_refused(
        tmp_path: Path, fifo: str) -> None:
    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    assert read_text(str(tmp_path / "link.json"), "--config", 10) == "{}"
    (tmp_path / "pipe.json").symlink_to(fifo)
    got, _ = within(5, open_regular, str(tmp_path / "pipe.json"), "--config")
    assert isinstance(got, UserFileError) and "FIFO" in str(got)


def test_lines_are_bounded_and_a_long_one_names_file_and_line() -> None:
    data = b"a 1\r\nb 2\n" + b"c" * 65 + b"\nd 4"
    with pytest.raises(UserFileError, match=r"^--inputs-from list.txt, line 3: longer than 64 "):
        list(bounded_lines(io.BytesIO(data), "--inputs-from", "list.txt", limit=64))
    lines = list(bounded_lines(io.BytesIO(b"a 1\r\n" + b"b" * 63 + b"\nc"), "x", "y", limit=64))
    assert lines == [(1, "a 1"), (2, "b" * 63), (3, "c")]
    with pytest.raises(UserFileError, match=r"y, line 2: not UTF-8 text \(byte 1 of the line"):
        list(bounded_lines(io.BytesIO(b"ok\nx\xff\n"), "x", "y"))


def test_an_endless_line_costs_the_limit_not_the_stream() -> None:
    """/dev/zero has no newline: reading stops after the limit, an error, not OOM."""
    with open("/dev/zero", "rb") as fh, pytest.raises(
            UserFileError, match="line 1: longer than 65,536 bytes"):
        list(bounded_lines(fh, "--inputs-from", "/dev/zero"))


def test_special_files_finds_what_is_planted_two_levels_down(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    os.mkfifo(tmp_path / "sub" / "p")
    os.symlink("/dev/null", tmp_path / "dev")
    os.symlink(tmp_path / "a.bin", tmp_path / "ok-link")
    (tmp_path / "sub" / "deep").mkdir()
    os.mkfifo(tmp_path / "sub" / "deep" / "too-deep")
    assert special_files(str(tmp_path)) == [
        (str(tmp_path / "dev"), "a character device"),
        (str(tmp_path / "sub" / "p"), "a FIFO (named pipe)")]
    assert special_files(str(tmp_path / "missing")) == []


def test_read_file_of_bounds_local_and_fsspec_files_alike(tmp_path: Path, fifo: str) -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/t/ten.bin", b"0123456789")
    assert read_file_of(memory, "/t/ten.bin", "x", 10, local=False) == b"0123456789"
    with pytest.raises(UserFileError, match="longer than 9 bytes"):
        read_file_of(memory, "/t/ten.bin", "x", 9, local=False)
    (tmp_path / "ten.bin").write_bytes(b"0123456789")
    assert read_file_of(None, str(tmp_path / "ten.bin"), "x", 10, local=True) == b"0123456789"
    raised, _ = within(10, lambda: read_file_of(None, fifo, "x", 10, local=True))
    assert isinstance(raised, UserFileError) and "FIFO" in str(raised)
    with pytest.raises(FileNotFoundError):
        read_file_of(None, str(tmp_path / "gone"), "x", 10, local=True)
