"""A real run on a file converted with ``--spacing``: phantoms at random LiTS-like
spacings, converted to one spacing, a 1-epoch smoke run, then ``distseg-predict`` on a
scan at yet another spacing writes its segmentation on that scan's own grid.

The network's quality is not the point (one epoch); the grid is: the output has the
input's shape and affine, and predict says which spacing it resampled to.
"""

import nibabel as nib
import numpy as np
import pytest

from distseg.data.convert import samples

from proc_group import run_group
from support import BIN, command_env

TIMEOUT = 240
pytestmark = pytest.mark.timeout(2 * TIMEOUT)


def test_a_run_trained_at_one_spacing_predicts_on_the_scans_own_grid(tmp_path):
    train, test = str(tmp_path / "train"), str(tmp_path / "test")
    samples.write_phantoms(train, 6, "random", extent=(30.0, 32.0, 32.0), seed=1)
    samples.write_phantoms(test, 1, [(4.0, 0.9, 0.9)], extent=(30.0, 32.0, 32.0), seed=9)
    h5 = str(tmp_path / "one.h5")
    out = run_group([f"{BIN}/distseg-data", "convert", train, h5, "--spacing", "2,1,1", "--size", "32",
                     "--val-fraction", "0.34", "--no-progress"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr
    run = str(tmp_path / "run")
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke", "--data", h5, "--run-dir", run,
                     "--epochs", "1"], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    scan = f"{test}/volume-0.nii.gz"
    out = run_group([f"{BIN}/distseg-predict", "--checkpoint", run, scan, "--labels", test,
                     "--out", str(tmp_path / "pred"), "--no-progress", "--no-overlays"],
                    timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "resampled to 2,1,1 mm (Z,Y,X), 32x32 slices" in out.stdout
    seg, image = nib.load(tmp_path / "pred/volume-0_seg.nii.gz"), nib.load(scan)
    assert seg.shape == image.shape == (36, 36, 8)  # x, y, z of 0.9 x 0.9 x 4 mm (LPS)
    np.testing.assert_array_equal(seg.affine, image.affine)
    assert set(np.unique(np.asarray(seg.dataobj))) <= {0, 1, 2}
