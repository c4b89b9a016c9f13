"""Lineage: where each document of a dataset came from and why a record is not in it.

A run keeps what answering that needs, and nothing it would not: every kept document's source
(the doc id itself where the id *is* ``file:line`` / ``file@offset`` / ``file#row``, else a
``source`` column), the manifest's ``lineage`` (the steps with their versions, options and
``config_sha256``, the tokenizer, the inputs' listing hash, the code version:
:mod:`pipeline.lineage.provenance`), and per partition a small record of the documents it left
out (:mod:`pipeline.lineage.records`). ``python -m pipeline trace`` reads them
(:mod:`pipeline.lineage.trace`).
"""
