"""``distseg-train --model-fn``: a researcher's own Keras model from a file outside the
package, trained by the real command as one process and as 2 Horovod ranks, resumed
after its file moved, predicted onto NIfTI scans and exported.

The model is docs/examples/own_unet.py (GroupNorm: exact at any rank count), copied to
a folder of the test's own.
"""

import json
import os
import shutil

import nibabel as nib
import numpy as np
import pytest

from distseg.core import rundir
from distseg.data import synth
from distseg.data.convert import samples

from proc_group import horovodrun, run_group
from support import BIN, REPO, command_env
from support import log_records as records

TIMEOUT = 300
EXAMPLE = os.path.join(REPO, "docs", "examples", "own_unet.py")
pytestmark = pytest.mark.timeout(4 * TIMEOUT)


def train(*args, ranks=1):
    cmd = ["distseg-train", "--intra-op-threads", "1", "--inter-op-threads", "1", *map(str, args)]
    if ranks > 1:
        return horovodrun(*cmd, ranks=ranks, timeout=TIMEOUT)
    return run_group([f"{BIN}/{cmd[0]}", *cmd[1:]], timeout=TIMEOUT, env=command_env())


def step_losses(run_dir):
    return {r["global_step"]: r["loss"] for r in records(run_dir, 0) if r["type"] == "step"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """An MSD-style phantom task converted to 32x32 slices, and the model's file."""
    root = tmp_path_factory.mktemp("own")
    task = str(root / "Task03_Liver")
    samples.write_task(task, 6, size=40, slices=16, spacing_ras=(0.8, 0.8, 2.5), test_cases=1)
    h5 = str(root / "liver.h5")
    out = run_group([f"{BIN}/distseg-data", "convert", task, h5, "--size", "32",
                     "--val-fraction", "0.34", "--no-progress"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr[-2000:]
    models = root / "models"
    models.mkdir()
    shutil.copy(EXAMPLE, models / "my_unet.py")
    return {"root": root, "task": task, "h5": h5, "fn": f"{models / 'my_unet.py'}:build"}


COMMON = ("--preset", "smoke", "--global-batch", "8", "--max-steps-per-epoch", "6",
          "--model-arg", "filters=4", "--no-validate")


def test_own_model_two_ranks_resume_predict_export(task):
    root = task["root"]
    one, two, straight = str(root / "one"), str(root / "two"), str(root / "straight")
    for run_dir, epochs, ranks in ((one, 2, 1), (two, 1, 2), (straight, 2, 2)):
        out = train(*COMMON, "--data", task["h5"], "--run-dir", run_dir, "--model-fn", task["fn"],
                    "--epochs", epochs, ranks=ranks)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    # The file moves away: the run resumes from its own copy, at 2 ranks.
    shutil.move(os.path.dirname(task["fn"].split(":")[0]), root / "moved")
    out = train("--resume", "--run-dir", two, "--epochs", "2", ranks=2)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    want, got, kept = step_losses(one), step_losses(two), step_losses(straight)
    assert sorted(got) == sorted(want) == sorted(kept) == list(range(12))
    got = [got[k] for k in range(12)]
    np.testing.assert_allclose(got, [want[k] for k in range(12)], rtol=1e-4)
    np.testing.assert_allclose(got, [kept[k] for k in range(12)], rtol=1e-6)
    run = records(two, 0)[0]
    assert run["model"]["name"] == "my_unet.py:build" and run["model"]["args"] == {"filters": 4}
    with open(rundir.config_path(two)) as f:
        model = json.load(f)["model"]
    assert model["fn_sha256"] == _sha(rundir.model_fn_path(two)) == _sha(EXAMPLE)

    # Predict the task's scans onto their own grids, and export.
    res = run_group([f"{BIN}/distseg-predict", "--checkpoint", two, task["task"], "--subset",
                     "all", "--out", str(root / "pred"), "--no-progress"],
                    timeout=TIMEOUT, env=command_env())
    assert res.returncode == 0, res.stderr[-3000:]
    for name in os.listdir(os.path.join(task["task"], "imagesTr")):
        scan = nib.load(os.path.join(task["task"], "imagesTr", name))
        seg = nib.load(root / "pred" / name.replace(".nii.gz", "_seg.nii.gz"))
        assert seg.shape == scan.shape and np.allclose(seg.affine, scan.affine)
    res = run_group([f"{BIN}/distseg-predict", "--checkpoint", two, "--export",
                     str(root / "export")], timeout=TIMEOUT, env=command_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(os.listdir(root / "export")) == ["model.json", "model.keras", "model_fn.py"]


def _sha(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_own_model_in_3d(tmp_path):
    h5 = str(tmp_path / "vol.h5")
    synth.make_volumes(h5, cases=3, size=32, slices_per_case=16, seed=0, jitter=0.0)
    shutil.copy(EXAMPLE, tmp_path / "net.py")
    run_dir = str(tmp_path / "run")
    out = train("--preset", "smoke3d", "--data", h5, "--run-dir", run_dir, "--slab", "16,32,32",
                "--model-fn", f"{tmp_path / 'net.py'}:build", "--max-steps-per-epoch", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    run = records(run_dir, 0)[0]
    assert run["model"]["spatial_dims"] == 3 and run["model"]["input_shape"] == [16, 32, 32]
    assert records(run_dir, 0)[-1]["status"] == "ok"


BAD = '''
import keras
from keras import layers

def raises(input_shape, num_classes):
    raise ValueError("no such backbone: resnet9000")

def wrong_classes(input_shape, num_classes):
    x = keras.Input(input_shape)
    return keras.Model(x, layers.Conv2D(num_classes + 1, 1, activation="softmax")(x))

def not_softmax(input_shape, num_classes):
    x = keras.Input(input_shape)
    return keras.Model(x, layers.Conv2D(num_classes, 1)(x))

def not_a_model(input_shape, num_classes):
    return 42
'''

CASES = {
    "missing file": ("nowhere.py:build", "no such file"),
    "missing function": ("bad.py:build", "has no function 'build'"),
    "raises": ("bad.py:raises", "raised ValueError for input shape (32, 32, 1), 3 classes: "
                                "no such backbone: resnet9000"),
    "wrong classes": ("bad.py:wrong_classes", "expected (32, 32, 3)"),
    "not softmax": ("bad.py:not_softmax", "is not softmax probabilities"),
    "not a model": ("bad.py:not_a_model", "returned a int, expected a keras.Model"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_model_function_is_one_line_on_every_rank(tiny, tmp_path, case):
    (tmp_path / "bad.py").write_text(BAD)
    ref, needle = CASES[case]
    run_dir = str(tmp_path / "run")
    ranks = 2 if case in ("raises", "wrong classes") else 1
    out = train("--preset", "smoke", "--data", tiny, "--run-dir", run_dir,
                "--model-fn", str(tmp_path / ref), ranks=ranks)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "--model-fn" in ln and needle in ln]
    assert len(lines) >= ranks, out.stdout[-2000:] + out.stderr[-2000:]
    assert not os.path.exists(rundir.config_path(run_dir))


def test_a_changed_model_file_is_refused_on_resume(tiny, tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "net.py")
    run_dir = str(tmp_path / "run")
    out = train("--preset", "smoke", "--data", tiny, "--run-dir", run_dir, "--model-fn",
                f"{tmp_path / 'net.py'}:build", "--max-steps-per-epoch", "2", "--no-validate")
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "net.py", "a") as f:
        f.write("\n# changed\n")
    os.remove(rundir.model_fn_path(run_dir))
    before = sorted(os.listdir(rundir.checkpoint_dir(run_dir)))
    out = train("--resume", "--run-dir", run_dir, "--epochs", "2")
    assert out.returncode == 2
    assert "no source with the recorded SHA-256" in out.stderr and "has changed" in out.stderr
    assert sorted(os.listdir(rundir.checkpoint_dir(run_dir))) == before
