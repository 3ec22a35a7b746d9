"""What the report says, in which order: its sections, built from the computed tables.

The words a reader sees around the numbers live here, once; ``render`` only draws the
``Section`` list, the same for the terminal, ``report.md`` and ``report.html``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd

from analysis.document import HOURS, Note, Projection, Role, Section, Tables, TimeUnit
from analysis.stateff import goal_text as _goal
from analysis.tables import TRAIN_TIME, compares_sizes
from distseg.core.link import FP16_MIN_SPEEDUP

#: Figure files written by ``analysis.report.write`` and shown by the documents.
LOSS_FIGURE = "loss_vs_time.png"
DICE_FIGURE = "val_dice_spread.png"
EFFICIENCY_FIGURE = "statistical_efficiency.png"
SIZE_FIGURE = "throughput_vs_size.png"
NOISE_FIGURE = "noise_scale.png"
LR_FIND_FIGURE = "lr_find.png"
ANSWER_TITLE = "The answer"

# Columns shown in the documents (the CSVs have them all). Those in ``WHEN_LOGGED``
# are shown only when some run logged them (older logs leave them empty).
RUNS_COLS = ("run", "path", "ranks", "nodes", "hosts", "ranks_logged", "launches", "epochs",
             "train_samples", "batch_per_rank", "wall_h", "config_hash", "status", "model",
             "precision", "input_shape", "onednn", "intra_op_threads")
#: The throughput in voxels is in the Scaling table (all ranks) and the input size table
#: (per rank), not here: 16 columns of numbers did not fit a 1280-px window once an
#: epoch's times fell below 0.1 s (a digit more each).
TPE_COLS = ("run", "ranks", "nodes", "epochs", "warmup_train_s", "median_train_s",
            "mean_train_s", "min_train_s", "max_train_s", "median_epoch_s",
            "outside_training_pct", "throughput_samples_s", "throughput_per_rank", "status")
SCALING_COLS = ("run", "ranks", "nodes", "scale", "median_train_s", "normalised_time",
                "speedup", "efficiency", "throughput_samples_s", "throughput_voxels_s",
                "throughput_speedup", "throughput_efficiency")
SIZE_COLS = ("run", "model", "input_shape", "voxels_per_sample", "ranks", "nodes",
             "batch_per_rank", "onednn", "intra_op_threads", "throughput_per_rank",
             "throughput_voxels_per_rank", "throughput_voxels_s")
WHEN_LOGGED = frozenset({"model", "precision", "input_shape", "onednn", "intra_op_threads",
                         "throughput_voxels_s", "throughput_voxels_per_rank"})
HOURS_COLS = ("run", "ranks", "nodes", "metric", "target", "result", "epoch", "global_step",
              "steps", "samples")
STATEFF_COLS = ("run", "ranks", "nodes", "metric", "target", "result", "steps", "samples_text",
                "statistical_efficiency_text", "time_speedup", "throughput_speedup",
                "other_factor", "limited_by")
PROJ_TARGET_COLS = ("kind", "run", "metric", "target", "nodes", "ranks", "throughput_speedup",
                    "statistical_efficiency", "statistical_efficiency_basis", "time_speedup",
                    "hours", "measured_hours", "note")
PROJ_COLS = ("kind", "run", "nodes", "ranks", "steps_per_epoch", "step_s", "allreduce_s",
             "epoch_s", "model_epoch_s", "residual_s", "efficiency", "note")
LINK_COLS = ("run", "ranks", "hosts", "link", "bandwidth_gbps", "latency_us", "sizes_timed",
             "largest_bytes", "largest_s", "largest_gbps", "traced_allreduce_s",
             "modelled_allreduce_s", "traced_wait_s", "compression", "note")
PROJECTION_TITLE = "Projection (model, not measured)"
PROJECTION_TARGET_TITLE = "Projection to target (model, not measured)"


def in_unit(frame: pd.DataFrame, column: str, unit: TimeUnit) -> pd.DataFrame:
    """``frame`` with the hours of ``column`` (``*_h``) shown in ``unit`` instead, under
    a name that says it (``wall_h`` -> ``wall_min``); the CSV and JSON keep hours."""
    if unit is HOURS or column not in frame.columns:
        return frame
    shown = frame.copy()
    shown[column] = unit.of(shown[column].astype(float) * 3600.0)
    return shown.rename(columns={column: column[:-1] + unit.name})


def shown(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[str, ...]:
    """``columns`` less those of ``WHEN_LOGGED`` that no row of ``frame`` has a value in
    (a report of older logs shows no empty voxel or thread columns)."""
    return tuple(c for c in columns if c not in WHEN_LOGGED
                 or (c in frame.columns and frame[c].notna().any()))


def runs_section(t: Tables, unit: TimeUnit = HOURS) -> Section:
    frame = in_unit(t.runs, "wall_h", unit)
    columns = tuple(f"wall_{unit.name}" if c == "wall_h" else c for c in RUNS_COLS)
    return Section("Runs", Role.TABLE, "One row per run directory; a launch is one start of "
                   "the job (a resumed run has several); nodes: the most hosts any launch "
                   f"ran on; wall_{unit.name}: wall-clock {unit.word}, the launches' durations "
                   "added up; train_samples: per epoch (slabs for a 3D run). From the run "
                   "record, where logged: model, precision (what it trained in; auto: "
                   "decided by a timed trial, with bfloat16's speed-up), input_shape (one "
                   "sample), onednn "
                   "(TensorFlow's oneDNN kernels on or off), intra_op_threads (TensorFlow "
                   "threads per rank; inter_op_threads and pinned are in report.json).",
                   frame=frame, columns=shown(frame, columns))


def warnings_section(notes: Sequence[Note]) -> Section | None:
    """The warnings, ahead of the numbers they qualify (``None`` when there are none)."""
    warnings = tuple(n.line() for n in notes if n.level == "warning")
    if not warnings:
        return None
    return Section("Warnings", Role.WARNINGS, "Read these before the numbers.", items=warnings)


def time_per_epoch_section(t: Tables) -> Section:
    tpe = t.time_per_epoch
    fallback = [r for r, time in zip(tpe["run"], tpe["time"]) if time != TRAIN_TIME]
    intro = ("*_train_s: seconds of training per epoch, the slowest rank's train_time (no "
             "validation; a synchronous epoch lasts as long as its slowest rank). "
             "median_epoch_s: the slowest rank's epoch_time, with validation. "
             "outside_training_pct: the share of an epoch's wall-clock time (one epoch's end "
             "to the next's) spent outside training: validation, records, TensorBoard, "
             "checkpoints, the ranks agreeing; what short epochs pay. The first "
             "epoch of each launch is warm-up: shown as warmup_train_s and left out of the "
             "other columns. throughput_samples_s = samples of all ranks / training seconds, "
             "over the epochs after warm-up.")
    if fallback:
        intro += (f" Runs {', '.join(fallback)} logged no train_time: their *_train_s "
                  "columns are epoch_time, with validation.")
    return Section("Time per epoch", Role.TABLE, intro, frame=tpe, columns=shown(tpe, TPE_COLS))


def scaling_section(t: Tables) -> Section:
    return Section("Scaling", Role.TABLE, "Against the run with the fewest ranks, on training "
                   "time per epoch (median_train_s) and on throughput. normalised_time = T / "
                   "T_base; speedup = T_base / T; efficiency = speedup / (ranks / base ranks); "
                   "throughput_speedup = X / X_base, throughput_efficiency likewise "
                   "(throughput_voxels_s = throughput_samples_s x voxels per sample, a "
                   "slice's H x W or a slab's D x H x W, where the run record logs it).",
                   frame=t.scaling, columns=shown(t.scaling, SCALING_COLS))


def size_sections(t: Tables) -> list[Section]:
    """Throughput against input size: the table and the figure, when the runs were
    trained at two or more input sizes (none otherwise)."""
    table = t.throughput_vs_size
    if not compares_sizes(table):
        return []
    left_out = [r for r in t.runs["run"] if r not in set(table["run"])] if len(t.runs) else []
    intro = ("One row per run, by model, ranks and input size: voxels/s per rank "
             "(throughput_voxels_per_rank, steady training epochs) against the voxels of "
             "one sample (input_shape: a slice's H x W, a slab's D x H x W), as in the "
             "IBM large-model-support study's voxels/s against cube size. oneDNN and "
             "threads per rank move the throughput too: compare rows where they agree.")
    if left_out:
        intro += (f" Runs {', '.join(left_out)} logged no voxels_per_sample (older logs) "
                  "and are left out.")
    return [Section("Throughput against input size", Role.TABLE, intro, frame=table,
                    columns=shown(table, SIZE_COLS)),
            Section("Voxels per second per rank against input size", Role.FIGURE,
                    "Voxels per second per rank against voxels per sample (each tick names "
                    "the input shape), one line per model and rank count. Data: "
                    "throughput_vs_size.csv.", figure=SIZE_FIGURE)]


def link_section(t: Tables) -> Section | None:
    """The link between the ranks as each run measured it (older logs: not measured;
    ``None`` without runs)."""
    if not len(t.links):
        return None
    return Section("Link between the ranks (measured)", Role.TABLE, "Measured by each run "
                   "at its start: allreduces of growing sizes timed (the slowest rank's median "
                   "of each), and the ring model t(n) = 2 (R-1) latency + 2 (R-1)/R x n / B "
                   "fitted to them: bandwidth_gbps is B, latency_us the latency per message "
                   "round; largest_*: the largest size timed, its seconds and the rate it saw "
                   "(Gbit/s through each rank's link, latency included). A run whose ranks "
                   "were all on one host measured the host's own path (shared memory or "
                   "loopback), not a network. From the run record of the run's last launch. "
                   "traced_*: medians per step over the first steps of a launch's second "
                   "epoch, from Horovod's timeline (rank 0's epoch record, comm): the "
                   "gradients' allreduce (fusion copies and wire), beside "
                   "modelled_allreduce_s, what the fitted link gives for the logged gradient "
                   "bytes, and the time the first rank waited for the last before the step's "
                   "allreduces (imbalance, not the link). compression: how the gradients "
                   "travelled (none: exact float32; fp16: half the bytes, a rounded update; "
                   "(auto): decided at the run's start), and in links.csv compression_reason why: under "
                   "--compression auto, the step predicted with and without fp16 on the "
                   f"measured link, fp16 taken at {FP16_MIN_SPEEDUP:.2f}x the samples/s or "
                   "more. "
                   "All columns: links.csv.",
                   frame=t.links, columns=LINK_COLS)


def hours_section(t: Tables, smooth: int, unit: TimeUnit = HOURS) -> Section | None:
    """Time to each target (``None`` when no target was given)."""
    if not len(t.hours_to_target):
        return None
    intro = ("First wall-clock time at which the "
             + (f"trailing mean over {smooth} steps of the " if smooth > 1 else "")
             + "training loss (mean over ranks) is <= the target, or the global validation "
             "Dice >= the target; no interpolation; found on every step record. Times "
             f"({unit.word}) count from the run's agreed start (after start-up), summed over "
             "the launches of a resumed run; hours_to_target.csv has them in hours. steps, "
             "samples: the steps and real samples of all ranks trained on until then "
             "(see Statistical efficiency).")
    return Section("Time to target", Role.TABLE, intro, frame=t.hours_to_target,
                   columns=HOURS_COLS)


def efficiency_sections(t: Tables) -> list[Section]:
    """Samples to target and statistical efficiency: the sentences, the table and the
    figure (none when no target was given)."""
    table = t.statistical_efficiency
    if not len(table):
        return []
    base = table["base"].iloc[0]
    return [
        Section("Time to target, decomposed", Role.LIST, "Against the base run "
                f"{base} (fewest ranks): time-to-target speedup = throughput speedup x "
                "statistical efficiency x other, and the factor that limits adding ranks "
                "(the smaller of throughput efficiency and statistical efficiency).",
                items=tuple(table["summary"])),
        Section("Statistical efficiency", Role.TABLE, "steps, samples: the steps and real "
                "samples of all ranks trained on up to the record that met the target (a "
                "resumed run's redone steps count once); '> N': not reached after N. "
                "statistical_efficiency = base samples / samples (1: as sample-efficient as "
                "the base). time_speedup = base time / time; throughput_speedup as in "
                "Scaling; other_factor = time_speedup / (throughput_speedup x "
                "statistical_efficiency): warm-up, validation, restarts. All columns: "
                "statistical_efficiency.csv.", frame=table, columns=STATEFF_COLS),
        Section("Statistical efficiency and samples to target versus ranks", Role.FIGURE,
                "Per target: statistical efficiency against the base (left; 1 is as "
                "sample-efficient as the base) and samples to target (right); hollow "
                "triangles are bounds of targets not reached.", figure=EFFICIENCY_FIGURE),
    ]


SEED_COLS = ("group", "runs", "seeds", "ranks", "nodes", "metric", "target", "reached",
             "mean_h", "min_h", "max_h", "mean_samples", "min_samples", "max_samples")
NOISE_COLS = ("run", "ranks", "nodes", "global_batch_size", "at", "metric", "target",
              "target_epoch", "epoch", "samples", "b_simple", "b_simple_low",
              "b_simple_high", "effective_steps")
PREDICTION_COLS = ("run", "ranks", "metric", "target", "global_batch_size",
                   "base_global_batch", "base_samples", "noise_from", "noise_epochs",
                   "b_noise_first", "b_noise_last", "predicted_samples", "samples_text",
                   "measured_over_predicted")


def seed_section(extra: Mapping[str, pd.DataFrame], unit: TimeUnit = HOURS) -> Section | None:
    """Time and samples to target per group of runs that differ only in seed (``None``
    without such a group)."""
    table = extra.get("seed_groups")
    if table is None:
        return None
    for column in ("mean_h", "min_h", "max_h"):
        table = in_unit(table, column, unit)
    columns = tuple(c[:-1] + unit.name if c.endswith("_h") else c for c in SEED_COLS)
    return Section("Time to target by seed group", Role.TABLE, "Runs whose config.json "
                   "differs only in train.seed (and run_dir), at the same ranks, form a "
                   "group (named by its first run); per target: how many reached it, and the "
                   f"mean, min and max over those of the time ({unit.word}) and samples to "
                   "it. Each run's own row is in Time to target. All columns: "
                   "seed_groups.csv (times in hours).", frame=table,
                   columns=columns)


def _not_drawn(extra: Mapping[str, pd.DataFrame], t: Tables) -> list[str]:
    series = extra["noise_scale_series"]
    drawn = set(series.loc[series["b_simple"].astype(float).notna(), "run"])
    return [r for r in t.runs["run"] if r not in drawn] if len(t.runs) else []


def noise_sections(extra: Mapping[str, pd.DataFrame], t: Tables) -> list[Section]:
    """The gradient noise scale: per run near each target, over training, and the
    samples to target it predicts (none when no run measured it)."""
    if "noise_scale" not in extra:
        return []
    missing = _not_drawn(extra, t)
    out = [Section("Gradient noise scale", Role.TABLE, "B_simple = tr(Sigma) / |G|^2 "
                   "(McCandlish et al. 2018), in samples, as the trainer logs it at the end "
                   "of each epoch (moving averages of the per-step estimates from the ranks' "
                   "own and averaged gradients). Per run: at the end of training, and near "
                   "each target: at the end of target_epoch, the epoch in which the run "
                   "first reached it (epoch: the record read, the latest with a value). "
                   "samples: trained by the end of that epoch. b_simple_low, b_simple_high: "
                   "its 90 % confidence interval over the measured steps the averages are "
                   "worth (effective_steps); b_simple_high empty beside a b_simple_low: no "
                   "upper bound (|G|^2 not told from 0); both empty in logs from before "
                   "2026-11-28. All columns: noise_scale.csv.",
                   frame=extra["noise_scale"], columns=NOISE_COLS),
           Section("Gradient noise scale over training", Role.FIGURE, "B_simple at the end of "
                   "each epoch against the samples all ranks trained on (log scale), one "
                   "line per run, shaded over its 90 % interval where logged, above 0 and "
                   "bounded; the dotted line is the run's global batch. "
                   + (f"Not drawn (no noise scale logged or estimated): {', '.join(missing)}. "
                      if missing else "") + "Data: noise_scale_series.csv.",
                   figure=NOISE_FIGURE)]
    prediction = extra.get("noise_prediction")
    if prediction is not None:
        out.append(Section(
            "Samples to target predicted from the noise scale", Role.TABLE, "PREDICTED "
            "samples to target at each run's global batch B from the measured noise scale, "
            "averaged over training progress as Pollux does (not one snapshot): the "
            "training of noise_from (the base run, else the run with the fewest ranks that "
            "logged a noise scale) up to the target, epoch by epoch, each epoch's samples x "
            "(phi + B) / (phi + B_epoch), phi its noise scale (b_noise_first to "
            "b_noise_last over noise_epochs epochs) and B_epoch the global batch it ran; "
            "beside the measured samples (samples_text) and measured / predicted. All "
            "columns: noise_prediction.csv.", frame=prediction, columns=PREDICTION_COLS))
    return out


def loss_figure_section(unit: TimeUnit = HOURS) -> Section:
    return Section("Loss versus wall-clock time", Role.FIGURE, "Training loss per step "
                   "(lines) and validation loss per epoch (dashed, markers), against "
                   f"wall-clock {unit.word}. Data: loss_vs_time.csv (in hours; long runs "
                   "thinned to what a plot can show).", figure=LOSS_FIGURE)


def balance_section(t: Tables) -> Section:
    return Section("Rank balance", Role.TABLE, "Per run, steady steps: mean step time across "
                   "ranks, the slowest rank, imbalance ratio = slowest rank's mean step time / "
                   "mean over ranks (1.0 = balanced), and the largest share of step time "
                   "spent waiting for input. Per rank: rank_balance.csv. step_time includes "
                   "the gradient allreduce, where fast ranks wait for the slowest, so in "
                   "synchronous training step times even out; a rank that starves for input "
                   "shows in its data-wait share.", frame=t.rank_balance_summary)


def dice_sections(t: Tables) -> list[Section]:
    """The Dice figure, and the last epoch's Dice table when any rank logged Dice."""
    out = [Section("Validation Dice across ranks", Role.FIGURE, "Each rank scores its own "
                   "validation shard; the band is the min-max over ranks, the line the median, "
                   "dotted the global Dice. Data: val_dice_spread.csv.", figure=DICE_FIGURE)]
    if len(t.val_dice_last):
        out.append(Section("Validation Dice, last epoch", Role.TABLE, frame=t.val_dice_last))
    return out


