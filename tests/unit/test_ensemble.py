"""``distseg.inference.ensemble``: the members' probabilities averaged, the members
checked to share what the data file decides, the fold runs of a CV plan found, one
decision for the ensemble from the members' pooled validation rows, and the exported
ensemble's output the mean of its members'."""

import dataclasses
import os

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.core import cvplan, rundir
from distseg.core.errors import InputError
from distseg.data.convert.intensity import Intensity
from distseg.inference import ensemble, postprocess, predict

NAMES = ("background", "liver", "lesion")


def test_the_ensemble_predict_is_the_mean_of_the_members():
    rng = np.random.default_rng(0)
    outs = [rng.dirichlet(np.ones(3), size=(2, 1, 4, 5)).astype(np.float32) for _ in range(3)]
    fn = ensemble.averaged([lambda x, o=o: o for o in outs])
    got = fn(np.zeros((2, 1, 4, 5, 1), np.float32))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.mean(outs, axis=0), atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)  # still probabilities


def _member(run_dir, intensity=None, size=32, names=NAMES, window=(1, 32, 32), dims=2,
            channel=None):
    intensity = intensity or Intensity.ct()
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, spatial_dims=dims))
    prep = predict.Preprocessing(intensity, size, channel, f"test {run_dir}")
    return ensemble.Member(run_dir, cfg, predict.TrainingData(prep, names, None), window)


@pytest.mark.parametrize("change,field,words", [
    (dict(names=("background", "liver", "tumour")), "class_names", "tumour"),
    (dict(names=("background", "liver")), "class_names", "'lesion') vs"),
    (dict(channel=1), "channel", "None vs 1"),
])
def test_a_member_that_predicts_other_classes_or_reads_other_channels_is_one_line(
        change, field, words):
    members = [_member("runs/a"), _member("runs/b"), _member("runs/c", **change)]
    with pytest.raises(InputError) as e:
        ensemble.check_agree(members)
    line = str(e.value)
    assert line.startswith(f"runs/a and runs/c differ in {field} (") and words in line, line
    assert "\n" not in line
    ensemble.check_agree(members[:2])  # the same facts: no error


@pytest.mark.parametrize("change", [
    dict(intensity=Intensity.ct(-100, 200)), dict(size=48), dict(window=(1, 48, 48)),
    dict(dims=3, window=(8, 32, 32)),
])
def test_members_that_read_a_scan_otherwise_are_grouped_not_refused(change):
    """A 2D and a 3D recipe, or runs of another normalisation or grid, are one
    ensemble: each group of members that read a scan alike runs its own sliding window
    (``reading``), and only the members of the first group's reading share its prep."""
    members = [_member("runs/a"), _member("runs/b"), _member("runs/c", **change)]
    ensemble.check_agree(members)
    kinds = [ensemble.reading(m) for m in members]
    assert kinds[0] == kinds[1] != kinds[2]
    assert ensemble.reading(_member("runs/d")) == kinds[0]  # "where" read from is no part


def _plan(root, recipes=("dice",), nodes=(1,), folds=(0, 1, 2), trained=True):
    plan = cvplan.make(str(root / "data.h5"), 3, folds, [cvplan.Recipe(r) for r in recipes],
                       nodes, 1)
    os.makedirs(root, exist_ok=True)
    plan.write(str(root))
    for run in plan.runs:
        path = plan.run_path(str(root), run)
        os.makedirs(path)
        if trained:
            open(rundir.config_path(path), "w").close()
    return plan


def test_the_folds_of_a_cv_plan_are_its_runs_of_one_recipe_and_node_count(tmp_path):
    _plan(tmp_path, recipes=("dice", "ce"), nodes=(1, 2))
    cv = str(tmp_path)
    got = ensemble.cv_runs(cv, "ce", 2)
    assert got == tuple(os.path.join(cv, "runs", "ce", "n2-r2", f"fold-{f}") for f in range(3))
    with pytest.raises(InputError, match=r"cv.json: holds 2 recipes \(dice, ce\); pick one with --recipe"):
        ensemble.cv_runs(cv, None, 1)
    with pytest.raises(InputError, match=r"cv.json: holds 2 node counts \(1, 2\); pick one with --nodes"):
        ensemble.cv_runs(cv, "dice")
    with pytest.raises(InputError, match=r"^--recipe lr: not in .*cv.json \(its recipes: dice, ce\)$"):
        ensemble.cv_runs(cv, "lr", 1)
    with pytest.raises(InputError, match="not a cross-validation directory"):
        ensemble.cv_runs(str(tmp_path / "runs"))
    opts = predict.Options("", (), "", cv=cv, recipe=("dice",), nodes=1)
    resolved = ensemble.resolved(opts)
    assert resolved.runs == ensemble.cv_runs(cv, "dice", 1)
    both = ensemble.resolved(dataclasses.replace(opts, recipe=("ce", "dice")))
    assert both.runs == ensemble.cv_runs(cv, "ce", 1) + ensemble.cv_runs(cv, "dice", 1)


