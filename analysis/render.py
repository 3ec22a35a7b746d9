"""Rendering a computed report as Markdown (terminal and ``report.md``), HTML and JSON.

The HTML is self-contained: styles inline and plots embedded as base64 PNG data, so a
single file can be mailed or opened from a cluster's scratch space in any browser.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd

from analysis.tables import TRAIN_TIME

if TYPE_CHECKING:  # pragma: no cover
    from analysis.report import Report


def fmt(value: Any) -> str:
    """A table cell for people: short floats, blanks for missing values."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return ""
        if value == int(value) and abs(value) < 1e9:
            return str(int(value))
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


def md_table(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (``columns`` to pick and order)."""
    cols = [c for c in (columns or df.columns) if c in df.columns]
    if not len(df):
        return "_(no rows)_\n"
    head = "| " + " | ".join(cols) + " |"
    rule = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |"
            for row in df[cols].itertuples(index=False, name=None)]
    return "\n".join([head, rule, *body]) + "\n"


def html_table(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    cols = [c for c in (columns or df.columns) if c in df.columns]
    if not len(df):
        return "<p><em>(no rows)</em></p>\n"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>\n"
                   for row in df[cols].itertuples(index=False, name=None))
    return (f"<div class=\"wide\"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}"
            "</tbody>\n</table></div>\n")


# Columns shown in the documents (the CSVs have them all).
TPE_COLS = ["run", "ranks", "nodes", "epochs", "warmup_train_s", "median_train_s",
            "mean_train_s", "min_train_s", "max_train_s", "median_epoch_s",
            "throughput_samples_s", "throughput_per_rank", "status"]
SCALING_COLS = ["run", "ranks", "nodes", "scale", "median_train_s", "normalised_time",
                "speedup", "efficiency", "throughput_samples_s", "throughput_speedup",
                "throughput_efficiency"]
HOURS_COLS = ["run", "ranks", "nodes", "metric", "target", "result", "epoch", "global_step"]
PROJ_COLS = ["kind", "run", "nodes", "ranks", "steps_per_epoch", "step_s", "allreduce_s",
             "epoch_s", "model_epoch_s", "residual_s", "efficiency", "note"]


def sections(report: "Report") -> list[tuple[str, str, Any]]:
    """The report as ``(title, intro, content)``; content is a frame, a list or a figure.

    Markdown, HTML and the terminal all render this one list, so they cannot drift.
    """
    t = report.tables
    out: list[tuple[str, str, Any]] = []
    out.append(("Runs", "One row per run directory; a launch is one start of the job "
                "(a resumed run has several).", ("table", t["runs"], None)))
    warnings = [n for n in report.notes if n.level == "warning"]
    if warnings:
        out.append(("Warnings", "Read these before the numbers.",
                    ("list", [n.line() for n in warnings])))
    tpe = t["time_per_epoch"]
    fallback = [r for r, time in zip(tpe["run"], tpe["time"]) if time != TRAIN_TIME]
    out.append(("Time per epoch", "*_train_s: seconds of training per epoch, the slowest "
                "rank's train_time (no validation; a synchronous epoch lasts as long as its "
                "slowest rank). median_epoch_s: the slowest rank's epoch_time, with "
                "validation. The first epoch of each launch is warm-up: shown as "
                "warmup_train_s and left out of the other columns. throughput_samples_s = "
                "samples of all ranks / training seconds, over the epochs after warm-up."
                + (f" Runs {', '.join(fallback)} logged no train_time: their *_train_s "
                   "columns are epoch_time, with validation." if fallback else ""),
                ("table", tpe, TPE_COLS)))
    out.append(("Scaling", "Against the run with the fewest ranks, on training time per "
                "epoch (median_train_s) and on throughput. normalised_time = T / T_base; "
                "speedup = T_base / T; efficiency = speedup / (ranks / base ranks); "
                "throughput_speedup = X / X_base, throughput_efficiency likewise.",
                ("table", t["scaling"], SCALING_COLS)))
    if len(t["hours_to_target"]):
        smooth = report.options.smooth
        out.append(("Hours to target", "First wall-clock time at which the "
                    + (f"trailing mean over {smooth} steps of the " if smooth > 1 else "")
                    + "training loss (mean over ranks) is <= the target, or the global "
                    "validation Dice >= the target; no interpolation. Hours count from the "
                    "run's agreed start (after start-up), summed over the launches of a "
                    "resumed run.", ("table", t["hours_to_target"], HOURS_COLS)))
    out.append(("Loss versus wall-clock time", "Training loss per step (lines) and "
                "validation loss per epoch (dashed, markers). Data: loss_vs_time.csv.",
                ("figure", "loss_vs_time.png")))
    out.append(("Rank balance", "Per run, steady steps: mean step time across ranks, the "
                "slowest rank, imbalance ratio = slowest rank's mean step time / mean over "
                "ranks (1.0 = balanced), and the largest share of step time spent waiting "
                "for input. Per rank: rank_balance.csv. step_time includes the gradient "
                "allreduce, where fast ranks wait for the slowest, so in synchronous training "
                "step times even out; a rank that starves for input shows in its data-wait "
                "share.",
                ("table", t["rank_balance_summary"], None)))
    out.append(("Validation Dice across ranks", "Each rank scores its own validation shard; "
                "the band is the min-max over ranks, the line the median, dotted the global "
                "Dice. Data: val_dice_spread.csv.", ("figure", "val_dice_spread.png")))
    last = t["val_dice_last"]
    if len(last):
        out.append(("Validation Dice, last epoch", "", ("table", last, None)))
    out.append(("Coverage", "Per epoch, whether the ranks' shards covered the train set "
                "exactly once, from the logged sample counts and digests (see the README section 'distseg-report' "
                "for what this can and cannot prove). Per epoch: coverage.csv.",
                ("table", t["coverage_summary"], None)))
    if report.projection is not None:
        out.append(("Projection (model, not measured)", "",
                    ("projection", report.projection.table, report.projection.assumptions)))
    elif report.projection_error:
        out.append(("Projection (model, not measured)", "",
                    ("list", [f"not computed: {report.projection_error}"])))
    others = [n for n in report.notes if n.level != "warning"]
    out.append(("Skipped and notes", "What was left out of the numbers, and why.",
                ("list", [n.line() for n in others] or ["nothing skipped"])))
    return out


def markdown(report: "Report", images: bool = True, max_items: int | None = None) -> str:
    """The report as Markdown; ``images=False`` and ``max_items`` for the terminal."""
    lines = ["# distseg scaling report\n", f"{report.summary_line()}\n"]
    for title, intro, content in sections(report):
        kind = content[0]
        if kind == "figure" and not images:
            continue
        lines.append(f"## {title}\n")
        if intro:
            lines.append(intro + "\n")
        if kind == "table":
            lines.append(md_table(content[1], content[2]))
        elif kind == "figure":
            lines.append(f"![{title}]({content[1]})\n")
        elif kind == "list":
            items = content[1]
            shown = items if max_items is None else items[:max_items]
            lines.append("\n".join(f"- {i}" for i in shown) + "\n")
            if len(shown) < len(items):
                lines.append(f"- ... {len(items) - len(shown)} more in report.md\n")
        elif kind == "projection":
            lines.append("**" + content[2][0] + "** Assumptions:\n")
            lines.append("\n".join(f"- {a}" for a in content[2][1:]) + "\n")
            lines.append(md_table(content[1], PROJ_COLS))
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em;
  border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafafa; }
img { max-width: 100%; border: 1px solid #eee; }
.wide { overflow-x: auto; }
.intro { color: #555; } .projection { border-left: 4px solid #c80; padding-left: 1em; }
li { margin: .2em 0; } .warn li { color: #a30; }
"""


def html_document(report: "Report", figures_dir: str) -> str:
    """A self-contained HTML page: inline CSS, plots as base64 ``data:`` URIs."""
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>distseg scaling report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>distseg scaling report</h1>",
             f"<p>{html.escape(report.summary_line())}</p>"]
    for title, intro, content in sections(report):
        kind = content[0]
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if intro:
            parts.append(f"<p class=\"intro\">{html.escape(intro)}</p>")
        if kind == "table":
            parts.append(html_table(content[1], content[2]))
        elif kind == "figure":
            path = os.path.join(figures_dir, content[1])
            try:
                with open(path, "rb") as f:
                    data = base64.b64encode(f.read()).decode("ascii")
                parts.append(f"<img alt=\"{html.escape(title)}\" "
                             f"src=\"data:image/png;base64,{data}\">")
            except OSError:
                parts.append(f"<p><em>figure {html.escape(content[1])} missing</em></p>")
        elif kind == "list":
            cls = " class=\"warn\"" if title == "Warnings" else ""
            parts.append(f"<ul{cls}>" + "".join(f"<li>{html.escape(i)}</li>"
                                               for i in content[1]) + "</ul>")
        elif kind == "projection":
            parts.append("<div class=\"projection\"><p><strong>"
                         f"{html.escape(content[2][0])}</strong> Assumptions:</p><ul>"
                         + "".join(f"<li>{html.escape(a)}</li>" for a in content[2][1:])
                         + "</ul>" + html_table(content[1], PROJ_COLS) + "</div>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts (NaN and NA become null)."""
    return json.loads(df.to_json(orient="records", date_format="iso"))


def json_document(report: "Report") -> dict:
    """The report for machines; ``loss_vs_time`` is referenced by file, not inlined."""
    doc = {"schema": "distseg-report/1", "summary": report.summary_line(),
           "options": report.options_dict(),
           "tables": {k: _records(v) for k, v in report.tables.items() if k != "loss_vs_time"},
           "projection": None,
           "notes": [{"level": n.level, "where": n.where, "message": n.message}
                     for n in report.notes],
           "files": report.files}
    if report.projection is not None:
        doc["projection"] = {"label": "projection (model, not measured)",
                             "assumptions": report.projection.assumptions,
                             "compute_s_per_step": report.projection.compute_s,
                             "table": _records(report.projection.table)}
    elif report.projection_error:
        doc["projection"] = {"error": report.projection_error}
    return doc
