"""A dataset kept on several stores: the set (:mod:`~storage.io.replicas.replica_set`), its
reads that fail over and hedge (:mod:`~storage.io.replicas.reads`), its quorum writes
(:mod:`~storage.io.replicas.writes`), health, leases, errors, the replica config file and the
command-line flags that name a replicated dataset (:mod:`~storage.io.replicas.flags`).

Empty on purpose: import the module you need, so that a loader reading one local replica does
not load the write path.
"""