def test_one_plan_needs_no_flags_and_an_untrained_fold_is_one_line(tmp_path):
    _plan(tmp_path / "a")
    assert len(ensemble.cv_runs(str(tmp_path / "a"))) == 3
    _plan(tmp_path / "b", trained=False)
    with pytest.raises(InputError, match="fold 0 of dice-n1-fold-0 has no trained run"):
        ensemble.cv_runs(str(tmp_path / "b"))


def test_a_run_given_twice_is_refused(tmp_path):
    opts = predict.Options("runs/a", (), "", more_runs=("runs/b", "runs/./a"))
    with pytest.raises(InputError, match=r"^runs/./a: given twice in the ensemble \(also as runs/a\)$"):
        ensemble.resolved(opts)


# ------------------------------------------------------------------ decisions


def _row(rng):
    """One case's Dice per foreground class for each kind (``postprocess.KINDS``)."""
    return {kind: [float(v) for v in rng.random(2)] for kind in postprocess.KINDS}


def _decided(tmp_path, name, rows, stem="epoch-0003"):
    run = str(tmp_path / name)
    os.makedirs(run, exist_ok=True)
    decisions = postprocess.decide(rows, NAMES)
    decisions["per_case"] = {f"case {i}": r for i, r in enumerate(rows)}
    postprocess.write(run, decisions, {"stem": stem}, "data.h5", list(decisions["per_case"]))
    return run


def test_the_ensemble_decides_on_its_members_validation_rows_pooled(tmp_path):
    rng = np.random.default_rng(3)
    rows = [[_row(rng) for _ in range(n)] for n in (2, 3, 2)]
    # Lesion: the largest component helps on every case of the first member only.
    for r in rows[0]:
        r["plain_lcc"][1] = r["plain"][1] + 0.3
    members = [(_decided(tmp_path, f"fold-{i}", r), "epoch-0003") for i, r in enumerate(rows)]
    got = postprocess.choose_pooled(members, NAMES)
    pooled = postprocess.decide([r for part in rows for r in part], NAMES)
    assert got.mirror == pooled["mirror"]["apply"]
    assert got.largest == tuple(c for c, name in enumerate(NAMES[1:], 1)
                                if pooled["largest_component"]["classes"][name]["apply"])
    assert "decided on the 7 validation case(s) of the 3 member(s), pooled" in got.words
    # Each member alone would decide for itself; the pool may differ from any one.
    assert postprocess.choose_pooled(members, NAMES, tta="mirror", postprocess="none").largest == ()
    assert postprocess.choose_pooled(members, NAMES, tta="mirror").mirror


def test_a_member_without_decisions_for_its_checkpoint_makes_the_ensemble_apply_nothing(tmp_path):
    rng = np.random.default_rng(4)
    a = _decided(tmp_path, "a", [_row(rng)])
    b = _decided(tmp_path, "b", [_row(rng)], stem="epoch-0001")
    c = str(tmp_path / "c")
    for members, words in ((((a, "epoch-0003"), (b, "epoch-0003")), "was decided on epoch-0001, not epoch-0003"),
                           (((a, "epoch-0003"), (c, "epoch-0003")), f"{c} has no decisions")):
        got = postprocess.choose_pooled(members, NAMES)
        assert (got.mirror, got.largest) == (False, ())
        assert "no decisions for the ensemble" in got.words and words in got.words, got.words
    assert postprocess.choose_pooled(((a, "epoch-0003"), (c, "epoch-0003")), NAMES, tta="mirror").mirror


# ------------------------------------------------------------------ export


def test_the_exported_ensemble_outputs_the_mean_of_its_members():
    from distseg.inference import export
    cfg = dataclasses.replace(config_lib.smoke().model, num_classes=3)
    rng = np.random.default_rng(5)
    twins = []
    for i in range(3):
        twin = export.inference_twin(cfg, (16, 16), name=f"member_{i}")
        for v in twin.weights:
            values = rng.normal(0.0, 0.3, v.shape)
            v.assign((rng.uniform(0.5, 2.0, v.shape) if "variance" in v.name else values).astype(np.float32))
        twins.append(twin)
    model = export.ensemble_model(twins)
    x = rng.random((2, 16, 16, 1), dtype=np.float32)
    want = np.mean([t(x, training=False).numpy() for t in twins], axis=0)
    np.testing.assert_allclose(model(x, training=False).numpy(), want, atol=1e-6)
    assert model.output_shape == (None, 16, 16, 3) and model.input_shape == (None, 16, 16, 1)
