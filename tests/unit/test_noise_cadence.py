"""The noise scale's cadence (``noise.Cadence``, ``--noise-every``): which steps measure,
how ``auto`` picks the cadence from the two kinds of step's times, averages that keep
their horizon in samples at any cadence, and the train step measuring (and halving)
only where told, traced once for every kind of step."""

import dataclasses
import math

import numpy as np
import pytest

from distseg.training.progress import noise as noise_lib
from distseg.training.progress.noise import KEEP, MEASURE, SKIP, Cadence, NoiseScale


@pytest.mark.parametrize("every,want", [
    (1, [MEASURE] * 6),
    (2, [MEASURE, KEEP] * 3),
    (3, [MEASURE, SKIP, KEEP] * 2),
    (4, [MEASURE, SKIP, SKIP, KEEP, MEASURE, SKIP]),
])
def test_every_kth_step_measures_and_the_one_before_keeps_its_gradient(every, want):
    assert [noise_lib.mode_of(step, every) for step in range(6)] == want


@pytest.mark.parametrize("measured,plain,want", [
    (0.108, 0.100, 8),      # 8 ms over 100 ms: every 8th step costs 1 %
    (0.1081, 0.100, 9),     # a little more: one step further apart
    (0.100, 0.100, 1),      # no extra time: every step
    (0.090, 0.100, 1),      # measuring steps timed faster (noise): every step
    (0.300, 0.100, noise_lib.MOST_EVERY),  # capped
])
def test_auto_takes_the_smallest_cadence_within_the_cost_share(measured, plain, want):
    every = noise_lib.every_for(measured, plain)
    assert every == want
    if 1 < every < noise_lib.MOST_EVERY:
        extra = measured - plain
        assert extra / every <= noise_lib.COST_SHARE * plain * (1 + 1e-9)
        assert extra / (every - 1) > noise_lib.COST_SHARE * plain


def test_auto_decides_once_both_kinds_are_timed():
    cadence = Cadence.of(0)
    assert cadence.auto and cadence.every == noise_lib.FIRST_EVERY
    cadence.observe(MEASURE, None)  # the launch's first step traced: not timed
    # Steps FIRST_EVERY and 2 FIRST_EVERY are the first two timed measuring steps.
    for step in range(1, 2 * noise_lib.FIRST_EVERY + 1):
        assert not cadence.ready
        mode = cadence.mode(step)
        cadence.observe(mode, 0.2 if mode == MEASURE else 0.1)
    assert cadence.ready and cadence.medians() == (0.2, 0.1)
    decision = cadence.decide(0.2, 0.1, global_step=17)
    assert decision["every"] == cadence.every == noise_lib.MOST_EVERY
    assert decision["share"] == pytest.approx(0.1 / noise_lib.MOST_EVERY / 0.1)
    assert not cadence.ready  # decided for the launch
    cadence.observe(MEASURE, 5.0)
    assert cadence.record() == {"every": noise_lib.MOST_EVERY, "auto": True, "steers": False,
                                "decision": decision}


def test_a_checkpoint_keeps_an_auto_decision_and_a_fixed_cadence_stays():
    decided = Cadence.of(0)
    decided.decide(0.108, 0.1, global_step=12)
    resumed = Cadence.of(0)
    resumed.restore(decided.record())
    assert resumed.record() == decided.record() and resumed.every == 8 and not resumed.ready
    undecided = Cadence.of(0)
    undecided.restore(Cadence.of(0).record())  # stopped before deciding: decides again
    assert undecided.every == noise_lib.FIRST_EVERY and undecided.decision is None
    fixed = Cadence.of(5)
    fixed.restore(decided.record())  # --noise-every 5 given: it stays
    assert fixed.every == 5 and fixed.decision is None


@pytest.mark.parametrize("changes", [{"lr_scaling": "gain"}, {"grown_lr_scaling": "adascale"},
                                     {"batch_policy": "goodput"}])
