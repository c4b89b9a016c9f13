"""Delta checkpoints through DCP (trainer/checkpoint/delta_dcp.py,
trainer/checkpoint/checkpointer.py): real saves and
loads, in this process (one rank) and in a process killed from outside mid-save."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainer.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from trainer.checkpoint.delta import HEADER
from trainer.checkpoint.safe_metadata import load_metadata
from trainer.model import GPT, GPTConfig
from trainer.optim import build_optimizer

REPO = Path(__file__).resolve().parents[3]
CFG = GPTConfig(vocab_size=256, max_seq_len=16, n_layers=2, d_model=32, n_heads=2)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make(freeze: bool = False) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(CFG)
    if freeze:  # embeddings and the first block: most of the parameters
        for p in [*model.tok_emb.parameters(), *model.pos_emb.parameters(),
                  *model.layers[0].parameters()]:
            p.requires_grad_(False)
    return model, build_optimizer(model, lr=1e-2, weight_decay=0.1)


def train(model: GPT, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, CFG.vocab_size, (4, 16), generator=g)
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()


def state(model: GPT, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        out.update({f"optim.{i}.{k}": v for k, v in s.items()})
    return out


def loaded(url: str, freeze: bool = False) -> dict[str, torch.Tensor]:
    model, opt = make(freeze)
    load_checkpoint(url, model, opt)
    return state(model, opt)


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(
        a[k].view(-1).view(torch.uint8) if a[k].numel() else a[k],
        b[k].view(-1).view(torch.uint8) if b[k].numel() else b[k])]
    assert not differ, differ


def test_full_plus_delta_restores_bitwise_what_a_full_save_holds(tmp_path: Path) -> None:
    model, opt = make()
    deltas = Checkpointer(str(tmp_path / "d"), keep=5, full_every=3)
    fulls = Checkpointer(str(tmp_path / "f"), keep=5)
    train(model, opt, 2, seed=1)
    deltas.save(2, model, opt, {})
    train(model, opt, 3, seed=2)
    live = {k: v.clone() for k, v in state(model, opt).items()}
    deltas.save(5, model, opt, {})
    fulls.save(5, model, opt, {})
    delta_dir = tmp_path / "d" / "step-00000005"
    assert json.loads((delta_dir / "delta.json").read_text()) == {
        "format": 1, "base": "step-00000002", "index": 1}
    assert not list(delta_dir.glob("*.distcp")) and list(delta_dir.glob("*.sfdelta"))
    restored = loaded(str(delta_dir))
    assert_bitwise(restored, loaded(str(tmp_path / "f" / "step-00000005")))
    assert_bitwise(restored, live)
    # the third save is full again; the delta's base stays while the delta is kept
    train(model, opt, 1, seed=3)
    deltas.save(6, model, opt, {})
    deltas.save(7, model, opt, {})
    assert not (tmp_path / "d" / "step-00000007" / "delta.json").exists()
    assert [s for s, _, _ in list_checkpoints(str(tmp_path / "d"))] == [2, 5, 6, 7]


def test_frozen_parameters_are_written_once(tmp_path: Path) -> None:
    model, opt = make(freeze=True)
    ck = Checkpointer(str(tmp_path), keep=5, full_every=4)
    train(model, opt, 1, seed=1)
    ck.save(1, model, opt, {})
    train(model, opt, 2, seed=2)
    ck.save(3, model, opt, {})
    meta = load_metadata((tmp_path / "step-00000003" / ".metadata").read_bytes())
    lengths = {i.fqn: info.length for i, info in meta.storage_data.items()}
    frozen = [k for k in lengths if k.startswith(("model.tok_emb", "model.pos_emb",
                                                   "model.layers.0."))]
    assert frozen and all(lengths[k] == HEADER.size for k in frozen), lengths
    # the optimizer's hyper-parameters did not change either: written once too
    groups = [k for k in lengths if k.startswith("optim.param_groups.")]
    assert groups and all(lengths[k] == HEADER.size for k in groups), lengths
    full = next((tmp_path / "step-00000001").glob("*.distcp")).stat().st_size
    delta = sum(p.stat().st_size for p in (tmp_path / "step-00000003").glob("*.sfdelta"))
    assert delta < full / 2, (delta, full)
    assert_bitwise(loaded(str(tmp_path / "step-00000003"), freeze=True), state(model, opt))


def test_bf16_moments_are_opt_in_lossy_for_the_moments_only(tmp_path: Path) -> None:
    model, opt = make()
    exact = Checkpointer(str(tmp_path / "exact"), keep=5, full_every=4)
    lossy = Checkpointer(str(tmp_path / "lossy"), keep=5, full_every=4, delta_moments="bf16")
    train(model, opt, 2, seed=1)
    exact.save(2, model, opt, {})
    lossy.save(2, model, opt, {})
    train(model, opt, 3, seed=2)
    live = {k: v.clone() for k, v in state(model, opt).items()}
    exact.save(5, model, opt, {})
    lossy.save(5, model, opt, {})
    d = tmp_path / "lossy" / "step-00000005"
    assert json.loads((d / "delta.json").read_text())["moments"] == "bf16"
    assert "moments" not in json.loads(
        (tmp_path / "exact" / "step-00000005" / "delta.json").read_text())
    restored = loaded(str(d))
    moments = [k for k in live if k.endswith(("exp_avg", "exp_avg_sq"))]
    assert moments
    # the moments: torch's bfloat16 rounding of the trained ones, bit for bit
    assert_bitwise({k: restored[k] for k in moments},
                   {k: live[k].to(torch.bfloat16).float() for k in moments})
    # everything else (weights, steps): exact; the base (a full checkpoint) exact too
    assert_bitwise({k: restored[k] for k in live if k not in moments},
                   {k: live[k] for k in live if k not in moments})
    assert_bitwise(loaded(str(tmp_path / "lossy" / "step-00000002")),
                   loaded(str(tmp_path / "exact" / "step-00000002")))
    size = {name: sum(p.stat().st_size for p in (tmp_path / name / "step-00000005").glob(
        "*.sfdelta")) for name in ("exact", "lossy")}
    assert size["lossy"] < 0.8 * size["exact"], size
    with pytest.raises(ValueError, match="delta_moments"):
        Checkpointer(str(tmp_path / "x"), delta_moments="fp8")


def test_torn_or_hostile_deltas_fail_clearly_and_the_last_valid_state_loads(
        tmp_path: Path) -> None:
    model, opt = make()
    ck = Checkpointer(str(tmp_path), keep=5, full_every=3)
    train(model, opt, 1, seed=1)
    ck.save(1, model, opt, {})
    train(model, opt, 1, seed=2)
    ck.save(2, model, opt, {})
    step2 = tmp_path / "step-00000002"
    data = next(step2.glob("*.sfdelta"))
    blob = data.read_bytes()

    data.write_bytes(blob[: len(blob) // 2])  # torn, but marked complete: a clear error
    with pytest.raises(CheckpointError, match=r"sfdelta.*(truncated|torn)"):
        loaded(str(step2))

    (step2 / "COMPLETE").unlink()  # torn before its marker: it does not exist
    assert latest_checkpoint(str(tmp_path)).endswith("step-00000001")
    loaded(latest_checkpoint(str(tmp_path)))

    data.write_bytes(blob)
    (step2 / "COMPLETE").write_text("{}")
    for hostile in ({"format": 1, "base": "../../etc", "index": 1},
                    {"format": 1, "base": "step-00000009", "index": 1},
                    {"format": 1, "base": "step-00000001", "index": True}):
        (step2 / "delta.json").write_text(json.dumps(hostile))
        with pytest.raises(CheckpointError, match="delta.json"):
            loaded(str(step2))
    (step2 / "delta.json").write_text(json.dumps({"format": 1, "base": "step-00000001",
                                                  "index": 1}))
    (tmp_path / "step-00000001" / "COMPLETE").unlink()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        loaded(str(step2))


SAVER = """
import hashlib, json, sys, torch
sys.path.insert(0, {repo!r})
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.model import GPT, GPTConfig
from trainer.optim import build_optimizer
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=2048, max_seq_len=16, n_layers=2, d_model=64, n_heads=2))
opt = build_optimizer(model, lr=1e-2, weight_decay=0.1)
ck = Checkpointer({root!r}, keep=2, full_every=4)
for step in range(1, 10_000):
    x = torch.randint(0, 2048, (2, 16))
    model(x, x)[1].backward(); opt.step(); opt.zero_grad()
    h = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values()))
    open({root!r} + f"/ref-{{step}}", "w").write(h.hexdigest())
    ck.save(step, model, opt, {{}})
