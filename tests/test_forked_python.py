"""The fork server the trainer tests run their child processes from answers as
``subprocess.run`` would: output, exit codes, crashes, timeouts, and a fresh state per child."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._forked_python import ForkedPython


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedPython]:
    server = ForkedPython(["json"])
    yield server
    server.close()


def test_output_and_exit_codes_are_the_childs(forked: ForkedPython, tmp_path: Path) -> None:
    out = forked.run(["-c", "import sys; print('out', sys.argv[1:]); "
                      "print('err', file=sys.stderr); sys.exit(3)", "a", "b"], cwd=tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (3, "out ['a', 'b']\n", "err\n")
    raised = forked.run(["-c", "raise ValueError('boom')"], cwd=tmp_path)
    assert raised.returncode == 1 and "ValueError: boom" in raised.stderr
    message = forked.run(["-c", "raise SystemExit('one line')"], cwd=tmp_path)
    assert (message.returncode, message.stderr) == (1, "one line\n")


def test_a_module_runs_as_main_in_the_given_directory(forked: ForkedPython,
                                                      tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text(
        "import os, sys\nif __name__ == '__main__':\n    print(os.getcwd(), sys.argv[1:])\n")
    out = forked.run(["-m", "hello", "x"], cwd=tmp_path,
                     env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{tmp_path} ['x']\n"


def test_a_crash_is_the_childs_alone_and_state_does_not_leak(forked: ForkedPython,
                                                             tmp_path: Path) -> None:
    crashed = forked.run(["-c", "import json, os, signal; json.dumps = None; "
                          "os.kill(os.getpid(), signal.SIGSEGV)"], cwd=tmp_path)
    assert crashed.returncode == -11
    clean = forked.run(["-c", "import json; print(json.dumps([1]))"], cwd=tmp_path)
    assert (clean.returncode, clean.stdout) == (0, "[1]\n")


def test_a_hung_child_times_out_and_the_next_command_still_runs(forked: ForkedPython,
                                                                tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run(["-c", "import time; time.sleep(60)"], cwd=tmp_path, timeout=1)
    out = forked.run(["-c", "import sys; print(sys.executable)"], cwd=tmp_path)
    assert out.stdout.strip() == sys.executable
