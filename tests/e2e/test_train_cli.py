"""End to end: `distseg-train` as a user runs it, one process and 2 Horovod ranks.

Each launch has a timeout so that a hang fails fast instead of eating CI's time.
"""

import json
import os

import numpy as np
import pytest

from distseg.core import rundir, schema
from distseg.data import synth

import proc_group
from proc_group import run_group
from support import BIN, command_env, tree_bytes
from support import log_records as records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)


def horovodrun(*args, np_=2, gloo=False):
    return proc_group.horovodrun("distseg-train", *args, ranks=np_,
                                 controller="gloo" if gloo else None, timeout=TIMEOUT,
                                 launcher="horovodrun")


def single(*args):
    return run_group([f"{BIN}/distseg-train", *args], timeout=TIMEOUT, env=command_env())


def test_two_ranks_one_epoch_loss_goes_down(tiny, tmp_path):
    run_dir = str(tmp_path / "np2")
    out = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", run_dir, "--epochs", "1",
                     "--lr", "0.01")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for rank in (0, 1):
        recs = records(run_dir, rank)
        assert recs[0]["size"] == 2 and recs[-1]["status"] == "ok"
        losses = [r["loss"] for r in recs if r["type"] == "step"]
        assert len(losses) == 16
        assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.02, losses
        epoch = [r for r in recs if r["type"] == "epoch"][0]
        assert epoch["samples"] == 64 and epoch["epoch_time"] > 0
        # Every field the trainer writes is documented in the schema.
        for r in recs:
            known = set(schema.COMMON + schema.FIELDS[r["type"]] + schema.OPTIONAL[r["type"]])
            assert not set(r) - known, (r["type"], set(r) - known)
    with open(rundir.config_path(run_dir)) as f:
        assert json.load(f)["data"]["path"] == tiny


def test_single_process_and_gloo_give_valid_runs(tiny, tmp_path):
    one = single("--preset", "smoke", "--data", tiny, "--run-dir", str(tmp_path / "np1"),
                 "--max-steps-per-epoch", "3", "--no-validate")
    assert one.returncode == 0, one.stderr[-3000:]
    run = records(str(tmp_path / "np1"), 0)[0]
    assert run["size"] == 1 and run["steps_per_epoch"] == 3

    gloo = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", str(tmp_path / "gloo"),
                      "--max-steps-per-epoch", "3", gloo=True)
    assert gloo.returncode == 0, gloo.stdout[-3000:] + gloo.stderr[-3000:]
    for rank in (0, 1):
        recs = records(str(tmp_path / "gloo"), rank)
        assert recs[0]["controller"] == "gloo" and recs[-1]["status"] == "ok"


