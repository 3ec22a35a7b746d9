"""``distseg-data convert``: MSD and LiTS-style folders in, distseg HDF5 out.

Folders are built with nibabel (and pynrrd) from phantoms of known content, on flipped
and permuted orientations and anisotropic spacing, so every number the converter
writes can be checked against the arrays it started from.
"""

import gzip
import json
import os
import re
import shutil
import signal

import h5py
import nibabel as nib
import numpy as np
import pytest
from click.testing import CliRunner

from distseg.cli.data import data as data_cli
from distseg.core.config import LIVER_CLASSES
from distseg.data import h5format, lits, synth, volumes
from distseg.data import slices as data
from distseg.data.convert import geometry, samples, splits
from distseg.data.convert.pipeline import peak_rss_mib

from proc_group import run_group
from support import BIN, background, command_env, finish, one_line_error, wait_for

SPACING = (0.7, 0.9, 3.0)  # x, y, z in mm: anisotropic in-plane and across slices


def convert(*args):
    return CliRunner().invoke(data_cli, ["convert", *map(str, args), "--no-progress"],
                              catch_exceptions=False)


def expected_slices(seed, size, slices, low=-150.0, high=250.0):
    """The phantom in distseg's slice layout, as ``samples`` writes it (HU rounded to int16)."""
    hu, labels = synth.phantom_case(np.random.default_rng(seed), size, slices)
    return h5format.window(np.round(hu), low, high), labels


@pytest.fixture(scope="module")
def same_case(tmp_path_factory):
    """One phantom (seed 7) written as 4 LiTS-style pairs, each in another orientation."""
    root = tmp_path_factory.mktemp("orient")
    for k, orientation in enumerate(("RAS", "LPS", "PIR", "ILA")):
        hu, labels = samples.case_arrays(7, 20, 10, orientation)
        affine = samples.affine_for(orientation, SPACING)
        samples.save_volume(str(root / f"volume-{k}.nii"), hu, affine)
        samples.save_volume(str(root / f"segmentation-{k}.nii"), labels, affine)
    return root


def test_every_orientation_gives_the_same_slices_and_records_its_geometry(same_case, tmp_path):
    out = tmp_path / "o.h5"
    res = convert(same_case, out, "--size", 20, "--val-fraction", 0)
    assert res.exit_code == 0, res.output
    images, masks = expected_slices(7, 20, 10)
    with h5py.File(out) as f:
        assert f["images"].shape == (40, 20, 20, 1) and f["images"].dtype == np.float32
        assert f["masks"].dtype == np.uint8
        assert f["case_id"][:].tolist() == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10
        for k, orientation in enumerate(("RAS", "LPS", "PIR", "ILA")):
            rows = slice(10 * k, 10 * k + 10)
            # size == in-plane size: no resampling, so the exact phantom comes back
            np.testing.assert_array_equal(f["images"][rows][..., 0], images)
            np.testing.assert_array_equal(f["masks"][rows], masks)
            np.testing.assert_allclose(f["cases/affine"][k], samples.affine_for(orientation, SPACING),
                                       atol=1e-5)  # NIfTI keeps it in float32
            np.testing.assert_allclose(f["cases/spacing"][k], SPACING[::-1])
        assert [n.decode() for n in f["cases/name"][:]] == [f"volume-{k}" for k in range(4)]
        assert f["cases/shape"][2].tolist() == [20, 10, 20]  # PIR: y, z, x
        # the liver sits on the patient's right: the image's left half
        liver_cols = np.argwhere(f["masks"][:] == 1)[:, 2]
        assert liver_cols.mean() < 10
        pre = json.loads(f.attrs["preprocessing"])
        assert pre["orientation"] == "RAS" and pre["window"] == [-150.0, 250.0] and pre["size"] == 20
    info = data.examine(str(out))  # the training's own reader accepts it
    data.check_fit(info, ranks=2, batch_size=4, image_size=32, resize=True, num_classes=3)
    with data.SliceReader(str(out), image_size=32, resize=True) as reader:
        imgs, msks = reader.read([0, 39, 5])
    assert imgs.shape == (3, 32, 32, 1) and msks.shape == (3, 32, 32)


