"""``--slab auto`` (``distseg.data.slabplan``): the slab starts at the training cases'
median shape in pooling units, the depth is the deepest that keeps every axis 4 voxels
at the bottleneck (at most 5), the axis the slab covers most of shrinks until the
memory estimate fits the budget, the batch is nnU-Net's (memory over batch 2, at most
5 % of the training voxels, at least 2), the same at any rank count, and a run records
all three in its config."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from distseg.core import batchplan, rundir
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import feeds, h5format, slabplan, volumes
from distseg.networks import memory, spec


def _model(**kw) -> config_lib.ModelConfig:
    base = config_lib.smoke3d().model
    return dataclasses.replace(base, num_classes=3, in_channels=1, **kw)


def _need(model, slab, depth, batch) -> int:
    planned = dataclasses.replace(model, precision="float32", depth=depth)
    return memory.estimate(spec.spec_of(planned, slab), batch).total


#: Training voxels enough that the 5 % cap never binds.
PLENTY = 10 ** 12


def test_a_median_that_fits_is_taken_in_pooling_units():
    found = slabplan.plan((37, 61, 70), _model(), PLENTY)
    # 37 >= 4 x 2**3 but < 4 x 2**4: depth 3, extents rounded down to multiples of 8.
    assert found.depth == 3 and found.slab == (32, 56, 64)
    assert found.median == (37, 61, 70) and found.need <= slabplan.BUDGET


@pytest.mark.parametrize("median,depth", [
    ((8, 256, 256), 1),       # thin: 8 slices hold one pooling (8 / 2 = 4), not two
    ((16, 256, 256), 2),
    ((31, 64, 64), 2),        # 31 < 4 x 2**3
    ((32, 64, 64), 3),
    ((64, 64, 64), 4),
    ((128, 128, 128), 5),
    ((512, 512, 512), 5),     # capped: 512 would hold 7
])
def test_the_depth_is_the_deepest_with_four_voxels_at_the_bottleneck(median, depth):
    assert slabplan.depth_for(median) == depth
    found = slabplan.plan(median, _model(base_filters=1), PLENTY, budget=2 ** 50)
    assert found.depth == depth and found.slab == tuple(m // 2 ** depth * 2 ** depth for m in median)
    bottleneck = [s // 2 ** found.depth for s in found.slab]
    assert min(bottleneck) >= 4 or found.depth == 1
    deeper = [s // 2 ** (found.depth + 1) for s in found.slab]
    assert found.depth == slabplan.MAX_DEPTH or min(deeper) < 4


def test_the_axis_covering_most_of_the_median_shrinks_until_the_step_fits():
    model = _model(base_filters=8)
    budget = _need(model, (48, 128, 128), 4, 2)
    found = slabplan.plan((64, 128, 256), model, PLENTY, budget=budget)
    assert _need(model, found.slab, found.depth, slabplan.MIN_BATCH) <= budget
    # 256 wide against a median of 256, 128 against 128: W and H shrink by turns from
    # the ratio 1, and D (64 of 64) with them; every extent a multiple of 2**depth.
    assert all(s % 2 ** found.depth == 0 and s <= m for s, m in zip(found.slab, (64, 128, 256)))
    assert np.prod(found.slab) < 64 * 128 * 256
    assert found.depth == slabplan.depth_for(found.slab)
    bigger = slabplan.plan((64, 128, 256), model, PLENTY, budget=budget * 4)
    assert np.prod(bigger.slab) > np.prod(found.slab)


def test_a_slab_shrunk_below_four_bottleneck_voxels_loses_a_pooling():
    model = _model(base_filters=8)
    start = slabplan.plan((64, 64, 64), model, PLENTY)
    assert start.depth == 4 and start.slab == (64, 64, 64)
    found = slabplan.plan((64, 64, 64), model, PLENTY, budget=_need(model, (48, 48, 48), 3, 2))
    # One unit of 16 off an axis leaves 48 < 4 x 16: depth 3, then units of 8.
    assert found.depth == 3 and all(s % 8 == 0 for s in found.slab)
    assert _need(model, found.slab, 3, 2) <= _need(model, (48, 48, 48), 3, 2)


def test_a_small_median_batches_more_as_far_as_five_percent_of_the_voxels():
    model = _model()
    median = (32, 32, 32)
    need = _need(model, median, 3, 2)
    by_memory = round(slabplan.BUDGET / need * 2)
    assert by_memory > 20  # a tiny network: memory alone would allow far more
    found = slabplan.plan(median, model, train_voxels=100 * 32 ** 3)
    assert found.batch == 5  # 5 % of 100 cases of one slab each
    assert slabplan.plan(median, model, train_voxels=10 * 32 ** 3).batch == 2  # never below 2
    assert slabplan.plan(median, model, train_voxels=PLENTY).batch == by_memory
    assert found.need == _need(model, found.slab, found.depth, 5)


def test_a_large_median_batches_two():
    model = _model(base_filters=16)
    found = slabplan.plan((200, 400, 400), model, PLENTY)
    assert found.batch == 2 and found.need <= slabplan.BUDGET
    assert np.prod(found.slab) < 200 * 400 * 400  # shrunk: batch 2 is what fits


def test_the_batch_never_passes_the_budget():
    model = _model(base_filters=8)
    slab = (128, 128, 128)
    planned = spec.spec_of(dataclasses.replace(model, precision="float32", depth=5), slab)
    # 2 x 1.76 = 3.52 rounds to 4 by nnU-Net's rule, but at this slab a sample's
    # activations dwarf the fixed terms, so only 3 fit.
    budget = int(_need(model, slab, 5, 2) * 1.76)
    fits = memory.largest_batch(planned, budget)
    assert round(budget / _need(model, slab, 5, 2) * 2) > fits >= 2
    found = slabplan.plan(slab, model, PLENTY, budget=budget)
    assert found.slab == slab and found.batch == fits and found.need <= budget


def test_nothing_fits_is_one_line():
    with pytest.raises(InputError, match="--slab auto: even a 4x4x4 slab at depth 1 needs") as e:
        slabplan.plan((16, 16, 16), _model(), PLENTY, budget=1000)
    assert "\n" not in str(e.value)


def test_a_model_fn_or_no_training_volume_is_refused():
    cfg = dataclasses.replace(config_lib.smoke3d(), data=dataclasses.replace(
        config_lib.smoke3d().data, slab="auto", path="v.h5"))
    with pytest.raises(InputError, match="no training volumes|needs training volumes"):
        slabplan.resolve(cfg, np.zeros((0, 3)))
    with_fn = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, fn="m.py:f"))
    with pytest.raises(InputError, match="--model-fn"):
        slabplan.resolve(with_fn, np.ones((2, 3)) * 32)


def _auto(path: str, run_dir: str, **train) -> config_lib.Config:
    base = config_lib.smoke3d()
    return dataclasses.replace(
        base, data=dataclasses.replace(base.data, path=path, slab="auto"),
        model=dataclasses.replace(base.model, depth=4, num_classes=3, in_channels=1),
        train=dataclasses.replace(base.train, **train), run_dir=run_dir).validate()


@pytest.mark.parametrize("train,field,other", [
    (dict(global_batch=8, global_batch_grows=True, batch_size=1), "global_batch", "batch_size"),
    (dict(global_batch=0, batch_size=1), "batch_size", "global_batch"),
])
def test_a_fixed_global_batch_plans_it_per_rank_batches_the_batch_size(train, field, other):
    shapes = np.array([[32, 32, 32]] * 100)
    cfg = _auto("v.h5", "r", **train)
    planned, found = slabplan.resolve(cfg, shapes)
    assert found.batch == 5 and getattr(planned.train, field) == 5
    assert getattr(planned.train, other) == getattr(cfg.train, other)  # untouched
    assert planned.train.global_batch_grows == cfg.train.global_batch_grows
    assert planned.train.lr == cfg.train.lr  # the plan leaves the lr alone
    assert planned.model.depth == 3 and planned.data.slab == "32,32,32"
    assert f"train.{field} 5" in found.describe()


@pytest.fixture(scope="module")
def many_small(tmp_path_factory) -> str:
    """80 training and 2 validation volumes of 16x32x32: the median holds 2 poolings
    and a batch of 5 % of the training voxels is 4 slabs."""
    path = str(tmp_path_factory.mktemp("v") / "small.h5")
    rng = np.random.default_rng(0)
    images = [rng.random((16, 32, 32), dtype=np.float32) for _ in range(82)]
    masks = [(image > 0.9).astype(np.uint8) for image in images]
    volumes.write_volumes(path, images, masks, list(range(82)), [0] * 80 + [1] * 2,
                          source="test", hu_window=h5format.HU_WINDOW)
    return path


@pytest.mark.parametrize("train,field", [
    # 7 cannot be shared by 2 ranks, the planned 4 can: the ranks share the plan's.
    (dict(global_batch=7, global_batch_grows=False), "global_batch"),
    (dict(global_batch=0, batch_size=1), "batch_size"),
])
def test_the_feed_plans_the_same_run_at_any_rank_count(many_small, tmp_path, train, field):
    cfg = _auto(many_small, str(tmp_path / "r"), **train)
    one = feeds.open_feed(cfg, 1, check_labels=False)
    two = feeds.open_feed(cfg, 2, check_labels=False)
    assert one.cfg == two.cfg
    assert one.cfg.data.slab == "16,32,32" and one.cfg.model.depth == 2
    assert getattr(one.cfg.train, field) == 4
    assert one.feed.input_shape == two.feed.input_shape == (16, 32, 32)
    assert batchplan.batch_plan(two.cfg.train, 2).per_rank == (2 if field == "global_batch" else 4)
    described = one.feed.summary()["slab_plan"]
    assert "slab 16x32x32, depth 2, train." + field + " 4" in described
    assert feeds.input_shape(cfg) == (16, 32, 32)  # the elastic start's path plans alike
    assert feeds.with_plan(cfg) == one.cfg
    json.dumps(one.feed.summary(), default=str)


def test_a_planned_global_batch_the_ranks_cannot_share_says_it_was_planned(many_small, tmp_path):
    cfg = _auto(many_small, str(tmp_path / "r"), global_batch=8, global_batch_grows=False)
    with pytest.raises(InputError, match="--global-batch 4 cannot be shared by 3 ranks.*"
                                         "--slab auto's plan") as e:
        feeds.open_feed(cfg, 3, check_labels=False)
    assert "\n" not in str(e.value)


def test_a_resumed_run_reads_the_plan_from_its_config(many_small, tmp_path):
    run_dir = str(tmp_path / "r")
    opened = feeds.open_feed(_auto(many_small, run_dir, global_batch=0, batch_size=1), 1,
                             check_labels=False)
    os.makedirs(run_dir)
    with open(rundir.config_path(run_dir), "w") as f:
        json.dump(opened.cfg.to_dict(), f)
    saved = config_lib.for_resume(run_dir)
    again = feeds.open_feed(saved, 2, check_labels=False)
    assert again.feed.plan is None and "slab_plan" not in again.feed.summary()
    assert (again.cfg.data.slab, again.cfg.model.depth, again.cfg.train.batch_size) == ("16,32,32", 2, 4)


def test_a_planned_depth_is_not_held_to_the_2d_image_size():
    base = config_lib.smoke3d()
    deep = dataclasses.replace(base, model=dataclasses.replace(base.model, depth=5, image_size=40),
                               data=dataclasses.replace(base.data, path="v.h5"), run_dir="r")
    assert deep.validate() is deep  # 3D: the slab is the input, not image_size
    flat = dataclasses.replace(deep, model=dataclasses.replace(deep.model, spatial_dims=2),
                               data=dataclasses.replace(deep.data, slab=""))
    with pytest.raises(InputError, match="model.image_size 40 is not divisible by 2\\*\\*depth = 32"):
        flat.validate()
