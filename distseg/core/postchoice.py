"""The rules that decide test-time mirroring and keep a class's largest connected
component, from per-case Dice.

One pair of rules for every place that decides post-processing: ``distseg-predict --decide``
(one run's validation cases), the pooled decision of an ensemble of runs, and
``distseg-predict --cv CV --out-of-fold`` (each configuration's out-of-fold cases,
read back by ``distseg-report``). As nnU-Net decides it on its out-of-fold
predictions: mirroring is applied where it raises the mean foreground Dice (the mean
over the foreground classes of each class's mean over the cases), strictly, and then,
on the prediction so chosen, a class keeps only its largest component where that
raises the mean of its Dice over the cases, strictly (an equal score keeps the prediction as the network
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


def mirroring(plain: Sequence[float | None], mirror: Sequence[float | None]) -> dict:
    """Whether to mirror at test time, from each foreground class's mean Dice predicted
    plain (``plain[i]``) and mirrored (``mirror[i]``): where the mean over the classes
    rises, strictly (both means kept beside the choice, None where no class has one)."""
    mean_plain, mean_mirror = class_mean(plain), class_mean(mirror)
    apply = mean_plain is not None and mean_mirror is not None and mean_mirror > mean_plain
    return {"apply": bool(apply), "dice_plain": mean_plain, "dice_mirror": mean_mirror}


def largest_component(names: Sequence[str], without: Sequence[float | None],
                      with_: Sequence[float | None]) -> dict[str, dict]:
    """Per foreground class ``names[i]``: whether to keep its largest component, with
    the two mean Dice behind the choice (``without[i]``, ``with_[i]``: ``class_mean``
    of the prediction as made and of the class reduced to its largest component)."""
    return {name: {"apply": bool(w is not None and o is not None and w > o),
                   "dice_without": o, "dice_with": w}
            for name, o, w in zip(names, without, with_)}