def test_volumes_keep_each_case_on_its_own_grid(tmp_path):
    # --ndim 3: the same reorientation and window as slices, no resampling, one volume
    # per case whatever its shape; the rows of cases/ still put it back on its scan.
    root = tmp_path / "pairs"
    root.mkdir()
    shapes = []
    for k, (orientation, (size, width, slices)) in enumerate(
            [("LPS", (20, 28, 10)), ("PIR", (24, 16, 7)), ("RAS", (20, 20, 12))]):
        hu, labels = samples.case_arrays(k, size, slices, orientation, width=width)
        affine = samples.affine_for(orientation, SPACING)
        samples.save_volume(str(root / f"volume-{k}.nii"), hu, affine)
        samples.save_volume(str(root / f"segmentation-{k}.nii"), labels, affine)
        shapes.append((slices, size, width))
    res = convert(root, tmp_path / "v.h5", "--ndim", 3, "--val-fraction", 0.34)
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"wrote {tmp_path / 'v.h5'}: 3 volumes (29 slices) (2 train, 1 val)")
    info = volumes.examine(str(tmp_path / "v.h5"))
    assert info.shapes.tolist() == [list(s) for s in shapes]
    np.testing.assert_allclose(info.spacing, [SPACING[::-1]] * 3, rtol=1e-6)
    with volumes.SlabReader(str(tmp_path / "v.h5"), (8, 16, 16)) as reader, \
            h5py.File(tmp_path / "v.h5", "r", locking=False) as f:
        for k, orientation in enumerate(("LPS", "PIR", "RAS")):
            image, mask = reader.read_case(k)
            hu, labels = samples.case_arrays(k, shapes[k][1], shapes[k][0], orientation,
                                             width=shapes[k][2])
            geom = geometry.Geometry.of(f["cases/affine"][k], f["cases/shape"][k])
            np.testing.assert_array_equal(mask, geometry.to_slices(labels, geom.ornt))
            np.testing.assert_array_equal(image[..., 0], h5format.window(geometry.to_slices(hu, geom.ornt)))
            np.testing.assert_array_equal(geometry.inverse(mask, geom), labels)  # back exactly
        assert "first" not in f["cases"] and f["volumes/0/image"].compression == "lzf"
        assert json.loads(f.attrs["preprocessing"])["ndim"] == 3
    one_line_error(convert(root, tmp_path / "x.h5", "--ndim", 3, "--size", 64),
                   "--size 64", "--ndim 3")
    with pytest.raises(h5format.DatasetError, match="holds 3D volumes"):
        data.examine(str(tmp_path / "v.h5"))


@pytest.mark.parametrize("orientation", ["RAS", "LPS", "PIR", "ILA", "SAL"])
@pytest.mark.parametrize("size", [24, 40, 48])
def test_inverse_geometry_gives_the_labels_back_exactly(orientation, size):
    # Upsampling in-plane (size >= 24) with nearest, then back: exact.
    _, labels = samples.case_arrays(3, 24, 9, orientation)
    affine = samples.affine_for(orientation, SPACING)
    geom = geometry.Geometry.of(affine, labels.shape, size=size)
    slices = geometry.forward(labels, geom, order=0)
    assert slices.shape == (9, size, size)
    back = geometry.inverse(slices, geom, order=0)
    assert back.shape == labels.shape and back.flags.c_contiguous
    np.testing.assert_array_equal(back, labels)
    # The slices are those of nibabel's closest canonical image.
    canonical = np.asarray(nib.as_closest_canonical(nib.Nifti1Image(labels, affine)).dataobj)
    np.testing.assert_array_equal(geometry.to_slices(labels, geom.ornt),
                                  np.swapaxes(canonical, 0, 2)[:, ::-1, ::-1])


def test_inverse_after_a_crop_and_a_downsampling():
    _, labels = samples.case_arrays(4, 48, 20, "LPS")
    affine = samples.affine_for("LPS", SPACING)
    geom = geometry.Geometry.of(affine, labels.shape, size=16)
    z0, z1 = geometry.roi_range(geometry.to_slices(labels, geom.ornt), margin=1)
    assert 0 < z0 or z1 < 20
    geom = geometry.Geometry.of(affine, labels.shape, z0, z1, size=16)
    back = geometry.inverse(geometry.forward(labels, geom, 0), geom, 0)
    assert back.shape == labels.shape
    liver = labels > 0
    dice = 2 * (liver & (back > 0)).sum() / (liver.sum() + (back > 0).sum())
    assert dice > 0.85, dice  # 48 -> 16 -> 48 loses detail, never place


