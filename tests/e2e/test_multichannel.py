"""End to end with several input channels: a 4-channel MSD task (4-D images) and an
nnU-Net v2 raw dataset (one file per channel) converted by ``distseg-data convert``,
trained for one epoch on 2 Horovod ranks by the real ``distseg-train`` (2D on the MSD
task, 3D on the nnU-Net one), and segmented by ``distseg-predict`` back onto the first
channel's NIfTI grid.

Every launch has a timeout, so a hang fails fast instead of eating CI's two cores.
"""

import json
import os

import nibabel as nib
import numpy as np
import pytest

from distseg.core import rundir
from distseg.data import slices as data
from distseg.data import volumes
from distseg.data.convert import samples

import proc_group
from proc_group import run_group
from support import BIN, command_env
from support import log_records as records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
SPACING = (0.7, 0.9, 3.0)
#: One thread per rank: two ranks share the machine's two cores.
THREADS = ("--intra-op-threads", "1", "--inter-op-threads", "1")


def distseg_data(*args):
    out = run_group([f"{BIN}/distseg-data", *map(str, args)], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def train_two_ranks(preset, h5, run, *args):
    out = proc_group.horovodrun("distseg-train", "--preset", preset, "--data", h5, "--run-dir", run,
                                "--epochs", "1", *THREADS, *args, timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for rank in (0, 1):
        recs = records(run, rank)
        assert recs[0]["size"] == 2 and recs[-1]["status"] == "ok"
    with open(rundir.config_path(run)) as f:
        return json.load(f)


def predict(run, out, *inputs):
    res = run_group([f"{BIN}/distseg-predict", "--checkpoint", run, *map(str, inputs), "--out",
                     out, "--no-progress", "--no-overlays"], timeout=TIMEOUT, env=command_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_a_4_channel_msd_task_trains_on_2_ranks_and_predicts_onto_its_grid(tmp_path):
    task = tmp_path / "Task01_BrainTumour"
    names = samples.write_multichannel_task(str(task), 6, size=32, slices=12,
                                            orientations=("RAS", "LPS"), spacing_ras=SPACING,
                                            test_cases=1)
    h5 = tmp_path / "brats.h5"
    said = distseg_data("convert", task, h5, "--size", 32, "--val-fraction", 0.34, "--no-progress")
    assert "4 channels: FLAIR (zscore), T1w (zscore), T1gd (zscore), T2w (zscore)" in said
    info = data.examine(str(h5))
    assert (info.channels, info.channel_names) == (4, ("FLAIR", "T1w", "T1gd", "T2w"))
    summary = json.loads(distseg_data("info", h5).replace("NaN", "null"))
    assert summary["channels"] == 4 and summary["channel_names"] == list(info.channel_names)
    run = str(tmp_path / "run")
    cfg = train_two_ranks("smoke", h5, run)
    assert cfg["model"]["in_channels"] == 4 and cfg["model"]["num_classes"] == 3
    run_record = next(r for r in records(run, 0) if r["type"] == "run")
    assert run_record["dataset"]["channels"] == 4
    # the unlabelled case of imagesTs, a 4-D image: the segmentation has its grid
    out = tmp_path / "pred"
    said = predict(run, out, task)
    assert "4 channels (FLAIR:" in said and "1 case(s) on 1 rank(s)" in said
    scan = nib.load(task / f"imagesTs/{names[-1]}.nii.gz")
    seg = nib.load(out / f"{names[-1]}_seg.nii.gz")
    assert scan.shape == (32, 32, 12, 4) and seg.shape == scan.shape[:3]
    assert seg.get_data_dtype() == np.uint8
    np.testing.assert_array_equal(seg.affine, scan.affine)
    assert set(np.unique(np.asarray(seg.dataobj))) <= {0, 1, 2}


def test_an_nnunet_dataset_trains_3d_on_2_ranks_and_predicts_from_its_channel_files(tmp_path):
    root = tmp_path / "Dataset005_Prostate"
    names = samples.write_multichannel_task(str(root), 5, kind="nnunet", channels=("T2", "ADC"),
                                            size=32, slices=16, orientations=("LPS", "RAS"),
                                            spacing_ras=SPACING, test_cases=1)
    h5 = tmp_path / "prostate.h5"
    said = distseg_data("convert", root, h5, "--ndim", 3, "--val-fraction", 0.2, "--no-progress")
    assert "2 channels: T2 (zscore), ADC (zscore)" in said
    info = volumes.examine(str(h5))
    assert (info.channels, info.class_names) == (2, ("background", "tumor"))
    run = str(tmp_path / "run3d")
    cfg = train_two_ranks("smoke3d", h5, run, "--slab", "8,16,16", "--batch-size", "2")
    assert cfg["model"]["in_channels"] == 2 and cfg["model"]["spatial_dims"] == 3
    # the first channel's file of the unlabelled case: CASE_0001 is read beside it
    first = root / f"imagesTs/{names[-1]}_0000.nii.gz"
    out = tmp_path / "pred3d"
    predict(run, out, first)
    seg = nib.load(out / f"{names[-1]}_seg.nii.gz")
    image = nib.load(first)
    assert seg.shape == image.shape == (32, 32, 16)
    np.testing.assert_array_equal(seg.affine, image.affine)
    assert set(np.unique(np.asarray(seg.dataobj))) <= {0, 1}
    assert sorted(os.listdir(out)) == [f"{names[-1]}_seg.nii.gz"]
