"""The load-imbalance report, the torch part: where the phase times come from, and the one
collective that brings them together (the verdict is :mod:`trainer.imbalance`).

* ``data``: the loop passes the time it blocked on the loader;
* ``optimizer``: ``optimizer.step`` timed by the optimizer's own step pre/post hooks;
* ``collective``: under DDP, a communication hook (the default all-reduce, wrapped) notes when
  each gradient bucket is ready and when its all-reduce completes; the exposed wait of a step
  is the last completion minus the last bucket ready (the end of this rank's backward). FSDP
  has no such hook: there this is 0 and the wait counts as compute;
* ``compute``: the rest of the step call: ``train_step`` time - optimizer - collective.

Every ``every`` steps each rank all-gathers :data:`~trainer.imbalance.WIDTH` floats (on the
training device) and every rank gets the same :class:`~trainer.imbalance.Report`; rank 0
logs it. Per step this costs a few clock reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.imbalance import WIDTH, PhaseMeter, Report, analyze


class ImbalanceProbe:
    def __init__(self, train_model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 world_size: int, device: torch.device, every: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.every = every
        self.enabled = every > 0 and world_size > 1 and dist.is_available() \
            and dist.is_initialized()
        self.world_size = world_size
        self.device = device
        self.clock = clock
        self.meter = PhaseMeter()
        self._opt_start = 0.0
        self._opt_s = 0.0
        self._ready = 0.0
        self._done = 0.0
        if not self.enabled:
            return
        optimizer.register_step_pre_hook(self._before_optimizer)
        optimizer.register_step_post_hook(self._after_optimizer)
        target = getattr(train_model, "_orig_mod", train_model)  # under torch.compile
        if isinstance(target, DistributedDataParallel):
            target.register_comm_hook(None, self._allreduce)

    # -- hooks -----------------------------------------------------------------------------

    def _before_optimizer(self, *_: Any) -> None:
        self._opt_start = self.clock()

    def _after_optimizer(self, *_: Any) -> None:
        self._opt_s += self.clock() - self._opt_start

    def _allreduce(self, state, bucket):  # noqa: ANN001, ANN202 - DDP checks annotations
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self._ready = max(self._ready, self.clock())

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            self._done = max(self._done, self.clock())
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    # -- what the loop calls ---------------------------------------------------------------

    def add_data(self, seconds: float) -> None:
        if self.enabled:
            self.meter.add("data", seconds)

    def add_train_step(self, seconds: float) -> None:
        """One ``train_step`` call took ``seconds``; split it."""
        if not self.enabled:
            return
        wait = max(0.0, self._done - self._ready) if self._ready else 0.0
        self.meter.add("optimizer", self._opt_s)
        self.meter.add("collective", wait)
        self.meter.add("compute", seconds - self._opt_s - wait)
        self._opt_s = self._ready = self._done = 0.0

    def add_step(self, wall_seconds: float) -> None:
        if self.enabled:
            self.meter.add_step(wall_seconds)

    def report(self, step: int) -> Report | None:
        """Every ``every`` steps: gather the ranks' rows and analyse them (collective: every
        rank calls it at the same steps)."""
        if not self.enabled or step % self.every:
            return None
        row = torch.tensor(self.meter.row(), dtype=torch.float64, device=self.device)
        rows = [torch.empty(WIDTH, dtype=torch.float64, device=self.device)
                for _ in range(self.world_size)]
        dist.all_gather(rows, row)
        self.meter.reset()
        return analyze(torch.stack(rows).cpu().tolist(), step)
