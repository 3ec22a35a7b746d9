"""The gradient noise scale (``distseg.training.noise``) and the norms the train step
feeds it."""

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
    assert noise.method == "ranks" and noise.record()["preconditioned"] is False


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


def test_the_one_rank_step_logs_one_norm_of_its_gradient():
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
    # The norm of the gradient the step applies, computed beside it from the same weights.
    grads = steps.loss_and_grads(model, tf.constant(images), tf.constant(masks),
                                 cfg.model.num_classes, cfg.train.loss)[2]
    want = float(steps.squared_norm(grads))
    got = step(images, masks, np.zeros(2, np.float32))[3].numpy()
    assert want > 0 and got[0] == got[1] == pytest.approx(want, rel=1e-4)