def test_window_flag_and_mr_normalisation(tmp_path):
    root = tmp_path / "w"
    affine = samples.affine_for("RAS", (1, 1, 1))
    hu = np.full((8, 8, 4), -1000, np.int16)
    hu[:, :, 1], hu[:, :, 2], hu[:, :, 3] = -100, 150, 400
    labels = np.zeros(hu.shape, np.uint8)
    labels[2:6, 2:6, :] = 1
    root.mkdir()
    samples.save_volume(str(root / "volume-1.nii"), hu, affine)
    samples.save_volume(str(root / "segmentation-1.nii"), labels, affine)
    assert convert(root, tmp_path / "ct.h5", "--size", 8, "--window", "-100,400").exit_code == 0
    with h5py.File(tmp_path / "ct.h5") as f:
        assert [float(f["images"][z].mean()) for z in range(4)] == [0.0, 0.0, 0.5, 1.0]
        assert f.attrs["hu_window"].tolist() == [-100.0, 400.0]
        assert f["cases/bounds"][0].tolist() == [-100.0, 400.0]
    assert convert(root, tmp_path / "mr.h5", "--size", 8, "--modality", "mr").exit_code == 0
    with h5py.File(tmp_path / "mr.h5") as f:
        img = f["images"][:]
        assert img.min() == 0.0 and img.max() == 1.0
        assert json.loads(f.attrs["preprocessing"])["intensity"] == "percentile"
        assert np.isnan(f.attrs["hu_window"]).all()
    # Stored integers with a scale factor (nibabel chooses one for float data kept as
    # int16) are scaled before the window, a block of slices at a time.
    scaled = nib.Nifti1Image(hu.astype(np.float32) * 0.9 + 0.25, affine)
    scaled.set_data_dtype(np.int16)
    nib.save(scaled, root / "volume-1.nii")
    assert nib.load(root / "volume-1.nii").dataobj.slope != 1.0
    assert convert(root, tmp_path / "scaled.h5", "--size", 8).exit_code == 0
    with h5py.File(tmp_path / "scaled.h5") as f:
        expected = h5format.window(nib.load(root / "volume-1.nii").get_fdata()).transpose(2, 1, 0)
        np.testing.assert_allclose(f["images"][..., 0], expected[:, ::-1, ::-1], atol=1e-6)
    one_line_error(convert(root, tmp_path / "x.h5", "--modality", "mr", "--window", "0,1"),
                   "--window", "MR")
    bad = CliRunner().invoke(data_cli, ["convert", str(root), "x.h5", "--window", "400,-100"])
    assert bad.exit_code == 2 and "HIGH must be above LOW" in bad.output


@pytest.fixture(scope="module")
def msd(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("msd") / "Task03_Liver")
    samples.write_task(root, 6, size=24, slices=12, orientations=("RAS", "LPS", "PIR"),
                       spacing_ras=SPACING, test_cases=2)
    return root


def _splits_of(path):
    with h5py.File(path) as f:
        return {n.decode(): int(s) for n, s in zip(f["cases/name"][:], f["cases/split"][:])}, \
            json.loads(f.attrs["splitting"])


