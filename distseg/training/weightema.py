"""Validating and saving an exponential moving average of the weights (``--weight-ema D``).

An average of the weights over the last steps (Polyak averaging; the
``ExponentialMovingAverage`` of TensorFlow and timm's model EMA) is a model of the same
run that does not move with each step's noise. Training itself is unchanged: the
optimizer steps the live weights; the average follows them. Off in every preset: on
LiTS 117's 3D folds at 2 ranks it did not steady validation, whose swings came from
BatchNorm statistics of one step's slabs, not from the weights
(docs/studies/recipe-real-ct-2026-11-27.md, "liver3d at 2 ranks: what swings").

How it runs, as one of the loop's parts (``observers``):

- after every applied step, ``average = d * average + (1 - d) * weights`` with
  ``d = min(D, (1 + t) / (10 + t))`` at global step ``t`` (TensorFlow's rule: the
  first steps are not held back by the initial weights);
- when an epoch's steps are done, the model takes the average's weights (the live ones
  kept aside) before precise BatchNorm and validation, so the statistics, the
  validation, the epoch's checkpoint (its weights file: what ``distseg-predict``, the
  best checkpoint and ``--export`` read) are all of the average;
- once the epoch's checkpoint is written, the live weights come back and training goes on.

Only the trainable weights are averaged. BatchNorm's moving statistics are whatever the
model holds (with ``--precise-bn``, recomputed for the averaged weights before each
validation: the presets that average also take it).

The average is the same on every rank (every rank updates it from the same weights),
so it is exact at any rank count. A checkpoint keeps it (``arrays``), and, when written
while the average is in the model, the live weights: a resumed run continues both.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from distseg.training import checkpoint
from distseg.training.observers import Observer

#: TensorFlow's ``ExponentialMovingAverage(num_updates=t)``: the decay at step t is at
#: most ``(1 + t) / (WARM + t)``.
WARM = 10.0
#: Names of the checkpoint arrays (``checkpoint.write``'s ``extra``).
AVERAGE_KEY, LIVE_KEY = "weight_ema_", "live_weight_"


def decay_at(decay: float, global_step: int) -> float:
    """The decay of the update after step ``global_step`` under ``--weight-ema decay``."""
    return min(decay, (1.0 + global_step) / (WARM + global_step))


def arrays_of(prefix: str, arrays: dict) -> list[np.ndarray] | None:
    """``prefix``'s arrays of a checkpoint's state, in order (None: it has none)."""
    return checkpoint.numbered(arrays, prefix) or None


class WeightAverage(Observer):
    """The part: the average of ``model``'s trainable weights under ``decay``, started from
    ``kept`` (a checkpoint's average; None: the weights now)."""

    def __init__(self, model, decay: float, kept: Sequence[np.ndarray] | None = None):
        import tensorflow as tf

        self.variables = list(model.trainable_variables)
        self.decay = decay
        start = kept if kept is not None else [v.numpy() for v in self.variables]
        if len(start) != len(self.variables):
            raise ValueError(f"the checkpoint's weight average holds {len(start)} variables, "
                             f"the model {len(self.variables)}")
        self.average = [tf.Variable(np.asarray(a, np.float32), trainable=False) for a in start]
        self.live: list[np.ndarray] | None = None
        """The live weights while the model holds the average (between an epoch's steps
        and its checkpoint)."""
        self._update = self._compiled_update()

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

    def on_epoch_trained(self) -> None:
        """The model takes the average; the live weights are kept aside."""
        self.live = [v.numpy() for v in self.variables]
        for v, a in zip(self.variables, self.average):
            v.assign(a.numpy())

    def on_epoch_closed(self) -> None:
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


def of(observers) -> WeightAverage | None:
    """The run's ``WeightAverage`` part (None: ``--weight-ema`` is off)."""
    return next((o for o in observers if isinstance(o, WeightAverage)), None)


def checkpoint_arrays(observers) -> dict:
    """The arrays the run's part adds to a checkpoint (none without the part)."""
    part = of(observers)
    return {} if part is None else part.arrays()
