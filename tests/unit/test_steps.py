"""distseg/training/step/steps.py and distseg/training/checkpoints/checkpoint.py in one process: the learning-rate
schedule, the weight checksum, and a checkpoint that comes back as it was saved."""

from __future__ import annotations

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.core import lr, rundir
from distseg.core.config import smoke
from distseg.core.errors import InputError
from distseg.training.checkpoints import checkpoint
from distseg.training.progress.plan import EpochPlan
from distseg.training.step import steps


@pytest.mark.parametrize("scaling, size, want", [
    ("linear", 1, 1e-3), ("linear", 16, 16e-3), ("sqrt", 16, 4e-3), ("none", 16, 1e-3),
])
def test_scaled_lr(scaling, size, want):
    assert 1e-3 * lr.batch_factor(scaling, size) == pytest.approx(want, rel=1e-12)


def test_lr_warm_up_is_linear_then_flat():
    got = [lr.warm_up(s, 1.0, 5.0, 4) for s in range(7)]
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0]
    assert lr.warm_up(0, 1.0, 5.0, 0) == 5.0  # no warm-up: the scaled lr from step 0


def test_schedule_from_the_config():
    t = dataclasses.replace(smoke().train, warmup_epochs=0.5)  # batch 4, linear scaling
    sched = EpochPlan.of(t, train_samples=130, size=4)
    # 130 slices over 4 ranks: at most 33 per rank, in batches of 4 -> 9 steps;
    # half an epoch of warm-up rounds to 4 steps
    assert (sched.steps, sched.warmup_steps) == (9, 4)
    assert sched.lr_target == pytest.approx(4 * t.lr)
    assert [lr.at(sched, s) / t.lr for s in (0, 2, 4, 9)] == pytest.approx([1, 2.5, 4, 4])


def test_a_chosen_batch_keeps_the_samples_of_an_epoch_and_its_shards_disjoint():
    t = dataclasses.replace(config_lib.default().train, max_steps_per_epoch=6)  # G = 8
    at_config = EpochPlan.of(t, train_samples=200, size=2)
    chosen = EpochPlan.of(t, train_samples=200, size=2, per_rank=8)
    assert (at_config.batch.per_rank, at_config.steps) == (4, 6)
    # 6 steps of 8 samples: 3 steps of 16 at the chosen batch
    assert (chosen.batch.global_batch, chosen.steps) == (16, 3)
    assert chosen.static_batch(200, 2) == 8
    ids = np.arange(200)
    shards = [chosen.batches(ids, r, 2, 0, 0)[:chosen.steps] for r in (0, 1)]
    seen = np.concatenate([b for shard in shards for b in shard])
    assert len(seen) == 48 == len(set(seen.tolist()))


@pytest.mark.parametrize("samples,size,batch,global_batch", [
    (96, 1, 8, 0), (96, 2, 8, 0), (97, 2, 8, 0), (130, 4, 4, 0), (7, 3, 1, 0), (96, 2, 4, 8),
    (100, 4, 4, 8)])
def test_a_static_batch_is_claimed_only_when_every_batch_has_it(samples, size, batch, global_batch):
    t = dataclasses.replace(smoke().train, batch_size=batch, global_batch=global_batch)
    sched = EpochPlan.of(t, train_samples=samples, size=size)
    ids = np.arange(samples)
    sizes = {len(b) for r in range(size) for e in range(2)
             for b in sched.batches(ids, r, size, e, 0)[:sched.steps]}
    static = sched.static_batch(samples, size)
    assert static == (sizes.pop() if len(sizes) == 1 else None)


def _tiny_state(seed):
    from distseg.networks import unet as model_lib
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


def _save(run_dir, model, opt, epoch, step=0, keep=2, seen=()):
    state = checkpoint.RankState(local=[v.numpy() for v in model.non_trainable_weights],
                                 seen=np.asarray(seen, np.int64), losses=[-0.5] * len(seen),
                                 losses_local=[-0.4] * len(seen))
    position = checkpoint.Position(epoch=epoch, step=step, global_step=10 * epoch + step, size=1)
    return checkpoint.write(run_dir, position, model, opt, [state], keep)


def test_checkpoint_round_trip_and_rotation(tmp_path):
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    for epoch in (1, 2, 3):
        _save(run_dir, model, opt, epoch)
    _save(run_dir, model, opt, 3, step=4, seen=[7, 9, 11])
    assert checkpoint.stems(rundir.checkpoint_dir(run_dir)) == ["epoch-0003", "epoch-0003-step-000004"]
    saved = steps.weight_checksum(model.weights + opt.variables)

    other, other_opt = _tiny_state(2)  # different weights and optimizer state
    assert steps.weight_checksum(other.weights + other_opt.variables) != saved
    entry, warnings = checkpoint.find(run_dir)
    assert warnings == [] and checkpoint.load(entry, other, other_opt) == 3
    assert steps.weight_checksum(other.weights + other_opt.variables) == saved
    pos = entry["position"]
    assert (pos.epoch, pos.step, pos.global_step, pos.size) == (3, 4, 34, 1)
    [rank0] = checkpoint.rank_states(checkpoint.read_state(entry), 1)
    assert rank0.seen.tolist() == [7, 9, 11] and rank0.losses == [-0.5] * 3


