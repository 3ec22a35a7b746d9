"""The cross-validation report (``analysis.cv``, ``analysis.cvrender``): CV directories
of synthetic runs whose fold numbers are known, and the means, intervals, out-of-fold
Dice, paired differences, hours and "The answer" they give."""

from __future__ import annotations

import json
import math
import os
import statistics
import time

import pytest

from analysis import cv, cvrender, render
from analysis.report import ReportOptions, build, write
from distseg.core.stats import Z_95, t_quantile
from tests.analysis_fixtures.runs import Launch, RunSpec, note_lines, one_row, write_cv

FOLDS = (0, 1, 2, 3, 4)


def case_offsets(fold: int) -> list[float]:
    """Liver Dice of each validation case around the fold's Dice: fold 0 has 3 cases
    (its case mean 0.02 above), the others 2 (their mean on it)."""
    return [0.06, 0.0, 0.0] if fold == 0 else [0.02, -0.02]


def spec(liver: float, lesion: float, fold: int, peak: float = 0.0, step_time: float = 1.0,
         **changes) -> RunSpec:
    """3 epochs on 1 rank: foreground Dice 0.3 below (liver, lesion) at epoch 0, ``peak``
    above at epoch 1, (liver, lesion) at the final epoch 2; per-case Dice logged."""
    def val_dice(epoch, rank, cls):
        if cls == "background":
            return 0.99
        base = liver if cls == "liver" else lesion
        return base - 0.3 if epoch == 0 else base + peak if epoch == 1 else base

    def val_cases(epoch, rank):
        return {str(100 * fold + i): {"background": 0.99, "liver": liver + d, "lesion": lesion}
                for i, d in enumerate(case_offsets(fold))}
    return RunSpec(epochs=3, val_dice=val_dice, val_cases=val_cases, step_time=step_time,
                   **changes)


def recipe_a(fold: int) -> tuple[float, float]:
    return 0.80 + 0.01 * fold, 0.60 + 0.02 * fold


