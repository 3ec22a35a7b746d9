"""The rule that keeps a class's largest connected component, from per-case Dice.

One rule for every place that decides post-processing: ``distseg-predict --decide``
(one run's validation cases), the pooled decision of an ensemble of runs, and
``distseg-predict --cv CV --out-of-fold`` (each configuration's out-of-fold cases,
read back by ``distseg-report``). As nnU-Net decides it on its out-of-fold
predictions: a class keeps only its largest component where that raises the mean of
its Dice over the cases, strictly (an equal score keeps the prediction as the network
made it). Reducing one class to its largest component turns the voxels removed into
background, so the other classes' Dice does not change and each class is decided on
its own.

Plain Python: the report reads it without TensorFlow.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def class_mean(values: Iterable[float | None]) -> float | None:
    """The mean over the cases that have a Dice for the class (None or NaN: the class
    in neither the truth nor the prediction of that case, left out as nnU-Net does);
    None when no case has one."""
    known = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(known) / len(known) if known else None


def largest_component(names: Sequence[str], without: Sequence[float | None],
                      with_: Sequence[float | None]) -> dict[str, dict]:
    """Per foreground class ``names[i]``: whether to keep its largest component, with
    the two mean Dice behind the choice (``without[i]``, ``with_[i]``: ``class_mean``
    of the prediction as made and of the class reduced to its largest component)."""
    return {name: {"apply": bool(w is not None and o is not None and w > o),
                   "dice_without": o, "dice_with": w}
            for name, o, w in zip(names, without, with_)}
