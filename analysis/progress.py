"""Steps and samples a run trained on up to any step: the inputs of statistical
efficiency (``analysis.stateff``).

The model that logged step ``s`` of epoch ``e`` in launch ``S`` was trained on each
step before it once, in the latest launch that ran it: a resumed (or elastic) launch
restarts at a checkpoint and runs the steps after it again, undoing what earlier
launches had logged beyond it. Positions in training are compared in epochs
(``epoch + step / steps per epoch`` of the launch), so launches at different sizes,
whose steps differ in size, line up at the epoch boundaries they resume from::

    samples to (S, e, s) = the global samples of every step of launch S up to (e, s)
        + of every step of launch k < S before cut(k),
    cut(S - 1) = where launch S starts,  cut(k) = min(cut(k + 1), where launch k + 1 starts)

A target crossed before a kill counts the killed launch's steps, one crossed after
the resume counts the redone steps once, and a launch on fewer ranks counts its own
batches. ``steps`` counts the steps on that trajectory (``global_step + 1`` for a run
that never changed size: global steps count from 0, and the crossing step's batch is
included).

Each rank's log arrives reduced to its samples per step, run-length encoded
(``reduce.sample_runs``: a few rows an epoch), and is added at once into running sums
per launch and step (``SampleSum``) and freed, so memory grows with the steps of the
run (16 bytes each), not with ranks x steps; ``SampleSum.trajectory`` then gives the
global samples per launch and step (``Trajectory``). Where a launch's step has records
from fewer ranks than the launch had (a missing log, lost lines) its samples are
scaled up by size / ranks logged, as the per-epoch totals are; a step that no rank
logged counts as the mean of the others. Both are noted.

Imports only the report's document module, so ``logs`` can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np
import pandas as pd

from analysis.document import Note


@dataclass(frozen=True)
class Trained:
    """What a run had trained on by a step, all ranks together.

    Attributes:
      steps: steps on the trajectory up to and including that step (0: none).
      samples: real samples (logged batch sizes) of all ranks (NaN: not logged).
      made_up: steps among them that no rank logged (their samples made up).
    """

    steps: int = 0
    samples: float = math.nan
    made_up: int = 0


@dataclass(frozen=True)
class LaunchSamples:
    """Global samples per step of one launch.

    Attributes:
      spe: steps per epoch of the launch (a step's position is ``epoch x spe + step``).
      first: the position of its first step.
      samples: samples of all ranks at positions ``first``, ``first + 1``, ... (NaN: no
        rank logged that step, or none logged its samples).
      epoch_last: epoch -> the last step any rank logged in it.
    """

    spe: int
    first: int
    samples: np.ndarray
    epoch_last: dict[int, int]

    @property
    def end(self) -> int:
        """One past the position of its last step."""
        return self.first + len(self.samples)


@dataclass
class Trajectory:
    """Every launch's ``LaunchSamples`` (``None``: a launch without step records).

    Attributes:
      launches: indexed by launch number.
      scaled: launches whose steps were scaled up for ranks without records.
    """

    launches: list[LaunchSamples | None] = field(default_factory=list)
    scaled: list[int] = field(default_factory=list)

    def at(self, segment: int, epoch: int, step: int) -> Trained:
        """Steps and samples trained on up to ``step`` of ``epoch`` in launch ``segment``
        (``Trained()`` when that launch logged no steps)."""
        here = self.launches[segment] if 0 <= segment < len(self.launches) else None
        if here is None or epoch < 0 or step < 0:
            return Trained()
        total, counted, steps = 0.0, 0, 0
        stop, start = epoch * here.spe + step + 1, math.inf  # start: in epochs
        earliest = here
        for launch in reversed(self.launches[:segment + 1]):
            if launch is None:
                continue
            if launch is not here:
                stop = math.ceil(start * launch.spe - 1e-9)
            valid = launch.samples[:max(0, min(stop, launch.end) - launch.first)]
            known = valid[np.isfinite(valid)]
            total, counted, steps = total + float(known.sum()), counted + len(known), \
                steps + len(valid)
            start, earliest = min(start, launch.first / launch.spe), launch
        steps += round(start * earliest.spe)  # before the first step logged: made up
        if not counted:
            return Trained(steps, math.nan, steps)
        return Trained(steps, total * steps / counted, steps - counted)

    def last(self) -> Trained:
        """What the run trained on by its last step record."""
        for k in reversed(range(len(self.launches))):
            launch = self.launches[k]
            if launch is not None:
                position = launch.end - 1
                return self.at(k, position // launch.spe, position % launch.spe)
        return Trained()

    def epoch_end(self, segment: int, epoch: int) -> Trained:
        """What the run trained on by the last step of ``epoch`` in launch ``segment``."""
        launch = self.launches[segment] if 0 <= segment < len(self.launches) else None
        if launch is None or epoch not in launch.epoch_last:
            return Trained()
        return self.at(segment, epoch, launch.epoch_last[epoch])


class _Sums:
    """Running sums of one launch: samples and ranks per step position, as
    differences (a run of steps adds at its first position and subtracts after its
    last), over positions ``[first, first + len(total) - 1)`` (the steps any rank
    logged, with or without samples)."""

    def __init__(self, spe: int):
        self.spe, self.first = spe, None
        self.total, self.ranks = np.zeros(1), np.zeros(1, np.int64)
        self.epoch_last: dict[int, int] = {}

    def cover(self, first: int, end: int) -> None:
        """Widens the arrays to hold positions ``[first, end)``."""
        if self.first is None:
            self.first = first
        lo, hi = min(first, self.first), max(end, self.first + len(self.total) - 1)
        if (lo, hi) == (self.first, self.first + len(self.total) - 1):
            return
        total, ranks = np.zeros(hi - lo + 1), np.zeros(hi - lo + 1, np.int64)
        at = self.first - lo
        total[at:at + len(self.total)], ranks[at:at + len(self.ranks)] = self.total, self.ranks
        self.first, self.total, self.ranks = lo, total, ranks

    def add(self, runs: pd.DataFrame) -> None:
        """Adds one rank's runs of this launch."""
        epoch = runs["epoch"].to_numpy(np.int64)
        last = runs.groupby("epoch")["last"].max()
        for e, s in zip(last.index, last.to_numpy()):
            self.epoch_last[int(e)] = max(self.epoch_last.get(int(e), -1), int(s))
        a = epoch * self.spe + runs["first"].to_numpy(np.int64)
        b = epoch * self.spe + runs["last"].to_numpy(np.int64) + 1
        self.cover(int(a.min()), int(b.max()))
        known = np.isfinite(runs["samples"].to_numpy(np.float64))
        samples = runs["samples"].to_numpy(np.float64)[known]
        a, b = a[known] - self.first, b[known] - self.first
        np.add.at(self.total, a, samples)
        np.add.at(self.total, b, -samples)
        np.add.at(self.ranks, a, 1)
        np.add.at(self.ranks, b, -1)

    def launch(self, size: int | None) -> tuple[LaunchSamples, bool]:
        """The launch's samples per step, scaled to ``size`` ranks (``None``: the most
        that logged a step); whether any step needed it."""
        total, ranks = np.cumsum(self.total)[:-1], np.cumsum(self.ranks)[:-1]
        size = size or int(ranks.max(initial=0))
        with np.errstate(divide="ignore", invalid="ignore"):
            samples = np.where(ranks > 0, total * size / ranks, np.nan)
        scaled = bool(((ranks > 0) & (ranks < size)).any())
        return LaunchSamples(self.spe, self.first, samples, dict(self.epoch_last)), scaled


@dataclass
class SampleSum:
    """Every rank's samples per launch and step, added one rank at a time (``add``),
    keyed by launch (any hashable key: ``logs`` uses ``summary.launch_keys``, the
    ``run`` records' start time and run id).

    Attributes:
      sums: launch key -> its running sums.
    """

    sums: dict = field(default_factory=dict)

    def add(self, keys: Sequence[Hashable], spe: Sequence[int | None],
            runs: pd.DataFrame | None) -> None:
        """Adds one rank's ``reduce.sample_runs``, whose ``segment`` indexes ``keys`` and
        ``spe`` (steps per epoch of each of the rank's launches; ``None``: not logged,
        the rank's most steps in an epoch of that launch)."""
        if runs is None or not len(runs):
            return
        for segment, group in runs.groupby("segment"):
            key = keys[int(segment)]
            if key not in self.sums:
                steps = spe[int(segment)] or int(group["last"].max()) + 1
                self.sums[key] = _Sums(int(steps))
            self.sums[key].add(group)

    def trajectory(self, order: Sequence[Hashable], sizes: Sequence[int | None]) -> Trajectory:
        """The ``Trajectory`` of the launches ``order`` (keys, in launch order) of
        ``sizes`` ranks each."""
        out = Trajectory(launches=[None] * len(order))
        for k, key in enumerate(order):
            if key in self.sums and self.sums[key].first is not None:
                out.launches[k], scaled = self.sums[key].launch(sizes[k])
                if scaled:
                    out.scaled.append(k)
        return out


def at_crossings(path: Trajectory, crossings: pd.DataFrame) -> pd.DataFrame:
    """``steps``, ``samples`` and ``made_up`` at each crossing that was reached (NaN
    or 0 for the others), in the order of ``crossings``."""
    rows = [path.at(int(c["segment"]), int(c["epoch"]), int(c["step"])) if c["reached"]
            else None for _, c in crossings.iterrows()]
    return pd.DataFrame({"steps": [r.steps if r else math.nan for r in rows],
                         "samples": [r.samples if r else math.nan for r in rows],
                         "made_up": [r.made_up if r else 0 for r in rows]},
                        index=crossings.index)


def at_epochs(path: Trajectory, epochs: pd.DataFrame) -> pd.DataFrame:
    """Steps and samples trained on by the end of each logged epoch: its last step in
    the launch whose ``epoch`` record the report uses (the latest).

    Args:
      path: the run's ``Trajectory``.
      epochs: ``RunData.epochs`` (``epoch``, ``segment`` per rank).

    Returns:
      One row per epoch: ``epoch``, ``segment``, ``steps``, ``samples``, ``made_up``.
    """
    cols = ["epoch", "segment", "steps", "samples", "made_up"]
    if not len(epochs):
        return pd.DataFrame(columns=cols)
    where = epochs.groupby("epoch", as_index=False)["segment"].max()
    rows = []
    for epoch, segment in zip(where["epoch"], where["segment"]):
        done = path.epoch_end(int(segment), int(epoch))
        rows.append({"epoch": int(epoch), "segment": int(segment),
                     "steps": done.steps if done.steps else math.nan,
                     "samples": done.samples, "made_up": done.made_up})
    return pd.DataFrame(rows, columns=cols)


def progress_notes(path: Trajectory, made_up: int, label: str) -> list[Note]:
    """What the samples to target rest on, when it is not every rank's every record."""
    notes = []
    if path.scaled:
        notes.append(Note("info", label, "samples to target: steps of launch(es) "
                          f"{', '.join(map(str, path.scaled))} logged by fewer ranks than "
                          "ran them are scaled up by ranks / ranks logged"))
    if made_up:
        notes.append(Note("info", label, f"samples to target: up to {made_up} step(s) "
                          "before a target have no step record with samples on any rank; "
                          "they count as the mean of the others"))
    return notes