def test_a_manifest_from_before_the_training_state_was_named_resumes_its_state(tmp_path):
    # Checkpoints written before the rename keep the training state under "scaling".
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    stem = _save(run_dir, model, opt, 1)
    kept = {"noise": None, "progress": 2.5, "samples": 40, "global_batch": 4}
    with open(f"{stem}.json") as f:
        manifest = json.load(f)
    assert "training" in manifest and "scaling" not in manifest
    del manifest["training"]
    manifest["scaling"] = kept
    with open(f"{stem}.json", "w") as f:
        json.dump(manifest, f)
    entry, warnings = checkpoint.find(run_dir)
    assert warnings == [] and entry["position"].training == kept


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path):
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    _save(run_dir, model, opt, 1)
    stem = _save(run_dir, model, opt, 2)
    with open(f"{stem}.weights.h5", "r+b") as f:  # one changed byte
        f.seek(2000)
        byte = f.read(1)
        f.seek(2000)
        f.write(bytes([(byte[0] + 1) % 256]))
    entry, warnings = checkpoint.find(run_dir)
    assert entry["epoch"] == 1
    assert len(warnings) == 1 and "epoch-0002.weights.h5: missing or damaged" in warnings[0]
    os.remove(os.path.join(rundir.checkpoint_dir(run_dir), "epoch-0001.state.npz"))
    assert checkpoint.find(run_dir)[0] is None


@pytest.mark.parametrize("damage, words", [
    ([1.0, 2.0], "got 2"), ("damaged", "got something that is not a list of numbers")])
def test_a_damaged_noise_average_is_a_damaged_checkpoint(tmp_path, damage, words):
    # The manifest's noise-scale averages are checked as it is read: the newest
    # checkpoint, damaged there, is skipped for the one before, with one warning
    # naming the file and the field, and before anything is written.
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    _save(run_dir, model, opt, 1)
    stem = _save(run_dir, model, opt, 2)
    noise_state = {"preconditioned": [1.0, 2.0, 0.5], "raw": [1.0, 2.0, 0.5, 0.1, 1, 1, 1]}
    with open(f"{stem}.json") as f:
        manifest = json.load(f)
    manifest["training"] = {"noise": noise_state, "global_batch": 4}
    with open(f"{stem}.json", "w") as f:
        json.dump(manifest, f)
    entry, warnings = checkpoint.find(run_dir)
    assert entry["epoch"] == 2 and warnings == []  # 3 and 7 values: both readable
    noise_state["raw"] = damage
    with open(f"{stem}.json", "w") as f:
        json.dump(manifest, f)
    entry, warnings = checkpoint.find(run_dir)
    assert entry["epoch"] == 1 and len(warnings) == 1
    assert "epoch-0002.json: not a checkpoint manifest" in warnings[0]
    assert f"field training.noise.raw: expected a list of 3 or 7 numbers (a noise-scale average), {words}" in warnings[0]


def test_the_files_of_a_checkpoint_are_those_rundir_names(tmp_path):
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    stem = _save(run_dir, model, opt, 2, step=5, seen=[1])
    name = rundir.checkpoint_stem(2, 5)
    assert stem == os.path.join(rundir.checkpoint_dir(run_dir), name)
    assert sorted(os.listdir(rundir.checkpoint_dir(run_dir))) == sorted(
        [rundir.checkpoint_file(name, k) for k in rundir.CHECKPOINT_FILES]
        + [rundir.manifest_name(name), rundir.LATEST_CHECKPOINT])
    with open(rundir.latest_path(run_dir)) as f:
        assert json.load(f) == {"manifest": rundir.manifest_name(name), "epoch": 2, "step": 5}


def test_resuming_at_another_size_falls_back_to_the_epoch_boundary(tmp_path):
    from distseg.training.checkpoints import resume
    model, opt = _tiny_state(1)
    run_dir = str(tmp_path)
    _save(run_dir, model, opt, 1)
    state = checkpoint.RankState(local=[v.numpy() for v in model.non_trainable_weights])
    checkpoint.write(run_dir, checkpoint.Position(epoch=1, step=3, global_step=13, size=2),
                    model, opt, [state, state], keep=3)
    same, warnings = resume._find_for_size(run_dir, 2)
    assert same["position"].step == 3 and warnings == []
    entry, warnings = resume._find_for_size(run_dir, 1)
    assert entry["manifest"] == os.path.join(rundir.checkpoint_dir(run_dir),
                                             rundir.manifest_name(rundir.checkpoint_stem(1)))
    assert len(warnings) == 1 and "(3 steps redone)" in warnings[0]


