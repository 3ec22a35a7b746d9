"""The cross-validation part of ``distseg-report``: from CV directories to folds, to the
CV tables, sections and the lines of "The answer" (the statistics: ``analysis.cv``).

A positional argument that holds a ``cv.json`` (``distseg.core.cvplan``) stands for
every run of its plan (``expand``); a run is named ``RECIPE-nN-fold-I``
(``CVNAME/RECIPE-nN-fold-I`` when several CV directories are given), and a run listed
twice (in a plan and on its own) is read once. A planned run without logs is missing:
it is a row of ``cv_runs.csv`` and a note, never an error. Plain run directories given
beside a CV are in every other table, not in the CV's.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import pandas as pd

from analysis import cv, tables
from analysis.document import HOURS, Note, Role, Section, TimeUnit
from analysis.logs import RunData, RunDirError, log_files
from analysis.outline import in_unit
from distseg.core import cvplan
from distseg.core import oof as oof_lib
from distseg.core.errors import InputError

DICE_TITLE = "Cross-validation"
PAIRED_TITLE = "Cross-validation: paired differences"
HOURS_TITLE = "Cross-validation: hours"
DIMS_TITLE = "Cross-validation: 2D and 3D recipes"
CONFIGS_TITLE = "Cross-validation: configurations"
RUNS_TITLE = "Cross-validation: runs"


@dataclass(frozen=True)
class CvInput:
    """One CV directory given to the report: its plan, and per planned run its
    directory when that has logs (``None``: missing) and its label."""

    cv_dir: str
    name: str
    plan: cvplan.CvPlan
    paths: tuple[str | None, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Inputs:
    """The report's arguments expanded (``expand``)."""

    run_dirs: list[str]
    """Every directory to read, once each, in the order given."""
    labels: dict[str, str]
    """Run directory -> its name in the tables (the CV runs')."""
    cvs: list[CvInput] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


def _has_logs(path: str) -> bool:
    return os.path.isdir(path) and bool(log_files(path))


def _cv_input(cv_dir: str, several: bool) -> tuple[CvInput, list[Note]]:
    plan = cvplan.read(cv_dir)
    name = os.path.basename(os.path.normpath(cv_dir)) or cv_dir
    paths, labels, notes = [], [], []
    for run in plan.runs:
        path = plan.run_path(cv_dir, run)
        label = f"{name}/{run.label}" if several else run.label
        paths.append(path if _has_logs(path) else None)
        labels.append(label)
        if paths[-1] is None:
            notes.append(Note("skipped", label, f"missing: no logs in {path} (not run yet, "
                              "or lost); left out of the cross-validation"))
    return CvInput(cv_dir, name, plan, tuple(paths), tuple(labels)), notes


def expand(args: Sequence[str]) -> Inputs:
    """Run directories and CV directories -> what to read (``Inputs``).

    Raises:
      InputError: a CV directory's plan is unreadable (``cvplan.read``).
      RunDirError: nothing to read at all (every planned run missing, no plain run).
    """
    several = sum(cvplan.is_cv_dir(a) for a in args) > 1
    out = Inputs([], {})
    seen: set[str] = set()
    for arg in args:
        if not cvplan.is_cv_dir(arg):
            if os.path.realpath(arg) not in seen:
                seen.add(os.path.realpath(arg))
                out.run_dirs.append(arg)
            continue
        given, notes = _cv_input(arg, several)
        out.cvs.append(given)
        out.notes.extend(notes)
        for path, label in zip(given.paths, given.labels):
            if path is not None and os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                out.run_dirs.append(path)
                out.labels[path] = label
    if not out.run_dirs:
        planned = sum(len(c.plan.runs) for c in out.cvs)
        raise RunDirError(f"{', '.join(c.cv_dir for c in out.cvs)}: none of the {planned} "
                          "planned runs has logs yet")
    return out


def _per_epoch(run: RunData) -> dict[int, dict[str, float]]:
    """Epoch -> the global validation Dice per class (the lowest rank's record)."""
    e = tables.first_per_epoch(run)
    cols = [c for c in run.classes if "dice_" + c in e.columns]
    return {int(row["epoch"]): {c: float(row["dice_" + c]) for c in cols}
            for _, row in e.iterrows()}


