"""``distseg.inference.postprocess``: test-time mirroring maps every output back to
its voxel, the largest connected component keeps exactly the largest blob of each class
asked for, and the decisions file says what helps, with the Dice behind it, and only
that is applied (``distseg.inference.predict``)."""

import json
import os

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from distseg.core import rundir
from distseg.data.convert.intensity import Intensity
from distseg.inference import postprocess, predict
from distseg.inference.scans import Scan

NAMES = ("background", "liver", "lesion")


# ------------------------------------------------------------------ mirroring


def test_the_flips_are_every_combination_of_the_spatial_axes():
    assert postprocess.flip_sets((2, 3)) == [(), (2,), (3,), (2, 3)]
    assert len(postprocess.flip_sets((1, 2, 3))) == 8
    assert postprocess.mirror_axes((1, 32, 32)) == (2, 3)  # a 2D run's one-slice window
    assert postprocess.mirror_axes((16, 32, 32)) == (1, 2, 3)


def _blur_net(x):
    """An equivariant "network": a 3x3(x3) box blur of the image, zero padded (the same
    under any flip), as two-class probabilities."""
    size = (1, 1, 3, 3, 1) if x.shape[1] == 1 else (1, 3, 3, 3, 1)
    p = ndimage.uniform_filter(x.astype(np.float64), size=size, mode="constant")
    return np.concatenate([p, 1.0 - p], axis=-1).astype(np.float32)


@pytest.mark.parametrize("window", [(1, 7, 5), (4, 6, 5)])
def test_mirroring_an_equivariant_network_changes_nothing(window):
    """On an asymmetric input (a ramp plus noise, odd sizes), the output of each flipped
    input flipped back is the plain output: the average is the plain output."""
    rng = np.random.default_rng(0)
    x = (np.arange(np.prod(window)).reshape((1, *window, 1)) / np.prod(window)
         + 0.1 * rng.random((1, *window, 1))).astype(np.float32)
    x = np.concatenate([x, x[:, ::-1] ** 2])  # two windows in the batch
    axes = postprocess.mirror_axes(window)
    np.testing.assert_allclose(postprocess.mirrored(_blur_net, axes)(x), _blur_net(x), atol=1e-6)
    # Not flipping back would be wrong: averaged flipped outputs differ from the plain one.
    unflipped = np.mean([_blur_net(np.flip(x, f)) for f in postprocess.flip_sets(axes)], axis=0)
    assert np.abs(unflipped - _blur_net(x)).max() > 0.05


def test_mirroring_a_fixed_function_gives_the_average_of_its_flips():
    """f(x) = x + R, R fixed and position dependent: the mirrored f is x plus the mean of
    R flipped along every combination of the axes."""
    rng = np.random.default_rng(1)
    shape = (2, 1, 6, 5, 3)
    offset = rng.random(shape[1:]).astype(np.float32)
    x = rng.random(shape).astype(np.float32)
    got = postprocess.mirrored(lambda v: v + offset, (2, 3))(x)
    flips = [offset, offset[:, ::-1], offset[:, :, ::-1], offset[:, ::-1, ::-1]]
    np.testing.assert_allclose(got, x + np.mean(flips, axis=0), atol=1e-6)


# ------------------------------------------------------------ largest component


def _blobs():
    """A (6, 10, 10) label volume: liver (1) in blobs of 24, 8 and 1 voxels, the 1 only
    touching the 24 at a corner (one blob under full connectivity); lesion (2) in blobs
    of 4 and 6."""
    seg = np.zeros((6, 10, 10), np.uint8)
    seg[0:2, 0:3, 0:4] = 1       # 24 voxels
    seg[2, 3, 4] = 1             # corner-touching the 24: part of it
    seg[4:6, 6:8, 6:8] = 1       # 8 voxels
    seg[0, 8:10, 0:2] = 2        # 4 voxels
    seg[5, 0:2, 7:10] = 2        # 6 voxels
    return seg


