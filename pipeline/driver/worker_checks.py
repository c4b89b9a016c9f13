"""Workers that hang, and workers that cannot read the inputs: found out, named, never silent.

**Hung workers.** A worker that dies closes its connections and Dask reschedules its tasks at
once. One that hangs (SIGSTOP, a stuck NFS read, a frozen VM) keeps its sockets open: only its
missing heartbeats tell, and Dask waits ``distributed.scheduler.worker-ttl`` (5 min by
default) before it gives up on it. The LocalCluster we start uses :data:`WORKER_TTL`
(``--worker-ttl``); the
scheduler checks every TTL, so a hung worker is dropped 20-40 s after its last heartbeat (with
a nanny, the nanny kills and restarts the process; its tasks run elsewhere either way). A
nanny does not heartbeat for its worker: stopping only the worker process is noticed the same
way. On an external cluster start the scheduler with ``DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL
=20s`` (or that key in its Dask config); :func:`watch` prints a warning when it is longer than
:data:`MAX_TTL_S`. :func:`watch` also prints one line naming each worker the scheduler gives
up on, from the scheduler's own events (no plugin to install on the scheduler).

**Unreadable inputs.** A path on the driver's local disk is not on the workers' (nor, on a
real cluster, on any other machine). A worker that cannot open an input quarantines it as
``unreadable_file``, which is right for one damaged file and wrong for inputs no worker can
see: the run used to commit an empty dataset with exit 0. :func:`probe_inputs` has every
worker open a bounded sample of the inputs before anything is written and stops the run with
one line naming the input and the worker; :func:`check_not_all_unreadable` is the net before
the commit, for workers that joined after the probe.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import random
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from distributed import Client

from infra.user_files import not_regular
from pipeline.records import InputError
from storage import display_url, resolve

#: how long the scheduler of a LocalCluster we start waits for a silent worker's heartbeat
#: (Dask's default is 5 min; ``pipeline run --worker-ttl``); it checks every TTL, so a hung
#: worker goes within 2 x TTL
WORKER_TTL_S = 20.0
WORKER_TTL = f"{WORKER_TTL_S:g}s"
#: an external scheduler whose worker-ttl is longer (or off) gets a warning line
MAX_TTL_S = 60.0
#: the probe opens the first file of at most this many input folders ...
PROBE_FOLDERS = 32
#: ... and this many other inputs picked at random (seeded: the same inputs, the same sample)
PROBE_RANDOM = 4
#: a probe that has not answered by then (a hung worker, a hung store) is given up with a
#: warning: it cannot tell, and the net before the commit remains
PROBE_TIMEOUT_S = 120.0


class UnreadableInputError(InputError):
    """A worker cannot open an input the driver listed."""


def _say(log: TextIO, line: str) -> None:
    print(line, file=log, flush=True)


class _Watcher:
    """Turns the scheduler's events into one warning line per worker it gives up on."""

    def __init__(self, log: TextIO) -> None:
        self.log = log
        self.named: set[str] = set()
        self.lock = threading.Lock()

    def _once(self, worker: str, line: str) -> None:
        with self.lock:
            if worker in self.named:
                return
            self.named.add(worker)
        _say(self.log, line)

    def on_scheduler(self, event: tuple[float, Any]) -> None:
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if not isinstance(msg, dict) or msg.get("action") != "worker-ttl-timed-out":
            return
        ttl = float(msg.get("ttl") or 0)
        for worker in msg.get("workers") or ():
            self._once(str(worker), f"shardflow: warning: worker {worker} sent no heartbeat for "
                       f"{ttl:.0f} s (hung?): the scheduler drops it and its tasks run "
                       "elsewhere")

    def on_all(self, event: tuple[float, Any]) -> None:
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if not isinstance(msg, dict) or msg.get("action") != "remove-worker" \
                or msg.get("expected"):
            return
        running = len(msg.get("processing-tasks") or ())
        if running:
            worker = str(msg.get("worker"))
            self._once(worker, f"shardflow: warning: lost worker {worker} while it ran "
                       f"{running} task(s): they run elsewhere")


def scheduler_ttl(client: Client) -> float | None:
    """The scheduler's worker-ttl in seconds (``None``: off, or it cannot be asked)."""
    try:
        return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.worker_ttl)
    except Exception:
        return None


