"""Out-of-fold configurations (``distseg.inference.oof``, ``distseg.core.oof``): every
recipe and every pair scored per case from the members' probabilities, the checks that
the recipes see each case on one grid with the same labels, and the files the report
reads."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from click.testing import CliRunner

from distseg import metrics
from distseg.cli.predict import predict as predict_cli
from distseg.core import config as config_lib
from distseg.core import oof as oof_lib
from distseg.core.errors import InputError
from distseg.inference import decide, oof, postprocess

CLASSES = ("background", "liver", "lesion")


def _probs(rng, shape=(4, 8, 8), classes=3):
    p = rng.random((*shape, classes)).astype(np.float32)
    return p / p.sum(axis=-1, keepdims=True)


def test_every_recipe_and_every_pair_in_nnunets_order():
    assert oof.configurations(["a", "b", "c"]) == [
        ("a",), ("b",), ("c",), ("a", "b"), ("a", "c"), ("b", "c")]


def test_a_case_is_scored_alone_and_as_the_mean_of_each_pairs_probabilities():
    rng = np.random.default_rng(0)
    probs = {"two": _probs(rng), "three": _probs(rng)}
    truth = rng.integers(0, 3, size=(4, 8, 8))
    rows = oof.score_case(oof.Item(1, 2, "case_7", 256),
                          {r: oof.Predicted(p, None, truth, 0.0) for r, p in probs.items()},
                          truth, CLASSES)
    assert [(r.configuration, r.members) for r in rows] == [
        ("two", ("two",)), ("three", ("three",)), ("two + three", ("two", "three"))]
    assert all((r.nodes, r.fold, r.case) == (1, 2, "case_7") for r in rows)
    mean = (probs["two"].astype(np.float64) + probs["three"]) / 2
    for row, seg in zip(rows, [np.argmax(probs["two"], -1), np.argmax(probs["three"], -1),
                               np.argmax(mean, -1)]):
        for c, name in ((1, "liver"), (2, "lesion")):
            assert row.dice[name] == pytest.approx(metrics.dice(truth == c, seg == c))


def test_a_class_in_neither_truth_nor_prediction_scores_nan():
    probs = np.zeros((2, 4, 4, 3), np.float32)
    probs[..., 1] = 1.0  # liver everywhere
    truth = np.ones((2, 4, 4), np.int64)
    (row,) = oof.score_case(oof.Item(1, 0, "c", 32), {"a": oof.Predicted(probs, None, truth, 0.0)},
                            truth, CLASSES)
    assert row.dice["liver"] == 1.0 and math.isnan(row.dice["lesion"])


def _member(data, dims, grids, cases=None):
    cfg = config_lib.resolve("smoke3d" if dims == 3 else "smoke", overrides={"data.path": data, "run_dir": "run"})
    cases = cases or {n: decide.Case(n, (0,), 1) for n in grids}
    return oof.Member("r", 1, 0, "run", cfg, data, cases, grids, {})


def test_recipes_that_see_a_case_on_other_grids_are_one_line():
    two = _member("s.h5", 2, {"case_1": (16, 32, 32), "case_2": (16, 32, 32)})
    three = _member("v.h5", 3, {"case_1": (16, 32, 32), "case_2": (16, 30, 32)})
    with pytest.raises(InputError) as err:
        oof.items_of({(1, "a", 0): two, (1, "b", 0): three}, ["a", "b"], [1], [0])
    assert str(err.value) == ("case 'case_2': s.h5 gives 16x32x32 (2D), v.h5 gives 16x30x32 "
                              "(3D); averaging needs both on one grid "
                              "(docs/cross-validation.md#configurations)")
    other = _member("v.h5", 3, {"case_1": (16, 32, 32), "case_3": (16, 32, 32)})
    with pytest.raises(InputError, match="fold 0 validates case 'case_2' in one only"):
        oof.items_of({(1, "a", 0): two, (1, "b", 0): other}, ["a", "b"], [1], [0])
    same = _member("v.h5", 3, dict(two.grids))
    items = oof.items_of({(1, "a", 0): two, (1, "b", 0): same}, ["a", "b"], [1], [0])
    assert [(i.case, i.voxels) for i in items] == [("case_1", 16 * 32 * 32), ("case_2", 16 * 32 * 32)]


def test_labels_that_differ_between_the_files_are_one_line():
    truth = np.zeros((2, 4, 4), np.uint8)
    moved = truth.copy()
    moved[0, 0, :3] = 1
    members = {"a": _member("s.h5", 2, {}), "b": _member("v.h5", 3, {})}
    oof.check_truths("c", {"a": truth, "b": truth.copy()}, members)
    with pytest.raises(InputError, match=r"case 'c': the labels in s.h5 and v.h5 differ \(3 voxels\)"):
        oof.check_truths("c", {"a": truth, "b": moved}, members)


def test_each_class_is_also_scored_with_its_largest_component_alone():
    probs = np.zeros((1, 6, 6, 3), np.float32)
    probs[..., 0] = 1.0
    truth = np.zeros((1, 6, 6), np.int64)
    truth[0, :3, :3] = 1
    probs[0, :3, :3] = (0, 1, 0)      # the liver, right
    probs[0, 5, 5] = (0, 1, 0)        # and a stray liver voxel apart from it
    probs[0, 4, 0] = (0, 0, 1)        # one lesion voxel, where there is none
    (row,) = oof.score_case(oof.Item(1, 0, "c", 36), {"a": oof.Predicted(probs, None, truth, 0.0)},
                            truth, CLASSES)
    assert row.dice["liver"] == pytest.approx(2 * 9 / (9 + 10))
    assert row.dice_lcc["liver"] == 1.0  # the stray voxel gone, the lesion untouched
    assert row.dice["lesion"] == row.dice_lcc["lesion"] == 0.0
    assert row.mirror == row.mirror_lcc == {}  # not predicted mirrored: not scored


def test_a_pair_is_scored_mirrored_on_the_mean_of_its_members_mirrored_probabilities():
    truth = np.zeros((1, 4, 4), np.int64)
    truth[0, :2, :2] = 1
    right = np.zeros((1, 4, 4, 3), np.float32)
    right[..., 0] = 1.0
    right[0, :2, :2] = (0, 1, 0)
    wrong = np.zeros_like(right)
    wrong[..., 0] = 1.0                # no liver at all
    a = oof.Predicted(wrong, right, truth, 0.0)            # plain wrong, mirrored right
    b = oof.Predicted(wrong, 0.6 * right + 0.4 * wrong, truth, 0.0)
    single, pair = oof.score_case(oof.Item(1, 0, "c", 16), {"a": a, "b": b}, truth, CLASSES)[0::2]
    assert single.dice["liver"] == 0.0 and single.mirror["liver"] == 1.0
    assert pair.members == ("a", "b") and pair.dice["liver"] == 0.0
    assert pair.mirror["liver"] == 1.0 and pair.mirror_lcc["liver"] == 1.0
    assert math.isnan(pair.mirror["lesion"])  # in neither the truth nor the prediction
    # One member predicted plain only: the pair has no mirrored score.
    c = oof.Predicted(wrong, None, truth, 0.0)
    assert oof.score_case(oof.Item(1, 0, "c", 16), {"a": a, "c": c}, truth, CLASSES)[2].mirror == {}


def _scores(liver, liver_lcc, lesion, lesion_lcc, mirror=False, mirrored=None, tta=None):
    """Scores of one pair at 1 node. ``tta`` None: a file from before mirroring was
    scored (its one pass mirrored or not: ``mirror``); else ``mirrored`` gives each
    case's (mirror, mirror_lcc) Dice as (liver, lesion) pairs (None: not scored)."""
    rows = tuple(oof_lib.CaseScore(1, "a + b", ("a", "b"), k % 2, f"case_{k}",
                                   {"liver": liver[k], "lesion": lesion[k]},
                                   {"liver": liver_lcc[k], "lesion": lesion_lcc[k]},
                                   *(({}, {}) if mirrored is None else
                                     [dict(zip(("liver", "lesion"), pair)) for pair in mirrored[k]]))
                 for k in range(len(liver)))
    info = {"mirror": mirror} if tta is None else {"tta": tta}
    return oof_lib.Scores(("liver", "lesion"), rows, (), info)