def test_the_largest_component_keeps_exactly_the_largest_blob_of_each_class_asked_for():
    seg = _blobs()
    liver = postprocess.keep_largest(seg, [1])
    assert (liver == 1).sum() == 25 and liver[4:6, 6:8, 6:8].max() == 0
    np.testing.assert_array_equal(liver == 2, seg == 2)  # lesion untouched
    assert (liver[(seg == 1) & (liver != 1)] == 0).all()  # removed voxels are background
    both = postprocess.keep_largest(seg, [1, 2])
    assert (both == 2).sum() == 6 and both[0, 8:10, 0:2].max() == 0
    np.testing.assert_array_equal(seg, _blobs())  # the input is not changed
    assert not postprocess.largest_component(np.zeros((3, 3), bool)).any()


def test_the_largest_component_is_taken_over_the_whole_volume():
    """A 2D run's case is stacked before the components are labelled: an organ cut into
    slices of 6 voxels each, over 4 slices (24), outweighs an 8-voxel blob in one slice."""
    seg = np.zeros((5, 8, 8), np.uint8)
    seg[0:4, 0:2, 0:3] = 1
    seg[4, 4:6, 4:8] = 1
    kept = postprocess.keep_largest(seg, [1])
    assert (kept == 1).sum() == 24 and kept[4].max() == 0


# ------------------------------------------------------------------- decisions


def _row(plain, mirror, plain_lcc, mirror_lcc):
    return {"plain": plain, "mirror": mirror, "plain_lcc": plain_lcc, "mirror_lcc": mirror_lcc}


def test_case_rows_score_each_prediction_with_and_without_the_largest_component():
    truth = _blobs()
    truth[4:6, 6:8, 6:8] = 0  # the truth has the big liver blob only
    row = postprocess.case_row(truth, _blobs(), _blobs(), 3)
    assert row["plain"][0] == pytest.approx(2 * 25 / (25 + 33))
    assert row["plain_lcc"][0] == 1.0
    # The lesion's two blobs are both true: the largest alone loses the 4 others.
    assert (row["plain"][1], row["plain_lcc"][1]) == (1.0, 2 * 6 / (10 + 6))
    truth[truth == 2] = 0
    row = postprocess.case_row(truth, _blobs(), _blobs(), 3)
    assert row["plain"][1] == row["plain_lcc"][1] == 0.0 and row["mirror"] == row["plain"]


def test_the_decisions_record_both_numbers_and_apply_only_what_raises_the_dice():
    rows = [_row([0.80, 0.50], [0.82, 0.40], [0.90, 0.45], [0.91, 0.42]),
            _row([0.70, None], [0.74, None], [0.75, None], [0.80, None])]
    d = postprocess.decide(rows, NAMES)
    m = d["mirror"]
    # mean foreground Dice: plain (0.75 + 0.50) / 2, mirrored (0.78 + 0.40) / 2: no mirroring
    assert m["dice_plain"] == pytest.approx(0.625) and m["dice_mirror"] == pytest.approx(0.59)
    assert m["apply"] is False and m["classes_mirror"]["liver"] == pytest.approx(0.78)
    lcc = d["largest_component"]
    assert lcc["on"] == "plain"
    assert lcc["classes"]["liver"] == {"apply": True, "dice_without": pytest.approx(0.75),
                                       "dice_with": pytest.approx(0.825)}
    assert lcc["classes"]["lesion"] == {"apply": False, "dice_without": 0.5, "dice_with": 0.45}
    # mirroring raising the mean: the largest component is decided on the mirrored prediction
    rows[0]["mirror"] = [0.82, 0.60]
    d = postprocess.decide(rows, NAMES)
    assert d["mirror"]["apply"] is True and d["largest_component"]["on"] == "mirror"
    assert d["largest_component"]["classes"]["lesion"]["dice_without"] == 0.6
    # equal is not better
    same = postprocess.decide([_row([0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5])], NAMES)
    assert not same["mirror"]["apply"]
    assert not any(c["apply"] for c in same["largest_component"]["classes"].values())


