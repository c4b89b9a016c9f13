"""How Shardflow's commands end: ``os._exit`` once the command has returned and its output is
flushed, not the interpreter's finalization.

A daemon thread still inside pyarrow's Parquet code (a loader's read-ahead or a hedged read
whose answer nobody waits for any more) can be unwound through a C++ frame while Python
finalizes, and libstdc++ then aborts the process ("terminate called without an active
exception", SIGABRT: apache/arrow#34314). It happened to ``storage verify`` in a CI run after
it had printed its full, correct report, turning exit code 1 into -6; a training rank that
aborts so after its last step is a failed rank to ``torchrun`` (and an elastic restart).
Every command closes what it holds (leases, files, its Dask cluster, the process group, a
pending checkpoint) before it returns, so finalization has nothing left to do for it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

#: the exit code of a command stopped by Ctrl-C (as a shell reports a SIGINT)
INTERRUPTED = 130


def exit_code(main: Callable[[], int | None]) -> int:
    """``main()``'s exit code, as the interpreter would have made it: its return value,
    ``SystemExit``'s code (a message is printed, and is 1), a traceback and 1 for an
    uncaught exception, 130 for Ctrl-C."""
    try:
        rc = main()
    except SystemExit as exc:  # usage errors, --help, sys.exit(...)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except BaseException:  # noqa: BLE001  (a bug: its traceback is what a report needs)
        traceback.print_exc()
        return 1
    return rc if isinstance(rc, int) else 0


def exit_after(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` (a command's entry), flush, and end the process with its
    :func:`exit_code`, skipping finalization (module docstring)."""
    rc = exit_code(main)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(rc)
