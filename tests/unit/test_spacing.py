"""One spacing: resampling to a target voxel spacing and back (``convert.spacing``),
the ``auto`` choice (nnU-Net's rule), ``convert --spacing`` in both layouts, predict
back onto the scan's grid, bad values, and the phantom drawn in mm at any spacing.

Every volume is generated here: label volumes drawn in mm, and phantom NIfTI folders
written by ``samples.write_phantoms`` (``distseg-data synth --spacing``).
"""

import dataclasses
import json

import h5py
import nibabel as nib
import numpy as np
import pytest
from click.testing import CliRunner
from scipy import ndimage

from distseg import metrics, sliding
from distseg.cli.data import data as data_cli
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import h5format, synth
from distseg.data.convert import geometry, pipeline, samples, sources
from distseg.data.convert import spacing as sp
from distseg.inference import predict
from distseg.inference import scans as scans_lib

#: Spacings (z, y, x mm) of the phantom cases of one folder: thin, mid, thick slices.
SPACINGS = ((2.0, 0.8, 0.8), (3.0, 1.0, 1.0), (5.0, 0.7, 0.7))
EXTENT = (60.0, 100.0, 100.0)
TARGET = (2.0, 1.0, 1.0)


def cli(*args):
    return CliRunner().invoke(data_cli, [*map(str, args)], catch_exceptions=False)


def convert(*args):
    return cli("convert", *args, "--no-progress")


def bad_value(out, *words):
    """A click option refused the value: exit 2 and one ``Error:`` line naming it."""
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, out.output
    for w in words:
        assert w in lines[0], (w, lines[0])


def organ(spacing, extent, liver, tumour_mm, centre=(0.0, 0.0, 0.0)):
    """A label volume drawn in mm: a liver ellipsoid of semi-axes ``liver`` (1) with a
    spherical tumour (2), sampled at ``spacing`` over ``extent`` (z, y, x mm)."""
    n = [max(1, round(e / s)) for e, s in zip(extent, spacing)]
    z, y, x = ((np.arange(k) + 0.5 - k / 2) * s for k, s in zip(n, spacing))
    z, y, x = z[:, None, None], y[None, :, None], x[None, None, :]
    labels = np.zeros(n, np.uint8)
    labels[(z / liver[0]) ** 2 + (y / liver[1]) ** 2 + (x / liver[2]) ** 2 <= 1] = 1
    cz, cy, cx = centre
    labels[(z - cz) ** 2 + (y - cy) ** 2 + (x - cx) ** 2 <= tumour_mm ** 2] = 2
    return labels


def phantom_labels(seed, spacing, extent=(42.0, 84.0, 84.0)):
    return synth.phantom_mm(np.random.default_rng([seed, 0, 0]), spacing, extent)[1]


# ------------------------------------------------------------ the resampling


@pytest.mark.parametrize("there", [(1.0, 0.5, 0.5), (1.5, 1 / 3, 0.25), (0.7, 0.7, 0.7)])
def test_upsampled_labels_come_back_exactly(there):
    # integer ratios (3 -> 1, 1 -> 0.5 ...) and an odd one (1.0 -> 0.7): each voxel's
    # centre lies in one finer voxel that took its label
    here = (3.0, 1.0, 1.0)
    labels = phantom_labels(4, here, (36.0, 48.0, 40.0))
    assert labels.shape == (12, 48, 40) and set(np.unique(labels)) == {0, 1, 2}
    up = sp.to_spacing(labels, here, there, order=0)
    assert up.dtype == np.uint8 and set(np.unique(up)) == {0, 1, 2}
    np.testing.assert_array_equal(sp.resample_volume(up, labels.shape, 0), labels)


