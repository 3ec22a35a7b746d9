"""Validating and saving an exponential moving average of the weights (``--weight-ema D``).

An average of the weights over the last steps (Polyak averaging; the
``ExponentialMovingAverage`` of TensorFlow and timm's model EMA) is a model of the same
run that does not move with each step's noise. Training itself is unchanged: the
optimizer steps the live weights; the average follows them. Off in every preset: on
LiTS 117's 3D folds at 2 ranks it did not steady validation, whose swings came from
BatchNorm statistics of one step's slabs, not from the weights
(docs/studies/recipe-real-ct-2026-11-27.md, "liver3d at 2 ranks: what swings").

How it runs, as a part that changes the model (``modelparts``, where its order is
declared):

- after every applied step, ``average = d * average + (1 - d) * weights`` with
  ``d = min(D, (1 + t) / (10 + t))`` at global step ``t`` (TensorFlow's rule: the
  first steps are not held back by the initial weights);
- when an epoch's steps are done (``before_validation``), the model takes the average's
  weights (the live ones kept aside) before precise BatchNorm and validation, so the
  statistics, the validation, the epoch's checkpoint (its weights file: what
  ``distseg-predict``, the best checkpoint and ``--export`` read) are all of the average;
- once the epoch's checkpoint is written (``after_checkpoint``), the live weights come
  back and training goes on.

Only the trainable weights are averaged. BatchNorm's moving statistics are whatever the
model holds (with ``--precise-bn``, recomputed for the averaged weights before each
validation: the presets that average also take it).

The average is the same on every rank (every rank updates it from the same weights),
so it is exact at any rank count. A checkpoint keeps it (``arrays``), and, when written
while the average is in the model, the live weights (``checkpoint.TRAINING_WEIGHTS``): a
resumed run continues both (``restore``: the average; ``checkpoint.load``: the live
weights back in the model before it is broadcast, so every rank and an elastic run's
commit hold them).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from distseg.parallel import agreement
from distseg.training.checkpoints import checkpoint
from distseg.training.epoch import modelparts

#: TensorFlow's ``ExponentialMovingAverage(num_updates=t)``: the decay at step t is at
#: most ``(1 + t) / (WARM + t)``.
WARM = 10.0
#: Names of the part's arrays in a checkpoint's state file (``arrays``): the average's,
#: and the live weights' (the weights training goes on from, which ``checkpoint.load``
#: puts back).
AVERAGE_KEY, LIVE_KEY = "weight_ema_", checkpoint.TRAINING_WEIGHTS


def decay_at(decay: float, global_step: int) -> float:
    """The decay of the update after step ``global_step`` under ``--weight-ema decay``."""
    return min(decay, (1.0 + global_step) / (WARM + global_step))


def arrays_of(prefix: str, arrays: dict) -> list[np.ndarray] | None:
    """``prefix``'s arrays of a checkpoint's state, in order (None: it has none)."""
    return checkpoint.numbered(arrays, prefix) or None


def _fit(what: str, values: Sequence[np.ndarray], variables: list) -> None:
    """Raises ``ValueError`` where ``values`` do not fit ``variables`` (count, shapes)."""
    if len(values) != len(variables):
        raise ValueError(f"the checkpoint's {what} holds {len(values)} variables, "
                         f"the model {len(variables)}")
    for i, (v, a) in enumerate(zip(variables, values)):
        if tuple(v.shape) != np.shape(a):
            raise ValueError(f"the checkpoint's {what} has shape {np.shape(a)} at variable "
                             f"{i}, the model {tuple(v.shape)}")


class WeightAverage(modelparts.ModelPart):
    """The part: the average of ``model``'s trainable weights under ``decay``, started from
    ``kept`` (a checkpoint's average; None: the weights now)."""

    key = modelparts.WEIGHT_AVERAGE

    def __init__(self, model, decay: float, kept: Sequence[np.ndarray] | None = None):
        import tensorflow as tf

        self.variables = list(model.trainable_variables)
        self.decay = decay
        start = kept if kept is not None else [v.numpy() for v in self.variables]
        _fit("weight average", start, self.variables)
        self.average = [tf.Variable(np.asarray(a, np.float32), trainable=False) for a in start]
        self.live: list[np.ndarray] | None = None
        """The live weights while the model holds the average (between an epoch's steps
        and its checkpoint)."""
        self._update = self._compiled_update()

    @classmethod
    def open(cls, train_cfg, model) -> "WeightAverage | None":
        """The part of a launch under ``train.weight_ema`` (None: off); a resumed
        checkpoint's average comes back through ``restore``."""
        if not train_cfg.weight_ema:
            return None
        return agreement.agree(cls, model, train_cfg.weight_ema)

    def _compiled_update(self):
        import tensorflow as tf

        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)], autograph=False)
        def update(d):
            for a, v in zip(self.average, self.variables):
                a.assign(d * a + (1.0 - d) * tf.cast(v.value, tf.float32))
            return d

        return update

    def on_step(self, record: dict) -> None:
        if not record.get("skipped"):
            self._update(np.float32(decay_at(self.decay, int(record["global_step"]))))

    def before_validation(self) -> None:
        """The model takes the average; the live weights are kept aside."""
        self.live = [v.numpy() for v in self.variables]
        for v, a in zip(self.variables, self.average):
            v.assign(a.numpy())

    def after_checkpoint(self) -> None:
        """The live weights back in the model: training goes on from them."""
        if self.live is not None:
            for v, value in zip(self.variables, self.live):
                v.assign(value)
            self.live = None

    def epoch_fields(self) -> dict:
        return {"weight_ema": {"decay": self.decay}}

    def arrays(self) -> dict:
        """What a checkpoint keeps: the average, and the live weights if the model holds
        the average now."""
        out = {f"{AVERAGE_KEY}{i}": a.numpy() for i, a in enumerate(self.average)}
        if self.live is not None:
            out.update({f"{LIVE_KEY}{i}": value for i, value in enumerate(self.live)})
        return out

    def restore(self, state: dict | None, arrays: dict) -> None:
        """The checkpoint's average (none kept: the weights now). The live weights it
        kept beside an average in its weights file are the model's already
        (``checkpoint.load``)."""
        average = arrays_of(AVERAGE_KEY, arrays)
        if average is not None:
            _fit("weight average", average, self.average)
            for a, value in zip(self.average, average):
                a.assign(np.asarray(value, np.float32))