def _cases(run: RunData, epoch: int) -> dict[str, dict[str, float]] | None:
    """Every rank's ``val_cases_local`` at ``epoch`` merged (``None``: none logged)."""
    if "val_cases_local" not in run.epochs.columns:
        return None
    logged = run.epochs.loc[run.epochs["epoch"] == epoch, "val_cases_local"]
    merged: dict[str, dict[str, float]] = {}
    for cases in logged:
        if isinstance(cases, dict):
            merged.update({str(k): v for k, v in cases.items() if isinstance(v, dict)})
    return merged or None


def spatial_dims(run: RunData) -> int | None:
    """2 or 3, from config.json's ``model.spatial_dims``, else the run record's model."""
    model = (run.config or {}).get("model")
    dims = model.get("spatial_dims") if isinstance(model, dict) else None
    if dims in (2, 3):
        return int(dims)
    name = run.model.get("name")
    return {"unet2d": 2, "unet3d": 3}.get(name) if isinstance(name, str) else None


def fold_of(planned: cvplan.CvRun, label: str, run: RunData | None, hours: float,
            to_target: Mapping[float, float]) -> tuple[cv.Fold, list[Note]]:
    """One planned run as a ``cv.Fold``, and a note where its config names another
    fold than the plan. Counted only when every rank of its last launch ended ``ok``."""
    key = dict(recipe=planned.recipe, nodes=planned.nodes, fold=planned.fold, run=label)
    if run is None:
        return cv.Fold(**key, status="missing", counted=False), []
    per_epoch = _per_epoch(run)
    final = max(per_epoch) if per_epoch else None
    best = cv.best_epoch(per_epoch, run.classes)
    counted = run.finished and final is not None
    data = (run.config or {}).get("data")
    logged = data.get("fold") if isinstance(data, dict) else None
    notes = []
    if logged is not None and logged != planned.fold:
        notes.append(Note("warning", label, f"config.json data.fold is {logged}, the plan "
                          f"says fold {planned.fold}: paired by the plan's"))
    status = "ok" if counted else f"unfinished: {run.status}"
    return cv.Fold(**key, status=status, counted=counted, spatial_dims=spatial_dims(run),
                   final_epoch=final, final=per_epoch.get(final, {}), best_epoch=best,
                   best=per_epoch.get(best, {}),
                   cases=_cases(run, final) if final is not None else None,
                   hours=hours, to_target=dict(to_target),
                   fall=cv.falls(per_epoch, run.classes)), notes


@dataclass(frozen=True)
class CvReport:
    """One CV directory's folds, groups, paired differences and answer."""

    name: str
    classes: tuple[str, ...]
    targets: tuple[float, ...]
    folds: tuple[cv.Fold, ...]
    groups: tuple[cv.Group, ...]
    paired: tuple[cv.Paired, ...]
    answer: cv.Answer
    configs: tuple[cv.Configuration, ...] = ()
    """Each recipe and pair out of fold (``CV/oof/``, ``distseg-predict --out-of-fold``)."""
    chosen: cv.ConfigAnswer | None = None


def _to_target(hours: pd.DataFrame, label: str) -> dict[float, float]:
    rows = hours[(hours["run"] == label) & hours["metric"].str.startswith("val_dice")]
    return {float(r["target"]): float(r["hours"]) if r["reached"] else math.nan
            for _, r in rows.iterrows()}


def _paired_all(groups: Sequence[cv.Group], classes: Sequence[str]) -> list[cv.Paired]:
    """Each recipe against the best at each node count, then over every node count."""
    out = []
    for nodes in [*sorted({g.nodes for g in groups}), None]:
        best = cv.best_recipe(groups, nodes)
        here = [g.recipe for g in groups if nodes is None or g.nodes == nodes]
        out += [cv.paired(groups, r, best, nodes, classes)
                for r in dict.fromkeys(here) if best and r != best]
    return out


