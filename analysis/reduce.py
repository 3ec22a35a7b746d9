"""Per-rank reductions of step records, made as soon as a rank's log is parsed.

A real allocation logs about 90 M step records (256 ranks x 350,000 steps, 22 GiB);
keeping them would make memory grow with the steps. Each rank's placed steps are
reduced instead, right after its file is parsed, to what the tables need:

* ``step_stats``: the rank-balance figures of the rank (steps, mean, median and
  largest step time, data wait), once over its steady steps and once over all its
  steps; ``tables.rank_balance`` picks one basis per run, as it did over all steps.
* ``reduce_curve``: the training-loss curve in wall-clock order, thinned to at most
  ``CURVE_POINTS`` records (a plot cannot show more), with the exact first crossing
  of every loss target by the raw and by the smoothed loss, found on every record
  before thinning.
* ``sample_runs``: the rank's samples per step, run-length encoded (a batch size
  changes at most twice an epoch); ``analysis.progress`` adds them up over ranks into
  the samples trained on up to any step.

None needs another rank, so files can be reduced in any order or in parallel, and
memory is bounded by one file plus a few kilobytes per rank. Imports nothing else of
``analysis`` but the model, so ``summary`` can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

#: Train-curve records kept per run (plus the last one): a figure ~1000 pixels wide
#: cannot show more, and ``loss_vs_time.csv`` stays small at any run length.
CURVE_POINTS = 20_000

STAT_COLUMNS = ["rank", "basis", "steps", "mean_step_s", "median_step_s", "max_step_s",
                "mean_data_wait_s", "data_wait_share"]


@dataclass(frozen=True)
class CurveSpec:
    """What the loss curve is reduced for (the report's options).

    Attributes:
      targets: ``--target-loss`` values; the first crossing of each is kept.
      smooth: ``--smooth`` window (0 or 1: raw values).
      points: most curve records kept (besides the last).
    """

    targets: tuple[float, ...] = ()
    smooth: int = 0
    points: int = CURVE_POINTS


def smoothed(loss: pd.Series, window: int) -> pd.Series:
    """Trailing mean over the last ``window`` step records (causal: no future values)."""
    if window <= 1:
        return loss.astype(float)
    return loss.rolling(window, min_periods=1).mean()


def _stats(steps: pd.DataFrame) -> pd.DataFrame:
    g = steps.groupby("rank")
    return pd.DataFrame({
        "steps": g.size(),
        "mean_step_s": g["step_time"].mean().astype(float),
        "median_step_s": g["step_time"].median().astype(float),
        "max_step_s": g["step_time"].max().astype(float),
        "mean_data_wait_s": g["data_wait"].mean().astype(float),
        "data_wait_share": (g["data_wait"].sum() / g["step_time"].sum()).astype(float),
    }).reset_index()


def step_stats(compact: pd.DataFrame) -> pd.DataFrame:
    """Rank-balance figures of one rank's compact steps (``summary.compact_steps``).

    One row with ``basis`` ``steady`` (steps after the warm-up epoch of each launch;
    absent when there are none) and one with ``basis`` ``all``. A group's statistics
    depend only on its own rows in file order, so they equal what a group-by over
    every rank of the run would give.
    """
    parts = []
    steady = compact[~compact["warmup"].to_numpy()]
    if len(steady):
        parts.append(_stats(steady).assign(basis="steady"))
    parts.append(_stats(compact).assign(basis="all"))
    return pd.concat(parts, ignore_index=True)[STAT_COLUMNS]


@dataclass(frozen=True)
class Crossing:
    """The first curve record at or below a loss target.

    Attributes:
      target: the target.
      window: the smoothing window (0: the raw loss).
      index: position in the full curve (``None``: not reached).
      segment, t, epoch, step, global_step: that record's (``segment`` as in the file).
    """

    target: float
    window: int
    index: int | None = None
    segment: int = -1
    t: float = math.nan
    epoch: int = -1
    global_step: int = -1
    step: int = -1

    @property
    def reached(self) -> bool:
        return self.index is not None


@dataclass
class RankCurve:
    """One rank's loss curve, reduced.

    Attributes:
      records: step records behind it (the placed steps of the rank).
      stride: every ``stride``-th record is kept in ``thin`` (and the last).
      thin: the kept records in wall-clock order: ``segment`` (local to the file),
        ``epoch``, ``step``, ``global_step``, ``t``, ``loss``, ``lr``, ``loss_smoothed``.
      crossings: the first crossing of each target, raw (window 0) and, with
        ``--smooth N``, smoothed (window N).
      loss_min: the lowest raw loss (NaN: none finite).
    """

    records: int
    stride: int
    thin: pd.DataFrame
    crossings: list[Crossing] = field(default_factory=list)
    loss_min: float = math.nan


def curve_order(seg_rank: np.ndarray, segment: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Wall-clock order of one file's curve records: launches in start order, then
    ``t`` within a launch (stable, so equal times keep file order).

    ``seg_rank`` maps the file's segment numbers to their launch's place in time.
    The run's wall clock lays launches end to end, each lasting at least its largest
    ``t``, so this is the order of ``offset + t`` without knowing the offsets.
    """
    return np.lexsort((t, seg_rank[segment]))


def first_at_or_below(values: np.ndarray, target: float) -> int | None:
    """Index of the first value ``<= target`` (NaN never is), or ``None``."""
    hit = values <= target
    i = int(np.argmax(hit)) if len(hit) else 0
    return i if len(hit) and hit[i] else None


def _crossing(curve: pd.DataFrame, values: np.ndarray, target: float, window: int) -> Crossing:
    i = first_at_or_below(values, target)
    if i is None:
        return Crossing(target, window)
    row = curve.iloc[i]
    return Crossing(target, window, i, int(row["segment"]), float(row["t"]), int(row["epoch"]),
                    int(row["global_step"]), int(row["step"]))


def thin_index(n: int, points: int) -> np.ndarray:
    """Every ``ceil(n / points)``-th of ``n`` positions, and the last."""
    stride = max(1, math.ceil(n / points)) if points > 0 else 1
    idx = np.arange(0, n, stride)
    if n and idx[-1] != n - 1:
        idx = np.append(idx, n - 1)
    return idx


def reduce_curve(curve: pd.DataFrame, seg_rank: np.ndarray, spec: CurveSpec) -> RankCurve:
    """Orders, smooths, finds the target crossings of, and thins one rank's curve.

    Args:
      curve: ``summary.curve_steps`` of the rank's placed steps (file order).
      seg_rank: the file's segment number -> its launch's place in time.
      spec: targets, smoothing window and resolution.
    """
    order = curve_order(seg_rank, curve["segment"].to_numpy(), curve["t"].to_numpy())
    curve = curve.iloc[order].reset_index(drop=True)
    curve["loss_smoothed"] = smoothed(curve["loss"], spec.smooth).to_numpy()
    raw = curve["loss"].to_numpy()
    crossings = [_crossing(curve, raw, target, 0) for target in spec.targets]
    if spec.smooth > 1:
        smooth = curve["loss_smoothed"].to_numpy()
        crossings += [_crossing(curve, smooth, target, spec.smooth) for target in spec.targets]
    finite = raw[np.isfinite(raw)]
    idx = thin_index(len(curve), spec.points)
    return RankCurve(records=len(curve), stride=int(idx[1] - idx[0]) if len(idx) > 1 else 1,
                     thin=curve.iloc[idx].reset_index(drop=True), crossings=crossings,
                     loss_min=float(finite.min()) if len(finite) else math.nan)


def crossing_table(crossings: Sequence[Crossing]) -> pd.DataFrame:
    """The crossings as a frame (``segment`` still as given)."""
    cols = ["target", "window", "reached", "segment", "t", "epoch", "step", "global_step"]
    return pd.DataFrame([{"target": c.target, "window": c.window, "reached": c.reached,
                          "segment": c.segment, "t": c.t, "epoch": c.epoch, "step": c.step,
                          "global_step": c.global_step} for c in crossings], columns=cols)



SAMPLE_RUN_COLUMNS = ["segment", "epoch", "first", "last", "samples"]


def sample_runs(segment: np.ndarray, epoch: np.ndarray, step: np.ndarray,
                samples: np.ndarray) -> pd.DataFrame:
    """One rank's samples per step, as runs of consecutive steps of one epoch of one
    launch with the same ``samples`` (NaN: not logged).

    A launch that logs a step twice counts its later record; records without an epoch
    or step are left out. Columns ``segment`` and ``epoch`` (as given), ``first`` and
    ``last`` (steps within the epoch, inclusive), ``samples`` (per step).
    """
    seg, ep, st, samples = _in_step_order(np.asarray(segment, np.int64),
                                          np.asarray(epoch, np.int64),
                                          np.asarray(step, np.int64),
                                          np.asarray(samples, np.float64))
    value = np.nan_to_num(samples, nan=-1.0)  # so that NaN == NaN within a run
    new = np.ones(len(st), bool)
    new[1:] = ((seg[1:] != seg[:-1]) | (ep[1:] != ep[:-1]) | (st[1:] != st[:-1] + 1)
               | (value[1:] != value[:-1]))
    last = np.append(np.flatnonzero(new)[1:] - 1, len(st) - 1) if len(st) else []
    return pd.DataFrame({"segment": seg[new], "epoch": ep[new], "first": st[new],
                         "last": st[last], "samples": samples[new]},
                        columns=SAMPLE_RUN_COLUMNS)


def _in_step_order(seg: np.ndarray, epoch: np.ndarray, step: np.ndarray,
                   samples: np.ndarray) -> tuple[np.ndarray, ...]:
    """The records with an epoch and a step, one per launch, epoch and step (the later
    record of one logged twice), sorted by them. A log is almost always in that order
    already, which is checked first (sorting 350,000 records costs more than reducing
    them)."""
    keep = (epoch >= 0) & (step >= 0)
    seg, epoch, step, samples = seg[keep], epoch[keep], step[keep], samples[keep]
    d_seg, d_epoch = np.diff(seg), np.diff(epoch)
    if ((d_seg > 0) | ((d_seg == 0) & ((d_epoch > 0) | ((d_epoch == 0)
                                                         & (np.diff(step) > 0))))).all():
        return seg, epoch, step, samples
    steps = pd.DataFrame({"segment": seg, "epoch": epoch, "step": step, "samples": samples})
    steps = (steps.drop_duplicates(["segment", "epoch", "step"], keep="last")
             .sort_values(["segment", "epoch", "step"], kind="stable"))
    return tuple(steps[c].to_numpy() for c in ("segment", "epoch", "step", "samples"))
