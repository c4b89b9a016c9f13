"""``--tokenizer`` and ``--url-blocklist`` name files too: a FIFO, a device, a missing or an
oversized file is one ``error:`` line and exit code 2 before any work starts, never a hang
(the FIFO) or a worker traceback (the missing list, read first by every task before)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.user_files import UserFileError
from pipeline.web import urls

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    doc = tmp_path / "doc.txt"
    doc.write_text("To be, or not to be, that is the question.\n" * 20)
    return subprocess.run([sys.executable, "-m", "pipeline", "run", "--output",
                           str(tmp_path / "ds"), *flags, str(doc)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _one_error(out: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for part in parts:
        assert part in errors[0], (part, errors[0])


@pytest.mark.parametrize("flag", ["--tokenizer", "--url-blocklist"])
def test_a_fifo_is_refused_at_once(tmp_path: Path, flag: str) -> None:
    fifo = tmp_path / "named.pipe"
    os.mkfifo(fifo)
    _one_error(_run(tmp_path, flag, str(fifo)), flag, "is a FIFO (named pipe)")


@pytest.mark.parametrize("flag", ["--tokenizer", "--url-blocklist"])
def test_a_device_is_refused_unread(tmp_path: Path, flag: str) -> None:
    _one_error(_run(tmp_path, flag, "/dev/zero"), flag, "/dev/zero", "character device")


def test_a_missing_blocklist_is_one_error_before_any_task(tmp_path: Path) -> None:
    out = _run(tmp_path, "--url-blocklist", str(tmp_path / "gone.txt"))
    _one_error(out, "--url-blocklist", "gone.txt: no such file")
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_a_blocklist_over_the_limit_is_refused_naming_it(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    listed = tmp_path / "block.txt"
    listed.write_text("example.com\n" * 100)
    monkeypatch.setattr(urls, "BLOCKLIST_LIMIT", 1000)
    monkeypatch.setattr(urls, "_LOADED", {})
    with pytest.raises(UserFileError, match=r"block\.txt: longer than 1,000 bytes"):
        urls.load_blocklist(str(listed))
    monkeypatch.setattr(urls, "BLOCKLIST_LIMIT", 1200)
    assert urls.load_blocklist(str(listed)) == frozenset({"example.com"})
