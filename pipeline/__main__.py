"""``python -m pipeline``: the pipeline's commands (:mod:`pipeline.cli`), ended by
:func:`infra.process.exit.exit_after` (``os._exit`` once the command has returned and
flushed its output, its Dask cluster closed: a daemon thread inside pyarrow can abort the
interpreter's finalization)."""

from infra.process.exit import exit_after
from pipeline.cli import main

if __name__ == "__main__":
    exit_after(main)
