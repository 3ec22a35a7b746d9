"""``train.optimizer`` and its options (``factory.make_optimizer``): nnU-Net's SGD with
Nesterov momentum beside Adam, weight decay, and the averaged gradient's norm clipped
before the update, through the run's own train step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distseg.core import config as config_lib  # noqa: E402
from distseg.core.errors import InputError  # noqa: E402
from distseg.training.step import factory  # noqa: E402


def _cfg(**train) -> config_lib.Config:
    base = config_lib.smoke()
    cfg = dataclasses.replace(base, data=dataclasses.replace(base.data, path="x.h5"),
                              model=dataclasses.replace(base.model, num_classes=3, in_channels=1),
                              train=dataclasses.replace(base.train, **train), run_dir="r")
    return cfg.validate()


def test_sgd_is_nesterov_with_the_configured_momentum_decay_and_clipping():
    opt = factory.make_optimizer(_cfg(optimizer="sgd", momentum=0.9, weight_decay=3e-5,
                                      clip_norm=12.0).train)
    assert isinstance(opt, keras.optimizers.SGD) and opt.nesterov
    assert opt.momentum == pytest.approx(0.9)
    assert opt.weight_decay == pytest.approx(3e-5) and opt.global_clipnorm == 12.0
    adam = factory.make_optimizer(_cfg().train)
    assert type(adam) is keras.optimizers.Adam
    assert adam.weight_decay is None and adam.global_clipnorm is None


@pytest.mark.parametrize("field,value", [("optimizer", "rmsprop"), ("momentum", 1.0),
                                         ("weight_decay", -1e-5), ("clip_norm", -1.0)])
def test_a_bad_optimizer_setting_is_refused_naming_the_field(field, value):
    with pytest.raises(InputError, match=f"train.{field}"):
        _cfg(**{field: value})


def _first_update(cfg) -> float:
    """The L2 norm of the weights' change after one train step of ``cfg`` on a batch."""
    shape = (cfg.model.image_size,) * 2
    model, optimizer = factory.model_and_optimizer(cfg, shape, seed=0)
    step = factory.train_step(cfg, (model, optimizer), shape, ranks=1, batch=4)
    before = [v.numpy().copy() for v in model.trainable_variables]
    rng = np.random.default_rng(0)
    images = rng.normal(size=(4, *shape, 1)).astype(np.float32)
    masks = rng.integers(0, 3, (4, *shape)).astype(np.uint8)
    step(images, masks, np.zeros(2, np.float32))
    return float(np.sqrt(sum(((v.numpy() - b) ** 2).sum()
                             for v, b in zip(model.trainable_variables, before))))


def test_sgd_s_first_step_moves_the_weights_by_the_clipped_norm():
    # Nesterov SGD's first step moves the weights by (1 + momentum) x lr x the gradient;
    # a gradient clipped to c moves them by exactly (1 + momentum) x lr x c.
    lr, clip, momentum = 0.01, 1e-3, 0.99
    moved = _first_update(_cfg(optimizer="sgd", lr=lr, momentum=momentum, clip_norm=clip))
    assert moved == pytest.approx((1 + momentum) * lr * clip, rel=1e-3)
    unclipped = _first_update(_cfg(optimizer="sgd", lr=lr, momentum=momentum))
    assert unclipped > 10 * moved
