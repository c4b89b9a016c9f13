"""What the load-imbalance report costs a training step (issue 27 item 2; goal <= 1 %).

Two gloo processes (``torch.multiprocessing``), each with two DDP replicas of the same small
GPT: one plain, one with the report's probe attached (optimizer step hooks, the DDP comm hook,
the loop's clock reads and one ``all_gather`` every ``--every`` steps). Blocks of ``--every``
steps alternate between the two (interleaved, so the shared machine's load hits both alike);
the result is the median block time of each and their ratio. Because a ~1 % effect is below
the noise of a busy 2-core machine, rank 0's CPU time per block is compared too (less
sensitive to other processes than wall time), and the probe's own cost is timed directly:
the per-step calls and the report's gather, as a share of the median step's CPU time.

    python benchmarks/imbalance_overhead.py [--blocks 20] [--every 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402


def worker(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.imbalance_probe import ImbalanceProbe
    from trainer.model import GPT, GPTConfig
    from trainer.optim import build_optimizer

    cfg = GPTConfig(vocab_size=2048, max_seq_len=64, n_layers=2, d_model=96, n_heads=4)
    runs = {}
    for name in ("off", "on"):
        torch.manual_seed(0)
        model = GPT(cfg)
        ddp = DDP(model)
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.1)
        probe = ImbalanceProbe(ddp, opt, world, torch.device("cpu"),
                               args.every if name == "on" else 0)
        runs[name] = (ddp, opt, probe)
    gen = torch.Generator().manual_seed(rank)
    clock = time.perf_counter
    step = 0

    def block(name: str) -> tuple[float, float]:
        nonlocal step
        ddp, opt, probe = runs[name]
        cpu_block = time.process_time()
        t_block = clock()
        step_end = clock()
        for _ in range(args.every):
            step += 1
            t0 = clock()
            x = torch.randint(0, cfg.vocab_size, (4, 64), generator=gen)
            probe.add_data(clock() - t0)
            t1 = clock()
            _, loss = ddp(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            probe.add_train_step(clock() - t1)
            now = clock()
            probe.add_step(now - step_end)
            step_end = now
            probe.report(step)  # every --every steps: the all_gather
        return clock() - t_block, time.process_time() - cpu_block

    block("off"), block("on")  # warm up both
    times: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(args.blocks):
        for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
            dist.barrier()
            wall, used = block(name)
            times[name].append(wall)
            cpu[name].append(used)
    # the probe's own cost, timed directly: its per-step calls and one report
    probe = runs["on"][2]
    n = 20_000
    t0 = clock()
    for _ in range(n):
        probe.add_data(0.001)
        probe.add_train_step(0.01)
        probe.add_step(0.012)
    per_step_calls = (clock() - t0) / n
    gathers = []
    for k in range(50):
        dist.barrier()
        t0 = clock()
        probe.report(args.every * (k + 1))
        gathers.append(clock() - t0)
    if rank == 0:
        queue.put({"times": times, "cpu": cpu, "per_step_calls_s": per_step_calls,
                   "gather_s": statistics.median(gathers)})
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=20, help="blocks per variant")
    p.add_argument("--every", type=int, default=50, help="--imbalance-every")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(2, port, args, queue), nprocs=2, join=True,
                       start_method="spawn")
    got = queue.get()
    off, on = (statistics.median(got["times"][k]) / args.every for k in ("off", "on"))
    cpu_off, cpu_on = (statistics.median(got["cpu"][k]) / args.every for k in ("off", "on"))
    direct = got["per_step_calls_s"] + got["gather_s"] / args.every
    result = {
        "every": args.every, "blocks": args.blocks, "load_average": os.getloadavg(),
        "step_s_off": off, "step_s_on": on, "ratio_on_off": on / off,
        "overhead_pct_measured": 100 * (on / off - 1),
        "probe_calls_per_step_s": got["per_step_calls_s"], "gather_s": got["gather_s"],
        "overhead_pct_direct": 100 * direct / off,
        "cpu_step_s_off": cpu_off, "cpu_step_s_on": cpu_on,
        "overhead_pct_cpu": 100 * (cpu_on / cpu_off - 1),
        "overhead_pct_direct_of_cpu_step": 100 * direct / cpu_off,
        "block_times": got["times"], "block_cpu": got["cpu"],
    }
    write_results("imbalance_overhead", result)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k in ("off", "on"):
        ax.plot([1000 * t / args.every for t in got["times"][k]], marker="o",
                label=f"report {k}: median {1000 * (off if k == 'off' else on):.2f} ms")
    ax.set_xlabel("block (interleaved)")
    ax.set_ylabel("ms/step")
    ax.set_title(f"imbalance report: wall {result['overhead_pct_measured']:+.1f} %, CPU "
                 f"{result['overhead_pct_cpu']:+.2f} %, direct "
                 f"{result['overhead_pct_direct_of_cpu_step']:.2f} % of a step's CPU",
                 fontsize="medium")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "imbalance_overhead.png", dpi=100)
    print(f"CPU per step (rank 0) off {1000 * cpu_off:.2f} ms, on {1000 * cpu_on:.2f} ms "
          f"({result['overhead_pct_cpu']:+.2f} %); direct cost "
          f"{result['overhead_pct_direct_of_cpu_step']:.2f} % of a step's CPU")
    print(f"step off {1000 * off:.2f} ms, on {1000 * on:.2f} ms (x{on / off:.3f}); probe calls "
          f"{1e6 * got['per_step_calls_s']:.1f} us/step, gather {1e3 * got['gather_s']:.2f} ms "
          f"per {args.every} steps: {result['overhead_pct_direct']:.3f} % of a step; load "
          f"{result['load_average'][0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