def test_msd_task_split_by_case_seeded_and_recorded(msd, tmp_path):
    a, b, c = (tmp_path / n for n in ("a.h5", "b.h5", "c.h5"))
    assert convert(msd, a, "--size", 32, "--val-fraction", 0.34, "--seed", 3).exit_code == 0
    assert convert(msd, b, "--size", 32, "--val-fraction", 0.34, "--seed", 3).exit_code == 0
    split_a, how = _splits_of(a)
    assert split_a == _splits_of(b)[0]  # same seed, same split
    assert sorted(split_a) == [f"liver_{i}" for i in range(6)]  # imagesTs are not converted
    assert sum(v == h5format.SPLITS["val"] for v in split_a.values()) == 2
    assert how == {"by": "case", "seed": 3, "val_fraction": 0.34, "folds": 0, "fold": 0}
    info = data.examine(str(a))  # also checks each case sits in one split
    assert info.attrs["class_names"] == ["background", "liver", "cancer"]
    assert len(info.val_indices) == 24 and len(info.train_indices) == 48
    # k folds: each case validates in exactly one fold
    val_cases = []
    for k in range(3):
        out = tmp_path / f"f{k}.h5"
        assert convert(msd, out, "--size", 16, "--folds", 3, "--fold", k).exit_code == 0
        s, how = _splits_of(out)
        assert how["folds"] == 3 and how["fold"] == k
        val_cases += [n for n, v in s.items() if v == h5format.SPLITS["val"]]
    assert sorted(val_cases) == sorted(split_a)
    one_line_error(convert(msd, tmp_path / "x.h5", "--folds", 3, "--fold", 3), "--fold 3")


def test_splits_assign_shares_and_folds():
    split, fold = splits.assign(10, seed=0, val_fraction=0.2)
    assert (split == 1).sum() == 2 and (fold == -1).all()
    assert (splits.assign(1, 0, 0.5)[0] == 0).all()  # one case: it trains
    assert (splits.assign(3, 0, 0.01)[0] == 1).sum() == 1  # at least one validates
    split, fold = splits.assign(7, seed=1, folds=3, fold=2)
    assert sorted(np.bincount(fold).tolist()) == [2, 2, 3]
    assert ((split == 1) == (fold == 2)).all()


def test_roi_margin_keeps_the_labelled_slices(msd, tmp_path):
    out = tmp_path / "roi.h5"
    assert convert(msd, out, "--size", 24, "--roi-margin", 1).exit_code == 0
    with h5py.File(out) as f:
        assert sum(f["cases/slices"][:]) < 6 * 12
        for k in range(6):
            z0, z1 = f["cases/z_range"][k]
            first, n = f["cases/first"][k], f["cases/slices"][k]
            assert n == z1 - z0
            labelled = np.flatnonzero(f["masks"][first:first + n].reshape(n, -1).max(axis=1))
            # one background slice of margin on each side, unless the volume ends first
            assert labelled[0] == 1 or z0 == 0
            assert labelled[-1] == n - 2 or z1 == 12
            assert len(labelled) == labelled[-1] - labelled[0] + 1