def t_interval(values):
    n = len(values)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(Z_95, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def test_students_t_at_4_degrees_is_within_a_percent_of_the_table():
    assert t_quantile(Z_95, 4) == pytest.approx(2.776, rel=3e-3)
    assert cv.interval([0.5, 0.7]).low != cv.interval([0.5, 0.7]).low  # NaN: 2 folds


@pytest.fixture(scope="module")
def clear(tmp_path_factory):
    """Recipe a clearly above b (0.10 liver, 0.05 lesion, every fold); a peaks at epoch 1
    of fold 0."""
    cv_dir = str(tmp_path_factory.mktemp("clear") / "cv")

    def spec_of(recipe, nodes, fold):
        liver, lesion = recipe_a(fold)
        if recipe == "a":
            return spec(liver, lesion, fold, peak=0.05 if fold == 0 else 0.0)
        return spec(liver - 0.10 + 0.01 * (fold % 2), lesion - 0.05, fold)
    write_cv(cv_dir, ["a", "b"], FOLDS, [1], spec_of, target_dice=0.69)
    return build([cv_dir], ReportOptions(), processes=0)


def test_fold_means_sd_and_t_interval_of_the_final_and_best_dice(clear):
    dice = clear.optional["cv_dice"]
    liver = one_row(dice, recipe="a", nodes=1, **{"class": "liver"})
    mean, sd, low, high = t_interval([recipe_a(f)[0] for f in FOLDS])
    assert (liver["folds"], liver["final_mean"]) == (5, pytest.approx(0.82))
    assert (liver["final_sd"], liver["final_low"], liver["final_high"]) == pytest.approx(
        (sd, low, high))
    assert liver["final_folds"] == "0.8000 0.8100 0.8200 0.8300 0.8400"
    # Best: fold 0 peaked at epoch 1 (0.85), the others are best at their final epoch.
    assert liver["best_folds"] == "0.8500 0.8100 0.8200 0.8300 0.8400"
    assert liver["best_mean"] == pytest.approx(0.83)
    runs = clear.optional["cv_runs"]
    # Epochs 1 and 2 tie outside fold 0: the earlier is the best.
    assert list(runs.loc[runs["recipe"] == "a", "best_epoch"]) == [1, 1, 1, 1, 1]
    assert list(runs.loc[runs["recipe"] == "a", "final_epoch"]) == [2, 2, 2, 2, 2]
    fg = one_row(dice, recipe="a", nodes=1, **{"class": cv.FOREGROUND})
    assert fg["final_mean"] == pytest.approx(statistics.fmean(
        (li + le) / 2 for li, le in map(recipe_a, FOLDS)))


def test_out_of_fold_dice_pools_every_case_from_its_fold(clear):
    liver = one_row(clear.optional["cv_dice"], recipe="a", nodes=1, **{"class": "liver"})
    cases = [recipe_a(f)[0] + d for f in FOLDS for d in case_offsets(f)]
    assert len(cases) == 11 and liver["oof_basis"] == "per case (11 cases)"
    assert liver["oof"] == pytest.approx(statistics.fmean(cases))
    assert liver["oof"] != pytest.approx(liver["final_mean"])  # fold 0's 3 cases weigh more


def test_the_paired_difference_from_the_best_recipe_and_the_answer(clear):
    paired = one_row(clear.optional["cv_paired"], nodes=1, recipe="b")
    # Per fold, b - a over the foreground classes: (-0.10 + 0.01 (fold % 2) - 0.05) / 2.
    diffs = [(-0.10 + 0.01 * (f % 2) - 0.05) / 2 for f in FOLDS]
    mean, _, low, high = t_interval(diffs)
    assert paired["best"] == "a" and paired["folds"] == 5
    assert (paired["diff_mean"], paired["diff_low"], paired["diff_high"]) == pytest.approx(
        (mean, low, high))
    assert not paired["within_noise"]
    answer = clear.document().sections[0]
    assert answer.items[0].startswith("cv: ship a (out-of-fold mean foreground Dice ")
    assert f"{mean:+.4f} over 5 folds" in answer.items[0]
    # Dice >= 0.69 at epoch 1 of every fold of a: 2 epochs of 8 one-second steps.
    assert answer.items[1] == ("cv: a reaches val Dice >= 0.69 soonest at 1 node(s): 16.0 s "
                               "on mean over 5 of 5 folds")
    assert answer.items[2] == ("cv: 10 of 10 runs counted, 240.0 s of training in all, "
                               "24.0 s with every run side by side")
    hours = one_row(clear.optional["cv_hours"], recipe="a", nodes=1)
    assert hours["reached"] == "5 of 5" and hours["to_target_mean_h"] == pytest.approx(16 / 3600)
    assert hours["hours_total"] == pytest.approx(5 * 24 / 3600)


def test_recipes_that_cannot_be_told_apart_ship_the_cheaper(tmp_path):
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, nodes, fold):
        liver, lesion = recipe_a(fold)
        if recipe == "a":
            return spec(liver, lesion, fold, step_time=1.0)
        return spec(liver + (0.01 if fold % 2 else -0.01) + 0.004, lesion, fold, step_time=2.0)
    write_cv(cv_dir, ["a", "c"], FOLDS, [1], spec_of)
    rep = build([cv_dir], ReportOptions(), processes=0)
    answer = rep.cv[0].answer
    assert (answer.best, answer.runner_up, answer.tied, answer.recipe) == ("c", "a", True, "a")
    assert answer.versus.diff.low < 0 < answer.versus.diff.high
    line = rep.document().sections[0].items[0]
    assert "cannot be told apart" in line and line.endswith(
        "ship a, as good within noise and at least 10% cheaper on every fold "
        "(c 48.0 s a fold, a 24.0 s)")
    assert "no target Dice" in rep.document().sections[0].items[1]


def test_recipes_that_cannot_be_told_apart_and_cost_alike_ship_the_higher(tmp_path):
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, nodes, fold):
        liver, lesion = recipe_a(fold)
        if recipe == "a":  # cheaper on every fold but one, by noise-like amounts
            return spec(liver, lesion, fold, step_time=0.5 if fold else 1.0)
        return spec(liver + (0.01 if fold % 2 else -0.01) + 0.004, lesion, fold, step_time=1.0)
    write_cv(cv_dir, ["a", "c"], FOLDS, [1], spec_of)
    answer = build([cv_dir], ReportOptions(), processes=0).cv[0].answer
    assert (answer.best, answer.runner_up, answer.tied, answer.recipe) == ("c", "a", True, "c")


