"""Commands end with ``os._exit`` after flushing (infra/process/exit.py): the exit code
the interpreter would have given, output kept, and no finalization for a thread still inside
C code to be unwound through."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.process.exit import INTERRUPTED, exit_code

ROOT = Path(__file__).resolve().parents[3]


def _raise(exc: BaseException):  # noqa: ANN202
    def main() -> int:
        raise exc
    return main


@pytest.mark.parametrize(("main", "rc", "stderr"), [
    (lambda: 3, 3, ""),
    (lambda: None, 0, ""),
    (_raise(SystemExit(4)), 4, ""),
    (_raise(SystemExit(None)), 0, ""),
    (_raise(SystemExit("usage: no such flag")), 1, "usage: no such flag"),
    (_raise(KeyboardInterrupt()), INTERRUPTED, "interrupted"),
    (_raise(RuntimeError("a bug")), 1, "RuntimeError: a bug"),
])
def test_the_exit_code_is_the_interpreters(main, rc: int, stderr: str,  # noqa: ANN001
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(main) == rc
    err = capsys.readouterr().err
    assert stderr in err
    if isinstance(rc, int) and rc == 1 and "bug" in stderr:
        assert "Traceback" in err  # what a report of a bug needs


def test_output_is_flushed_and_finalization_skipped(tmp_path: Path) -> None:
    """Buffered output arrives; an atexit handler (finalization) never runs, nor does a
    daemon thread's unwinding: the process ends while the thread still works."""
    marker = tmp_path / "finalized"
    code = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from infra.process.exit import exit_after
        atexit.register(lambda: open({str(marker)!r}, "w").write("ran"))
        threading.Thread(target=lambda: time.sleep(60), daemon=True).start()
        def main():
            sys.stdout.write("report line")  # no newline: still in the buffer
            return 5
        exit_after(main)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 5, out.stderr
    assert out.stdout == "report line"
    assert not marker.exists()


@pytest.mark.parametrize("package", ["storage", "pipeline", "trainer"])
def test_every_command_ends_through_it(package: str) -> None:
    """``python -m <package>`` keeps its exit codes: --help is 0 with its text, a bad flag
    is an error exit with a message."""
    ok = subprocess.run([sys.executable, "-m", package, "--help"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "usage" in ok.stdout.lower(), ok.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", package, "--no-such-flag"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode not in (0, -6) and bad.stderr.strip(), (bad.returncode, bad.stderr)
    main = (ROOT / package / "__main__.py").read_text()
    assert "exit_after(main)" in main
