"""Ray Data doing the pipeline's work: read_json → map_batches(Shardflow's cleaning + GPT-2
tokenize, EOS after each document) → write_parquet. Ray Data has no exact dedup step, so this
peer does less work than the others (no dedup)."""

import functools
import itertools
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


@functools.cache
def _tools(tokenizer_json: str):
    from tokenizers import Tokenizer

    from pipeline.cleaning import Cleaner, CleaningConfig

    return Cleaner(CleaningConfig()), Tokenizer.from_file(tokenizer_json)


def run(files: list[str], workers: int, tokenizer_json: str, eos_id: int) -> dict:
    import ray

    out = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    t = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             object_store_memory=2 << 30, configure_logging=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False

        def clean_tokenize(batch: dict) -> dict:
            cleaner, tok = _tools(tokenizer_json)
            ids, texts = [], []
            for doc_id, text in zip(batch["id"], batch["text"], strict=True):
                cleaned = cleaner(text)
                if cleaned is not None:
                    ids.append(doc_id)
                    texts.append(cleaned)
            enc = [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
            lengths = np.fromiter((len(e) + 1 for e in enc), dtype=np.int32, count=len(enc))
            flat = np.fromiter(itertools.chain.from_iterable([*e, eos_id] for e in enc),
                               dtype=np.uint16, count=int(lengths.sum()))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return pa.table({"id": pa.array(ids, pa.string()),
                             "input_ids": pa.ListArray.from_arrays(offsets, flat)})

        ds = ray.data.read_json(files)
        ds = ds.map_batches(clean_tokenize, batch_format="numpy", batch_size=1024)
        ds.write_parquet(str(out))
        seconds = time.perf_counter() - t
    finally:
        ray.shutdown()
    table = pq.read_table(str(out), columns=["input_ids"])
    written = int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py())
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "tokens_written": written, "docs": table.num_rows}