def build(given: CvInput, runs: Mapping[str, RunData], targets: Sequence[float],
          dice_class: str | None, wall_seconds: Callable[[RunData], float],
          unit: TimeUnit = HOURS) -> tuple[CvReport, list[Note]]:
    """The CV of ``given`` from its loaded runs (``runs``: label -> run) and targets
    (hours to each: ``tables.hours_to_target``, as for every run)."""
    loaded = [runs[label] for label, path in zip(given.labels, given.paths)
              if path is not None and label in runs]
    hours = tables.hours_to_target(loaded, (), targets, 0, dice_class, unit)
    classes = tuple(dict.fromkeys(c for r in loaded for c in r.classes))
    folds, notes = [], []
    for planned, label in zip(given.plan.runs, given.labels):
        run = runs.get(label)
        wall = wall_seconds(run) / 3600.0 if run is not None else math.nan
        fold, more = fold_of(planned, label, run, wall, _to_target(hours, label))
        folds.append(fold)
        notes += more
        if run is not None and not fold.counted:
            notes.append(Note("info", label, f"left out of the cross-validation: {fold.status}"))
    groups = cv.summarise(folds, classes, targets)
    for g in groups:
        if g.folds and not all(f.cases for f in g.folds):
            notes.append(Note("info", f"{given.name}/{g.recipe}-n{g.nodes}",
                              f"out-of-fold Dice: {g.oof_basis}"))
    answer = cv.decide(groups, classes, targets)
    configs, more = out_of_fold(given, groups, classes)
    return CvReport(given.name, classes, tuple(targets), tuple(folds), tuple(groups),
                    tuple(_paired_all(groups, classes)), answer, tuple(configs),
                    cv.choose_configuration(configs)), notes + more


def out_of_fold(given: CvInput, groups: Sequence[cv.Group],
                classes: Sequence[str]) -> tuple[list[cv.Configuration], list[Note]]:
    """The configurations scored in ``CV/oof/`` (none where it was not made, or with a
    note where it cannot be read)."""
    try:
        scores = oof_lib.read(given.cv_dir)
    except InputError as e:
        return [], [Note("warning", given.name, f"out-of-fold scores left out: {e}")]
    if scores is None:
        return [], []
    return cv.configurations(scores.rows, classes, groups, scores.seconds,
                             lambda nodes, name: oof_lib.postprocessing(scores, nodes, name)), []


def _folds_text(values: Sequence[float]) -> str:
    return " ".join(f"{v:.4f}" if math.isfinite(v) else "-" for v in values)


def _interval_cols(prefix: str, i: cv.Interval) -> dict:
    return {f"{prefix}_mean": i.mean, f"{prefix}_sd": i.sd, f"{prefix}_low": i.low,
            f"{prefix}_high": i.high}


def runs_frame(reports: Sequence[CvReport]) -> pd.DataFrame:
    """``cv_runs.csv``: one row per planned run."""
    rows = []
    for rep in reports:
        for f in rep.folds:
            row = {"cv": rep.name, "recipe": f.recipe, "nodes": f.nodes, "fold": f.fold,
                   "run": f.run, "status": f.status, "counted": f.counted,
                   "spatial_dims": f.spatial_dims, "final_epoch": f.final_epoch,
                   "best_epoch": f.best_epoch,
                   "final_mean_foreground": cv.mean_foreground(f.final, rep.classes),
                   "best_mean_foreground": cv.mean_foreground(f.best, rep.classes),
                   "cases": len(f.cases) if f.cases else 0, "hours": f.hours,
                   "largest_fall": f.fall.get(cv.FOREGROUND, math.nan)}
            row.update({f"final_{c}": f.final.get(c, math.nan) for c in rep.classes})
            row.update({f"best_{c}": f.best.get(c, math.nan) for c in rep.classes})
            row.update({f"hours_to_{t:g}": f.to_target.get(t, math.nan) for t in rep.targets})
            rows.append(row)
    return pd.DataFrame(rows)


def dice_frame(reports: Sequence[CvReport]) -> pd.DataFrame:
    """``cv_dice.csv``: one row per recipe, node count and class."""
    rows = []
    for rep in reports:
        for g in rep.groups:
            for c in [*rep.classes, cv.FOREGROUND]:
                pick = (lambda d, c=c: cv.mean_foreground(d, rep.classes)
                        if c == cv.FOREGROUND else d.get(c, math.nan))
                rows.append({"cv": rep.name, "recipe": g.recipe, "nodes": g.nodes,
                             "spatial_dims": g.spatial_dims, "class": c,
                             "folds": len(g.folds), "planned": g.planned,
                             **_interval_cols("final", g.final[c]),
                             "final_folds": _folds_text([pick(f.final) for f in g.folds]),
                             **_interval_cols("best", g.best[c]),
                             "largest_fall": max([f.fall.get(c, 0.0) for f in g.folds],
                                                 default=math.nan),
                             "best_folds": _folds_text([pick(f.best) for f in g.folds]),
                             "oof": g.oof.get(c, math.nan), "oof_basis": g.oof_basis})
    return pd.DataFrame(rows)


