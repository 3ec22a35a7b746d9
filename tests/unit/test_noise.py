"""The gradient noise scale (``distseg.training.noise``) and the Adam preconditioning
of its norms (``distseg.training.steps.preconditioned``)."""

import numpy as np
import pytest

from distseg.training.noise import NoiseScale


@pytest.mark.parametrize("small,big", [(1, 8), (4, 8), (2, 16)])
def test_b_simple_recovers_the_noise_of_known_gradients(small, big):
    # Per-sample gradients G + noise with covariance sigma^2 I in d dimensions: the
    # true B_simple is d sigma^2 / |G|^2. Each step draws N = big/small "ranks" of
    # ``small`` samples and feeds the loop's two norms.
    rng = np.random.default_rng(0)
    d, sigma = 50, 0.5
    true_g = rng.normal(size=d)
    want = d * sigma**2 / float(true_g @ true_g)
    noise = NoiseScale(small, big)
    for _ in range(3000):
        ranks = [true_g + rng.normal(scale=sigma, size=(small, d)).mean(0) for _ in range(big // small)]
        mean = np.mean(ranks, axis=0)
        noise.update(float(np.mean([r @ r for r in ranks])), float(mean @ mean))
    assert noise.b_simple == pytest.approx(want, rel=0.15)
    assert noise.method == "ranks" and noise.record()["preconditioned"] == "adam"


def test_one_rank_estimates_nothing():
    noise = NoiseScale(8, 8)
    noise.update(2.0, 2.0)
    assert noise.b_simple is None and noise.record()["method"] == "none"


def test_non_finite_norms_are_skipped():
    noise = NoiseScale(1, 2)
    noise.update(3.0, 2.0)
    before = noise.record()
    noise.update(float("nan"), 1.0)
    assert noise.record() == before


def _model_and_adam():
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_preconditioning_divides_by_adams_bias_corrected_second_moments():
    import keras
    import tensorflow as tf

    from distseg.training import steps
    model, optimizer = _model_and_adam()
    variables = model.trainable_variables
    grads = [tf.ones_like(v) * (i + 1) for i, v in enumerate(variables)]
    # Before the first update Adam has no moments: the gradients are left as they are.
    first = steps.preconditioned(optimizer, grads, variables)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first, grads))
    seen = [tf.ones_like(v) * 0.1 * (i + 2) for i, v in enumerate(variables)]
    optimizer.apply_gradients(zip(seen, variables))
    out = steps.preconditioned(optimizer, grads, variables)
    # One update: v = (1 - beta2) g0^2, bias-corrected back to g0^2.
    for g, g0, got in zip(grads, seen, out):
        want = g.numpy() / (np.abs(g0.numpy()) + optimizer.epsilon)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4)
    # An optimizer without second moments: raw gradients.
    sgd = keras.optimizers.SGD(0.1)
    sgd.build(variables)
    assert all(np.array_equal(a.numpy(), b.numpy())
               for a, b in zip(steps.preconditioned(sgd, grads, variables), grads))


def test_the_one_rank_step_logs_one_preconditioned_norm():
    import dataclasses

    import keras
    import tensorflow as tf

    from distseg.core import config as config_lib
    from distseg.networks import unet
    from distseg.training import steps
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=2, image_size=16))
    model = unet.from_config(cfg.model)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    size = cfg.model.image_size
    step = steps.make_train_step(model, optimizer, (size, size), cfg.model.num_classes,
                                 cfg.train.loss, ranks=1, batch=2)
    rng = np.random.default_rng(0)
    images = rng.random((2, size, size, 1), dtype=np.float32)
    masks = (images[..., 0] > 0.5).astype(np.uint8)
    norms = [step(images, masks, np.zeros(2, np.float32))[3].numpy() for _ in range(3)]
    assert all(n[0] == n[1] > 0 for n in norms)
    # From the second step on, Adam's moments scale the gradients up (|g|/sqrt(v) ~ 1
    # per weight, against raw gradients far below 1).
    grads = steps.loss_and_grads(model, tf.constant(images), tf.constant(masks),
                                 cfg.model.num_classes, cfg.train.loss)[2]
    assert norms[1][0] > 10 * float(steps.squared_norm(grads))
