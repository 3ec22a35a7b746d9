"""The U-Net builder for 2D and 3D (Keras 3 on TensorFlow); the losses and Dice are in
``distseg.losses``.

``build_unet`` builds the classic encoder-decoder of Ronneberger et al. for 2D or 3D
inputs (``spatial_dims``): two 3x3 convolutions per level, ``depth`` poolings, filters
doubling per level, transposed-convolution upsampling and skip concatenations. With
the livermask-style defaults (240x240, depth 4, 64 base filters) it has about 31M
parameters. It is a pure builder: no Horovod, no training state.

The 3D default of the ``liver3d`` preset (``spatial_dims=3``, 16 base filters, depth 4,
1 input channel, 3 classes, batch norm) has **5,649,363 parameters** (5,646,419
trainable and 2,944 BatchNorm moving statistics): the "about 5.65 M" of the reference
BraTS study of Intel and Dell. Their 3D U-Net (Intel's ``unet_3d``: the same topology
with a bias on every convolution before its BatchNorm, one FLAIR input channel and one
sigmoid output) has 5,650,801 (5,647,857 trainable); ours drops the 1,472 biases that
BatchNorm's offset makes redundant and has 3 softmax outputs instead of 1 sigmoid
(+34). ``distseg.networks.memory`` reproduces both counts from the same
``distseg.networks.spec.UNetSpec``.

Two options trade time or precision for memory on large 3D inputs (docs/memory.md):
``recompute`` (gradient checkpointing of every convolution unit of every level) and
``precision="bfloat16"`` (Keras' ``mixed_bfloat16`` policy on every layer, float32
softmax output).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import keras
import tensorflow as tf
from keras import layers

from distseg.core.config import LIVER_CLASSES, ModelConfig
from distseg.networks.spec import NORM_SUFFIX, UNetSpec, spec_of

#: Keras dtype policy per precision; None is Keras' global policy (float32 unless a
#: caller, such as a benchmark comparing policies, set another).
_POLICIES = {"float32": None, "bfloat16": "mixed_bfloat16"}


def norm_groups(filters: int) -> int:
    """Groups of GroupNorm for a layer of ``filters`` channels: 8 (Wu and He's default
    of 32 is too many for 16-filter U-Nets), or the largest power of two below it that
    divides ``filters``."""
    return next(g for g in (8, 4, 2, 1) if filters % g == 0)


class FusedBatchNorm(layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training pass runs TensorFlow's fused
    kernel (``FusedBatchNormV3``, oneDNN's on x86), with the same weights, names and
    moving-statistics rule (momentum, biased batch variance). distseg's BatchNorm.

    Keras 3's own layer computes the batch moments and the normalisation as a dozen
    separate element-wise ops, each a pass over the activations, forward and backward;
    the fused kernel makes fewer passes, so the training step is faster
    (docs/studies/normalisation-layers-2026-11-23.md). In bfloat16, Keras' layer also
    keeps a float32 copy of every convolution output for the backward pass, which
    undoes much of what bfloat16 saves (docs/studies/memory-calibration-2026-11-23.md);
    the fused kernel keeps its input in bfloat16. ``update_stats=False`` normalises with
    the batch moments without moving the statistics: a recomputation in the backward
    pass must not count the batch twice. Inference uses the Keras path unchanged.

    ``ghost_batch`` g > 0 (``model.bn_ghost_batch``) normalises each run of g samples of
    a larger batch with that run's own statistics (Hoffer et al. 2017's ghost batches):
    one process with a global batch of G then computes what N = G/g ranks compute with
    g samples each, so BatchNorm runs are exact across rank counts up to N (docs/
    training.md). The moving statistics move by the mean of the runs' statistics,
    which is what averaging the ranks' statistics at the epoch's end gives.
    """

    def __init__(self, *args, ghost_batch: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.ghost_batch = int(ghost_batch)

    def get_config(self):
        return {**super().get_config(), "ghost_batch": self.ghost_batch}

    def call(self, inputs, training=None, mask=None, update_stats=True):
        if not training or mask is not None or self.renorm or not (self.center and self.scale):
            return super().call(inputs, training=training, mask=mask)
        g, static = self.ghost_batch, inputs.shape[0]
        if g and static is not None:  # a batch size known when traced: split statically
            y, mean, variance = (self._split_batches(inputs) if static > g and static % g == 0
                                 else self._fused(inputs))
        elif g:
            batch = tf.shape(inputs)[0]
            y, mean, variance = tf.cond(
                tf.logical_and(batch > g, tf.equal(batch % g, 0)),
                functools.partial(self._ghost_batches, inputs),
                functools.partial(self._fused, inputs))
        else:
            y, mean, variance = self._fused(inputs)
        if update_stats:
            m = self.momentum
            self.moving_mean.assign(self.moving_mean * m + mean * (1.0 - m))
            self.moving_variance.assign(self.moving_variance * m + variance * (1.0 - m))
        return tf.cast(y, self.compute_dtype)

    def _fused(self, x):
        """(normalised x, batch mean, biased batch variance), from the fused kernel."""
        layout = "NHWC" if len(x.shape) == 4 else "NDHWC"
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta),
            epsilon=self.epsilon, data_format=layout, is_training=True)[:3]
        # The fused kernel returns the unbiased variance; Keras keeps the biased one.
        n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), variance.dtype)
        return y, mean, variance * (n - 1.0) / n

    def _split_batches(self, x):
        """``_ghost_batches`` for a batch size known when traced: the fused kernel on
        each run, joined, with less overhead than a loop over the runs
        (docs/studies/fixed-global-batch-2026-11-24.md, "Ghost batches")."""
        runs = [self._fused(part) for part in tf.split(x, x.shape[0] // self.ghost_batch)]
        return (tf.concat([r[0] for r in runs], 0), tf.reduce_mean([r[1] for r in runs], 0),
                tf.reduce_mean([r[2] for r in runs], 0))

    def _ghost_batches(self, x):
        """Each run of ``ghost_batch`` samples normalised with its own statistics (the
        mean of their statistics for the moving ones), for a batch size known only when
        the step runs: the runs become channels of one fused kernel call. (B, *S, C) is
        viewed as (g, *S, B/g x C), channel (r, c) holding channel c of run r, so the
        kernel's per-channel statistics are the runs' own. One call instead of a
        ``tf.map_fn`` loop over the runs, whose per-run overhead took a large share of
        the demo's step: docs/studies/fixed-global-batch-2026-11-24.md, "Ghost
        batches".)"""
        g, shape = self.ghost_batch, tf.shape(x)
        rank = len(x.shape)
        runs = shape[0] // g
        channels = shape[-1]
        # (runs, g, *S, C) -> (g, *S, runs, C) -> (g, *S, runs * C)
        grouped = tf.reshape(x, tf.concat([[runs, g], shape[1:]], 0))
        order = list(range(1, rank)) + [0, rank]
        wide = tf.reshape(tf.transpose(grouped, order),
                          tf.concat([[g], shape[1:-1], [runs * channels]], 0))
        gamma = tf.tile(tf.convert_to_tensor(self.gamma), [runs])
        beta = tf.tile(tf.convert_to_tensor(self.beta), [runs])
        layout = "NHWC" if rank == 4 else "NDHWC"
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            wide, gamma, beta, epsilon=self.epsilon, data_format=layout, is_training=True)[:3]
        n = tf.cast(tf.reduce_prod(tf.shape(wide)[:-1]), variance.dtype)
        variance = variance * (n - 1.0) / n
        back = [rank - 1] + list(range(rank - 1)) + [rank]
        y = tf.transpose(tf.reshape(y, tf.concat([[g], shape[1:-1], [runs, channels]], 0)), back)
        return (tf.reshape(y, shape), tf.reduce_mean(tf.reshape(mean, [runs, channels]), 0),
                tf.reduce_mean(tf.reshape(variance, [runs, channels]), 0))


class GroupNorm(layers.GroupNormalization):
    """``keras.layers.GroupNormalization`` (channels last, with scale and offset: how
    the U-Net uses it) with its gradient written out. distseg's GroupNorm.

    Keras reduces a (batch, positions, groups, channels per group) view over two strided
    axes and leaves the backward pass to automatic differentiation, a dozen more passes
    over every activation: a large share of a U-Net's training step
    (docs/studies/normalisation-layers-2026-11-23.md). Here every reduction runs over
    the positions of a (batch, positions, channels) view with the channels contiguous,
    the few per-channel sums are then added up per group, and the backward pass needs
    two reductions and one pass over the activations. Same weights, names, groups,
    epsilon and results (to float32 rounding) as Keras' layer; statistics and arithmetic
    in float32 whatever the input's dtype, as Keras does. Other configurations fall back
    to Keras' own code.
    """

    def call(self, inputs):
        if not (self.scale and self.center) or self.axis not in (-1, len(inputs.shape) - 1):
            return super().call(inputs)
        y = tf.custom_gradient(self._normalise)(inputs, tf.convert_to_tensor(self.gamma),
                                                tf.convert_to_tensor(self.beta))
        return tf.cast(y, self.compute_dtype)

    def _per_group(self, per_channel):
        """(batch, 1, channels) sums -> the same shape, each channel holding the total of
        its group."""
        shape = tf.shape(per_channel)
        grouped = tf.reshape(per_channel, [shape[0], self.groups, -1])
        total = tf.reduce_sum(grouped, axis=2, keepdims=True) + tf.zeros_like(grouped)
        return tf.reshape(total, shape)

    def _normalise(self, x, gamma, beta):
        channels = x.shape[-1]
        xf = tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1, channels])
        count = tf.cast(tf.shape(xf)[1] * (channels // self.groups), tf.float32)
        mean = self._per_group(tf.reduce_sum(xf, axis=1, keepdims=True)) / count
        mean_sq = self._per_group(tf.reduce_sum(tf.square(xf), axis=1, keepdims=True)) / count
        rstd = tf.math.rsqrt(tf.maximum(mean_sq - tf.square(mean), 0.0) + self.epsilon)
        g = tf.cast(gamma, tf.float32)
        scale = rstd * g
        shift = tf.cast(beta, tf.float32) - mean * scale
        y = tf.reshape(xf * scale + shift, tf.shape(x))
        # A bound partial, not a closure: tf.custom_gradient calls it with dy.
        return tf.cast(y, x.dtype), functools.partial(self._gradients, x, xf, mean, rstd, g, count)

    def _gradients(self, x, xf, mean, rstd, g, count, dy):
        """d/dx, d/dgamma, d/dbeta of y = (x - mean) * rstd * gamma + beta, per group."""
        df = tf.reshape(tf.cast(dy, tf.float32), tf.shape(xf))
        sum_dy = tf.reduce_sum(df, axis=1, keepdims=True)
        sum_dy_xhat = rstd * (tf.reduce_sum(df * xf, axis=1, keepdims=True) - mean * sum_dy)
        mean_dxhat = self._per_group(g * sum_dy) / count
        mean_dxhat_xhat = self._per_group(g * sum_dy_xhat) / count
        # dx = rstd (gamma dy - mean(dxhat) - xhat mean(dxhat xhat)), xhat = (x - mean) rstd,
        # with the terms in x gathered into one scale and one offset per channel.
        coef_x = -rstd * rstd * mean_dxhat_xhat
        const = rstd * (mean * rstd * mean_dxhat_xhat - mean_dxhat)
        dx = df * (rstd * g) + (xf * coef_x + const)
        return (tf.cast(tf.reshape(dx, tf.shape(x)), x.dtype),
                tf.reduce_sum(sum_dy_xhat, axis=[0, 1]), tf.reduce_sum(sum_dy, axis=[0, 1]))


#: The layer of each ``model.norm`` (``none``: no layer). A benchmark swaps entries to
#: time Keras' own layers against these (``benchmarks/benchlib/model_variants.py``).
NORM_LAYERS = {"batch": FusedBatchNorm, "group": GroupNorm, "instance": GroupNorm}
#: Instance normalisation's epsilon (nnU-Net's; Keras' GroupNormalization defaults to 1e-3).
INSTANCE_EPSILON = 1e-5


class ConvUnit(layers.Layer):
    """One convolution unit (3x3 conv -> norm -> ReLU) with gradient checkpointing: in
    training only its inputs are kept for the backward pass, which recomputes the unit
    (TensorFlow then frees the convolution and norm outputs after the forward pass).

    The first unit of a decoder level takes [lower level's output, skip] and also owns
    that level's transposed convolution (``up_name``): the upsampling and the skip
    concatenation are recomputed too instead of kept. The recomputation waits for the
    unit's output gradient (a data dependency), so the executor cannot run it early,
    and it does not move BatchNorm's statistics a second time.
    """

    def __init__(self, filters: int, spatial_dims: int, norm: str, bn_momentum: float,
                 name: str, index: int, dtype=None, up_name: str | None = None, up_dtype=None,
                 use_bias: bool = False, ghost_batch: int = 0):
        super().__init__(name=f"{name}_unit{index}", dtype=dtype)
        conv = layers.Conv2D if spatial_dims == 2 else layers.Conv3D
        up = layers.Conv2DTranspose if spatial_dims == 2 else layers.Conv3DTranspose
        # Created first, so the variables come in the plain model's order (up, conv, norm).
        self.up = up(filters, 2, strides=2, name=up_name, dtype=up_dtype) if up_name else None
        self.conv = conv(filters, 3, padding="same", use_bias=use_bias,
                         kernel_initializer="he_normal", name=f"{name}_conv{index}", dtype=dtype)
        self.norm = _norm_layer(norm, filters, bn_momentum, f"{name}_{NORM_SUFFIX.get(norm, '')}{index}",
                                dtype=dtype, ghost_batch=ghost_batch)

    def call(self, inputs, training=False):
        xs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if not training:
            return self._forward(xs, training=False)
        return tf.custom_gradient(self._checkpointed)(*xs)

    def _forward(self, xs, training, update_stats=True):
        if self.up is not None:
            xs = [self.up(xs[0])] + xs[1:]
        xs = [tf.cast(x, self.conv.compute_dtype) for x in xs]
        x = xs[0] if len(xs) == 1 else tf.concat(xs, axis=-1)
        x = self.conv(x)
        if isinstance(self.norm, FusedBatchNorm):  # not with a benchmark's Keras BatchNorm
            x = self.norm(x, training=training, update_stats=update_stats)
        elif self.norm is not None:
            x = self.norm(x, training=training)
        return tf.nn.relu(x)

    def _checkpointed(self, *xs):
        y = self._forward(list(xs), training=True)
        # A bound partial, not a closure: tf.custom_gradient calls it with the output
        # gradient and the variables the forward pass read.
        return y, functools.partial(self._recomputed_gradients, xs)

    def _recomputed_gradients(self, xs, dy, variables=None):
        variables = list(variables or [])
        # A data dependency on dy holds the recomputation back until the backward pass
        # reaches this unit (a zero that graph optimisations cannot fold away, as in
        # tf.recompute_grad; they may drop or move a control dependency). It costs a
        # transient copy of the unit's inputs.
        first = tf.reshape(dy, [-1])[:1]
        zero = tf.where(tf.reduce_all(tf.equal(first, first)), 0.0, float("nan"))
        again = [x + tf.cast(zero, x.dtype) for x in xs]
        with tf.GradientTape() as tape:
            tape.watch(again)
            tape.watch(variables)
            y = self._forward(again, training=True, update_stats=False)
        grads = tape.gradient(y, again + variables, output_gradients=dy)
        # The backward pass moves on only once this unit's weight gradients exist:
        # otherwise the executor may defer them and hold several units' recomputed
        # tensors at once, and a run could peak as high as the plain model
        # (docs/studies/memory-calibration-2026-11-23.md, "Recompute: units, not levels").
        with tf.control_dependencies([g for g in grads[len(again):] if g is not None]):
            inputs = [tf.identity(g) for g in grads[:len(again)]]
        return inputs, grads[len(again):]


def _norm_layer(norm: str, filters: int, bn_momentum: float, name: str, dtype, ghost_batch: int = 0):
    """The normalisation after a convolution, or None for ``norm="none"``."""
    if norm == "batch":
        ghost = {"ghost_batch": ghost_batch} if ghost_batch else {}
        return NORM_LAYERS["batch"](momentum=bn_momentum, name=name, dtype=dtype, **ghost)
    if norm == "group":
        return NORM_LAYERS["group"](norm_groups(filters), name=name, dtype=dtype)
    if norm == "instance":  # one group per channel: each sample's channel alone
        return NORM_LAYERS["instance"](filters, epsilon=INSTANCE_EPSILON, name=name, dtype=dtype)
    return None


@dataclasses.dataclass(frozen=True)
class _Parts:
    """Makes the layers of one ``UNetSpec``, level by level (names, filters and
    precisions from the spec)."""

    spec: UNetSpec
    bn_momentum: float
    ghost_batch: int = 0

    def dtype(self, level: int) -> str | None:
        """The Keras dtype policy of ``level``'s layers (``UNetSpec.precision_of``)."""
        return _POLICIES[self.spec.precision_of(level)]

    def unit(self, filters: int, block: str, level: int, i: int, **up) -> ConvUnit:
        """A checkpointed convolution unit (``recompute``)."""
        s = self.spec
        return ConvUnit(filters, s.spatial_dims, s.norm, self.bn_momentum, block, i,
                        dtype=self.dtype(level), use_bias=s.has_bias(), ghost_batch=self.ghost_batch,
                        **up)

    def decoder_block(self, below, skip, level: int):
        """Decoder ``level``: upsampling of the level below, the skip concatenation and
        two convolution units."""
        filters = self.spec.filters(level)
        if self.spec.recompute:  # the first unit upsamples and concatenates (both recomputed)
            x = self.unit(filters, f"dec{level}", level, 1, up_name=f"up{level}",
                          up_dtype=self.dtype(level + 1))([below, skip])
            return self.unit(filters, f"dec{level}", level, 2)(x)
        up = self.up(below, level)
        x = layers.Concatenate(name=f"skip{level}", dtype=self.dtype(level))([up, skip])
        return self.block(x, f"dec{level}", level)

    def block(self, x, block: str, level: int):
        """Two convolution units (conv, norm, ReLU)."""
        s, dtype, filters = self.spec, self.dtype(level), self.spec.filters(level)
        if s.recompute:
            for i in (1, 2):
                x = self.unit(filters, block, level, i)(x)
            return x
        conv = layers.Conv2D if s.spatial_dims == 2 else layers.Conv3D
        for i in (1, 2):
            x = conv(filters, 3, padding="same", use_bias=s.has_bias(),
                     kernel_initializer="he_normal", name=f"{block}_conv{i}", dtype=dtype)(x)
            norm = _norm_layer(s.norm, filters, self.bn_momentum, s.norm_name(block, i), dtype=dtype,
                               ghost_batch=self.ghost_batch)
            if norm is not None:
                x = norm(x)
            x = layers.Activation("relu", name=f"{block}_relu{i}", dtype=dtype)(x)
        return x

    def pool(self, x, level: int):
        """Max-pooling from ``level`` to ``level + 1``, in the precision of the latter."""
        pool = layers.MaxPooling2D if self.spec.spatial_dims == 2 else layers.MaxPooling3D
        return pool(2, name=f"pool{level}", dtype=self.dtype(level + 1))(x)

    def up(self, x, level: int):
        """Transposed convolution from ``level + 1`` to ``level``, in the precision of the
        former (its filter gradient is computed on the smaller extents)."""
        up = layers.Conv2DTranspose if self.spec.spatial_dims == 2 else layers.Conv3DTranspose
        return up(self.spec.filters(level), 2, strides=2, name=f"up{level}", dtype=self.dtype(level + 1))(x)

    def head(self, x):
        """Per-class probabilities, always float32. In bfloat16 the 1x1 convolution runs
        in bfloat16 and only its logits are cast for the softmax (a float32 1x1 conv would
        keep a float32 copy of the last level's features for its backward pass)."""
        conv = layers.Conv2D if self.spec.spatial_dims == 2 else layers.Conv3D
        classes = self.spec.num_classes
        if self.spec.precision == "float32":
            return conv(classes, 1, activation="softmax", dtype="float32", name="probs")(x)
        logits = conv(classes, 1, dtype=self.dtype(0), name="logits")(x)
        return layers.Activation("softmax", dtype="float32", name="probs")(logits)


def build_unet(image_size: int | None = None, *, input_shape: Sequence[int] | None = None,
               name: str = "unet", **fields) -> keras.Model:
    """The U-Net of ``ModelConfig()`` with ``fields`` replaced (``num_classes`` 3 and
    ``precision`` float32 unless given): the keyword form of ``from_config`` that tests and benchmarks use, with the
    config's defaults (240x240 slices, depth 4, 64 base filters, BatchNorm).

    Args:
      image_size: extent on every axis when ``input_shape`` is not given.
      input_shape: spatial extents, (H, W) or (D, H, W), each divisible by 2**depth.
      name: the Keras model's name.
      **fields: any ``ModelConfig`` field (``spatial_dims``, ``depth``, ``base_filters``,
        ``norm``, ``recompute``, ``precision``, ``bn_ghost_batch`` ...).

    Raises:
      ValueError: a hyper-parameter that cannot build a valid network.
    """
    fields.setdefault("num_classes", len(LIVER_CLASSES))
    fields.setdefault("precision", "float32")
    if image_size is not None:
        fields["image_size"] = image_size
    return from_config(dataclasses.replace(ModelConfig(), **fields), input_shape, name=name)


def build(spec: UNetSpec, *, dropout: float = 0.0, bn_momentum: float = 0.9,
          bn_ghost_batch: int = 0, name: str = "unet") -> keras.Model:
    """The Keras model of ``spec`` (softmax outputs, so ``spec.num_classes >= 2``)."""
    if spec.num_classes < 2 or spec.conv_bias:
        raise ValueError("distseg builds softmax U-Nets without convolution biases before a "
                         f"norm: num_classes >= 2 and conv_bias False, got {spec.num_classes}, "
                         f"{spec.conv_bias}")
    parts = _Parts(spec, bn_momentum, bn_ghost_batch)
    inputs = keras.Input(spec.spatial + (spec.in_channels,), name="image")
    x, skips = inputs, []
    for level in range(spec.depth):
        x = parts.block(x, f"down{level}", level)
        skips.append(x)
        x = parts.pool(x, level)
    x = parts.block(x, "bottleneck", spec.depth)
    if dropout:
        x = layers.Dropout(dropout, name="dropout", dtype=parts.dtype(spec.depth))(x)
    for level in reversed(range(spec.depth)):
        x = parts.decoder_block(x, skips[level], level)
    return keras.Model(inputs, parts.head(x), name=name)


def from_config(cfg: ModelConfig, input_shape: Sequence[int] | None = None,
                name: str = "unet") -> keras.Model:
    """The U-Net of a ``ModelConfig``, for inputs of ``input_shape`` (the 2D slice or
    the 3D slab; None: ``image_size`` on every axis): ``build`` of ``spec_of``. The
    config's classes must have been read from the data file (``feeds.with_classes``) or
    set.

    Raises:
      ValueError: a hyper-parameter that cannot build a valid network.
    """
    if not cfg.num_classes:
        raise ValueError("model.num_classes is 0, which means 'from the data file': "
                         "resolve it with distseg.data.feeds.with_classes first")
    if cfg.num_classes < 2:
        raise ValueError(f"need num_classes >= 2 (softmax), got {cfg.num_classes}")
    return build(spec_of(cfg, input_shape), dropout=cfg.dropout, bn_momentum=cfg.bn_momentum,
                 bn_ghost_batch=cfg.bn_ghost_batch, name=name)