@contextlib.contextmanager
def watch(client: Client, log: TextIO, external: bool) -> Iterator[None]:
    """While in the block, print a line for each worker the scheduler drops for silence or
    loses mid-task; on an external cluster, also one if its scheduler waits longer than
    :data:`MAX_TTL_S`. The topics are left before the client closes: the scheduler would
    otherwise send this client the news of its own departure over the closed connection and
    log a traceback."""
    watcher = _Watcher(log)
    client.subscribe_topic("scheduler", watcher.on_scheduler)
    client.subscribe_topic("all", watcher.on_all)
    if external:
        ttl = scheduler_ttl(client)
        if ttl is None or ttl > MAX_TTL_S:
            shown = "off" if ttl is None else f"{ttl:.0f} s"
            _say(log, f"shardflow: warning: the scheduler's worker-ttl is {shown}: a hung worker "
                 "stalls the run that long; start it with "
                 "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL=20s")
    try:
        yield
    finally:
        for topic in ("scheduler", "all"):
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(topic)


def probe_sample(urls: Sequence[str], folders: int = PROBE_FOLDERS,
                 extra: int = PROBE_RANDOM) -> list[str]:
    """The inputs a worker opens before the run: the first of each folder (at most
    ``folders`` folders) and ``extra`` others at random, seeded by the inputs themselves."""
    picked: dict[str, None] = {}
    seen: set[str] = set()
    for url in urls:
        folder = posixpath.dirname(url)
        if folder not in seen and len(seen) < folders:
            seen.add(folder)
            picked[url] = None
    rest = [u for u in urls if u not in picked]
    rng = random.Random(json.dumps([len(urls), urls[:1], urls[-1:]]))
    for url in rng.sample(rest, min(extra, len(rest))):
        picked[url] = None
    return list(picked)


def can_read(urls: list[str], options: Any) -> tuple[str, str, str] | None:
    """Runs on a worker: open each input and read a byte. ``(url, host, error)`` of the first
    that fails, ``None`` when all open. ``options`` is a ``HiddenOptions`` (no repr)."""
    for url in urls:
        try:
            loc = resolve(url, options.value)
            if loc.is_local and not_regular(loc.root):
                continue  # a FIFO or device: never opened, its partition quarantines it
            with loc.fs.open(loc.root, "rb") as fh:
                fh.read(1)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            return url, socket.gethostname(), f"{type(exc).__name__}: {first}"[:300]
    return None


def probe_inputs(client: Client, urls: Sequence[str],
                 storage_options: dict[str, Any] | None, log: TextIO | None = None,
                 timeout_s: float = PROBE_TIMEOUT_S) -> int:
    """Every worker opens :func:`probe_sample` of the inputs; the first that cannot stops the
    run (:class:`UnreadableInputError`, one line naming input and worker). Returns the number
    of inputs probed. A worker that leaves meanwhile is not an error (it runs nothing)."""
    from pipeline.tasks.stages import HiddenOptions

    sample = probe_sample(list(urls))
    if not sample:
        return 0
    try:  # callback_timeout bounds the wait (Client.sync's, not passed to can_read)
        answers = client.run(can_read, sample, HiddenOptions(storage_options),
                             on_error="return", callback_timeout=timeout_s)
    except TimeoutError:
        if log is not None:
            _say(log, f"shardflow: warning: the workers did not finish opening {len(sample)} "
                 f"inputs within {timeout_s:.0f} s; going on without the probe's answer")
        return 0
    for worker in sorted(answers):
        found = answers[worker]
        if isinstance(found, tuple) and len(found) == 3:
            url, host, error = found
            raise UnreadableInputError(
                f"{display_url(url)}: worker {worker} (host {host}) cannot read this input "
                f"({error}); every worker must reach every input: a path on the driver's own "
                "disk is not on the workers', use shared or object storage")
    return len(sample)


def check_not_all_unreadable(ones: Sequence[Any], store: Any = None) -> None:
    """Before the commit: a run whose every input document was an ``unreadable_file`` reject
    read nothing at all (workers that joined after the probe, or inputs gone since the
    listing): it fails instead of committing an empty dataset. ``ones``: phase-1 results;
    ``store``: where their quarantine lies, to name the first input (optional)."""
    docs_in = sum(o.docs_in for o in ones)
    unreadable = sum(o.quarantined.get("unreadable_file", 0) for o in ones)
    if docs_in == 0 or unreadable < docs_in:
        return
    where = ""
    if store is not None:
        try:
            obj = next(o.quarantine for o in ones if o.quarantine)
            first = json.loads(store.get(obj.path, sha256=obj.sha256).splitlines()[0])
            where = f"{first.get('file') or first.get('source')}: {first.get('detail')}; "
        except Exception:
            where = ""
    raise UnreadableInputError(
        f"{where}none of the {unreadable} input files could be read by the workers: nothing "
        "was committed (every worker must reach every input: use shared or object storage)")
