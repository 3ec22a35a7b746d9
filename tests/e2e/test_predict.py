"""``distseg-predict``: segmentations back on the scans' own grids, metrics, overlays.

An "oracle" model that returns the converted label slices shows that everything around
the network (reorientation, resampling both ways, batching, the NIfTI written) puts the
labels back exactly. A real smoke-preset run, trained by the real ``distseg-train`` on a
converted file, then goes through the command, as one process and as 2 Horovod ranks.
"""

import csv
import json
import os
import shutil

import nibabel as nib
import numpy as np
import pytest

from distseg import metrics, sliding
from distseg.core.errors import InputError
from distseg.data import h5format
from distseg.data import slices as data
from distseg.data.convert import geometry, samples, sources
from distseg.data.convert.intensity import Intensity
from distseg.inference import predict
from distseg.inference import scans as scans_lib

from proc_group import horovodrun_cmd, run_group
from support import BIN, command_env, predict_exported
from support import log_records as records

TIMEOUT = 240
SPACING = (0.7, 0.9, 3.0)
pytestmark = pytest.mark.timeout(2 * TIMEOUT)


def oracle(labels, affine, size, num_classes=3):
    """A "model" that copies the labels: it returns, batch after batch, the one-hot of
    the label slices as ``convert`` resamples them (nearest)."""
    geom = geometry.Geometry.of(affine, labels.shape, size=size)
    slices = geometry.forward(labels, geom, order=0)
    done = [0]

    def fn(x):
        assert x.shape[1:] == (size, size, 1) and x.dtype == np.float32
        batch = slices[done[0]:done[0] + len(x)]
        done[0] += len(x)
        return np.eye(num_classes, dtype=np.float32)[batch]
    return fn


def prep(size):
    return predict.Preprocessing(Intensity.ct(), size, None, "test")


def slices_net(fn, size, batch=8):
    """A 2D "model" ``fn`` ((B, size, size, 1) -> (B, size, size, C)) as predict runs
    it: sliding windows of one slice."""
    return predict.Network(sliding.slicewise(fn), (1, size, size), batch)


@pytest.mark.parametrize("orientation", ["PIL", "LPS", "RAS"])
def test_the_label_comes_back_exactly_through_predict(orientation, tmp_path):
    hu, labels = samples.case_arrays(5, 24, 10, orientation)
    affine = samples.affine_for(orientation, SPACING)
    image, seg = str(tmp_path / "scan.nii.gz"), str(tmp_path / "scan_truth.nii.gz")
    samples.save_volume(image, hu, affine)
    samples.save_volume(seg, labels, affine)
    opts = predict.Options(run_dir="r", inputs=(image,), out=str(tmp_path))
    scan = scans_lib.Scan("scan", image, seg)
    # 24 -> 48 in-plane and back: exact even with linear interpolation of probabilities
    result = predict.predict_scan(scan, prep(48), slices_net(oracle(labels, affine, 48), 48, 3),
                                  opts, 3)
    out = nib.load(result.output)
    assert result.output == str(tmp_path / "scan_seg.nii.gz")
    assert out.shape == labels.shape and out.get_data_dtype() == np.uint8
    np.testing.assert_array_equal(out.affine, nib.load(image).affine)
    np.testing.assert_array_equal(np.asarray(out.dataobj), labels)
    assert [(s.dice, s.hd95, s.nsd) for s in result.scores] == [(1.0, 0.0, 1.0)] * 2
    # Downsampled (24 -> 16 -> 24) a copying model is close, not exact.
    vol = sources.image_voxels(nib.load(image), image)
    down = predict.segment(vol, affine, prep(16), slices_net(oracle(labels, affine, 16), 16, 4))
    assert down.shape == labels.shape
    assert metrics.dice(labels == 1, down == 1) > 0.85


