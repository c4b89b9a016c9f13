"""Delta checkpoints vs full ones (issue 27 item 3): bytes and write time.

The ``small`` preset: the trainer's CPU model shape (4 layers x 128, 4 heads) on an 8,192-token
vocabulary, sequences of 64, batches of 8, AdamW as the trainer builds it; 100 steps of
training on a learnable token rule, then a full checkpoint (the base), then ``--gap`` more steps
(default 10: a checkpoint every 10 steps) and the delta against the base. Two regimes:

* dense: every parameter trained (AdamW moves every weight and both moments every step);
* frozen: all but the last block's MLP frozen (>= 90 % of the parameters), as in fine-tuning.

Measured, per regime: the full DCP checkpoint (``full_bytes``); the same state compressed
with the delta's own codec but without a base (``full_compressed_bytes``: byte planes + zstd,
i.e. a delta against nothing); the delta (``delta_bytes``); for reference plain zstd of the
full checkpoint's files and XOR + zstd without the byte-plane split; the delta's bytes by
state (weights, exp_avg, exp_avg_sq); write times (medians of ``--rounds`` interleaved
saves); and whether full + delta restores bitwise what was trained (``bitwise_restore``).
The ratio vs gap (1..100 steps) is the plot.

    python benchmarks/checkpoint_delta.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import zstandard  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402
from storage import resolve  # noqa: E402
from trainer.checkpoint import Checkpointer, load_checkpoint  # noqa: E402
from trainer.delta import HEADER  # noqa: E402
from trainer.delta_dcp import delta_writer  # noqa: E402
from trainer.model import GPT, GPTConfig  # noqa: E402
from trainer.optim import build_optimizer  # noqa: E402
from trainer.safe_metadata import load_metadata  # noqa: E402

PRESETS = {"small": dict(vocab_size=8192, max_seq_len=64, n_layers=4, d_model=128, n_heads=4),
           "tiny": dict(vocab_size=1024, max_seq_len=32, n_layers=2, d_model=64, n_heads=2)}
BATCH = 8


def build(preset: str, frozen: bool) -> tuple[GPT, torch.optim.Optimizer, float]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**PRESETS[preset]))
    if frozen:
        keep = set(map(id, model.layers[-1].mlp.parameters())) \
            if hasattr(model.layers[-1], "mlp") else set()
        if not keep:  # any block layout: the last block's largest matrices
            keep = {id(p) for p in model.layers[-1].parameters() if p.dim() == 2}
        for p in model.parameters():
            if id(p) not in keep:
                p.requires_grad_(False)
    total = sum(p.numel() for p in model.parameters())
    frozen_frac = sum(p.numel() for p in model.parameters() if not p.requires_grad) / total
    return model, build_optimizer(model, lr=1e-3, weight_decay=0.1), frozen_frac


def train(model: GPT, opt: torch.optim.Optimizer, steps: int, gen: torch.Generator) -> None:
    vocab, seq = model.cfg.vocab_size, model.cfg.max_seq_len
    for _ in range(steps):
        x = torch.empty(BATCH, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (BATCH,), generator=gen)
        for t in range(1, seq + 1):  # a rule the model can learn: next = 3 * prev + 1
            x[:, t] = (x[:, t - 1] * 3 + 1) % vocab
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def dir_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def tensors_bytes(path: Path) -> int:
    return dir_bytes(path, "__*") + dir_bytes(path, ".metadata")


def live_state(model: GPT, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        out.update({f"optim.{i}.{k}": v.clone() for k, v in s.items()})
    return out


def by_state(delta_dir: Path) -> dict[str, int]:
    """A delta's record bytes by what they hold (weights, exp_avg, exp_avg_sq, other)."""
    meta = load_metadata((delta_dir / ".metadata").read_bytes())
    out: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        fqn = index.fqn
        key = "weights" if fqn.startswith("model.") else next(
            (k for k in ("exp_avg_sq", "exp_avg") if fqn.endswith(k)), "other")
        out[key] = out.get(key, 0) + info.length
    return out


