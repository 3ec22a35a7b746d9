"""``distseg.training.epoch.modelparts``: the parts that change the model come in ``ORDER``
whatever order they are opened in, and are saved and restored through one hook. The
parts here are the real ones (the average of the weights, the best checkpoint's
choice) on a tiny Keras model; the order of their hooks in the loop is
tests/unit/test_loop_events.py's."""

from __future__ import annotations

import numpy as np
import pytest

from distseg.core.errors import InputError
from distseg.training.epoch import bestcheckpoint, modelparts, weightema


def _model():
    import keras
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


class Named(modelparts.ModelPart):
    """A part of a given key and arrays (the rules of ``ordered`` and ``saved``)."""

    def __init__(self, key: str, arrays: dict | None = None):
        self.key, self._arrays = key, arrays or {}

    def arrays(self) -> dict:
        return self._arrays


def test_the_parts_come_in_the_declared_order_whatever_order_they_are_opened_in():
    average, chooser = weightema.WeightAverage(_model(), 0.9), bestcheckpoint.BestDice(3, 1)
    for given in ((chooser, None, average), (average, chooser), (None, chooser, average)):
        assert modelparts.ordered(*given) == (average, chooser)
    assert [p.key for p in (average, chooser)] == [modelparts.WEIGHT_AVERAGE, modelparts.BEST]
    with pytest.raises(ValueError, match="each must be one of"):
        modelparts.ordered(Named("mystery"))
    with pytest.raises(ValueError, match="each must be one of"):
        modelparts.ordered(chooser, bestcheckpoint.BestDice(3, 1))


def test_every_part_is_saved_and_restored_through_one_hook():
    model = _model()
    average, chooser = weightema.WeightAverage(model, 0.9), bestcheckpoint.BestDice(3, 1)
    chooser.before_checkpoint({"epoch": 0, "val_dice": {"background": 1.0, "liver": 0.5}})
    kept = modelparts.saved(modelparts.ordered(average, chooser))
    assert kept.states == {"best": chooser.state()}
    assert sorted(kept.arrays) == [f"{weightema.AVERAGE_KEY}{i}" for i in range(2)]

    again = modelparts.ordered(weightema.WeightAverage(model, 0.9), bestcheckpoint.BestDice(3, 1))
    for v in model.trainable_variables:  # the model moved on: the average must come back
        v.assign(v.numpy() + 1.0)
    modelparts.restore(again, modelparts.Kept(kept.states, kept.arrays, "ck.state.npz"))
    for a, b in zip(again[0].average, average.average):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert (again[1].ema, again[1].best, again[1].mark) == (chooser.ema, chooser.best, False)
    modelparts.restore(again, None)  # a new run, or an elastic run's commit: nothing
    with pytest.raises(ValueError, match=r"arrays \['x0'\] are another part's"):
        modelparts.saved((Named(modelparts.WEIGHT_AVERAGE, {"x0": 1}),
                          Named(modelparts.BEST, {"x0": 2})))


def test_a_kept_state_that_does_not_fit_names_the_checkpoint():
    part = modelparts.ordered(weightema.WeightAverage(_model(), 0.9))
    with pytest.raises(InputError, match=r"^ck.state.npz: the checkpoint's weight average "
                                         r"has shape \(4,\) at variable 0, the model \(3, 2\)$"):
        modelparts.restore(part, modelparts.Kept({}, {f"{weightema.AVERAGE_KEY}{i}": np.zeros(4)
                                                      for i in range(2)}, "ck.state.npz"))