def _bad_folder(root, problem):
    """A LiTS-style folder of 3 good cases plus volume-9 with ``problem``."""
    samples.write_task(root, 3, kind="pairs", size=16, slices=6, ext=".nii.gz")
    hu, labels = samples.case_arrays(9, 16, 6, "RAS")
    affine = samples.affine_for("RAS")
    img, seg = os.path.join(root, "volume-9.nii.gz"), os.path.join(root, "segmentation-9.nii.gz")
    samples.save_volume(img, hu, affine)
    if problem == "empty":
        labels[:] = 0
    if problem == "label 7":
        labels[labels == 2] = 7
    if problem == "shape":
        labels = labels[:, :, :-1]
    if problem == "affine":
        affine = samples.affine_for("RAS", origin=(-100.0, 20.0, 55.0))
    samples.save_volume(seg, labels, affine)
    if problem == "truncated":
        with open(img, "rb") as f:
            raw = gzip.decompress(f.read())
        with open(img, "wb") as f:
            f.write(gzip.compress(raw[:len(raw) // 2]))
    if problem == "not nifti":
        with open(img, "wb") as f:
            f.write(b"not a volume")
    return root


BAD = {
    "truncated": "voxel data cannot be read",
    "not nifti": "cannot be read as a volume",
    "shape": "has shape (16, 16, 6) but labels",
    "affine": "not on one grid (affines differ by up to 5 mm)",
    "label 7": "holds label 7, not declared (0 background, 1 liver, 2 lesion)",
    "empty": "holds no labelled voxel",
}


@pytest.mark.parametrize("problem", sorted(BAD))
def test_a_bad_case_stops_with_one_line_or_is_skipped(problem, tmp_path):
    root = _bad_folder(str(tmp_path / "src"), problem)
    out = tmp_path / "out.h5"
    out.write_bytes(b"an older file")
    res = convert(root, out, "--size", 16)
    one_line_error(res, "case volume-9:", BAD[problem])
    assert out.read_bytes() == b"an older file"  # untouched
    assert not os.path.exists(f"{out}.partial")
    res = convert(root, out, "--size", 16, "--on-error", "skip")
    assert res.exit_code == 0, res.output
    assert "skipped 1 case(s):" in res.stdout and BAD[problem] in res.stdout
    info = data.examine(str(out))
    assert info.samples == 18 and "volume-9" in info.attrs["skipped"][0]
    with h5py.File(out) as f:
        assert [n.decode() for n in f["cases/name"][:]] == ["volume-0", "volume-1", "volume-2"]


def test_source_problems_are_one_line(msd, tmp_path):
    one_line_error(convert(tmp_path / "nothing", tmp_path / "x.h5"), "no such folder")
    (tmp_path / "empty").mkdir()
    one_line_error(convert(tmp_path / "empty", tmp_path / "x.h5"), "neither an MSD task folder")
    task = tmp_path / "bad_json"
    shutil.copytree(msd, task)
    (task / "dataset.json").write_text('{"labels": {"0": "background", "2": "liver"}, "training": []}')
    one_line_error(convert(task, tmp_path / "x.h5"), "dataset.json", "0..K-1")
    (task / "dataset.json").write_text("{")
    one_line_error(convert(task, tmp_path / "x.h5"), "not an MSD dataset.json")
    assert not list(tmp_path.glob("x.h5*"))


def test_multichannel_msd_keeps_every_channel_or_the_one_picked(tmp_path):
    # Every channel by default (tests/unit/test_channels.py checks the numbers); with
    # --channel, that one alone, normalised as single-channel MR always was.
    root = tmp_path / "Task01"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    affine = samples.affine_for("LPS")
    for i in range(2):
        hu, labels = samples.case_arrays(i, 16, 6, "LPS")
        four = np.stack([hu, hu * 2 + 5], axis=-1).astype(np.float32)  # 2 "MR" channels
        nib.save(nib.Nifti1Image(four, affine), root / f"imagesTr/b_{i}.nii.gz")
        nib.save(nib.Nifti1Image(labels, affine), root / f"labelsTr/b_{i}.nii.gz")
    (root / "dataset.json").write_text(json.dumps({
        "modality": {"0": "FLAIR", "1": "T2w"}, "labels": {"0": "background", "1": "a", "2": "b"},
        "training": [{"image": f"./imagesTr/b_{i}.nii.gz", "label": f"./labelsTr/b_{i}.nii.gz"}
                     for i in range(2)]}))
    res = convert(root, tmp_path / "all.h5", "--size", 16)
    assert res.exit_code == 0, res.output
    assert "2 channels: FLAIR (zscore), T2w (zscore)" in res.output
    with h5py.File(tmp_path / "all.h5") as f:
        assert f["images"].shape == (12, 16, 16, 2)
    one_line_error(convert(root, tmp_path / "x.h5", "--channel", 2), "--channel 2", "channels 0..1")
    res = convert(root, tmp_path / "c1.h5", "--channel", 1, "--size", 16)
    assert res.exit_code == 0, res.output
    with h5py.File(tmp_path / "c1.h5") as f:
        pre = json.loads(f.attrs["preprocessing"])
        assert pre["channel"] == 1 and pre["modality"] == "MR"  # per-volume normalisation
        assert f["images"][:].max() == 1.0


def test_nrrd_pairs_convert_like_nifti(tmp_path):
    for ext in (".nii", ".nrrd"):
        samples.write_task(str(tmp_path / ext), 2, kind="pairs", size=16, slices=6, ext=ext,
                           orientations=("LPS", "PIR"), spacing_ras=SPACING)
        assert convert(tmp_path / ext, tmp_path / f"{ext}.h5", "--size", 16).exit_code == 0
    with h5py.File(tmp_path / ".nii.h5") as a, h5py.File(tmp_path / ".nrrd.h5") as b:
        np.testing.assert_array_equal(a["images"][:], b["images"][:])
        np.testing.assert_array_equal(a["masks"][:], b["masks"][:])
        np.testing.assert_allclose(a["cases/affine"][:], b["cases/affine"][:])


def test_lits_case_117_as_nifti_converts_to_the_lits_sample_slices(tmp_path):
    samples.write_lits117(str(tmp_path / "lits"), orientation="LPS")
    assert convert(tmp_path / "lits", tmp_path / "117.h5", "--size", 128).exit_code == 0
    lits.convert(str(tmp_path / "sample.h5"), ct_norm="window")  # convert's default
    with h5py.File(tmp_path / "117.h5") as a, h5py.File(tmp_path / "sample.h5") as b:
        assert a["images"].shape == b["images"].shape == (128, 128, 128, 1)
        np.testing.assert_array_equal(a["masks"][:], b["masks"][:])
        # HU rounded to int16 in the NIfTI: at most half a HU of 400 apart
        assert np.abs(a["images"][:] - b["images"][:]).max() <= 0.5 / 400 + 1e-6
        assert a["case_id"][0] == 117 and a.attrs["class_names"].tolist() == list(LIVER_CLASSES)


def _cli(*args, progress: bool = False):
    return [f"{BIN}/distseg-data", "convert", *map(str, args),
            "--progress" if progress else "--no-progress"]


def _cases_counted(progress) -> int:
    """The last case count that the progress bar wrote to the file ``progress``."""
    counts = re.findall(r"(\d+)/\d+ \[", progress.read_text(encoding="utf-8", errors="replace"))
    return int(counts[-1]) if counts else 0


def _peak(out: str) -> float:
    return float(out.split("peak RSS ")[1].split(" MiB")[0])


def test_memory_stays_at_one_volume_whatever_the_number_of_cases(tmp_path):
    # 128x128x64 volumes: 4 MB of float32 slices each; holding 24 would add ~120 MiB.
    few, many = str(tmp_path / "few"), str(tmp_path / "many")
    samples.write_task(many, 24, kind="pairs", size=128, slices=64, ext=".nii")
    os.makedirs(few)
    for k in range(4):
        for kind in ("volume", "segmentation"):
            os.link(f"{many}/{kind}-{k}.nii", f"{few}/{kind}-{k}.nii")
    peaks = {}
    for name, src in (("few", few), ("many", many)):
        res = run_group(_cli(src, tmp_path / f"{name}.h5", "--size", 128), timeout=120,
                        env=command_env())
        assert res.returncode == 0, res.stderr
        peaks[name] = _peak(res.stdout)
    assert data.examine(str(tmp_path / "many.h5")).samples == 24 * 64
    assert peaks["many"] < peaks["few"] + 25, peaks
    assert peak_rss_mib() > 0


def test_interrupted_conversion_leaves_no_complete_looking_file(tmp_path):
    src = str(tmp_path / "src")
    samples.write_task(src, 30, kind="pairs", size=96, slices=48, ext=".nii.gz")
    out = tmp_path / "out.h5"
    for sig, code in ((signal.SIGTERM, 130), (signal.SIGKILL, -9)):
        stderr = tmp_path / f"stderr-{sig.name}.txt"
        with open(stderr, "w") as progress, background(
                _cli(src, out, "--size", 96, progress=True), env=command_env(), stderr=progress) as proc:
            # Signalled in the middle: once the progress bar has counted a case (so the
            # partial file is open and the signal handler set), before it counts all 30.
            counted = wait_for(lambda: _cases_counted(stderr), 60, "a case on the progress bar",
                               poll=0.01, proc=proc)
            assert counted < 30, "the conversion finished before the signal"
            proc.send_signal(sig)
            finish(proc, 60)
        err = stderr.read_text(encoding="utf-8", errors="replace")
        assert proc.returncode == code, err
        assert not out.exists()
        if sig == signal.SIGTERM:
            assert "interrupted" in err and not os.path.exists(f"{out}.partial")
        else:  # no chance to clean up: the partial name still says so
            assert os.path.exists(f"{out}.partial")
            with pytest.raises(h5format.DatasetError):
                data.examine(str(out))
