"""Fixtures for the trainer tests.

* ``synthetic_loader``: a stand-in with the loader's interface (iterate one epoch, ``len``,
  ``set_epoch``) over a learnable token rule, so the loop can be tested in-process without
  the data stack. It lives here, never in ``trainer/``.
* ``tiny_vocab_dataset``: a real dataset made by the pipeline CLI (``python -m pipeline
  run``), with a small word-level tokenizer (vocab 28) and ~8k tokens, so that a run crosses
  several epochs in a few seconds on two CPU cores (with GPT-2's 50k vocab, the shared
  ``tiny_dataset``, the embedding and LM head dominate every step).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


class SyntheticLoader:
    """Batches of ``next = (prev * 3 + 1) % vocab`` sequences from random starts: a rule a
    tiny model learns in a few dozen steps. Deterministic in (seed, epoch, rank)."""

    def __init__(self, *, vocab_size: int = 32, batch_size: int = 4, seq_len: int = 16,
                 batches_per_epoch: int = 3, seed: int = 0, rank: int = 0,
                 delay_s: float = 0.0) -> None:
        self.vocab_size = vocab_size
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.batches_per_epoch = batches_per_epoch
        self.seed = seed
        self.rank = rank
        self.delay_s = delay_s
        self.epoch = 0
        self.epochs_set: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        import time

        g = torch.Generator().manual_seed(hash((self.seed, self.epoch, self.rank)) % 2**31)
        for _ in range(self.batches_per_epoch):
            if self.delay_s:
                time.sleep(self.delay_s)
            x = torch.empty(self.batch_size, self.seq_len + 1, dtype=torch.long)
            x[:, 0] = torch.randint(0, self.vocab_size, (self.batch_size,), generator=g)
            for t in range(1, self.seq_len + 1):
                x[:, t] = (x[:, t - 1] * 3 + 1) % self.vocab_size
            yield {"input_ids": x[:, :-1].clone(), "labels": x[:, 1:].clone()}


@pytest.fixture
def synthetic_loader() -> type[SyntheticLoader]:
    return SyntheticLoader


# --- a real dataset, made by the pipeline -------------------------------------------------

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")


def markov_text(n_docs: int, seed: int = 0) -> str:
    """Paragraphs from a Markov chain where each word has two successors: low entropy, so a
    falling loss is unmistakable; distinct paragraphs, so dedup keeps them all."""
    rng = random.Random(seed)
    successors = {w: rng.sample(WORDS, 2) for w in WORDS}
    docs = []
    for _ in range(n_docs):
        w = rng.choice(WORDS)
        words = [w]
        for _ in range(rng.randint(30, 50)):
            w = rng.choice(successors[w])
            words.append(w)
        docs.append(" ".join(words))
    return "\n\n".join(docs) + "\n"


def word_level_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))


@pytest.fixture(scope="session")
def tiny_vocab_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL of a ~8k-token dataset (vocab 28): a 2-rank, batch-4, seq-64 run spans ~2 epochs
    in 30 steps, so the epoch rollover of the real loader is exercised too."""
    root = tmp_path_factory.mktemp("tiny_vocab_dataset")
    text = root / "input.txt"
    text.write_text(markov_text(200), encoding="utf-8")
    tokenizer = root / "tokenizer.json"
    word_level_tokenizer(tokenizer)
    out = root / "ds"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(text), "--output", str(out),
         "--tokenizer", str(tokenizer), "--workers", "1", "--row-group-tokens", "2048",
         "--dashboard-address", ":0", "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"pipeline failed:\n{proc.stdout}\n{proc.stderr}"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["vocab_size"] == len(WORDS) + 2
    return str(out)


# --- one uninterrupted 2-process torchrun job, the reference of the fault tests -------------

@pytest.fixture(scope="session")
def straight_run(tiny_vocab_dataset: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, list[str], int]:
    """One uninterrupted 2-process run (one epoch and 2 steps, a checkpoint every 3 steps, all
    kept): the reference of the killed, hung and elastic runs (test_restart, test_hang,
    test_elastic) and the source of the elastic resumes. Returns its run dir, the flags every
    run shares, and the step count."""
    from loaders import TokenDataset
    from tests.trainer._torchrun import EVERY, GBS, MODEL, SEQ, Job, free_port, torchrun

    ds = TokenDataset(tiny_vocab_dataset, SEQ, rank=0, world_size=2, batch_size=GBS // 2)
    steps = -(-len(ds) // (GBS // 2)) + 2
    common = ["--data", tiny_vocab_dataset, "--steps", str(steps), "--global-batch-size",
              str(GBS), "--checkpoint-every", str(EVERY), "--keep", "100", "--deterministic",
              *MODEL]
    run_dir = tmp_path_factory.mktemp("straight")
    job = Job([*torchrun(2, free_port()), "-m", "trainer", *common, "--run-dir", str(run_dir),
               "--checkpoint-dir", str(run_dir / "ck")], run_dir.parent / "straight")
    assert job.wait(240) == 0, job.tail()
    return run_dir, common, steps
