"""Input channels: C-channel slice and volume files, MSD 4-D images and nnU-Net v2 raw
datasets converted with every channel, each normalised on its own, and predict reading
multi-channel cases of both layouts.

Every folder is written here with nibabel from phantoms whose channels are known
functions of the phantom's HU (``samples.channel_arrays``), so the numbers convert and
predict produce can be checked against the arrays they started from.
"""

import dataclasses
import json
import os
import shutil

import h5py
import nibabel as nib
import numpy as np
import pytest
from click.testing import CliRunner

from distseg import sliding
from distseg.cli.data import data as data_cli
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import h5format, synth, volumes
from distseg.data import slices as data
from distseg.data.convert import geometry, samples, sources
from distseg.data.convert.intensity import Intensity
from distseg.inference import predict, report
from distseg.inference import scans as scans_lib

from support import one_line_error

BRATS = ("FLAIR", "T1w", "T1gd", "T2w")
PROSTATE = ("T2", "ADC")
SPACING = (0.7, 0.9, 3.0)


def cli(*args):
    return CliRunner().invoke(data_cli, [*map(str, args)], catch_exceptions=False)


def convert(*args):
    return cli("convert", *args, "--no-progress")


def one_line(exc_info, *words):
    text = str(exc_info.value)
    assert "\n" not in text, text
    for w in words:
        assert w in text, (w, text)


def zscored(a: np.ndarray) -> np.ndarray:
    """A channel as convert z-scores it: the mean and standard deviation of its non-zero
    voxels, zeros kept at 0."""
    values = a[a != 0].astype(np.float64)
    mean, std = values.mean(), values.std()
    out = (a.astype(np.float32) - np.float32(mean)) / np.float32(std)
    return np.where(a == 0, np.float32(0), out).astype(np.float32)


# ---------------------------------------------------------------- the format


def test_slices_of_four_channels_round_trip(tmp_path):
    path = str(tmp_path / "c4.h5")
    rng = np.random.default_rng(0)
    images = rng.random((6, 8, 10, 4), dtype=np.float32)
    masks = rng.integers(0, 3, (6, 8, 10)).astype(np.uint8)
    data.write_dataset(path, images, masks, [0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1],
                       source="test", hu_window=(np.nan, np.nan), channel_names=BRATS)
    with h5py.File(path) as f:
        assert f["images"].chunks == (1, 8, 10, 4)
    info = data.examine(path)
    assert (info.channels, info.channel_names) == (4, BRATS)
    summary = info.summary()
    assert summary["channels"] == 4 and summary["channel_names"] == list(BRATS)
    with data.SliceReader(path) as reader:
        got, got_masks = reader.read([5, 0, 3])
    np.testing.assert_array_equal(got, images[[5, 0, 3]])
    np.testing.assert_array_equal(got_masks, masks[[5, 0, 3]])
    with data.SliceReader(path, image_size=16, resize=True) as reader:
        resized, _ = reader.read([1])
    assert resized.shape == (1, 16, 16, 4)
    # each channel resized on its own: channel c of the resize is the resize of channel c
    for c in range(4):
        np.testing.assert_allclose(resized[..., c],
                                   data.resize_bilinear(images[[1], ..., c:c + 1], 16)[..., 0], atol=1e-6)
    with pytest.raises(h5format.DatasetError, match="3 channel_names for images of 4 channel"):
        data.write_dataset(path, images, masks, [0] * 6, [0] * 6, source="t",
                           hu_window=(0, 1), channel_names=BRATS[:3])


def _cases4(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random(s + (4,), dtype=np.float32), rng.integers(0, 3, s).astype(np.uint8))
            for s in shapes]