def _write_decisions(run_dir, stem="epoch-0003", mirror=True, liver=True, lesion=False):
    rows = [_row([0.7, 0.5], [0.8 if mirror else 0.6, 0.5], [0.7, 0.5],
                 [0.9 if liver else 0.7, 0.6 if lesion else 0.4])]
    decisions = postprocess.decide(rows, NAMES)
    return postprocess.write(str(run_dir), decisions, {"stem": stem, "epoch": 3, "which": "best"},
                             "data.h5", ["case 1"])


def test_the_decisions_file_is_read_back_for_its_checkpoint_and_the_flags_override_it(tmp_path):
    path = _write_decisions(tmp_path)
    assert path == rundir.postprocessing_path(str(tmp_path))
    with open(path) as f:
        doc = json.load(f)
    assert doc["checkpoint"]["stem"] == "epoch-0003" and doc["cases"] == ["case 1"]
    assert doc["largest_component"]["classes"]["liver"]["dice_with"] == 0.9
    auto = postprocess.choose(str(tmp_path), NAMES, "epoch-0003")
    assert (auto.mirror, auto.largest, auto.warnings) == (True, (1,), ())
    assert "mirroring on (validation Dice 0.6000 plain, 0.6500 mirrored)" in auto.words
    assert "liver yes (0.8000 -> 0.9000), lesion no (0.5000 -> 0.4000)" in auto.words
    off = postprocess.choose(str(tmp_path), NAMES, "epoch-0003", tta="none", postprocess="none")
    assert (off.mirror, off.largest) == (False, ())
    assert "--tta none" in off.words and "--postprocess none" in off.words
    forced = postprocess.choose(str(tmp_path), NAMES, "epoch-0003", tta="mirror")
    assert forced.mirror and forced.largest == (1,)


def test_decisions_of_another_checkpoint_or_none_apply_nothing_and_say_why(tmp_path):
    _write_decisions(tmp_path, stem="epoch-0002")
    other = postprocess.choose(str(tmp_path), NAMES, "epoch-0003")
    assert (other.mirror, other.largest) == (False, ())
    assert "decided on epoch-0002, not epoch-0003" in other.words
    os.remove(rundir.postprocessing_path(str(tmp_path)))
    none = postprocess.choose(str(tmp_path), NAMES, "epoch-0003", tta="mirror")
    assert (none.mirror, none.largest, none.warnings) == (True, (), ())
    assert "--decide" in none.words
    with open(rundir.postprocessing_path(str(tmp_path)), "w") as f:
        f.write('{"mirror": {"apply": true}}')
    damaged = postprocess.choose(str(tmp_path), NAMES, "epoch-0003")
    assert (damaged.mirror, damaged.largest) == (False, ())
    [line] = damaged.warnings
    assert "postprocessing.json: not a post-processing decisions file" in line
    assert "checkpoint.stem" in line and "\n" not in line


def test_predict_keeps_the_largest_component_only_of_the_classes_it_was_told(tmp_path, monkeypatch):
    """``predict_scan`` on a scan whose segmentation has two blobs of each class: only
    the classes of ``Network.post`` lose their smaller blobs."""
    image = str(tmp_path / "scan.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros((10, 10, 6), np.int16), np.eye(4)), image)
    monkeypatch.setattr(predict, "segment", lambda *a, **k: _blobs())
    prep = predict.Preprocessing(Intensity.ct(), 10, None, "test")
    opts = predict.Options(run_dir="r", inputs=(image,), out=str(tmp_path))
    for largest, liver, lesion in (((), 33, 10), ((1,), 25, 10), ((2,), 33, 6), ((1, 2), 25, 6)):
        net = predict.Network(lambda x: x, (1, 10, 10),
                              post=postprocess.Applied(largest=largest))
        result = predict.predict_scan(Scan("scan", image, None), prep, net, opts, 3)
        seg = np.asarray(nib.load(result.output).dataobj)
        assert ((seg == 1).sum(), (seg == 2).sum()) == (liver, lesion), largest