def alt_codecs(base_dir: Path, model: GPT, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Other schemes on the same (base, new) pairs: XOR + zstd without the byte planes, and
    plain zstd of the full checkpoint's data file."""
    from trainer.delta_dcp import BaseCheckpoint, tensor_bytes

    base = BaseCheckpoint(resolve(str(base_dir)))
    model_sd, optim_sd = get_state_dict(model, opt)
    flat: dict[str, Any] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix] = obj

    walk("", {"model": model_sd, "optim": optim_sd})
    zc = zstandard.ZstdCompressor(level=3)
    xor_plain = 0
    from torch.distributed.checkpoint.metadata import MetadataIndex

    for fqn, t in flat.items():
        raw = tensor_bytes(t)
        b = base.chunk(MetadataIndex(fqn, [0] * t.dim()), t.dtype, t.shape)
        if b is None:
            xor_plain += HEADER.size + len(zc.compress(raw.tobytes()))
        elif np.array_equal(raw, b):
            xor_plain += HEADER.size
        else:
            xor_plain += HEADER.size + len(zc.compress(np.bitwise_xor(raw, b).tobytes()))
    base.close()
    plain = sum(len(zc.compress(p.read_bytes())) for p in base_dir.glob("__*"))
    return {"xor_zstd_no_planes_bytes": xor_plain, "base_plain_zstd_bytes": plain}


