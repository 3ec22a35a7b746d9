"""The learning rate of every step: every rule in one place, and its one writer.

A step's lr is the base lr (``train.lr``, the one process's) times three things:

* the batch rule (``batch_factor``): how the lr grows with the global batch over the
  base batch it was set for: ``linear`` (Goyal et al. 2017), ``sqrt`` (Malladi et al.
  2022, for Adam), ``none``; the gain rules (``GAIN_RULES``) follow the measured gain
  of the batch instead (``gain_factor``);
* the warm-up (``warm_up``): linear from the base to that target;
* the schedule (``decay``): constant, cosine or poly after the warm-up, counted in
  samples of the run's planned horizon.

``at`` composes them for one step of an epoch plan; the training state
(``distseg.training.progress.state.TrainingState``) calls it with its clocks, and ``assign``
writes the result into the optimizer: the only place that does. Plain Python: the
report's projection and the benchmarks' emulation read the same rules.
"""

from __future__ import annotations

import math

#: nnU-Net's exponent of the ``poly`` schedule.
POLY_EXPONENT = 0.9

#: The lr rules that follow the measured gain r of the global batch over the base
#: batch: ``gain`` x sqrt(r) (AdaptDL's AdamScale for Adam), ``adascale`` x r
#: (AdaScale's rule for SGD, McCandlish et al.'s optimal step over the base batch's).
GAIN_RULES = ("gain", "adascale")

#: How each rule grows the lr with a growth x of the batch (or the gain r): the one
#: statement of the square-root and linear rules.
_GROWTH = {"linear": float, "adascale": float, "sqrt": math.sqrt, "gain": math.sqrt,
           "none": lambda x: 1.0}


def batch_factor(rule: str, growth: float) -> float:
    """What ``rule`` multiplies the base lr by for a global batch ``growth`` times the
    base batch; for the gain rules the most they can reach (the measured gain is at
    most the growth)."""
    return _GROWTH[rule](growth)


def gain_factor(gain: float, rule: str = "gain") -> float:
    """What a gain rule multiplies the base lr by once warmed up, at the measured gain
    r: sqrt(r) for ``gain``, r for ``adascale``; never below 1."""
    return _GROWTH[rule](max(gain, 1.0))


def warm_up(clock: float, base: float, target: float, steps: float) -> float:
    """Linear warm-up from the one process's ``base`` to the scaled ``target`` over
    ``steps`` (of any clock: steps, or gain-weighted steps)."""
    if steps <= 0 or clock >= steps:
        return target
    return base + (target - base) * clock / steps


def decay(schedule: str, trained: float, warm: float, horizon: float) -> float:
    """What the lr ``schedule`` multiplies the lr by after ``trained`` samples of a run
    planned for ``horizon`` samples whose warm-up lasts ``warm``: 1 through the warm-up,
    then ``cosine`` 0.5 (1 + cos(pi f)) or ``poly`` (1 - f)^0.9, f the share of the
    samples after the warm-up already trained (0 past the horizon); ``constant`` 1."""
    if schedule == "constant" or trained <= warm:
        return 1.0
    f = min(1.0, (trained - warm) / max(horizon - warm, 1.0))
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * f))
    return (1.0 - f) ** POLY_EXPONENT


def gain_lr(base: float, gain: float, progress: float, warmup: float,
            rule: str = "gain") -> float:
    """A gain rule's lr: ``base`` x ``gain_factor``, reached by a linear warm-up over
    ``warmup`` steps of the base batch counted in gain-weighted ``progress`` (each
    step adds its gain), so the warm-up lasts as many one-process samples at any
    batch."""
    return warm_up(progress, base, base * gain_factor(gain, rule), warmup)


def uses_gain(rule: str, global_batch: int, base: int) -> bool:
    """Whether the lr follows the measured gain: a gain rule past the base batch."""
    return rule in GAIN_RULES and global_batch > base


def at(plan, clock: float, gain: float = 1.0, progress: float = 0.0) -> float:
    """The lr of a step of epoch plan ``plan`` (``training.progress.plan.EpochPlan``) before the
    schedule: warmed up over ``clock`` steps of its batch, or, under a gain rule, from
    the measured ``gain`` and the gain-weighted ``progress``."""
    batch = plan.batch
    if uses_gain(batch.lr_scaling, batch.global_batch, batch.base):
        return gain_lr(plan.lr_base, gain, progress, plan.warmup_progress, batch.lr_scaling)
    return warm_up(clock, plan.lr_base, plan.lr_target, plan.warmup_steps)


def after_warm_up(base: float, plan, gain: float) -> float:
    """The lr a batch plan (``core.batchplan.BatchPlan``) sets once warmed up, before
    the schedule: ``base`` x its batch factor, or x ``gain_factor`` of the measured
    ``gain`` under a gain rule (the report's projection)."""
    if plan.lr_scaling in GAIN_RULES:
        return base * gain_factor(gain, plan.lr_scaling)
    return base * plan.lr_factor


def assign(optimizer, lr: float) -> None:
    """Sets the optimizer's lr: every write of it (the run's steps, the lr range test's
    sweep and its result) goes through here."""
    optimizer.learning_rate.assign(lr)
