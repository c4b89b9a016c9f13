"""Getting a Dask client: a LocalCluster by default, an existing scheduler by address.

Cores are shared, never oversubscribed: each worker runs one task at a time, and the
tokenizer's own threads in each worker (HF's rayon pool, ``fastokens``' fan-out threads) number
``tokenizer_threads``, with ``workers x tokenizer_threads <= cores`` by default. For a remote
cluster, start workers with ``--nthreads 1`` and ``RAYON_NUM_THREADS`` and
``FASTOKENS_BPE_THREADS`` set the same way, and give their nannies a Dask
config whose ``distributed.nanny.pre-spawn-environ`` lacks ``MALLOC_TRIM_THRESHOLD_``
(:data:`NANNY_PRE_SPAWN_ENVIRON` says why); give the scheduler a worker-ttl of 20 s
(``DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL=20s``, :data:`LIVENESS`), or a hung worker stalls
the run for Dask's default 5 min.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Collection, Iterator

import dask
from distributed import Client, LocalCluster, Nanny
from distributed.deploy.adaptive import Adaptive

from pipeline.driver.worker_checks import WORKER_TTL, WORKER_TTL_S
from pipeline.driver.worker_setup import ImportGuard


def worker_env(tokenizer_threads: int) -> dict[str, str]:
    """A worker's environment: its tokenizer's threads sized, other pools at one thread.

    ``FASTOKENS_BPE_THREADS`` counts the calling thread: at 1, ``fastokens`` encodes on the
    task's thread alone. Unset, it adds a helper thread per core it sees, so two one-thread
    workers on two cores ran four encoding threads, each helper taking a core from the other
    worker (phase 1 of two workers 4 % slower than with it set, 15 partitions each, three
    rounds; a single worker got ~6 % of a second core for free).

    Parallelism stays on even for one thread: the tokenizer's serial path
    (``TOKENIZERS_PARALLELISM=false``) took ~8 % more CPU per token than a one-thread rayon
    pool, same ids (benchmarks/worker_overhead.py).
    No ``MALLOC_TRIM_THRESHOLD_`` (set here before): it pins glibc's mmap threshold at 128 KiB,
    so every large buffer is a fresh mmap, and the memory bound holds without it
    (tests/pipeline/test_memory.py). Dask's nanny sets it too, unless told otherwise: see
    :data:`NANNY_PRE_SPAWN_ENVIRON`.
    """
    threads = str(tokenizer_threads)
    return {"RAYON_NUM_THREADS": threads, "RAYON_RS_NUM_CPUS": threads,
            "FASTOKENS_BPE_THREADS": threads, "TOKENIZERS_PARALLELISM": "true",
            "OMP_NUM_THREADS": "1"}


#: the default, one tokenizer thread per worker (kept for callers of the skeleton's name)
WORKER_ENV = worker_env(1)

#: What Dask's nanny puts in a worker's environment before Python starts: Dask's default less
#: ``MALLOC_TRIM_THRESHOLD_=65536``. That setting turns off glibc's adaptive mmap threshold, so
#: each parsed batch's large buffers are fresh mappings, page-faulted and zeroed by the kernel
#: every time: phase 1 took 8 % longer on a worker with it than without (24 partitions of
#: real text, medians of 4, 6.07 vs 5.63 s; the same tasks in a plain process 5.50 s), and
#: more when two workers fault pages at once.
NANNY_PRE_SPAWN_ENVIRON = {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1,
                           "OPENBLAS_NUM_THREADS": 1}

#: Dask's housekeeping, slowed for a cluster whose every core tokenizes. At the defaults a
#: worker's own threads (a 10 ms stack sampler, a 20 ms event-loop watchdog, 100-500 ms
#: monitors) took 6.2 % more CPU beside a tokenizing task; at these, 1.1 %
#: (benchmarks/worker_overhead.py). The dashboard keeps every page: profiles come from
#: 10 samples/s, monitors refresh every second.
QUIET_HOUSEKEEPING = {
    "distributed.worker.profile.interval": "100ms",
    "distributed.admin.tick.interval": "500ms",
    "distributed.admin.system-monitor.interval": "1s",
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.nanny.pre-spawn-environ": NANNY_PRE_SPAWN_ENVIRON,
}

#: A hung worker (SIGSTOP, a stuck read) keeps its sockets open: its scheduler drops it after
#: this long without a heartbeat instead of Dask's 5 min (see :mod:`pipeline.driver.worker_checks`).
LIVENESS_KEY = "distributed.scheduler.worker-ttl"
LIVENESS = {LIVENESS_KEY: WORKER_TTL}

#: How long a worker that its scheduler still knows gets to close at the end of a run, before
#: its nanny kills it: Dask's nanny allows 4 s (of a 5 s timeout), which a loaded 2-core machine
#: overran ("Worker process still alive after 4.0 seconds, killing"); its nanny then waits as
#: long again for the killed process. A worker the scheduler already dropped (hung, stopped)
#: gets :data:`DROPPED_WORKER_CLOSE_S`: it answers nothing, so a long wait only delays the exit.
WORKER_CLOSE_S = 30.0
DROPPED_WORKER_CLOSE_S = 1.0
#: the client's and the scheduler's own close, each
CLOSE_S = 30.0


#: what a Nanny writes into its *parent's* ``os.environ`` before it spawns a worker (the
#: pre-spawn variables, and PYTHONHASHSEED when unset); :func:`_environ_kept` puts them back
NANNY_WRITES = (*NANNY_PRE_SPAWN_ENVIRON, "MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED")


@contextlib.contextmanager
def _environ_kept(names: tuple[str, ...]) -> Iterator[None]:
    """Restore ``names`` in this process's environment on exit.

    Dask's Nanny applies the pre-spawn environment with ``os.environ.update`` in the process
    that starts the cluster, so without this a ``pipeline.driver.job.run`` inside a user's program
    (a notebook, a training script) would leave ``OMP_NUM_THREADS=1`` and a fixed
    ``PYTHONHASHSEED`` in it for good, and every subprocess it started afterwards would
    inherit them."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def dask_client(n_workers: int, scheduler: str | None = None,
                dashboard_address: str = "127.0.0.1:8787", tokenizer_threads: int = 1,
                adapt: tuple[int, int] | None = None,
                worker_ttl_s: float = WORKER_TTL_S) -> Iterator[Client]:
    """Yield a connected client; a LocalCluster we started is closed on exit.

    The LocalCluster binds the scheduler, the workers and the dashboard to 127.0.0.1: a
    dashboard shows file names and code, so it is not for the whole network unless asked.
    With ``adapt=(lo, hi)`` it starts ``max(lo, 1)`` workers and lets Dask scale in between.
    ``worker_ttl_s``: how long its scheduler waits for a silent worker (:data:`LIVENESS`).
    Every worker, also one that joins later, runs :class:`ImportGuard` before its first task;
    one that cannot import Shardflow raises ``WorkerImportError`` here.
    """
    if scheduler:
        with Client(scheduler) as client:
            client.register_plugin(ImportGuard())
            yield client
        return
    logging.getLogger("distributed").setLevel(logging.WARNING)
    start = max(adapt[0], 1) if adapt else n_workers
    with _environ_kept(NANNY_WRITES), dask.config.set({**QUIET_HOUSEKEEPING, **LIVENESS,
                                                  LIVENESS_KEY: f"{worker_ttl_s:g}s"}), \
            LocalCluster(n_workers=start, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=dashboard_address,
                         worker_dashboard_address=None, env=worker_env(tokenizer_threads),
                         silence_logs=logging.WARNING) as cluster:
        client = Client(cluster)
        finished = False
        try:
            client.register_plugin(ImportGuard())  # before any task: pipeline.driver.worker_setup
            adaptive = cluster.adapt(minimum=adapt[0], maximum=adapt[1]) if adapt else None
            yield client
            finished = True
        finally:
            if finished:
                close_in_order(cluster, client, adaptive)
            else:  # a failing run: out at once, as Dask closes it (the error is what matters)
                client.close()


