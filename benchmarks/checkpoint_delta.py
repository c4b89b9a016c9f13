"""Delta checkpoints vs full ones (issue 27 item 3): bytes and write time.

The ``small`` preset: the trainer's CPU model shape (4 layers x 128, 4 heads) on an 8,192-token
vocabulary, sequences of 64, batches of 8, AdamW as the trainer builds it; 100 steps of
training on a learnable token rule, then a full checkpoint (the base), then ``--gap`` more steps
(default 10: a checkpoint every 10 steps) and the delta against the base. Two regimes:

* dense: every parameter trained (AdamW moves every weight and both moments every step);
* frozen: all but the last block's MLP frozen (>= 90 % of the parameters), as in fine-tuning.

Measured, per regime: the full DCP checkpoint (``full_bytes``); the same state compressed
with the delta's own codec but without a base (``full_compressed_bytes``: byte planes + zstd,
i.e. a delta against nothing); the delta (``delta_bytes``, lossless); for reference plain
zstd of the full checkpoint's files and other residual codecs on the same (base, new) pairs
(``alt_codecs``: XOR + byte planes, the first codec; XOR without planes; the integer
difference with bit planes instead of byte planes); the delta's bytes by state (weights,
exp_avg, exp_avg_sq, other); write times (medians of ``--rounds`` interleaved saves); whether
full + delta restores bitwise what was trained (``bitwise_restore``); why a dense delta is
hardly smaller (``bits``: per state, the fraction of zero bits of ``new XOR base`` at each of
the 32 bit positions, sign first, and the median bit length of the integer difference of the
float bit patterns: the bits that carry the change); and the opt-in lossy delta whose AdamW
moments are rounded to bfloat16 (``lossy_bf16_moments``: bytes, ratio, weights bitwise,
the moments' largest relative error). The ratio vs gap (1..100 steps) is the plot.

    python benchmarks/checkpoint_delta.py --json     # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import contextlib
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
from trainer.checkpoint.checkpointer import Checkpointer, load_checkpoint  # noqa: E402
from trainer.checkpoint.delta import HEADER  # noqa: E402
from trainer.checkpoint.delta_dcp import delta_writer  # noqa: E402
from trainer.checkpoint.safe_metadata import load_metadata  # noqa: E402
from trainer.model import GPT, GPTConfig  # noqa: E402
from trainer.optim import build_optimizer  # noqa: E402

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
        key = state_kind(index.fqn)
        out[key] = out.get(key, 0) + info.length
    return out


def record_bytes(ck_dir: Path, fqns: set[str]) -> int:
    meta = load_metadata((ck_dir / ".metadata").read_bytes())
    return sum(info.length for index, info in meta.storage_data.items() if index.fqn in fqns)


def tied_fqns(model: GPT) -> set[str]:
    """State-dict keys whose tensor shares its storage with an earlier key (a tied matrix
    is saved twice by DCP)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = set()
    for k, v in model.state_dict(keep_vars=True).items():
        key = (v.data_ptr(), tuple(v.shape))
        if key in seen:
            out.add(f"model.{k}")
        seen.add(key)
    return out


def bit_planes(u8: np.ndarray, itemsize: int) -> bytes:
    """Bit-plane split (bitshuffle, whole chunk; numpy): bit k of every element together,
    most significant first. Elements padded to a multiple of 8."""
    n = u8.size // itemsize
    m = u8.reshape(n, itemsize)[:, ::-1]
    if n % 8:
        m = np.concatenate([m, np.zeros((8 - n % 8, itemsize), np.uint8)])
    return np.packbits(np.unpackbits(m, axis=1).T, axis=1).tobytes()


def state_kind(fqn: str) -> str:
    return "weights" if fqn.startswith("model.") else next(
        (k for k in ("exp_avg_sq", "exp_avg") if fqn.endswith(k)), "other")