def test_volumes_of_four_channels_round_trip(tmp_path):
    path = str(tmp_path / "v4.h5")
    shapes = [(20, 70, 30), (6, 12, 9), (17, 33, 65)]
    cases = _cases4(shapes)
    info = volumes.write_volumes(path, [c[0] for c in cases], [c[1] for c in cases], [3, 4, 5],
                                 [0, 0, 1], source="test", hu_window=(np.nan, np.nan),
                                 channel_names=BRATS)
    assert (info.channels, info.channel_names) == (4, BRATS)
    assert info.shapes.tolist() == [list(s) for s in shapes]
    assert info.summary((8, 16, 16))["channels"] == 4
    with h5py.File(path) as f:
        assert f["volumes/0/image"].shape == (20, 70, 30, 4)
        assert f["volumes/0/image"].chunks == (16, 64, 30, 4)  # channels last, in one chunk
        assert f["volumes/1/image"].chunks == (6, 12, 9, 4)
        assert f["volumes/0/mask"].chunks == (16, 64, 30)
    with volumes.SlabReader(path, (8, 16, 16)) as reader:
        for k, (image, mask) in enumerate(cases):
            whole, whole_mask = reader.read_case(k)
            np.testing.assert_array_equal(whole, image)
            np.testing.assert_array_equal(whole_mask, mask)
        ids = reader.grid.ids([1, 0])
        slabs, masks = reader.read(ids)
        assert slabs.shape == (len(ids), 8, 16, 16, 4) and masks.shape == (len(ids), 8, 16, 16)
        cases_of, starts, _ = reader.plan(ids, 0)
        for b, (k, start) in enumerate(zip(cases_of, starts)):
            z, y, x = start
            inside = cases[k][0][z:z + 8, y:y + 16, x:x + 16]
            d, h, w = inside.shape[:3]
            np.testing.assert_array_equal(slabs[b, :d, :h, :w], inside)
            assert (slabs[b, d:] == volumes.PAD_IMAGE).all() and (slabs[b, :, h:] == 0).all()
    # the sliding-window inferer takes the C channels whole, every window with all of them
    seen = []

    def model(x):
        seen.append(x.shape)
        return np.concatenate([x[..., :1], x[..., 3:4]], axis=-1)

    probs = sliding.sliding_window(model, cases[2][0], (8, 16, 16), 0.5, batch=4)
    assert {s[1:] for s in seen} == {(8, 16, 16, 4)}
    np.testing.assert_array_equal(probs[..., 0], cases[2][0][..., 0])  # voxelwise: exact
    np.testing.assert_array_equal(probs[..., 1], cases[2][0][..., 3])


def test_images_of_another_channel_count_are_refused_in_one_line(tmp_path):
    path = str(tmp_path / "mixed.h5")
    writer = volumes.VolumeWriter(path)
    (four, mask), (two, _) = _cases4([(4, 8, 8)]) + [(np.zeros((4, 8, 8, 2), np.float32), None)]
    writer.append(four, mask, 1, 0)
    with pytest.raises(h5format.DatasetError) as e:
        writer.append(two, mask, 2, 0)
    one_line(e, path, "case 2", "2 channel(s)", "first case has 4")
    writer.abort()
    assert not os.path.exists(path) and not os.path.exists(path + ".partial")
    # A file edited by hand: volumes/1/image with 2 channels beside 4
    volumes.write_volumes(path, [four, four], [mask, mask], [7, 8], [0, 1], source="t",
                          hu_window=(np.nan, np.nan))
    with h5py.File(path, "a") as f:
        del f["volumes/1/image"]
        f["volumes/1/image"] = two
    with pytest.raises(h5format.DatasetError) as e:
        volumes.examine(path)
    one_line(e, path, "case 8 (volumes/1/image)", "2 channel(s)", "volumes/0/image", "has 4")
    with h5py.File(path, "a") as f:
        del f["volumes/1/image"]
        f["volumes/1/image"] = np.zeros((4, 8, 7), np.float32)  # not the grid of 'shape'
    with pytest.raises(h5format.DatasetError) as e:
        volumes.examine(path)
    one_line(e, "case 8 (volumes/1)", "'image' has shape (4, 8, 7)", "expected (4, 8, 8) or (4, 8, 8, C)")
    # channel_names that are not one per channel
    volumes.write_volumes(path, [four], [mask], [7], [0], source="t", hu_window=(np.nan, np.nan))
    with h5py.File(path, "a") as f:
        f.attrs["channel_names"] = ["FLAIR", "FLAIR", "T1", "T2"]
    with pytest.raises(h5format.DatasetError) as e:
        volumes.examine(path)
    one_line(e, path, "attribute channel_names", "4 distinct names")
    result = cli("info", path)
    assert result.exit_code == 2 and "attribute channel_names" in result.stderr


