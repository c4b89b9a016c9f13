"""One pickling rule for objects that travel to other processes (DataLoader workers, Dask
tasks) while holding things that belong to the process that made them.

A lock, an open file or mapping, a network client or a per-process cache means nothing in
another process (a held lock would even deadlock it; a forked client shares a socket). Such
objects list those attributes once, with how to make a fresh one, and inherit
``__getstate__``/``__setstate__`` from :class:`ProcessLocal` instead of each copying its
``__dict__`` by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


def none() -> None:
    """The factory of an attribute that is rebuilt lazily, on first use, in the new process."""
    return None


class ProcessLocal:
    """Mixin: attributes named in ``_process_local`` are not pickled; the unpickled copy gets
    a fresh value from each one's factory (a new lock, an empty cache, ``None`` for "build it
    when first needed")."""

    #: attribute name -> factory of the value a copy in another process starts with
    _process_local: ClassVar[dict[str, Callable[[], Any]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._process_local:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name, make in self._process_local.items():
            setattr(self, name, make())