def bit_analysis(base: dict[str, torch.Tensor], live: dict[str, torch.Tensor]
                 ) -> dict[str, Any]:
    """Per state: the fraction of zero bits of ``new XOR base`` at each bit position (sign,
    8 exponent bits, 23 mantissa bits) and the median bit length of ``|new - base|`` as
    integers (the float bit patterns): what a lossless delta must store per element. Changed
    tensors only."""
    zero: dict[str, np.ndarray] = {}
    count: dict[str, int] = {}
    lengths: dict[str, list[np.ndarray]] = {}
    for k, t in live.items():
        if t.dtype != torch.float32 or t.dim() == 0 or k not in base:
            continue
        kind = state_kind(k)
        a = t.reshape(-1).numpy().view(np.uint32)
        b = base[k].reshape(-1).numpy().view(np.uint32)
        if np.array_equal(a, b):  # unchanged (frozen): a 'same' record, nothing to store
            continue
        x = (a ^ b).view(np.uint8).reshape(-1, 4)[:, ::-1]
        zero[kind] = zero.get(kind, 0) + (np.unpackbits(x, axis=1) == 0).sum(0)
        count[kind] = count.get(kind, 0) + a.size
        d = np.abs(a.astype(np.int64) - b.astype(np.int64))
        lengths.setdefault(kind, []).append(np.ceil(np.log2(d + 1)))
    return {kind: {"xor_zero_fraction_by_bit": [round(float(v), 3)
                                                for v in zero[kind] / count[kind]],
                   "median_changed_bits": float(np.median(np.concatenate(lengths[kind]))),
                   "elements": count[kind]} for kind in zero}


