"""The Dask job that turns raw text into a Shardflow dataset (``python -m pipeline``)."""