def test_a_resumed_fold_counts_once_and_missing_or_unfinished_runs_are_reported(tmp_path):
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, nodes, fold):
        liver, lesion = recipe_a(fold)
        if (recipe, fold) == ("b", 2):
            return None  # never ran
        if (recipe, fold) == ("b", 4):
            return spec(liver, lesion, fold, launches=[Launch(0, 2, killed_after=1)])
        if (recipe, fold) == ("a", 3):  # killed in epoch 2, resumed from epoch 1
            return spec(liver, lesion, fold, launches=[Launch(0, 2, killed_after=1),
                                                       Launch(1, 3)])
        return spec(liver, lesion, fold)
    write_cv(cv_dir, ["a", "b"], FOLDS, [1], spec_of, target_dice=0.69)
    rep = build([cv_dir], ReportOptions(), processes=0)
    runs = rep.optional["cv_runs"]
    resumed = one_row(runs, recipe="a", fold=3)
    assert resumed["counted"] and resumed["final_epoch"] == 2 and resumed["cases"] == 2
    assert resumed["hours"] == pytest.approx((17 + 16) / 3600)  # launches end to end
    assert one_row(runs, recipe="b", fold=2)["status"] == "missing"
    unfinished = one_row(runs, recipe="b", fold=4)
    assert not unfinished["counted"] and unfinished["status"].startswith("unfinished")
    dice = rep.optional["cv_dice"]
    assert one_row(dice, recipe="a", **{"class": "liver"})["folds"] == 5
    b = one_row(dice, recipe="b", **{"class": "liver"})
    assert (b["folds"], b["planned"]) == (3, 5)
    assert b["final_folds"] == "0.8000 0.8100 0.8300"
    assert any("b-n1-fold-2: missing: no logs in" in n for n in note_lines(rep, "skipped"))
    # b and a share folds 0, 1 and 3 only: the paired difference is over those.
    assert one_row(rep.optional["cv_paired"], nodes=1, recipe="b")["folds"] == 3


def test_documents_and_csvs_hold_the_cross_validation(clear, tmp_path):
    files = write(clear, str(tmp_path / "out"))
    for name in ("cv_dice", "cv_paired", "cv_hours", "cv_runs"):
        assert os.path.exists(files[name])
    md = open(files["report_md"]).read()
    assert "## Cross-validation" in md and "## Cross-validation: paired differences" in md
    doc = json.load(open(files["report_json"]))
    assert {r["recipe"] for r in doc["tables"]["cv_paired"]} == {"b"}
    page = render.html_document(clear.document(), str(tmp_path))
    assert f'href="#{render.anchor(cvrender.PAIRED_TITLE)}"' in page


def test_a_plain_run_beside_a_cv_is_reported_but_not_in_the_cv(clear, tmp_path):
    from tests.analysis_fixtures.runs import write_run
    plain = write_run(str(tmp_path / "np2"), RunSpec())
    cv_dir = os.path.dirname(clear.runs[0].path.split("/runs/")[0] + "/")
    rep = build([plain, cv_dir], ReportOptions(), processes=0)
    assert "np2" in set(rep.tables.runs["run"]) and len(rep.runs) == 11
    assert "np2" not in set(rep.optional["cv_runs"]["run"])


def test_2d_and_3d_recipes_are_listed_side_by_side(tmp_path):
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, nodes, fold):
        return spec(*recipe_a(fold), fold, spatial_dims=3 if recipe == "v3" else 2)
    write_cv(cv_dir, ["s2", "v3"], (0, 1, 2), [1], spec_of)
    rep = build([cv_dir], ReportOptions(), processes=0)
    table = next(s for s in rep.document().sections if s.title == cvrender.DIMS_TITLE).frame
    assert list(table["model"]) == ["2D", "3D"] and table["best_of_its_kind"].all()
    assert cv.ensemble_pair(rep.cv[0].groups) == ("s2", "v3")


