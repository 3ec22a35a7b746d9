"""The report's tables, computed from loaded runs (``analysis.logs.RunData``).

Each public function returns one pandas frame whose columns are documented in
docs/report.md; the frames are written as CSV as they are, so column names are part
of the interface. Definitions that matter for reading the numbers:

* Warm-up: the first epoch of every launch (graph tracing, cold caches). It is reported
  separately and left out of the steady-state statistics and of step-time means,
  unless a run has nothing else.
* Time per epoch: the slowest rank's ``train_time`` of that epoch (training only,
  without validation; ``epoch_time`` where ``train_time`` is not logged), and beside
  it the slowest rank's ``epoch_time`` (with validation). Throughput: samples of all
  ranks / the slowest rank's training time, summed over the steady epochs.
* Scaling: against the run with the fewest ranks; efficiency divides the speedup by
  the ratio of ranks.
* Voxel rates: samples/s x the run record's ``voxels_per_sample`` (every sample of a
  run has the same shape); empty for logs without it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from analysis import lrrange
from analysis.document import HOURS, TimeUnit
from analysis.logfile import count
from analysis.logs import RunData
from analysis.reduce import smoothed
from distseg.core import ranktime

NOT_REACHED = "not reached"


def foreground(classes: Sequence[str]) -> list[str]:
    """The classes a Dice target is about by default: all but ``background``."""
    fg = [c for c in classes if c != "background"]
    return fg or list(classes)


def dice_name(classes: Sequence[str], dice_class: str | None) -> str:
    """The Dice a target or a check refers to: ``liver``, or ``mean liver+lesion``."""
    return dice_class or "mean " + "+".join(foreground(classes))


def first_per_epoch(run: RunData) -> pd.DataFrame:
    """One row per epoch with the global (rank-independent) values, lowest rank first."""
    if not len(run.epochs):
        return run.epochs
    return run.epochs.sort_values(["epoch", "rank"]).drop_duplicates("epoch")


def epoch_summary(run: RunData) -> pd.DataFrame:
    """One row per finished epoch, all ranks combined.

    Columns: ``epoch``, ``segment``, ``warmup``, ``wall_s`` (end of the epoch on the
    run's wall clock), ``wall_gap_s`` (``wall_s`` since the launch's previous epoch
    ended: the whole epoch as the run paid it, NaN for a launch's first), ``epoch_s``
    (slowest rank's ``epoch_time``: training plus validation), ``train_s`` (slowest
    rank's ``train_time``: training only; ``epoch_s`` where no rank logged it),
    ``train_time_logged``, ``ranks_logged``, ``samples`` (all ranks; scaled up by size /
    ranks_logged when ranks are missing), ``throughput`` (samples / train_s).
    """
    cols = ["epoch", "segment", "warmup", "wall_s", "wall_gap_s", "epoch_s", "train_s",
            "train_time_logged", "ranks_logged", "samples", "throughput"]
    e = run.epochs
    if not len(e):
        return pd.DataFrame(columns=cols)
    g = e.groupby("epoch")
    out = pd.DataFrame({
        "segment": g["segment"].max(),
        "wall_s": g["wall_s"].max(),
        "epoch_s": g["epoch_time"].max(),
        "train_s": g["train_time"].max(),
        "ranks_logged": g["rank"].nunique(),
        "samples": g["samples"].sum(min_count=1),
    }).reset_index()
    out["train_time_logged"] = out["train_s"].notna()
    out["train_s"] = out["train_s"].fillna(out["epoch_s"])
    size = run.size or out["ranks_logged"].max()
    out["samples"] = out["samples"] * size / out["ranks_logged"]
    first = out.groupby("segment")["epoch"].transform("min")
    out["warmup"] = out["epoch"] == first
    out["throughput"] = out["samples"] / out["train_s"]
    out = out.sort_values("epoch").reset_index(drop=True)
    out["wall_gap_s"] = out.groupby("segment")["wall_s"].diff()
    return out[cols]


def _steady(summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    steady = summary[~summary["warmup"]]
    if len(steady):
        return steady, "epochs after warm-up"
    return summary, "warm-up epoch only (no later epoch finished)"


EPOCH_BATCH_COLUMNS = ["epoch", "warmup", "train_s", "steps", "samples", "end_samples",
                       "global_batch", "per_rank", "g2", "tr_sigma"]


def _noise_at(run: RunData, epochs: pd.Series, field: str) -> np.ndarray:
    """The epoch records' ``noise_scale.<field>`` at ``epochs`` (NaN where not logged)."""
    column = f"noise_{field}"
    if column not in run.epochs.columns:
        return np.full(len(epochs), math.nan)
    values = first_per_epoch(run).set_index("epoch")[column].astype(float)
    return epochs.map(values).to_numpy(float)


def epoch_batches(run: RunData) -> pd.DataFrame:
    """One row per finished epoch with the batch it ran (``EPOCH_BATCH_COLUMNS``).

    ``warmup`` and ``train_s`` are ``epoch_summary``'s; ``steps`` and ``samples`` that
    epoch's own steps and samples of all ranks, and ``end_samples`` what the run trained
    on by its end (``RunData.epoch_progress``, so a resumed run counts each step once);
    ``global_batch = samples / steps`` and ``per_rank = global_batch / ranks``, read
    from what the steps trained on, so epochs of the ``goodput`` batch policy (each its
    own batch) and remainder batches count as they ran. ``g2`` and ``tr_sigma``: the
    epoch record's ``noise_scale`` (Adam-preconditioned |G|^2 and tr(Sigma)), NaN where
    not logged. Without step records the run record's ``steps_per_epoch`` stands in.
    """
    s = epoch_summary(run)
    if not len(s):
        return pd.DataFrame(columns=EPOCH_BATCH_COLUMNS)
    s = s.sort_values("epoch").reset_index(drop=True)
    progress = (run.epoch_progress.set_index("epoch") if len(run.epoch_progress)
                else pd.DataFrame(columns=["steps", "samples"]))
    end_steps = s["epoch"].map(progress["steps"]).astype(float)
    end_samples = s["epoch"].map(progress["samples"]).astype(float)
    logged = np.isfinite(end_steps) & np.isfinite(end_samples)
    steps = end_steps.diff().fillna(end_steps)
    samples = end_samples.diff().fillna(end_samples)
    spe = float(count(run.run_record.get("steps_per_epoch")) or math.nan)
    steps, samples = steps.where(logged, spe), samples.where(logged, s["samples"])
    out = pd.DataFrame({"epoch": s["epoch"], "warmup": s["warmup"], "train_s": s["train_s"],
                        "steps": steps, "samples": samples,
                        "end_samples": end_samples.where(logged, samples.cumsum()),
                        "global_batch": samples / steps})
    out["per_rank"] = out["global_batch"] / (run.ranks or math.nan)
    out["g2"] = _noise_at(run, out["epoch"], "g2")
    out["tr_sigma"] = _noise_at(run, out["epoch"], "tr_sigma")
    return out[EPOCH_BATCH_COLUMNS]


#: Throughput in voxels, added after the other columns of ``time_per_epoch`` (empty
#: where the run record has no ``voxels_per_sample``).
VOXEL_COLUMNS = ("voxels_per_sample", "throughput_voxels_s", "throughput_voxels_per_rank")


def voxel_rates(row: dict, voxels: float) -> dict[str, float]:
    """``VOXEL_COLUMNS`` of a row with ``throughput_samples_s`` and
    ``throughput_per_rank``: samples/s x voxels per sample (NaN when unknown)."""
    return {"voxels_per_sample": voxels,
            "throughput_voxels_s": row["throughput_samples_s"] * voxels,
            "throughput_voxels_per_rank": row["throughput_per_rank"] * voxels}


#: What the ``*_train_s`` columns and the throughput measure (``time`` column).
TRAIN_TIME = "train_time: slowest rank, training only (no validation)"
EPOCH_TIME_FALLBACK = "epoch_time: slowest rank, training + validation (train_time not logged)"


#: ``time_per_epoch``'s columns of what an epoch pays outside training (``outside_training``).
OUTSIDE_COLUMNS = ("median_wall_epoch_s", "outside_training_pct")


def outside_training(steady: pd.DataFrame) -> dict[str, float]:
    """``median_wall_epoch_s`` and ``outside_training_pct`` (``time_per_epoch``) of the
    steady epochs of ``epoch_summary`` (NaN where no epoch follows another in a launch)."""
    timed = steady[steady["wall_gap_s"].notna()]
    if not len(timed):
        return {"median_wall_epoch_s": math.nan, "outside_training_pct": math.nan}
    outside = (timed["wall_gap_s"] - timed["train_s"]).clip(lower=0.0)
    return {"median_wall_epoch_s": float(timed["wall_gap_s"].median()),
            "outside_training_pct": float(100.0 * outside.sum() / timed["wall_gap_s"].sum())}


def time_per_epoch(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per run: seconds per epoch (warm-up apart) and training throughput.

    The ``*_train_s`` columns are the slowest rank's ``train_time`` per epoch (training
    only; a synchronous epoch lasts as long as its slowest rank); ``*_epoch_s`` the
    slowest rank's ``epoch_time`` (training plus validation). ``throughput_samples_s``
    is the samples of all ranks over the steady epochs divided by the sum of their
    ``train_s`` (``distseg.core.ranktime.throughput``). ``time`` says which time the
    ``*_train_s`` columns hold. Then ``VOXEL_COLUMNS``: the same throughput in voxels
    (``voxel_rates``); last ``OUTSIDE_COLUMNS``: ``median_wall_epoch_s``, the median
    wall-clock time from one epoch's end to the next's, and ``outside_training_pct``, the
    share of it spent outside training (validation, the epoch's records, TensorBoard,
    checkpoints, the ranks' agreement at its end and start): what short epochs pay.
    """
    cols = ["run", "ranks", "nodes", "epochs", "steady_epochs", "time", "warmup_train_s",
            "median_train_s", "mean_train_s", "min_train_s", "max_train_s", "warmup_epoch_s",
            "median_epoch_s", "samples_per_epoch", "throughput_samples_s",
            "throughput_per_rank", "steps_per_epoch", "global_batch_size", "basis", "status",
            *VOXEL_COLUMNS, *OUTSIDE_COLUMNS]
    rows = []
    for run in runs:
        s = epoch_summary(run)
        rec = run.run_record
        row = dict.fromkeys(cols, math.nan)
        row.update({"run": run.label, "ranks": run.ranks, "nodes": run.nodes,
                    "epochs": len(s), "steady_epochs": 0, "time": TRAIN_TIME,
                    "basis": "no finished epoch",
                    "steps_per_epoch": rec.get("steps_per_epoch"),
                    "global_batch_size": rec.get("global_batch_size"), "status": run.status})
        if len(s):
            steady, basis = _steady(s)
            warm = s[s["warmup"]]
            rate = ranktime.throughput(steady["samples"].sum(), steady["train_s"].sum())
            throughput = math.nan if rate is None else float(rate)
            row.update({
                "steady_epochs": int((~s["warmup"]).sum()),
                "time": TRAIN_TIME if steady["train_time_logged"].all() else EPOCH_TIME_FALLBACK,
                "warmup_train_s": float(warm["train_s"].iloc[0]) if len(warm) else math.nan,
                "median_train_s": float(steady["train_s"].median()),
                "mean_train_s": float(steady["train_s"].mean()),
                "min_train_s": float(steady["train_s"].min()),
                "max_train_s": float(steady["train_s"].max()),
                "warmup_epoch_s": float(warm["epoch_s"].iloc[0]) if len(warm) else math.nan,
                "median_epoch_s": float(steady["epoch_s"].median()),
                **outside_training(steady),
                "samples_per_epoch": float(steady["samples"].median()),
                "throughput_samples_s": throughput,
                "throughput_per_rank": throughput / run.ranks if run.ranks else math.nan,
                "basis": basis,
            })
        row.update(voxel_rates(row, run.voxels_per_sample))
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    out["voxels_per_sample"] = out["voxels_per_sample"].astype("Int64")  # 8192, not 8192.0
    return out


def scaling(tpe: pd.DataFrame) -> pd.DataFrame:
    """Speedup and parallel efficiency of each run against the one with fewest ranks.

    For time per epoch (median steady ``train_s``): ``normalised_time = T / T_base``,
    ``speedup = T_base / T``, ``efficiency = speedup / (ranks / ranks_base)``. For
    throughput: ``throughput_speedup = X / X_base`` and the same efficiency. The voxel
    throughputs of ``time_per_epoch`` follow, as they are.
    """
    cols = ["run", "ranks", "nodes", "base", "scale", "median_train_s", "normalised_time",
            "speedup", "efficiency", "throughput_samples_s", "throughput_speedup",
            "throughput_efficiency", "throughput_voxels_s", "throughput_voxels_per_rank"]
    ok = tpe[np.isfinite(tpe["median_train_s"].astype(float))]
    if not len(ok):
        return pd.DataFrame(columns=cols)
    base = ok.sort_values(["ranks", "median_train_s"], kind="stable").iloc[0]
    out = tpe[["run", "ranks", "nodes", "median_train_s", "throughput_samples_s"]].copy()
    out["base"] = base["run"]
    out["scale"] = out["ranks"] / base["ranks"]
    out["normalised_time"] = out["median_train_s"] / base["median_train_s"]
    out["speedup"] = base["median_train_s"] / out["median_train_s"]
    out["efficiency"] = out["speedup"] / out["scale"]
    out["throughput_speedup"] = out["throughput_samples_s"] / base["throughput_samples_s"]
    out["throughput_efficiency"] = out["throughput_speedup"] / out["scale"]
    for c in ("throughput_voxels_s", "throughput_voxels_per_rank"):
        out[c] = tpe[c] if c in tpe.columns else math.nan
    return out[cols]


def shape_text(shape: Sequence[int] | None) -> str | None:
    """A sample's shape for people: ``32x128x128`` (``None`` when unknown)."""
    return "x".join(str(d) for d in shape) if shape else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def precision_text(run_record: dict) -> str | None:
    """The precision a run trained in, and how it was decided: ``bfloat16 (auto,
    1.48x)`` where ``--precision auto``'s trial chose it, ``float32 (auto, no trial)``
    where the CPU had no bfloat16, the bare precision where the config named it; None
    where the run record does not say (older logs)."""
    model = run_record.get("model") if isinstance(run_record.get("model"), dict) else {}
    chosen = model.get("precision")
    if not isinstance(chosen, str):
        return None
    decided = run_record.get("precision")
    if not isinstance(decided, dict) or decided.get("requested") != "auto":
        return chosen
    speedup = decided.get("speedup")
    return (f"{chosen} (auto, {speedup:.2f}x)" if isinstance(speedup, (int, float))
            else f"{chosen} (auto, no trial)")


def run_settings(run: RunData) -> dict[str, object]:
    """What a run ran as, from its run record: ``model`` (``unet2d``/``unet3d``),
    ``precision`` (``precision_text``), ``input_shape`` (text), ``onednn`` (TensorFlow's oneDNN kernels on or off),
    ``intra_op_threads`` and ``inter_op_threads`` (TensorFlow threads per rank), ``lr``
    (``lrrange.lr_text``) and
    ``pinned`` (whether distseg pinned the rank to its cores); ``None`` where the
    record does not say (older logs)."""
    threads = run.threads
    name = run.model.get("name")
    return {"model": name if isinstance(name, str) else None,
            "precision": precision_text(run.run_record),
            "lr": lrrange.lr_text(run),
            "input_shape": shape_text(run.input_shape),
            "onednn": _flag(run.run_record.get("onednn")),
            "intra_op_threads": count(threads.get("intra_op")),
            "inter_op_threads": count(threads.get("inter_op")),
            "pinned": _flag(threads.get("pinned"))}


#: Columns of ``throughput_vs_size``.
SIZE_COLUMNS = ["run", "model", "input_shape", "voxels_per_sample", "ranks", "nodes",
                "batch_per_rank", "onednn", "intra_op_threads", "throughput_samples_s",
                "throughput_per_rank", "throughput_voxels_s", "throughput_voxels_per_rank"]


def throughput_vs_size(runs: Sequence[RunData], tpe: pd.DataFrame) -> pd.DataFrame:
    """Throughput against input size: one row per run that logged ``voxels_per_sample``.

    The x of the plot is ``voxels_per_sample`` (labelled with ``input_shape``), the y
    ``throughput_voxels_per_rank`` (steady training voxels per second per rank, from
    ``time_per_epoch``); rows are grouped by ``model`` and ``ranks`` and sorted by
    size within a group, so runs at several slab sizes read as one curve per model
    and rank count. ``onednn`` and ``intra_op_threads`` are beside them because both
    move the throughput as much as the size does.
    """
    rows = []
    for run in runs:
        if not math.isfinite(run.voxels_per_sample):
            continue
        t = tpe[tpe["run"] == run.label].iloc[0]
        settings = run_settings(run)
        row = {c: t[c] for c in SIZE_COLUMNS if c in tpe.columns}
        row.update({k: settings[k] for k in ("model", "input_shape", "onednn",
                                            "intra_op_threads")},
                   batch_per_rank=count(run.run_record.get("batch_size")))
        rows.append(row)
    out = pd.DataFrame(rows, columns=SIZE_COLUMNS)
    if not len(out):
        return out
    for c in ("voxels_per_sample", "batch_per_rank", "intra_op_threads"):
        out[c] = out[c].astype("Int64")
    order = out.assign(_model=out["model"].fillna(""))
    order = order.sort_values(["_model", "ranks", "voxels_per_sample"], kind="stable")
    return out.loc[order.index].reset_index(drop=True)


def compares_sizes(table: pd.DataFrame) -> bool:
    """Whether ``throughput_vs_size`` holds runs at two or more input sizes (else its
    plot would be one column of points, and the report leaves it out)."""
    return len(table) > 0 and table["voxels_per_sample"].nunique() >= 2


def loss_vs_time(runs: Sequence[RunData], smooth: int = 0) -> pd.DataFrame:
    """Training loss per step and validation loss per epoch against wall-clock hours.

    Columns: ``run``, ``ranks``, ``nodes``, ``series`` (``train`` or ``val``),
    ``segment``, ``epoch``, ``global_step`` (empty for ``val``), ``hours``, ``loss``,
    ``loss_smoothed`` (train only; equal to ``loss`` without ``--smooth``). The train
    rows are the run's curve as read (``RunData.curve``: thinned on long runs, smoothed
    on every record before thinning); ``smooth`` only applies to a curve without
    ``loss_smoothed``.
    """
    parts = []
    for run in runs:
        c = run.curve
        if len(c):
            loss_smoothed = (c["loss_smoothed"] if "loss_smoothed" in c
                             else smoothed(c["loss"], smooth))
            parts.append(pd.DataFrame({
                "run": run.label, "ranks": run.ranks, "nodes": run.nodes, "series": "train",
                "segment": c["segment"].to_numpy(), "epoch": c["epoch"].to_numpy(),
                "global_step": c["global_step"].to_numpy(),
                "hours": c["wall_s"].to_numpy() / 3600.0, "loss": c["loss"].to_numpy(),
                "loss_smoothed": loss_smoothed.to_numpy()}))
        e = first_per_epoch(run)
        if len(e):
            e = e.sort_values("wall_s")
            parts.append(pd.DataFrame({
                "run": run.label, "ranks": run.ranks, "nodes": run.nodes, "series": "val",
                "segment": e["segment"].to_numpy(), "epoch": e["epoch"].to_numpy(),
                "global_step": np.nan, "hours": e["wall_s"].to_numpy() / 3600.0,
                "loss": e["val_loss"].to_numpy(), "loss_smoothed": np.nan}))
    cols = ["run", "ranks", "nodes", "series", "segment", "epoch", "global_step", "hours",
            "loss", "loss_smoothed"]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True)[cols]
    out["global_step"] = out["global_step"].astype("Int64")
    return out


def dice_metric(epochs: pd.DataFrame, classes: Sequence[str], dice_class: str | None,
                prefix: str = "dice_") -> pd.Series:
    """The Dice a target is compared with: one class, or the mean over foreground classes."""
    names = [dice_class] if dice_class else foreground(classes)
    cols = [prefix + c for c in names if prefix + c in epochs.columns]
    if not cols:
        return pd.Series(np.nan, index=epochs.index)
    return epochs[cols].mean(axis=1, skipna=True)


def _loss_rows(run: RunData, base: dict, targets: Sequence[float], smooth: int,
               unit: TimeUnit) -> list[dict]:
    """Rows of ``hours_to_target`` for the loss targets, from ``run.crossings``."""
    window = smooth if smooth > 1 else 0
    pending = "" if run.finished else " (run not finished)"
    metric = "train_loss" + (f" (smoothed {smooth})" if smooth > 1 else "")
    rows = []
    for target in targets:
        found = run.crossings[(run.crossings["target"] == target)
                              & (run.crossings["window"] == window)]
        if len(run.curve) and not len(found):
            raise ValueError(f"the loss curve of {run.label} was not read for target "
                             f"{target:g} (window {window}): pass it to load_runs")
        row = dict(base, metric=metric, target=target)
        if len(found) and found["reached"].iloc[0]:
            hit = found.iloc[0]
            row.update(reached=True, hours=float(hit["wall_s"]) / 3600.0,
                       epoch=int(hit["epoch"]), global_step=int(hit["global_step"]),
                       result=unit.text(float(hit["wall_s"])), steps=float(hit["steps"]),
                       samples=float(hit["samples"]), samples_lower_bound=math.nan)
        else:
            row.update(reached=False, hours=math.nan, epoch=None, global_step=None,
                       result=(NOT_REACHED + pending) if len(run.curve) else "no step records",
                       steps=math.nan, samples=math.nan,
                       samples_lower_bound=run.trained.samples)
        rows.append(row)
    return rows


def _dice_rows(run: RunData, base: dict, targets: Sequence[float], dice_class: str | None,
               unit: TimeUnit) -> list[dict]:
    """Rows of ``hours_to_target`` for the Dice targets, from the epoch records."""
    pending = "" if run.finished else " (run not finished)"
    e = first_per_epoch(run)
    done = (run.epoch_progress.set_index("epoch") if len(run.epoch_progress)
            else pd.DataFrame(columns=["steps", "samples"]))
    name = f"val_dice ({dice_name(run.classes, dice_class)})"
    rows = []
    for target in targets:
        row = dict(base, metric=name, target=target)
        if len(e):
            e = e.sort_values("wall_s")
            metric = dice_metric(e, run.classes, dice_class).to_numpy()
            hit = np.flatnonzero(metric >= target)
        else:
            hit = []
        if len(hit):
            i = int(hit[0])
            wall_s = float(e["wall_s"].iloc[i])
            epoch = int(e["epoch"].iloc[i])
            row.update(reached=True, hours=wall_s / 3600.0, epoch=epoch, global_step=None,
                       result=unit.text(wall_s), samples_lower_bound=math.nan,
                       steps=float(done["steps"].get(epoch, math.nan)),
                       samples=float(done["samples"].get(epoch, math.nan)))
        else:
            row.update(reached=False, hours=math.nan, epoch=None, global_step=None,
                       result=(NOT_REACHED + pending) if len(e) else "no epoch records",
                       steps=math.nan, samples=math.nan,
                       samples_lower_bound=(float(done.loc[e["epoch"].iloc[-1], "samples"])
                                            if len(e) and e["epoch"].iloc[-1] in done.index
                                            else math.nan))
        rows.append(row)
    return rows


def hours_to_target(runs: Sequence[RunData], target_loss: Sequence[float] = (),
                    target_dice: Sequence[float] = (), smooth: int = 0,
                    dice_class: str | None = None, unit: TimeUnit = HOURS) -> pd.DataFrame:
    """First wall-clock time each run reaches each target.

    A loss target is reached at the first step record, in wall-clock order, whose
    (smoothed) training loss is <= the target (found on every record while the logs
    were read: ``RunData.crossings``); a Dice target at the first epoch whose global
    validation Dice is >= the target. No interpolation: the time is the ``t`` of that
    record (plus the durations of earlier launches). ``hours`` is in hours always;
    ``result`` says the time in ``unit``. ``steps`` and ``samples``: what all ranks
    trained on up to that record (``analysis.progress``; for a Dice target, to the end
    of that epoch); for a target not reached, ``samples_lower_bound`` is what they
    trained on in all (by the last step record; for Dice, the last validated epoch).

    Raises:
      ValueError: a loss target the runs' curves were not read for.
    """
    rows = []
    for run in runs:
        base = {"run": run.label, "ranks": run.ranks, "nodes": run.nodes}
        rows += _loss_rows(run, base, target_loss, smooth, unit)
        rows += _dice_rows(run, base, target_dice, dice_class, unit)
    cols = ["run", "ranks", "nodes", "metric", "target", "reached", "hours", "epoch",
            "global_step", "result", "steps", "samples", "samples_lower_bound"]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("epoch", "global_step", "steps"):
        out[c] = pd.to_numeric(out[c]).astype("Int64")
    return out


def rank_balance(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per run and rank: step and data-wait times, the slowest rank, the imbalance ratio.

    Warm-up epochs are left out when a run has later ones. ``imbalance_ratio`` is the
    slowest rank's mean step time over the mean across ranks (1.0 = balanced;
    ``distseg.core.ranktime.imbalance``). The
    per-rank figures were computed while reading (``RunData.step_stats``).
    """
    cols = ["run", "ranks", "rank", "host", "steps", "mean_step_s", "median_step_s",
            "max_step_s", "mean_data_wait_s", "data_wait_share", "slowest", "slowest_rank",
            "imbalance_ratio"]
    parts = []
    for run in runs:
        s = run.step_stats
        if not len(s):
            continue
        basis = "steady" if (s["basis"] == "steady").any() else "all"
        t = s[s["basis"] == basis].drop(columns="basis").reset_index(drop=True)
        t.insert(0, "run", run.label)
        t.insert(1, "ranks", run.ranks)
        t.insert(3, "host", t["rank"].map(run.rank_hosts))
        if t["mean_step_s"].notna().any():
            slow = int(t.loc[t["mean_step_s"].idxmax(), "rank"])
            ratio = ranktime.imbalance(t["mean_step_s"].max(), t["mean_step_s"].mean())
            ratio = math.nan if ratio is None else float(ratio)
        else:
            slow, ratio = None, math.nan
        t["slowest"] = t["rank"] == slow
        t["slowest_rank"] = slow
        t["imbalance_ratio"] = ratio
        parts.append(t[cols])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def rank_balance_summary(balance: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``rank_balance``: the figures a reader scans first."""
    cols = ["run", "ranks", "mean_step_s", "slowest_rank", "slowest_step_s", "imbalance_ratio",
            "max_data_wait_share", "most_waiting_rank"]
    if not len(balance):
        return pd.DataFrame(columns=cols)
    rows = []
    for run, t in balance.groupby("run", sort=False):
        wait = t["data_wait_share"]
        rows.append({"run": run, "ranks": int(t["ranks"].iloc[0]),
                     "mean_step_s": float(t["mean_step_s"].mean()),
                     "slowest_rank": t["slowest_rank"].iloc[0],
                     "slowest_step_s": float(t["mean_step_s"].max()),
                     "imbalance_ratio": float(t["imbalance_ratio"].iloc[0]),
                     "max_data_wait_share": float(wait.max()) if wait.notna().any() else math.nan,
                     "most_waiting_rank": (int(t.loc[wait.idxmax(), "rank"])
                                           if wait.notna().any() else None)})
    return pd.DataFrame(rows, columns=cols)


def val_dice_spread(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per run, epoch and class: min/median/max of the ranks' local validation Dice.

    Columns: ``run``, ``epoch``, ``hours``, ``class`` (each class, plus
    ``mean_foreground``), ``ranks`` (ranks with a value), ``min``, ``median``, ``max``,
    ``global`` (the Dice from counts summed over ranks).
    """
    rows = []
    for run in runs:
        e = run.epochs
        if not len(e):
            continue
        classes = list(run.classes)
        e = e.copy()
        e["local_dice_mean_foreground"] = dice_metric(e, classes, None, "local_dice_")
        e["dice_mean_foreground"] = dice_metric(e, classes, None, "dice_")
        hours = e.groupby("epoch")["wall_s"].max() / 3600.0
        for cls in classes + ["mean_foreground"]:
            local, glob = "local_dice_" + cls, "dice_" + cls
            if local not in e.columns:
                continue
            g = e.groupby("epoch")
            stats = pd.DataFrame({"ranks": g[local].count(), "min": g[local].min(),
                                  "median": g[local].median(), "max": g[local].max(),
                                  "global": g[glob].first() if glob in e.columns else np.nan})
            stats["hours"] = hours
            stats = stats.reset_index()
            stats.insert(0, "run", run.label)
            stats.insert(3, "class", cls)
            rows.append(stats)
    cols = ["run", "epoch", "hours", "class", "ranks", "min", "median", "max", "global"]
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)
