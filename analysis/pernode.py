"""The prediction per node count (``node_rows``): for every measured run and projected
node count, and each target, the batch and lr the run's rule (or the ``goodput``
policy, ``goodput.choose`` with the step-time model as its step time) would use there,
the throughput of ``analysis.stepmodel``'s model, samples to each target from the
base run's noise scale averaged over its training (``noise.History``), and hours =
samples / throughput; beside the measured value wherever a run ran at that count.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from analysis import noise, stateff, tables
from analysis.logs import RunData
from analysis.noise import History
from analysis.stepmodel import EpochModel, Point, policy_of, rule_text
from distseg.core import goodput, lr
from distseg.core.batchplan import BatchPlan
from distseg.core.config import TrainConfig

NODE_COLUMNS = ["kind", "run", "metric", "target", "nodes", "ranks", "batch_policy", "lr_rule",
                "predicted_per_rank_batch", "measured_per_rank_batch", "predicted_global_batch",
                "measured_global_batch", "predicted_lr", "measured_lr", "predicted_step_s",
                "measured_step_s", "predicted_throughput", "measured_throughput",
                "predicted_samples", "measured_samples", "predicted_hours", "measured_hours",
                "measured_train_hours", "note"]


def lr_at(train: TrainConfig, plan: BatchPlan, g2: float | None, tr_sigma: float | None) -> float:
    """The lr the rule sets after the warm-up (``lr.after_warm_up``), a gain rule's at
    the gain of the global batch over the base at the noise scale (``goodput.gain``; 1
    before any estimate)."""
    return lr.after_warm_up(train.lr, plan, goodput.gain(plan.global_batch, plan.base, g2, tr_sigma))


def batch_path(model: EpochModel, ranks: int, hist: History | None) -> list[int]:
    """The per-rank batch of each stretch of ``hist`` at ``ranks``: the config's batch;
    under the ``goodput`` policy, from the second stretch on, ``goodput.choose``'s at the
    end of the stretch before (the loop decides at an epoch's end for the next), with
    this model's step time and that stretch's noise scale."""
    plan = model.plan(ranks)
    path = [plan.per_rank]
    if hist is None:
        return path
    if policy_of(model.train) != "goodput":
        return path * len(hist.samples)
    options = goodput.candidates(ranks, plan.base, model.train.max_batch_per_rank)
    seconds = functools.partial(model.seconds, ranks)
    for g2, tr_sigma in zip(hist.g2[:-1], hist.tr_sigma[:-1]):
        path.append(goodput.choose(path[-1], options, ranks, plan.base, seconds, g2,
                                   tr_sigma).per_rank)
    return path


def _to_target(model: EpochModel, ranks: int, hist: History, path: Sequence[int]) -> dict:
    """Predicted samples and hours to the target: each stretch of ``hist`` at the global
    batch its per-rank batch in ``path`` runs, at the model's throughput there."""
    shapes = [model.shape(ranks, b) for b in path]
    samples = hist.stretch_samples([s.samples / s.steps if s.steps else math.nan
                                    for s in shapes])
    seconds = sum(n / model.throughput(ranks, b) for n, b in zip(samples, path))
    return {"predicted_samples": float(sum(samples)), "predicted_hours": seconds / 3600.0}


def predict(model: EpochModel, ranks: int, hist: History | None, target: bool) -> dict:
    """The predicted columns of ``NODE_COLUMNS`` at ``ranks``: the batch and lr in force
    at the end of ``hist`` (the target, or the base run's end), step time and
    throughput there, and with a ``target`` and a ``hist`` the samples and hours to it."""
    shape = model.shape(ranks)
    if shape.plan is None or shape.why:
        return {"predicted_per_rank_batch": shape.plan.per_rank if shape.plan else math.nan,
                "predicted_global_batch": shape.plan.global_batch if shape.plan else math.nan,
                "lr_rule": shape.plan.lr_scaling if shape.plan else "", "note": shape.why}
    path = batch_path(model, ranks, hist)
    plan = model.plan(ranks, path[-1])
    g2, tr_sigma = (hist.g2[-1], hist.tr_sigma[-1]) if hist is not None else (None, None)
    out = {"predicted_per_rank_batch": plan.per_rank, "predicted_global_batch": plan.global_batch,
           "lr_rule": plan.lr_scaling, "predicted_lr": lr_at(model.train, plan, g2, tr_sigma),
           "predicted_step_s": model.step(ranks, path[-1]),
           "predicted_throughput": model.throughput(ranks, path[-1]), "note": ""}
    if len(set(path)) > 1:
        out["note"] = "goodput: per-rank batch by epoch " + ", ".join(map(str, path))
    if target and hist is not None:
        out.update(_to_target(model, ranks, hist, path))
    return out


def measured_values(run: RunData, points: Sequence[Point], tpe: pd.DataFrame) -> dict:
    """The measured columns of ``NODE_COLUMNS`` that do not depend on a target: the
    batch of its last epoch, the lr of its last step, its step time at that batch (its
    point's) and its steady throughput (``tables.time_per_epoch``)."""
    rows = tables.epoch_batches(run)
    lrs = (run.curve["lr"].astype(float).dropna() if "lr" in run.curve.columns
           else pd.Series(dtype=float))
    last = rows.iloc[-1] if len(rows) else pd.Series({"per_rank": math.nan,
                                                      "global_batch": math.nan})
    mine = [p for p in points if p.run == run.label]
    at_last = [p for p in mine if abs(p.batch - last["per_rank"]) < 1e-6] or mine
    return {"measured_per_rank_batch": last["per_rank"],
            "measured_global_batch": last["global_batch"],
            "measured_lr": float(lrs.iloc[-1]) if len(lrs) else math.nan,
            "measured_step_s": at_last[-1].step_s if at_last else math.nan,
            "measured_throughput": float(tpe.loc[tpe["run"] == run.label,
                                                 "throughput_samples_s"].iloc[0])}


def train_hours_to(run: RunData, samples: float) -> float:
    """Hours of training (the epochs' ``train_time``, warm-up included) until ``run``
    had trained on ``samples``: each epoch in full before, the epoch it happened in in
    proportion to its samples; NaN past the last finished epoch."""
    rows = tables.epoch_batches(run)
    ends = rows["end_samples"].to_numpy(float)
    if not len(rows) or not samples <= ends[-1]:
        return math.nan
    starts = np.concatenate(([0.0], ends[:-1]))
    width = np.maximum(ends - starts, 1e-12)  # an epoch of no samples adds nothing
    share = np.clip((samples - starts) / width, 0.0, 1.0)
    return float((share * rows["train_s"].to_numpy(float)).sum()) / 3600.0


def measured_target(group: pd.DataFrame | None, run: RunData | None) -> tuple[dict, str]:
    """The run's measured samples and hours to the target (``stateff.efficiency_table``
    row) and its training hours to it (``train_hours_to``), or a note where it did not
    reach it."""
    mine = group[group["run"] == run.label] if group is not None and run is not None else None
    if mine is None or not len(mine):
        return {}, ""
    row = mine.iloc[0]
    if not row["reached"]:
        return {}, f"{run.label}: not reached ({row['samples_text']} samples)"
    return {"measured_samples": float(row["samples"]), "measured_hours": float(row["hours"]),
            "measured_train_hours": train_hours_to(run, float(row["samples"]))}, ""


@dataclass(frozen=True)
class Count:
    """One row's size in the node table: a measured run, or a projected node count."""

    kind: str
    run: str
    nodes: int | None
    ranks: int


def counts(runs: Sequence[RunData], points: Sequence[Point], nodes: Sequence[int],
           rpn: int) -> list[Count]:
    """The measured runs that were fitted, then each projected node count whose ranks
    no measured run ran at (that run's row carries the prediction beside it)."""
    fitted = {p.run for p in points}
    out = [Count("measured", r.label, r.nodes, r.ranks) for r in runs if r.label in fitted]
    measured_ranks = {c.ranks for c in out}
    out += [Count("projection", f"projected {n} nodes", int(n), int(n) * rpn) for n in nodes
            if int(n) * rpn not in measured_ranks]
    return out


def _goal(metric: str, target: float) -> str:
    return f"{metric} {stateff.comparison(metric)} {target:g}"


def history_line(metric: str | None, target: float | None, hist: History | None,
                 why: str) -> str:
    """Where one target's predicted samples come from (or why there are none)."""
    goal = _goal(metric, target) if metric is not None else "without a target"
    if hist is None:
        return f"{goal}: no samples predicted: {why}."
    return f"{goal}: samples PREDICTED from {hist.text()}."


def node_rows(model: EpochModel, runs: Sequence[RunData], points: Sequence[Point],
              tpe: pd.DataFrame, efficiency: pd.DataFrame, nodes: Sequence[int],
              rpn: int) -> tuple[pd.DataFrame, list[str]]:
    """One row per target (or one set without targets) and count (``counts``): the
    predicted columns beside the measured ones (``NODE_COLUMNS``), and one line per
    target saying where its samples come from."""
    groups = (list(efficiency.groupby(["metric", "target"], sort=False)) if len(efficiency)
              else [((None, None), None)])
    by_label = {r.label: r for r in runs}
    sizes = counts(runs, points, nodes, rpn)
    measured = {c.run: measured_values(by_label[c.run], points, tpe)
                for c in sizes if c.kind == "measured"}
    rows, lines = [], []
    for (metric, target), group in groups:
        hist, why = noise.history_for(runs, group)
        if group is not None:
            lines.append(history_line(metric, target, hist, why))
        for c in sizes:
            row = {"kind": c.kind, "run": c.run, "metric": metric, "target": target,
                   "nodes": c.nodes, "ranks": c.ranks, "batch_policy": policy_of(model.train)}
            row.update(predict(model, c.ranks, hist, group is not None))
            reached, note = measured_target(group, by_label.get(c.run))
            row.update(measured.get(c.run, {}), **reached)
            row["note"] = "; ".join(n for n in (row["note"], note) if n)
            rows.append(row)
    return pd.DataFrame(rows, columns=NODE_COLUMNS), lines


def node_assumptions(model: EpochModel, per_node: pd.DataFrame, lines: Sequence[str]) -> list[str]:
    """The lines printed with the node table (``per_node``); the first labels it a
    prediction. The samples' and the gain rule's lines only where they apply."""
    t = model.train
    rules = {"gain": "the gain rule x sqrt(gain(B))", "adascale": "the adascale rule x gain(B)"}
    used = [text for rule, text in rules.items() if (per_node["lr_rule"] == rule).any()]
    gain = (f", with {' and '.join(used)} at the noise scale at the target (or the run's end)"
            if used else "")
    goodput_line = [f"train.batch_policy goodput: from the second epoch on, each epoch's "
                    "per-rank batch is goodput.choose's at the end of the epoch before "
                    "(powers of two up to train.max_batch_per_rank = "
                    f"{t.max_batch_per_rank}, never a global batch below the base), with "
                    "the step time below as its seconds and that epoch's noise scale; "
                    "the batch and lr shown are those in force at the target."]
    samples_lines = [
        "predicted_samples at global batch B = sum over the epochs of the history named "
        "below, up to the target, of (its samples x (phi + B) / (phi + B_epoch)), phi = "
        "tr(Sigma) / |G|^2 the Adam-preconditioned noise scale at that epoch's end and "
        "B_epoch the global batch it ran (McCandlish's E(B) per stretch, summed over "
        "training progress as Pollux does; distseg.core.goodput.samples_at; a batch "
        "below B_epoch counts that epoch's samples as run).",
        "predicted_hours = sum of each epoch's predicted samples / predicted_throughput: "
        "steady training only, without start-up, the warm-up epoch's tracing and "
        "validation, which measured_hours (wall clock, Time to target) include; "
        "measured_train_hours is the run's training time (train_time) to the target, "
        "warm-up epoch included."]
    return [
        "PREDICTION from models, not a measurement: every predicted_* column; measured_* "
        "where a run ran at that count.",
        f"Batch and lr at R ranks: distseg.core.batchplan.batch_plan of {model.train_source} "
        f"({rule_text(model)}; train.lr = {t.lr:g}); the lr after the warm-up{gain}.",
        *(goodput_line if policy_of(t) == "goodput" else []),
        "predicted_step_s = t_compute(b) + t_allreduce(R) of the projection above at the "
        "mean per-rank batch b; predicted_throughput = samples per epoch / (steps x "
        "predicted_step_s).",
        *(samples_lines if per_node["predicted_samples"].notna().any() else []),
        *lines]
