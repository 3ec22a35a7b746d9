"""The arithmetic of the study: a run's per-rank logs to validation points (global
samples, time, Dice, training loss), and those to the run's numbers: samples and time
to the target, the largest drop after the warm-up, the final Dice. No TensorFlow."""

from __future__ import annotations

import statistics

from benchlib.stateff.study import MEASURE


def dice_of(val_dice: dict, measure: str = MEASURE) -> float:
    """The Dice the target applies to, from an epoch record's ``val_dice``; an
    undefined class Dice (None: absent from prediction and truth) counts as 0 here.
    ``foreground``: the mean over the data file's foreground classes, every class of
    ``val_dice`` after the first (it holds the file's classes in order, background
    first, as ``distseg-train`` and the emulation log them)."""
    if measure == "foreground":
        return statistics.fmean(float(d or 0.0) for d in list(val_dice.values())[1:])
    return float(val_dice.get(measure) or 0.0)


def eval_points(rank_records: list[list[dict]], measure: str = MEASURE) -> list[dict]:
    """One point per validated epoch: global samples so far (summed over every rank's
    ``epoch`` records), time from the agreed start (the slowest rank's), the Dice and
    the training loss (rank 0's, a global mean)."""
    by_epoch: dict[int, list[dict]] = {}
    for records in rank_records:
        for r in records:
            if r.get("type") == "epoch" and r.get("val_dice"):
                by_epoch.setdefault(r["epoch"], []).append(r)
    points, samples = [], 0
    for epoch in sorted(by_epoch):
        recs = by_epoch[epoch]
        if len(recs) != len(rank_records):
            break  # an epoch some rank did not log is not complete
        samples += sum(int(r["samples"]) for r in recs)
        points.append({"epoch": epoch, "samples": samples, "t": max(float(r["t"]) for r in recs),
                       "dice": dice_of(recs[0]["val_dice"], measure),
                       "train_loss": float(recs[0]["train_loss"])})
    return points


def first_reach(points: list[dict], target: float) -> dict | None:
    """The first point whose Dice is at least ``target``, or None."""
    return next((p for p in points if p["dice"] >= target), None)


def largest_drop(points: list[dict], after_samples: float, every: int = 1) -> float:
    """The largest fall of the Dice from one point to the next (taking every
    ``every``-th point: 4 compares whole passes when a pass is 4 evaluations), among
    the points at or after ``after_samples`` (the end of the warm-up); 0 if none."""
    kept = [p for p in points if p["samples"] >= after_samples][::every]
    return max([a["dice"] - b["dice"] for a, b in zip(kept, kept[1:])] + [0.0])


def summarise(points: list[dict], target: float, warmup_samples: float, per_pass: int) -> dict:
    """A run's numbers: samples/steps-free measures from its validation points."""
    hit = first_reach(points, target)
    return {
        "samples_to_target": hit["samples"] if hit else None,
        "time_to_target": hit["t"] if hit else None,
        "max_drop": largest_drop(points, warmup_samples),
        "max_drop_per_pass": largest_drop(points, warmup_samples, every=per_pass),
        "final_dice": points[-1]["dice"] if points else None,
        "best_dice": max((p["dice"] for p in points), default=None),
        "final_train_loss": points[-1]["train_loss"] if points else None,
        "evals": len(points),
        "samples": points[-1]["samples"] if points else 0,
    }