def test_files_of_one_channel_read_as_before(tmp_path):
    # What distseg wrote before channels existed: slices (N, H, W, 1), volumes
    # (D, H, W), no channel_names. They read unchanged, with channels = 1.
    flat = synth.make_dataset(str(tmp_path / "s.h5"), cases=3, size=16, seed=0, slices_per_case=4)
    vols = synth.make_volumes(str(tmp_path / "v.h5"), cases=3, size=16, seed=0, slices_per_case=8)
    with h5py.File(tmp_path / "s.h5") as f, h5py.File(tmp_path / "v.h5") as g:
        assert f["images"].shape == (12, 16, 16, 1) and f["images"].chunks == (1, 16, 16, 1)
        assert g["volumes/0/image"].ndim == 3  # one channel is still stored (D, H, W)
        assert "channel_names" not in f.attrs and "channel_names" not in g.attrs
    assert (flat.channels, flat.channel_names, vols.channels, vols.channel_names) == (1, (), 1, ())
    for path in ("s.h5", "v.h5"):
        shown = json.loads(cli("info", str(tmp_path / path)).output)
        assert shown["channels"] == 1 and shown["channel_names"] == []
    with volumes.SlabReader(str(tmp_path / "v.h5"), (8, 8, 8)) as reader:
        image, _ = reader.read_case(0)
        slabs, _ = reader.read([0])
        with h5py.File(tmp_path / "v.h5", "r", locking=False) as g:
            np.testing.assert_array_equal(image[..., 0], g["volumes/0/image"][()])
    assert image.shape[-1] == 1 and slabs.shape[-1] == 1


# ---------------------------------------------------------------- convert: MSD 4-D


@pytest.fixture(scope="module")
def brats(tmp_path_factory):
    """A 4-channel MSD task: 3 cases of 4-D images (two orientations) and 1 in imagesTs."""
    root = str(tmp_path_factory.mktemp("brats") / "Task01_BrainTumour")
    names = samples.write_multichannel_task(root, 3, channels=BRATS, size=24, slices=8,
                                            orientations=("LPS", "RAS"), spacing_ras=SPACING,
                                            test_cases=1)
    return root, names


def _channels_of_case(i, names, size, slices, orientation):
    hu, _ = samples.case_arrays(i, size, slices, orientation)
    return samples.channel_arrays(hu, names)


