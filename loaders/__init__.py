"""Streaming loaders for Shardflow datasets (imports ``storage``, never ``pipeline`` or dask)."""

from loaders.dataloader import LoaderStateError, ShardflowLoader, build_dataloader
from loaders.dataset import TokenDataset
from loaders.mixture import MixtureSource, build_mixture_loader
from loaders.mixture_schedule import Schedule
from loaders.plan import Layout, PlanParams, Progress
from loaders.settings import LoaderSettings, ReadSettings
from loaders.source import DatasetSource, Source

__all__ = ["DatasetSource", "Layout", "LoaderSettings", "LoaderStateError", "MixtureSource",
           "PlanParams", "Progress", "ReadSettings", "Schedule", "ShardflowLoader", "Source",
           "TokenDataset", "build_dataloader", "build_mixture_loader"]
