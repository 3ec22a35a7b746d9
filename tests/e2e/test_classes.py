"""The data file decides the classes: MSD-style tasks of 2 and 4 classes go through
`distseg-data convert`, `distseg-train --preset smoke` (no flag for classes) and
`distseg-predict` as a user runs them, and a config that contradicts the file is
refused in one line before anything is written.
"""

import csv
import json
import os

import nibabel as nib
import numpy as np
import pytest

from analysis import coverage, logs
from distseg.data.convert import samples

from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)

#: Class names of each task, and how its labels come from the phantom's 0/1/2.
TASKS = {
    2: ("background", "lesion"),
    4: ("background", "liver", "cancer", "vessel"),
}


def relabel(labels: np.ndarray, classes: int) -> np.ndarray:
    """The phantom's labels (0 background, 1 liver, 2 lesion) as ``classes`` classes:
    2: any foreground is 1; 4: the liver's voxels of the second axis' upper half become
    3 (present in every case, since the liver straddles the middle)."""
    if classes == 2:
        return (labels > 0).astype(np.uint8)
    out = labels.copy()
    half = labels.shape[1] // 2
    out[:, half:][out[:, half:] == 1] = 3
    return out


def write_task(root: str, classes: int, cases: int = 6, size: int = 32, slices: int = 8) -> None:
    """An MSD task folder (dataset.json, imagesTr/, labelsTr/) of ``cases`` phantoms of
    ``size`` x ``size`` x ``slices`` voxels, labelled with ``classes`` classes."""
    names = TASKS[classes]
    training = []
    for folder in ("imagesTr", "labelsTr"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    for i in range(cases):
        orientation = ("RAS", "LPS")[i % 2]
        hu, labels = samples.case_arrays(100 + i, size, slices, orientation)
        affine = samples.affine_for(orientation, (0.8, 0.8, 2.5))
        image, label = f"./imagesTr/case_{i}.nii.gz", f"./labelsTr/case_{i}.nii.gz"
        samples.save_volume(os.path.join(root, image), hu, affine)
        samples.save_volume(os.path.join(root, label), relabel(labels, classes), affine)
        training.append({"image": image, "label": label})
    with open(os.path.join(root, "dataset.json"), "w", encoding="utf-8") as f:
        json.dump({"name": f"Phantom{classes}", "modality": {"0": "CT"},
                   "labels": {str(k): n for k, n in enumerate(names)},
                   "numTraining": cases, "numTest": 0, "training": training, "test": []}, f)


def records(run_dir: str, rank: int) -> list[dict]:
    return log_records(run_dir, rank)


def command(name, *args):
    return run_group([f"{BIN}/{name}", *map(str, args)], timeout=TIMEOUT, env=command_env())


def converted(root, classes: int, *extra) -> tuple[str, str]:
    task = str(root / f"Task{classes}")
    if not os.path.isdir(task):
        write_task(task, classes)
    h5 = str(root / f"task{classes}{'-3d' if '--ndim' in extra else ''}.h5")
    out = command("distseg-data", "convert", task, h5, "--val-fraction", "0.34", "--no-progress",
                  *extra)
    assert out.returncode == 0, out.stderr
    return task, h5


@pytest.fixture(scope="module", params=[2, 4], ids=["2-classes", "4-classes"])
def trained(request, tmp_path_factory):
    """A task of 2 or 4 classes, converted to 32x32 slices and trained a few smoke steps."""
    classes = request.param
    root = tmp_path_factory.mktemp(f"classes{classes}")
    task, h5 = converted(root, classes, "--size", 32)
    run = str(root / "run")
    out = command("distseg-train", "--preset", "smoke", "--data", h5, "--run-dir", run,
                  "--epochs", "1", "--max-steps-per-epoch", "3")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"classes": classes, "names": list(TASKS[classes]), "task": task, "h5": h5,
            "run": run, "root": root}


def test_the_run_takes_its_classes_from_the_data_file(trained):
    n, names = trained["classes"], trained["names"]
    with open(os.path.join(trained["run"], "config.json")) as f:
        model = json.load(f)["model"]
    assert (model["num_classes"], model["class_names"]) == (n, names)
    recs = records(trained["run"], 0)
    run = recs[0]
    assert (run["model"]["num_classes"], run["model"]["class_names"]) == (n, names)
    assert (run["dataset"]["num_classes"], run["dataset"]["class_names"]) == (n, names)
    epoch = next(r for r in recs if r["type"] == "epoch")
    assert list(epoch["val_dice"]) == names and recs[-1]["status"] == "ok"


def test_predict_writes_labels_and_one_column_per_class(trained):
    n, names, task = trained["classes"], trained["names"], trained["task"]
    out = trained["root"] / "predicted"
    res = command("distseg-predict", "--checkpoint", trained["run"],
                  os.path.join(task, "imagesTr", "case_0.nii.gz"),
                  "--labels", os.path.join(task, "labelsTr"), "--out", out, "--no-progress",
                  "--no-overlays")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    seg = np.asarray(nib.load(out / "case_0_seg.nii.gz").dataobj)
    assert seg.shape == (32, 32, 8) and 0 <= seg.min() and seg.max() <= n - 1
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == ["case_0", "mean"]
    dice = [c for c in rows[0] if c.startswith("dice_")]
    assert dice == [f"dice_{name}" for name in names[1:]]  # each foreground class, once
    for name in names[1:]:
        assert f"{name[:10]} Dice" in res.stdout


@pytest.mark.parametrize("field, value, said", [
    ("num_classes", 3, "holds 2 classes (attribute num_classes), but config field "
                       "model.num_classes is 3"),
    ("class_names", ["background", "liver"],
     "names its classes ['background', 'lesion'] (attribute class_names), but config field "
     "model.class_names is ['background', 'liver']"),
])
def test_a_config_that_contradicts_the_file_is_one_line_and_nothing_is_written(
        tmp_path_factory, field, value, said):
    root = tmp_path_factory.mktemp("refused")
    _, h5 = converted(root, 2, "--size", 32)
    config = root / "config.json"
    config.write_text(json.dumps({"model": {field: value}}))
    run = root / "run"
    out = command("distseg-train", "--preset", "smoke", "--config", config, "--data", h5,
                  "--run-dir", run)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {h5}: {said}"), out.stderr
    assert not run.exists()


def test_a_3d_run_takes_the_file_classes_and_its_coverage_is_checked_against_the_file(
        tmp_path_factory):
    root = tmp_path_factory.mktemp("classes3d")
    _, h5 = converted(root, 2, "--ndim", 3)
    run = str(root / "run3d")
    out = command("distseg-train", "--preset", "smoke3d", "--data", h5, "--run-dir", run,
                  "--epochs", "2", "--no-validate")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["model"]["num_classes"] == 2
    dataset = records(run, 0)[0]["dataset"]
    assert dataset["layout"] == "volumes" and dataset["sample"] == "slab"
    assert dataset["num_classes"] == 2 and dataset["train_samples"] == dataset["train_slabs"] == 4
    cov = coverage.coverage([logs.load_run(run)])
    assert list(cov["reference"]) == ["train split of the data file"] * 2
    assert list(cov["status"]) == ["covered"] * 2
