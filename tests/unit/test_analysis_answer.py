"""The report opens with the answer (``outline.answer_section``): per target the fastest
measured run, its speedup and what limits it, the prediction at the largest node count
asked, and each run's lr, each line linked to its section; and ``--lr auto``'s range
tests (``analysis.lrrange``) as a table, a figure and the lr column."""

from __future__ import annotations

import json

from analysis import lrrange, outline, render
from analysis.report import ReportOptions, build, write
from tests.analysis_fixtures.runs import RunSpec, write_run

LR_FIND = {"lr": 2 ** -8, "raw": 0.0041, "why": "steepest", "steps": 4,
           "lrs": [1e-5, 1e-4, 1e-3, 1e-2], "losses": [-0.1, -0.2, -0.5, 0.3],
           "smoothed": [-0.1, -0.18, -0.4, 0.1], "seconds": 2.5}


def _runs(tmp_path):
    """1 rank at 1 s a step and 2 ranks at 0.6 s a step (half the steps each)."""
    one = write_run(str(tmp_path / "np1"), RunSpec(size=1, step_time=1.0,
                                                   train_fields={"lr_auto": True, "lr": LR_FIND["lr"]},
                                                   extra_run_fields={"lr_find": LR_FIND}))
    two = write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=0.6,
                                                   train_fields={"lr_from": one}))
    return one, two


def test_the_first_section_answers_each_target_and_links_to_its_section(tmp_path):
    rep = build(list(_runs(tmp_path)), ReportOptions(target_loss=(-0.15,), project_nodes=(4, 16)))
    first = rep.document().sections[0]
    assert first.title == outline.ANSWER_TITLE
    assert first.items[0].startswith("train_loss <= -0.15: fastest measured np2 (2 ranks), in ")
    assert "sooner than np1" in first.items[0]
    assert first.items[1].startswith("train_loss <= -0.15: predicted at 16 nodes ")
    assert first.items[-1] == "lr: np1 0.00391 (found), np2 0.005 (from np1)"
    titles = {s.title for s in rep.document().sections}
    assert all(link in titles for link in first.links), first.links
    page = render.html_document(rep.document(), str(tmp_path))
    assert page.index("The answer") < page.index(">Runs<")
    for link in set(first.links):
        assert f'href="#{render.anchor(link)}"' in page and f'id="{render.anchor(link)}"' in page


def test_without_a_target_it_names_the_best_throughput(tmp_path):
    rep = build(list(_runs(tmp_path)), ReportOptions())
    first = rep.document().sections[0]
    assert first.items[0].startswith("no target given") and "np2's" in first.items[0]


def test_range_tests_become_a_table_a_figure_and_the_lr_column(tmp_path):
    one, two = _runs(tmp_path)
    rep = build([one, two], ReportOptions())
    curve = rep.optional["lr_find"]
    assert list(curve["run"].unique()) == ["np1"] and len(curve) == 4
    assert curve["chosen_lr"].iloc[0] == LR_FIND["lr"] and list(curve["lr"]) == LR_FIND["lrs"]
    assert list(rep.tables.runs["lr"]) == ["0.00391 (found)", "0.005 (from np1)"]
    files = write(rep, str(tmp_path / "out"))
    assert files["lr_find_png"].endswith(outline.LR_FIND_FIGURE)
    assert any(s.title == "Learning-rate range test" for s in rep.document().sections)
    with open(tmp_path / "out" / "report.json") as f:
        assert len(json.load(f)["tables"]["lr_find"]) == 4


def test_the_curve_is_read_from_the_first_run_record_alone(tmp_path):
    run = write_run(str(tmp_path / "r"), RunSpec(size=1, extra_run_fields={"lr_find": LR_FIND}))
    assert lrrange.first_run_record(run)["lr_find"]["lr"] == LR_FIND["lr"]
    assert lrrange.first_run_record(str(tmp_path / "none")) is None
