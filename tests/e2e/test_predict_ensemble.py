"""``distseg-predict --cv`` / repeated ``--checkpoint``: the fold ensemble.

A phantom task is converted once with a fold table (``convert --folds 3``), a CV plan of
one recipe is written and trained by the user's own commands (``distseg-jobs cv``,
``cv-run``: three smoke-preset folds), and each fold decides its own mirroring and
largest component (``--decide``). The ensemble is then checked against its members,
each predicted alone by the same inferer: its probabilities are their mean, its
segmentation is the argmax of that mean on each scan's own grid, the exported model
gives the same probabilities, 2 ranks write what 1 rank writes, and a member of another
preprocessing is averaged with the others on each scan's own grid.
"""

import csv
import json
import os
import shutil

import nibabel as nib
import numpy as np
import pytest

from distseg import sliding
from distseg.core import config as config_lib
from distseg.data.convert import geometry, samples, sources
from distseg.data.convert.intensity import forward_channels
from distseg.inference import ensemble, postprocess, predict

from proc_group import horovodrun_cmd, run_group
from support import BIN, command_env, predict_exported

TIMEOUT = 240
SPACING = (0.7, 0.9, 3.0)
FOLDS = 3
#: Held-out phantom cases (seed, orientation): no fold trained on them.
HELD_OUT = ((101, "RAS"), (102, "LPS"), (103, "PIR"))
pytestmark = pytest.mark.timeout(4 * TIMEOUT)