def test_a_class_keeps_its_largest_component_where_that_raises_its_mean_out_of_fold():
    nan = math.nan
    scores = _scores([0.8, 0.9, 0.7], [0.85, 0.9, 0.7], [0.5, nan, 0.6], [0.4, nan, 0.7])
    doc = oof_lib.postprocessing(scores, 1, "a + b")
    classes = doc["largest_component"]["classes"]
    assert classes["liver"]["apply"] and classes["liver"]["dice_with"] == pytest.approx(2.45 / 3)
    assert not classes["lesion"]["apply"]  # 0.55 both ways: an equal mean keeps the network's
    assert classes["lesion"]["dice_without"] == pytest.approx(0.55)  # the NaN case left out
    assert doc["cases"] == 3 and doc["mirror"]["apply"] is False
    assert oof_lib.postprocessing(scores, 2, "a + b") is None
    applied = postprocess.from_decisions(doc, CLASSES, "auto", "auto")
    assert applied.largest == (1,) and not applied.mirror
    assert "liver yes (0.8000 -> 0.8167)" in applied.words
    assert postprocess.from_decisions(doc, CLASSES, "auto", "none").largest == ()
    # A file from before mirroring was scored: mirrored as its one pass predicted.
    old = oof_lib.postprocessing(_scores([0.8], [0.7], [0.5], [0.5], mirror=True), 1, "a + b")
    applied = postprocess.from_decisions(old, CLASSES, "auto", "auto")
    assert applied.mirror and "as the out-of-fold pass predicted" in applied.words