def paired_frame(reports: Sequence[CvReport]) -> pd.DataFrame:
    """``cv_paired.csv``: each recipe minus the best, fold by fold."""
    rows = [{"cv": rep.name, "nodes": "all" if p.nodes is None else p.nodes,
             "recipe": p.recipe, "best": p.best, "folds": len(p.folds),
             **_interval_cols("diff", p.diff), "within_noise": p.within_noise,
             "differences": _folds_text(p.differences)}
            for rep in reports for p in rep.paired]
    return pd.DataFrame(rows)


def hours_frame(reports: Sequence[CvReport]) -> pd.DataFrame:
    """``cv_hours.csv``: per recipe, node count and target (one row without targets)."""
    rows = []
    for rep in reports:
        for g in rep.groups:
            base = {"cv": rep.name, "recipe": g.recipe, "nodes": g.nodes,
                    "spatial_dims": g.spatial_dims, "folds": len(g.folds),
                    "planned": g.planned, "hours_per_fold": g.hours_per_fold,
                    "hours_total": g.hours_total, "hours_side_by_side": g.hours_side_by_side}
            for t in rep.targets or (None,):
                i = g.to_target[t] if t is not None else cv.interval([])
                rows.append({**base, "target": t, "reached": f"{i.n} of {len(g.folds)}",
                             "to_target_mean_h": i.mean, "to_target_sd_h": i.sd,
                             "to_target_folds": _folds_text(
                                 [f.to_target.get(t, math.nan) for f in g.folds])})
    return pd.DataFrame(rows)


def configs_frame(reports: Sequence[CvReport]) -> pd.DataFrame:
    """``cv_configs.csv``: one row per configuration and node count, its out-of-fold
    Dice per class, spread and hours."""
    rows = []
    for rep in reports:
        for c in rep.configs:
            rows.append({"cv": rep.name, "configuration": c.name, "model": c.dims,
                         "nodes": c.nodes, "oof_mean_foreground": c.score,
                         **{f"oof_{k}": c.oof.get(k, math.nan) for k in tables.foreground(rep.classes)},
                         "cases": c.cases, "case_sd": c.case_sd,
                         **_interval_cols("folds", c.over_folds),
                         "fold_values": _folds_text(list(c.folds.values())),
                         "mirror": c.mirror_text,
                         "largest_component": " ".join(c.kept) or "-",
                         "post_mean_foreground": c.post_oof[cv.FOREGROUND],
                         **{f"post_{k}": c.post_oof.get(k, math.nan)
                            for k in tables.foreground(rep.classes)},
                         "train_h": c.hours, "predict_h": c.predict_hours,
                         "shipped": rep.chosen is not None and rep.chosen.name == c.name})
    return pd.DataFrame(rows)


#: The CV's tables by their ``document.OPTIONAL_CSV`` name.
FRAMES = {"cv_runs": runs_frame, "cv_dice": dice_frame, "cv_paired": paired_frame,
          "cv_hours": hours_frame, "cv_configs": configs_frame}


def frames(reports: Sequence[CvReport]) -> dict[str, pd.DataFrame]:
    return {name: make(reports) for name, make in FRAMES.items()} if reports else {}


def _ci(low: float, high: float) -> str:
    return f"[{low:.4f}, {high:.4f}]" if math.isfinite(low) else f"(< {cv.MIN_FOLDS} folds)"


def _ship_line(rep: CvReport, unit: TimeUnit) -> str:
    a = rep.answer
    if a.recipe is None:
        return f"{rep.name}: no fold finished yet: nothing to decide"
    score = f"out-of-fold mean foreground Dice {a.scores[a.best]:.4f}"
    if a.versus is None:
        return f"{rep.name}: ship {a.recipe} (the only recipe; {score})"
    d = a.versus.diff
    diff = (f"paired difference {d.mean:+.4f} over {d.n} folds, 95 % interval "
            f"{_ci(d.low, d.high)}")
    if a.tied:
        hours = {r: unit.text(cv.recipe_hours(rep.groups, r) * 3600) for r in (a.best, a.runner_up)}
        why = (f"as good within noise and at least {cv.CHEAPER:.0%} cheaper on every fold"
               if a.recipe == a.runner_up else
               f"the higher; {a.runner_up} was not {cv.CHEAPER:.0%} cheaper on every fold")
        return (f"{rep.name}: {a.best} ({a.scores[a.best]:.4f}) and {a.runner_up} "
                f"({a.scores[a.runner_up]:.4f}) cannot be told apart ({diff}, covers 0): "
                f"ship {a.recipe}, {why} ({a.best} {hours[a.best]} a fold, {a.runner_up} "
                f"{hours[a.runner_up]})")
    noise = "" if a.versus.within_noise is False else "; too few folds to tell them apart"
    return (f"{rep.name}: ship {a.recipe} ({score}; {a.runner_up} "
            f"{a.scores[a.runner_up]:.4f}, {diff}{noise})")


