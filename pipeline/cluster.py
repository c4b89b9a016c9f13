"""Getting a Dask client: a LocalCluster by default, an existing scheduler by address."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from distributed import Client, LocalCluster

# Each worker runs one task at a time; the tokenizer's own thread pool must not fan out on top
# of that, or N workers x N rayon threads fight over N cores.
WORKER_ENV = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "OMP_NUM_THREADS": "1", "MALLOC_TRIM_THRESHOLD_": "65536"}


@contextlib.contextmanager
def dask_client(n_workers: int, scheduler: str | None = None,
                dashboard_address: str = "127.0.0.1:8787") -> Iterator[Client]:
    """Yield a connected client; a LocalCluster we started is closed on exit.

    The LocalCluster binds the scheduler, the workers and the dashboard to 127.0.0.1: a
    dashboard shows file names and code, so it is not for the whole network unless asked.
    """
    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address=dashboard_address,
                      worker_dashboard_address=None, env=WORKER_ENV,
                      silence_logs=logging.WARNING) as cluster, Client(cluster) as client:
        yield client
