"""U-Net builders, segmentation losses and Dice metrics (Keras 3 on TensorFlow).

``build_unet`` builds the classic encoder-decoder of Ronneberger et al. for 2D or 3D
inputs (``spatial_dims``): two 3x3 convolutions per level, ``depth`` poolings, filters
doubling per level, transposed-convolution upsampling and skip concatenations. With
the livermask-style defaults (240x240, depth 4, 64 base filters) it has about 31M
parameters. It is a pure builder: no Horovod, no training state.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

from distseg.config import ModelConfig

_SMOOTH = 1e-5


def norm_groups(filters: int) -> int:
    """Groups of GroupNorm for a layer of ``filters`` channels: 8 (Wu and He's default
    of 32 is too many for 16-filter U-Nets), or the largest power of two below it that
    divides ``filters``."""
    return next(g for g in (8, 4, 2, 1) if filters % g == 0)


def _conv_block(x, filters: int, spatial_dims: int, norm: str, name: str, bn_momentum: float):
    conv = layers.Conv2D if spatial_dims == 2 else layers.Conv3D
    for i in (1, 2):
        x = conv(filters, 3, padding="same", use_bias=norm == "none",
                 kernel_initializer="he_normal", name=f"{name}_conv{i}")(x)
        if norm == "batch":
            x = layers.BatchNormalization(momentum=bn_momentum, name=f"{name}_bn{i}")(x)
        elif norm == "group":
            x = layers.GroupNormalization(norm_groups(filters), name=f"{name}_gn{i}")(x)
        x = layers.Activation("relu", name=f"{name}_relu{i}")(x)
    return x


def build_unet(image_size: int = 240, *, spatial_dims: int = 2, depth: int = 4,
               base_filters: int = 64, num_classes: int = 3, in_channels: int = 1,
               dropout: float = 0.0, norm: str = "batch", bn_momentum: float = 0.9,
               name: str = "unet") -> keras.Model:
    """Builds a U-Net that maps (B, S, S[, S], C) images to per-class softmax maps.

    Args:
      image_size: spatial extent of the (square/cubic) input; divisible by 2**depth.
      spatial_dims: 2 for slices, 3 for volumes.
      depth: number of poolings.
      base_filters: filters at the first level, doubled at each pooling.
      num_classes: output channels (softmax over classes).
      in_channels: input channels.
      dropout: dropout rate in the bottleneck.
      norm: ``batch``, ``group`` (GroupNorm: no moving statistics, so training and
        inference normalise alike on every rank) or ``none``.
      bn_momentum: momentum of BatchNorm's moving statistics.

    Raises:
      ValueError: a hyper-parameter that cannot build a valid network.
    """
    if spatial_dims not in (2, 3):
        raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
    if depth < 1 or base_filters < 1 or num_classes < 2:
        raise ValueError("need depth >= 1, base_filters >= 1 and num_classes >= 2")
    if image_size % (2 ** depth):
        raise ValueError(f"image_size {image_size} is not divisible by 2**depth = {2 ** depth}")
    if norm not in ("batch", "group", "none"):
        raise ValueError(f"norm must be 'batch', 'group' or 'none', got {norm!r}")
    pool = layers.MaxPooling2D if spatial_dims == 2 else layers.MaxPooling3D
    up = layers.Conv2DTranspose if spatial_dims == 2 else layers.Conv3DTranspose
    conv = layers.Conv2D if spatial_dims == 2 else layers.Conv3D

    inputs = keras.Input((image_size,) * spatial_dims + (in_channels,), name="image")
    x, skips = inputs, []
    for level in range(depth):
        x = _conv_block(x, base_filters * 2 ** level, spatial_dims, norm, f"down{level}", bn_momentum)
        skips.append(x)
        x = pool(2, name=f"pool{level}")(x)
    x = _conv_block(x, base_filters * 2 ** depth, spatial_dims, norm, "bottleneck", bn_momentum)
    if dropout:
        x = layers.Dropout(dropout, name="dropout")(x)
    for level in reversed(range(depth)):
        x = up(base_filters * 2 ** level, 2, strides=2, name=f"up{level}")(x)
        x = layers.Concatenate(name=f"skip{level}")([x, skips[level]])
        x = _conv_block(x, base_filters * 2 ** level, spatial_dims, norm, f"dec{level}", bn_momentum)
    outputs = conv(num_classes, 1, activation="softmax", dtype="float32", name="probs")(x)
    return keras.Model(inputs, outputs, name=name)


def from_config(cfg: ModelConfig) -> keras.Model:
    return build_unet(cfg.image_size, depth=cfg.depth, base_filters=cfg.base_filters,
                      num_classes=cfg.num_classes, dropout=cfg.dropout, norm=cfg.norm,
                      bn_momentum=cfg.bn_momentum)


def soft_dice_per_class(probs: tf.Tensor, masks: tf.Tensor, num_classes: int) -> tf.Tensor:
    """Soft Dice of each class over the whole batch, shape (num_classes,).

    dice_c = (2 sum(p_c g_c) + s) / (sum(p_c) + sum(g_c) + s), sums over batch and
    space, with s = 1e-5 so that a class absent from both prediction and truth scores 1.
    """
    onehot = tf.one_hot(tf.cast(masks, tf.int32), num_classes, dtype=probs.dtype)
    axes = list(range(len(probs.shape) - 1))
    inter = tf.reduce_sum(probs * onehot, axis=axes)
    denom = tf.reduce_sum(probs, axis=axes) + tf.reduce_sum(onehot, axis=axes)
    return (2.0 * inter + _SMOOTH) / (denom + _SMOOTH)


def segmentation_loss(probs: tf.Tensor, masks: tf.Tensor, num_classes: int,
                      kind: str = "dice") -> tf.Tensor:
    """``dice``: negative mean soft Dice over classes (-1 is perfect), the convention of
    the Stampede2 liver study whose targets are -0.75 and -0.76. ``dice_ce``: that plus
    the mean categorical cross-entropy."""
    loss = -tf.reduce_mean(soft_dice_per_class(probs, masks, num_classes))
    if kind == "dice_ce":
        ce = keras.losses.sparse_categorical_crossentropy(tf.cast(masks, tf.int32), probs)
        loss = loss + tf.reduce_mean(ce)
    elif kind != "dice":
        raise ValueError(f"loss must be 'dice' or 'dice_ce', got {kind!r}")
    return loss


def dice_counts(probs: tf.Tensor, masks: tf.Tensor, num_classes: int) -> tf.Tensor:
    """Hard-Dice sufficient statistics, shape (3, num_classes): intersection, predicted
    and true voxel counts per class. Summed over batches and ranks, they give the exact
    Dice of the whole set (``dice_from_counts``)."""
    pred = tf.one_hot(tf.argmax(probs, axis=-1), num_classes, dtype=tf.float64)
    true = tf.one_hot(tf.cast(masks, tf.int32), num_classes, dtype=tf.float64)
    axes = list(range(len(probs.shape) - 1))
    return tf.stack([tf.reduce_sum(pred * true, axis=axes), tf.reduce_sum(pred, axis=axes),
                     tf.reduce_sum(true, axis=axes)])


def dice_from_counts(counts) -> list:
    """Per-class Dice from summed ``dice_counts``; None where a class is absent from
    both prediction and truth (Dice is undefined there)."""
    out = []
    for inter, pred, true in zip(*[list(map(float, row)) for row in counts]):
        out.append(None if pred + true == 0 else 2.0 * inter / (pred + true))
    return out
