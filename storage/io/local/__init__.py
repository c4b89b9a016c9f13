"""A dataset replica on a local file system: the symlink rules every path goes through
(:mod:`~storage.io.local.paths`), the replica's reads without fsspec
(:mod:`~storage.io.local.files`) and fsspec's file system held to the same rules
(:mod:`~storage.io.local.dataset_fs`).
"""
