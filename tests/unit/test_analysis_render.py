"""``analysis.document``, ``analysis.outline`` and ``analysis.render``: the report's document
is a leaf, renderers choose by role (never by title), and the structure stays small.
"""

import ast
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from analysis import outline, plots, render, tables
from analysis.document import (
    HOURS,
    MINUTES,
    SECONDS,
    Document,
    Note,
    Projection,
    Role,
    Section,
    Tables,
    csv_files,
    time_unit,
)
from analysis.report import ReportOptions, build, write
from tests.analysis_fixtures.runs import RunSpec, write_run

from support import REPO

ANALYSIS = os.path.join(REPO, "analysis")


def _imports_of(module: str) -> set[str]:
    """The ``analysis`` modules that ``analysis/<module>.py`` imports, at any depth."""
    tree = ast.parse(open(os.path.join(ANALYSIS, module + ".py")).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "analysis":
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names
                       if a.name.startswith("analysis."))
    return out


def test_the_document_is_a_leaf_and_render_depends_only_on_it():
    assert _imports_of("document") == set()
    assert _imports_of("render") == {"document"}
    assert "report" not in _imports_of("outline") | _imports_of("render")
    code = ("import sys, analysis.document; "
            "print(sorted(m for m in sys.modules if m.startswith('analysis')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True).stdout
    assert out.strip() == "['analysis', 'analysis.document']"


def test_no_import_cycle_between_analysis_modules():
    modules = [f[:-3] for f in os.listdir(ANALYSIS) if f.endswith(".py") and f != "__init__.py"]
    graph = {m: _imports_of(m) for m in modules}

    def reaches(start, goal, seen):
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n}))
                   for n in graph.get(start, ()))
    assert [m for m in modules if reaches(m, m, set())] == []


def test_no_function_in_analysis_reaches_80_lines():
    long = []
    for name in sorted(os.listdir(ANALYSIS)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(ANALYSIS, name)).read())
            long += [f"{name}:{n.name}" for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.end_lineno - n.lineno >= 80]
    assert long == []


def _tables(**frames) -> Tables:
    empty = {name: pd.DataFrame() for name in Tables.__dataclass_fields__}
    return Tables(**{**empty, **frames})


def _doc(*sections, **changes) -> Document:
    fields = dict(summary="1 run(s)", sections=tuple(sections), tables=_tables(), notes=(),
                  projection=None, projection_error="", options={}, files={})
    fields.update(changes)
    return Document(**fields)


def test_the_warning_style_follows_the_role_not_the_title():
    page = render.html_document(_doc(Section("Read first", Role.WARNINGS, items=("a <b>",)),
                                     Section("Warnings", Role.LIST, items=("c",))), "/nowhere")
    assert "<h2 id=\"read-first\">Read first</h2>\n<ul class=\"warn\"><li>a &lt;b&gt;</li></ul>" in page
    assert "<h2 id=\"warnings\">Warnings</h2>\n<ul><li>c</li></ul>" in page


def test_markdown_cuts_long_lists_and_leaves_figures_out_of_the_terminal():
    doc = _doc(Section("Notes", Role.LIST, items=tuple(f"n{i}" for i in range(5))),
               Section("Plot", Role.FIGURE, "intro", figure="p.png"))
    terminal = render.markdown(doc, images=False, max_items=2)
    assert "- n0\n- n1\n\n- ... 3 more in report.md\n" in terminal and "Plot" not in terminal
    full = render.markdown(doc)
    assert "- n4" in full and "## Plot\n\nintro\n\n![Plot](p.png)\n" in full


def test_projection_section_bolds_its_label_and_shows_the_chosen_columns():
    proj = Projection(table=pd.DataFrame({"kind": ["projection"], "nodes": [4], "x": [1]}),
                      assumptions=["LABEL.", "one", "two"], compute_s=0.5)
    section = outline.projection_section(proj, "")
    md = render.markdown(_doc(section))
    assert "**LABEL.** Assumptions:\n\n- one\n- two\n" in md
    assert "| kind | nodes |\n|---|---|\n| projection | 4 |" in md  # x is not in PROJ_COLS
    failed = outline.projection_section(None, "no fit")
    assert (failed.role, failed.items) == (Role.LIST, ("not computed: no fit",))
    assert outline.projection_section(None, "") is None


def test_html_tables_may_break_names_at_underscores_and_paths_at_slashes():
    out = render.html_table(pd.DataFrame({"run_dir": ["/scratch/u/runs/np16"], "ok": [True]}))
    assert "<th>run_<wbr>dir</th>" in out and "<td>yes</td>" in out
    assert "<td>/<wbr>scratch/<wbr>u/<wbr>runs/<wbr>np16</td>" in out


