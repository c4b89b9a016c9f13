"""Planning: what the inputs are and how they split into units of work.

:mod:`~pipeline.planning.discovery` lists the inputs (or :mod:`~pipeline.planning.filetable`
holds millions of them compactly), :mod:`~pipeline.planning.input_checks` reads an input only
as what it was listed as, and :mod:`~pipeline.planning.plan` — pure, property-tested — cuts them
into partitions. Nothing here starts Dask or writes the dataset.
"""
