"""What the epochs of one launch share (``Session``, built by ``loop.open_session``) and
what one epoch measured on this rank (``EpochResult``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distseg.core import config as config_lib
from distseg.core.errors import RunError
from distseg.core.stopflag import StopFlag
from distseg.data import feeds
from distseg.parallel import distributed as dist
from distseg.training import stopping
from distseg.training.checkpoints import resume
from distseg.training.epoch.modelparts import ModelPart
from distseg.training.epoch.observers import Console, Observer
from distseg.training.progress.plan import PlannedBatches
from distseg.training.progress.state import TrainingState
from distseg.training.runlog import RunLog
from distseg.training.step.factory import TrainSteps

Failure = tuple[str, int]


@dataclass
class Session:
    """The state the epochs of one launch share."""

    cfg: config_lib.Config
    """The run's one live config after start-up (``prepare.Prepared.cfg``): the other
    pieces take the values they need from it when built or called, and hold no copy."""
    ctx: dist.Context
    feed: feeds.Feed
    model: Any
    optimizer: Any
    synced: list
    """What every rank holds identically: weights and optimizer state."""
    reader: Any
    """The feed's reader (``data.SliceReader`` or ``volumes.SlabReader``)."""
    batches: PlannedBatches
    train_steps: TrainSteps
    eval_step: Any
    predict: Any
    """The compiled forward pass (sliding-window validation of volumes)."""
    log: RunLog
    t0: float
    """``perf_counter`` at the agreed start; log times count from here."""
    start_time: float
    """Unix time of the agreed start on rank 0's clock, the same on every rank."""
    stop: StopFlag
    training: TrainingState
    """The lr, batch and noise scale: what changes with progress."""
    console: Console
    parts: tuple[ModelPart, ...] = ()
    """The parts that change the model, in ``modelparts.ORDER``, called in that order
    on every rank."""
    observers: tuple[Observer, ...] = ()
    """The observers, called in this order on every rank."""
    watch: stopping.HangWatch | None = None
    """Times this rank's collectives."""
    resumed: resume.Resumed | None = None
    origin: tuple[int, int] = (0, 0)
    """(epoch, step) this launch trains from: a resumed checkpoint's position."""
    global_step: int = 0
    epochs_done: int = 0
    train_step: Any = None
    """The train step traced for the batch in force."""
    fresh: bool = True
    """The next step traces the train step (not timed for the policy; longer watch)."""
    elastic: Any | None = None
    """An elastic run's state, committed after each epoch's checkpoint."""
    link: dict | None = None
    """The link between the ranks as measured at the start (``prepare.measure_link``)."""
    precision: dict | None = None
    """``--precision auto``'s decision at the run's start (``precision.decide``)."""
    lr_find: dict | None = None
    """``--lr auto``'s range test at the run's start (``lrfind.find``)."""
    compression: dict | None = None
    """``--compression auto``'s decision at the run's start (``compression.decide``)."""

    @property
    def plan(self):
        """The epoch plan in force (``training.progress.plan``)."""
        return self.training.plan

    @property
    def class_names(self) -> list[str]:
        """The run's class names: the config's, which start-up filled from the data file
        (``feeds.open_feed``), so the logs name the classes as config.json does."""
        return list(self.cfg.model.class_names)


@dataclass
class EpochResult:
    """What one epoch of training measured on this rank."""

    epoch: int
    start: float
    seen: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    losses_local: list = field(default_factory=list)
    failure: Failure | None = None
    """This rank's first error, not yet raised: it rides on the next collective."""
    skipped: int = 0
    """Steps whose update every rank skipped (non-finite loss or gradient)."""
    elapsed_before: float = 0.0
    """Training seconds of this epoch spent by an earlier launch (resumed inside it)."""
    weights: list = field(default_factory=list)
    train_time: float = 0.0
    epoch_time: float = 0.0

    @classmethod
    def begin(cls, epoch: int, resumed: resume.Resumed | None,
              origin: tuple[int, int]) -> "EpochResult":
        """``epoch``'s result as its training starts now: a launch resumed inside it (at
        (epoch, step) ``origin``) starts from what its checkpoint had seen."""
        result = cls(epoch=epoch, start=time.perf_counter())
        carried = resumed.carried if resumed else None
        if carried is not None and epoch == origin[0] and origin[1]:
            result.seen.append(np.asarray(carried.seen, np.int64))
            result.losses.extend(carried.losses)
            result.losses_local.extend(carried.losses_local)
            result.elapsed_before = resumed.position.train_time
        return result

    def nonfinite(self, step: int, loss: float, on_nonfinite: str) -> None:
        """Some rank's loss or gradient was not finite at ``step``, so no rank applied
        its update: counted as skipped under ``train.on_nonfinite`` ``skip``, else every
        rank stops with the same message."""
        if on_nonfinite == "skip":
            self.skipped += 1
            return
        what = f"training loss is {loss}" if not math.isfinite(loss) else "a gradient is not finite"
        raise RunError(f"{what} at epoch {self.epoch} step {step}; lower --lr, check the data, "
                       "or pass --on-nonfinite skip")