def coverage_section(t: Tables) -> Section:
    return Section("Coverage", Role.TABLE, "Per epoch, whether the ranks' shards covered the "
                   "train set exactly once, from the logged sample counts and digests (see "
                   "docs/report.md, 'coverage.csv', for what this can and cannot prove). Per "
                   "epoch: coverage.csv.", frame=t.coverage_summary)


def projection_section(projection: Projection | None, error: str) -> Section | None:
    """The projection, or why it was not computed (``None`` when none was asked for)."""
    if projection is not None:
        return Section(PROJECTION_TITLE, Role.PROJECTION, frame=projection.table,
                       columns=PROJ_COLS, items=tuple(projection.assumptions))
    if error:
        return Section(PROJECTION_TITLE, Role.LIST, items=(f"not computed: {error}",))
    return None


def projection_target_section(projection: Projection | None,
                              unit: TimeUnit = HOURS) -> Section | None:
    """Projected time to each target (``None`` without a projection or targets); the
    times in ``unit`` (``projection_to_target.csv`` keeps hours)."""
    if projection is None or not len(projection.targets):
        return None
    shown = projection.targets.copy()
    names = {"hours": f"time_{unit.name}", "measured_hours": f"measured_{unit.name}"}
    for column in names:
        shown[column] = unit.of(shown[column].astype(float) * 3600.0)
    columns = tuple(names.get(c, c) for c in PROJ_TARGET_COLS)
    return Section(PROJECTION_TARGET_TITLE, Role.PROJECTION, frame=shown.rename(columns=names),
                   columns=columns, items=tuple(projection.target_assumptions))


