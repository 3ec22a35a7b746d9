"""The configuration chosen, as a user runs it from a folder of NIfTI scans: one phantom
task converted twice (2D slices at the scans' own in-plane size, and 3D volumes on
their own grid, so both hold each case on one grid), one fold table on each, a CV of a
2D and a 3D recipe trained by ``distseg-jobs cv-run``, then ``distseg-predict --cv CV
--out-of-fold`` and ``distseg-report CV``; then the configuration shipped predicts
held-out scans (``distseg-predict --cv CV --recipe two --recipe three``). Each single
configuration's out-of-fold Dice is what training validated for that case; the report's
configurations table, its post-processing and "The answer" follow from the per-case
file; the 2D + 3D ensemble of new scans is the mean of its members' probabilities on
each scan's grid, with the largest components decided out of fold; a 2D file on
another grid is refused in one line before anything is predicted."""

from __future__ import annotations

import csv
import json
import os
import statistics

import nibabel as nib
import numpy as np
import pytest

from distseg import sliding
from distseg.core import cvplan
from distseg.core import oof as oof_lib
from distseg.data import folds
from distseg.data.convert import geometry, samples, sources
from distseg.data.convert.intensity import forward_channels
from distseg.inference import ensemble, postprocess, predict

from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(3 * TIMEOUT)
#: Epochs and steps of each run: a CV of 4 runs in about a minute on 2 cores.
EPOCHS, STEPS = 2, 3
#: The scans' in-plane size and slices: the 2D file is converted at this size, so no
#: in-plane resampling happens and the 3D file (each scan's own grid) matches it.
SIZE, SLICES = 32, 16
SPACING = (0.8, 0.8, 2.5)
#: The phantom task's classes (its dataset.json).
CLASSES = ("background", "liver", "cancer")
#: Held-out labelled scans (seed, orientation) no fold trained on.
HELD_OUT = ((201, "RAS"), (202, "LPS"))