def test_mirroring_is_decided_out_of_fold_then_the_largest_component_on_its_prediction():
    plain = ([0.8, 0.6], [0.8, 0.6], [0.5, 0.5], [0.5, 0.5])
    # Mirrored: liver up (0.9, 0.7), lesion down a little (0.45, 0.5); the liver's
    # largest component helps only on the mirrored prediction.
    mirrored = [((0.9, 0.45), (0.95, 0.45)), ((0.7, 0.5), (0.7, 0.5))]
    doc = oof_lib.postprocessing(_scores(*plain, mirrored=mirrored, tta="auto"), 1, "a + b")
    m = doc["mirror"]
    assert m["apply"] and m["dice_plain"] == pytest.approx(0.6)
    assert m["dice_mirror"] == pytest.approx((0.8 + 0.475) / 2)
    assert doc["largest_component"]["on"] == "mirror"
    liver = doc["largest_component"]["classes"]["liver"]
    assert liver["apply"] and (liver["dice_without"], liver["dice_with"]) == pytest.approx((0.8, 0.825))
    applied = postprocess.from_decisions(doc, CLASSES, "auto", "auto")
    assert applied.mirror and applied.largest == (1,)
    assert "out-of-fold Dice 0.6000 plain, 0.6375 mirrored" in applied.words
    assert not postprocess.from_decisions(doc, CLASSES, "none", "auto").mirror
    # Mirroring that lowers the score stays off, strictly; --tta mirror forces it.
    lower = [((0.7, 0.5), (0.7, 0.5)), ((0.6, 0.5), (0.6, 0.5))]
    off = oof_lib.postprocessing(_scores(*plain, mirrored=lower, tta="auto"), 1, "a + b")
    assert not off["mirror"]["apply"] and off["largest_component"]["on"] == "plain"
    forced = oof_lib.postprocessing(_scores(*plain, mirrored=lower, tta="mirror"), 1, "a + b")
    assert forced["mirror"]["apply"] and forced["largest_component"]["on"] == "mirror"
    # --tta none: not scored, off, and predict says so.
    none = oof_lib.postprocessing(_scores(*plain, tta="none"), 1, "a + b")
    assert none["mirror"]["scored"] is False and not none["mirror"]["apply"]
    assert "not scored" in postprocess.from_decisions(none, CLASSES, "auto", "auto").words


def test_the_files_read_back_as_written(tmp_path):
    rows = (oof_lib.CaseScore(1, "a", ("a",), 0, "case_1", {"liver": 0.9, "lesion": math.nan},
                              {"liver": 0.92, "lesion": math.nan}),
            oof_lib.CaseScore(1, "a + b", ("a", "b"), 0, "case_1", {"liver": 0.95, "lesion": 0.5},
                              {"liver": 0.95, "lesion": 0.25}))
    costs = (oof_lib.RunCost(1, "a", 0, 2.5, 1), oof_lib.RunCost(1, "b", 0, 4.0, 1))
    oof_lib.write(str(tmp_path), oof_lib.Scores(("liver", "lesion"), rows, costs, {"which": "best"}))
    back = oof_lib.read(str(tmp_path))
    assert back.classes == ("liver", "lesion") and back.info["which"] == "best"
    assert back.rows[1] == rows[1] and back.rows[0].dice["liver"] == 0.9
    assert back.rows[0].dice_lcc["liver"] == 0.92
    assert math.isnan(back.rows[0].dice["lesion"])
    assert back.seconds(1, ("a", "b")) == 6.5 and math.isnan(back.seconds(2, ("a",)))
    assert back.rows[0].mirror == back.rows[0].mirror_lcc == {}
    mirrored = (dataclasses.replace(rows[0], mirror={"liver": 0.91, "lesion": math.nan},
                                    mirror_lcc={"liver": 0.93, "lesion": math.nan}),)
    oof_lib.write(str(tmp_path), oof_lib.Scores(("liver", "lesion"), mirrored, costs, {}))
    again = oof_lib.read(str(tmp_path)).rows[0]
    assert again.mirror["liver"] == 0.91 and again.mirror_lcc["liver"] == 0.93
    assert math.isnan(again.mirror["lesion"])
    # A file written before mirroring was scored has no mirror columns.
    path = tmp_path / "oof" / "cases.csv"
    header, *lines = path.read_text().splitlines()
    keep = [i for i, name in enumerate(header.split(",")) if not name.startswith("mirror_")]
    path.write_text("\n".join(",".join(line.split(",")[i] for i in keep)
                              for line in [header, *lines]) + "\n")
    assert oof_lib.read(str(tmp_path)).rows[0].mirror == {}
    assert oof_lib.read(str(tmp_path / "none")) is None
    (tmp_path / "oof" / "cases.csv").write_text("nodes,configuration\n1,a\n")
    with pytest.raises(InputError, match="cases.csv: not the per-case table"):
        oof_lib.read(str(tmp_path))


@pytest.mark.parametrize("args, words", [
    (["--out-of-fold", "--checkpoint", "run"], "--out-of-fold scores the configurations of --cv"),
    (["--out-of-fold", "--decide", "--cv", "cv"], "separate steps"),
])
def test_out_of_fold_flags_are_checked_before_anything_runs(args, words):
    res = CliRunner().invoke(predict_cli, args)
    assert res.exit_code == 2 and words in res.output