def test_mpirun_launch(tiny, tmp_path):
    env = command_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = run_group(
        ["mpirun", "-np", "2", "--oversubscribe", "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
         f"{BIN}/distseg-train", "--preset", "smoke", "--data", tiny, "--run-dir",
         str(tmp_path / "mpi"), "--max-steps-per-epoch", "2", "--no-validate"],
        timeout=TIMEOUT, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert {records(str(tmp_path / "mpi"), r)[0]["controller"] for r in (0, 1)} == {"mpi"}


def _no_masks(d):
    import h5py
    path = str(d / "no_masks.h5")
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((8, 32, 32, 1), np.float32)
    return ["--data", path]


def _bad_label(d):
    import h5py
    path = str(d / "labels.h5")
    synth.make_dataset(path, cases=4, size=32, seed=0, slices_per_case=8)
    with h5py.File(path, "r+") as f:
        f["masks"][5, 0, 0] = 9
    return ["--data", path]


def _mask_shape(d):
    import h5py
    path = str(d / "shape.h5")
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((8, 32, 32, 1), np.float32)
        f["masks"] = np.zeros((8, 32, 31), np.uint8)
        f["case_id"] = np.arange(8)
        f["split"] = np.zeros(8, np.uint8)
    return ["--data", path]


def _too_small(d):
    path = str(d / "small.h5")
    synth.make_dataset(path, cases=2, size=32, seed=0, slices_per_case=4)
    return ["--data", path]


def _unwritable_run_dir(d, tiny):
    a_file = d / "a_file"
    a_file.write_text("x")
    return ["--data", tiny, "--run-dir", str(a_file / "run")]


def _newer_format(d):
    import h5py
    path = str(d / "newer.h5")
    synth.make_dataset(path, cases=4, size=32, seed=0, slices_per_case=8)
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 99
    return ["--data", path]


def _other_classes(d, tiny):
    config = d / "four.json"  # the data file decides: its 3 classes, not the config's 4
    config.write_text('{"model": {"num_classes": 4}}')
    return ["--data", tiny, "--config", str(config)]


#: name -> (how to make the bad input in a directory, the message every rank prints)
BAD_INPUTS = {
    "missing file": (lambda d, tiny: ["--data", str(d / "missing.h5")],
                     "missing.h5: no such data file"),
    "no masks": (lambda d, tiny: _no_masks(d), "missing dataset 'masks'"),
    "mask shape": (lambda d, tiny: _mask_shape(d),
                   "'masks' has shape (8, 32, 31), expected (8, 32, 32)"),
    "label": (lambda d, tiny: _bad_label(d), "'masks' slice 5 has label 9, expected 0..2"),
    "too small": (lambda d, tiny: _too_small(d),
                  "4 training slices, fewer than ranks x batch size = 2 x 4 = 8"),
    "image size": (lambda d, tiny: ["--data", tiny, "--image-size", "64"],
                   "slices are 32x32 but --image-size is 64"),
    "run dir": (_unwritable_run_dir, "run directory is not writable"),
    "newer format": (lambda d, tiny: _newer_format(d), "format_version 99 is newer"),
    "global batch": (lambda d, tiny: ["--data", tiny, "--global-batch", "3"],
                     "--global-batch 3 cannot be shared by 2 ranks"),
    "classes": (_other_classes, "holds 3 classes (attribute num_classes), but config field "
                                "model.num_classes is 4"),
}


#: Decided from what every rank reads alike, so one process shows the message; the
#: cases above them in the list stay on 2 ranks, among them the checks one rank makes
#: for all (labels: rank 0 alone reads every mask) and a rank count in the message.
ONE_PROCESS = ("image size", "mask shape", "newer format", "no masks")


def _bad_input_outcome(case, tiny, tmp_path):
    make, message = BAD_INPUTS[case]
    args = make(tmp_path, tiny)
    if "--run-dir" not in args:
        args = args + ["--run-dir", str(tmp_path / "run")]
    ranks = 1 if case in ONE_PROCESS else 2
    out = single("--preset", "smoke", *args) if ranks == 1 else horovodrun("--preset", "smoke", *args)
    return out, message, ranks


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_one_line_same_on_every_rank(tiny, tmp_path, case):
    out, message, ranks = _bad_input_outcome(case, tiny, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, (case, text[-3000:])
    lines = [ln for ln in text.splitlines() if "error: " in ln and message in ln]
    # one line from each rank, the same words on every rank (prefixes name the rank)
    assert len(lines) == ranks, (message, text[-3000:])
    assert len({ln.split("error: ", 1)[1] for ln in lines}) == 1
    assert "Traceback" not in text, text[-3000:]
    assert not os.path.exists(tmp_path / "run"), "a failed start left a run directory"


def test_existing_run_is_refused_and_left_intact(tiny, finished_run):
    before = tree_bytes(finished_run)
    again = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", finished_run)
    assert again.returncode == 2
    assert "already holds a run" in again.stdout + again.stderr
    assert tree_bytes(finished_run) == before


def test_bad_flags_are_named():
    out = single("--data", "x.h5", "--run-dir", "r", "--image-size", "100")
    assert out.returncode == 2
    assert "model.image_size 100 is not divisible by 2**depth = 16" in out.stderr
    out = single("--data", "x.h5", "--run-dir", "r", "--lr-scaling", "cubic")
    assert out.returncode == 2 and "--lr-scaling" in out.stderr
