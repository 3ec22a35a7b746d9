"""The segmentation loss and the Dice metric, in one place: TensorFlow forms for the
train and eval steps, numpy forms for whole volumes (sliding-window validation and
``distseg-predict``), and the arithmetic both share.

Soft Dice of class c over a batch (sums over every sample and voxel):

    dice_c = (2 I_c + s) / (D_c + s),  I_c = sum p_c g_c,  D_c = sum p_c + sum g_c

with s = ``SMOOTH`` so that a class absent from both prediction and truth scores 1. The
loss ``dice`` is -mean_c dice_c (-1 is perfect: the convention of the Stampede2 liver
study whose targets are -0.75 and -0.76); ``dice_ce`` adds the mean categorical
cross-entropy. What a loss is computed from, the loss sums, add up over batches, cases and
ranks; their layout is ``sums_width`` and ``split_sums``. The hard Dice (argmax) is a
metric: ``distseg.metrics``.

TensorFlow is imported inside the TensorFlow forms, so the numpy forms load without it.
tests/unit/test_losses.py holds the two forms to each other.
"""

from __future__ import annotations

import numpy as np

from distseg import metrics
from distseg.core.config import LOSSES

#: The soft Dice's smoothing constant.
SMOOTH = 1e-5
#: Slices of a volume reduced at a time by the numpy forms (bounds their memory).
_CHUNK = 16


def check_loss(kind: str) -> None:
    """Raises ``ValueError`` unless ``kind`` is one of ``config.LOSSES``."""
    if kind not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")


def sums_width(num_classes: int) -> int:
    """Length of the loss sums of ``num_classes`` classes: I (C), D (C), the summed
    cross-entropy and the voxel count."""
    return 2 * num_classes + 2


def split_sums(sums, num_classes: int):
    """(I, D, cross-entropy total, voxels) of loss sums (numpy or TensorFlow)."""
    c = num_classes
    return sums[:c], sums[c:2 * c], sums[2 * c], sums[2 * c + 1]


def dice_from_sums(inter, denom):
    """Per-class soft Dice from the sums ``I_c`` and ``D_c`` (numpy or TensorFlow)."""
    return (2.0 * inter + SMOOTH) / (denom + SMOOTH)


# --- TensorFlow forms (train and eval steps) ---------------------------------------

def soft_dice_sums(probs, masks, num_classes: int):
    """(I, D) per class, each of shape (num_classes,), summed over batch and space."""
    import tensorflow as tf
    onehot = tf.one_hot(tf.cast(masks, tf.int32), num_classes, dtype=probs.dtype)
    axes = list(range(len(probs.shape) - 1))
    inter = tf.reduce_sum(probs * onehot, axis=axes)
    denom = tf.reduce_sum(probs, axis=axes) + tf.reduce_sum(onehot, axis=axes)
    return inter, denom


def soft_dice_per_class(probs, masks, num_classes: int):
    """Soft Dice of each class over the whole batch, shape (num_classes,)."""
    return dice_from_sums(*soft_dice_sums(probs, masks, num_classes))


def loss_sums(probs, masks, num_classes: int):
    """What the loss of a batch is computed from, and what adds up over batches and
    ranks: [I (C), D (C), cross-entropy summed over voxels, voxels], float32."""
    import keras
    import tensorflow as tf
    inter, denom = soft_dice_sums(probs, masks, num_classes)
    ce = keras.losses.sparse_categorical_crossentropy(tf.cast(masks, tf.int32), probs)
    voxels = tf.cast(tf.size(masks), tf.float32)
    return tf.concat([tf.cast(inter, tf.float32), tf.cast(denom, tf.float32),
                      [tf.reduce_sum(tf.cast(ce, tf.float32)), voxels]], 0)