def ok(cmd, timeout=TIMEOUT):
    out = run_group([str(c) for c in cmd], timeout=timeout, env=command_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def predict_cmd(*args, ranks=1):
    cmd = [f"{BIN}/distseg-predict", *map(str, args), "--no-progress"]
    if ranks > 1:
        cmd = horovodrun_cmd(*cmd, ranks=ranks)
    return run_group(cmd, timeout=TIMEOUT, env=command_env())


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    """Three smoke folds of one converted file, trained by ``distseg-jobs cv-run`` (about
    35 s), each with its ``postprocessing.json``; and held-out labelled scans."""
    root = tmp_path_factory.mktemp("ensemble")
    task = str(root / "Task03_Liver")
    samples.write_task(task, 6, size=40, slices=16, orientations=("RAS", "LPS", "PIR"),
                       spacing_ras=SPACING)
    h5 = str(root / "liver.h5")
    ok([f"{BIN}/distseg-data", "convert", task, h5, "--size", "32", "--folds", str(FOLDS),
        "--no-progress"])
    cv_dir = str(root / "CV")
    ok([f"{BIN}/distseg-jobs", "cv", "--partition", "generic", "--cores-per-node", "2",
        "--ranks-per-node", "1", "--data", h5, "--nodes", "1", "--epochs", "3", "--out", cv_dir,
        "--recipe", "smoke=--preset smoke --lr 0.01"])
    ok([f"{BIN}/distseg-jobs", "cv-run", cv_dir, "--no-report"], timeout=3 * TIMEOUT)
    runs = ensemble.cv_runs(cv_dir)
    assert len(runs) == FOLDS
    for run in runs:
        ok([f"{BIN}/distseg-predict", "--checkpoint", run, "--decide", "--no-progress"])
    for folder in ("scans", "truth"):
        os.makedirs(root / folder)
    scans = []
    for seed, orientation in HELD_OUT:
        hu, labels = samples.case_arrays(seed, 40, 16, orientation)
        affine = samples.affine_for(orientation, SPACING)
        name = f"held_{seed}"
        samples.save_volume(str(root / f"scans/{name}.nii.gz"), hu, affine)
        samples.save_volume(str(root / f"truth/{name}.nii.gz"), labels, affine)
        scans.append(str(root / f"scans/{name}.nii.gz"))
    return {"root": root, "h5": h5, "cv": cv_dir, "runs": runs, "task": task, "scans": scans}


@pytest.fixture(scope="module")
def one_rank(cv):
    """The ensemble predicts the held-out scans on one rank, with its own decisions."""
    out = cv["root"] / "one"
    res = predict_cmd("--cv", cv["cv"], *cv["scans"], "--labels", cv["root"] / "truth",
                      "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stdout


def _options(**kw):
    return predict.Options(**{"run_dir": "", "inputs": (), "out": "", **kw})


def _scan_volume(path, prep):
    """A scan as predict preprocesses it: (its geometry, the model's input volume)."""
    img = sources.load(path)
    voxels = sources.image_voxels(img, path)
    geom = geometry.Geometry.of(img.affine, voxels.raw.shape, size=prep.size, target=prep.spacing)
    return img, geom, forward_channels((voxels,), geom, prep.intensities)[0]


def _probs(net, volume):
    return sliding.sliding_window(net.predict, volume, net.window, net.overlap, batch=net.batch_size)


def _member_net(run, tta):
    """One member alone, as single-run predict builds it."""
    cfg = predict.run_config(run)
    known = predict.training_data(cfg, _options(run_dir=run))
    opts = predict.Options(run, (), "", tta=tta, postprocess="none")
    return predict.network(cfg, opts, known.path)


@pytest.mark.parametrize("tta", ["none", "mirror"])
def test_the_ensemble_is_the_mean_of_its_members_probabilities(cv, tta):
    opts = ensemble.resolved(_options(cv=cv["cv"], tta=tta))
    members = ensemble.members_of(opts)
    net = ensemble.network(members, opts)
    assert net.post.mirror == (tta == "mirror")
    _, _, volume = _scan_volume(cv["scans"][0], members[0].known.prep)
    got = _probs(net, volume)
    alone = [_probs(_member_net(run, tta), volume) for run in cv["runs"]]
    assert got.shape == volume.shape + (3,) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.mean(alone, axis=0), atol=1e-5)
    # The members differ (else the mean proves nothing), and the mean is a probability.
    assert max(np.abs(a - alone[0]).max() for a in alone[1:]) > 1e-2
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_the_ensemble_segmentation_is_the_argmax_of_the_mean_on_each_scan(cv, one_rank):
    out, stdout = one_rank
    opts = ensemble.resolved(_options(cv=cv["cv"]))
    members = ensemble.members_of(opts)
    chosen = [predict.choose_checkpoint(run) for run in opts.runs]
    post = ensemble.applied(members, chosen, opts)
    tta = "mirror" if post.mirror else "none"
    nets = [_member_net(run, tta) for run in cv["runs"]]
    for path in cv["scans"]:
        img, geom, volume = _scan_volume(path, members[0].known.prep)
        mean = np.mean([_probs(n, volume) for n in nets], axis=0)
        on_scan = geometry.labels_on_scan(mean, geom)
        want = postprocess.keep_largest(on_scan, post.largest) if post.largest else on_scan
        seg = nib.load(out / f"{sources.strip_extension(os.path.basename(path))}_seg.nii.gz")
        assert seg.shape == img.shape and seg.get_data_dtype() == np.uint8
        np.testing.assert_array_equal(seg.affine, img.affine)
        got = np.asarray(seg.dataobj)
        # The same arithmetic in another process: equal but for a voxel at a near tie.
        assert (got != want).mean() < 1e-3, (got != want).sum()
    assert f"ensemble: the mean of {FOLDS} members' softmax probabilities" in stdout
    assert f"decided on the 6 validation case(s) of the {FOLDS} member(s), pooled" in stdout
    assert all(f"member {i}: {run}: checkpoint epoch-" in stdout for i, run in enumerate(cv["runs"]))


def _mean_dice(out):
    with open(out / "metrics.csv") as f:
        row = list(csv.DictReader(f))[-1]
    assert row["case"] == "mean"
    return {k[5:]: float(v) for k, v in row.items() if k.startswith("dice_")}


def test_the_ensembles_dice_beside_each_members(cv, one_rank):
    """The note's measure, printed, not asserted: on these toy folds (3 epochs) the
    order of ensemble and members is the phantom's, not a finding."""
    lines = [f"ensemble of {FOLDS}: {_mean_dice(one_rank[0])}"]
    for i, run in enumerate(cv["runs"]):
        out = cv["root"] / f"member-{i}"
        res = predict_cmd("--checkpoint", run, *cv["scans"], "--labels", cv["root"] / "truth",
                          "--out", out, "--no-overlays")
        assert res.returncode == 0, res.stderr[-3000:]
        lines.append(f"fold {i} alone: {_mean_dice(out)}")
    print("\nmean Dice over the held-out phantom cases\n" + "\n".join(lines))


def test_two_ranks_write_the_segmentation_of_one(cv, one_rank):
    two = cv["root"] / "two"
    res = predict_cmd("--cv", cv["cv"], *cv["scans"], "--out", two, "--no-overlays", ranks=2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = sorted(f for f in os.listdir(two) if f.endswith("_seg.nii.gz"))
    assert names == sorted(f"held_{seed}_seg.nii.gz" for seed, _ in HELD_OUT)
    for name in names:
        np.testing.assert_array_equal(np.asarray(nib.load(one_rank[0] / name).dataobj),
                                      np.asarray(nib.load(two / name).dataobj))
    assert f"{len(HELD_OUT)} case(s) on 2 rank(s)" in res.stdout


def test_a_member_of_another_preprocessing_is_averaged_on_each_scans_grid(cv):
    """A member trained on data of another CT window reads each scan with its own
    window; the two members' probabilities meet on the scan's own grid, each weighing
    half."""
    root = cv["root"]
    other = str(root / "other.h5")
    ok([f"{BIN}/distseg-data", "convert", cv["task"], other, "--size", "32", "--window",
        "-100,200", "--folds", str(FOLDS), "--no-progress"])
    windowed = root / "windowed"
    shutil.copytree(cv["runs"][1], windowed)
    with open(windowed / "config.json") as f:
        cfg = json.load(f)
    cfg["data"]["path"] = other  # the same network, as if trained on another window
    with open(windowed / "config.json", "w") as f:
        json.dump(cfg, f)
    out = root / "windowed-seg"
    res = predict_cmd("--checkpoint", cv["runs"][0], "--checkpoint", windowed, cv["scans"][0],
                      "--out", out, "--tta", "none", "--postprocess", "none", "--no-overlays")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "over 2 windows or grids" in res.stdout
    background = np.eye(3, dtype=np.float32)[0]
    on_scan = []
    for run in (cv["runs"][0], str(windowed)):
        known = predict.training_data(predict.run_config(run), _options(run_dir=run))
        _, geom, volume = _scan_volume(cv["scans"][0], known.prep)
        on_scan.append(geometry.inverse(_probs(_member_net(run, "none"), volume), geom,
                                        order=1, fill=background))
    assert not np.array_equal(on_scan[0], on_scan[1])  # the windows differ, so do the members
    want = np.argmax(np.mean(on_scan, axis=0), axis=-1)
    name = sources.strip_extension(os.path.basename(cv["scans"][0]))
    got = np.asarray(nib.load(out / f"{name}_seg.nii.gz").dataobj)
    assert (got != want).mean() < 1e-3, (got != want).sum()


def test_the_exported_ensemble_gives_the_ensembles_probabilities(cv):
    export_dir = cv["root"] / "export"
    res = predict_cmd("--cv", cv["cv"], "--export", export_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(export_dir / "model.json") as f:
        convention = json.load(f)
    assert convention["window"] == [1, 32, 32] and convention["input"]["shape"] == [None, 32, 32, 1]
    assert convention["class_names"] == ["background", "liver", "cancer"]
    assert "mean of the members' softmax probabilities" in convention["output"]["meaning"]
    assert [m["run"] for m in convention["members"]] == [os.path.abspath(r) for r in cv["runs"]]
    assert "pooled" in convention["postprocessing"]["why"]
    x = np.random.default_rng(0).random((4, 32, 32, 1), dtype=np.float32)
    _, theirs = predict_exported(export_dir, x, TIMEOUT)
    opts = ensemble.resolved(_options(cv=cv["cv"], tta="none"))
    net = ensemble.network(ensemble.members_of(opts), opts)
    ours = net.predict(x[:, None])[:, 0]
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_the_plans_flags_choose_the_folds(cv):
    res = predict_cmd("--cv", cv["cv"], "--recipe", "dice", cv["scans"][0], "--out",
                      cv["root"] / "none")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"error: --recipe dice: not in {cv['cv']}/cv.json (its "
                                  "recipes: smoke)")
    res = predict_cmd("--cv", cv["cv"], "--checkpoint", cv["runs"][0], "--out", cv["root"] / "x")
    assert res.returncode == 2 and "give --checkpoint RUN" in res.stderr
    # Every case validates in one fold and trains the others: no split is the ensemble's.
    res = predict_cmd("--cv", cv["cv"], cv["task"], "--subset", "val", "--out", cv["root"] / "x")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"error: --subset val: {cv['runs'][0]} and {cv['runs'][1]} "
                                  "split the cases differently (other folds); give test, all or "
                                  "the files")


def test_each_member_validated_its_own_fold(cv):
    """Each fold validated its own cases: the members' configs name folds 0..K-1."""
    folds = [config_lib.resolve("liver2d", file=os.path.join(r, "config.json")).data.fold
             for r in cv["runs"]]
    assert folds == list(range(FOLDS))