def lr_find_section(extra: Mapping[str, pd.DataFrame]) -> Section | None:
    """The runs' lr range tests (``--lr auto``), none when no run made one."""
    if "lr_find" not in extra:
        return None
    return Section("Learning-rate range test", Role.FIGURE, "Each run that found its lr with "
                   "--lr auto: the training loss of the global batch at each step of the sweep "
                   "against its lr (thin), smoothed both ways (thick), and the lr chosen "
                   "(dashed; the steepest fall, on a grid of sqrt(2) steps). Data: lr_find.csv.",
                   figure=LR_FIND_FIGURE)


def _fastest(g: pd.DataFrame) -> str:
    """The fastest measured run of one target's rows of the efficiency table."""
    reached = g[g["reached"].astype(bool)]
    if not len(reached):
        return f"{_goal(g.iloc[0])}: no run reached it"
    row = reached.loc[reached["hours"].astype(float).idxmin()]
    who = f"{row['run']} ({int(row['ranks'])} rank{'s' if int(row['ranks']) != 1 else ''})"
    if row["run"] == row["base"]:
        return f"{_goal(row)}: fastest measured {who}, in {row['result']} (the base run)"
    limit = f"; {row['limited_by']} limits it" if row["limited_by"] else ""
    return (f"{_goal(row)}: fastest measured {who}, in {row['result']}, "
            f"{float(row['time_speedup']):.2f}x sooner than {row['base']}{limit}")


