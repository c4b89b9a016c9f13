"""``python -m storage``: the admin commands (:mod:`storage.admin.cli`), ended by
:func:`storage.io.process_exit.exit_after` (``os._exit`` once the command has returned and
flushed its output: a daemon thread inside pyarrow can abort the interpreter's finalization)."""

from storage.admin.cli import main
from storage.io.process_exit import exit_after

if __name__ == "__main__":
    exit_after(main)
