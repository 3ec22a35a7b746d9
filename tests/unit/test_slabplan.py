"""``--slab auto`` (``distseg.data.slabplan``): the slab starts at the training cases'
median shape in pooling units, shrinks the axis the slab covers most of until the
memory estimate fits the budget, is the same at any rank count, and a run records it."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import feeds, slabplan, synth
from distseg.networks import memory, spec


def _model(**kw) -> config_lib.ModelConfig:
    base = config_lib.smoke3d().model
    return dataclasses.replace(base, num_classes=3, in_channels=1, **kw)


def test_a_median_that_fits_is_taken_in_pooling_units():
    found = slabplan.plan((37, 61, 70), _model(), batch=2)
    assert found.slab == (36, 60, 68)  # depth 2: multiples of 4, rounded down
    assert found.median == (37, 61, 70) and found.need <= slabplan.BUDGET


def test_the_axis_covering_most_of_the_median_shrinks_until_the_step_fits():
    model = _model(base_filters=8)
    start = (64, 128, 128)
    budget = memory.estimate(spec.spec_of(dataclasses.replace(model, precision="float32"),
                                          (48, 128, 128)), 2).total
    found = slabplan.plan((64, 128, 256), model, batch=2, budget=budget)
    assert found.need <= budget
    # 256 wide against a median of 256, 128 against 128: W and H shrink by turns from
    # the ratio 1, and D (64 of 64) with them; every extent a multiple of 4.
    assert all(s % 4 == 0 and s <= m for s, m in zip(found.slab, (64, 128, 256)))
    assert found.slab != start and np.prod(found.slab) < 64 * 128 * 256
    bigger = slabplan.plan((64, 128, 256), model, batch=2, budget=budget * 4)
    assert np.prod(bigger.slab) > np.prod(found.slab)


def test_nothing_fits_is_one_line():
    with pytest.raises(InputError, match="--slab auto: even a 4x4x4 slab needs"):
        slabplan.plan((16, 16, 16), _model(), batch=1, budget=1000)


def test_a_model_fn_or_no_training_volume_is_refused():
    cfg = dataclasses.replace(config_lib.smoke3d(), data=dataclasses.replace(
        config_lib.smoke3d().data, slab="auto", path="v.h5"))
    with pytest.raises(InputError, match="no training volumes|needs training volumes"):
        slabplan.resolve(cfg, np.zeros((0, 3)), 2)
    with_fn = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, fn="m.py:f"))
    with pytest.raises(InputError, match="--model-fn"):
        slabplan.resolve(with_fn, np.ones((2, 3)) * 32, 2)


def test_the_feed_plans_the_same_slab_at_any_rank_count(tmp_path):
    path = str(tmp_path / "v.h5")
    synth.make(path, ndim=3, cases=6, size=32, seed=0, slices_per_case=24, jitter=0.25)
    base = config_lib.smoke3d()
    cfg = dataclasses.replace(base, data=dataclasses.replace(base.data, path=path, slab="auto"),
                              train=dataclasses.replace(base.train, global_batch=4, batch_size=4),
                              run_dir=str(tmp_path / "r")).validate()
    one = feeds.open_feed(cfg, 1, check_labels=False)
    two = feeds.open_feed(cfg, 2, check_labels=False)
    assert one.cfg.data.slab == two.cfg.data.slab != "auto"
    slab = tuple(int(v) for v in one.cfg.data.slab.split(","))
    assert one.feed.input_shape == slab and all(s % 4 == 0 for s in slab)
    assert "--slab auto:" in one.feed.summary()["slab_plan"]
    assert feeds.input_shape(cfg) == slab  # the elastic start's path plans alike
    json.dumps(one.feed.summary(), default=str)
    assert os.path.exists(path)