def test_80_runs_of_4_recipes_5_folds_4_node_counts(tmp_path):
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, nodes, fold):
        k = int(recipe[1:])
        liver, lesion = 0.7 + 0.03 * k + 0.002 * fold, 0.5 + 0.03 * k

        def val_dice(epoch, rank, cls):
            base = 0.99 if cls == "background" else liver if cls == "liver" else lesion
            return base - (0.3 if epoch == 0 and cls != "background" else 0.0)

        def val_cases(epoch, rank):
            return {str(1000 * fold + 10 * rank + i): {"liver": liver, "lesion": lesion}
                    for i in range(2)}
        return RunSpec(epochs=2, val_dice=val_dice, val_cases=val_cases)
    write_cv(cv_dir, [f"r{k}" for k in range(4)], FOLDS, [1, 2, 4, 8], spec_of,
             target_dice=0.6)
    start = time.perf_counter()
    rep = build([cv_dir], ReportOptions(), processes=0)
    items = rep.document().sections[0].items
    print(f"\n80-run CV report: {time.perf_counter() - start:.1f} s")
    assert len(rep.runs) == 80 and len(rep.cv[0].groups) == 16
    assert items[0].startswith("cv: ship r3 (")
    assert items[1].startswith("cv: r3 reaches val Dice >= 0.6 soonest at 8 node(s): ")
    one = one_row(rep.optional["cv_dice"], recipe="r3", nodes=8, **{"class": "liver"})
    assert one["oof_basis"] == "per case (80 cases)"  # 8 ranks x 2 cases x 5 folds


def test_a_cv_of_one_recipe_reports_without_pairs(tmp_path):
    cv_dir = str(tmp_path / "cv")
    write_cv(cv_dir, ["a"], (0, 1, 2), [1], lambda recipe, nodes, fold: spec(*recipe_a(fold), fold))
    rep = build([cv_dir], ReportOptions(), processes=0)
    assert "cv_paired" not in rep.optional
    titles = [s.title for s in rep.document().sections]
    assert cvrender.DICE_TITLE in titles and cvrender.PAIRED_TITLE not in titles
    assert one_row(rep.optional["cv_dice"], recipe="a", **{"class": "liver"})["folds"] == 3
    write(rep, str(tmp_path / "out"))


def test_the_largest_fall_of_the_second_half():
    assert cv.largest_fall([0.1, 0.9, 0.2, 0.5, 0.6, 0.4, 0.45, 0.3]) == pytest.approx(0.2)
    assert cv.largest_fall([0.1, 0.2, 0.3, 0.4]) == 0.0
    assert cv.largest_fall([0.5, None, 0.7, None, 0.6]) == pytest.approx(0.1)
    falls = cv.falls({0: {"liver": 0.5, "lesion": 0.2}, 1: {"liver": 0.8, "lesion": 0.4},
                      2: {"liver": 0.75, "lesion": 0.45}, 3: {"liver": 0.7, "lesion": 0.3}},
                     ("background", "liver", "lesion"))
    # The second half: epochs 2 and 3 (the fall from 0.8 to 0.75 is in the first).
    assert falls["liver"] == pytest.approx(0.05) and falls["lesion"] == pytest.approx(0.15)
    assert falls[cv.FOREGROUND] == pytest.approx(0.6 - 0.5)


def test_a_target_some_folds_never_reach_names_them(tmp_path):
    cv_dir = str(tmp_path / "cv")
    # Mean foreground Dice 0.70 + 0.015 x fold at the final epoch: folds 0 and 1 stay
    # below 0.725.
    write_cv(cv_dir, ["a"], FOLDS, [1, 2], lambda recipe, nodes, fold: spec(*recipe_a(fold), fold),
             target_dice=0.725)
    rep = build([cv_dir], ReportOptions(), processes=0)
    nodes = rep.cv[0].answer.nodes[0.725]
    group = next(g for g in rep.cv[0].groups if g.nodes == nodes)
    assert group.to_target[0.725].n == 3
    assert group.to_target[0.725].mean == min(g.to_target[0.725].mean for g in rep.cv[0].groups)
    lines = [line for line in rep.document().sections[0].items if "soonest" in line]
    assert len(lines) == 1 and lines[0].endswith("over 3 of 5 folds (fold 0, 1 never did)")
    # The scaling study's "fastest measured run" would compare runs of other folds.
    assert not any("fastest measured" in line for line in rep.document().sections[0].items)


# ---- Configurations out of fold (CV/oof/, distseg-predict --cv --out-of-fold) ----------

#: Per configuration (at node count 1), each fold's two cases' (liver, lesion) Dice.
OOF_CASES = {
    "s2": {0: [(0.90, 0.60), (0.80, 0.50)], 1: [(0.85, 0.70), (0.75, math.nan)],
           2: [(0.88, 0.40), (0.92, 0.55)]},
    "v3": {0: [(0.86, 0.65), (0.84, 0.45)], 1: [(0.90, 0.60), (0.70, math.nan)],
           2: [(0.80, 0.50), (0.94, 0.60)]},
}


