"""``python -m storage``: the admin commands (:mod:`storage.admin.cli`).

The process ends with ``os._exit`` once the command has returned and its output is flushed,
not through the interpreter's finalization: a daemon thread still inside pyarrow's Parquet
code (a read-ahead or hedged read whose answer nobody waits for any more) can be unwound
through a C++ frame while Python finalizes, and libstdc++ then aborts the process
("terminate called without an active exception", SIGABRT: apache/arrow#34314). It happened
to ``storage verify`` in a CI run after it had printed its full, correct report, turning
exit code 1 into -6. Everything the commands hold (leases, files) is closed before they
return, so finalization has nothing left to do for them.
"""

import os
import sys

from storage.admin.cli import main

if __name__ == "__main__":
    try:
        rc = main()
    except SystemExit as exc:  # usage errors, --help
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc if isinstance(rc, int) else 0)
