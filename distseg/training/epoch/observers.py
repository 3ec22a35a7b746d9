"""The loop's observers: built once per launch, an ordered tuple called on every rank
in the same order (some observers make collectives), each keeping its own state.

An observer sees what the loop logs: each ``step`` record as it is written and each
``epoch`` record once it is written, plus the start of an epoch and the moment its
training time is taken. An observer that adds fields to the ``epoch`` record returns them
from ``epoch_fields`` (``records.epoch_record`` is the one place that gathers them).
Keras callbacks, Lightning callbacks and MONAI's event handlers are the model; there is
no event bus: the loop calls the hooks by name.

The observers: ``Timeline`` (Horovod's timeline over the second epoch's first steps, what
the ``comm`` field reports), ``board.Board`` (live TensorBoard scalars) and ``Console``
(rank 0's progress bar and epoch lines).
"""

from __future__ import annotations

import contextlib
import sys

from distseg.core import rundir, timeline
from distseg.parallel import distributed as dist


class Observer:
    """A do-nothing observer: an observer overrides the hooks it needs."""

    def on_run(self, record: dict) -> None:
        """This rank's ``run`` record, as written at the launch's start."""

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        """``epoch`` starts, with ``steps`` steps left to train in this launch."""

    def on_step(self, record: dict) -> None:
        """A ``step`` record of this rank, as the log has it."""

    def on_epoch_trained(self) -> None:
        """The epoch's steps are done and its training time taken."""

    def epoch_fields(self) -> dict:
        """Fields this observer adds to the epoch's ``epoch`` record."""
        return {}

    def on_epoch_end(self, record: dict) -> None:
        """This rank's ``epoch`` record, as written."""

    def on_epoch_closed(self) -> None:
        """The epoch's checkpoint is written (or was not due); training goes on next."""


class Timeline(Observer):
    """Horovod's timeline over the first ``timeline.TIMELINE_STEPS`` steps of a launch's
    second epoch (the first traces the step function) on 2 or more ranks: rank 0 reads
    it into the epoch's ``comm`` field (where the steps' time went). Nothing where
    ``HOROVOD_TIMELINE`` is not ``DYNAMIC`` (``dist.start_timeline``). The same
    decisions on every rank (no collective depends on them)."""

    def __init__(self, run_dir: str, ctx: dist.Context, first_epoch: int):
        self.run_dir, self.ctx = run_dir, ctx
        self.epoch = first_epoch + 1
        self.path: str | None = None
        self.steps = self.seen = 0
        self.comm: dict | None = None

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        self.path, self.comm, self.seen = None, None, 0
        self.steps = min(timeline.TIMELINE_STEPS, steps)
        if self.ctx.size < 2 or epoch != self.epoch or self.steps <= 0:
            return
        path = rundir.timeline_path(self.run_dir, epoch)
        self.path = path if dist.start_timeline(path) else None

    def on_step(self, record: dict) -> None:
        if self.path is None or self.seen >= self.steps:
            return
        self.seen += 1
        if self.seen == self.steps:
            dist.stop_timeline()

    def on_epoch_trained(self) -> None:
        # After the epoch's training time is taken: parsing it is not training.
        if self.path is not None and self.ctx.is_root():
            self.comm = timeline.record(self.path, self.steps)

    def epoch_fields(self) -> dict:
        return {} if self.comm is None else {"comm": self.comm}


class Console(Observer):
    """Rank 0's voice: a progress bar over the launch's steps, a line per epoch, and
    the loop's messages (``say``). Silent on the other ranks."""

    def __init__(self, bar=None):
        self.bar = bar

    @classmethod
    def open(cls, ctx: dist.Context, total: int, done: int,
             resources: contextlib.ExitStack) -> "Console":
        """Rank 0's bar of ``total`` steps, ``done`` of them already trained; closed by
        ``resources``."""
        if not ctx.is_root():
            return cls()
        from tqdm import tqdm
        bar = tqdm(total=total, initial=done, unit="step", file=sys.stderr, dynamic_ncols=True,
                   mininterval=0.5, desc=f"train x{ctx.size}")
        resources.callback(bar.close)
        return cls(bar)

    def say(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message)

    def set_left(self, steps: int) -> None:
        """``steps`` steps are left from here (a new batch changes the count)."""
        if self.bar is not None:
            self.bar.total = self.bar.n + steps

    def on_step(self, record: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(epoch=record["epoch"], loss=f"{record['loss']:.4f}",
                                 lr=f"{record['lr']:.2e}", refresh=False)

    def on_epoch_end(self, record: dict) -> None:
        if self.bar is None:
            return
        dice = ", ".join(f"{k} {v:.3f}" for k, v in record["val_dice"].items() if v is not None)
        vloss = "n/a" if record["val_loss"] is None else f"{record['val_loss']:.4f}"
        self.say(f"epoch {record['epoch']}: {record['epoch_time']:.1f} s, train loss "
                 f"{record['train_loss']:.4f}, val loss {vloss}, val Dice {dice or 'n/a'}")
