"""``python -m trainer``: training (what torchrun launches) and ``plot`` (:mod:`trainer.cli`),
ended by :func:`infra.process.exit.exit_after`: ``os._exit`` once the command has
returned (its checkpoint awaited, its process group destroyed) and flushed its output. A
loader's read-ahead or hedged read inside pyarrow can otherwise abort the interpreter's
finalization (SIGABRT), which torchrun counts as a failed rank."""

from infra.process.exit import exit_after
from trainer.cli import main

if __name__ == "__main__":
    exit_after(main)