@pytest.mark.parametrize("ndim", [2, 3])
def test_an_msd_task_of_4d_images_keeps_every_channel_z_scored(brats, tmp_path, ndim):
    root, names = brats
    out = tmp_path / f"b{ndim}.h5"
    extra = ("--size", 24) if ndim == 2 else ("--ndim", 3)
    res = convert(root, out, *extra, "--val-fraction", 0.34)
    assert res.exit_code == 0, res.output
    assert "4 channels: FLAIR (zscore), T1w (zscore), T1gd (zscore), T2w (zscore)" in res.output
    info = (data if ndim == 2 else volumes).examine(str(out))
    assert (info.channels, info.channel_names) == (4, BRATS)
    assert info.class_names == ("background", "edema", "tumour")
    with h5py.File(out) as f:
        pre = json.loads(f.attrs["preprocessing"])
        assert [c["name"] for c in pre["channels"]] == list(BRATS)
        assert {c["intensity"] for c in pre["channels"]} == {"zscore"} and pre["channel"] is None
        assert np.isnan(f.attrs["hu_window"]).all()
        assert f["cases/bounds"].shape == (3, 4, 2)
        for k, orientation in enumerate(("LPS", "RAS")):
            arrays = _channels_of_case(k, BRATS, 24, 8, orientation)
            ornt = geometry.ornt_of(f["cases/affine"][k])
            if ndim == 2:  # size = in-plane size: no resampling
                first, n = f["cases/first"][k], f["cases/slices"][k]
                stored = f["images"][first:first + n]
            else:
                stored = f[f"volumes/{k}/image"][()]
            assert stored.shape[-1] == 4
            for c, a in enumerate(arrays):
                expected = geometry.to_slices(zscored(a), ornt)
                np.testing.assert_allclose(stored[..., c], expected, atol=2e-5)
                body = geometry.to_slices(a, ornt) != 0
                # each channel on its own scale, yet z-scored alike: mean 0, sd 1
                assert abs(stored[..., c][body].mean()) < 1e-4
                assert abs(stored[..., c][body].std() - 1) < 1e-4
                assert (stored[..., c][~body] == 0).all()
                mean, std = a[a != 0].mean(), a[a != 0].std()
                np.testing.assert_allclose(f["cases/bounds"][k, c], [mean, mean + std], rtol=1e-5)
    if ndim == 2:  # cases prepared in worker processes: the same file
        assert convert(root, tmp_path / "w2.h5", *extra, "--val-fraction", 0.34, "--workers", 2).exit_code == 0
        with h5py.File(out) as f, h5py.File(tmp_path / "w2.h5") as g:
            np.testing.assert_array_equal(f["images"][()], g["images"][()])


def test_msd_channel_picks_and_bad_channel_counts(brats, tmp_path):
    root, _ = brats
    # --channel keeps one, normalised as single-channel MR always was (percentiles)
    res = convert(root, tmp_path / "one.h5", "--size", 24, "--channel", 2)
    assert res.exit_code == 0, res.output
    info = data.examine(str(tmp_path / "one.h5"))
    assert (info.channels, info.channel_names) == (1, ("T1gd",))
    with h5py.File(tmp_path / "one.h5") as f:
        assert f["cases/bounds"].shape == (3, 2)
        assert json.loads(f.attrs["preprocessing"])["intensity"] == "percentile"
    # --mr-norm zscore for every channel kept, percentile for all of them
    res = convert(root, tmp_path / "p.h5", "--size", 24, "--mr-norm", "percentile")
    assert res.exit_code == 0 and "FLAIR (percentile)" in res.output
    with h5py.File(tmp_path / "p.h5") as f:
        assert f["images"][()].min() == 0.0 and f["images"][()].max() == pytest.approx(1.0)
    # a case of 3 channels in a task that declares 4
    task = tmp_path / "bad"
    shutil.copytree(root, task)
    img = nib.load(task / "imagesTr/brats_001.nii.gz")
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[..., :3], img.affine), task / "imagesTr/brats_001.nii.gz")
    one_line_error(convert(task, tmp_path / "x.h5", "--size", 24), "case brats_001",
                   "brats_001.nii.gz has 3 channel(s)", "dataset.json declares 4", "FLAIR")
    res = convert(task, tmp_path / "skip.h5", "--size", 24, "--on-error", "skip")
    assert res.exit_code == 0 and "skipped 1 case(s)" in res.output
    one_line_error(convert(root, tmp_path / "x.h5", "--window", "-100,200"), "--window", "MR")
    assert not list(tmp_path.glob("x.h5*"))


# ---------------------------------------------------------------- convert: nnU-Net v2


@pytest.fixture(scope="module")
def prostate(tmp_path_factory):
    """An nnU-Net v2 raw dataset: channels T2 and ADC, labels name -> id, 3 cases and 1
    in imagesTs."""
    root = str(tmp_path_factory.mktemp("nnunet") / "Dataset005_Prostate")
    names = samples.write_multichannel_task(root, 3, kind="nnunet", channels=PROSTATE, size=24,
                                            slices=8, orientations=("RAS", "PIR"),
                                            spacing_ras=SPACING, test_cases=1)
    return root, names


