"""Command-line entry: ``python -m trainer --data URL ...`` trains, ``python -m trainer plot
RUN_DIR`` plots. Training stays the bare command (that is what torchrun launches); ``plot``
is recognised only as the first argument."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        from trainer.plot import main as plot_main

        return plot_main(argv[1:])

    from storage import DatasetNotFoundError, ManifestError, redact
    from trainer.checkpoint import CheckpointError
    from trainer.config import ConfigError, parse_args
    from trainer.train import run

    cfg = parse_args(argv)
    try:
        run(cfg)
    except (ConfigError, CheckpointError, DatasetNotFoundError, ManifestError) as exc:
        # Expected user errors: one line, not a traceback (per rank under torchrun).
        opts = redact(cfg.storage_options)
        hint = f" (storage options: {opts})" if opts else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    return 0