def test_a_model_trained_with_resize_gets_resized_slices(tmp_path):
    _, labels = samples.case_arrays(6, 24, 6, "LPS")
    affine = samples.affine_for("LPS", SPACING)
    inner = oracle(labels, affine, 48)
    seen = []

    def model32(x):  # the data file holds 48x48 slices; the model takes 32x32
        seen.append(x.shape)
        return data.resize_nearest(inner(data.resize_bilinear(x, 48)), 32)
    seg = predict.segment(sources.Voxels(np.zeros(labels.shape, np.int16)), affine, prep(48),
                          slices_net(model32, 32, 4))
    assert seen[0] == (4, 32, 32, 1) and seg.shape == labels.shape
    assert metrics.dice(labels > 0, seg > 0) > 0.9


def test_nrrd_input_is_written_as_nifti_on_its_grid(tmp_path):
    samples.write_task(str(tmp_path / "n"), 1, kind="pairs", size=16, slices=6, ext=".nrrd",
                       orientations=("LPS",), spacing_ras=SPACING)
    image, seg = str(tmp_path / "n/volume-0.nrrd"), str(tmp_path / "n/segmentation-0.nrrd")
    lab = sources.load(seg)
    labels = sources.label_array(lab, seg)
    opts = predict.Options(run_dir="r", inputs=(image,), out=str(tmp_path))
    result = predict.predict_scan(scans_lib.Scan("volume-0", image, seg), prep(16),
                                  slices_net(oracle(labels, lab.affine, 16), 16), opts, 3)
    out = nib.load(result.output)
    np.testing.assert_allclose(out.affine, lab.affine, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.dataobj), labels)


def test_inputs_are_checked_from_their_headers(tmp_path):
    affine = samples.affine_for("RAS")
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 4, 2), np.float32), affine), tmp_path / "two.nii")
    nib.save(nib.Nifti1Image(np.zeros((8, 8), np.float32), affine), tmp_path / "flat.nii")
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 4), np.float32), affine), tmp_path / "vol.nii")
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 5), np.uint8), affine), tmp_path / "lab.nii")
    for name, label, words in (("two", None, ["two.nii", "2 channels", "model of RUN takes 1", "--channel"]),
                               ("flat", None, ["flat.nii", "(8, 8)", "model of RUN", "3-D"]),
                               ("vol", "lab", ["lab.nii", "(8, 8, 5)", "vol.nii is (8, 8, 4)"])):
        scan = scans_lib.Scan(name, str(tmp_path / f"{name}.nii"),
                              str(tmp_path / f"{label}.nii") if label else None)
        with pytest.raises(InputError) as e:
            predict.check_scan(scan, prep(16), "RUN")
        assert all(w in str(e.value) for w in words), str(e.value)
    assert predict.check_scan(scans_lib.Scan("two", str(tmp_path / "two.nii"), None),
                              predict.Preprocessing(Intensity.mr(), 16, 1, "flag"), "RUN") == 8 * 8 * 4


