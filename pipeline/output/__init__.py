"""Output: the dataset's files and what reads them back for people.

Feature shards (:mod:`~pipeline.output.shards`), the driver's record of them and the row-group
index it spills to disk (:mod:`~pipeline.output.shard_table`,
:mod:`~pipeline.output.index_file`), ``pipeline export`` and ``pipeline inspect``'s signal
summary.
"""
