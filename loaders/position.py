"""Where a ``build_dataloader`` loader stands: its layout and its progress through the epochs.

Three rules meet here, and each needs the others' facts:

- **The layout is taken when first needed**, not when the loader is built (see
  :mod:`loaders.world`): from the process group once one exists, refused while none exists
  in a job whose ``WORLD_SIZE`` says several processes. Without a group or ``WORLD_SIZE`` the
  loader is one process (rank 0 of 1) but keeps asking, so a group made later is still
  adopted; a part of an epoch read before then is only carried over where the elastic rule
  allows it (same lanes, at a global batch boundary), and refused otherwise.
- **Re-iterating moves on.** After a whole pass the next ``iter()`` reads the next epoch
  (what litdata and MosaicML streaming do: Lightning calls ``set_epoch`` only on a sampler,
  so a loader that replayed its epoch trained every epoch on one order), unless
  ``set_epoch`` chose an epoch since: another epoch, or the finished one again from its
  start. An epoch read in part (a loop left early, a loaded state) continues where it stopped.
- **A state loaded before the layout can be taken** (no group yet, ``WORLD_SIZE`` > 1) is
  kept until it can: its plan is checked against lanes known only then. Its position counts
  at once (``state_dict``, ``set_epoch`` and ``epoch`` see it).

Progress is one :class:`loaders.plan.Progress` value in units of the layout it was counted
in; batches are counted as handed out (``handed``) and folded in when it is read.
"""

from __future__ import annotations

from typing import Any

from loaders import plan
from loaders.plan import Layout, Progress
from loaders.source import Source, resume_on_saved_plan
from loaders.state import LoaderStateError, check_state, make_state
from loaders.world import LayoutSpec, WorldNotReadyError, group_rank_world, rank_world


