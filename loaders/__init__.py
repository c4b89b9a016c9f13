"""Streaming loaders for Shardflow datasets (imports ``storage``, never ``pipeline`` or dask)."""

from loaders.dataloader import LoaderStateError, ShardflowLoader, build_dataloader
from loaders.dataset import TokenDataset
from loaders.mixture import MixtureDataset, build_mixture_loader

__all__ = ["LoaderStateError", "MixtureDataset", "ShardflowLoader", "TokenDataset",
           "build_dataloader", "build_mixture_loader"]
