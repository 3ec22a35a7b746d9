"""distseg/losses.py: the TensorFlow and numpy forms agree, and the global
loss's per-rank surrogates add up to the gradient of the whole batch's loss."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from distseg import losses, metrics


def _batch(seed: int, shape=(4, 6, 5), classes: int = 3):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=shape + (classes,)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    masks = rng.integers(0, classes, size=shape).astype(np.uint8)
    return probs.astype(np.float32), masks


@pytest.mark.parametrize("kind", ["dice", "dice_ce"])
@pytest.mark.parametrize("classes", [2, 3, 5])
def test_tensorflow_and_numpy_losses_agree(kind, classes):
    probs, masks = _batch(classes, classes=classes)
    ours = float(losses.segmentation_loss(tf.constant(probs), tf.constant(masks), classes, kind))
    theirs = losses.volume_loss(probs, masks, classes, kind)
    assert ours == pytest.approx(theirs, rel=1e-5)
    sums_tf = losses.loss_sums(tf.constant(probs), tf.constant(masks), classes).numpy()
    np.testing.assert_allclose(sums_tf, losses.volume_loss_sums(probs, masks, classes), rtol=1e-5)


def test_dice_ce_is_dice_plus_the_mean_cross_entropy():
    probs, masks = _batch(0)
    dice = float(losses.segmentation_loss(tf.constant(probs), tf.constant(masks), 3, "dice"))
    both = float(losses.segmentation_loss(tf.constant(probs), tf.constant(masks), 3, "dice_ce"))
    ce = -np.log(np.take_along_axis(probs, masks[..., None].astype(np.int64), -1)).mean()
    assert both - dice == pytest.approx(ce, rel=1e-5)
    perfect = np.eye(3, dtype=np.float32)[masks]
    assert float(losses.segmentation_loss(tf.constant(perfect), tf.constant(masks), 3)) == pytest.approx(-1.0)


def test_soft_dice_loss_matches_hand_computation():
    # One 1x2x2 image, two classes. Truth: class 1 on the top row.
    masks = np.array([[[1, 1], [0, 0]]], np.uint8)
    p1 = np.array([[[0.9, 0.6], [0.2, 0.1]]], np.float32)
    probs = np.stack([1 - p1, p1], axis=-1)
    # class 1: inter = 0.9 + 0.6 = 1.5; sum p = 1.8; sum g = 2 -> dice = 3.0 / 3.8
    # class 0: inter = 0.8 + 0.9 = 1.7; sum p = 2.2; sum g = 2 -> dice = 3.4 / 4.2
    s = 1e-5
    d1 = (3.0 + s) / (3.8 + s)
    d0 = (3.4 + s) / (4.2 + s)
    loss = losses.segmentation_loss(tf.constant(probs), tf.constant(masks), 2, "dice")
    assert float(loss) == pytest.approx(-(d0 + d1) / 2, rel=1e-6)
    ce = -np.mean(np.log([0.9, 0.6, 0.8, 0.9]))
    loss_ce = losses.segmentation_loss(tf.constant(probs), tf.constant(masks), 2, "dice_ce")
    assert float(loss_ce) == pytest.approx(-(d0 + d1) / 2 + ce, rel=1e-5)


def test_perfect_prediction_scores_minus_one():
    masks = np.random.default_rng(0).integers(0, 3, size=(2, 8, 8)).astype(np.uint8)
    probs = tf.one_hot(masks, 3)
    assert float(losses.segmentation_loss(probs, tf.constant(masks), 3)) == pytest.approx(-1.0)


def test_dice_counts_combine_like_one_batch():
    rng = np.random.default_rng(1)
    masks = rng.integers(0, 3, size=(4, 8, 8)).astype(np.uint8)
    probs = tf.nn.softmax(rng.normal(size=(4, 8, 8, 3)).astype(np.float32))
    whole = metrics.dice_counts(probs, tf.constant(masks), 3).numpy()
    parts = sum(metrics.dice_counts(probs[i:i + 1], tf.constant(masks[i:i + 1]), 3).numpy()
                for i in range(4))
    np.testing.assert_allclose(whole, parts)
    pred = np.argmax(probs.numpy(), -1)
    for c, d in enumerate(metrics.dice_from_counts(whole)):
        inter = np.sum((pred == c) & (masks == c))
        assert d == pytest.approx(2 * inter / (np.sum(pred == c) + np.sum(masks == c)))
    assert metrics.dice_from_counts(np.zeros((3, 2))) == [None, None]


def test_tensorflow_and_numpy_counts_agree():
    probs, masks = _batch(1, shape=(3, 8, 8), classes=4)
    ours = metrics.dice_counts(tf.constant(probs), tf.constant(masks), 4).numpy()
    np.testing.assert_array_equal(ours, metrics.volume_dice_counts(probs, masks, 4))
    dice = metrics.dice_from_counts(ours)
    for c in range(4):
        assert dice[c] == pytest.approx(2 * ours[0, c] / (ours[1, c] + ours[2, c]))
    assert metrics.dice_from_counts(np.zeros((3, 2))) == [None, None]


def test_an_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="loss must be one of"):
        losses.loss_from_sums(np.zeros(8), 3, "focal")


def _gradients(fn, variable):
    with tf.GradientTape() as tape:
        out = fn()
    return tape.gradient(out, variable).numpy()


@pytest.mark.parametrize("kind", ["dice", "dice_ce"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_global_loss_surrogates_average_to_the_whole_batch_gradient(kind, ranks):
    """Each "rank" holds a part of a 6-sample batch; with the sums of all parts as the
    allreduce, the mean of the parts' surrogate gradients is the whole batch's."""
    rng = np.random.default_rng(ranks)
    logits = tf.Variable(rng.normal(size=(6, 4, 4, 3)).astype(np.float32))
    masks = tf.constant(rng.integers(0, 3, size=(6, 4, 4)).astype(np.uint8))
    whole = _gradients(lambda: losses.segmentation_loss(tf.nn.softmax(logits), masks, 3, kind), logits)
    parts = np.array_split(np.arange(6), ranks)
    value = float(losses.segmentation_loss(tf.nn.softmax(logits), masks, 3, kind))

    def everyone(local, mine):
        others = [losses.loss_sums(tf.gather(tf.nn.softmax(logits), p), tf.gather(masks, p), 3)
                  for k, p in enumerate(parts) if k != mine]
        return local + tf.add_n(others)

    mean = np.zeros_like(whole)
    for r, part in enumerate(parts):
        def surrogate(r=r, part=part):
            v, s, _ = losses.global_loss(tf.gather(tf.nn.softmax(logits), part), tf.gather(masks, part),
                                      3, kind, lambda t: everyone(t, r), ranks)
            assert float(v) == pytest.approx(value, rel=1e-5)
            return s
        mean += _gradients(surrogate, logits) / ranks
    np.testing.assert_allclose(mean, whole, rtol=1e-4, atol=1e-7)