def test_scans_from_files_folders_and_subsets(tmp_path):
    root = str(tmp_path / "Task")
    samples.write_task(root, 3, size=16, slices=4, test_cases=2)
    found = scans_lib.collect_scans((root,), None)
    assert [(j.name, j.label) for j in found] == [("liver_3", None), ("liver_4", None)]
    table = {"liver_0": 0, "liver_1": 1, "liver_2": 1}
    val = scans_lib.collect_scans((root,), table, subset="val")
    assert [j.name for j in val] == ["liver_1", "liver_2"] and val[0].label.endswith("labelsTr/liver_1.nii.gz")
    assert len(scans_lib.collect_scans((root,), None, subset="all")) == 5
    with pytest.raises(InputError, match="needs the case table"):
        scans_lib.collect_scans((root,), None, subset="val")
    pairs = str(tmp_path / "pairs")
    samples.write_task(pairs, 2, kind="pairs", size=16, slices=4)
    files = scans_lib.collect_scans((f"{pairs}/volume-1.nii.gz",), None, labels=pairs)
    assert files[0].label == f"{pairs}/segmentation-1.nii.gz"
    with pytest.raises(InputError, match="outputs would overwrite each other"):
        scans_lib.collect_scans((f"{pairs}/volume-1.nii.gz",) * 2, None)
    with pytest.raises(InputError, match="no such file or folder"):
        scans_lib.collect_scans(("missing.nii",), None)
    # ranks share the cases out, each exactly once, the largest alone
    scans, sizes = found + val, [10, 10, 10, 25]
    shares = [predict.mine(scans, sizes, r, 3) for r in range(3)]
    assert sorted(s.name for share in shares for s in share) == sorted(s.name for s in scans)
    assert [s.name for s in shares[0]] == ["liver_2"]


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A converted MSD-style phantom task and a 1-epoch smoke run trained on it."""
    root = tmp_path_factory.mktemp("e2e")
    task = str(root / "Task03_Liver")
    samples.write_task(task, 8, size=40, slices=16, orientations=("RAS", "LPS", "PIR"),
                       spacing_ras=SPACING, test_cases=2)
    h5 = str(root / "liver.h5")
    out = run_group([f"{BIN}/distseg-data", "convert", task, h5, "--size", "32", "--val-fraction",
                     "0.25", "--no-progress"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr
    run = str(root / "run")
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke", "--data", h5, "--run-dir", run,
                     "--epochs", "1", "--lr", "0.01"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"task": task, "h5": h5, "run": run, "root": root}


def predict_cmd(*args, ranks=1):
    cmd = [f"{BIN}/distseg-predict", *map(str, args), "--no-progress"]
    if ranks > 1:
        cmd = horovodrun_cmd(*cmd, ranks=ranks)
    return run_group(cmd, timeout=TIMEOUT, env=command_env())


def _split_names(h5, split):
    import h5py
    with h5py.File(h5) as f:
        return sorted(n.decode() for n, s in zip(f["cases/name"][:], f["cases/split"][:])
                      if s == h5format.SPLITS[split])


@pytest.fixture(scope="module")
def predicted(trained):
    """One process predicts every case of the task folder (8 labelled, 2 imagesTs)."""
    out = trained["root"] / "one"
    res = predict_cmd("--checkpoint", trained["run"], trained["task"], "--subset", "all",
                      "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stdout


def test_predictions_land_on_each_scan_with_metrics_and_overlays(trained, predicted):
    out_dir, stdout = predicted
    names = [f"liver_{i}" for i in range(10)]
    for name in names:
        seg = nib.load(out_dir / f"{name}_seg.nii.gz")
        folder = "imagesTr" if name < "liver_8" else "imagesTs"
        scan = nib.load(os.path.join(trained["task"], folder, f"{name}.nii.gz"))
        assert seg.shape == scan.shape and seg.get_data_dtype() == np.uint8
        np.testing.assert_array_equal(seg.affine, scan.affine)
        assert set(np.unique(np.asarray(seg.dataobj))) <= {0, 1, 2}
    with open(out_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == names[:8] + ["mean"]  # imagesTs have no labels
    assert set(rows[0]) >= {"dice_liver", "hd95_mm_liver", "nsd_cancer", "voxels_true_cancer"}
    for r in rows[:-1]:
        assert 0.0 <= float(r["dice_liver"]) <= 1.0 and int(r["voxels_true_liver"]) > 0
    mean = np.mean([float(r["dice_liver"]) for r in rows[:-1]])
    assert float(rows[-1]["dice_liver"]) == pytest.approx(mean, abs=1e-3)
    pngs = sorted(os.listdir(out_dir / "overlays"))
    assert [p.split("_")[0] for p in pngs] == ["best", "median", "worst"]
    assert "mean of 8" in stdout and "liver Dice" in stdout
    assert "attributes of" in stdout and "'window': [-150.0, 250.0]" in stdout


def test_two_horovod_ranks_share_the_cases_and_agree_with_one(trained, predicted):
    one, two = predicted[0], trained["root"] / "two"
    res = predict_cmd("--checkpoint", trained["run"], trained["task"], "--subset", "val",
                      "--out", two, "--no-overlays", ranks=2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    val = _split_names(trained["h5"], "val")
    assert len(val) == 2
    names = sorted(f for f in os.listdir(two) if f.endswith("_seg.nii.gz"))
    assert names == [f"{n}_seg.nii.gz" for n in val]  # each case once, by one rank
    for name in names:
        np.testing.assert_array_equal(np.asarray(nib.load(one / name).dataobj),
                                      np.asarray(nib.load(two / name).dataobj))
    with open(two / "metrics.csv") as f:
        assert [r["case"] for r in csv.DictReader(f)] == val + ["mean"]
    assert "2 case(s) on 2 rank(s)" in res.stdout


def test_a_checkpoint_of_another_model_or_class_count_is_one_line(trained):
    bad = trained["root"] / "other"
    shutil.copytree(trained["run"], bad)
    with open(bad / "config.json") as f:
        cfg = json.load(f)
    cfg["model"]["base_filters"] = 8
    with open(bad / "config.json", "w") as f:
        json.dump(cfg, f)
    from distseg.core import config as config_lib
    with pytest.raises(InputError) as e:
        predict.build_model(config_lib.resolve("liver2d", file=str(bad / "config.json")), str(bad))
    assert "weights.h5: cannot be loaded into this model" in str(e.value)
    assert "config.json describes a 2D U-Net of 3 classes" in str(e.value) and "base filters 8" in str(e.value)
    cfg["model"]["base_filters"], cfg["model"]["num_classes"] = 4, 4
    cfg["model"].pop("class_names", None)  # (the run's names are the data file's 3)
    with open(bad / "config.json", "w") as f:
        json.dump(cfg, f)
    res = predict_cmd("--checkpoint", bad, trained["task"], "--out", trained["root"] / "x")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (f"error: {trained['h5']}: 3 classes, but the model of "
                                            f"{bad} predicts 4"), res.stderr


# ---------------------------------------------------------------- 3D runs

SLAB3D = (8, 16, 16)


@pytest.fixture(scope="module")
def trained3d(tmp_path_factory):
    """A phantom task converted to volumes (``--ndim 3``) and a small smoke3d run on
    8x16x16 slabs (25 short epochs, about 40 s)."""
    root = tmp_path_factory.mktemp("e2e3d")
    task = str(root / "Task03_Liver")
    samples.write_task(task, 6, size=32, slices=16, orientations=("RAS", "LPS", "PIR"),
                       spacing_ras=SPACING)
    h5 = str(root / "volumes.h5")
    out = run_group([f"{BIN}/distseg-data", "convert", task, h5, "--ndim", "3",
                     "--val-fraction", "0.2", "--no-progress"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr
    run = str(root / "run")
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke3d", "--data", h5, "--run-dir", run,
                     "--slab", ",".join(map(str, SLAB3D)), "--epochs", "25", "--batch-size", "4",
                     "--lr", "0.01", "--loss", "dice_ce", "--base-filters", "8",
                     "--foreground-fraction", "0.5"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"task": task, "h5": h5, "run": run, "root": root}


def test_a_3d_run_segments_a_scan_on_its_own_grid(trained3d):
    # An unseen phantom of another shape, in LPS order with anisotropic voxels and an
    # offset origin: the segmentation must come back on exactly that grid. The same
    # phantom stored in RAS and PIR order must be segmented voxel for voxel alike once
    # its axes are brought to one order: a check of the geometry that does not depend
    # on how well this small model learned.
    root = trained3d["root"]
    os.makedirs(root / "scans", exist_ok=True)
    os.makedirs(root / "truth", exist_ok=True)
    scans = {}
    for orientation in ("LPS", "RAS", "PIR"):
        hu, labels = samples.case_arrays(77, 40, 20, orientation)
        affine = samples.affine_for(orientation, SPACING)
        name = f"phantom_{orientation.lower()}"
        samples.save_volume(str(root / f"scans/{name}.nii.gz"), hu, affine)
        samples.save_volume(str(root / f"truth/{name}.nii.gz"), labels, affine)
        scans[orientation] = name, hu, labels, affine
    out = root / "pred3d"
    res = predict_cmd("--checkpoint", trained3d["run"],
                      *[root / f"scans/{name}.nii.gz" for name, *_ in scans.values()],
                      "--labels", root / "truth", "--out", out, "--no-overlays")
    assert res.returncode == 0, res.stderr[-3000:]
    canonical, preds = {}, {}
    for orientation, (name, hu, labels, affine) in scans.items():
        seg = nib.load(out / f"{name}_seg.nii.gz")
        assert seg.shape == hu.shape and seg.get_data_dtype() == np.uint8
        np.testing.assert_array_equal(seg.affine, nib.load(root / f"scans/{name}.nii.gz").affine)
        np.testing.assert_allclose(seg.affine, affine, atol=1e-5)  # (NIfTI stores float32)
        preds[orientation] = pred = np.asarray(seg.dataobj)
        assert set(np.unique(pred)) <= {0, 1, 2}
        canonical[orientation] = geometry.to_slices(pred, geometry.ornt_of(affine))
    assert np.array_equal(canonical["LPS"], canonical["RAS"])
    assert np.array_equal(canonical["LPS"], canonical["PIR"])
    # No Dice floor on this unseen shape: the 25-epoch toy model's Dice on it is set by
    # the CPU's float rounding (0.24-0.73 over seeds on the machine of 2026-11-24; 0.043,
    # liver everywhere's score, on the machine of 2026-11-25 with the code of both
    # days and the same data), so a floor tests the machine, not predict. That predict
    # scores a case as training validated it is the next test.
    assert (preds["LPS"] > 0).any()
    assert "each scan's own grid" in res.stdout and "windows of 8x16x16" in res.stdout


def test_a_3d_validation_case_scores_as_training_validated_it(trained3d):
    # The same case through predict (from its NIfTI) and through training's validation
    # (from the converted file): the same preprocessing and inferer give the same Dice.
    out = trained3d["root"] / "val3d"
    res = predict_cmd("--checkpoint", trained3d["run"], trained3d["task"], "--subset", "val",
                      "--out", out, "--no-overlays")
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))[:-1]
    assert [r["case"] for r in rows] == _split_names(trained3d["h5"], "val") == ["liver_3"]
    last = [r for r in records(trained3d["run"], 0) if r["type"] == "epoch"][-1]
    validated = last["val_cases_local"]["3"]
    for name in ("liver", "cancer"):
        assert float(rows[0][f"dice_{name}"]) == pytest.approx(validated[name], abs=1e-4), name


def test_a_volume_file_for_a_2d_run_is_one_line(trained, trained3d):
    res = predict_cmd("--checkpoint", trained["run"], trained["task"], "--data", trained3d["h5"],
                      "--out", trained["root"] / "y")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"error: {trained3d['h5']}: holds 3D volumes, but the model of "
                                  f"{trained['run']} is a 2D U-Net trained on 2D slices")


# ---------------------------------------------------------------- export

@pytest.mark.parametrize("which", ["trained", "trained3d"])
def test_the_exported_model_loads_without_distseg_and_predicts_the_same(which, request):
    run = request.getfixturevalue(which)
    export_dir = run["root"] / "export"
    res = predict_cmd("--checkpoint", run["run"], "--export", export_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(export_dir / "model.json") as f:
        convention = json.load(f)
    dims = 3 if which == "trained3d" else 2
    window = list(SLAB3D) if dims == 3 else [1, 32, 32]
    spatial = window if dims == 3 else window[1:]
    assert convention["spatial_dims"] == dims and convention["window"] == window
    assert convention["layout"] == "channels_last"
    assert convention["input"]["shape"] == [None] + spatial + [1]
    assert convention["input"]["dtype"] == "float32" and convention["input"]["range"] == [0.0, 1.0]
    assert convention["intensity"]["window"] == [-150.0, 250.0]
    assert convention["class_names"] == ["background", "liver", "cancer"]
    assert convention["output"]["shape"] == [None] + spatial + [3]
    assert "softmax probabilities" in convention["output"]["meaning"]
    x = np.random.default_rng(0).random([3] + spatial + [1], dtype=np.float32)
    loaded, theirs = predict_exported(export_dir, x, TIMEOUT)
    assert "LAYERS=keras\n" in loaded.stdout
    from distseg.core import config as config_lib
    cfg = config_lib.resolve("liver2d", file=str(os.path.join(run["run"], "config.json")))
    ours = predict.build_model(cfg, run["run"], tuple(spatial))(x, training=False).numpy()
    assert theirs.shape == ours.shape == tuple([3] + spatial + [3])
    np.testing.assert_allclose(theirs, ours, atol=2e-6)
