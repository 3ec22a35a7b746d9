"""Dice, HD95 and normalised surface Dice on shapes whose answers are known."""

import math

import numpy as np
import pytest

from distseg import metrics


def cube(shape=(30, 30, 30), lo=(5, 5, 5), side=10):
    m = np.zeros(shape, bool)
    m[lo[0]:lo[0] + side, lo[1]:lo[1] + side, lo[2]:lo[2] + side] = True
    return m


def ball(radius, shape=(64, 64, 64)):
    z, y, x = np.indices(shape) - np.array(shape)[:, None, None, None] // 2
    return np.sqrt(z ** 2 + y ** 2 + x ** 2) <= radius


def test_identical_masks_score_perfectly():
    s = metrics.score_class(cube(), cube(), (1.0, 1.0, 1.0), 1.0)
    assert (s.dice, s.hd95, s.nsd) == (1.0, 0.0, 1.0)
    assert s.true_voxels == s.pred_voxels == 1000


@pytest.mark.parametrize("axis,shift,spacing", [
    (0, 3, (1.0, 1.0, 1.0)), (0, 3, (2.0, 0.5, 0.5)), (2, 2, (2.0, 0.5, 0.7)), (1, 1, (3.0, 0.8, 0.8)),
])
def test_a_shifted_cube_is_off_by_the_shift_in_mm(axis, shift, spacing):
    lo = [5, 5, 5]
    lo[axis] += shift
    s = metrics.score_class(cube(), cube(lo=tuple(lo)), spacing, tolerance_mm=1e-3)
    assert s.dice == pytest.approx((10 - shift) / 10)  # overlap shrinks by the shift
    mm = shift * spacing[axis]
    assert s.hd95 == pytest.approx(mm)  # the two faces across the shift are mm apart
    # Every surface point is within the shift of the other surface...
    assert metrics.score_class(cube(), cube(lo=tuple(lo)), spacing, mm + 1e-6).nsd == pytest.approx(1.0)
    # ... while at zero tolerance only the overlapping side faces touch it.
    assert 0 < s.nsd < 1


def test_concentric_balls_are_their_radii_apart():
    small, big = ball(12), ball(16)
    s = metrics.score_class(small, big, (1.0, 1.0, 1.0), tolerance_mm=2.0)
    assert s.hd95 == pytest.approx(4.0, abs=0.6)  # voxelised spheres: within a voxel
    assert s.dice == pytest.approx(2 * small.sum() / (small.sum() + big.sum()))
    assert s.nsd < 0.1  # nothing within 2 mm of the other surface
    assert metrics.score_class(small, big, (1.0, 1.0, 1.0), tolerance_mm=5.0).nsd == pytest.approx(1.0)
    # the same balls on 2 mm voxels: distances double
    assert metrics.score_class(small, big, (2.0, 2.0, 2.0), 2.0).hd95 == pytest.approx(2 * s.hd95)


def test_empty_masks_follow_the_documented_conventions():
    empty = np.zeros((10, 10, 10), bool)
    both = metrics.score_class(empty, empty, (1, 1, 1), 1.0)
    assert math.isnan(both.dice) and math.isnan(both.hd95) and math.isnan(both.nsd)
    missed = metrics.score_class(cube((10, 10, 10), (2, 2, 2), 4), empty, (1, 1, 1), 1.0)
    assert (missed.dice, missed.hd95, missed.nsd) == (0.0, math.inf, 0.0)
    invented = metrics.score_class(empty, cube((10, 10, 10), (2, 2, 2), 4), (1, 1, 1), 1.0)
    assert (invented.dice, invented.hd95, invented.nsd) == (0.0, math.inf, 0.0)


def test_cases_classes_and_means():
    truth = np.zeros((20, 20, 20), np.uint8)
    truth[2:18, 2:18, 2:18] = 1
    truth[5:9, 5:9, 5:9] = 2
    pred = truth.copy()
    pred[5:9, 5:9, 5:9] = 1  # the lesion missed
    scores = metrics.score_case(truth, pred, (1, 1, 1), num_classes=3)
    assert len(scores) == 2
    assert scores[0].dice == pytest.approx(2 * 4032 / (4032 + 4096))
    assert scores[1].dice == 0.0 and scores[1].hd95 == math.inf
    assert metrics.foreground_dice(scores) == pytest.approx(scores[0].dice / 2)
    perfect = metrics.score_case(truth, truth, (1, 1, 1), 3)
    means = metrics.mean_scores([scores, perfect])
    assert means[0]["dice"] == pytest.approx((scores[0].dice + 1) / 2)
    assert means[1]["hd95"] == 0.0 and means[1]["hd95_infinite"] == 1  # inf left out, counted
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.score_case(truth, truth[:-1], (1, 1, 1), 3)
