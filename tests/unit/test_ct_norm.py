"""``--ct-norm foreground``: nnU-Net's CT normalisation, from the training cases'
foreground only, the same numbers for every case, recorded so predict repeats it; the
HU window stays convert's default, the foreground lits-sample's."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from distseg.cli.data import data as data_cli
from distseg.data import lits
from distseg.data.convert import samples
from distseg.data.convert.intensity import Intensity, foreground_voxels
from distseg.data.convert.sources import Voxels


def test_the_statistics_are_the_foreground_s_percentiles_mean_and_std():
    rng = np.random.default_rng(0)
    samples_ = rng.normal(100.0, 20.0, 50_000)
    norm = Intensity.ct_foreground(samples_)
    assert norm.low == pytest.approx(np.percentile(samples_, 0.5))
    assert norm.high == pytest.approx(np.percentile(samples_, 99.5))
    assert (norm.mean, norm.std) == pytest.approx((samples_.mean(), samples_.std()))
    hu = np.array([-1000.0, norm.low, norm.mean, norm.mean + norm.std, 3000.0], np.float32)
    voxels = Voxels(hu.copy())
    out = norm.normaliser(voxels, norm.bounds(voxels))(voxels.raw)
    expected = (np.clip(hu, norm.low, norm.high) - norm.mean) / norm.std
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert out[2] == pytest.approx(0.0, abs=1e-5) and out[3] == pytest.approx(1.0, abs=1e-5)
    assert Intensity.from_description(norm.describe()) == norm
    with pytest.raises(ValueError, match="no training case holds a foreground voxel"):
        Intensity.ct_foreground(np.zeros(0))


def test_foreground_voxels_are_drawn_from_the_labelled_ones_only():
    values = np.arange(100_000, dtype=np.float64)
    labels = (values % 2 == 1).astype(np.uint8)
    drawn = foreground_voxels(values, labels, seed=1, limit=1000)
    assert len(drawn) == 1000 and np.all(drawn % 2 == 1) and len(set(drawn)) == 1000
    np.testing.assert_array_equal(foreground_voxels(values, labels, seed=1, limit=1000), drawn)
    assert len(foreground_voxels(values[:10], labels[:10], seed=1)) == 5


def _pairs(root, liver_hu: list[int]):
    """One LiTS-style pair per entry: a liver block of that HU in -1000 HU air."""
    root.mkdir()
    affine = samples.affine_for("RAS", (1, 1, 1))
    for k, value in enumerate(liver_hu):
        hu = np.full((16, 16, 6), -1000, np.int16)
        labels = np.zeros(hu.shape, np.uint8)
        hu[4:12, 4:12, :] = value + np.arange(6, dtype=np.int16)  # a little spread
        labels[4:12, 4:12, :] = 1
        samples.save_volume(str(root / f"volume-{k}.nii"), hu, affine)
        samples.save_volume(str(root / f"segmentation-{k}.nii"), labels, affine)


def test_convert_takes_the_statistics_from_the_training_cases_and_records_them(tmp_path):
    _pairs(tmp_path / "src", [100, 100, 100, 500])
    out = tmp_path / "fg.h5"
    args = ["convert", str(tmp_path / "src"), str(out), "--size", "16", "--no-progress",
            "--val-fraction", "0.25", "--seed", "2", "--ct-norm", "foreground"]
    result = CliRunner().invoke(data_cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with h5py.File(out) as f:
        prep = json.loads(f.attrs["preprocessing"])
        names = [n.decode() for n in f["cases/name"][:]]
        val = [n for n, s in zip(names, f["cases/split"][:]) if s == 1]
    assert prep["intensity"] == "foreground"
    # Case 3 (500 HU) validates: the statistics are the training cases' (100-105 HU).
    assert val == ["volume-3"]
    assert 100 <= prep["clip"][0] <= prep["mean"] <= prep["clip"][1] <= 105
    assert prep["channels"][0]["intensity"] == "foreground"
    window = CliRunner().invoke(data_cli, args[:-2], catch_exceptions=False)
    assert window.exit_code == 0
    with h5py.File(out) as f:
        assert json.loads(f.attrs["preprocessing"])["intensity"] == "window"


def test_with_folds_the_statistics_cover_every_fold_s_cases(tmp_path):
    """One file serves every fold (docs/cross-validation.md): the statistics come from
    every case in a fold, as nnU-Net's fingerprint covers its whole training set."""
    _pairs(tmp_path / "src", [100, 100, 100, 500])
    out = tmp_path / "fg.h5"
    result = CliRunner().invoke(data_cli, [
        "convert", str(tmp_path / "src"), str(out), "--size", "16", "--no-progress",
        "--folds", "4", "--fold", "3", "--ct-norm", "foreground"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with h5py.File(out) as f:
        prep = json.loads(f.attrs["preprocessing"])
    assert 100 <= prep["clip"][0] < prep["mean"] < prep["clip"][1] and prep["clip"][1] >= 495


def test_lits_sample_normalises_by_its_training_slabs_foreground(tmp_path):
    out = str(tmp_path / "l.h5")
    result = CliRunner().invoke(data_cli, ["lits-sample", "--out", out, "--folds", "4", "--fold", "0"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output  # the default: --ct-norm foreground
    with h5py.File(out) as f:
        images, masks, split = f["images"][..., 0], f["masks"][:], f["split"][:]
        assert np.isnan(f.attrs["hu_window"]).all() and "foreground" in f.attrs["source"]
    fg = images[(split == 0)[:, None, None] & (masks > 0)]
    assert abs(float(fg.mean())) < 0.2 and 0.7 < float(fg.std()) < 1.1
    assert images.min() < -1.5  # air, clipped to the foreground's low percentile


@pytest.mark.parametrize("ndim,ct_norm", [(2, "foreground"), (3, "foreground"), (2, "window")])
def test_predict_repeats_a_lits_sample_files_normalisation(tmp_path, ndim, ct_norm):
    """A lits-sample file records its normalisation as ``preprocessing``, as convert's
    files do: predict reads it and maps the case's HU to exactly the file's values."""
    import dataclasses

    from distseg.core import config as config_lib
    from distseg.inference import predict

    out = str(tmp_path / "l.h5")
    (lits.convert_volumes if ndim == 3 else lits.convert)(out, fold=(4, 1), ct_norm=ct_norm)
    with h5py.File(out) as f:
        recorded = json.loads(f.attrs["preprocessing"])
        stored = f["volumes/0/image"][:] if ndim == 3 else f["images"][..., 0]
        first = int(f["case_id"][0]) % 100 * lits.SLAB if ndim == 3 else 0
    assert recorded["intensity"] == ct_norm and recorded["channels"][0]["name"] == "CT"
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, spatial_dims=ndim, image_size=128, num_classes=3),
        data=dataclasses.replace(cfg.data, path=out))
    known = predict.training_data(cfg, predict.Options("RUN", (), str(tmp_path)))
    intensity = known.prep.intensity
    assert intensity.kind == ("ct" if ct_norm == "window" else "ct_foreground")
    assert known.prep.where == f"attributes of {out}"
    hu, _ = lits.read_case()
    hu = hu[first:first + len(stored)]
    voxels = Voxels(hu)
    np.testing.assert_allclose(intensity.normaliser(voxels, intensity.bounds(voxels))(hu), stored,
                               rtol=0, atol=1e-6)
