"""distseg's U-Net with one layer type swapped, for A/B timing of a proposed change.

Keras 3's ``BatchNormalization`` on the TensorFlow backend is not fused: it computes
the batch moments and the normalisation as a dozen separate element-wise ops (Mean,
SquaredDifference, BroadcastTo, Sub, Mul, ...), each a pass over the activations on
TensorFlow's generic CPU kernels, forward and backward. distseg's float32 model uses
that layer; its bfloat16 and recompute paths use ``distseg.model.FusedBatchNorm``
(the same layer, same weights and names, whose training pass runs TensorFlow's fused
kernel, oneDNN's on x86).

``build(cfg, input_shape, variant=...)`` builds ``distseg.model.from_config`` itself, with
``keras.layers.BatchNormalization`` replaced by ``FusedBatchNorm`` while it builds
(variant ``fusedbn``): the U-Net keeps its one definition in distseg, and nothing in
distseg changes.

Variants (``VARIANTS``): ``keras`` (distseg's model as it is), ``fusedbn``.
"""

from __future__ import annotations

import contextlib
import types

from distseg import model as model_lib
# Bound at import, so a caller that replaces ``model_lib.from_config`` by ``build``
# (``benchlib.train_variant``) still reaches distseg's own builder here.
from distseg.model import from_config as distseg_from_config

VARIANTS = ("keras", "fusedbn")


@contextlib.contextmanager
def swapped_layers(module, **replacements):
    """While open, ``module.layers`` (a module's ``from keras import layers``) is a
    namespace whose named layers are ``replacements`` and the rest Keras' own."""
    original = module.layers
    names = {n: getattr(original, n) for n in dir(original) if not n.startswith("_")}
    module.layers = types.SimpleNamespace(**{**names, **replacements})
    try:
        yield
    finally:
        module.layers = original


def build(model_cfg, input_shape=None, *, variant: str = "keras"):
    """distseg's U-Net for ``model_cfg`` as the model variant ``variant``."""
    if variant == "keras":
        return distseg_from_config(model_cfg, input_shape)
    if variant == "fusedbn":
        with swapped_layers(model_lib, BatchNormalization=model_lib.FusedBatchNorm):
            return distseg_from_config(model_cfg, input_shape)
    raise ValueError(f"model variant must be one of {VARIANTS}, got {variant!r}")
