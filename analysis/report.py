"""``distseg-report``: from run directories to tables, plots and documents.

``build`` reads the runs and computes every table; ``write`` puts the CSVs, plots,
``report.md``, ``report.html`` and ``report.json`` into the output directory; ``main``
does both and prints Markdown (or JSON) for the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Sequence, TextIO

import pandas as pd

from analysis import (
    checks,
    coverage,
    cvrender,
    links,
    logs,
    lrrange,
    mismatch,
    noise,
    outline,
    render,
    seeds,
    stateff,
    tables,
)
from analysis.document import (
    HOURS,
    OPTIONAL_CSV,
    Document,
    Note,
    Projection,
    Role,
    Section,
    Tables,
    TimeUnit,
    csv_files,
    time_unit,
)
from analysis.logs import RunData
from analysis.project import project
from analysis.project import warnings as projection_warnings
from analysis.reduce import CurveSpec
from analysis.stepmodel import Fabric

FORMATS = ("md", "json")
#: The per-node prediction's figure and title (``node_sections``).
NODES_FIGURE = "projection_nodes.png"
NODES_TITLE = "Prediction per node count (model, not measured)"
NODE_COLS = ("kind", "run", "metric", "target", "nodes", "ranks", "predicted_per_rank_batch",
             "measured_per_rank_batch", "predicted_global_batch", "measured_global_batch",
             "lr_rule", "predicted_lr", "measured_lr", "predicted_throughput",
             "measured_throughput", "predicted_samples", "measured_samples", "predicted_time",
             "measured_train_time", "measured_time", "note")


def node_sections(projection: Projection | None, unit: TimeUnit = HOURS) -> list[Section]:
    """The prediction per node count and, where it predicts hours, its figure (none
    without a projection); times in ``unit`` (``projection_nodes.csv`` keeps hours).
    They follow ``outline``'s projection sections."""
    if projection is None or not len(projection.nodes):
        return []
    shown = projection.nodes.copy()
    names = {"predicted_hours": f"predicted_time_{unit.name}",
             "measured_train_hours": f"measured_train_time_{unit.name}",
             "measured_hours": f"measured_time_{unit.name}"}
    for column in names:
        shown[column] = unit.of(shown[column].astype(float) * 3600.0)
    columns = tuple(f"{c}_{unit.name}" if c.endswith("_time") else c for c in NODE_COLS)
    out = [Section(NODES_TITLE, Role.PROJECTION, frame=shown.rename(columns=names),
                   columns=columns, items=tuple(projection.node_assumptions))]
    if projection.predicts_hours():
        out.append(Section("Predicted time to target against node count", Role.FIGURE,
                           "Lines and hollow circles: predicted (steady training only); "
                           "filled squares: measured wall clock; crosses: measured training "
                           "time. Data: projection_nodes.csv.", figure=NODES_FIGURE))
    return out