@pytest.mark.parametrize("orientation", ["LPS", "PIR"])
def test_geometry_with_a_target_goes_forward_and_back_exactly(orientation):
    _, labels = samples.case_arrays(3, 24, 10, orientation)
    affine = samples.affine_for(orientation, (0.9, 0.9, 3.0))
    geom = geometry.Geometry.of(affine, labels.shape, target=(1.5, 0.45, 0.45))
    assert geom.grid == (20, 48, 48) and geom.offset == (0, 0)
    np.testing.assert_allclose(geom.resampled_spacing, (1.5, 0.45, 0.45))
    stored = geometry.forward(labels, geom, order=0)
    assert stored.shape == (20, 48, 48)
    np.testing.assert_array_equal(geometry.inverse(stored, geom), labels)
    # 2D: padded to 64 (offset -8) and back, and one-hot probabilities through predict's path
    padded = dataclasses.replace(geom, size=64)
    assert padded.offset == (-8, -8)
    stored = geometry.forward(labels, padded, order=0)
    assert stored.shape == (20, 64, 64) and not stored[:, :8].any()
    np.testing.assert_array_equal(geometry.inverse(stored, padded), labels)
    probs = np.eye(3, dtype=np.float32)[stored]
    np.testing.assert_array_equal(geometry.labels_on_scan(probs, padded), labels)


def test_odd_ratio_round_trip_keeps_organ_sized_classes_above_0_99():
    # 0.7 -> 1.0 -> 0.7 mm: nearest moves a boundary by under one 1.0 mm voxel, so
    # Dice = 1 - ~1.5 * 0.25 mm / radius: above 0.99 from a radius of ~40 mm (a liver,
    # a large tumour). Measured 2026-11-27: liver 0.991, tumour 0.990.
    labels = organ((0.7,) * 3, (146.0, 126.0, 166.0), (70.0, 60.0, 80.0), 40.0, (5.0, -5.0, 10.0))
    down = sp.to_spacing(labels, (0.7,) * 3, (1.0,) * 3, order=0)
    assert down.shape == (146, 126, 166)
    back = sp.resample_volume(down, labels.shape, 0)
    for c in (1, 2):
        assert metrics.dice(labels == c, back == c) >= 0.99, c


def test_odd_ratio_round_trip_changes_labels_only_next_to_a_boundary():
    # the phantom's small lesions (radius 2-5 mm here) lose more Dice, but every voxel
    # that changed has a voxel of its old class and of its new one within 1.4 mm
    labels = phantom_labels(0, (0.7,) * 3)
    back = sp.resample_volume(sp.to_spacing(labels, (0.7,) * 3, (1.0,) * 3, 0), labels.shape, 0)
    changed = back != labels
    assert 0 < changed.mean() < 0.02
    ball = ndimage.generate_binary_structure(3, 3)
    for c in (0, 1, 2):
        near = ndimage.binary_dilation(labels == c, ball, iterations=2)
        assert near[changed & (back == c)].all(), c  # a new class c came from next door
    assert metrics.dice(labels == 1, back == 1) > 0.95


def test_images_are_interpolated_linearly_and_blockwise():
    ramp = np.broadcast_to(np.arange(40, dtype=np.float32)[:, None, None], (40, 6, 5)).copy()
    out = sp.resample_volume(ramp, (80, 12, 10), 1)
    assert out.dtype == np.float32 and out.shape == (80, 12, 10)
    # inside the field of view a linear ramp stays one: output u samples (u + 0.5) / 2 - 0.5
    np.testing.assert_allclose(out[1:-1, 0, 0], (np.arange(1, 79) + 0.5) / 2 - 0.5, atol=1e-5)
    # in blocks of 32 output slices, fetching only what each block needs, as whole
    fetched = []

    def get(lo, hi):
        fetched.append((lo, hi))
        return ramp[lo:hi]
    blocks = list(sp.resample_blocks(get, 40, (80, 12, 10), 1))
    assert [s for s, _ in blocks] == [0, 32, 64] and max(hi - lo for lo, hi in fetched) <= 18  # 16 and a neighbour each side
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), out)


# ------------------------------------------------------------ auto


def test_auto_is_the_median_spacing():
    spacings = [(2.0, 0.8, 0.8), (2.5, 0.7, 0.7), (1.5, 0.9, 0.9), (2.0, 0.6, 0.6)]
    shapes = [(200, 512, 512)] * 4
    assert sp.target_spacing(spacings, shapes) == (2.0, 0.75, 0.75)


