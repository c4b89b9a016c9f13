"""Make Dask workers import Shardflow's packages, whatever directory they were started in.

Every Dask server puts its local directory first on ``sys.path`` (for ``upload_file``), and a
worker's local directory holds its spill folder, ``storage/``. Under an editable install
(``pip install -e .``, whose import hook runs after the path search), that empty folder is
found first as a namespace package and shadows the project's ``storage``: every task then fails
to unpickle with ``cannot import name ... from 'storage'``. :class:`ImportGuard` runs on each
worker before its first task: it takes the local directory off ``sys.path`` (Shardflow uploads
no files), forgets a shadowing namespace module, and imports the packages a task needs, so a
worker that still cannot import them fails at registration with one clear error instead of
every task failing later.

This module imports nothing of ours at import time: unpickling the plugin on a worker must
not itself trip over the shadowing it is there to remove.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

#: what phase 1, phase 2 and the dedup shuffle import on a worker
TASK_MODULES = ("storage", "pipeline.tasks.stages", "pipeline.dedup.shuffle")


class WorkerImportError(ImportError):
    """A Dask worker cannot import the project's packages."""


def _is_shadow(module: Any) -> bool:
    """A namespace package (no ``__file__``) standing where a regular package belongs."""
    return module is not None and getattr(module, "__file__", None) is None


def unshadow(local_directory: str | None) -> None:
    """Remove ``local_directory`` from ``sys.path`` and drop shadowing namespace modules."""
    if local_directory:
        target = os.path.realpath(local_directory)
        sys.path[:] = [p for p in sys.path if not p or os.path.realpath(p) != target]
    for name in ("infra", "storage", "pipeline", "loaders", "trainer"):
        if _is_shadow(sys.modules.get(name)):
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
    importlib.invalidate_caches()


def check_imports(modules: tuple[str, ...] = TASK_MODULES) -> None:
    """Import ``modules``; a failure names the module, the worker's path and the likely fix."""
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise WorkerImportError(
                f"a Dask worker cannot import {name!r} ({type(exc).__name__}: {exc}); install "
                "shardflow on every worker (pip install shardflow[pipeline]) and start workers "
                f"with the same Python; worker sys.path[:3] = {sys.path[:3]}") from None
        if _is_shadow(module):
            raise WorkerImportError(
                f"a Dask worker imports {name!r} from {list(module.__path__)[:2]}, a folder "
                "that is not Shardflow's package; start the worker from another directory")


class ImportGuard(WorkerPlugin):
    """Registered by the driver on every worker (and on workers that join later)."""

    name = "shardflow-import-guard"
    idempotent = True

    def setup(self, worker: Any) -> None:
        unshadow(getattr(worker, "local_directory", None))
        check_imports()
