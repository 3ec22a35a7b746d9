"""distseg's U-Net with its normalisation layers swapped for Keras' own, to time what
distseg's layers buy (an A/B of a change that landed, kept so it can be re-measured on
another machine or TensorFlow build).

distseg's BatchNorm (``distseg.networks.unet.FusedBatchNorm``) runs TensorFlow's fused kernel in
training; Keras 3's ``BatchNormalization`` computes the batch moments and the
normalisation as a dozen separate element-wise ops (Mean, SquaredDifference,
BroadcastTo, Sub, Mul, ...), each a pass over the activations, forward and backward.
distseg's GroupNorm (``distseg.networks.unet.GroupNorm``) writes its gradient out; Keras'
``GroupNormalization`` reduces over two strided axes and leaves the backward pass to
automatic differentiation (on the demo U-Net it took 28% of a training step: 569 ms of
CPU per step, against 412 ms with no normalisation).

Variants (``VARIANTS``): ``keras`` (distseg's model as it is; the name is historical),
``kerasbn`` (Keras' BatchNormalization), ``kerasgn`` (Keras' GroupNormalization). The
U-Net keeps its one definition in distseg: a variant only swaps entries of
``distseg.networks.unet.NORM_LAYERS`` while the model is built.

``model_and_optimizer`` is how every benchmark that trains builds what it trains: the
run's own factory (``distseg.training.step.factory``) with a variant's layers swapped in, so
the optimizer is the config's (``train.optimizer``, weight decay, clipping), as in the
run it stands for.
"""

from __future__ import annotations

import contextlib

import keras

from distseg.networks import unet as model_lib

# Bound at import, so a caller that replaces ``model_lib.from_config`` by ``build``
# (``benchlib.train_variant``) still reaches distseg's own builder here.
from distseg.networks.unet import from_config as distseg_from_config

VARIANTS = ("keras", "kerasbn", "kerasgn")
#: variant -> the ``NORM_LAYERS`` entries it replaces.
KERAS_NORMS = {"kerasbn": {"batch": keras.layers.BatchNormalization},
               "kerasgn": {"group": keras.layers.GroupNormalization}}


@contextlib.contextmanager
def swapped_norms(**replacements):
    """While open, ``distseg.networks.unet.NORM_LAYERS`` has ``replacements`` for some norms."""
    original = dict(model_lib.NORM_LAYERS)
    model_lib.NORM_LAYERS.update(replacements)
    try:
        yield
    finally:
        model_lib.NORM_LAYERS.clear()
        model_lib.NORM_LAYERS.update(original)


def swapped(variant: str):
    """While open, distseg builds its U-Net as the model variant ``variant``."""
    if variant != "keras" and variant not in KERAS_NORMS:
        raise ValueError(f"model variant must be one of {VARIANTS}, got {variant!r}")
    return swapped_norms(**KERAS_NORMS.get(variant, {}))


def model_and_optimizer(cfg, input_shape, seed: int, *, variant: str = "keras"):
    """(model, optimizer) of the run config ``cfg`` as ``distseg-train`` builds them
    (``factory.model_and_optimizer``: the optimizer of ``train.optimizer`` at
    ``train.lr``, built with its slots), the model as the variant ``variant``."""
    from distseg.training.step import factory
    with swapped(variant):
        return factory.model_and_optimizer(cfg, input_shape, seed)


def build(model_cfg, input_shape=None, name: str = "unet", *, variant: str = "keras"):
    """distseg's U-Net for ``model_cfg`` as the model variant ``variant``; the
    arguments of ``distseg.networks.unet.from_config``, which ``benchlib.train_variant``
    puts this in place of."""
    with swapped(variant):
        return distseg_from_config(model_cfg, input_shape, name=name)
