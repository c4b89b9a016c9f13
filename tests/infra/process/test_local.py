"""One pickling rule for objects holding process-local things (locks, clients, mappings)."""

from __future__ import annotations

import pickle
import threading

from infra.process.local import ProcessLocal, none
from loaders.cache import ChunkCache
from storage.io.hedge import LatencyTracker


class _Holder(ProcessLocal):
    _process_local = {"_lock": threading.Lock, "_client": none, "_seen": dict}

    def __init__(self) -> None:
        self.value = 7
        self._lock = threading.Lock()
        self._client = object()
        self._seen = {"a": 1}


def test_copy_gets_fresh_process_local_values_and_keeps_the_rest() -> None:
    h = _Holder()
    h._lock.acquire()  # a held lock must not travel (it would deadlock the copy)
    copy = pickle.loads(pickle.dumps(h))
    assert copy.value == 7
    assert copy._lock is not h._lock and copy._lock.acquire(blocking=False)
    assert copy._client is None and copy._seen == {}
    assert h._seen == {"a": 1}  # the original is untouched


def test_real_classes_pickle_with_their_locks_held(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tracker = LatencyTracker()
    tracker.record(0.1)
    cache = ChunkCache(tmp_path)
    with tracker._lock, cache._counts:
        t2 = pickle.loads(pickle.dumps(tracker))
        c2 = pickle.loads(pickle.dumps(cache))
    assert list(t2._recent) == [0.1] and t2._lock.acquire(blocking=False)
    assert c2._counts.acquire(blocking=False) and len(c2._maps) == 0