def test_auto_measures_every_step_where_the_estimate_steers_training(changes):
    from distseg.core import config as config_lib
    from distseg.training.progress.state import TrainingState
    cfg = dataclasses.replace(config_lib.demo().train, **changes)
    cadence = TrainingState.initial(cfg, train_samples=64, ranks=2).cadence
    for step in range(40):
        assert cadence.mode(step) == MEASURE
        cadence.observe(MEASURE, 0.1)
    assert cadence.steers and not cadence.ready and cadence.every == 1


def test_a_fixed_cadence_never_decides():
    cadence = Cadence.of(3)
    for step in range(40):
        cadence.observe(cadence.mode(step), 0.1)
    assert not cadence.ready and cadence.every == 3 and cadence.record()["decision"] is None


def test_sparse_estimates_keep_the_averages_horizon_in_samples():
    # The same norms fed every step, or every 5th standing for 5 steps: the averages'
    # weight (their bias correction, 1 - the product of the decays) is the same.
    every, dense, sparse = 5, NoiseScale(4, 8, base=8), NoiseScale(4, 8, base=8)
    for step in range(200):
        dense.update(3.0, 2.0, 3.0, 2.0)
        if step % every == 0:
            sparse.update(3.0, 2.0, 3.0, 2.0, steps=every)
    for kind in noise_lib.KINDS:
        assert sparse.averages[kind].weight == pytest.approx(dense.averages[kind].weight, rel=1e-12)
        assert sparse.averages[kind].b_simple == pytest.approx(dense.averages[kind].b_simple)


def test_the_training_state_feeds_only_measured_steps():
    from distseg.core import config as config_lib
    from distseg.training.progress.state import TrainingState
    cfg = dataclasses.replace(config_lib.demo().train, noise_every=3)
    state = TrainingState.initial(cfg, train_samples=64, ranks=1)
    assert state.cadence.every == 3 and not state.cadence.auto
    state.observe(None, applied=True, seconds=0.1, mode=SKIP)
    assert state.noise.averages["raw"].weight == 0
    state.observe([3.0, 2.0, 3.0, 2.0], applied=True, seconds=0.1, mode=MEASURE)
    n = state.noise  # the samples a measured step's estimate covers, 3 times
    want = 1 - noise_lib.DECAY ** (n.gradient_samples * n.count * 3 / n.base)
    assert state.noise.averages["raw"].weight == pytest.approx(want)
    assert state.epoch_fields(4, None)["noise_scale"]["cadence"]["every"] == 3


def _model(norm: str, ghost: int, size: int = 16):
    from distseg.core import config as config_lib
    from distseg.networks import unet
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, num_classes=2, image_size=size, norm=norm, bn_ghost_batch=ghost))
    return cfg, unet.from_config(cfg.model)


def _batches(count: int, batch: int, size: int):
    rng = np.random.default_rng(0)
    for _ in range(count):
        images = rng.random((batch, size, size, 1), dtype=np.float32)
        yield images, (images[..., 0] > 0.5).astype(np.uint8)


@pytest.mark.parametrize("norm,ghost,halved", [("batch", 2, True), ("batch", 0, False)],
                         ids=["halves", "consecutive"])
