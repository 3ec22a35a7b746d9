"""``distseg-report``: from run directories to tables, plots and documents.

``build`` reads the runs and computes every table; ``write`` puts the CSVs, plots,
``report.md``, ``report.html`` and ``report.json`` into the output directory; ``main``
does both and prints Markdown (or JSON) for the command line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Sequence, TextIO

import pandas as pd

from analysis import logs, render, tables
from analysis.logs import Note, RunData
from analysis.project import Fabric, Projection, project

FORMATS = ("md", "json")


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
    fabric: Fabric = field(default_factory=Fabric)
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
        self.fabric.validate()
        return self


@dataclass
class Report:
    """A computed report: the runs, every table, the projection and all notes."""

    runs: list[RunData]
    options: ReportOptions
    tables: dict[str, pd.DataFrame]
    notes: list[Note]
    projection: Projection | None = None
    projection_error: str = ""
    files: dict[str, str] = field(default_factory=dict)

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


def _runs_table(runs: Sequence[RunData], tpe: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for run in runs:
        rec = run.run_record
        ds = rec.get("dataset") if isinstance(rec.get("dataset"), dict) else {}
        rows.append({"run": run.label, "path": run.path, "ranks": run.ranks, "nodes": run.nodes,
                     "hosts": ", ".join(run.hosts[:4]) + (" ..." if len(run.hosts) > 4 else ""),
                     "ranks_logged": len(run.ranks_present), "launches": len(run.segments),
                     "epochs": int(tpe.loc[tpe["run"] == run.label, "epochs"].iloc[0]),
                     "train_samples": ds.get("train_samples"),
                     "batch_per_rank": rec.get("batch_size"),
                     "wall_h": (float(run.segments["duration_s"].sum()) / 3600.0
                                if len(run.segments) else None),
                     "config_hash": rec.get("config_hash"), "status": run.status})
    return pd.DataFrame(rows)


def _dice_last(spread: pd.DataFrame) -> pd.DataFrame:
    if not len(spread):
        return spread
    last = spread.groupby("run", sort=False)["epoch"].transform("max")
    out = spread[spread["epoch"] == last]
    return out[["run", "epoch", "class", "ranks", "min", "median", "max", "global"]]


def build(run_dirs: Sequence[str], options: ReportOptions | None = None,
          show_progress: bool | None = None) -> Report:
    """Reads the runs and computes every table.

    Raises:
      logs.RunDirError: a run directory is missing or has no logs.
      ValueError: an option is out of range.
    """
    options = (options or ReportOptions()).validate()
    runs = logs.load_runs(run_dirs, show_progress=show_progress)
    notes = [n for r in runs for n in r.notes] + tables.config_mismatches(runs)
    tpe = tables.time_per_epoch(runs)
    balance = tables.rank_balance(runs)
    spread = tables.val_dice_spread(runs)
    cov = tables.coverage(runs)
    t = {
        "runs": _runs_table(runs, tpe),
        "time_per_epoch": tpe,
        "scaling": tables.scaling(tpe),
        "loss_vs_time": tables.loss_vs_time(runs, options.smooth),
        "hours_to_target": tables.hours_to_target(runs, options.target_loss, options.target_dice,
                                                  options.smooth, options.dice_class),
        "rank_balance": balance,
        "rank_balance_summary": tables.rank_balance_summary(balance),
        "val_dice_spread": spread,
        "val_dice_last": _dice_last(spread),
        "coverage": cov,
        "coverage_summary": tables.coverage_summary(cov),
    }
    for target in options.target_loss:
        if target > 0 and any(len(r.curve) and (r.curve["loss"] < 0).any() for r in runs):
            notes.append(Note("warning", "options", f"--target-loss {target:g} is positive but "
                              f"the loss is a negative Dice; did you mean {-target:g}?"))
    if options.dice_class and not any(options.dice_class in r.classes for r in runs):
        notes.append(Note("warning", "options", f"--dice-class {options.dice_class!r} is not "
                          "among the logged classes "
                          f"({', '.join(sorted({c for r in runs for c in r.classes}))})"))
    report = Report(runs=runs, options=options, tables=t, notes=notes)
    if options.project_nodes:
        try:
            report.projection = project(runs, tpe, options.project_nodes, options.fabric,
                                        options.grad_bytes, options.ranks_per_node)
        except ValueError as e:
            report.projection_error = str(e)
            notes.append(Note("warning", "projection", str(e)))
    return report


#: Table name -> CSV file written by ``write``.
CSV_FILES = {"time_per_epoch": "time_per_epoch.csv", "scaling": "scaling.csv",
             "loss_vs_time": "loss_vs_time.csv", "hours_to_target": "hours_to_target.csv",
             "rank_balance": "rank_balance.csv", "val_dice_spread": "val_dice_spread.csv",
             "coverage": "coverage.csv"}


def write(report: Report, out_dir: str) -> dict[str, str]:
    """Writes every output file into ``out_dir``; returns name -> path."""
    from analysis import plots  # matplotlib only when files are written

    os.makedirs(out_dir, exist_ok=True)
    files = {}
    for name, fname in CSV_FILES.items():
        path = os.path.join(out_dir, fname)
        report.tables[name].to_csv(path, index=False)
        files[name] = path
    path = os.path.join(out_dir, "projection.csv")
    if report.projection is not None:
        report.projection.table.to_csv(path, index=False)
        files["projection"] = path
    elif os.path.exists(path):
        os.remove(path)  # from an earlier report in this directory: no longer true
    files["loss_vs_time_png"] = plots.loss_vs_time(
        report.tables["loss_vs_time"], os.path.join(out_dir, "loss_vs_time.png"),
        report.options.target_loss, report.options.smooth)
    classes = list(dict.fromkeys(c for r in report.runs for c in tables.foreground(r.classes)))
    files["val_dice_spread_png"] = plots.val_dice_spread(
        report.tables["val_dice_spread"], os.path.join(out_dir, "val_dice_spread.png"), classes)
    files["report_md"] = os.path.join(out_dir, "report.md")
    files["report_html"] = os.path.join(out_dir, "report.html")
    files["report_json"] = os.path.join(out_dir, "report.json")
    report.files = files
    with open(files["report_md"], "w", encoding="utf-8") as f:
        f.write(render.markdown(report))
    with open(files["report_html"], "w", encoding="utf-8") as f:
        f.write(render.html_document(report, out_dir))
    with open(files["report_json"], "w", encoding="utf-8") as f:
        json.dump(render.json_document(report), f, indent=1)
    return files


def main(run_dirs: Sequence[str], options: ReportOptions, out_dir: str | None = "report",
         fmt: str = "md", stream: TextIO | None = None,
         show_progress: bool | None = None) -> Report:
    """The command: build, write (unless ``out_dir`` is ``None``), print.

    Markdown goes to ``stream`` (stdout) with at most 20 notes; ``fmt="json"`` prints
    the JSON document instead.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {fmt!r}")
    stream = stream or sys.stdout
    report = build(run_dirs, options, show_progress=show_progress)
    if out_dir:
        write(report, out_dir)
    if fmt == "json":
        json.dump(render.json_document(report), stream, indent=1)
        stream.write("\n")
    else:
        stream.write(render.markdown(report, images=False, max_items=20))
        if out_dir:
            stream.write(f"\nWrote {len(report.files)} files to {out_dir}/ "
                         f"(open {report.files['report_html']} in a browser).\n")
    return report
