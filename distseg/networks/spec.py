"""The one description of a distseg U-Net, read by the Keras builder
(``distseg.networks.unet``) and by the memory planner (``distseg.networks.memory``).

Plain Python: the planner answers on a login node without TensorFlow. What a level is
(its extents, filters, precision) and what each layer is called are decided here once;
the builder makes those layers, the planner counts their tensors, and
tests/unit/test_memory.py holds the two to each other layer by layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from distseg.core.config import AUTO, NORMS, PRECISIONS, ModelConfig
from distseg.core.errors import InputError

#: The name part of each norm's layers (``down0_bn1``, ``dec2_gn2``).
NORM_SUFFIX = {"batch": "bn", "group": "gn", "instance": "in"}


def level_precision(precision: str, spatial: tuple[int, ...], level: int) -> str:
    """The precision U-Net level ``level`` computes in: ``precision``, except that a
    bfloat16 3D level with an extent of 2 or less computes in float32. oneDNN's bfloat16
    3D convolution filter gradient (TensorFlow 2.18.1, AVX512_BF16) intermittently
    returns non-finite values when an extent is 2, which made bfloat16 runs diverge to
    NaN (docs/studies/memory-calibration-2026-11-23.md, "Float32 where an extent is
    2"); such levels hold a negligible share of the activations."""
    if precision == "bfloat16" and len(spatial) == 3 and min(s // 2 ** level for s in spatial) <= 2:
        return "float32"
    return precision


@dataclass(frozen=True)
class UNetSpec:
    """A U-Net: the classic encoder-decoder of Ronneberger et al. with two 3x3 (x3)
    convolution units per level, ``depth`` poolings, filters doubling per level,
    transposed-convolution upsampling and skip concatenations.

    Raises ``InputError`` (a ``ValueError``) naming what cannot build a network.
    """

    spatial: tuple[int, ...]
    """Input extents, (H, W) or (D, H, W); each divisible by 2**depth."""
    depth: int = ModelConfig.depth
    base_filters: int = ModelConfig.base_filters
    in_channels: int = 1
    num_classes: int = 3
    """Output classes (softmax); 1 means one sigmoid output (the reference study's
    model, which the planner counts and the builder does not make)."""
    norm: str = ModelConfig.norm
    conv_bias: bool = False
    """A bias on convolutions followed by a norm (distseg drops it; the reference keeps it)."""
    recompute: bool = ModelConfig.recompute
    precision: str = PRECISIONS[0]
    """What the network computes in (float32 unless given; a config's ``auto`` is decided
    by a training run before a spec is made)."""

    def __post_init__(self):
        object.__setattr__(self, "spatial", tuple(int(s) for s in self.spatial))
        pool = 2 ** self.depth
        if self.depth < 1 or self.base_filters < 1 or self.num_classes < 1 or self.in_channels < 1:
            raise InputError("need depth >= 1, base_filters >= 1, in_channels >= 1 and num_classes >= 1")
        if len(self.spatial) not in (2, 3) or any(s < 1 or s % pool for s in self.spatial):
            raise InputError(f"input {'x'.join(map(str, self.spatial))}: expected 2 or 3 extents, "
                             f"each a multiple of 2**depth = {pool}")
        if self.norm not in NORMS:
            raise InputError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    @property
    def spatial_dims(self) -> int:
        return len(self.spatial)

    @classmethod
    def reference(cls, spatial=(144, 144, 144)) -> "UNetSpec":
        """The 3D U-Net of the Intel/Dell BraTS study (Intel's ``unet_3d``): 16 base
        filters, 4 poolings, a bias on every convolution, 1 FLAIR channel, 1 sigmoid
        output; 5,650,801 parameters."""
        return cls(tuple(spatial), depth=4, base_filters=16, norm="batch", conv_bias=True,
                   num_classes=1)

    def filters(self, level: int) -> int:
        """Channels of ``level``'s convolutions (``depth``: the bottleneck)."""
        return self.base_filters * 2 ** level

    def shape(self, level: int) -> tuple[int, ...]:
        """Extents of ``level``: the input's, halved ``level`` times."""
        return tuple(s // 2 ** level for s in self.spatial)

    def voxels(self, level: int) -> int:
        return math.prod(self.shape(level))

    def precision_of(self, level: int) -> str:
        """The precision ``level`` computes in (``level_precision``)."""
        return level_precision(self.precision, self.spatial, level)

    def has_bias(self) -> bool:
        """Whether the 3x3 convolutions carry a bias (only without a norm after them,
        unless ``conv_bias``)."""
        return self.conv_bias or self.norm == "none"

    def norm_name(self, block: str, unit: int) -> str:
        """The name of unit ``unit``'s norm layer in ``block`` (``down0``, ``dec1``,
        ``bottleneck``)."""
        return f"{block}_{NORM_SUFFIX.get(self.norm, '')}{unit}"


def spatial_shape(image_size: int, input_shape: Sequence[int] | None, spatial_dims: int,
                  depth: int) -> tuple[int, ...]:
    """The input's spatial extents: ``input_shape`` if given, else ``image_size`` on every
    axis. Raises ``InputError`` (a ``ValueError``) unless there is one extent per spatial
    dimension, each divisible by 2**depth (every pooling halves it exactly)."""
    if spatial_dims not in (2, 3):
        raise InputError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
    shape = tuple(int(s) for s in input_shape) if input_shape else (image_size,) * spatial_dims
    if len(shape) != spatial_dims:
        raise InputError(f"input_shape {shape} must have {spatial_dims} extents for "
                         f"spatial_dims={spatial_dims}")
    for extent in shape:
        if extent < 1 or extent % (2 ** depth):
            what = "image_size" if not input_shape else f"input_shape {shape}: extent"
            raise InputError(f"{what} {extent} is not divisible by 2**depth = {2 ** depth}")
    return shape


def spec_of(cfg: ModelConfig, input_shape: Sequence[int] | None = None) -> UNetSpec:
    """The spec of a ``ModelConfig`` for inputs of ``input_shape`` (None: ``image_size``
    on every axis): the one path from a config to a network, which the builder
    (``unet.from_config``) takes.

    Raises:
      InputError: extents that do not fit ``cfg.depth``, or a config no spec can hold
        (``precision`` ``auto``, which only a training run's start decides).
    """
    if cfg.precision == AUTO:
        raise InputError(f"model.precision {cfg.precision!r} is decided when a training run "
                         f"starts (distseg.training.startup.precision); a network is built in one of "
                         f"{PRECISIONS}")
    shape = spatial_shape(cfg.image_size, input_shape, cfg.spatial_dims, cfg.depth)
    return UNetSpec(shape, depth=cfg.depth, base_filters=cfg.base_filters,
                    in_channels=cfg.channels, num_classes=cfg.num_classes, norm=cfg.norm, recompute=cfg.recompute,
                    precision=cfg.precision)
