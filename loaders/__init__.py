"""Streaming loaders for Shardflow datasets (imports ``storage``, never ``pipeline`` or dask)."""

from loaders.dataloader import ShardflowLoader, build_dataloader
from loaders.dataset import TokenDataset

__all__ = ["ShardflowLoader", "TokenDataset", "build_dataloader"]
