"""Command-line entry: ``python -m trainer --data URL ...`` (or ``--mixture FILE``) trains,
``python -m trainer plot RUN_DIR`` plots. Training stays the bare command (that is what
torchrun launches); ``plot`` is recognised only as the first argument."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        from trainer.plot import main as plot_main

        return plot_main(argv[1:])

    from storage import DatasetNotFoundError, ManifestError, redact
    from trainer.checkpoint.checkpointer import CheckpointError
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
    except PermissionError as exc:
        # A store that refuses the credentials (a wrong S3 secret: 403): one line per rank,
        # never the client's traceback, and never a secret (redacted from the message too).
        print(f"error: {access_denied(exc, cfg)}", file=sys.stderr)
        return 2
    return 0


def access_denied(exc: PermissionError, cfg: object) -> str:
    """The one line for a store that refused this run's credentials: the store's first
    line of reason (cut short), what to check, the options redacted; any secret value of
    the storage options that the store's message repeats is replaced by ``***``."""
    from storage import redact

    options = [getattr(cfg, "storage_options", None),
               getattr(cfg, "checkpoint_storage_options", None)]
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first.split(" <?xml", 1)[0].rstrip(" :")  # the start of the store's XML body
    reason = _without_secrets(first, options)
    if len(reason) > 300:
        reason = reason[:297] + "..."
    opts = redact(options[0])
    hint = f"; storage options: {opts}" if opts else ""
    return (f"access denied: {reason} (check the credentials: --storage-options, "
            f"--checkpoint-storage-options or the AWS_* environment variables{hint})")


def _without_secrets(text: str, options: list[object]) -> str:
    from storage.io.urls import SECRET_KEYS

    def secrets(value: object) -> list[str]:
        if not isinstance(value, dict):
            return []
        out: list[str] = []
        for key, item in value.items():
            if isinstance(item, dict):
                out += secrets(item)
            elif str(key).lower() in SECRET_KEYS and isinstance(item, str) and item:
                out.append(item)
        return out

    for secret in sorted({s for o in options for s in secrets(o)}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