def _oof_rows(cases_of: dict, nodes=(1,), mirror_gain: dict | None = None):
    """The rows of ``cases_of``; with ``mirror_gain`` (configuration -> gain), each case
    also scored mirrored: its Dice plus that gain (its largest component: the same)."""
    from distseg.core import oof

    def mirrored(name, li, le):
        if mirror_gain is None:
            return {}, {}
        d = {"liver": li + mirror_gain.get(name, 0.0), "lesion": le + mirror_gain.get(name, 0.0)}
        return d, dict(d)
    return [oof.CaseScore(n, name, tuple(name.split(oof.JOIN)), fold, f"case_{fold}{i}",
                          {"liver": li, "lesion": le}, {"liver": li, "lesion": le},
                          *mirrored(name, li, le))
            for n in nodes for name, by_fold in cases_of.items()
            for fold, cases in by_fold.items() for i, (li, le) in enumerate(cases)]


def _dims_cv(tmp_path, cases_of: dict, nodes=(1,), mirror_gain: dict | None = None):
    """A CV of a 2D recipe ``s2`` and a 3D one ``v3`` over 3 folds, and its CV/oof/ of
    ``cases_of`` (configuration -> fold -> cases' Dice), 2 s per case to predict; with
    ``mirror_gain``, scored mirrored too (``_oof_rows``; ``--tta auto``)."""
    from distseg.core import oof
    cv_dir = str(tmp_path / "cv")

    def spec_of(recipe, n, fold):
        return spec(*recipe_a(fold), fold, spatial_dims=3 if recipe == "v3" else 2,
                    step_time=2.0 if recipe == "v3" else 1.0)
    write_cv(cv_dir, ["s2", "v3"], (0, 1, 2), list(nodes), spec_of)
    costs = tuple(oof.RunCost(n, r, f, 2.0 * len(OOF_CASES[r][f]), 2)
                  for n in nodes for r in ("s2", "v3") for f in (0, 1, 2))
    info = {"which": "best", **({} if mirror_gain is None else {"tta": "auto"})}
    oof.write(cv_dir, oof.Scores(("liver", "lesion"), tuple(_oof_rows(cases_of, nodes, mirror_gain)),
                                 costs, info))
    return cv_dir


def _expected(cases_by_fold: dict) -> tuple[float, dict[int, float]]:
    """nnU-Net's mean foreground Dice over every case, and each fold's, by hand."""
    def score(cases):
        liver = statistics.fmean(c[0] for c in cases)
        lesion = statistics.fmean(c[1] for c in cases if not math.isnan(c[1]))
        return (liver + lesion) / 2
    every = [c for cases in cases_by_fold.values() for c in cases]
    return score(every), {f: score(c) for f, c in cases_by_fold.items()}


def _ensemble_cases(gain: float) -> dict:
    """``s2 + v3``'s cases: s2's, raised so that its score is s2's plus ``gain``."""
    return {f: [(li + gain, le + gain) for li, le in cases] for f, cases in OOF_CASES["s2"].items()}


def test_configurations_table_and_answer_follow_the_per_case_dice(tmp_path):
    cases_of = {**OOF_CASES, "s2 + v3": _ensemble_cases(0.03)}
    rep = build([_dims_cv(tmp_path, cases_of)], ReportOptions(), processes=0)
    table = rep.optional["cv_configs"]
    assert list(table["configuration"]) == ["s2", "v3", "s2 + v3"]
    assert list(table["model"]) == ["2D", "3D", "2D + 3D"]
    groups = {g.recipe: g for g in rep.cv[0].groups}
    for name, by_fold in cases_of.items():
        row = one_row(table, configuration=name)
        score, per_fold = _expected(by_fold)
        assert row["oof_mean_foreground"] == pytest.approx(score)
        assert row["oof_liver"] == pytest.approx(statistics.fmean(
            c[0] for cases in by_fold.values() for c in cases))
        assert row["cases"] == 6
        assert row["folds_mean"] == pytest.approx(statistics.fmean(per_fold.values()))
        members = name.split(" + ")
        assert row["train_h"] == pytest.approx(sum(groups[m].hours_total for m in members))
        assert row["predict_h"] == pytest.approx(len(members) * 12.0 / 3600)
    shipped = table.loc[table["shipped"], "configuration"].tolist()
    assert shipped == ["s2 + v3"]
    line = next(i for i in rep.document().sections[0].items if "configurations out of fold" in i)
    best = _expected(cases_of["s2 + v3"])[0]
    assert line.startswith(f"cv: configurations out of fold: ship s2 + v3 (2D + 3D ensemble; "
                           f"mean foreground Dice {best:.4f}, the best single recipe s2 ")
    assert "tie" not in line
    titles = [s.title for s in rep.document().sections]
    assert cvrender.CONFIGS_TITLE in titles and cvrender.DIMS_TITLE not in titles
    write(rep, str(tmp_path / "out"))
    assert os.path.isfile(tmp_path / "out" / "cv_configs.csv")