def _predicted(projection: Projection | None, row) -> str | None:
    """The prediction for one target at the largest node count asked for, if any."""
    if projection is None or not len(projection.targets):
        return None
    p = projection.targets
    p = p[(p["kind"] == "projection") & (p["metric"] == row["metric"])
          & (p["target"].astype(float) == float(row["target"]))]
    if not len(p):
        return None
    last = p.loc[p["nodes"].astype(float).idxmax()]
    hours = float(last["hours"])
    when = f", {hours:.3g} h" if math.isfinite(hours) else ""
    return (f"{_goal(row)}: predicted at {int(last['nodes'])} nodes {float(last['time_speedup']):.3g}x "
            f"the base{when} (model, not measured)")


def answer_section(t: Tables, projection: Projection | None,
                   lead: Sequence[tuple[str, str]] = ()) -> Section | None:
    """The report's first screen: ``lead`` (a cross-validation's lines, with the section
    each sums up), per target the fastest measured run, its speedup and what limits it,
    and the prediction at the largest node count asked; each run's lr. Each line links
    to the section it sums up. With a cross-validation's lines the fastest run is left
    out: its runs differ in fold and recipe, and the CV's lines say which node count
    reaches the target soonest."""
    items: list[tuple[str, str]] = list(lead)
    eff = t.statistical_efficiency if not lead else t.statistical_efficiency.iloc[0:0]
    for _, g in (eff.groupby(["metric", "target"], sort=False) if len(eff) else ()):
        items.append((_fastest(g), "Time to target, decomposed"))
        predicted = _predicted(projection, g.iloc[0])
        if predicted:
            items.append((predicted, PROJECTION_TARGET_TITLE))
    if not items and len(t.scaling) > 1:
        best = t.scaling.loc[t.scaling["throughput_speedup"].astype(float).idxmax()]
        items.append((f"no target given (--target-loss, --target-dice): the highest "
                      f"throughput is {best['run']}'s, {float(best['throughput_speedup']):.2f}x "
                      f"the base", "Scaling"))
    if "lr" in t.runs and t.runs["lr"].notna().any():
        lrs = ", ".join(f"{r} {lr}" for r, lr in zip(t.runs["run"], t.runs["lr"]) if lr)
        items.append((f"lr: {lrs}", "Runs"))
    if not items:
        return None
    return Section(ANSWER_TITLE, Role.LIST, "", items=tuple(i for i, _ in items),
                   links=tuple(to for _, to in items))


