"""``storage``'s public names load on first use (PEP 562): ``import storage`` imports none of
its subpackages, and every name of ``__all__`` still imports, as the object where it lives."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import storage

REPO = Path(__file__).resolve().parents[2]


def test_import_storage_loads_no_subpackage() -> None:
    code = ("import sys, storage\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('storage.'))\n"
            "assert not loaded, loaded\n"
            "from storage import ReplicaSet\n"
            "assert 'storage.admin.versions' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", storage.__all__)
def test_every_public_name_is_the_object_where_it_lives(name: str) -> None:
    value = getattr(storage, name)
    if name in storage._MODULES:
        assert value is importlib.import_module(storage._MODULES[name])
    else:
        assert value is getattr(importlib.import_module(storage._WHERE[name]), name)
    assert name in dir(storage)


def test_star_import_and_an_unknown_name() -> None:
    namespace: dict[str, object] = {}
    exec("from storage import *", namespace)
    assert set(storage.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no_such_name"):
        storage.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from storage import no_such_name", {})