def _nodes_lines(rep: CvReport, unit: TimeUnit) -> list[str]:
    a = rep.answer
    if a.recipe is None:
        return []
    if not rep.targets:
        mine = [g for g in rep.groups if g.recipe == a.recipe and g.folds]
        g = min(mine, key=lambda g: g.hours_per_fold)
        return [f"{rep.name}: no target Dice (cv.json target_dice or --target-dice): "
                f"{a.recipe} trains a fold soonest at {g.nodes} node(s), "
                f"{unit.text(g.hours_per_fold * 3600)} on mean"]
    out = []
    for t, nodes in a.nodes.items():
        if nodes is None:
            out.append(f"{rep.name}: no fold of {a.recipe} reached val Dice >= {t:g}")
            continue
        g = next(g for g in rep.groups if (g.recipe, g.nodes) == (a.recipe, nodes))
        reached = g.to_target[t].n
        missed = [str(f.fold) for f in g.folds if not math.isfinite(f.to_target.get(t, math.nan))]
        out.append(f"{rep.name}: {a.recipe} reaches val Dice >= {t:g} soonest at {nodes} "
                   f"node(s): {unit.text(g.to_target[t].mean * 3600)} on mean over "
                   f"{reached} of {len(g.folds)} folds"
                   + (f" (fold {', '.join(missed)} never did)" if missed else ""))
    return out


def _cost_line(rep: CvReport, unit: TimeUnit) -> str:
    hours = [f.hours for f in rep.folds if f.counted and math.isfinite(f.hours)]
    counted, planned = len(hours), len(rep.folds)
    if not hours:
        return f"{rep.name}: 0 of {planned} runs counted"
    return (f"{rep.name}: {counted} of {planned} runs counted, "
            f"{unit.text(sum(hours) * 3600)} of training in all, "
            f"{unit.text(max(hours) * 3600)} with every run side by side")


def _config_hours(rep: CvReport, name: str, unit: TimeUnit) -> str:
    """``training 1.20 min at 1 node(s), ... (every fold's, added up); predicting its 8
    out-of-fold cases 3.0 s``: what one configuration costs."""
    mine = [c for c in rep.configs if c.name == name]
    train = ", ".join(f"{unit.text(c.hours * 3600)} at {c.nodes} node(s)" for c in mine)
    predict = [c.predict_hours for c in mine if math.isfinite(c.predict_hours)]
    return (f"training {train} (every fold's, added up)"
            + (f"; predicting its {mine[0].cases} out-of-fold cases "
               f"{unit.text(statistics.fmean(predict) * 3600)}" if predict else ""))


def _config_line(rep: CvReport, unit: TimeUnit) -> str:
    """The configuration to ship out of fold, with its hours and what it beat."""
    a = rep.chosen
    kind = next(c.dims for c in rep.configs if c.name == a.name)
    what = "ensemble" if len(a.members) > 1 else "recipe"
    line = (f"{rep.name}: configurations out of fold: ship {a.name} ({kind} {what}; mean "
            f"foreground Dice {a.scores[a.name]:.4f}")
    if a.best_single != a.name:
        line += f", the best single recipe {a.best_single} {a.scores[a.best_single]:.4f}"
    if a.runner_up is not None:
        d = a.versus
        line += (f"; over {a.runner_up} ({a.scores[a.runner_up]:.4f}) fold by fold "
                 f"{d.mean:+.4f}, 95 % interval {_ci(d.low, d.high)}")
    if a.tied:
        line += f"; a tie within {cv.TIE:g} goes to the configuration listed first"
    return f"{line}){_post_words(rep, a.name)}: {_config_hours(rep, a.name, unit)}"