def notes_section(notes: Sequence[Note]) -> Section:
    others = tuple(n.line() for n in notes if n.level != "warning")
    return Section("Skipped and notes", Role.LIST, "What was left out of the numbers, and why.",
                   items=others or ("nothing skipped",))


def sections(t: Tables, notes: Sequence[Note], smooth: int = 0,
             projection: Projection | None = None, projection_error: str = "",
             unit: TimeUnit = HOURS,
             extra: Mapping[str, pd.DataFrame] | None = None,
             lead: Sequence[tuple[str, str]] = (),
             cv: Sequence[Section] = ()) -> tuple[Section, ...]:
    """The report's sections in reading order.

    Args:
      t: the computed tables.
      notes: every note (warnings get their own section, first).
      smooth: the ``--smooth`` window, named in the hours-to-target intro.
      projection: the fitted model, if any.
      projection_error: why a projection that was asked for is missing.
      unit: the unit wall-clock times are shown in.
      extra: the optional tables (``document.OPTIONAL_CSV``) the runs gave rows.
      lead: the first lines of "The answer" (a cross-validation's), each with the title
        of the section it sums up.
      cv: a cross-validation's sections (``analysis.cvrender.sections``), after the
        warnings.
    """
    extra = extra or {}
    parts = [answer_section(t, projection, lead), runs_section(t, unit),
             warnings_section(notes), *cv, time_per_epoch_section(t),
             scaling_section(t), *size_sections(t), link_section(t),
             hours_section(t, smooth, unit),
             seed_section(extra, unit), *efficiency_sections(t), *noise_sections(extra, t),
             lr_find_section(extra),
             loss_figure_section(unit), balance_section(t), *dice_sections(t),
             coverage_section(t), projection_section(projection, projection_error),
             projection_target_section(projection, unit), notes_section(notes)]
    return tuple(p for p in parts if p is not None)
