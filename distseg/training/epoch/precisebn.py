"""Precise BatchNorm: statistics of the weights that are validated and saved.

BatchNorm's moving statistics are an exponential average of batch statistics taken
while the weights moved, so they lag the weights; validation and inference normalise
with them, and a run's validation Dice can swing between epochs although training
does not (docs/studies/folds-2026-11-27.md). Wu and Johnson's "precise BN" (2021, also
Detectron2's ``update_bn_stats``) replaces them, with the weights frozen, by the mean
of the batch statistics of a few training batches: here ``train.precise_bn`` steps,
the first of the epoch just trained and, where it has fewer, those of the epochs before
it (the same samples and augmentation draws at any rank count), each rank its own part
of each step, averaged over the steps and the ranks. An epoch of one or two steps (a 3D
case cut in few slabs) would otherwise give statistics of one or two batches, and the
validation Dice swung with them (docs/studies/recipe-real-ct-2026-11-27.md).
With a fixed global batch and ghost batches, one process and N ranks average the same
ghost-batch statistics, so the result stays exact across rank counts.

How a batch's statistics are read: a BatchNorm layer's training pass sets
``moving = m * moving + (1 - m) * batch``; with ``moving`` zeroed first that is
``(1 - m) * batch``. This holds for distseg's ``FusedBatchNorm`` and for Keras'
``BatchNormalization`` in a researcher's own model alike. The forward pass also moves
dropout's seed generators; they are put back, so training after it draws what it would
have drawn without it.

``PreciseBatchNorm`` is the part that does it after each epoch's steps, before
validation and the epoch's checkpoint (``train.precise_bn`` steps; 0: off): it changes
the model, so it is a ``modelparts.ModelPart``, after the average of the weights
(``modelparts.ORDER``). No Horovod here: the caller passes ``allreduce_many``.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from distseg.parallel import agreement
from distseg.training.epoch import modelparts


def batchnorm_layers(model) -> list:
    """Every Keras ``BatchNormalization`` layer of ``model`` (nested ones included)."""
    import keras
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)  # noqa: SLF001
            if isinstance(layer, keras.layers.BatchNormalization)]


def make_forward(model, input_shape: Sequence[int]):
    """Compiles ``forward(images)``: the training-mode pass that moves the statistics
    (no loss, no gradient)."""
    import tensorflow as tf

    spec = tf.TensorSpec([None, *input_shape, model.inputs[0].shape[-1]], tf.float32)

    @tf.function(input_signature=[spec], autograph=False)
    def forward(images):
        model(images, training=True)
        return tf.constant(0)

    return forward


def batch_statistics(layers: list, forward: Callable, images: np.ndarray) -> list[np.ndarray]:
    """[mean, variance] of every layer in ``layers`` for one batch: what its training
    pass normalises with (the mean of the ghost batches' statistics with ghost batches)."""
    for layer in layers:
        layer.moving_mean.assign(np.zeros(layer.moving_mean.shape, np.float32))
        layer.moving_variance.assign(np.zeros(layer.moving_variance.shape, np.float32))
    forward(images)
    out = []
    for layer in layers:
        keep = 1.0 - float(layer.momentum)
        out += [layer.moving_mean.numpy() / keep, layer.moving_variance.numpy() / keep]
    return out


def local_statistics(layers: list, forward: Callable, batches) -> tuple[list[np.ndarray], int]:
    """The sum over ``batches`` (images arrays) of ``batch_statistics``, and their count."""
    total: list[np.ndarray] | None = None
    count = 0
    for images in batches:
        stats = batch_statistics(layers, forward, images)
        total = stats if total is None else [a + b for a, b in zip(total, stats)]
        count += 1
    return total or [], count


def measure(model, forward: Callable, batches) -> list[np.ndarray]:
    """This rank's mean batch statistics over ``batches`` (images arrays), [mean,
    variance] per BatchNorm layer, with every non-trainable variable (the moving
    statistics, dropout's seeds) put back as it was, whatever happens."""
    layers = batchnorm_layers(model)
    kept = [v.numpy() for v in model.non_trainable_variables]
    try:
        total, count = local_statistics(layers, forward, batches)
    finally:
        for v, value in zip(model.non_trainable_variables, kept):
            v.assign(value)
    return [t / count for t in total] if count else []


def install(model, means: list[np.ndarray], allreduce_many: Callable, size: int) -> None:
    """Collective: every BatchNorm layer's moving statistics set to ``means``
    (``measure``'s) averaged over the ranks. Every rank passes the same shapes."""
    if size > 1 and means:
        means = allreduce_many(means)
    for k, layer in enumerate(batchnorm_layers(model)[:len(means) // 2]):
        layer.moving_mean.assign(np.asarray(means[2 * k], np.float32))
        layer.moving_variance.assign(np.asarray(means[2 * k + 1], np.float32))


class PreciseBatchNorm(modelparts.ModelPart):
    """The part: when an epoch's steps are done, ``measure`` and ``install`` the
    statistics of ``steps`` steps of that epoch and those before it (``read(epoch,
    steps)``: this rank's images arrays of them, read and augmented as training read
    them); its cost goes in the epoch's ``precise_bn`` field. A read that fails on any
    rank fails every rank alike."""

    key = modelparts.PRECISE_BN

    def __init__(self, model, forward: Callable, read: Callable, steps: int,
                 allreduce_many: Callable, size: int):
        self.model, self.forward, self.read, self.steps = model, forward, read, steps
        self.allreduce_many, self.size = allreduce_many, size
        self.epoch, self.done = 0, None

    @classmethod
    def open(cls, train_cfg, model, input_shape: Sequence[int], read: Callable,
             allreduce_many: Callable, size: int) -> "PreciseBatchNorm | None":
        """The part of a launch under ``train.precise_bn`` (None: off, or no BatchNorm
        in the model), reading its images with ``read`` (``plan.PlannedBatches.images``)."""
        if not train_cfg.precise_bn or not batchnorm_layers(model):
            return None
        return cls(model, make_forward(model, input_shape), read, train_cfg.precise_bn,
                   allreduce_many, size)

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        self.epoch, self.done = epoch, None

    def before_validation(self) -> None:
        start = time.perf_counter()
        # Each piece agreed: a rank whose read or forward pass fails must not leave the
        # others waiting in the allreduce of ``install``.
        batches = agreement.agree(self.read, self.epoch, self.steps)
        means = agreement.agree(measure, self.model, self.forward, batches)
        install(self.model, means, self.allreduce_many, self.size)
        self.done = {"steps": len(batches), "seconds": round(time.perf_counter() - start, 4)}

    def epoch_fields(self) -> dict:
        return {} if self.done is None else {"precise_bn": self.done}