"""


def digest(model: GPT) -> str:
    return hashlib.sha256(b"".join(v.numpy().tobytes()
                                   for v in model.state_dict().values())).hexdigest()


def test_a_process_killed_mid_delta_save_leaves_the_last_complete_one_loadable(
        tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-c", SAVER.format(repo=str(REPO),
                                                                root=str(root))], env=env)
    try:
        deadline = time.monotonic() + 60
        # wait until a few deltas exist, then kill while the next one is being written
        while not (root / "step-00000002" / "COMPLETE").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        while not any(root.glob("step-*/__0_0.sfdelta")) or all(
                (p.parent / "COMPLETE").exists() for p in root.glob("step-*/__0_0.sfdelta")):
            time.sleep(0.001)
            assert time.monotonic() < deadline
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    torn = [p.parent.name for p in root.glob("step-*/__0_0.sfdelta")
            if not (p.parent / "COMPLETE").exists()]
    latest = latest_checkpoint(str(root))
    assert latest is not None
    step = int(latest.rsplit("-", 1)[1])
    assert torn and all(int(t.rsplit("-", 1)[1]) > step for t in torn), (torn, latest)
    model = GPT(GPTConfig(vocab_size=2048, max_seq_len=16, n_layers=2, d_model=64, n_heads=2))
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    load_checkpoint(latest, model, opt)
    assert digest(model) == (root / f"ref-{step}").read_text()


@pytest.mark.slow
def test_delta_checkpoints_on_s3(s3_bucket) -> None:
    """The fsspec path: delta records written and read through DCP's FsspecWriter/Reader on
    a real S3 server; the base is kept while the delta needs it."""
    url = f"{s3_bucket.url}/ckpt"
    opts = s3_bucket.storage_options
    model, opt = make()
    ck = Checkpointer(url, keep=1, storage_options=opts, full_every=2)
    train(model, opt, 1, seed=1)
    ck.save(1, model, opt, {})
    train(model, opt, 1, seed=2)
    ck.save(2, model, opt, {})
    assert [(s, c) for s, _, c in list_checkpoints(url, opts)] == [(1, True), (2, True)]
    fresh, fresh_opt = make()
    load_checkpoint(latest_checkpoint(url, opts), fresh, fresh_opt, opts)
    assert_bitwise(state(fresh, fresh_opt), state(model, opt))
