"""The driver: the process that runs a job on Dask and commits it.

:mod:`~pipeline.driver.job` is the order of events (lease, plan, phase 1, dedup shuffle,
phase 2, commit); the rest serve it: the Dask client (:mod:`~pipeline.driver.cluster`), the
bounded window of live tasks, the terminal progress bar, hung and blind workers, making workers
import Shardflow, and energy/carbon gating.
"""
