"""The peers that benchmarks/pipeline_throughput.py measures against, each doing the pipeline's
work its own way. They run in their own virtual environment (``requirements.txt``; the
benchmark builds it in ``benchmarks/.peers-venv``), so their dependency trees never touch the
project's. Each imports only ``pipeline.cleaning`` (standard library only) from Shardflow.
"""
