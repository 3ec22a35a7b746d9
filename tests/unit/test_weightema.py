"""The average of the weights (``--weight-ema``): its arithmetic, the model taking it
for validation and giving it back, and what a checkpoint keeps of it and gives back
through the parts' one hook (``modelparts.saved``/``restore``)."""

from __future__ import annotations

import numpy as np
import pytest

from distseg.core.errors import InputError
from distseg.training.epoch import modelparts, weightema


def _model():
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    return model


def _move(model, rng) -> None:
    for v in model.trainable_variables:
        v.assign(v.numpy() + rng.normal(size=v.shape).astype(np.float32))


@pytest.mark.parametrize("decay,step,want", [(0.95, 0, 0.1), (0.95, 10, 11 / 20),
                                             (0.95, 1000, 0.95), (0.2, 3, 0.2)])
def test_the_decay_starts_low_and_reaches_the_one_asked(decay, step, want):
    assert weightema.decay_at(decay, step) == pytest.approx(want)


def test_the_average_follows_applied_steps_only():
    rng = np.random.default_rng(0)
    model = _model()
    part = weightema.WeightAverage(model, 0.9)
    want = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    for step in range(30):
        _move(model, rng)
        skipped = step % 7 == 3
        part.on_step({"global_step": step, **({"skipped": True} if skipped else {})})
        if not skipped:
            d = weightema.decay_at(0.9, step)
            want = [d * a + (1 - d) * v.numpy() for a, v in zip(want, model.trainable_variables)]
    for a, w in zip(part.average, want):
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-5, atol=1e-6)


def _trained(seed: int):
    """A model moved 5 steps with its part following: (model, part, its live weights)."""
    rng = np.random.default_rng(seed)
    model = _model()
    part = weightema.WeightAverage(model, 0.9)
    for step in range(5):
        _move(model, rng)
        part.on_step({"global_step": step})
    return model, part, [v.numpy() for v in model.trainable_variables]


def test_the_model_holds_the_average_from_its_epoch_s_end_to_its_checkpoint():
    model, part, live = _trained(1)
    assert set(part.arrays()) == {f"{weightema.AVERAGE_KEY}{i}" for i in range(len(live))}

    part.before_validation()
    for v, a in zip(model.trainable_variables, part.average):
        np.testing.assert_array_equal(v.numpy(), a.numpy())
    kept = part.arrays()  # written now: the average, and the live weights beside it
    for i, value in enumerate(live):
        np.testing.assert_array_equal(kept[f"{weightema.LIVE_KEY}{i}"], value)
    assert weightema.arrays_of(weightema.LIVE_KEY, kept)[0] is kept[f"{weightema.LIVE_KEY}0"]

    part.after_checkpoint()
    for v, value in zip(model.trainable_variables, live):
        np.testing.assert_array_equal(v.numpy(), value)
    assert weightema.LIVE_KEY + "0" not in part.arrays()

    again = weightema.WeightAverage(model, 0.9, weightema.arrays_of(weightema.AVERAGE_KEY, kept))
    for a, b in zip(again.average, part.average):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _optimizer(model):
    import keras
    opt = keras.optimizers.Adam(learning_rate=1e-3)
    opt.build(model.trainable_variables)
    return opt


def test_a_resumed_run_gets_back_the_average_and_the_live_weights(tmp_path):
    """Saved through the parts' one hook while the model held the average (between an
    epoch's end and its checkpoint): the weights file (what predict reads) holds the
    average; resumed (``resume``'s load on rank 0, then the parts' ``restore``), the
    model holds the live weights again and a fresh part the same average."""
    from distseg.training.checkpoints import checkpoint, resume
    model, part, live = _trained(2)
    part.before_validation()
    average = [v.numpy() for v in model.trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(average, live))
    kept = modelparts.saved(modelparts.ordered(part))
    assert kept.states == {} and sorted(kept.arrays) == sorted(part.arrays())
    ranks = [checkpoint.RankState(local=[v.numpy() for v in model.non_trainable_weights])]
    checkpoint.write(str(tmp_path), checkpoint.Position(epoch=1, parts=kept.states), model,
                     _optimizer(model), ranks, keep=1, extra=kept.arrays)

    predicted = _model()
    checkpoint.load(checkpoint.latest(str(tmp_path)), predicted)
    for v, value in zip(predicted.trainable_variables, average):
        np.testing.assert_array_equal(v.numpy(), value)
    other = _model()
    _, _, _, _, resumed = resume._load_on_root(str(tmp_path), 1, other, _optimizer(other))
    assert not any(k.startswith(weightema.LIVE_KEY) for k in resumed.arrays)  # load's
    again = modelparts.ordered(weightema.WeightAverage(other, 0.9))
    modelparts.restore(again, resumed)
    for v, value in zip(other.trainable_variables, live):
        np.testing.assert_array_equal(v.numpy(), value)
    for a, b in zip(again[0].average, average):
        np.testing.assert_array_equal(a.numpy(), b)
    # An average of another model is refused naming the checkpoint's file.
    resumed.arrays = {f"{weightema.AVERAGE_KEY}0": live[0]}
    with pytest.raises(InputError, match=r"state.npz: the checkpoint's weight average holds 1"):
        modelparts.restore(again, resumed)


def test_a_checkpoint_of_another_model_is_refused_naming_the_counts():
    model = _model()
    with pytest.raises(ValueError, match="holds 1 variables, the model 4"):
        weightema.WeightAverage(model, 0.9, [np.zeros(3, np.float32)])


def test_the_decay_must_be_below_one():
    import dataclasses

    from distseg.core import config as config_lib
    from distseg.core.errors import InputError
    cfg = config_lib.resolve("smoke", None, {"data.path": "x.h5", "run_dir": "r"})
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, weight_ema=1.0))
    with pytest.raises(InputError, match=r"train.weight_ema.*must be in \[0, 1\)"):
        bad.validate()
