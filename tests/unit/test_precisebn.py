"""Precise BatchNorm (``distseg.training.epoch.precisebn``): the statistics installed are the
mean of the batches' own statistics (ghost batches included), for distseg's BatchNorm
and Keras' alike; dropout's seeds and everything else come back as they were; a model
without BatchNorm is left alone."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distseg.networks.unet import FusedBatchNorm  # noqa: E402
from distseg.training.epoch import precisebn  # noqa: E402

SHAPE = (8, 8)


def _model(ghost: int, dropout: float = 0.0):
    keras.utils.set_random_seed(3)
    inp = keras.Input((*SHAPE, 2))
    conv = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inp)
    x = FusedBatchNorm(momentum=0.9, ghost_batch=ghost, name="fused")(conv)
    x = keras.layers.Dropout(dropout, name="drop")(x) if dropout else x
    x = keras.layers.Conv2D(3, 1, name="head")(keras.layers.ReLU()(x))
    x = keras.layers.BatchNormalization(momentum=0.8, name="plain")(x)
    return keras.Model(inp, x), keras.Model(inp, conv)


def _expected(features: np.ndarray, ghost: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the ghost batches of their per-channel mean and biased variance."""
    runs = np.split(features, len(features) // ghost) if ghost else [features]
    means = [r.mean(axis=(0, 1, 2)) for r in runs]
    variances = [r.var(axis=(0, 1, 2)) for r in runs]
    return np.mean(means, 0), np.mean(variances, 0)


@pytest.mark.parametrize("ghost", [0, 2])
def test_the_installed_statistics_are_the_mean_of_the_batches_own(ghost):
    model, features_of = _model(ghost)
    rng = np.random.default_rng(0)
    batches = [rng.normal(k, 1 + k, (4, *SHAPE, 2)).astype(np.float32) for k in range(3)]
    forward = precisebn.make_forward(model, SHAPE)
    means = precisebn.measure(model, forward, batches)
    precisebn.install(model, means, allreduce_many=None, size=1)
    fused = model.get_layer("fused")
    per_batch = [_expected(features_of(b, training=False).numpy(), ghost) for b in batches]
    want_mean = np.mean([m for m, _ in per_batch], 0)
    want_var = np.mean([v for _, v in per_batch], 0)
    np.testing.assert_allclose(fused.moving_mean.numpy(), want_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused.moving_variance.numpy(), want_var, rtol=1e-4, atol=1e-5)
    # Keras' own layer (another momentum) gets statistics too, and not the initial ones.
    plain = model.get_layer("plain")
    assert len(means) == 4
    np.testing.assert_allclose(plain.moving_mean.numpy(), means[2], rtol=1e-6)
    assert not np.allclose(plain.moving_variance.numpy(), 1.0)


def test_one_batch_repeated_gives_that_batch_s_statistics():
    model, features_of = _model(0)
    batch = np.random.default_rng(1).normal(size=(4, *SHAPE, 2)).astype(np.float32)
    forward = precisebn.make_forward(model, SHAPE)
    once = precisebn.measure(model, forward, [batch])
    thrice = precisebn.measure(model, forward, [batch] * 3)
    for a, b in zip(once, thrice):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_measuring_moves_nothing_and_puts_dropout_seeds_back():
    model, _ = _model(0, dropout=0.5)
    before = [v.numpy().copy() for v in model.non_trainable_variables]
    forward = precisebn.make_forward(model, SHAPE)
    batches = [np.ones((4, *SHAPE, 2), np.float32) * k for k in range(2)]
    precisebn.measure(model, forward, batches)
    after = [v.numpy() for v in model.non_trainable_variables]
    assert len(before) > 4  # the seed generator's state is among them
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_a_failing_batch_leaves_the_statistics_as_they_were():
    model, _ = _model(0)
    before = [v.numpy().copy() for v in model.non_trainable_variables]
    forward = precisebn.make_forward(model, SHAPE)

    def batches():
        yield np.ones((4, *SHAPE, 2), np.float32)
        raise OSError("chunk unreadable")

    with pytest.raises(OSError):
        precisebn.measure(model, forward, batches())
    for a, b in zip(before, [v.numpy() for v in model.non_trainable_variables]):
        np.testing.assert_array_equal(a, b)


def test_a_model_without_batchnorm_has_nothing_to_measure():
    inp = keras.Input((*SHAPE, 1))
    model = keras.Model(inp, keras.layers.GroupNormalization(groups=1)(inp))
    assert precisebn.batchnorm_layers(model) == []
    assert precisebn.measure(model, precisebn.make_forward(model, SHAPE),
                             [np.ones((2, *SHAPE, 1), np.float32)]) == []
