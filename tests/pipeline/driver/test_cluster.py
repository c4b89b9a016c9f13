"""The LocalCluster the pipeline starts: what its worker processes actually get."""

from __future__ import annotations

import os

import dask
import pytest

from pipeline.driver.cluster import NANNY_WRITES, QUIET_HOUSEKEEPING, dask_client


def _worker_view() -> dict[str, object]:
    return {"config": {k: dask.config.get(k) for k in QUIET_HOUSEKEEPING},
            "rayon": os.environ.get("RAYON_NUM_THREADS"),
            "fastokens": os.environ.get("FASTOKENS_BPE_THREADS"),
            "parallel": os.environ.get("TOKENIZERS_PARALLELISM"),
            "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            "omp": os.environ.get("OMP_NUM_THREADS")}


def test_workers_get_the_quiet_housekeeping_and_tokenizer_pool_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Dask's Nanny writes its pre-spawn variables into the *parent's* os.environ, so any
    # cluster started with Dask's defaults earlier in this test process leaves
    # MALLOC_TRIM_THRESHOLD_ behind for every later child: start from a clean environment.
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    before = {k: os.environ.get(k) for k in NANNY_WRITES}
    with dask_client(2, dashboard_address="127.0.0.1:0", tokenizer_threads=1,
                     worker_ttl_s=7.5) as client:
        views = client.run(_worker_view)
        scheduler = client.run_on_scheduler(lambda: dask.config.get("distributed.admin.tick."
                                                                    "interval"))
        ttl = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.worker_ttl)
        link = client.dashboard_link
    assert ttl == 7.5  # --worker-ttl, where the scheduler reads it
    assert len(views) == 2
    for view in views.values():
        # no MALLOC_TRIM_THRESHOLD_ (Dask's nanny sets one by default: phase 1 +8 %)
        assert view == {"config": QUIET_HOUSEKEEPING, "rayon": "1", "fastokens": "1",
                        "parallel": "true",
                        "malloc_trim": None, "omp": "1"}
    assert scheduler == QUIET_HOUSEKEEPING["distributed.admin.tick.interval"]
    # the caller's own environment is left as it was (the Nanny writes into it)
    assert {k: os.environ.get(k) for k in NANNY_WRITES} == before
    assert link.startswith("http://127.0.0.1:")
    # only while the cluster runs: the caller's own configuration is left as it was
    assert dask.config.get("distributed.worker.profile.interval") != \
        QUIET_HOUSEKEEPING["distributed.worker.profile.interval"]


def _encoding_threads() -> list[str]:
    """Encode a batch with the pipeline's fast path, then name this process's native threads."""
    from pipeline.tasks import tokenizing

    spec = tokenizing.gpt2()
    assert tokenizing.engine(spec.json) == "fastokens"
    text = "It is a truth universally acknowledged, that a single man in possession. " * 40
    tokenizing.encode_flat(spec.json, spec.eos_id, [f"{i} {text}" for i in range(2000)])
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as fh:
            names.append(fh.read().strip())
    return names


def test_fast_encoder_adds_no_thread_to_a_one_thread_worker() -> None:
    """``workers x tokenizer_threads <= cores`` holds for ``fastokens`` too: left alone it starts
    a helper thread per core, which on a busy machine takes a core from another worker."""
    with dask_client(1, dashboard_address="127.0.0.1:0", tokenizer_threads=1) as client:
        (names,) = client.run(_encoding_threads).values()
    assert not [n for n in names if n.startswith("fastokens")], names
