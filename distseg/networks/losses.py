"""The segmentation loss and the Dice metric, in one place: TensorFlow forms for the
train and eval steps, numpy forms for whole volumes (sliding-window validation and
``distseg-predict``), and the arithmetic both share.

Soft Dice of class c over a batch (sums over every sample and voxel):

    dice_c = (2 I_c + s) / (D_c + s),  I_c = sum p_c g_c,  D_c = sum p_c + sum g_c

with s = ``SMOOTH`` so that a class absent from both prediction and truth scores 1. The
loss ``dice`` is -mean_c dice_c (-1 is perfect: the convention of the Stampede2 liver
study whose targets are -0.75 and -0.76); ``dice_ce`` adds the mean categorical
cross-entropy. The hard Dice of a set is kept as counts (intersection, predicted, true
voxels per class) that add up over batches, cases and ranks.

TensorFlow is imported inside the TensorFlow forms, so the numpy forms load without it.
tests/unit/test_losses.py holds the two forms to each other.
"""

from __future__ import annotations

import numpy as np

from distseg.core.config import LOSSES

#: The soft Dice's smoothing constant.
SMOOTH = 1e-5
#: Slices of a volume reduced at a time by the numpy forms (bounds their memory).
_CHUNK = 16


def check_loss(kind: str) -> None:
    """Raises ``ValueError`` unless ``kind`` is one of ``config.LOSSES``."""
    if kind not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")


def dice_from_sums(inter, denom):
    """Per-class soft Dice from the sums ``I_c`` and ``D_c`` (numpy or TensorFlow)."""
    return (2.0 * inter + SMOOTH) / (denom + SMOOTH)


def dice_from_counts(counts) -> list:
    """Per-class hard Dice from summed counts (3, classes); None where a class is
    absent from both prediction and truth (Dice is undefined there)."""
    out = []
    for inter, pred, true in zip(*[list(map(float, row)) for row in counts]):
        out.append(None if pred + true == 0 else 2.0 * inter / (pred + true))
    return out


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


def cross_entropy(probs, masks):
    """Mean categorical cross-entropy of softmax ``probs`` against integer ``masks``."""
    import keras
    import tensorflow as tf
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(tf.cast(masks, tf.int32), probs))


def segmentation_loss(probs, masks, num_classes: int, kind: str = "dice"):
    """The training loss of a batch: ``dice`` or ``dice_ce`` (module docstring)."""
    import tensorflow as tf
    check_loss(kind)
    loss = -tf.reduce_mean(soft_dice_per_class(probs, masks, num_classes))
    if kind == "dice_ce":
        loss = loss + cross_entropy(probs, masks)
    return loss


def dice_counts(probs, masks, num_classes: int):
    """Hard-Dice counts of a batch, shape (3, num_classes) float64: intersection,
    predicted and true voxels per class."""
    import tensorflow as tf
    pred = tf.one_hot(tf.argmax(probs, axis=-1), num_classes, dtype=tf.float64)
    true = tf.one_hot(tf.cast(masks, tf.int32), num_classes, dtype=tf.float64)
    axes = list(range(len(probs.shape) - 1))
    return tf.stack([tf.reduce_sum(pred * true, axis=axes), tf.reduce_sum(pred, axis=axes),
                     tf.reduce_sum(true, axis=axes)])


# --- numpy forms (whole volumes) ---------------------------------------------------

def _check_volume(probs: np.ndarray, mask: np.ndarray, num_classes: int) -> None:
    if probs.shape[:-1] != mask.shape or probs.shape[-1] != num_classes:
        raise ValueError(f"probabilities {probs.shape} and mask {mask.shape} do not match "
                         f"({num_classes} classes)")
    if mask.size and (int(mask.max()) >= num_classes or int(mask.min()) < 0):
        raise ValueError(f"mask holds label {int(mask.max())}, expected 0..{num_classes - 1}")


def volume_dice_counts(probs: np.ndarray, mask: np.ndarray, num_classes: int) -> np.ndarray:
    """``dice_counts`` of one volume: the argmax of ``probs`` (..., C) against ``mask``
    (...), (3, num_classes) float64, counted ``_CHUNK`` slices at a time.

    Raises:
      ValueError: shapes that differ, or a label outside 0..num_classes-1.
    """
    _check_volume(probs, mask, num_classes)
    confusion = np.zeros(num_classes * num_classes, dtype=np.int64)
    for z in range(0, mask.shape[0], _CHUNK):
        pred = np.argmax(probs[z:z + _CHUNK], axis=-1).astype(np.int64)
        true = mask[z:z + _CHUNK].astype(np.int64)
        confusion += np.bincount((pred * num_classes + true).ravel(),
                                 minlength=num_classes * num_classes)
    confusion = confusion.reshape(num_classes, num_classes)  # rows predicted, columns true
    return np.stack([np.diag(confusion), confusion.sum(axis=1),
                     confusion.sum(axis=0)]).astype(np.float64)


def volume_loss(probs: np.ndarray, mask: np.ndarray, num_classes: int, kind: str = "dice") -> float:
    """``segmentation_loss`` of one whole volume in float64 numpy, ``_CHUNK`` slices at
    a time (the 3D validation loss).

    Raises:
      ValueError: an unknown ``kind``, shapes that differ, or a label out of range.
    """
    check_loss(kind)
    _check_volume(probs, mask, num_classes)
    inter, denom = np.zeros(num_classes), np.zeros(num_classes)
    ce_sum = 0.0
    for z in range(0, mask.shape[0], _CHUNK):
        p = probs[z:z + _CHUNK].reshape(-1, num_classes).astype(np.float64)
        labels = mask[z:z + _CHUNK].reshape(-1).astype(np.int64)
        onehot = np.eye(num_classes)[labels]
        inter += (p * onehot).sum(axis=0)
        denom += p.sum(axis=0) + onehot.sum(axis=0)
        if kind == "dice_ce":
            ce_sum += float(-np.log(np.clip(p[np.arange(len(labels)), labels], 1e-7, 1.0 - 1e-7)).sum())
    loss = float(-np.mean(dice_from_sums(inter, denom)))
    return loss + ce_sum / max(mask.size, 1) if kind == "dice_ce" else loss