def loss_from_sums(sums, num_classes: int, kind: str = "dice"):
    """The loss (``dice`` or ``dice_ce``) of everything ``sums`` (``loss_sums``,
    ``volume_loss_sums``, summed) covers; numpy or TensorFlow in, the same out."""
    check_loss(kind)
    inter, denom, ce, voxels = split_sums(sums, num_classes)
    dice = dice_from_sums(inter, denom)
    loss = -sum(dice[k] for k in range(num_classes)) / num_classes
    if kind == "dice_ce":
        loss = loss + ce / voxels
    return loss


def segmentation_loss(probs, masks, num_classes: int, kind: str = "dice"):
    """The loss of one batch on its own (module docstring)."""
    return loss_from_sums(loss_sums(probs, masks, num_classes), num_classes, kind)


def global_loss(probs, masks, num_classes: int, kind: str, sum_over_ranks, ranks: int):
    """The loss of the global batch, whose parts sit on ``ranks`` ranks: returns
    (its value, this rank's surrogate, this rank's ``loss_sums``).

    ``sum_over_ranks`` sums a tensor over the ranks (an allreduce in the forward pass;
    the identity on one rank). With the global sums I, D (and the cross-entropy total
    and voxel count T, V) held constant, this rank's surrogate is

        ranks * ( -(1/C) sum_c [2 I_rc / (D_c + s) - (2 I_c + s) D_rc / (D_c + s)^2] + T_r / V )

    whose gradient, averaged over ranks as the train step averages gradients, is the
    gradient of the loss of the whole global batch: the soft Dice's derivative is linear
    in dI and dD, and I and D are sums over the ranks' parts. ``T_r/V`` enters only for
    ``dice_ce``. On one rank it is the gradient of ``segmentation_loss`` itself.
    """
    import tensorflow as tf
    local = loss_sums(probs, masks, num_classes)
    total = tf.stop_gradient(sum_over_ranks(local))
    return (loss_from_sums(total, num_classes, kind),
            surrogate(local, total, num_classes, kind, ranks), local)


def surrogate(local, total, num_classes: int, kind: str, parts: int):
    """The surrogate of ``global_loss`` for the part of a batch whose ``loss_sums`` are
    ``local``, the whole batch's (held constant) ``total``, the batch in ``parts``
    parts: the mean of the parts' surrogates' gradients is the whole batch's loss's."""
    import tensorflow as tf
    inter, denom, _, voxels = split_sums(total, num_classes)
    inter_r, denom_r, ce_r, _ = split_sums(local, num_classes)
    d = denom + SMOOTH
    part = -tf.reduce_mean(2.0 * inter_r / d - (2.0 * inter + SMOOTH) * denom_r / (d * d))
    if kind == "dice_ce":
        part = part + ce_r / voxels
    return float(parts) * part


# --- numpy forms (whole volumes) ---------------------------------------------------

def volume_loss_sums(probs: np.ndarray, mask: np.ndarray, num_classes: int) -> np.ndarray:
    """``loss_sums`` of one whole volume in float64 numpy, ``_CHUNK`` slices at a time.

    Raises:
      ValueError: shapes that differ, or a label out of range.
    """
    metrics.check_volume(probs, mask, num_classes)
    out = np.zeros(sums_width(num_classes))
    for z in range(0, mask.shape[0], _CHUNK):
        p = probs[z:z + _CHUNK].reshape(-1, num_classes).astype(np.float64)
        labels = mask[z:z + _CHUNK].reshape(-1).astype(np.int64)
        onehot = np.eye(num_classes)[labels]
        # Clipped as Keras' cross-entropy clips (epsilon 1e-7).
        picked = np.clip(p[np.arange(len(labels)), labels], 1e-7, 1.0 - 1e-7)
        out += np.concatenate([(p * onehot).sum(axis=0), p.sum(axis=0) + onehot.sum(axis=0),
                               [-float(np.log(picked).sum()), labels.size]])
    return out


def volume_loss(probs: np.ndarray, mask: np.ndarray, num_classes: int, kind: str = "dice") -> float:
    """``segmentation_loss`` of one whole volume (numpy, float64)."""
    return float(loss_from_sums(volume_loss_sums(probs, mask, num_classes), num_classes, kind))