def close_in_order(cluster: LocalCluster, client: Client, adaptive: Adaptive | None = None,
                   worker_close_s: float = WORKER_CLOSE_S) -> None:
    """Take a LocalCluster down in order at the end of a finished run: the adaptive scaler
    stopped, the client closed, every worker closed by its nanny (each given
    ``worker_close_s`` to close by itself, one its scheduler dropped one second), the
    scheduler last.

    Dask's own close of a LocalCluster gives each worker 4 s and then kills it; on a loaded
    machine that printed warnings after a successful run, and a worker that outlived its
    scheduler logged ``Failed to communicate with scheduler during heartbeat`` with a
    ``CommClosedError`` traceback. Here no worker runs when the scheduler goes, and the exit
    of :class:`LocalCluster`'s context afterwards finds it all closed."""
    if adaptive is not None:
        adaptive.stop(reason="run finished")
    try:
        live = set(client.scheduler_info(n_workers=-1).get("workers", {}))
    except Exception:  # noqa: BLE001 - no answer: give every worker the long wait
        live = None
    client.close(timeout=CLOSE_S)
    cluster.sync(_close_workers, list(cluster.workers.values()), live, worker_close_s)
    cluster.close(timeout=CLOSE_S)


async def _close_workers(nannies: list[Nanny], live: Collection[str] | None,
                         timeout_s: float) -> None:
    async def close(nanny: Nanny) -> None:
        known = live is None or nanny.worker_address in live
        await nanny.close(timeout=timeout_s if known else DROPPED_WORKER_CLOSE_S,
                          reason="shardflow-run-finished")

    # one that would not even die (its nanny says so) must not fail a finished run: the
    # cluster's own close then does what it can
    await asyncio.gather(*(close(n) for n in nannies), return_exceptions=True)