def test_the_step_measures_only_where_told_traced_once(norm, ghost, halved):
    # Two copies of a model, one step measuring every step, the other every 3rd: the
    # same updates (halves round differently from one pass: float32 tolerance), norms
    # only on the told steps, and one trace for every kind of step.
    import keras

    from distseg.training.step import steps
    cfg, model = _model(norm, ghost)
    _, other = _model(norm, ghost)
    other.set_weights(model.get_weights())
    size, c, batch = cfg.model.image_size, cfg.model.num_classes, 4
    every = steps.make_train_step(model, keras.optimizers.SGD(0.05), (size, size), c,
                                  cfg.train.loss, batch=batch)
    sparse = steps.make_train_step(other, keras.optimizers.SGD(0.05), (size, size), c,
                                   cfg.train.loss, batch=batch)
    assert every.gradients_per_rank == sparse.gradients_per_rank == (2 if halved else 1)
    flags = np.zeros(2, np.float32)
    for step, (images, masks) in enumerate(_batches(7, batch, size)):
        mode = noise_lib.mode_of(step, 3)
        sparse.noise_mode.assign(mode)
        want, got = every(images, masks, flags), sparse(images, masks, flags)
        np.testing.assert_allclose(float(got.loss), float(want.loss), rtol=1e-5)
        norms = got.grad_sq.numpy()
        if mode == MEASURE and (halved or step > 0):
            # The consecutive estimator at step 3: step 2 kept its gradient (KEEP).
            np.testing.assert_allclose(norms, want.grad_sq.numpy(), rtol=1e-3)
        else:
            assert np.isnan(norms).all(), (step, mode, norms)
    assert sparse.experimental_get_tracing_count() == 1
    for x, y in zip(model.variables, other.variables):  # weights and moving statistics
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_a_skipped_step_forgets_the_consecutive_estimators_gradient():
    import keras

    from distseg.training.step import steps
    cfg, model = _model("batch", 0)
    size, c = cfg.model.image_size, cfg.model.num_classes
    step = steps.make_train_step(model, keras.optimizers.SGD(0.05), (size, size), c,
                                 cfg.train.loss, batch=4)
    flags = np.zeros(2, np.float32)
    got = []
    for mode, (images, masks) in zip([KEEP, SKIP, MEASURE, MEASURE], _batches(4, 4, size)):
        step.noise_mode.assign(mode)
        got.append(step(images, masks, flags).grad_sq.numpy())
    assert np.isnan(got[2]).all()  # the step before it kept nothing: nothing to compare
    assert all(math.isfinite(v) for v in got[3])


@pytest.mark.parametrize("given,want", [("auto", 0), ("1", 1), ("12", 12)])
def test_the_flag_takes_a_count_or_auto(given, want):
    from distseg.cli.train import EveryType
    assert EveryType().convert(given, None, None) == want


@pytest.mark.parametrize("given,says", [("often", "neither a whole number nor 'auto'"),
                                        ("-2", "must be >= 1 (or auto)"),
                                        ("2.5", "neither a whole number nor 'auto'")])
def test_the_flag_refuses_anything_else_in_one_line(given, says):
    import click

    from distseg.cli.train import EveryType
    with pytest.raises(click.BadParameter, match=says.replace("(", r"\(").replace(")", r"\)")):
        EveryType().convert(given, None, None)


@pytest.mark.parametrize("changes,want", [({}, SKIP), ({"noise_every": 1}, MEASURE),
                                          ({"noise_every": 5}, SKIP),
                                          ({"lr_scaling": "gain"}, MEASURE)],
                         ids=["auto", "every-step", "every-5th", "steering"])
def test_a_trial_times_the_kind_of_step_the_run_mostly_takes(changes, want):
    from distseg.core import config as config_lib
    from distseg.training.startup import timedsteps
    cfg = config_lib.demo()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))
    assert timedsteps.usual_noise_mode(cfg) == want


def test_a_timed_step_runs_in_the_trial_s_kind_and_put_back_measures_again():
    import keras

    from distseg.training.startup import timedsteps
    from distseg.training.step import steps
    cfg, model = _model("batch", 2)
    size, c = cfg.model.image_size, cfg.model.num_classes
    optimizer = keras.optimizers.SGD(0.05)
    step = steps.make_train_step(model, optimizer, (size, size), c, cfg.train.loss, batch=4)
    candidate = timedsteps.Candidate.of((model, optimizer, None), SKIP)
    candidate.step = step
    seen = []
    images, masks = next(_batches(1, 4, size))
    for _ in range(2):
        timedsteps.timed_step(candidate, (images, masks, 4), "the test", "a step",
                         lambda: seen.append(int(step.noise_mode.numpy())))
    assert seen == [SKIP, SKIP]
    timedsteps.put_back(candidate)
    assert int(step.noise_mode.numpy()) == MEASURE
    for v, kept in zip(candidate.variables, candidate.kept):
        np.testing.assert_array_equal(np.asarray(v), kept)
