"""distseg/steps.py and distseg/checkpoint.py in one process: the learning-rate
schedule, the weight checksum, and a checkpoint that comes back as it was saved."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from distseg import checkpoint, steps
from distseg.config import smoke
from distseg.errors import InputError
from distseg.train import Schedule

keras = pytest.importorskip("keras")


@pytest.mark.parametrize("scaling, size, want", [
    ("linear", 1, 1e-3), ("linear", 16, 16e-3), ("sqrt", 16, 4e-3), ("none", 16, 1e-3),
])
def test_scaled_lr(scaling, size, want):
    assert steps.scaled_lr(1e-3, size, scaling) == pytest.approx(want, rel=1e-12)


def test_lr_warm_up_is_linear_then_flat():
    got = [steps.lr_at(s, 1.0, 5.0, 4) for s in range(7)]
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0]
    assert steps.lr_at(0, 1.0, 5.0, 0) == 5.0  # no warm-up: the scaled lr from step 0


def test_schedule_from_the_config():
    t = dataclasses.replace(smoke().train, warmup_epochs=0.5)  # batch 4, linear scaling
    sched = Schedule.of(t, train_samples=130, size=4)
    # 130 slices over 4 ranks: at most 33 per rank, in batches of 4 -> 9 steps;
    # half an epoch of warm-up rounds to 4 steps
    assert (sched.steps, sched.warmup_steps) == (9, 4)
    assert sched.lr_target == pytest.approx(4 * t.lr)
    assert [sched.lr(s) / t.lr for s in (0, 2, 4, 9)] == pytest.approx([1, 2.5, 4, 4])


def _tiny_state(seed):
    from distseg import model as model_lib
    keras.utils.set_random_seed(seed)
    model = model_lib.build_unet(16, depth=1, base_filters=2)
    opt = keras.optimizers.Adam(learning_rate=1e-3)
    opt.build(model.trainable_variables)
    for v in opt.variables:  # non-trivial optimizer state, so a load that skipped it shows
        v.assign(np.random.default_rng(seed).random(v.shape).astype(v.dtype))
    return model, opt


def test_weight_checksum_is_sum_and_sum_of_squares():
    model, opt = _tiny_state(0)
    values = np.concatenate([v.numpy().astype(np.float64).ravel() for v in model.weights])
    got = steps.weight_checksum(model.weights)
    np.testing.assert_allclose(got, [values.sum(), (values ** 2).sum()], rtol=1e-12)


def test_checkpoint_round_trip_and_rotation(tmp_path):
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    for epoch in (1, 2, 3):
        checkpoint.save(run_dir, epoch, model, opt, keep=2)
    ckdir = checkpoint.directory(run_dir)
    assert sorted(os.listdir(ckdir)) == [
        "epoch-0002.optimizer.npz", "epoch-0002.weights.h5",
        "epoch-0003.optimizer.npz", "epoch-0003.weights.h5", "latest.json"]
    saved = steps.weight_checksum(model.weights + opt.variables)

    other, other_opt = _tiny_state(2)  # different weights and optimizer state
    assert steps.weight_checksum(other.weights + other_opt.variables) != saved
    entry = checkpoint.latest(run_dir)
    assert checkpoint.load(entry, other, other_opt) == 3
    assert steps.weight_checksum(other.weights + other_opt.variables) == saved


def test_a_checkpoint_of_another_model_is_refused_with_one_line(tmp_path):
    from distseg import model as model_lib
    model, opt = _tiny_state(1)
    checkpoint.save(str(tmp_path), 1, model, opt, keep=1)
    bigger = model_lib.build_unet(16, depth=1, base_filters=4)
    with pytest.raises(InputError) as err:
        checkpoint.load(checkpoint.latest(str(tmp_path)), bigger)
    assert str(err.value).startswith(os.path.join(str(tmp_path), "checkpoints", "epoch-0001"))
    assert "\n" not in str(err.value)


def test_is_due():
    assert [checkpoint.is_due(d, 5, 2) for d in range(1, 6)] == [False, True, False, True, True]
    assert [checkpoint.is_due(d, 3, 0) for d in range(1, 4)] == [False, False, True]