def alt_codecs(base_dir: Path, model: GPT, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Other schemes on the same (base, new) pairs: XOR + byte planes (the first codec), XOR
    + zstd without the byte planes, the integer difference with bit planes, and plain zstd of
    the full checkpoint's data file; bytes by state."""
    from trainer.checkpoint.delta import split_planes, sub_zigzag
    from trainer.checkpoint.delta_dcp import BaseCheckpoint, tensor_bytes

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
    schemes: dict[str, dict[str, int]] = {"xor_byte_planes": {}, "sub_bit_planes": {}}
    bit_s = 0.0
    pairs: list[tuple[bytes, bytes]] = []  # (chunk, difference), byte planes: zstd's settings
    from torch.distributed.checkpoint.metadata import MetadataIndex

    for fqn, t in flat.items():
        raw = tensor_bytes(t)
        kind = state_kind(fqn)
        b = base.chunk(MetadataIndex(fqn, [0] * t.dim()), t.dtype, t.shape)
        if b is None:
            xor_plain += HEADER.size + len(zc.compress(raw.tobytes()))
            continue
        if np.array_equal(raw, b):
            xor_plain += HEADER.size
            continue
        x = np.bitwise_xor(raw, b)
        xor_plain += HEADER.size + len(zc.compress(x.tobytes()))
        size = t.element_size()
        xs = schemes["xor_byte_planes"]
        xs[kind] = xs.get(kind, 0) + HEADER.size + len(zc.compress(split_planes(x, size)))
        if size in (2, 4, 8):
            pairs.append((split_planes(raw, size), split_planes(sub_zigzag(raw, b, size), size)))
            t0 = time.perf_counter()
            planes = bit_planes(sub_zigzag(raw, b, size), size)
            bit_s += time.perf_counter() - t0
            ss = schemes["sub_bit_planes"]
            ss[kind] = ss.get(kind, 0) + HEADER.size + len(zc.compress(planes))
    base.close()
    plain = sum(len(zc.compress(p.read_bytes())) for p in base_dir.glob("__*"))
    # zstd's settings on the changed tensors, chunk alone vs difference: a codec-only change
    levels: dict[str, Any] = {}
    for name, params in (("1", {"level": 1}), ("3", {"level": 3}), ("9", {"level": 9}),
                         ("19", {"level": 19}),
                         ("3-long", {"compression_params": zstandard.ZstdCompressionParameters
                                     .from_level(3, enable_ldm=True, window_log=27)})):
        z = zstandard.ZstdCompressor(**params)
        t0 = time.perf_counter()
        alone = sum(len(z.compress(c)) for c, _ in pairs)
        diff = sum(len(z.compress(d)) for _, d in pairs)
        levels[name] = {"chunks_alone_bytes": alone, "differences_bytes": diff,
                        "ratio": alone / diff, "s": time.perf_counter() - t0}
    return {"xor_zstd_no_planes_bytes": xor_plain, "base_plain_zstd_bytes": plain,
            "changed_tensors_by_scheme": schemes, "bit_planes_split_s": bit_s,
            "zstd_levels_changed_tensors": levels}


@contextlib.contextmanager
def previous_codec() -> Any:
    """Deltas written as the first codec wrote them (XOR + byte planes + zstd; non-tensor
    values stored whole every time), to compare with in the same run."""
    import trainer.checkpoint.delta_dcp as dd
    from trainer.checkpoint.delta import SAME, XOR, encode_bytes, encode_tensor, split_planes

    def xor_record(new: Any, base: Any, itemsize: int, level: int = 3, *,
                   bf16: bool = False) -> bytes:
        a = np.frombuffer(new, dtype=np.uint8)
        if base is None:
            return encode_tensor(new, None, itemsize)
        b = np.frombuffer(base, dtype=np.uint8)
        if np.array_equal(a, b):
            return HEADER.pack(b"SFD1", SAME, itemsize, 0, a.size, 0)
        payload = zstandard.ZstdCompressor(level=level).compress(
            split_planes(np.bitwise_xor(a, b), itemsize))
        return HEADER.pack(b"SFD1", XOR, itemsize, 0, a.size, len(payload)) + payload

    saved = dd.encode_tensor, dd.encode_bytes
    dd.encode_tensor, dd.encode_bytes = xor_record, lambda value, base=None: encode_bytes(value)
    try:
        yield
    finally:
        dd.encode_tensor, dd.encode_bytes = saved


WRITES = ("full", "full_codec", "delta", "delta_previous_codec", "delta_bf16_moments")


def timed_writes(saved_state: dict[str, Any], base_dir: Path, root: Path, rounds: int
                 ) -> tuple[dict[str, list[float]], dict[str, Path]]:
    """Write times, interleaved (medians of ``rounds``): full DCP, full with the delta's codec
    and no base, the delta, the delta with the first codec, the lossy delta. The first round's
    directories are kept (returned)."""
    times: dict[str, list[float]] = {k: [] for k in WRITES}
    kept: dict[str, Path] = {}
    for r in range(rounds):
        for kind in WRITES:
            out = root / f"w-{kind}-{r}"
            t0 = time.perf_counter()
            if kind == "full":
                dcp.save(saved_state, storage_writer=dcp.FileSystemWriter(str(out)))
            elif kind == "full_codec":
                dcp.save(saved_state, storage_writer=delta_writer(
                    resolve(str(out)), str(out), None, {}))
            elif kind == "delta_previous_codec":
                with previous_codec():
                    dcp.save(saved_state, storage_writer=delta_writer(
                        resolve(str(out)), str(out), resolve(str(base_dir)), {}))
            else:
                dcp.save(saved_state, storage_writer=delta_writer(
                    resolve(str(out)), str(out), resolve(str(base_dir)), {},
                    moments="bf16" if kind == "delta_bf16_moments" else "exact"))
            times[kind].append(time.perf_counter() - t0)
            if r == 0:
                kept[kind] = out
            else:
                shutil.rmtree(out)
    return times, kept


def measure(preset: str, frozen: bool, warm_steps: int, gaps: list[int], rounds: int,
            work: Path) -> dict[str, Any]:
    model, opt, frozen_frac = build(preset, frozen)
    gen = torch.Generator().manual_seed(1)
    train(model, opt, warm_steps, gen)
    root = work / ("frozen" if frozen else "dense")
    ck = Checkpointer(str(root / "chain"), keep=1000, full_every=1000)
    ck.save(warm_steps, model, opt, {})  # the base: a full DCP checkpoint
    base_dir = root / "chain" / f"step-{warm_steps:08d}"
    base_live = live_state(model, opt)
    full_bytes = tensors_bytes(base_dir)
    sweep, step, at = [], warm_steps, {}
    for gap in sorted(gaps):
        train(model, opt, gap - (step - warm_steps), gen)
        step = warm_steps + gap
        ck.save(step, model, opt, {})
        d = root / "chain" / f"step-{step:08d}"
        sweep.append({"gap": gap, "delta_bytes": tensors_bytes(d)})
        if gap != args.gap:
            continue
        # everything else at this state: the same state with the delta's codec and no base
        # ("full, compressed with the same codec"), the other codecs, the write times
        model_sd, optim_sd = get_state_dict(model, opt)
        times, kept = timed_writes({"model": model_sd, "optim": optim_sd}, base_dir, root,
                                   rounds)
        at = {"gap": gap, "delta_dir": d, "live": live_state(model, opt), "times": times,
              "kept": kept, "alt": alt_codecs(base_dir, model, opt), "tied": tied_fqns(model)}
    gap, delta_dir, live, times = at["gap"], at["delta_dir"], at["live"], at["times"]
    full_z, tied = at["kept"]["full_codec"], at["tied"]
    full_compressed = tensors_bytes(full_z)
    previous = tensors_bytes(at["kept"]["delta_previous_codec"])
    lossy = lossy_delta(preset, frozen, base_dir, delta_dir, at["kept"]["delta_bf16_moments"],
                        live, full_compressed)
    # bitwise restore: full + delta into a fresh model and optimizer
    fresh, fresh_opt, _ = build(preset, frozen)
    load_checkpoint(str(delta_dir), fresh, fresh_opt)
    restored = live_state(fresh, fresh_opt)
    bitwise = restored.keys() == live.keys() and all(
        restored[k].dtype == live[k].dtype and torch.equal(restored[k], live[k]) for k in live)
    delta_bytes = tensors_bytes(delta_dir)
    tied_bytes = record_bytes(full_z, tied)
    return {
        "frozen_fraction": frozen_frac,
        "gap_steps": gap,
        "full_bytes": full_bytes,
        "full_compressed_bytes": full_compressed,
        "delta_bytes": delta_bytes,
        "ratio_vs_full_compressed": full_compressed / delta_bytes,
        "ratio_vs_full": full_bytes / delta_bytes,
        "delta_by_state": by_state(delta_dir),
        "full_compressed_by_state": by_state(full_z),
        # a tied matrix (the embedding and the LM head) is saved twice by DCP: in the full
        # checkpoint it counts twice, in a delta (same change twice) too
        "tied_duplicate": {"fqns": sorted(tied), "full_compressed_bytes": tied_bytes,
                           "delta_bytes": record_bytes(delta_dir, tied),
                           "ratio_vs_full_compressed_without_it":
                               (full_compressed - tied_bytes)
                               / (delta_bytes - record_bytes(delta_dir, tied))},
        "previous_codec": {  # XOR + byte planes, values whole: the first codec
            "delta_bytes": previous,
            "ratio_vs_full_compressed": full_compressed / previous,
            "delta_by_state": by_state(at["kept"]["delta_previous_codec"])},
        "bits": bit_analysis(base_live, live),
        "lossy_bf16_moments": lossy,
        **at["alt"],
        "write_s": {k: statistics.median(v) for k, v in times.items()},
        "write_s_all": times,
        "bitwise_restore": bool(bitwise),
        "sweep": [{**s, "ratio_vs_full_compressed": full_compressed / s["delta_bytes"]}
                  for s in sweep],
    }


def lossy_delta(preset: str, frozen: bool, base_dir: Path, delta_dir: Path, lossy_dir: Path,
                live: dict[str, torch.Tensor], full_compressed: int) -> dict[str, Any]:
    """The opt-in lossy delta (moments rounded to bfloat16), restored on its base: bytes,
    ratio, whether the weights (and everything but the moments) are bitwise, and the moments'
    largest relative error."""
    chain = lossy_dir.parent / "lossy-chain"  # the base and the lossy delta in its place
    shutil.copytree(base_dir, chain / base_dir.name)
    target = chain / delta_dir.name
    shutil.copytree(lossy_dir, target)
    for name in ("trainer.json", "rng", "delta.json", "COMPLETE"):
        src = delta_dir / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, target / name)
    fresh, fresh_opt, _ = build(preset, frozen)
    load_checkpoint(str(target), fresh, fresh_opt)
    restored = live_state(fresh, fresh_opt)
    shutil.rmtree(chain)
    moments = [k for k in live if k.endswith(("exp_avg", "exp_avg_sq"))]
    exact = [k for k in live if k not in moments]
    rel = 0.0
    for k in moments:
        a, b = restored[k].double(), live[k].double()
        rel = max(rel, float(((a - b).abs() / b.abs().clamp_min(1e-300)).max()))
    size = tensors_bytes(lossy_dir)
    return {"delta_bytes": size, "ratio_vs_full_compressed": full_compressed / size,
            "delta_by_state": by_state(lossy_dir),
            "weights_and_rest_bitwise": all(torch.equal(restored[k], live[k]) for k in exact),
            "moments_bitwise": all(torch.equal(restored[k], live[k]) for k in moments),
            "moments_max_relative_error": rel}


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
    labels, full, full_z, delta, lossy = [], [], [], [], []
    for name in ("dense", "frozen"):
        r = result[name]
        labels.append(name)
        full.append(r["full_bytes"] / 1e6)
        full_z.append(r["full_compressed_bytes"] / 1e6)
        delta.append(r["delta_bytes"] / 1e6)
        lossy.append(r["lossy_bf16_moments"]["delta_bytes"] / 1e6)
    x = np.arange(len(labels))
    b.bar(x - 0.3, full, 0.2, label="full DCP")
    b.bar(x - 0.1, full_z, 0.2, label="full, same codec")
    b.bar(x + 0.1, delta, 0.2, label=f"delta ({result['gap']} steps), lossless")
    b.bar(x + 0.3, lossy, 0.2, label="delta, moments bf16 (lossy, opt-in)")
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
    import os

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        dense = measure(args.preset, False, args.warm_steps, gaps, args.rounds, Path(tmp))
        frozen = measure(args.preset, True, args.warm_steps, gaps, args.rounds, Path(tmp))

    result = {
        "preset": args.preset, "model": PRESETS[args.preset], "batch": BATCH,
        "warm_steps": args.warm_steps, "gap": args.gap, "rounds": args.rounds,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "full_bytes": dense["full_bytes"],
        "full_compressed_bytes": dense["full_compressed_bytes"],
        "delta_bytes": dense["delta_bytes"],
        "frozen_full_compressed_bytes": frozen["full_compressed_bytes"],
        "frozen_delta_bytes": frozen["delta_bytes"],
        "bitwise_restore": dense["bitwise_restore"] and frozen["bitwise_restore"],
        "ratio_vs_full_compressed": dense["ratio_vs_full_compressed"],
        "frozen_ratio_vs_full_compressed": frozen["ratio_vs_full_compressed"],
        "lossy_bf16_moments": {
            name: {k: r["lossy_bf16_moments"][k] for k in (
                "delta_bytes", "ratio_vs_full_compressed", "weights_and_rest_bitwise",
                "moments_max_relative_error")} for name, r in (("dense", dense),
                                                               ("frozen", frozen))},
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
                  f" s, bitwise {r['bitwise_restore']}; moments bf16 (lossy) "
                  f"{r['lossy_bf16_moments']['delta_bytes']:,} "
                  f"({r['lossy_bf16_moments']['ratio_vs_full_compressed']:.2f}x)")
    return 0


args: argparse.Namespace

if __name__ == "__main__":
    raise SystemExit(main())