def _post_words(rep: CvReport, name: str) -> str:
    """``, mirrored, with the largest component of liver: 0.8123`` (the score after
    post-processing, averaged over node counts), or nothing where neither is applied."""
    mine = [c for c in rep.configs if c.name == name]
    kept = list(dict.fromkeys(k for c in mine for k in c.kept))
    mirrored = any(c.mirror_text == "yes" for c in mine)
    if not (kept or mirrored):
        return ""
    score = statistics.fmean(c.post_oof[cv.FOREGROUND] for c in mine)
    words = (["mirrored"] if mirrored else []) + (
        [f"with the largest component of {' and '.join(kept)}"] if kept else [])
    return f", {', '.join(words)} {score:.4f}"


def answer_items(reports: Sequence[CvReport],
                 unit: TimeUnit = HOURS) -> list[tuple[str, str]]:
    """The lines of "The answer" for each CV, with the section each sums up."""
    out = []
    for rep in reports:
        out.append((_ship_line(rep, unit), PAIRED_TITLE))
        if rep.chosen is not None:
            out.append((_config_line(rep, unit), CONFIGS_TITLE))
        out += [(line, HOURS_TITLE) for line in _nodes_lines(rep, unit)]
        out.append((_cost_line(rep, unit), HOURS_TITLE))
    return out


DICE_COLS = ("cv", "recipe", "nodes", "spatial_dims", "class", "folds", "final_mean",
             "final_sd", "final_low", "final_high", "final_folds", "best_mean", "best_low",
             "best_high", "largest_fall", "oof", "oof_basis")
PAIRED_COLS = ("cv", "nodes", "recipe", "best", "folds", "diff_mean", "diff_low",
               "diff_high", "within_noise", "differences")
HOURS_COLS = ("cv", "recipe", "nodes", "spatial_dims", "folds", "planned", "target",
              "reached", "to_target_mean_h", "hours_per_fold", "hours_total",
              "hours_side_by_side")
RUNS_COLS = ("cv", "run", "fold", "status", "counted", "final_epoch", "best_epoch",
             "final_mean_foreground", "best_mean_foreground", "largest_fall", "cases", "hours")


#: The hours columns of ``cv_hours.csv`` as the documents name them (then in the
#: report's unit: ``to_target_min``).
HOURS_SHOWN = {"to_target_mean_h": "to_target_h", "hours_per_fold": "per_fold_h",
               "hours_total": "total_h", "hours_side_by_side": "side_by_side_h"}


def _hours_shown(table: pd.DataFrame, unit: TimeUnit) -> tuple[pd.DataFrame, tuple[str, ...]]:
    shown = table.rename(columns=HOURS_SHOWN)
    for c in HOURS_SHOWN.values():
        shown = in_unit(shown, c, unit)
    named = {c: c[:-1] + unit.name for c in HOURS_SHOWN.values()}
    return shown, tuple(named.get(HOURS_SHOWN.get(c, c), c) for c in HOURS_COLS)


def _dims_section(reports: Sequence[CvReport]) -> Section | None:
    rows = []
    for rep in reports:
        dims = {g.spatial_dims for g in rep.groups}
        if {2, 3} <= dims:
            two, three = cv.ensemble_pair(rep.groups)
            rows += [{"cv": rep.name, "recipe": g.recipe, "model": f"{g.spatial_dims}D",
                      "nodes": g.nodes, "oof_mean_foreground": g.score,
                      "hours_per_fold": g.hours_per_fold, "hours_total": g.hours_total,
                      "best_of_its_kind": g.recipe in (two, three)} for g in rep.groups]
    if not rows:
        return None
    return Section(DIMS_TITLE, Role.TABLE, "The 2D and the 3D recipes side by side (model: "
                   "config.json model.spatial_dims), with their hours; best_of_its_kind marks "
                   "the best 2D and the best 3D recipe by out-of-fold Dice, the pair a 2D + "
                   "3D ensemble would combine (distseg-predict --cv CV --out-of-fold scores "
                   "it, and this table becomes the configurations').", frame=pd.DataFrame(rows))


