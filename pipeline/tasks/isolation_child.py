"""The isolation process (:mod:`pipeline.tasks.isolation`): runs one record's steps at a time for
the worker that started it, under the CPU guard, and answers over a pipe.

``python -m pipeline.tasks.isolation_child READ_FD WRITE_FD``. The first message is the steps'
configuration; then each ``("doc", Document)`` is answered with
``("ok", text, metadata columns, dropped, changed, reports, drop)`` (the counts this record
added; the steps' reports so far when this record changed them, else ``None``; the
``(step, reason)`` that dropped it, for the lineage's drop record, else ``None``),
``("poisoned", reason, detail)`` for a page the complexity check refuses, or
``("error", message)`` for an exception in the steps. Past the CPU limit the kernel ends the
process (``SIGPROF``); the worker sees the pipe close and names the record. It exits when
its input ends. Core dumps are off: a record that crashes this process is expected here.
"""

from __future__ import annotations

import resource
import signal
import sys
import traceback
from collections import Counter
from typing import Any

from pipeline.tasks.isolation import receive, send
from pipeline.tasks.record_steps import Poisoned, RecordSteps


def _answer(steps: RecordSteps, doc: Any, sent: list[Any]) -> tuple[Any, ...]:
    """One record's reply; ``sent`` holds the reports last sent (a report travels only when
    a record changed it: most records change none)."""
    before_dropped, before_changed = Counter(steps.dropped), Counter(steps.changed)
    try:
        text = steps(doc)
    except Poisoned as bad:
        return ("poisoned", bad.reason, bad.detail)
    finally:
        steps.idle()
    columns = steps.last if text is not None else None
    dropped: Counter[str] = steps.dropped - before_dropped
    changed: Counter[str] = steps.changed - before_changed
    reports = steps.reports()
    fresh = None
    if reports != sent[0]:
        fresh = sent[0] = reports
    drop = steps.last_drop if text is None else None
    return ("ok", text, columns, dict(dropped), dict(changed), fresh, drop)


def _error(exc: Exception) -> tuple[str, str, str]:
    first = (str(exc).strip().splitlines() or [""])[0]
    return ("error", f"{type(exc).__name__}: {first}"[:500], traceback.format_exc()[-4000:])


def main(argv: list[str]) -> int:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # an ignored signal outlives exec
    requests, replies = int(argv[0]), int(argv[1])
    kind, init = receive(requests)
    assert kind == "init", kind
    steps: RecordSteps | None = None
    failed: tuple[str, str, str] | None = None
    sent: list[Any] = [{}]
    try:  # a failure here (an unreadable block-list) is the answer to every message
        steps = RecordSteps(init["recipe"], init["storage_options"],
                            cpu_s=init["cpu_s"])
    except Exception as exc:
        failed = _error(exc)
    while True:
        try:
            message = receive(requests)
        except EOFError:
            return 0
        reply: tuple[Any, ...]
        if failed is not None or steps is None:
            reply = failed or ("error", "no steps", "")
        elif message[0] == "ready":
            reply = ("ready", steps.chain.declared)
        else:
            try:
                reply = _answer(steps, message[1], sent)
            except Exception as exc:
                reply = _error(exc)
        send(replies, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