def test_mirroring_is_decided_per_configuration_and_the_answer_says_so(tmp_path):
    cases_of = {**OOF_CASES, "s2 + v3": _ensemble_cases(0.03)}
    cv_dir = _dims_cv(tmp_path, cases_of, mirror_gain={"s2 + v3": 0.02, "s2": -0.01, "v3": 0.0})
    table = build([cv_dir], ReportOptions(), processes=0).optional["cv_configs"]
    assert list(table["mirror"]) == ["no", "no", "yes"]  # v3: equal, so not mirrored
    pair = one_row(table, configuration="s2 + v3")
    score = _expected(cases_of["s2 + v3"])[0]
    assert pair["oof_mean_foreground"] == pytest.approx(score)  # ranked plain
    assert pair["post_mean_foreground"] == pytest.approx(score + 0.02)
    assert pair["largest_component"] == "-"
    assert one_row(table, configuration="s2")["post_mean_foreground"] == pytest.approx(
        _expected(OOF_CASES["s2"])[0])
    rep = build([cv_dir], ReportOptions(), processes=0)
    line = next(i for i in rep.document().sections[0].items if "configurations out of fold" in i)
    assert f", mirrored {score + 0.02:.4f}: " in line


@pytest.mark.parametrize("gain, shipped", [(0.00005, "s2"), (0.0003, "s2 + v3")])
def test_an_ensemble_within_the_tie_of_the_best_single_ships_the_single(tmp_path, gain, shipped):
    cases_of = {**OOF_CASES, "s2 + v3": _ensemble_cases(gain)}
    rep = build([_dims_cv(tmp_path, cases_of)], ReportOptions(), processes=0)
    assert rep.cv[0].chosen.name == shipped
    assert rep.cv[0].chosen.tied == (shipped == "s2")
    line = next(i for i in rep.document().sections[0].items if "configurations out of fold" in i)
    assert line.startswith(f"cv: configurations out of fold: ship {shipped} (")
    assert ("a tie within 0.0001 goes to the configuration listed first" in line) == (shipped == "s2")


def test_configurations_at_two_node_counts_are_scored_by_their_mean(tmp_path):
    cases_of = {**OOF_CASES, "s2 + v3": _ensemble_cases(0.01)}
    rep = build([_dims_cv(tmp_path, cases_of, nodes=(1, 2))], ReportOptions(), processes=0)
    table = rep.optional["cv_configs"]
    assert len(table) == 6 and sorted(set(table["nodes"])) == [1, 2]
    chosen = rep.cv[0].chosen
    assert chosen.name == "s2 + v3" and chosen.best_single == "s2"
    assert chosen.scores["v3"] == pytest.approx(_expected(OOF_CASES["v3"])[0])
    line = next(i for i in rep.document().sections[0].items if "configurations out of fold" in i)
    assert " at 1 node(s), " in line and " at 2 node(s)" in line


def test_without_or_with_a_damaged_oof_the_report_lists_the_recipes_as_before(tmp_path):
    from distseg.core import oof
    cv_dir = _dims_cv(tmp_path, OOF_CASES)
    os.remove(oof.path_of(cv_dir, oof.INFO_FILE))
    rep = build([cv_dir], ReportOptions(), processes=0)
    assert "cv_configs" not in rep.optional and rep.cv[0].chosen is None
    assert any("out-of-fold scores left out" in n for n in note_lines(rep, "warning"))
    titles = [s.title for s in rep.document().sections]
    assert cvrender.DIMS_TITLE in titles and cvrender.CONFIGS_TITLE not in titles
    os.remove(oof.path_of(cv_dir, oof.CASES_FILE))
    rep = build([cv_dir], ReportOptions(), processes=0)
    assert "cv_configs" not in rep.optional and not any("out-of-fold" in n for n in note_lines(rep))