@dataclass(frozen=True)
class ReportOptions:
    """What the report computes (each field is a ``distseg-report`` option)."""

    target_loss: tuple[float, ...] = ()
    """Training-loss targets (reached when loss <= target)."""
    target_dice: tuple[float, ...] = ()
    """Validation-Dice targets (reached when Dice >= target)."""
    dice_class: str | None = None
    """Class a Dice target refers to; ``None``: the mean over foreground classes."""
    smooth: int = 0
    """Trailing mean over this many steps for the loss curve and loss targets (0/1: off)."""
    project_nodes: tuple[int, ...] = ()
    """Node counts to project time per epoch to."""
    bandwidth_gbps: float | None = None
    """Link bandwidth of the projection's allreduce model, Gbit/s; ``None``: measured
    between hosts where a run logged such a link (``analysis.links``), else
    ``Fabric``'s default (flagged ASSUMED)."""
    latency_us: float | None = None
    """Latency per allreduce message, microseconds; ``None``: as ``bandwidth_gbps``."""
    latency_term: str = "ring"
    """``ring`` (2 (R-1) message rounds) or ``log`` (2 log2 R)."""
    grad_bytes: float | None = None
    """Gradient bytes per allreduce; default: the logged parameter count x 4."""
    ranks_per_node: int | None = None
    """Ranks per node of the projected runs; default: as in the largest measured run."""

    def validate(self) -> "ReportOptions":
        if self.smooth < 0:
            raise ValueError(f"--smooth must be >= 0, got {self.smooth}")
        if any(n < 1 for n in self.project_nodes):
            raise ValueError(f"--project-nodes must be positive integers, got {self.project_nodes}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"--ranks-per-node must be >= 1, got {self.ranks_per_node}")
        if self.grad_bytes is not None and self.grad_bytes <= 0:
            raise ValueError(f"--grad-bytes must be > 0, got {self.grad_bytes}")
        default = Fabric()
        Fabric(default.bandwidth_gbps if self.bandwidth_gbps is None else self.bandwidth_gbps,
               default.latency_us if self.latency_us is None else self.latency_us,
               self.latency_term).validate()
        return self

    def curve_spec(self) -> CurveSpec:
        """What the loss curves are reduced for while the logs are read."""
        return CurveSpec(targets=tuple(self.target_loss), smooth=self.smooth)


@dataclass
class Report:
    """A computed report: the runs, every table, the projection and all notes."""

    runs: list[RunData]
    options: ReportOptions
    tables: Tables
    notes: list[Note]
    projection: Projection | None = None
    projection_error: str = ""
    files: dict[str, str] = field(default_factory=dict)
    unit: TimeUnit = HOURS
    """The unit wall-clock times are shown in (``model.time_unit`` of the longest run)."""
    optional: dict[str, pd.DataFrame] = field(default_factory=dict)
    """The tables of ``OPTIONAL_CSV`` the runs gave rows (``add_optional``)."""
    noise: noise.NoiseReport | None = None
    """The gradient noise scale, when a run measured one."""
    cv: list[cvrender.CvReport] = field(default_factory=list)
    """Each cross-validation given (a directory with a ``cv.json``)."""

    def summary_line(self) -> str:
        names = ", ".join(f"{r.label} ({r.ranks} rank{'s' if r.ranks != 1 else ''})"
                          for r in self.runs)
        warn = sum(1 for n in self.notes if n.level == "warning")
        skipped = sum(1 for n in self.notes if n.level == "skipped")
        return (f"{len(self.runs)} run(s): {names}. {warn} warning(s), {skipped} "
                "skipped item(s).")

    def options_dict(self) -> dict:
        d = dataclasses.asdict(self.options)
        d["run_dirs"] = [r.path for r in self.runs]
        return d

    def document(self) -> Document:
        """The report as ``render`` draws it (Markdown, HTML, JSON)."""
        sections = outline.sections(self.tables, self.notes, self.options.smooth,
                                    self.projection, self.projection_error, self.unit,
                                    self.optional, cvrender.answer_items(self.cv, self.unit),
                                    cvrender.sections(self.cv, self.optional, self.unit))
        # Before "Skipped and notes", always the last.
        sections = (*sections[:-1], *node_sections(self.projection, self.unit), sections[-1])
        return Document(
            summary=self.summary_line(),
            sections=sections,
            tables=self.tables, notes=tuple(self.notes), projection=self.projection,
            projection_error=self.projection_error, options=self.options_dict(),
            files=dict(self.files), time_unit=self.unit.name,
            optional_tables=dict(self.optional))


def wall_seconds(run: RunData) -> float:
    """Wall-clock seconds of a run: its launches' durations added up."""
    return float(run.segments["duration_s"].sum()) if len(run.segments) else 0.0


def report_unit(runs: Sequence[RunData]) -> TimeUnit:
    """The unit that fits the longest run (``model.time_unit``)."""
    return time_unit(max((wall_seconds(r) for r in runs), default=0.0))


def _runs_table(runs: Sequence[RunData], tpe: pd.DataFrame) -> pd.DataFrame:
    """The Runs table: where each run ran, its size, and (``tables.run_settings``) its
    model, input shape, oneDNN and threads per rank."""
    rows = []
    for run in runs:
        rec = run.run_record
        rows.append({"run": run.label, "path": run.path, "ranks": run.ranks, "nodes": run.nodes,
                     "hosts": ", ".join(run.hosts[:4]) + (" ..." if len(run.hosts) > 4 else ""),
                     "ranks_logged": len(run.ranks_present), "launches": len(run.segments),
                     "epochs": int(tpe.loc[tpe["run"] == run.label, "epochs"].iloc[0]),
                     "train_samples": run.train_samples,
                     "batch_per_rank": rec.get("batch_size"),
                     "wall_h": (float(run.segments["duration_s"].sum()) / 3600.0
                                if len(run.segments) else None),
                     "config_hash": rec.get("config_hash"), "status": run.status,
                     **tables.run_settings(run)})
    return pd.DataFrame(rows)


def _dice_last(spread: pd.DataFrame) -> pd.DataFrame:
    if not len(spread):
        return spread
    last = spread.groupby("run", sort=False)["epoch"].transform("max")
    out = spread[spread["epoch"] == last]
    return out[["run", "epoch", "class", "ranks", "min", "median", "max", "global"]]


def compute_tables(runs: Sequence[RunData], options: ReportOptions,
                   unit: TimeUnit = HOURS) -> Tables:
    """Every table of the report, from the loaded runs (times to target in ``unit``)."""
    tpe = tables.time_per_epoch(runs)
    scaling = tables.scaling(tpe)
    hours = tables.hours_to_target(runs, options.target_loss, options.target_dice,
                                   options.smooth, options.dice_class, unit)
    balance = tables.rank_balance(runs)
    spread = tables.val_dice_spread(runs)
    cov = coverage.coverage(runs)
    return Tables(
        runs=_runs_table(runs, tpe),
        time_per_epoch=tpe,
        scaling=scaling,
        throughput_vs_size=tables.throughput_vs_size(runs, tpe),
        links=links.link_table(runs),
        loss_vs_time=tables.loss_vs_time(runs, options.smooth),
        hours_to_target=hours,
        statistical_efficiency=stateff.efficiency_table(hours, scaling),
        rank_balance=balance,
        rank_balance_summary=tables.rank_balance_summary(balance),
        val_dice_spread=spread,
        val_dice_last=_dice_last(spread),
        coverage=cov,
        coverage_summary=coverage.coverage_summary(cov),
    )


def option_notes(runs: Sequence[RunData], options: ReportOptions) -> list[Note]:
    """Warnings about options that look like slips given what the logs hold."""
    notes = []
    for target in options.target_loss:
        if target > 0 and any(r.curve_loss_min < 0 for r in runs):
            notes.append(Note("warning", "options", f"--target-loss {target:g} is positive but "
                              f"the loss is a negative Dice; did you mean {-target:g}?"))
    if options.dice_class and not any(options.dice_class in r.classes for r in runs):
        notes.append(Note("warning", "options", f"--dice-class {options.dice_class!r} is not "
                          "among the logged classes "
                          f"({', '.join(sorted({c for r in runs for c in r.classes}))})"))
    return notes


def add_optional(report: Report) -> None:
    """The seed groups (``analysis.seeds``), the lr range tests (``analysis.lrrange``)
    and the noise scale (``analysis.noise``), with their notes, where the runs give them
    rows; nothing for runs that do not."""
    t = report.tables
    groups, notes = seeds.seed_table(report.runs, t.hours_to_target)
    report.noise = noise.build(report.runs, t.hours_to_target, t.statistical_efficiency)
    found = {"seed_groups": groups, "lr_find": lrrange.table(report.runs),
             **cvrender.frames(report.cv)}
    if report.noise is not None:
        found.update(noise_scale=report.noise.table, noise_scale_series=report.noise.series,
                     noise_prediction=report.noise.prediction)
        notes += report.noise.notes
    report.optional = {k: found[k] for k in OPTIONAL_CSV if k in found and len(found[k])}
    report.notes.extend(notes)


def relabel(runs: Sequence[RunData], labels: dict[str, str]) -> None:
    """Names the runs of a cross-validation as its plan does (``RECIPE-nN-fold-I``, by
    run directory in ``labels``), in their notes too."""
    for run in runs:
        new = labels.get(run.path)
        if not new or new == run.label:
            continue
        old, run.label = run.label, new
        run.notes = [dataclasses.replace(n, where=new) if n.where == old else n
                     for n in run.notes]
        run.progress_notes = [dataclasses.replace(n, where=new) if n.where == old else n
                              for n in run.progress_notes]


def cross_validate(report: Report, inputs: cvrender.Inputs) -> None:
    """Each cross-validation of ``inputs`` from the loaded runs: its folds, statistics
    and answer (``analysis.cvrender``), to the target Dice of ``--target-dice``, else its
    plan's ``target_dice``."""
    by_label = {r.label: r for r in report.runs}
    report.notes.extend(inputs.notes)
    for given in inputs.cvs:
        planned = given.plan.target_dice
        targets = report.options.target_dice or (() if planned is None else (planned,))
        cv_report, notes = cvrender.build(given, by_label, targets, report.options.dice_class,
                                          wall_seconds, report.unit)
        report.cv.append(cv_report)
        report.notes.extend(notes)


def _project(report: Report) -> None:
    """Fits the projection asked for; a fit that is impossible becomes a warning."""
    options = report.options
    link = links.choose(report.tables.links, options.bandwidth_gbps, options.latency_us,
                        options.latency_term)
    try:
        report.projection = project(report.runs, report.tables.time_per_epoch,
                                    options.project_nodes, link.fabric,
                                    options.grad_bytes, options.ranks_per_node,
                                    report.tables.statistical_efficiency,
                                    report.noise.predictions if report.noise else None,
                                    link.lines)
    except ValueError as e:
        report.projection_error = str(e)
        report.notes.append(Note("warning", "projection", str(e)))
        return
    report.notes.extend(projection_warnings(report.projection)
                        + stateff.projection_notes(report.projection.target_assumptions))


def build(run_dirs: Sequence[str], options: ReportOptions | None = None,
          show_progress: bool | None = None, processes: int | None = None) -> Report:
    """Reads the runs and computes every table.

    ``run_dirs``: run directories and cross-validation directories (with a ``cv.json``:
    every run of the plan, ``analysis.cvrender.expand``). ``processes``: worker processes that read the logs (0: none; default: as many as
    pay, see ``analysis.workers.worker_count``).

    Raises:
      logs.RunDirError: a run directory is missing or has no logs.
      distseg.core.errors.InputError: a log or data file was written by a newer distseg.
      ValueError: an option is out of range.
    """
    options = (options or ReportOptions()).validate()
    inputs = cvrender.expand(run_dirs)
    runs = logs.load_runs(inputs.run_dirs, show_progress=show_progress,
                          spec=options.curve_spec(), processes=processes)
    relabel(runs, inputs.labels)
    unit = report_unit(runs)
    targets = options.target_loss + options.target_dice
    notes = ([n for r in runs for n in r.notes + (r.progress_notes if targets else [])]
             + mismatch.config_mismatches(runs)
             + checks.check_runs(runs, options.target_loss, options.smooth,
                                 options.dice_class, unit))
    report = Report(runs=runs, options=options, tables=compute_tables(runs, options, unit),
                    notes=notes + option_notes(runs, options), unit=unit)
    cross_validate(report, inputs)
    add_optional(report)
    if options.project_nodes:
        _project(report)
    return report


#: Table name -> CSV file written by ``write``.
CSV_FILES = csv_files()


def _write_csvs(report: Report, out_dir: str) -> dict[str, str]:
    files = {}
    for name, fname, frame in report.tables.csv_frames():
        files[name] = os.path.join(out_dir, fname)
        frame.to_csv(files[name], index=False)
    projection = report.projection
    for name, frame in (("projection", None if projection is None else projection.table),
                        ("projection_to_target", None if projection is None
                         or not len(projection.targets) else projection.targets),
                        ("projection_nodes", None if projection is None
                         or not len(projection.nodes) else projection.nodes)):
        path = os.path.join(out_dir, name + ".csv")
        if frame is not None:
            frame.to_csv(path, index=False)
            files[name] = path
        elif os.path.exists(path):
            os.remove(path)  # from an earlier report in this directory: no longer true
    for name, fname in OPTIONAL_CSV.items():
        path = os.path.join(out_dir, fname)
        if name in report.optional:
            files[name] = path
            report.optional[name].to_csv(path, index=False)
        elif os.path.exists(path):
            os.remove(path)  # from an earlier report in this directory: no longer true
    return files


def _write_plots(report: Report, out_dir: str) -> dict[str, str]:
    from analysis import plots  # matplotlib only when files are written

    classes = list(dict.fromkeys(c for r in report.runs for c in tables.foreground(r.classes)))
    files = {
        "loss_vs_time_png": plots.loss_vs_time(
            report.tables.loss_vs_time, os.path.join(out_dir, outline.LOSS_FIGURE),
            report.options.target_loss, report.options.smooth, report.unit),
        "val_dice_spread_png": plots.val_dice_spread(
            report.tables.val_dice_spread, os.path.join(out_dir, outline.DICE_FIGURE), classes),
    }
    optional = (("statistical_efficiency_png", outline.EFFICIENCY_FIGURE,
                 plots.statistical_efficiency, report.tables.statistical_efficiency,
                 len(report.tables.statistical_efficiency) > 0),
                ("throughput_vs_size_png", outline.SIZE_FIGURE, plots.throughput_vs_size,
                 report.tables.throughput_vs_size,
                 tables.compares_sizes(report.tables.throughput_vs_size)),
                ("noise_scale_png", outline.NOISE_FIGURE, plots.noise_scale,
                 report.optional.get("noise_scale_series"),
                 "noise_scale_series" in report.optional),
                ("lr_find_png", outline.LR_FIND_FIGURE, plots.lr_find,
                 report.optional.get("lr_find"), "lr_find" in report.optional),
                ("projection_nodes_png", NODES_FIGURE,
                 functools.partial(plots.predicted_hours, unit=report.unit),
                 None if report.projection is None else report.projection.nodes,
                 report.projection is not None and report.projection.predicts_hours()))
    for name, fname, draw, table, wanted in optional:
        path = os.path.join(out_dir, fname)
        if wanted:
            files[name] = draw(table, path)
        elif os.path.exists(path):
            os.remove(path)  # from an earlier report in this directory: no longer true
    return files


def _write(report: Report, out_dir: str) -> Document:
    """Writes every output file; returns the document they were rendered from."""
    os.makedirs(out_dir, exist_ok=True)
    files = _write_csvs(report, out_dir)
    files.update(_write_plots(report, out_dir))
    files["report_md"] = os.path.join(out_dir, "report.md")
    files["report_html"] = os.path.join(out_dir, "report.html")
    files["report_json"] = os.path.join(out_dir, "report.json")
    report.files = files
    doc = report.document()
    with open(files["report_md"], "w", encoding="utf-8") as f:
        f.write(render.markdown(doc))
    with open(files["report_html"], "w", encoding="utf-8") as f:
        f.write(render.html_document(doc, out_dir))
    with open(files["report_json"], "w", encoding="utf-8") as f:
        json.dump(render.json_document(doc), f, indent=1)
    return doc


def write(report: Report, out_dir: str) -> dict[str, str]:
    """Writes every output file into ``out_dir``; returns name -> path."""
    _write(report, out_dir)
    return report.files


def main(run_dirs: Sequence[str], options: ReportOptions, out_dir: str | None = "report",
         fmt: str = "md", stream: TextIO | None = None,
         show_progress: bool | None = None, processes: int | None = None) -> Report:
    """The command: build, write (unless ``out_dir`` is ``None``), print.

    Markdown goes to ``stream`` (stdout) with at most 20 notes; ``fmt="json"`` prints
    the JSON document instead. ``processes``: as in ``build``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    stream = stream or sys.stdout
    report = build(run_dirs, options, show_progress=show_progress, processes=processes)
    doc = _write(report, out_dir) if out_dir else report.document()
    if fmt == "json":
        json.dump(render.json_document(doc), stream, indent=1)
        stream.write("\n")
    else:
        stream.write(render.markdown(doc, images=False, max_items=20))
        if out_dir:
            stream.write(f"\nWrote {len(report.files)} files to {out_dir}/ "
                         f"(open {report.files['report_html']} in a browser).\n")
    return report
