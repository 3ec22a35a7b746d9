"""The pieces of one training step, each built at module level so tests can import them.

``make_train_step`` and ``make_eval_step`` compile the ``tf.function`` steps of a
model; ``scaled_lr`` and ``lr_at`` give the learning rate of every step;
``weight_checksum``, ``check_weights`` and ``average_batchnorm`` keep the ranks'
copies of the model identical. TensorFlow is imported inside the functions, so the
learning-rate arithmetic is importable without it.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from distseg.core.errors import RunError
from distseg.training import distributed as dist


def scaled_lr(lr: float, size: int, scaling: str) -> float:
    """Learning rate for ``size`` ranks: lr*size (linear, Goyal et al. 2017),
    lr*sqrt(size) (sqrt) or lr (none)."""
    factor = {"linear": float(size), "sqrt": math.sqrt(size), "none": 1.0}[scaling]
    return lr * factor


def lr_at(step: int, base: float, target: float, warmup_steps: int) -> float:
    """Linear warm-up from the single-process ``base`` to the scaled ``target``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base + (target - base) * step / warmup_steps


def _input_spec(spatial_shape: Sequence[int]):
    import tensorflow as tf
    shape = [None, *spatial_shape]
    return [tf.TensorSpec(shape + [1], tf.float32), tf.TensorSpec(shape, tf.uint8)]


def loss_and_grads(model, images, masks, num_classes: int, loss: str):
    """Forward and backward on this rank's batch: (local loss, gradients of the
    trainable variables). Traced inside the steps below; a benchmark or a test that
    needs the step without its allreduce calls this, not a copy."""
    import tensorflow as tf

    from distseg.networks import losses
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        local_loss = losses.segmentation_loss(probs, masks, num_classes, loss)
    return local_loss, tape.gradient(local_loss, model.trainable_variables)


def checked_loss_and_grads(model, images, masks, num_classes: int, loss: str):
    """``loss_and_grads`` with what the step needs to skip an update: (BatchNorm
    statistics, their values before the forward pass, local loss, gradients, 1.0 if
    the loss or a gradient is not finite on this rank)."""
    import tensorflow as tf
    # BatchNorm's moving statistics change in the forward pass itself: keep a copy
    # to put back when the step is skipped, so a NaN batch cannot poison them.
    stats = list(model.non_trainable_weights)
    before = [tf.identity(v) for v in stats]
    local_loss, grads = loss_and_grads(model, images, masks, num_classes, loss)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    nonfinite = 1.0 - tf.cast(tf.logical_and(finite, tf.math.is_finite(local_loss)), tf.float32)
    return stats, before, local_loss, grads, nonfinite


def apply_unless(skip_flag, optimizer, grads, variables, stats=(), before=()):
    """Applies ``grads`` unless ``skip_flag`` > 0; then puts ``stats`` back to ``before``."""
    import tensorflow as tf

    def apply():
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    def skip():
        for v, old in zip(stats, before):
            v.assign(old)
        return tf.constant(False)

    return tf.cond(skip_flag > 0, skip, apply)


def make_train_step(model, optimizer, spatial_shape: Sequence[int], num_classes: int, loss: str):
    """Compiles ``train_step(images, masks, flags) -> (loss, mean loss, any flags)``.

    ``flags`` holds this rank's [failed, stop]: 1.0 on a rank that could not read its
    batch (it passes a blank one) or that was asked to stop. They ride in the step's
    one allreduce with a third flag, a non-finite loss or gradient on this rank, so
    every rank learns of each at the same step instead of waiting for a rank that has
    stopped. The returned flags are means over ranks (> 0: some rank raised it). The
    update is applied only when every rank's loss and gradients were finite; otherwise
    the BatchNorm statistics are put back as they were before the step.
    """
    import tensorflow as tf

    @tf.function(input_signature=_input_spec(spatial_shape) + [tf.TensorSpec([2], tf.float32)])
    def train_step(images, masks, flags):
        stats, before, local_loss, grads, nonfinite = checked_loss_and_grads(
            model, images, masks, num_classes, loss)
        # Horovod: average gradients, the loss (for logging) and the flags in one
        # grouped allreduce.
        grads, (mean_loss, mean_flags) = dist.average_gradients(
            grads, [local_loss, tf.concat([flags, [nonfinite]], 0)])
        apply_unless(mean_flags[2], optimizer, grads, model.trainable_variables, stats, before)
        return local_loss, mean_loss, mean_flags

    return train_step


def make_eval_step(model, spatial_shape: Sequence[int], num_classes: int, loss: str):
    """Compiles ``eval_step(images, masks) -> (loss, Dice counts)`` (no communication)."""
    import tensorflow as tf

    from distseg.networks import losses

    @tf.function(input_signature=_input_spec(spatial_shape))
    def eval_step(images, masks):
        probs = model(images, training=False)
        return (losses.segmentation_loss(probs, masks, num_classes, loss),
                losses.dice_counts(probs, masks, num_classes))

    return eval_step


def make_predict_step(model, spatial_shape: Sequence[int]):
    """Compiles ``predict_step(images) -> probabilities`` (inference mode; sliding-window
    validation of whole volumes calls it window batch by window batch)."""
    import tensorflow as tf

    @tf.function(input_signature=_input_spec(spatial_shape)[:1])
    def predict_step(images):
        return model(images, training=False)

    return predict_step


def onednn_enabled() -> bool:
    """Whether TensorFlow uses its oneDNN (MKL) kernels: on by default on x86 since TF
    2.9, off with ``TF_ENABLE_ONEDNN_OPTS=0``. Recorded in the run record."""
    import tensorflow as tf
    try:
        return bool(tf.python.util._pywrap_util_port.IsMklEnabled())  # noqa: SLF001
    except AttributeError:
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0"


def weight_checksum(variables) -> list[float]:
    """[sum, sum of squares] of every value, in float64, one variable at a time (never
    a float64 copy of the whole model and optimizer state at once)."""
    import tensorflow as tf
    sums = [tf.stack([tf.reduce_sum(x), tf.reduce_sum(x * x)])
            for x in (tf.cast(tf.convert_to_tensor(v), tf.float64) for v in variables)]
    return [float(x) for x in tf.add_n(sums)]


def check_weights(where: str, variables) -> list[float]:
    """Collective: raises the same ``RunError`` on every rank if any rank's weights
    differ from rank 0's; returns this rank's checksum."""
    mine = weight_checksum(variables)
    diverged = dist.find_divergence(mine)
    if diverged:
        r, other, ref, rel = diverged
        raise RunError(f"ranks diverged {where}: rank {r}'s weight checksum {other} differs "
                       f"from rank 0's {ref} (relative {rel:.2e}); check that every rank "
                       "runs the same code, data file and config")
    return mine


def average_batchnorm(model, size: int) -> None:
    """Collective: replaces the BatchNorm moving statistics by their mean over ranks.

    They are updated from each rank's own batches; averaging them once per epoch, in
    one fused allreduce, makes every rank validate and checkpoint the same model.
    """
    stats = list(model.non_trainable_weights)
    if stats and size > 1:
        for v, mean in zip(stats, dist.allreduce_many([v.numpy() for v in stats])):
            v.assign(mean)