def measure(preset: str, frozen: bool, warm_steps: int, gaps: list[int], rounds: int,
            work: Path) -> dict[str, Any]:
    model, opt, frozen_frac = build(preset, frozen)
    gen = torch.Generator().manual_seed(1)
    train(model, opt, warm_steps, gen)
    root = work / ("frozen" if frozen else "dense")
    ck = Checkpointer(str(root / "chain"), keep=1000, full_every=1000)
    ck.save(warm_steps, model, opt, {})  # the base: a full DCP checkpoint
    base_dir = root / "chain" / f"step-{warm_steps:08d}"
    full_bytes = tensors_bytes(base_dir)
    sweep, step, headline = [], warm_steps, None
    for gap in sorted(gaps):
        train(model, opt, gap - (step - warm_steps), gen)
        step = warm_steps + gap
        ck.save(step, model, opt, {})
        d = root / "chain" / f"step-{step:08d}"
        sweep.append({"gap": gap, "delta_bytes": tensors_bytes(d)})
        if headline is None or gap == args.gap:
            headline = (gap, d, live_state(model, opt))
    gap, delta_dir, live = headline
    # the same state with the delta's codec and no base: "full, compressed with the same codec"
    full_z = root / "full-codec"
    model_sd, optim_sd = get_state_dict(model, opt)
    saved_state = {"model": model_sd, "optim": optim_sd}
    # write times, interleaved: full DCP / full with the codec / delta against the base
    times: dict[str, list[float]] = {"full": [], "full_codec": [], "delta": []}
    for r in range(rounds):
        for kind in times:
            out = root / f"t-{kind}-{r}"
            t0 = time.perf_counter()
            if kind == "full":
                dcp.save(saved_state, storage_writer=dcp.FileSystemWriter(str(out)))
            elif kind == "full_codec":
                dcp.save(saved_state, storage_writer=delta_writer(
                    resolve(str(out)), str(out), None, {}))
            else:
                dcp.save(saved_state, storage_writer=delta_writer(
                    resolve(str(out)), str(out), resolve(str(base_dir)), {}))
            times[kind].append(time.perf_counter() - t0)
            if r == 0 and kind == "full_codec":
                shutil.copytree(out, full_z)
            shutil.rmtree(out)
    full_compressed = tensors_bytes(full_z)
    # bitwise restore: full + delta into a fresh model and optimizer
    fresh, fresh_opt, _ = build(preset, frozen)
    load_checkpoint(str(delta_dir), fresh, fresh_opt)
    restored = live_state(fresh, fresh_opt)
    bitwise = restored.keys() == live.keys() and all(
        restored[k].dtype == live[k].dtype and torch.equal(restored[k], live[k]) for k in live)
    delta_bytes = tensors_bytes(delta_dir)
    return {
        "frozen_fraction": frozen_frac,
        "gap_steps": gap,
        "full_bytes": full_bytes,
        "full_compressed_bytes": full_compressed,
        "delta_bytes": delta_bytes,
        "ratio_vs_full_compressed": full_compressed / delta_bytes,
        "ratio_vs_full": full_bytes / delta_bytes,
        "delta_by_state": by_state(delta_dir),
        **alt_codecs(base_dir, model, opt),
        "write_s": {k: statistics.median(v) for k, v in times.items()},
        "write_s_all": times,
        "bitwise_restore": bool(bitwise),
        "sweep": [{**s, "ratio_vs_full_compressed": full_compressed / s["delta_bytes"]}
                  for s in sweep],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("dense", "frozen"):
        r = result[name]
        a.plot([s["gap"] for s in r["sweep"]], [s["ratio_vs_full_compressed"]
                                               for s in r["sweep"]], marker="o",
               label=f"{name} ({100 * r['frozen_fraction']:.0f} % frozen)")
    a.axhline(1.5, color="grey", linestyle=":", label="goal, dense 1.5x")
    a.axhline(10, color="grey", linestyle="--", label="goal, frozen 10x")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("steps since the full checkpoint")
    a.set_ylabel("full (same codec) / delta bytes")
    a.set_title(f"delta size, {result['preset']} preset after {result['warm_steps']} steps")
    a.legend(fontsize="small")
    labels, full, full_z, delta = [], [], [], []
    for name in ("dense", "frozen"):
        r = result[name]
        labels.append(name)
        full.append(r["full_bytes"] / 1e6)
        full_z.append(r["full_compressed_bytes"] / 1e6)
        delta.append(r["delta_bytes"] / 1e6)
    x = np.arange(len(labels))
    b.bar(x - 0.25, full, 0.25, label="full DCP")
    b.bar(x, full_z, 0.25, label="full, same codec")
    b.bar(x + 0.25, delta, 0.25, label=f"delta ({result['gap']} steps)")
    b.set_xticks(x, labels)
    b.set_ylabel("MB")
    b.set_title("bytes written")
    b.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    global args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--warm-steps", type=int, default=100)
    p.add_argument("--gap", type=int, default=10, help="steps between base and the delta")
    p.add_argument("--gaps", default="1,10,100", help="the sweep (plot)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed saves")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = p.parse_args()
    gaps = sorted({args.gap, *(int(g) for g in args.gaps.split(","))})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dense = measure(args.preset, False, args.warm_steps, gaps, args.rounds, Path(tmp))
        frozen = measure(args.preset, True, args.warm_steps, gaps, args.rounds, Path(tmp))
    import os

    result = {
        "preset": args.preset, "model": PRESETS[args.preset], "batch": BATCH,
        "warm_steps": args.warm_steps, "gap": args.gap, "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "full_bytes": dense["full_bytes"],
        "full_compressed_bytes": dense["full_compressed_bytes"],
        "delta_bytes": dense["delta_bytes"],
        "frozen_full_compressed_bytes": frozen["full_compressed_bytes"],
        "frozen_delta_bytes": frozen["delta_bytes"],
        "bitwise_restore": dense["bitwise_restore"] and frozen["bitwise_restore"],
        "dense": dense, "frozen": frozen,
    }
    suffix = "" if args.preset == "small" else f"_{args.preset}"
    write_results(f"checkpoint_delta{suffix}", result)
    plot(result, RESULTS / f"checkpoint_delta{suffix}.png")
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name, r in (("dense", dense), ("frozen", frozen)):
            print(f"{name}: full {r['full_bytes']:,} B, same codec {r['full_compressed_bytes']:,}"
                  f", delta {r['delta_bytes']:,} ({r['ratio_vs_full_compressed']:.2f}x), "
                  f"write full {r['write_s']['full']:.3f} s / delta {r['write_s']['delta']:.3f}"
                  f" s, bitwise {r['bitwise_restore']}")
    return 0


args: argparse.Namespace

if __name__ == "__main__":
    raise SystemExit(main())
