"""The LocalCluster the pipeline starts: what its worker processes actually get."""

from __future__ import annotations

import os

import dask

from pipeline.cluster import QUIET_HOUSEKEEPING, dask_client


def _worker_view() -> dict[str, object]:
    return {"config": {k: dask.config.get(k) for k in QUIET_HOUSEKEEPING},
            "rayon": os.environ.get("RAYON_NUM_THREADS"),
            "parallel": os.environ.get("TOKENIZERS_PARALLELISM"),
            "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            "omp": os.environ.get("OMP_NUM_THREADS")}


def test_workers_get_the_quiet_housekeeping_and_tokenizer_pool_settings() -> None:
    with dask_client(2, dashboard_address="127.0.0.1:0", tokenizer_threads=1) as client:
        views = client.run(_worker_view)
        scheduler = client.run_on_scheduler(lambda: dask.config.get("distributed.admin.tick."
                                                                    "interval"))
        link = client.dashboard_link
    assert len(views) == 2
    for view in views.values():
        # no MALLOC_TRIM_THRESHOLD_ (Dask's nanny sets one by default: phase 1 +8 %)
        assert view == {"config": QUIET_HOUSEKEEPING, "rayon": "1", "parallel": "true",
                        "malloc_trim": None, "omp": "1"}
    assert scheduler == QUIET_HOUSEKEEPING["distributed.admin.tick.interval"]
    assert link.startswith("http://127.0.0.1:")
    # only while the cluster runs: the caller's own configuration is left as it was
    assert dask.config.get("distributed.worker.profile.interval") != \
        QUIET_HOUSEKEEPING["distributed.worker.profile.interval"]
