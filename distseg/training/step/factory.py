"""What a run trains with, built from its config in one place: the model and its
optimizer (``build_state``), the train step of a batch size (``train_step``,
``TrainSteps``), the evaluation and forward steps, the batch transform
(``transform``) and the blank batch a rank steps with when its read failed
(``stand_in``).

Every path that trains the run's model calls these: the loop, the lr range test
(``lrfind``), the precision trial (``precision``), the elastic start and the
benchmarks' emulation; so what the trial times and the range test sweeps is the step
the run takes. The config passed is the run's one live config.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from distseg.core import config as config_lib
from distseg.core import lr
from distseg.data import augment
from distseg.parallel import distributed as dist
from distseg.training.step import steps


class State(NamedTuple):
    """The model a run trains, its optimizer and what every rank must hold identically:
    weights (BatchNorm statistics included) and optimizer state (``synced``)."""

    model: Any
    optimizer: Any
    synced: list


def make_optimizer(t: config_lib.TrainConfig):
    """The optimizer of ``train.optimizer`` (Adam, or SGD with Nesterov momentum), with
    the config's weight decay and gradient-norm clipping; its lr is set by ``lr.assign``."""
    import keras

    options = {"weight_decay": t.weight_decay or None, "global_clipnorm": t.clip_norm or None}
    if t.optimizer == "sgd":
        return keras.optimizers.SGD(momentum=t.momentum, nesterov=True, **options)
    return keras.optimizers.Adam(**options)


def model_and_optimizer(cfg: config_lib.Config, input_shape: Sequence[int], seed: int):
    """``cfg``'s network (``networks.models.build``) and its optimizer
    (``make_optimizer``) at ``train.lr``, built with its slots, the random state seeded
    with ``seed`` first."""
    import keras

    from distseg.networks import models

    keras.utils.set_random_seed(seed)
    model = models.build(cfg.model, input_shape, run_dir=cfg.run_dir)
    optimizer = make_optimizer(cfg.train)
    lr.assign(optimizer, cfg.train.lr)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def build_state(cfg: config_lib.Config, ctx: dist.Context, input_shape: Sequence[int],
                broadcast: bool = True) -> State:
    """The run's ``State``, identical on every rank (``broadcast`` False: each rank's
    own initial values, for an elastic run's state to sync)."""
    model, optimizer = model_and_optimizer(cfg, input_shape, cfg.train.seed + ctx.rank)
    # Not model.variables: that also holds the dropout layers' seed-generator states,
    # which must stay different per rank (seeded by rank above) or every rank would
    # drop the same units.
    synced = model.weights + optimizer.variables
    if broadcast:
        # Horovod: every rank starts from rank 0's weights and optimizer state.
        dist.broadcast_variables(synced, root=0)
    return State(model, optimizer, synced)


def train_step(cfg: config_lib.Config, state, input_shape: Sequence[int], ranks: int,
               batch: int | None):
    """The train step of ``state``'s model for ``ranks`` ranks of per-rank ``batch``
    samples (None: any size), with the config's loss and gradient compression
    (``steps.make_train_step``). On several ranks the compression must be decided
    (``compression.decide``) before the step is built: a traced step keeps it.

    Raises:
      ValueError: ``train.compression`` still ``auto`` on several ranks.
    """
    model, optimizer = state[0], state[1]
    t = cfg.train
    if ranks > 1 and t.compression not in config_lib.COMPRESSIONS:
        raise ValueError(f"train.compression must be one of {config_lib.COMPRESSIONS} when "
                         f"a step of {ranks} ranks is built, got {t.compression!r}")
    return steps.make_train_step(model, optimizer, input_shape, cfg.model.num_classes, t.loss,
                                 ranks=ranks, batch=batch,
                                 compression=t.compression if ranks > 1 else "none")


def eval_step(cfg: config_lib.Config, model, input_shape: Sequence[int]):
    """The validation step of ``model`` (``steps.make_eval_step``)."""
    return steps.make_eval_step(model, input_shape, cfg.model.num_classes)


def predict_step(model, input_shape: Sequence[int]):
    """The forward pass of ``model`` (``steps.make_predict_step``)."""
    return steps.make_predict_step(model, input_shape)


def transform(cfg: config_lib.Config):
    """The training batches' augmentation (``data.augment.for_training``; None: none)."""
    return augment.for_training(cfg.data.augment, cfg.train.seed, cfg.model.spatial_dims)


def stand_in(cfg: config_lib.Config, input_shape: Sequence[int], n: int):
    """A blank batch of ``n`` samples, (ids, images, masks): what a rank whose read
    failed still steps with, so that it joins the step's allreduce, where every rank
    learns of the failure."""
    shape = tuple(input_shape)
    return (np.zeros(0, np.int64), np.zeros((n, *shape, cfg.model.channels), np.float32),
            np.zeros((n, *shape), np.uint8))


class TrainSteps:
    """The train step traced for each per-rank batch a run trains (``train_step``; the
    ``goodput`` policy may come back to a batch it left). ``traced``: steps already
    made for this state (by the precision trial), with gradient compression
    ``compression``.

    It holds no config: each ``for_batch`` is given the one the caller holds, so a
    decision start-up takes after the steps exist (the compression) reaches them
    without being told twice."""

    def __init__(self, state, input_shape: Sequence[int], ranks: int,
                 traced: dict | None = None, compression: str | None = None):
        self.state, self.input_shape, self.ranks = state, input_shape, ranks
        self.traced: dict = dict(traced or {})
        self.compression = compression
        """The gradient compression of the steps in ``traced``."""

    def for_batch(self, cfg: config_lib.Config, batch: int | None):
        """``cfg``'s train step for ``batch`` samples per rank; the steps traced for
        another gradient compression are dropped (it is fixed in their graphs)."""
        if cfg.train.compression != self.compression:
            self.traced.clear()
            self.compression = cfg.train.compression
        if batch not in self.traced:
            self.traced[batch] = train_step(cfg, self.state, self.input_shape, self.ranks, batch)
        return self.traced[batch]