def _configs_section(extra: Mapping[str, pd.DataFrame], unit: TimeUnit) -> Section:
    table = extra["cv_configs"]
    shown = in_unit(in_unit(table, "train_h", unit), "predict_h", unit)
    classes = [c for c in table.columns if c.startswith("oof_")]
    columns = ("cv", "configuration", "model", "nodes", *classes, "cases", "case_sd",
               "folds_mean", "folds_low", "folds_high", "fold_values", "mirror",
               "largest_component", "post_mean_foreground",
               *(c for c in shown.columns if c.startswith(("train_", "predict_"))), "shipped")
    return Section(CONFIGS_TITLE, Role.TABLE, "Each recipe and each pair's ensemble (the mean "
                   "of the two recipes' softmax probabilities, case by case), scored on every "
                   "case by the models of the fold that validated it (distseg-predict --cv CV "
                   "--out-of-fold, CV/oof/): oof_* is the mean over cases of each class's Dice "
                   "and of their mean over the foreground classes (nnU-Net's "
                   "find_best_configuration score); case_sd its sd over cases; folds_* the "
                   "mean and 95 % interval over the folds' means, fold_values each fold's. "
                   "mirror: test-time mirroring, decided on these cases (yes where it raises "
                   "the mean foreground Dice; -: not scored, --tta none); "
                   "largest_component: the classes that keep only their largest connected "
                   "component, decided on the prediction so chosen (where it raises the "
                   "class's mean Dice), and post_*: the Dice with both; the ranking is before "
                   "them, as nnU-Net's. "
                   f"train: every fold's training {unit.word} added up (an ensemble: both "
                   "recipes'); predict: its networks over the out-of-fold cases. shipped: the "
                   "highest oof_mean_foreground averaged over node counts, a tie within "
                   f"{cv.TIE:g} going to the one listed first (a single recipe before an "
                   "ensemble). All columns: cv_configs.csv (in hours).",
                   frame=shown, columns=columns)


def sections(reports: Sequence[CvReport], extra: Mapping[str, pd.DataFrame],
             unit: TimeUnit = HOURS) -> list[Section]:
    """The CV's sections (none without a CV)."""
    if not reports:
        return []
    hours, hour_cols = _hours_shown(extra.get("cv_hours", pd.DataFrame()), unit)
    out = [Section(DICE_TITLE, Role.TABLE, "Per recipe, node count and class, over the "
                   "folds that finished: final = the last epoch's validation Dice, best = the "
                   "epoch of the highest mean foreground Dice; mean, sd and 95 % interval "
                   "(Student t over folds, from 3 folds), each fold's value in fold order; "
                   "largest_fall: the largest fall between two consecutive validations in "
                   "the second half of any fold's run (how much the last epochs swing). "
                   "oof: the out-of-fold Dice, each case's Dice from the fold that validated "
                   "it averaged over all cases (nnU-Net), or the mean of folds where a fold "
                   "logged no per-case Dice (oof_basis). All columns: cv_dice.csv.",
                   frame=extra.get("cv_dice", pd.DataFrame()), columns=DICE_COLS)]
    if len(extra.get("cv_paired", ())):  # a CV of one recipe has nothing to pair
        out.append(Section(PAIRED_TITLE, Role.TABLE, "Each recipe minus the best recipe (highest "
                   "oof mean foreground Dice), fold by fold on the same fold and node count "
                   "(each fold's mean foreground Dice over its cases); nodes 'all': each "
                   "fold's differences averaged over the node counts. within_noise: the 95 % "
                   "interval covers 0. All columns: cv_paired.csv.",
                   frame=extra["cv_paired"], columns=PAIRED_COLS))
    out.append(Section(HOURS_TITLE, Role.TABLE, f"Wall-clock {unit.word} per recipe and node "
                   "count: to the target Dice (mean over the folds that reached it; reached: "
                   "how many), per fold (mean), all folds added up (total) and the longest "
                   "fold (side_by_side: the CV's wall time with its folds run at once). "
                   "All columns: cv_hours.csv (in hours).", frame=hours, columns=hour_cols))
    if len(extra.get("cv_configs", ())):
        out.append(_configs_section(extra, unit))
    else:
        dims = _dims_section(reports)
        if dims is not None:
            out.append(dims)
    out.append(Section(RUNS_TITLE, Role.TABLE, "One row per planned run: missing (no logs) "
                       "and unfinished runs are left out of the statistics. All columns: "
                       "cv_runs.csv.", frame=extra.get("cv_runs", pd.DataFrame()), columns=RUNS_COLS))
    return out