def test_json_document_holds_the_tables_the_model_says():
    doc = _doc(tables=_tables(scaling=pd.DataFrame({"run": ["a"], "speedup": [float("nan")]}),
                              loss_vs_time=pd.DataFrame({"loss": [1.0]})),
               notes=(Note("info", "a", "m"),), files={"scaling": "s.csv"})
    out = render.json_document(doc)
    assert out["tables"]["scaling"] == [{"run": "a", "speedup": None}]
    assert "loss_vs_time" not in out["tables"] and len(out["tables"]) == 13
    assert out["notes"] == [{"level": "info", "where": "a", "message": "m"}]
    json.dumps(out)
    assert csv_files() == {"time_per_epoch": "time_per_epoch.csv", "scaling": "scaling.csv",
                           "throughput_vs_size": "throughput_vs_size.csv",
                           "links": "links.csv", "loss_vs_time": "loss_vs_time.csv",
                           "hours_to_target": "hours_to_target.csv",
                           "statistical_efficiency": "statistical_efficiency.csv",
                           "rank_balance": "rank_balance.csv",
                           "val_dice_spread": "val_dice_spread.csv",
                           "coverage": "coverage.csv"}


def test_sections_follow_the_reading_order_and_skip_what_is_empty():
    notes = [Note("warning", "r", "w"), Note("skipped", "r", "s")]
    tpe = pd.DataFrame({"run": ["new", "old"],
                        "time": [tables.TRAIN_TIME, tables.EPOCH_TIME_FALLBACK]})
    parts = outline.sections(_tables(time_per_epoch=tpe), notes)
    titles = [(s.title, s.role) for s in parts]
    assert titles == [("Runs", Role.TABLE), ("Warnings", Role.WARNINGS),
                      ("Time per epoch", Role.TABLE), ("Scaling", Role.TABLE),
                      ("Loss versus wall-clock time", Role.FIGURE),
                      ("Rank balance", Role.TABLE),
                      ("Validation Dice across ranks", Role.FIGURE), ("Coverage", Role.TABLE),
                      ("Skipped and notes", Role.LIST)]
    assert parts[-1].items == ("[skipped] r: s",) and parts[1].items == ("[warning] r: w",)
    assert parts[2].intro.endswith(" Runs old logged no train_time: their *_train_s columns "
                                   "are epoch_time, with validation.")
    # no run logged voxels_per_sample: the voxel columns are left out of the document
    assert parts[2].columns == tuple(c for c in outline.TPE_COLS if "voxels" not in c)
    assert outline.notes_section([]).items == ("nothing skipped",)


# ----------------------------------------------------------------------------- time units


def test_the_time_unit_follows_the_length_of_the_longest_run():
    assert [time_unit(s).name for s in (0, 60, 119.9, 120, 7199, 7200, 3e5, float("nan"))] == [
        "s", "s", "s", "min", "min", "h", "h", "h"]
    assert [u.text(75.6) for u in (SECONDS, MINUTES, HOURS)] == [
        "75.6 s", "1.26 min", "0.021 h (1.3 min)"]
    assert HOURS.text(12600.0) == "3.500 h" and HOURS.text(15.0) == "0.0042 h (15.0 s)"


def test_a_one_minute_run_reads_in_seconds_and_its_files_keep_hours(tmp_path):
    # 3 epochs of 4 steps of 5 s: 60 s of wall-clock time.
    run = write_run(str(tmp_path / "demo"), RunSpec(epochs=3, step_time=5.0))
    rep = build([run], ReportOptions(target_loss=(-0.15,)))
    assert rep.unit is SECONDS
    row = rep.tables.hours_to_target.iloc[0]  # loss -0.15 at step 5: 6 x 5 s
    assert row["result"] == "30.0 s" and row["hours"] == 30 / 3600
    runs = outline.runs_section(rep.tables, rep.unit)
    assert "wall_s" in runs.frame.columns and "wall_h" not in runs.frame.columns
    assert runs.frame["wall_s"].iloc[0] == pytest.approx(60.0)
    assert rep.tables.runs["wall_h"].iloc[0] == pytest.approx(60 / 3600)  # JSON keeps hours
    fig = plots.loss_figure(rep.tables.loss_vs_time, unit=rep.unit)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "wall-clock time (seconds)"
    assert max(line.get_xdata().max() for line in ax.get_lines()) == pytest.approx(60.0)
    plots.plt.close(fig)
    write(rep, str(tmp_path / "out"))
    with open(tmp_path / "out" / "report.json") as f:
        doc = json.load(f)
    assert doc["time_unit"] == "s" and "wall_h" in doc["tables"]["runs"][0]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Time to target" in md and "| 30.0 s |" in md and "| wall_s |" in md