def test_the_nnunet_v2_layout_is_found_with_its_channels_and_classes(prostate):
    root, names = prostate
    src = sources.discover(root)
    assert src.kind == "nnunet" and src.modalities == PROSTATE
    assert src.class_names == ("background", "tumor")
    assert [c.name for c in src.cases] == names[:3] and [c.name for c in src.unlabelled] == names[3:]
    case = src.cases[1]
    assert case.files == (f"{root}/imagesTr/{names[1]}_0000.nii.gz", f"{root}/imagesTr/{names[1]}_0001.nii.gz")
    assert case.image == case.files[0] and case.label == f"{root}/labelsTr/{names[1]}.nii.gz"
    assert case.case_id == 1


@pytest.mark.parametrize("ndim", [2, 3])
def test_an_nnunet_dataset_converts_every_channel(prostate, tmp_path, ndim):
    root, names = prostate
    out = tmp_path / f"p{ndim}.h5"
    res = convert(root, out, *(("--size", 24) if ndim == 2 else ("--ndim", 3)))
    assert res.exit_code == 0, res.output
    assert "2 channels: T2 (zscore), ADC (zscore)" in res.output
    info = (data if ndim == 2 else volumes).examine(str(out))
    assert (info.channels, info.channel_names, info.class_names) == (2, PROSTATE, ("background", "tumor"))
    with h5py.File(out) as f:
        assert f.attrs["source"].startswith("nnunet PhantomProstate")
        assert [n.decode() for n in f["cases/name"][:]] == names[:3]
        assert f["cases/image"][0].decode() == f"imagesTr/{names[0]}_0000.nii.gz"
        for k, orientation in enumerate(("RAS", "PIR", "RAS")):
            ornt = geometry.ornt_of(f["cases/affine"][k])
            hu, labels = samples.case_arrays(k, 24, 8, orientation)
            if ndim == 2:
                first, n = f["cases/first"][k], f["cases/slices"][k]
                stored, mask = f["images"][first:first + n], f["masks"][first:first + n]
            else:
                stored, mask = f[f"volumes/{k}/image"][()], f[f"volumes/{k}/mask"][()]
            np.testing.assert_array_equal(mask, geometry.to_slices((labels > 0).astype(np.uint8), ornt))
            for c, a in enumerate(samples.channel_arrays(hu, PROSTATE)):
                np.testing.assert_allclose(stored[..., c], geometry.to_slices(zscored(a), ornt), atol=2e-5)


def test_ct_channels_are_windowed_and_the_others_z_scored(tmp_path):
    # nnU-Net's rule, channel by channel: "CT" -> the HU window, anything else per case
    root = str(tmp_path / "Dataset009_PetCt")
    samples.write_multichannel_task(root, 2, kind="nnunet", channels=("CT", "PET"), size=16, slices=6)
    res = convert(root, tmp_path / "pc.h5", "--ndim", 3, "--window", "-100,300")
    assert res.exit_code == 0, res.output
    assert "CT (window), PET (zscore)" in res.output
    with h5py.File(tmp_path / "pc.h5") as f:
        pre = json.loads(f.attrs["preprocessing"])
        assert [c["intensity"] for c in pre["channels"]] == ["window", "zscore"]
        assert pre["channels"][0]["window"] == [-100.0, 300.0]
        assert f.attrs["hu_window"].tolist() == [-100.0, 300.0]
        hu, _ = samples.case_arrays(0, 16, 6, "RAS")
        ornt = geometry.ornt_of(f["cases/affine"][0])
        image = f["volumes/0/image"][()]
        np.testing.assert_array_equal(image[..., 0], geometry.to_slices(h5format.window(hu.astype(np.int16), -100, 300), ornt))
        pet = samples.channel_arrays(hu, ("CT", "PET"))[1]
        np.testing.assert_allclose(image[..., 1], geometry.to_slices(zscored(pet), ornt), atol=2e-5)


