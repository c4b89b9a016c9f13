"""How bytes move: URLs and filesystems, the S3 read client, retries, hedging, replicas
(quorum writes, verified reads with failover), atomic writes, the writer lease, ``_degraded/``
markers. Imports :mod:`storage.format`, never :mod:`storage.admin`."""