class Position:
    """The layout, progress and any state waiting for a layout, of one loader."""

    def __init__(self, source: Source, spec: LayoutSpec) -> None:
        self.source = source
        self.spec = spec
        #: the layout the progress counts in (None until one was needed)
        self.current: Layout | None = None
        self.lane_len = 0  # samples per lane of ``current``'s plan
        self.pinned = False  # ``current`` is final: given, or the process group's
        #: samples handed out by the loader, ever: written only by the iterating thread
        self.handed = 0
        self._progress, self._folded = Progress(), 0
        self.pending: dict[str, Any] | None = None  # a state loaded before any layout
        if spec.fixed:
            self._use(spec.make(spec.rank, spec.world_size))  # type: ignore[arg-type]
            self.pinned = True

    # -- progress ------------------------------------------------------------------------

    @property
    def progress(self) -> Progress:
        """Where the epoch stands, batches handed out so far included (folded when read:
        consuming ``a`` then ``b`` samples is consuming ``a + b``)."""
        handed = self.handed
        if handed != self._folded:
            assert self.current is not None, "batches were handed out without a layout"
            self._progress = plan.advance(self._progress, self.current, self.lane_len,
                                          handed - self._folded)
            self._folded = handed
        return self._progress

    @progress.setter
    def progress(self, value: Progress) -> None:
        self._progress, self._folded = value, self.handed

    def finished(self) -> bool:
        """The current epoch was read to its end."""
        p = self.progress
        if not p.lane_pos:
            return False
        if self.pending is not None:
            lanes = self.pending["plan"]["lanes"]
            return p.lane_pos >= self.source.lane_length(lanes)
        return p.lane_pos >= self.lane_len

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads ``epoch``: from its start, unless it is the epoch read
        in part now (which continues; a finished one starts again)."""
        if epoch != self.progress.epoch or self.finished():
            self.progress = Progress(epoch)

    def start_pass(self) -> tuple[Layout, Progress]:
        """The layout and progress an iteration starts from: the next epoch after a whole
        one (the re-iteration rule)."""
        layout = self.layout()
        if self.finished():
            self.progress = self.progress.next_epoch()
        return layout, self.progress

    def remaining(self) -> int:
        layout = self.layout()
        return plan.rank_batches(self.lane_len, layout, self.progress)

    def epoch_batches(self) -> int:
        layout = self.layout()
        return plan.rank_batches(self.lane_len, layout, Progress(self.progress.epoch))

    # -- the layout ----------------------------------------------------------------------

    def layout(self) -> Layout:
        """This rank's layout: the given one, or the process group's once it exists (kept
        from then on); rank 0 of 1 without a group in a job of one process;
        :class:`loaders.world.WorldNotReadyError` while there is no group in a job of
        several."""
        if self.pinned:
            assert self.current is not None
            return self.current
        group = group_rank_world()
        rank, world = group if group is not None else rank_world("this loader")
        layout = self.spec.make(rank, world)
        if layout != self.current or self.pending is not None:
            self._use(layout)
        self.pinned = group is not None
        return layout

    def _use(self, layout: Layout) -> None:
        progress = self.progress  # folded in the layout it was counted in
        old, old_len = self.current, self.lane_len
        lane_len = self.source.lane_length(layout.lanes)
        moved = old is not None and layout != old and self.pending is None
        if moved and (progress.lane_pos or progress.into_step):
            if old_len and progress.lane_pos >= old_len:  # a finished epoch stays finished
                progress = Progress(progress.epoch, lane_len)
            elif old.lanes != layout.lanes or (
                    progress.into_step
                    and progress.mid_step_layout != (layout.world_size, layout.batch)):
                raise WorldNotReadyError(
                    f"this loader read part of epoch {progress.epoch} as rank {old.rank} of "
                    f"{old.world_size} (no process group existed) and now finds rank "
                    f"{layout.rank} of {layout.world_size}, on another plan: iterate it "
                    "only once the process group exists, or pass rank= and world_size=")
        self.current, self.lane_len = layout, lane_len
        self.progress = progress
        if self.pending is not None:  # kept until it applies: a refused one stays refused
            self._apply(self.pending, layout, keep=progress)
            self.pending = None

    # -- state ---------------------------------------------------------------------------

    def plan_identity(self, layout: Layout) -> dict[str, Any]:
        return {**self.source.plan_identity(layout.lanes), "lanes": layout.lanes}

    def state_dict(self) -> dict[str, Any]:
        try:
            layout = self.layout()
        except WorldNotReadyError:
            if self.pending is None:
                raise
            return make_state(self.progress, self.pending["plan"])
        return make_state(self.progress, self.plan_identity(layout))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            layout = self.layout()
        except WorldNotReadyError:
            self.progress = _waiting_state(state)
            self.pending = state
            return
        self._apply(state, layout)

    def _apply(self, state: dict[str, Any], layout: Layout, keep: Progress | None = None
               ) -> None:
        """Continue ``state`` on ``layout``: on its plan where the settings left a choice open
        (``run_blocks`` unset takes the state's), any other difference refused. ``keep``:
        the progress now, kept when ``set_epoch`` replaced the state's since it was loaded."""
        try:
            source, progress = resume_on_saved_plan(self.source, state, layout.lanes)
        except LoaderStateError as exc:
            if self.spec.fixed or group_rank_world() is not None:
                raise
            raise LoaderStateError(
                f"{exc} (no process group exists yet, so this loader counts as rank 0 of 1: "
                "load the state once the group exists, or pass rank= and world_size=)"
            ) from None
        if keep is not None and keep != progress:
            progress = keep
        here = (layout.world_size, layout.batch)
        if progress.into_step and progress.mid_step_layout != here:
            raise LoaderStateError(
                f"the state is {progress.into_step} samples into a global batch under (world "
                f"size, batch size) {progress.mid_step_layout}, not {here}: resume on another "
                "layout from a state taken at a global batch boundary")
        self.source, self.progress = source, progress


def _waiting_state(state: Any) -> Progress:
    """The progress in a state kept until a layout exists: what can be checked without one
    (a dict of this version, a plan with a lane count, the counts)."""
    if not isinstance(state, dict) or not isinstance(state.get("plan"), dict):
        raise LoaderStateError(f"loader state is {type(state).__name__} without a 'plan' dict")
    lanes = state["plan"].get("lanes")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise LoaderStateError(f"loader state field 'plan.lanes' is {lanes!r:.40}, not a "
                               "count of lanes")
    return check_state(state, dict(state["plan"]))