def _edited(root, tmp_path, name, edit):
    task = tmp_path / name
    shutil.copytree(root, task)
    edit(task)
    return task


def _json_edit(**changes):
    def edit(task):
        meta = json.loads((task / "dataset.json").read_text())
        meta.update(changes)
        (task / "dataset.json").write_text(json.dumps(meta))
    return edit


def test_bad_nnunet_datasets_are_refused_in_one_line(prostate, tmp_path):
    root, names = prostate
    regions = _edited(root, tmp_path, "regions", _json_edit(
        labels={"background": 0, "whole tumor": [1, 2], "core": 2}, regions_class_order=[1, 2]))
    one_line_error(convert(regions, tmp_path / "x.h5"), "dataset.json", "region-based",
                   "whole tumor: [1, 2]", "one integer id")
    gaps = _edited(root, tmp_path, "gaps", _json_edit(labels={"background": 0, "tumor": 2}))
    one_line_error(convert(gaps, tmp_path / "x.h5"), "dataset.json", "0..K-1", "[0, 2]")
    ending = _edited(root, tmp_path, "ending", _json_edit(file_ending=".mha"))
    one_line_error(convert(ending, tmp_path / "x.h5"), "file_ending '.mha'", ".nii.gz")
    channels = _edited(root, tmp_path, "chan", _json_edit(channel_names={"0": "T2", "2": "ADC"}))
    one_line_error(convert(channels, tmp_path / "x.h5"), "channel_names", "0..C-1")

    def move(task):  # channel 1 of case 1 on another grid (shifted 2 mm)
        path = task / f"imagesTr/{names[1]}_0001.nii.gz"
        img = nib.load(path)
        affine = img.affine.copy()
        affine[0, 3] += 2.0
        nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), path)
    moved = _edited(root, tmp_path, "moved", move)
    one_line_error(convert(moved, tmp_path / "x.h5", "--size", 24), f"case {names[1]}",
                   f"{names[1]}_0001.nii.gz: not on the grid of the first channel",
                   f"{names[1]}_0000.nii.gz", "2 mm")

    def shrink(task):
        path = task / f"imagesTr/{names[2]}_0001.nii.gz"
        img = nib.load(path)
        nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[:, :, :5], img.affine), path)
    one_line_error(convert(_edited(root, tmp_path, "shrunk", shrink), tmp_path / "x.h5", "--size", 24),
                   f"case {names[2]}", f"{names[2]}_0001.nii.gz: shape (24, 24, 5)")
    missing = _edited(root, tmp_path, "missing",
                      lambda task: os.remove(task / f"imagesTr/{names[0]}_0001.nii.gz"))
    one_line_error(convert(missing, tmp_path / "x.h5", "--size", 24), f"case {names[0]}",
                   f"{names[0]}_0001.nii.gz: no such file")
    assert not list(tmp_path.glob("x.h5*"))


def test_an_nnunet_v1_task_reads_its_channel_files(prostate, tmp_path):
    # nnU-Net v1: an MSD dataset.json whose images are CASE_XXXX files
    root, names = prostate
    task = tmp_path / "Task005_Prostate"
    shutil.copytree(root, task)
    (task / "dataset.json").write_text(json.dumps({
        "modality": {"0": "T2", "1": "ADC"}, "labels": {"0": "background", "1": "tumor"},
        "training": [{"image": f"./imagesTr/{n}.nii.gz", "label": f"./labelsTr/{n}.nii.gz"}
                     for n in names[:3]]}))
    src = sources.discover(str(task))
    assert src.kind == "nnunet" and len(src.cases[0].files) == 2
    res = convert(task, tmp_path / "v1.h5", "--ndim", 3)
    assert res.exit_code == 0, res.output
    assert volumes.examine(str(tmp_path / "v1.h5")).channels == 2


# ---------------------------------------------------------------- predict


