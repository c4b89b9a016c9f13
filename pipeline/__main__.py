"""``python -m pipeline``: the pipeline's commands (:mod:`pipeline.cli`), ended by
:func:`storage.io.process_exit.exit_after` (``os._exit`` once the command has returned and
flushed its output, its Dask cluster closed: a daemon thread inside pyarrow can abort the
interpreter's finalization)."""

from pipeline.cli import main
from storage.io.process_exit import exit_after

if __name__ == "__main__":
    exit_after(main)
