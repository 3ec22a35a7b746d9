"""The gradient noise scale (``distseg.training.progress.noise``) and the norms the train step
feeds it: known noise recovered by both methods, the preconditioner as Adam's own, the
gain, the bias-corrected averages, resume."""

import dataclasses

import numpy as np
import pytest

from distseg.core.errors import InputError
from distseg.training.progress import noise as noise_lib
from distseg.training.progress.noise import NoiseScale


def _draws(rng, true_g, sigma, small, ranks):
    """``ranks`` gradients, each the mean of ``small`` per-sample gradients G + noise."""
    return [true_g + rng.normal(scale=sigma, size=(small, true_g.size)).mean(0)
            for _ in range(ranks)]


def _norms(grads, scale):
    """The step's four norms of ``grads`` (one per rank), the preconditioned ones after
    dividing every gradient by ``scale``."""
    mean = np.mean(grads, axis=0)
    pre = [g / scale for g in grads]
    return (float(np.mean([g @ g for g in grads])), float(mean @ mean),
            float(np.mean([g @ g for g in pre])), float((mean / scale) @ (mean / scale)))


@pytest.mark.parametrize("small,big", [(1, 8), (4, 8), (2, 16)])
def test_b_simple_recovers_the_noise_of_known_gradients(small, big):
    # Per-sample gradients G + noise with covariance sigma^2 I in d dimensions: the
    # true B_simple is d sigma^2 / |G|^2. Preconditioning by a constant scale c leaves
    # B_simple as it is (both terms are divided by c^2).
    rng = np.random.default_rng(0)
    d, sigma = 50, 0.5
    true_g = rng.normal(size=d)
    want = d * sigma**2 / float(true_g @ true_g)
    noise = NoiseScale(small, big, base=small)
    for _ in range(3000):
        noise.update(*_norms(_draws(rng, true_g, sigma, small, big // small), 3.0))
    record = noise.record()
    assert record["b_simple"] == pytest.approx(want, rel=0.15)
    assert record["b_simple_raw"] == pytest.approx(want, rel=0.15)
    assert record["g2_raw"] == pytest.approx(9.0 * record["g2"], rel=1e-9)
    assert noise.method == "ranks" and record["preconditioned"] is True


def test_preconditioning_weighs_each_coordinate_by_its_scale():
    # Noise only in the first half of the coordinates, the true gradient only in the
    # second: dividing the noisy half by 10 lowers B_simple 100-fold.
    rng = np.random.default_rng(1)
    d = 40
    true_g = np.r_[np.zeros(d // 2), np.ones(d // 2)]
    scale = np.r_[np.full(d // 2, 10.0), np.ones(d // 2)]
    noise = NoiseScale(1, 4, base=1)
    for _ in range(4000):
        grads = [true_g + np.r_[rng.normal(size=d // 2), np.zeros(d // 2)] for _ in range(4)]
        noise.update(*_norms(grads, scale))
    record = noise.record()
    assert record["b_simple_raw"] == pytest.approx(d / 2 / (d / 2), rel=0.15)
    assert record["b_simple"] == pytest.approx(record["b_simple_raw"] / 100, rel=0.15)


def test_one_rank_differences_consecutive_gradients():
    # The loop feeds a one-rank run the norms of this and the last gradient (count 2):
    # the same noise as two ranks of the same batch.
    rng = np.random.default_rng(2)
    d, sigma, small = 30, 1.0, 4
    true_g = rng.normal(size=d)
    want = d * sigma**2 / float(true_g @ true_g)
    noise = NoiseScale(small, small, base=small)
    assert noise.method == "consecutive" and noise.count == 2
    noise.update(*[float("nan")] * 4)  # a launch's first step: no last gradient
    assert noise.b_simple is None
    last = _draws(rng, true_g, sigma, small, 1)[0]
    for _ in range(3000):
        now = _draws(rng, true_g, sigma, small, 1)[0]
        noise.update(*_norms([last, now], 1.0))
        last = now
    assert noise.b_simple == pytest.approx(want, rel=0.15)


def test_the_averages_are_bias_corrected_and_decay_per_base_samples():
    noise = NoiseScale(2, 8, base=8)
    noise.update(5.0, 2.0, 5.0, 2.0)
    g2, tr_sigma = noise_lib.estimates(5.0, 2.0, 2, 4)
    # One step: the corrected average is that step's estimate, whatever the decay.
    assert noise.averages["raw"].g2 == pytest.approx(g2)
    assert noise.averages["raw"].tr_sigma == pytest.approx(tr_sigma)
    noise.update(7.0, 3.0, 7.0, 3.0)
    g2b, tr_sigma_b = noise_lib.estimates(7.0, 3.0, 2, 4)
    decay = noise_lib.DECAY ** (8 / 8)
    want = (decay * (1 - decay) * g2 + (1 - decay) * g2b) / (decay * (1 - decay) + (1 - decay))
    assert noise.averages["raw"].g2 == pytest.approx(want)
    half = NoiseScale(2, 8, base=16)  # a step of 8 samples decays half as much
    half.update(5.0, 2.0, 5.0, 2.0)
    half.update(7.0, 3.0, 7.0, 3.0)
    d = noise_lib.DECAY ** 0.5
    assert half.averages["raw"].g2 == pytest.approx(
        (d * (1 - d) * g2 + (1 - d) * g2b) / (d * (1 - d) + (1 - d)))


def test_gain_runs_from_one_to_the_batch_ratio():
    noise = NoiseScale(1, 8, base=8)
    assert noise.gain(64) == 1.0  # nothing measured yet
    noise.averages["preconditioned"] = noise_lib.Average(1.0, 80.0, 1.0)  # |G|^2 1, tr 80
    # B_noise = 80: gain(S) = (80/8 + 1) / (80/64 + 1) = 11 / 2.25.
    assert noise.gain(64) == pytest.approx(11 / 2.25)
    assert noise.gain(8) == pytest.approx(1.0)
    noise.averages["preconditioned"] = noise_lib.Average(0.0, 80.0, 1.0)  # pure noise
    assert noise.gain(64) == pytest.approx(8.0)


def test_non_finite_norms_are_skipped_and_state_resumes_exactly():
    noise = NoiseScale(1, 2, base=2)
    noise.update(3.0, 2.0, 3.0, 2.0)
    before = noise.record()
    noise.update(float("nan"), 1.0, 1.0, 1.0)
    assert noise.record() == before
    again = NoiseScale(1, 2, base=2)
    again.restore(noise.state())
    for n in (noise, again):
        n.update(4.0, 2.5, 4.0, 2.5)
    assert again.record() == noise.record()
    fresh = NoiseScale(1, 2, base=2)
    fresh.restore(None)
    assert fresh.b_simple is None


def _replicate(rng, updates, true_g, sigma, small=2, ranks=4, steps=1):
    """One run's ``NoiseScale`` after ``updates`` measured steps of known noise."""
    noise = NoiseScale(small, small * ranks, base=small * ranks)
    for _ in range(updates):
        noise.update(*_norms(_draws(rng, true_g, sigma, small, ranks), 1.0), steps=steps)
    return noise


@pytest.mark.parametrize("sigma,updates,steps,open_above", [
    (2.0, 30, 1, (0.0, 0.0)), (6.0, 60, 8, (0.0, 0.05)), (10.0, 60, 1, (0.25, 0.6))])
def test_the_b_simple_interval_covers_the_true_noise_scale_in_90_percent_of_runs(
        sigma, updates, steps, open_above):
    # 300 runs of the same known noise, from precise (sigma 2) to |G|^2 hardly told
    # from 0 (sigma 10: many intervals have no upper bound, and a few runs no B_simple
    # at all, which log no interval either). About 90 % of the intervals logged
    # contain the true B_simple, and the effective steps are the worth of the moving
    # average's weights.
    rng = np.random.default_rng(7)
    true_g = rng.normal(size=30)
    want = 30 * sigma**2 / float(true_g @ true_g)
    runs = [_replicate(rng, updates, true_g, sigma, steps=steps).averages["preconditioned"]
            for _ in range(300)]
    assert [a.b_simple_interval() is None for a in runs] == [a.b_simple is None for a in runs]
    runs = [a for a in runs if a.b_simple is not None]
    intervals = [a.b_simple_interval() for a in runs]
    inside = [lo <= want and (hi is None or want <= hi) for lo, hi in intervals]
    assert 0.85 <= np.mean(inside) <= 0.96
    assert open_above[0] <= np.mean([hi is None for _, hi in intervals]) <= open_above[1]
    assert all(lo <= a.b_simple and (hi is None or a.b_simple <= hi)
               for a, (lo, hi) in zip(runs, intervals))
    decay = noise_lib.DECAY ** steps
    weights = (1 - decay) * decay ** np.arange(updates)
    n = [a.effective_steps for a in runs]
    assert n == pytest.approx([weights.sum() ** 2 / (weights ** 2).sum()] * len(runs), rel=1e-9)


@pytest.mark.parametrize("dof,exact", [(2, 2.920), (3, 2.353), (5, 2.015), (10, 1.812), (30, 1.697)])
def test_t_quantile_is_students_at_the_intervals_level(dof, exact):
    assert noise_lib.t_quantile(noise_lib.INTERVAL_Z, dof) == pytest.approx(exact, rel=0.015)


def test_the_interval_needs_three_effective_steps_and_a_known_spread():
    noise = NoiseScale(1, 2, base=2)
    noise.update(3.0, 2.0, 3.0, 2.0)
    assert noise.record()["effective_steps"] == pytest.approx(1.0)
    assert noise.record()["b_simple_low"] is None and noise.record()["b_simple_high"] is None
    for small, big in ((4.0, 2.5), (3.2, 2.1)):
        noise.update(small, big, small, big)
    assert noise.record()["effective_steps"] < 3 and noise.record()["b_simple_low"] is None
    noise.update(3.5, 2.0, 3.5, 2.0)
    record = noise.record()
    assert 0 <= record["b_simple_low"] <= record["b_simple"]
    # A checkpoint from before 2026-11-28 kept 3 values per average: B_simple goes on
    # exactly, its spread is not known.
    old = {k: v[:3] for k, v in noise.state().items()}
    again = NoiseScale(1, 2, base=2)
    again.restore(old)
    for n in (noise, again):
        n.update(5.0, 3.0, 5.0, 3.0)
    assert again.record()["b_simple"] == noise.record()["b_simple"]
    assert again.record()["b_simple_low"] is None and again.record()["effective_steps"] is None
    with pytest.raises(InputError, match=r"^field training\.noise\.preconditioned: expected a list of 3 "
                       r"or 7 numbers \(a noise-scale average\), got 4$"):
        again.restore({k: [1.0, 2.0, 3.0, 4.0] for k in noise_lib.KINDS})
    with pytest.raises(InputError, match="got something that is not a list of numbers"):
        again.restore({k: "damaged" for k in noise_lib.KINDS})


def _smoke_model(num_classes=2, size=16, **model):
    """The smoke U-Net, with ``model`` fields (``norm``, ``bn_ghost_batch``) over it."""
    from distseg.core import config as config_lib
    from distseg.networks import unet
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, num_classes=num_classes, image_size=size, **model))
    return cfg, unet.from_config(cfg.model)


def test_the_one_rank_step_logs_the_norms_of_its_last_two_gradients():
    import keras
    import tensorflow as tf

    from distseg.training.step import steps
    cfg, model = _smoke_model()
    optimizer = keras.optimizers.Adam(1e-3)
    size = cfg.model.image_size
    step = steps.make_train_step(model, optimizer, (size, size), cfg.model.num_classes,
                                 cfg.train.loss, ranks=1, batch=2)
    rng = np.random.default_rng(0)
    batches = [rng.random((2, size, size, 1), dtype=np.float32) for _ in range(2)]
    grads, got = [], []
    for images in batches:
        masks = (images[..., 0] > 0.5).astype(np.uint8)
        # The gradient the step applies, computed beside it from the same weights.
        grads.append([np.asarray(g) for g in steps.loss_and_grads(
            model, tf.constant(images), tf.constant(masks), cfg.model.num_classes,
            cfg.train.loss)[2]])
        got.append(step(images, masks, np.zeros(2, np.float32)).grad_sq.numpy())
    assert np.isnan(got[0]).all()  # no last gradient yet
    sq = [sum(float((g ** 2).sum()) for g in gs) for gs in grads]
    mean = sum(float((((a + b) / 2) ** 2).sum()) for a, b in zip(*grads))
    # Adam has taken fewer than PRECONDITION_AFTER steps: preconditioned == raw.
    np.testing.assert_allclose(got[1], [(sq[0] + sq[1]) / 2, mean] * 2, rtol=1e-4)


def test_the_preconditioner_is_adams_bias_corrected_second_moment():
    import keras
    import tensorflow as tf

    from distseg.training.step import steps
    cfg, model = _smoke_model()
    variables = model.trainable_variables
    optimizer = keras.optimizers.Adam(1e-3, epsilon=1e-7)
    rng = np.random.default_rng(3)
    for _ in range(noise_lib.PRECONDITION_AFTER + 2):
        steps.apply_adam(optimizer, [tf.constant(rng.normal(size=v.shape), tf.float32)
                                     for v in variables], variables)
    grads = [rng.normal(size=v.shape).astype(np.float32) for v in variables]
    t = int(optimizer.iterations.numpy())
    want = 0.0
    for g, v in zip(grads, variables):
        vel = np.asarray(optimizer._velocities[optimizer._get_variable_index(v)])
        want += float(((g / (np.sqrt(vel / (1 - 0.999 ** t)) + 1e-7)) ** 2).sum())
    got = float(steps.preconditioned_sq(optimizer, [tf.constant(g) for g in grads], variables))
    assert got == pytest.approx(want, rel=1e-4)
    assert got != pytest.approx(sum(float((g ** 2).sum()) for g in grads), rel=1e-2)


def test_one_rank_halves_recover_known_noise():
    # A one-rank step that takes its batch of 8 as two halves (parts 2) feeds the norms
    # of the halves: the same estimate as two ranks of 4.
    rng = np.random.default_rng(3)
    d, sigma, batch = 30, 1.0, 8
    true_g = rng.normal(size=d)
    want = d * sigma**2 / float(true_g @ true_g)
    noise = NoiseScale(batch, batch, base=batch, gradients_per_rank=2)
    assert (noise.method, noise.gradient_samples, noise.count) == ("halves", 4, 2)
    for _ in range(3000):
        noise.update(*_norms(_draws(rng, true_g, sigma, batch // 2, 2), 1.0))
    assert noise.b_simple == pytest.approx(want, rel=0.15)
    assert noise.record()["small_batch"] == 4


def _model(norm: str, ghost: int = 0):
    return _smoke_model(norm=norm, bn_ghost_batch=ghost)


@pytest.mark.parametrize("norm,ghost,batch,want", [
    ("group", 0, 8, True), ("group", 0, 7, False), ("group", 0, None, False),
    ("batch", 2, 8, True), ("batch", 4, 8, True), ("batch", 4, 4, False),
    ("batch", 0, 8, False)])
def test_a_step_halves_only_where_no_layer_mixes_the_halves(norm, ghost, batch, want):
    from distseg.training.step import steps
    _, model = _model(norm, ghost)
    assert steps.can_halve(model, batch) is want


def _halves_gradients(model, images, masks, c: int, loss: str) -> list:
    """Each half's gradient (flat), computed apart from the step: the surrogate of its
    part against the whole batch's sums (``losses.surrogate``)."""
    import tensorflow as tf

    from distseg import losses
    from distseg.training.step import steps
    out = []
    for mine in (0, 1):
        with tf.GradientTape() as tape:
            sums = [losses.loss_sums(model(images[s], training=True), tf.constant(masks[s]), c)
                    for s in (slice(0, 2), slice(2, 4))]
            total = tf.stop_gradient(sums[0] + sums[1])
            surrogate = losses.surrogate(sums[mine], total, c, loss, 2)
        out.append(steps.flat(tape.gradient(surrogate, model.trainable_variables)).numpy())
    return out


@pytest.mark.parametrize("norm,ghost", [("group", 0), ("batch", 1)])
def test_the_halved_step_trains_as_one_pass_and_measures_its_halves(norm, ghost):
    import keras

    from distseg.training.step import steps
    cfg, model = _model(norm, ghost)
    _, other = _model(norm, ghost)
    _, probe = _model(norm, ghost)
    for m in (other, probe):
        m.set_weights(model.get_weights())
    size, c, batch = cfg.model.image_size, cfg.model.num_classes, 4
    # SGD: Adam's first steps turn a gradient's rounding into up to its lr per weight.
    opts = [keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)]
    halved = steps.make_train_step(model, opts[0], (size, size), c, cfg.train.loss, batch=batch)
    whole = steps.make_train_step(other, opts[1], (size, size), c, cfg.train.loss, batch=batch,
                                  halves=False)
    assert (halved.gradients_per_rank, whole.gradients_per_rank) == (2, 1)
    rng = np.random.default_rng(0)
    for k in range(3):
        images = rng.random((batch, size, size, 1), dtype=np.float32)
        masks = (images[..., 0] > 0.5).astype(np.uint8)
        got = halved(images, masks, np.zeros(2, np.float32))
        ref = whole(images, masks, np.zeros(2, np.float32))
        np.testing.assert_allclose(float(got.loss), float(ref.loss), rtol=1e-5)
        if k == 0:  # not Adam: preconditioned == raw
            a, b = _halves_gradients(probe, images, masks, c, cfg.train.loss)
            want = [(a @ a + b @ b) / 2, ((a + b) / 2) @ ((a + b) / 2)] * 2
            np.testing.assert_allclose(got.grad_sq.numpy(), want, rtol=1e-4)
            assert np.isnan(ref.grad_sq.numpy()).all()  # no last gradient yet
    for x, y in zip(model.variables, other.variables):  # weights and moving statistics
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