def _config(h5, in_channels, num_classes, dims=2, size=24):
    cfg = config_lib.smoke()
    model = dataclasses.replace(cfg.model, in_channels=in_channels, num_classes=num_classes,
                                spatial_dims=dims, image_size=size)
    return dataclasses.replace(cfg, model=model, data=dataclasses.replace(cfg.data, path=str(h5)))


class Recording:
    """A 2D "model" that keeps what it is given and calls a voxel tumour where channel
    ``channel`` is above ``threshold``."""

    def __init__(self, classes, channel=0, threshold=0.5):
        self.seen, self.classes, self.channel, self.threshold = [], classes, channel, threshold

    def __call__(self, x):
        self.seen.append(x.copy())
        fg = x[..., self.channel] > self.threshold
        return np.eye(self.classes, dtype=np.float32)[fg.astype(int)]


def test_predict_reads_a_4d_msd_case_as_convert_prepared_it(brats, tmp_path):
    root, names = brats
    h5 = tmp_path / "b.h5"
    assert convert(root, h5, "--size", 24, "--val-fraction", 0).exit_code == 0
    opts = predict.Options(run_dir="RUN", inputs=(root,), out=str(tmp_path), subset="all")
    known = predict.training_data(_config(h5, 4, 3), opts)
    assert known.prep.intensities == (Intensity.zscore(),) * 4
    assert known.prep.channel_names == BRATS and "4 channels (FLAIR:" in known.prep.describe()
    found = scans_lib.collect_scans((root,), known.cases, "all")
    assert [s.name for s in found] == names and all(s.files == (s.image,) for s in found)
    assert predict.check_scan(found[0], known.prep, "RUN") == 24 * 24 * 8
    model = Recording(3, channel=1, threshold=0.0)
    net = predict.Network(sliding.slicewise(model), (1, 24, 24), 5)
    result = predict.predict_scan(found[1], known.prep, net, opts, 3)
    # the network saw exactly the training data's slices of that case, all 4 channels
    with h5py.File(h5) as f:
        first, n = f["cases/first"][1], f["cases/slices"][1]
        np.testing.assert_array_equal(np.concatenate(model.seen), f["images"][first:first + n])
        ornt = geometry.ornt_of(f["cases/affine"][1])
        expected = geometry.from_slices((f["images"][first:first + n][..., 1] > 0).astype(np.uint8), ornt)
    seg, scan = nib.load(result.output), nib.load(found[1].image)
    assert seg.shape == scan.shape[:3] and scan.shape[3] == 4
    np.testing.assert_array_equal(seg.affine, scan.affine)
    np.testing.assert_array_equal(np.asarray(seg.dataobj), expected)
    assert result.scores is not None and len(result.scores) == 2
    # its overlay shows the first channel
    png = report.draw_overlay("best", result, found[1], known.prep, str(tmp_path), known.class_names)
    assert png == str(tmp_path / "overlays" / f"best_{names[1]}.png") and os.path.getsize(png) > 0
    # flags apply to every channel; --channel is for single-channel models
    assert predict.training_data(_config(h5, 4, 3), dataclasses.replace(opts, modality="mr")).prep.intensities \
        == (Intensity.zscore(),) * 4
    flagged = predict.training_data(_config(h5, 4, 3), dataclasses.replace(opts, modality="ct"))
    assert flagged.prep.intensities == (Intensity.ct(),) * 4 and flagged.prep.where == "flags"
    with pytest.raises(InputError) as e:
        predict.training_data(_config(h5, 4, 3), dataclasses.replace(opts, channel=1))
    one_line(e, "--channel 1", "takes 4 channels")
    # a model of one channel is told to pick one; one of 4 channels is told what to give
    with pytest.raises(InputError) as e:
        predict.check_scan(found[0], predict.Preprocessing(Intensity.mr(), 24, None, "t"), "RUN")
    one_line(e, "has 4 channels", "model of RUN takes 1", "--channel")
    hu, _ = samples.case_arrays(0, 24, 8, "RAS")
    nib.save(nib.Nifti1Image(hu, samples.affine_for("RAS")), tmp_path / "single.nii.gz")
    with pytest.raises(InputError) as e:
        predict.check_scan(scans_lib.Scan("single", str(tmp_path / "single.nii.gz"), None), known.prep, "RUN")
    one_line(e, "single.nii.gz: 1 channel(s)", "takes 4 (FLAIR, T1w, T1gd, T2w)", "CASE_0000")


