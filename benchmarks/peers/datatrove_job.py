"""datatrove doing the pipeline's work: JsonlReader → Shardflow's cleaning → datatrove's exact
dedup (signatures, find, filter) → DocumentTokenizer (GPT-2, EOS after each document).

Exact dedup is three stages in datatrove: the reader and the cleaning run twice (for the
signatures, then for the filter), as its own examples do.
"""

import shutil
import tempfile
import time
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.exact_dedup import (
    ExactDedupConfig,
    ExactDedupFilter,
    ExactDedupSignature,
    ExactFindDedups,
)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer

from pipeline.cleaning import Cleaner, CleaningConfig


class Clean(PipelineStep):
    """Shardflow's ``Cleaner`` (the pipeline's default settings) as a datatrove step."""

    type = "✂️ - CLEAN"
    name = "shardflow cleaning"

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        cleaner = Cleaner(CleaningConfig())
        for doc in data:
            text = cleaner(doc.text)
            if text is None:
                self.stat_update("dropped")
                continue
            doc.text = text
            yield doc


def text_of(doc: Document) -> str:
    return doc.text


def run(files: list[str], workers: int, tokenizer_json: str, eos: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-dt-"))
    folder = str(Path(files[0]).parent)
    names = sorted(Path(f).name for f in files)
    glob = names[0] if len(names) == 1 else "*.jsonl"
    config = ExactDedupConfig(content_getter=text_of)
    tasks = max(1, min(workers, len(files)))

    def reader() -> JsonlReader:
        return JsonlReader(folder, glob_pattern=glob, compression=None, add_file_path=False)

    t = time.perf_counter()
    LocalPipelineExecutor(
        [reader(), Clean(), ExactDedupSignature(str(work / "sigs"), config=config)],
        tasks=tasks, workers=workers, logging_dir=str(work / "logs1")).run()
    LocalPipelineExecutor(
        [ExactFindDedups(str(work / "sigs"), str(work / "dups"), config=config)],
        tasks=1, workers=1, logging_dir=str(work / "logs2")).run()
    LocalPipelineExecutor(
        [reader(), Clean(), ExactDedupFilter(str(work / "dups"), config=config),
         DocumentTokenizer(str(work / "tokens"), tokenizer_name_or_path=tokenizer_json,
                           eos_token=eos, shuffle_documents=False)],
        tasks=tasks, workers=workers, logging_dir=str(work / "logs3")).run()
    seconds = time.perf_counter() - t
    written = sum(p.stat().st_size for p in (work / "tokens").glob("*.ds")) // 2
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": seconds, "tokens_written": written}
