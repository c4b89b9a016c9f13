"""A Python process that imports torch (and whatever else a test names) once and then runs each
command in a child forked from it: ``python -m trainer ...`` or ``python -c CODE ...`` as a
fresh process would, less the ~2-3 s that every fresh process spends importing torch on these
2-core machines.

Each command still gets a process of its own: its module globals, class attributes and caches
start from the server's untouched state (the server only imports), it ends through its own
``os._exit`` or ``SystemExit``, a crash or a signal kills the child alone, and its resource
limits and peak memory (``VmHWM``) are its own. What it does not get is a fresh interpreter
start: environment variables that torch reads at import (thread counts) are the server's, so
callers start one server per environment they need.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_SERVER = r"""
import json, os, runpy, sys, traceback
for name in sys.argv[1:]:
    __import__(name)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.setpgid(0, 0)
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            sys.stdin.close()
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            argv = job["argv"]
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *argv[2:]]
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            rc = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                rc = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(rc)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkedPython:
    """``run(argv)`` is ``subprocess.run([sys.executable, *argv], capture_output=True,
    text=True)`` from a server that imported ``preload`` once (module docstring)."""

    def __init__(self, preload: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.preload = list(preload)
        self.proc: subprocess.Popen[bytes] | None = None
        #: bytes read from the server past the last answer
        self._pending = b""

    def _server(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *self.preload],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=self.env)
            self._pending = b""
        return self.proc

    def _answer(self, proc: subprocess.Popen[bytes], timeout: float) -> dict | None:
        """The server's next line, or ``None`` after ``timeout`` s. Read from the descriptor
        itself: a buffered ``readline`` can take both of a fast child's lines at once, and a
        ``select`` for the second then waits the whole timeout for bytes already read."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the server died
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def run(self, argv: Sequence[str], *, cwd: Path | str, timeout: float = 300,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One command in a forked child. A child still running after ``timeout`` s (from
        the request, the server's first import included) is killed with its process group
        and raises :class:`subprocess.TimeoutExpired`, as ``subprocess.run`` does."""
        proc = self._server()
        assert proc.stdin is not None
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            proc.stdin.write((json.dumps({
                "argv": list(argv), "cwd": str(cwd), "env": dict(self.env if env is None
                                                                 else env),
                "stdout": str(out), "stderr": str(err)}) + "\n").encode())
            proc.stdin.flush()
            started = self._answer(proc, timeout)
            if started is None:
                self.close()
                raise subprocess.TimeoutExpired(list(argv), timeout)
            ended = self._answer(proc, timeout)
            if ended is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(started["pid"], signal.SIGKILL)
                self.close()
                raise subprocess.TimeoutExpired(list(argv), timeout)
            return subprocess.CompletedProcess(
                [sys.executable, *argv], ended["rc"],
                out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self._pending = b""

