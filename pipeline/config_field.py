"""How a configuration field is declared: its one default and its help, and whether it is a
flag and whether the manifest records it.

The fields live in small dataclasses next to the code they configure (the cleaning step's
flags in :mod:`pipeline.steps.cleaning`, dedup's in :mod:`pipeline.dedup.flags`, ...);
:class:`pipeline.config.PipelineConfig` composes them into the one flat set of flags,
``--config`` keys and ``SHARDFLOW_PIPELINE_*`` overrides (:mod:`infra.config`), so every flag
keeps its name wherever its field is declared.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from cyclopts import Parameter

#: a field the CLI sets from flags of its own (positional INPUTs, --output, replica flags)
NOT_A_FLAG = Parameter(parse=False)


def flag(default: Any, help: str, *, manifest: bool = True, cli: bool = True) -> Any:
    """A field with its one default and its help (which cyclopts reads from ``metadata``);
    ``manifest=False``: not recorded in the manifest (it cannot change the output bytes)."""
    meta = {"help": help, "manifest": manifest, "cli": cli}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