def test_a_checkpoint_of_another_model_is_refused_with_one_line(tmp_path):
    from distseg.networks import unet as model_lib
    model, opt = _tiny_state(1)
    _save(str(tmp_path), model, opt, 1)
    bigger = model_lib.build_unet(16, depth=1, base_filters=4)
    with pytest.raises(InputError) as err:
        checkpoint.load(checkpoint.latest(str(tmp_path)), bigger)
    assert str(err.value).startswith(os.path.join(rundir.checkpoint_dir(str(tmp_path)), "epoch-0001"))
    assert "\n" not in str(err.value)


def test_is_due():
    assert [checkpoint.is_due(d, 5, 2) for d in range(1, 6)] == [False, True, False, True, True]
    assert [checkpoint.is_due(d, 3, 0) for d in range(1, 4)] == [False, False, True]


def _adam_runs(apply, model_seed=4, steps_=6):
    """Weights and optimizer state after ``steps_`` updates of a tiny U-Net's Adam by
    ``apply(optimizer, grads, variables)`` inside a tf.function, the learning rate
    changed half way (as the warm-up changes it)."""
    import tensorflow as tf

    from distseg.networks import unet as model_lib
    keras.utils.set_random_seed(model_seed)
    model = model_lib.build_unet(16, depth=1, base_filters=2)
    opt = keras.optimizers.Adam(learning_rate=1e-2)
    opt.build(model.trainable_variables)
    rng = np.random.default_rng(1)
    grads = [[tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in model.trainable_variables]
             for _ in range(steps_)]
    update = tf.function(lambda g: apply(opt, g, model.trainable_variables), autograph=False)
    for k, g in enumerate(grads):
        if k == steps_ // 2:
            opt.learning_rate.assign(3e-3)
        update(g)
    return [v.numpy() for v in model.trainable_variables], [v.numpy() for v in opt.variables]


def test_the_fused_adam_makes_keras_adams_update():
    fused = _adam_runs(steps.apply_adam)
    keras_own = _adam_runs(lambda opt, g, vs: opt.apply_gradients(zip(g, vs)))
    for got, want in zip(fused[0] + fused[1], keras_own[0] + keras_own[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # float32 rounding
    assert int(fused[1][0]) == 6  # the iteration count moved as Keras' does
    assert not np.allclose(fused[0][0], _adam_runs(lambda *a: None)[0][0])  # it trained


def test_an_adam_with_other_settings_keeps_keras_own_update():
    assert steps._plain_adam(keras.optimizers.Adam(1e-3))
    for other in (keras.optimizers.Adam(1e-3, amsgrad=True), keras.optimizers.Adam(1e-3, clipnorm=1.0),
                  keras.optimizers.AdamW(1e-3), keras.optimizers.SGD(1e-3)):
        assert not steps._plain_adam(other)


def test_the_gain_rule_follows_the_measured_gain_and_warms_up_in_progress():
    import dataclasses

    from distseg.core import config as config_lib
    t = dataclasses.replace(config_lib.smoke().train, lr=1e-3, lr_scaling="gain",
                            warmup_epochs=1.0)
    four = EpochPlan.of(t, train_samples=64, size=4)  # b = 4, B = 16, base 4
    # One epoch of the base batch: 64 samples / 4 = 16 steps of progress.
    assert four.warmup_progress == 16.0 and four.lr_target == pytest.approx(2e-3)
    assert lr.at(four, 0, gain=4.0, progress=0.0) == pytest.approx(1e-3)
    assert lr.at(four, 0, gain=4.0, progress=8.0) == pytest.approx(1.5e-3)
    assert lr.at(four, 99, gain=4.0, progress=16.0) == pytest.approx(2e-3)  # x sqrt(4)
    assert lr.at(four, 99, gain=2.25, progress=40.0) == pytest.approx(1.5e-3)  # x sqrt(2.25)
    # One rank: the batch the lr was set for, so no gain enters.
    assert lr.at(EpochPlan.of(t, 64, 1), 5, gain=9.0, progress=100.0) == pytest.approx(1e-3)
    # The fixed rules ignore the gain.
    linear = EpochPlan.of(dataclasses.replace(t, lr_scaling="linear"), 64, 4)
    assert lr.at(linear, 99, gain=1.0, progress=0.0) == pytest.approx(4e-3)