def ok(*cmd, timeout=TIMEOUT):
    out = run_group([str(c) for c in cmd], timeout=timeout, env=command_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _task(root) -> str:
    """The 6 phantom scans, as a folder of NIfTI files."""
    task = str(root / "Task03_Liver")
    if not os.path.isdir(task):
        samples.write_task(task, 6, size=SIZE, slices=SLICES, orientations=("RAS", "LPS"),
                           spacing_ras=SPACING)
    return task


def _folded(path):
    ok(f"{BIN}/distseg-data", "folds", path, "--folds", "2", "--seed", "1")
    return path


def volumes(root, *volume_flags):
    """A volume file (converted with ``volume_flags``) of the 6 phantom scans, 2 folds
    over them."""
    three = str(root / "v.h5")
    ok(f"{BIN}/distseg-data", "convert", _task(root), three, "--ndim", "3", *volume_flags,
       "--no-progress")
    return _folded(three)


def phantoms(root):
    """A slice file and a volume file of the same 6 phantom scans, 2 folds over each."""
    two = str(root / "s.h5")
    ok(f"{BIN}/distseg-data", "convert", _task(root), two, "--size", str(SIZE), "--no-progress")
    return _folded(two), volumes(root)


def held_out(root):
    """Labelled phantom scans no fold trained on: (scans folder, truth folder)."""
    for folder in ("scans", "truth"):
        os.makedirs(root / folder)
    for seed, orientation in HELD_OUT:
        hu, labels = samples.case_arrays(seed, SIZE, SLICES, orientation)
        affine = samples.affine_for(orientation, SPACING)
        samples.save_volume(str(root / f"scans/held_{seed}.nii.gz"), hu, affine)
        samples.save_volume(str(root / f"truth/held_{seed}.nii.gz"), labels, affine)
    return root / "scans", root / "truth"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The CV of ``two`` (smoke, 2D) and ``three`` (smoke3d, its own volume file),
    trained, predicted out of fold and reported."""
    root = tmp_path_factory.mktemp("dims")
    two, three = phantoms(root)
    cv_dir = str(root / "cv")
    steps = f"--max-steps-per-epoch {STEPS}"
    ok(f"{BIN}/distseg-jobs", "cv", "--partition", "generic", "--cores-per-node", "2",
       "--ranks-per-node", "1", "--data", two, "--nodes", "1", "--epochs", str(EPOCHS),
       "--out", cv_dir, "--recipe", f"two=--preset smoke {steps}",
       "--recipe", f"three=--preset smoke3d --data {three} {steps}")
    ok(f"{BIN}/distseg-jobs", "cv-run", cv_dir, "--no-report", timeout=2 * TIMEOUT)
    said = ok(f"{BIN}/distseg-predict", "--cv", cv_dir, "--out-of-fold", "--no-progress").stdout
    ok(f"{BIN}/distseg-report", cv_dir, "--out", os.path.join(cv_dir, "report"))
    return root, cv_dir, said


def _cases(cv_dir) -> list[dict]:
    with open(oof_lib.path_of(cv_dir, oof_lib.CASES_FILE), newline="") as f:
        return list(csv.DictReader(f))


def _class_means(rows, prefix="dice") -> dict[str, float]:
    """Per class the mean over cases (empty cells left out), by hand."""
    out = {}
    for c in CLASSES[1:]:
        values = [float(r[f"{prefix}_{c}"]) for r in rows if r[f"{prefix}_{c}"]]
        if values:
            out[c] = statistics.fmean(values)
    return out


def _score(rows) -> float:
    """nnU-Net's mean foreground Dice, by hand: the mean of the classes' means."""
    return statistics.fmean(_class_means(rows).values())


def _post_score(rows) -> tuple[bool, list[str], float]:
    """By hand: whether mirroring raises the mean foreground Dice out of fold; on the
    prediction so chosen, the classes whose largest component raises their mean; and
    the mean foreground Dice with both."""
    plain, mirror = _class_means(rows), _class_means(rows, "mirror_dice")
    mirrored = statistics.fmean(mirror.values()) > statistics.fmean(plain.values())
    chosen, lcc = (mirror, _class_means(rows, "mirror_lcc")) if mirrored else (
        plain, _class_means(rows, "lcc"))
    kept = [c for c in chosen if lcc[c] > chosen[c]]
    return mirrored, kept, statistics.fmean(lcc[c] if c in kept else chosen[c] for c in chosen)


def test_singles_score_each_case_as_training_validated_it(trained):
    _, cv_dir, said = trained
    rows = _cases(cv_dir)
    assert "wrote " + oof_lib.path_of(cv_dir, oof_lib.CASES_FILE) in said
    assert sorted({r["configuration"] for r in rows}) == ["three", "two", "two + three"]
    assert all(sum(r["configuration"] == c for r in rows) == 6 for c in ("two", "three"))
    with open(oof_lib.path_of(cv_dir, oof_lib.INFO_FILE)) as f:
        info = json.load(f)
    plan = cvplan.read(cv_dir)
    listed = folds.file_cases(plan.data)  # the case names the file gives its case ids
    names = dict(zip(listed.case_ids.tolist(), listed.names))
    ids = {name: case_id for case_id, name in names.items()}
    for run in info["runs"]:
        planned = next(p for p in plan.runs if (p.recipe, p.fold) == (run["recipe"], run["fold"]))
        epoch = run["checkpoint"]["epoch"] - 1  # the checkpoint after that many epochs
        logged = next(r["val_cases_local"] for r in log_records(plan.run_path(cv_dir, planned), 0)
                      if r["type"] == "epoch" and r["epoch"] == epoch)
        mine = [r for r in rows if (r["configuration"], int(r["fold"])) == (run["recipe"], run["fold"])]
        assert sorted(r["case"] for r in mine) == sorted(names[int(c)] for c in logged)
        for r in mine:
            truth = logged[str(ids[r["case"]])]
            for c in CLASSES[1:]:
                if r[f"dice_{c}"]:
                    assert float(r[f"dice_{c}"]) == pytest.approx(truth[c], abs=0.01)
    assert {c["recipe"] for c in info["costs"]} == {"two", "three"}
    assert all(c["seconds"] > 0 and c["cases"] == 3 for c in info["costs"])


def test_the_configurations_table_and_the_answer_follow_the_cases(trained):
    _, cv_dir, _ = trained
    rows = _cases(cv_dir)
    with open(os.path.join(cv_dir, "report", "cv_configs.csv"), newline="") as f:
        table = {r["configuration"]: r for r in csv.DictReader(f)}
    with open(os.path.join(cv_dir, "report", "cv_hours.csv"), newline="") as f:
        hours = {r["recipe"]: float(r["hours_total"]) for r in csv.DictReader(f)}
    scores = {}
    for name in ("two", "three", "two + three"):
        mine = [r for r in rows if r["configuration"] == name]
        scores[name] = _score(mine)
        assert float(table[name]["oof_mean_foreground"]) == pytest.approx(scores[name])
        mirrored, kept, post = _post_score(mine)
        assert table[name]["mirror"] == ("yes" if mirrored else "no")
        assert table[name]["largest_component"] == (" ".join(kept) or "-")
        assert float(table[name]["post_mean_foreground"]) == pytest.approx(post)
        assert int(table[name]["cases"]) == 6
        assert float(table[name]["train_h"]) == pytest.approx(
            sum(hours[m] for m in name.split(" + ")))
    assert [table[n]["model"] for n in ("two", "three", "two + three")] == ["2D", "3D", "2D + 3D"]
    top = max(scores.values())
    ship = next(n for n in ("two", "three", "two + three") if scores[n] >= top - 1e-4)
    assert [n for n, r in table.items() if r["shipped"] == "True"] == [ship]
    with open(os.path.join(cv_dir, "report", "report.md")) as f:
        text = f.read()
    assert f"- cv: configurations out of fold: ship {ship} (" in text
    assert f"mean foreground Dice {scores[ship]:.4f}" in text
    assert "## Cross-validation: configurations" in text


def test_a_volume_file_on_another_grid_is_refused_in_one_line(trained, tmp_path):
    _, cv_dir, _ = trained
    plan = cvplan.read(cv_dir)
    three, before = plan.data_of("three"), _cases(cv_dir)
    # The same cases and folds, resampled to twice the in-plane spacing: 16x16 slices.
    coarser = volumes(tmp_path, "--spacing", f"{SPACING[2]},1.6,1.6")
    os.replace(three, str(tmp_path / "kept.h5"))
    os.replace(coarser, three)
    try:
        out = run_group([f"{BIN}/distseg-predict", "--cv", cv_dir, "--out-of-fold",
                         "--no-progress"], timeout=TIMEOUT, env=command_env())
    finally:
        os.replace(str(tmp_path / "kept.h5"), three)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert plan.data in lines[0] and three in lines[0]
    assert f"16x{SIZE}x{SIZE} (2D)" in lines[0] and "16x16x16 (3D)" in lines[0]
    assert _cases(cv_dir) == before  # nothing written


def _scan_probabilities(run, path, mirror: bool):
    """One member alone, its probabilities taken back onto the scan's own grid: each
    member's own reading (its data file's preprocessing, its sliding window), mirrored
    at test time where ``mirror``."""
    cfg = predict.run_config(run)
    opts = predict.Options(run, (), "", tta="none", postprocess="none")
    known = predict.training_data(cfg, opts)
    net = predict.network(cfg, opts, known.path)
    fn = postprocess.mirrored(net.predict, postprocess.mirror_axes(net.window)) if mirror else net.predict
    img = sources.load(path)
    voxels = sources.image_voxels(img, path)
    prep = known.prep
    geom = geometry.Geometry.of(img.affine, voxels.raw.shape, size=prep.size, target=prep.spacing)
    volume = forward_channels((voxels,), geom, prep.intensities)[0]
    probs = sliding.sliding_window(fn, volume, net.window, net.overlap, batch=net.batch_size)
    return geometry.inverse(probs, geom, order=1, fill=np.eye(probs.shape[-1], dtype=np.float32)[0])


def test_the_shipped_2d_3d_ensemble_predicts_new_scans_on_their_own_grid(trained):
    """Ships "two + three" whatever the toy CV ranked first (the pair is what is new):
    every fold model of both recipes, the 2D ones on slices, the 3D ones on windows,
    averaged on each scan's grid, mirrored and reduced to the largest components as
    decided out of fold."""
    root, cv_dir, _ = trained
    scans, truth = held_out(root / "new")
    out = root / "new" / "seg"
    said = ok(f"{BIN}/distseg-predict", "--cv", cv_dir, "--recipe", "two", "--recipe", "three",
              *sorted(scans.glob("*.nii.gz")), "--labels", truth, "--out", out, "--no-progress",
              "--no-overlays").stdout
    assert "ensemble: the mean of 4 members' softmax probabilities over 2 windows or grids" in said
    where = oof_lib.path_of(cv_dir, oof_lib.DIR)
    assert f"decided out of fold on the 6 case(s) of {where} (two + three)" in said
    decided = oof_lib.postprocessing(oof_lib.read(cv_dir), 1, "two + three")
    mirror = decided["mirror"]["apply"]
    assert f"mirroring {'on' if mirror else 'off'} (out-of-fold Dice " in said
    largest = [c for c, name in enumerate(CLASSES)
               if decided["largest_component"]["classes"].get(name, {}).get("apply")]
    runs = ensemble.cv_runs(cv_dir, "two", 1) + ensemble.cv_runs(cv_dir, "three", 1)
    for seed, _ in HELD_OUT:
        path = str(scans / f"held_{seed}.nii.gz")
        mean = np.mean([_scan_probabilities(run, path, mirror) for run in runs], axis=0)
        want = np.argmax(mean, axis=-1)
        want = postprocess.keep_largest(want, largest) if largest else want
        seg = nib.load(out / f"held_{seed}_seg.nii.gz")
        assert seg.shape == nib.load(path).shape
        got = np.asarray(seg.dataobj)
        # The same arithmetic in another process: equal but for a voxel at a near tie.
        assert (got != want).mean() < 1e-3, (got != want).sum()
    with open(out / "metrics.csv") as f:
        assert [r["case"] for r in csv.DictReader(f)][-1] == "mean"


def test_the_2d_3d_ensemble_cannot_be_exported_as_one_model(trained):
    root, cv_dir, _ = trained
    res = run_group([f"{BIN}/distseg-predict", "--cv", cv_dir, "--recipe", "two", "--recipe",
                     "three", "--export", str(root / "export")], timeout=TIMEOUT,
                    env=command_env())
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "read a scan on other windows or grids" in lines[0]
    assert not os.path.exists(root / "export")
