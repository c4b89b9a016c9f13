"""The README's recipes under real frameworks, 2 CPU processes on gloo, no mocks.

Each script under ``frameworks/`` builds the loader before the process group exists (the
way each framework's users write it) and records, per rank, the sample ids of every batch it
trained on. Against the plan's global batches (a one-process loader with the whole global
batch), every step's two rank batches must be disjoint and together be that step's global
batch, and the epoch after the first must be the next epoch's order, not the first's again.
On the loader before it took its rank at the first iteration, both ranks read rank 0 of 1
(the same batches); before re-iteration moved on, Lightning's second epoch replayed the first.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loaders import build_dataloader
from tests.loaders.frameworks._shared import BATCH, SEED, SEQ

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "frameworks"

pytestmark = pytest.mark.slow

WORLD = 2
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")


@pytest.fixture(scope="module")
def words_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ~8k-token dataset with a 28-word vocabulary, made by the pipeline CLI: ~30 global
    batches of 8 x 32 tokens an epoch, so a run crosses epochs in seconds."""
    import random

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    root = tmp_path_factory.mktemp("words")
    rng = random.Random(0)
    successors = {w: rng.sample(WORDS, 2) for w in WORDS}
    docs = []
    for _ in range(200):  # distinct paragraphs, so dedup keeps them all
        w = rng.choice(WORDS)
        words = [w]
        for _ in range(rng.randint(30, 50)):
            w = rng.choice(successors[w])
            words.append(w)
        docs.append(" ".join(words))
    (root / "input.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    vocab = {"[UNK]": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(root / "tokenizer.json"))
    out = root / "ds"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(root / "input.txt"), "--output", str(out),
         "--tokenizer", str(root / "tokenizer.json"), "--workers", "1", "--row-group-tokens",
         "2048", "--dashboard-address", ":0", "--no-progress"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, f"pipeline failed:\n{proc.stdout}\n{proc.stderr}"
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], timeout: float = 120) -> None:
    """Run a launcher to its end; its output is the failure message. One thread a process:
    two ranks fill the two cores."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TOKENIZERS_PARALLELISM": "false"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        env.pop(key, None)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd[1:3]} failed ({proc.returncode}):\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def torchrun(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
            "--master-port", str(free_port()), str(SCRIPTS / script), *args]


def records(out: Path, name: str) -> list[list]:
    return [json.loads((out / f"{name}_rank{r}.json").read_text()) for r in range(WORLD)]


def global_batches(dataset: str, epochs: int) -> list[list[int]]:
    """The plan's global batches (sorted ids), epoch after epoch: one process reading the
    whole global batch of the same plan (lanes = the global batch)."""
    ref = build_dataloader(dataset, BATCH * WORLD, SEQ, seed=SEED, rank=0, world_size=1,
                           return_sample_id=True)
    out = []
    for epoch in range(epochs):
        ref.set_epoch(epoch)
        out += [sorted(b["sample_id"].tolist()) for b in ref]
    return out


def check_split(per_rank: list[list[list[int]]], want: list[list[int]]) -> None:
    """Step k of every rank: disjoint batches whose union is global batch k."""
    assert len({len(r) for r in per_rank}) == 1, [len(r) for r in per_rank]
    assert len(per_rank[0]) == len(want) > 0
    for k, parts in enumerate(zip(*per_rank, strict=True)):
        assert not set(parts[0]) & set(parts[1]), f"step {k}: both ranks read {parts}"
        assert sorted(parts[0] + parts[1]) == want[k], f"step {k}"


def test_torch_loaders_built_before_the_group(words_dataset: str, tmp_path: Path) -> None:
    run(torchrun("torch_late_group.py", words_dataset, str(tmp_path)))
    got = records(tmp_path, "torch")
    want = global_batches(words_dataset, 2)
    per_epoch = len(want) // 2
    check_split([r["loader"][0] + r["loader"][1] for r in got], want)
    check_split([r["spawned"] for r in got], want[:per_epoch])
    # Alone (no group, no WORLD_SIZE): rank 0 of 1, the whole first global batch on each.
    assert all(sorted(r["alone"][0] + r["alone"][1]) == want[0] for r in got)
    check_split([r["fixed_rest"] for r in got], want[1:per_epoch])
    assert all("rank 0 of 1" in r["refused"] and "rank=" in r["refused"] for r in got)


def test_lightning_ddp_distinct_data_next_epoch_and_exact_resume(words_dataset: str,
                                                                 tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    per_epoch = len(build_dataloader(words_dataset, BATCH * WORLD, SEQ, seed=SEED, rank=0,
                                     world_size=1))
    steps = per_epoch + 12
    run([sys.executable, str(SCRIPTS / "lightning_ddp.py"), words_dataset, str(tmp_path),
         str(steps)])
    full = records(tmp_path, "full")
    check_split([[ids for _step, _epoch, ids in r] for r in full],
                global_batches(words_dataset, 2)[:steps])
    assert [e for _s, e, _ids in full[0]] == [0] * per_epoch + [1] * 12

    state = _loader_state(tmp_path / "ckpt-full" / "step=8.ckpt")
    assert (state["epoch"], state["lane_pos"]) == (0, 8)  # Lightning saved the loader's state
    for name, resume_at in (("step=8", 8), ("epoch=0-end", per_epoch)):
        resumed = records(tmp_path, name)
        for r in range(WORLD):  # Lightning's epoch count after an epoch-end resume aside
            assert [(s, ids) for s, _e, ids in resumed[r]] == \
                [(s, ids) for s, _e, ids in full[r][resume_at:]], f"{name}, rank {r}"


def _loader_state(path: Path) -> dict:
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    (state,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    return state


def test_accelerate_distinct_data_next_epoch_and_saved_state(words_dataset: str,
                                                             tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    per_epoch = len(build_dataloader(words_dataset, BATCH * WORLD, SEQ, seed=SEED, rank=0,
                                     world_size=1))
    steps = per_epoch + 6
    run(torchrun("accelerate_ddp.py", words_dataset, str(tmp_path), str(steps)))
    got = records(tmp_path, "accelerate")
    check_split([[ids for _e, ids in r["steps"]] for r in got],
                global_batches(words_dataset, 2)[:steps])
    assert [e for e, _ids in got[0]["steps"]] == [0] * per_epoch + [1] * 6
    for r in got:  # load_state put the loader back at step 8: the same batches again
        assert r["resumed"] == r["steps"][8:]


def test_transformers_trainer_distinct_data_and_right_targets(words_dataset: str,
                                                              tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import torch

    first = next(iter(build_dataloader(words_dataset, BATCH, SEQ, rank=0, world_size=1)))
    assert torch.equal(first["labels"][:, :-1], first["input_ids"][:, 1:])  # shifted already
    per_epoch = len(build_dataloader(words_dataset, BATCH * WORLD, SEQ, seed=SEED, rank=0,
                                     world_size=1))
    steps = per_epoch + 4
    run(torchrun("hf_trainer.py", words_dataset, str(tmp_path), str(steps)))
    got = records(tmp_path, "hf")
    check_split([r["ids"] for r in got], global_batches(words_dataset, 2)[:steps])
    # The first step's loss, as the Trainer logged it (the mean of the ranks'), is the
    # initial model's loss against the next tokens, not against the tokens two ahead.
    logged = got[0]["logged"][0]
    right = sum(r["losses"]["right"] for r in got) / WORLD
    wrong = sum(r["losses"]["double_shift"] for r in got) / WORLD
    assert logged == pytest.approx(right, abs=1e-5)
    assert abs(wrong - right) > 0.05