def test_predict_reads_nnunet_channel_files_from_a_file_or_a_folder(prostate, tmp_path):
    root, names = prostate
    h5 = tmp_path / "p.h5"
    assert convert(root, h5, "--ndim", 3, "--val-fraction", 0).exit_code == 0
    cfg = _config(h5, 2, 2, dims=3)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, slab="8,16,16"))
    opts = predict.Options(run_dir="RUN", inputs=(), out=str(tmp_path / "out"))
    os.makedirs(opts.out)
    known = predict.training_data(cfg, opts)
    assert len(known.prep.intensities) == 2 and known.prep.size == 0
    # the first channel's file: case CASE, its channels beside it, labels CASE
    first = f"{root}/imagesTr/{names[0]}_0000.nii.gz"
    (scan,) = scans_lib.collect_scans((first,), None, labels=f"{root}/labelsTr")
    assert scan.name == names[0] and scan.label == f"{root}/labelsTr/{names[0]}.nii.gz"
    assert scan.files == (first, first.replace("_0000", "_0001"))
    # the dataset folder (imagesTs), and a plain folder of channel files as nnUNetv2_predict takes
    (test,) = scans_lib.collect_scans((root,), None, "test")
    assert test.name == names[3] and len(test.files) == 2 and test.label is None
    plain = tmp_path / "plain"
    shutil.copytree(f"{root}/imagesTs", plain)
    (again,) = scans_lib.collect_scans((str(plain),), None)
    assert again.name == names[3] and again.files == tuple(str(plain / f"{names[3]}_{c:04d}.nii.gz") for c in (0, 1))
    # a voxelwise 3D model (ADC above its case mean): the result is exact, on channel 0's grid
    net = predict.Network(lambda x: np.eye(2, dtype=np.float32)[(x[..., 1] > 0).astype(int)],
                          (8, 16, 16), 2, 0.5)
    assert predict.check_scan(scan, known.prep, "RUN") == 24 * 24 * 8
    result = predict.predict_scan(scan, known.prep, net, opts, 2)
    with volumes.SlabReader(str(h5), (8, 16, 16)) as reader:
        volume, _ = reader.read_case(0)
    with h5py.File(h5) as f:
        ornt = geometry.ornt_of(f["cases/affine"][0])
    seg, image = nib.load(result.output), nib.load(first)
    assert result.output.endswith(f"{names[0]}_seg.nii.gz")
    assert seg.shape == image.shape
    np.testing.assert_array_equal(seg.affine, image.affine)
    np.testing.assert_array_equal(np.asarray(seg.dataobj),
                                  geometry.from_slices((volume[..., 1] > 0).astype(np.uint8), ornt))
    # a channel file on another grid is refused from the headers, naming case and file
    moved = tmp_path / "moved"
    shutil.copytree(plain, moved)
    bad = moved / f"{names[3]}_0001.nii.gz"
    img = nib.load(bad)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), img.affine * 1.01), bad)
    (wrong,) = scans_lib.collect_scans((str(moved),), None)
    with pytest.raises(InputError) as e:
        predict.check_scan(wrong, known.prep, "RUN")
    one_line(e, f"case {names[3]}", f"{bad}: not on the grid of the first channel")
    # a model of two channels needs the data file (or --modality) for their normalisation
    with pytest.raises(InputError) as e:
        predict.training_data(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path="")), opts)
    one_line(e, "takes 2 channels", "--data FILE.h5")
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, in_channels=3))
    with pytest.raises(InputError) as e:
        predict.training_data(other, opts)
    one_line(e, str(h5), "images of 2 channel(s)", "takes 3")
