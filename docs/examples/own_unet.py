"""A model of your own for distseg-train --model-fn docs/examples/own_unet.py:build.

distseg calls ``build(input_shape, num_classes, **model_args)`` on every rank:
``input_shape`` is the sample's spatial extents plus its channels, (H, W, C) for a
slice file or (D, H, W, C) for a volume file, and ``num_classes`` is the data file's.
Return a keras.Model whose one output is softmax probabilities of shape
(batch, *spatial, num_classes). The loss is distseg's (global soft Dice, optionally
with cross-entropy); train it with --model-arg filters=16 --model-arg levels=3.

GroupNorm, not BatchNorm: its statistics are each sample's own, so N ranks of a fixed
global batch make the update one process makes (docs/own-model.md). distseg's
``GroupNorm`` is Keras' ``GroupNormalization`` (same weights and results) with its
gradient written out: faster, and its rounding grows less with the batch split. No
dropout: Keras seeds it per rank.
"""

import keras
from keras import layers

from distseg.networks.unet import GroupNorm


def _unit(x, filters: int, conv, name: str):
    for i in (1, 2):
        x = conv(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        x = GroupNorm(groups=min(8, filters), name=f"{name}_gn{i}")(x)
        x = layers.Activation("relu", name=f"{name}_relu{i}")(x)
    return x


def build(input_shape, num_classes, filters=8, levels=2):
    """A small U-Net of ``levels`` poolings, 2D or 3D after ``input_shape``."""
    dims = len(input_shape) - 1
    conv = layers.Conv2D if dims == 2 else layers.Conv3D
    pool = layers.MaxPooling2D if dims == 2 else layers.MaxPooling3D
    up = layers.Conv2DTranspose if dims == 2 else layers.Conv3DTranspose
    image = keras.Input(input_shape)
    x, skips = image, []
    for level in range(levels):
        x = _unit(x, filters * 2 ** level, conv, f"enc{level}")
        skips.append(x)
        x = pool(2, name=f"pool{level}")(x)
    x = _unit(x, filters * 2 ** levels, conv, "bottom")
    for level in reversed(range(levels)):
        x = up(filters * 2 ** level, 2, strides=2, name=f"up{level}")(x)
        x = layers.Concatenate(name=f"skip{level}")([x, skips[level]])
        x = _unit(x, filters * 2 ** level, conv, f"dec{level}")
    probs = conv(num_classes, 1, activation="softmax", name="classes")(x)
    return keras.Model(image, probs, name="own_unet")