def test_auto_takes_the_10th_percentile_of_thick_slices():
    # LiTS-like: in-plane ~0.75 mm, slices 0.7 to 5 mm, median 4: more than 3 x 0.75,
    # and few slices (median 60, x 3 < 512): the slice axis takes its 10th percentile
    z = [0.7, 1.0, 2.5, 4.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    spacings = [(s, 0.75, 0.75) for s in z]
    shapes = [(60, 512, 512)] * len(z)
    target = sp.target_spacing(spacings, shapes)
    assert target[1:] == (0.75, 0.75)
    assert target[0] == pytest.approx(np.percentile(z, 10)) and target[0] < np.median(z)
    # ... but never finer than the in-plane spacing (nnU-Net's floor)
    thin = sp.target_spacing([(0.5, 0.75, 0.75)] * 2 + [(5.0, 0.75, 0.75)] * 7, shapes[:9])
    assert thin[0] == pytest.approx(0.75, abs=2e-5)
    # not anisotropic enough (3 x 0.75 = 2.25 >= median 2.0): the median stays
    assert sp.target_spacing([(2.0, 0.75, 0.75), (0.7, 0.75, 0.75), (5.0, 0.75, 0.75)],
                             [(60, 512, 512)] * 3)[0] == 2.0
    # as many slices as pixels across (no anisotropy in voxels): the median stays
    assert sp.target_spacing(spacings, [(512, 512, 512)] * len(z))[0] == 4.0


# ------------------------------------------------------------ convert


@pytest.fixture(scope="module")
def phantoms(tmp_path_factory):
    """A folder of 3 LiTS-style phantom pairs, one body each, at ``SPACINGS``."""
    root = tmp_path_factory.mktemp("spacings") / "ph"
    out = cli("synth", "--out", root, "--cases", 3, "--extent", ",".join(map(str, EXTENT)),
              *[a for s in SPACINGS for a in ("--spacing", ",".join(map(str, s)))])
    assert out.exit_code == 0, out.output
    assert "3 phantom(s)" in out.output and "5,0.7,0.7" in out.output
    return root


def test_convert_3d_resamples_every_case_to_the_target_and_records_it(phantoms, tmp_path):
    h5 = tmp_path / "v.h5"
    out = convert(phantoms, h5, "--ndim", 3, "--spacing", "2,1,1", "--val-fraction", 0)
    assert out.exit_code == 0, out.output
    assert "every case resampled to 2,1,1 mm (Z,Y,X; as given)" in out.output
    with h5py.File(h5) as f:
        np.testing.assert_array_equal(f.attrs["target_spacing"], TARGET)
        np.testing.assert_allclose(f["cases/spacing"][:], SPACINGS, rtol=1e-6)  # the sources'
        assert f["cases/grid"][:].tolist() == [[30, 100, 100]] * 3
        assert f["cases/offset"][:].tolist() == [[0, 0]] * 3
        assert [f[f"volumes/{k}/image"].shape for k in range(3)] == [(30, 100, 100)] * 3
        np.testing.assert_allclose(f["spacing"][:], [TARGET] * 3, rtol=2e-3)  # 143 x 0.7 = 100.1
        assert json.loads(f.attrs["preprocessing"])["target_spacing"] == list(TARGET)
    assert h5format.target_spacing_of(str(h5), {"target_spacing": np.array(TARGET)}) == TARGET


def test_convert_2d_resamples_then_crops_or_pads_to_size(phantoms, tmp_path):
    h5 = tmp_path / "s.h5"
    assert convert(phantoms, h5, "--spacing", "2,1,1", "--size", 96, "--val-fraction", 0).exit_code == 0
    with h5py.File(h5) as f:
        assert f["images"].shape == (90, 96, 96, 1) and f["cases/slices"][:].tolist() == [30] * 3
        assert f["cases/offset"][:].tolist() == [[2, 2]] * 3  # 100 -> 96: 2 cut each side
        assert json.loads(f.attrs["preprocessing"])["size"] == 96
    # auto, without --size: the median (anisotropic z: its 10th percentile, 2.2 mm) and
    # the largest slice (125 at 0.8 mm) rounded up to 128, padded, nothing cut
    h5 = tmp_path / "auto.h5"
    out = convert(phantoms, h5, "--spacing", "auto", "--val-fraction", 0)
    assert out.exit_code == 0, out.output
    assert "resampled to 2.2,0.8,0.8 mm" in out.output and "10th percentile" in out.output
    assert "128x128" in out.output
    with h5py.File(h5) as f:
        np.testing.assert_allclose(f.attrs["target_spacing"], (2.2, 0.8, 0.8))
        assert f["images"].shape[1:] == (128, 128, 1) and f["cases/grid"][0].tolist() == [27, 125, 125]
        assert f["cases/offset"][0].tolist() == [-2, -2]


def test_without_spacing_files_are_as_before(phantoms, tmp_path):
    h5 = tmp_path / "plain.h5"
    assert convert(phantoms, h5, "--size", 64, "--val-fraction", 0).exit_code == 0
    with h5py.File(h5) as f:
        assert "target_spacing" not in f.attrs and "grid" not in f["cases"]
        assert "target_spacing" not in json.loads(f.attrs["preprocessing"])
        assert f["images"].shape == (30 + 20 + 12, 64, 64, 1)  # each case's own slices


def test_bad_spacing_values_are_one_line(phantoms, tmp_path):
    for value in ("0,1,1", "a,b", "1,2", "nan,1,1", "-1,1,1"):
        bad_value(convert(phantoms, tmp_path / "x.h5", "--spacing", value),
                  "'--spacing'", repr(value), "expected auto or Z,Y,X")
    bad_value(cli("synth", "--out", tmp_path / "p", "--spacing", "1,2"), "'--spacing'", "expected Z,Y,X")
    bad_value(cli("synth", "--out", tmp_path / "p", "--spacing", "1,1,1", "--extent", "0,9,9"),
              "'--extent'", "field of view")
    assert not (tmp_path / "x.h5").exists()
    with pytest.raises(InputError, match=r"^--spacing '1,2': expected auto or Z,Y,X"):
        pipeline.settled(pipeline.Options(spacing="1,2"))
    with pytest.raises(h5format.DatasetError, match="attribute target_spacing.*three positive"):
        h5format.target_spacing_of("f.h5", {"target_spacing": np.array([1.0, 0.0])})


# ------------------------------------------------------------ predict


def _config(h5, dims, size):
    cfg = config_lib.smoke()
    model = dataclasses.replace(cfg.model, spatial_dims=dims, image_size=size, num_classes=3)
    return dataclasses.replace(cfg, model=model, data=dataclasses.replace(cfg.data, path=str(h5)))


def _scan(root, k):
    return scans_lib.Scan(f"volume-{k}", f"{root}/volume-{k}.nii.gz", f"{root}/segmentation-{k}.nii.gz")


def _predicted(scan, prep, net, out_dir):
    opts = predict.Options(run_dir="RUN", inputs=(scan.image,), out=str(out_dir))
    result = predict.predict_scan(scan, prep, net, opts, 3)
    seg, image = nib.load(result.output), nib.load(scan.image)
    assert seg.shape == image.shape and seg.get_data_dtype() == np.uint8
    np.testing.assert_array_equal(seg.affine, image.affine)
    truth = sources.label_array(nib.load(scan.label), scan.label)
    return np.asarray(seg.dataobj), truth, result


def test_predict_2d_resamples_to_the_files_spacing_and_back_to_the_scan(phantoms, tmp_path):
    h5 = tmp_path / "s.h5"
    assert convert(phantoms, h5, "--spacing", "2,1,1", "--size", 96, "--val-fraction", 0).exit_code == 0
    known = predict.training_data(_config(h5, 2, 96), predict.Options("RUN", (), str(tmp_path)))
    assert known.prep.spacing == TARGET and known.prep.size == 96
    assert "resampled to 2,1,1 mm (Z,Y,X), 96x96 slices" in known.prep.describe()
    with h5py.File(h5) as f:
        images, masks = f["images"][:], f["masks"][:]
    for k in range(3):
        seen = []

        def oracle(x, k=k):  # the converted labels of case k, slice after slice
            start = 30 * k + sum(len(s) for s in seen)
            seen.append(x.copy())
            return np.eye(3, dtype=np.float32)[masks[start:start + len(x)]]
        seg, truth, _ = _predicted(_scan(phantoms, k), known.prep,
                                   predict.Network(sliding.slicewise(oracle), (1, 96, 96), 7), tmp_path)
        # the network saw exactly the slices convert wrote
        np.testing.assert_array_equal(np.concatenate(seen), images[30 * k:30 * k + 30])
        if k == 1:  # 3,1,1 -> 2,1,1 only upsamples: the labels come back exactly
            np.testing.assert_array_equal(seg, truth)
        assert metrics.dice(truth == 1, seg == 1) > 0.95, k


def test_predict_3d_resamples_to_the_files_spacing_and_back_to_the_scan(phantoms, tmp_path):
    h5 = tmp_path / "v.h5"
    assert convert(phantoms, h5, "--ndim", 3, "--spacing", "2,1,1", "--val-fraction", 0).exit_code == 0
    known = predict.training_data(_config(h5, 3, 32), predict.Options("RUN", (), str(tmp_path)))
    assert known.prep.spacing == TARGET and known.prep.size == 0
    for k in (1, 2):
        with h5py.File(h5) as f:
            mask = f[f"volumes/{k}/mask"][:]
        net = predict.Network(lambda x, m=mask: np.eye(3, dtype=np.float32)[m][None].repeat(len(x), 0),
                              (30, 100, 100), 1)
        seg, truth, result = _predicted(_scan(phantoms, k), known.prep, net, tmp_path)
        if k == 1:
            np.testing.assert_array_equal(seg, truth)
        assert result.scores[0].dice > 0.95, k  # liver, scored on the scan's own grid


# ------------------------------------------------------------ the phantom in mm


def test_one_phantom_at_two_spacings_converts_to_agreeing_labels(tmp_path):
    extent = "60,160,160"
    for name, spacing in (("fine", "2,0.8,0.8"), ("coarse", "3,1,1")):
        out = cli("synth", "--out", tmp_path / name, "--cases", 1, "--seed", 5,
                  "--spacing", spacing, "--extent", extent)
        assert out.exit_code == 0, out.output
        assert convert(tmp_path / name, tmp_path / f"{name}.h5", "--ndim", 3, "--spacing", "2,1,1",
                       "--val-fraction", 0).exit_code == 0
    assert nib.load(tmp_path / "fine/volume-0.nii.gz").shape != nib.load(tmp_path / "coarse/volume-0.nii.gz").shape
    with h5py.File(tmp_path / "fine.h5") as a, h5py.File(tmp_path / "coarse.h5") as b:
        fine, coarse = a["volumes/0/mask"][:], b["volumes/0/mask"][:]
    assert fine.shape == coarse.shape == (30, 160, 160)
    # measured 2026-11-27: liver 0.94, lesion 0.92 (a few hundred voxels), foreground 0.95
    assert metrics.dice(fine > 0, coarse > 0) >= 0.9
    assert metrics.dice(fine == 1, coarse == 1) >= 0.9
    assert metrics.dice(fine == 2, coarse == 2) >= 0.8


def test_random_spacings_are_lits_like_and_seeded(tmp_path):
    used = samples.write_phantoms(str(tmp_path / "a"), 4, "random", extent=(20.0, 30.0, 30.0), seed=2)
    again = samples.write_phantoms(str(tmp_path / "b"), 4, "random", extent=(20.0, 30.0, 30.0), seed=2)
    assert used == again and len(set(used)) == 4
    assert all(1.0 <= z <= 5.0 and 0.6 <= y == x <= 1.0 for z, y, x in used)
    img = nib.load(tmp_path / "a/volume-0.nii.gz")
    np.testing.assert_allclose(geometry.voxel_sizes(img.affine), used[0][::-1], rtol=1e-6)
    # the HDF5 options are refused with --spacing, --extent without it
    out = cli("synth", "--out", tmp_path / "c", "--spacing", "random", "--size", 64)
    assert out.exit_code == 2 and "--size: not with --spacing" in out.output
    out = cli("synth", "--out", tmp_path / "d.h5", "--extent", "10,10,10")
    assert out.exit_code == 2 and "--extent: only with --spacing" in out.output
