"""FSDP2 on CPU with gloo (it runs there in torch 2.13), gradient accumulation, HSDP over two
local "nodes" launched as two torchrun agents with the c10d rendezvous, and a sharded FSDP
checkpoint loaded whole by one process. All against the DDP run of the same global batch:
the same samples per step and the same mean loss, so the weights agree to float tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
SEQ = 64
STEPS = 8
pytestmark = pytest.mark.slow


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(argv: list[str], nproc: int | None) -> None:
    """``python -m trainer``, under torchrun (c10d rendezvous) when ``nproc`` is given."""
    launcher = [sys.executable]
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    proc = subprocess.run([*launcher, "-m", "trainer", *argv], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def args(data: str, run_dir: Path, *extra: str) -> list[str]:
    return ["--data", data, "--steps", str(STEPS), "--global-batch-size", "8", "--preset",
            "tiny", "--seq-len", str(SEQ), "--device", "cpu", "--lr", "3e-3",
            "--warmup-steps", "2", "--log-every", "4", "--run-dir", str(run_dir), *extra]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model_final.pt", weights_only=True)


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.fixture(scope="module")
def ddp_run(tiny_vocab_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: DDP, 2 processes, 4 sequences per rank per step."""
    run_dir = tmp_path_factory.mktemp("ddp")
    trainer(args(tiny_vocab_dataset, run_dir), nproc=2)
    return run_dir


def test_fsdp_with_grad_accum_matches_ddp_and_its_shards_load_whole(
        tiny_vocab_dataset: str, ddp_run: Path, tmp_path: Path) -> None:
    trainer(args(tiny_vocab_dataset, tmp_path / "fsdp", "--strategy", "fsdp", "--grad-accum",
                 "2", "--checkpoint-dir", str(tmp_path / "fsdp" / "ck"), "--checkpoint-every",
                 "4"), nproc=2)
    config = json.loads((tmp_path / "fsdp" / "config.json").read_text())
    assert config["strategy"] == "fsdp" and config["mesh"] == [2]
    assert config["global_batch_size"] == 8 and config["train"]["batch_size"] == 2
    ddp, fsdp = weights(ddp_run), weights(tmp_path / "fsdp")
    assert_close(ddp, fsdp)
    # Same samples per step (4 per rank, in two micro-batches of 2 under FSDP).
    for r in (0, 1):
        a = read_jsonl(ddp_run / f"rank{r}_samples.jsonl")
        b = read_jsonl(tmp_path / "fsdp" / f"rank{r}_samples.jsonl")
        assert [x["sample_ids"] for x in a] == [x["sample_ids"] for x in b]

    # The sharded checkpoint (2 shards) loads unsharded in one process and is exactly the
    # gathered final model. (Elastic resume of the whole run: tests/trainer/test_restart.py.)
    from trainer.checkpoint.checkpointer import load_checkpoint
    from trainer.model import GPT, GPTConfig
    from trainer.optim import build_optimizer

    ck = tmp_path / "fsdp" / "ck"
    assert {p.name for p in (ck / "step-00000008").glob("__*_0.distcp")} == {
        "__0_0.distcp", "__1_0.distcp"}
    model = GPT(GPTConfig(**config["model"]))
    load_checkpoint(str(ck / "step-00000008"), model,
                    build_optimizer(model, lr=1e-3, weight_decay=0.1))
    for k, v in model.state_dict().items():
        assert torch.equal(v, fsdp[k]), k


def test_two_nodes_hsdp_with_c10d_rendezvous(tiny_vocab_dataset: str, ddp_run: Path,
                                             tmp_path: Path) -> None:
    """``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`` twice on this host: the
    two-node launch of README-trainer, with FSDP over a (2 nodes x 1) mesh (HSDP)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "hsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
           "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-id", "shardflow-test", "-m", "trainer",
           *args(tiny_vocab_dataset, run_dir, "--strategy", "fsdp")]
    nodes = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [n.communicate(timeout=240)[0] for n in nodes]
    for node, out in zip(nodes, outs, strict=True):
        assert node.returncode == 0, out[-4000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["world_size"] == 2 and config["mesh"] == [2, 1]
    assert_close(weights(ddp_run), weights(run_dir))
