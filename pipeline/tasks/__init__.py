"""The tasks Dask runs on workers, and what they need: a record's steps, tokenizing, work files.

:mod:`~pipeline.tasks.stages` holds the task functions; a task reads its partition
(:mod:`pipeline.readers`), runs the recipe's steps (:mod:`pipeline.steps`, via
:mod:`~pipeline.tasks.record_steps`), tokenizes (:mod:`~pipeline.tasks.tokenizing`) and leaves
its rows under ``_work/`` (:mod:`~pipeline.tasks.work`); :mod:`~pipeline.tasks.isolation` reruns
a partition record by record after a lost worker.
"""
