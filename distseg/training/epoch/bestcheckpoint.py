"""The best checkpoint of a run, chosen as nnU-Net chooses it: by an exponential moving
average of the mean foreground validation Dice (weight ``EMA_WEIGHT`` on the old value,
the first epoch's Dice as its start), which one lucky epoch of a noisy validation set
cannot win alone.

``BestDice`` chooses the checkpoint to keep, so it is a part that changes what a run
leaves, not an observer (``modelparts.ModelPart``, the last of ``modelparts.ORDER``):
before the epoch's checkpoint it reads the ``epoch`` record's ``val_dice`` (the same on
every rank: it comes from validation's allreduce), updates the EMA, and marks a new best
when the EMA beats the best so far at an epoch whose checkpoint is due
(``checkpoint.is_due``). Its ``state()`` rides in that checkpoint (the manifest's
``parts``, ``modelparts.saved``): a marked state makes ``checkpoint.write`` point
``RUN/checkpoints/best.json`` at the checkpoint and keep it through rotation, and
``--resume`` continues the EMA from it exactly (``restore``).

Decision: only epochs whose checkpoint is due compete. With ``--checkpoint-every 1``
(the default) that is every epoch, as in nnU-Net; with N > 1 the best is the best of
the checkpointed epochs (the EMA still counts every epoch), so the flag keeps meaning
what it says about disk and time. A checkpoint written because a run was asked to stop
does not compete. No validation (``--no-validate``, or no validation cases): no EMA,
no ``best.json``, and ``distseg-predict`` takes the newest checkpoint.

Plain Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import math

from distseg.training.checkpoints import checkpoint
from distseg.training.epoch import modelparts
from distseg.training.epoch.observers import Console

#: nnU-Net's weight on the old value of the moving average.
EMA_WEIGHT = 0.9


def mean_foreground(val_dice: dict) -> float | None:
    """The mean Dice of the foreground classes (every class but the first, the
    background) that have one; None when none has (no validation, or no foreground
    voxel in truth or prediction)."""
    values = [d for d in list(val_dice.values())[1:] if d is not None and math.isfinite(d)]
    return sum(values) / len(values) if values else None


def ema_update(old: float | None, value: float, weight: float = EMA_WEIGHT) -> float:
    """The moving average after ``value``: ``value`` itself when there is none yet."""
    return value if old is None else weight * old + (1.0 - weight) * value


class BestDice(modelparts.ModelPart):
    """The EMA of the mean foreground validation Dice, and the best checkpoint by it.

    Args:
      epochs: the run's planned epochs (the last one's checkpoint is always due).
      every: ``train.checkpoint_every``.
      console: rank 0's console, for the line that names a new best.
      kept: a checkpoint's ``state()`` to continue (None: a new run, or a checkpoint
        written before the EMA was kept).
    """

    key = modelparts.BEST

    def __init__(self, epochs: int, every: int, console: Console | None = None,
                 kept: dict | None = None):
        self.epochs, self.every, self.console = epochs, every, console
        self.weight = EMA_WEIGHT
        self.ema: float | None = None
        self.best: dict | None = None
        """The best so far: epochs done, its EMA, its raw mean Dice and ``val_dice``."""
        self.mark = False
        """The epoch just ended is the new best: its checkpoint becomes ``best.json``'s."""
        self.restore(kept)

    @classmethod
    def open(cls, train_cfg, console: Console | None = None) -> "BestDice":
        """The part of a launch; a resumed checkpoint's state comes back through
        ``restore``."""
        return cls(train_cfg.epochs, train_cfg.checkpoint_every, console)

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        self.mark = False  # a checkpoint inside this epoch is no candidate

    def before_checkpoint(self, record: dict) -> None:
        dice = mean_foreground(record.get("val_dice") or {})
        if dice is None:
            return
        self.ema = ema_update(self.ema, dice, self.weight)
        done = int(record["epoch"]) + 1
        if not checkpoint.is_due(done, self.epochs, self.every):
            return
        if self.best is None or self.ema > self.best["ema"]:
            self.best = {"epoch": done, "ema": self.ema, "dice": dice,
                         "val_dice": dict(record["val_dice"])}
            self.mark = True
            if self.console is not None:
                self.console.say(f"best checkpoint: after {done} epoch(s), EMA of the mean "
                                 f"foreground Dice {self.ema:.4f} (this epoch {dice:.4f})")

    def state(self) -> dict:
        """What a checkpoint keeps (its manifest's ``parts``)."""
        return {"ema": self.ema, "weight": self.weight, "best": self.best, "mark": self.mark}

    def restore(self, state: dict | None, arrays: dict | None = None) -> None:
        """Continues ``state()`` as a checkpoint kept it."""
        if not state:
            return
        self.ema = state.get("ema")
        self.best = state.get("best")
        self.mark = False
