"""On-the-fly augmentation of training samples (``data.augment``: none, light, default).

``Augmenter(kind, seed, spatial_dims)`` is called in the reader thread as
``augmenter(ids, epoch, images, masks) -> (images, masks)`` on each training batch:
``images`` float32 ``(B, *spatial, C)``, ``masks`` uint8 ``(B, *spatial)`` class ids,
``spatial`` ``(H, W)`` or ``(D, H, W)``. Validation never passes through it.

Design:

* **Keyed by the data, not the rank.** Every random number of sample ``id`` in
  ``epoch`` comes from ``np.random.default_rng([seed, SALT, epoch, id])``: never from the
  rank, the batch or the sample's place in it. N ranks that split a fixed global batch
  draw exactly what one process draws, and a resumed run draws what an uninterrupted
  one would have.
* **Draw, then apply.** ``draw`` turns one sample's generator into a ``Draw``: which
  transforms fired and their parameters (small; the fields of noise are drawn at
  apply time from a seed in the draw). ``apply`` is deterministic given the draw. The
  tests count the draws to check each probability.
* **One resampling.** Rotation, scaling and elastic deformation compose into one
  coordinate map per sample and one ``scipy.ndimage.map_coordinates`` call per channel
  (images: linear, outside filled with the channel's minimum) and one for the mask
  (nearest neighbour, outside 0), only when one of them fired. The elastic field is
  Gaussian noise on a coarse grid of ``ELASTIC_NODES`` points per axis, upsampled by
  separable Gaussian weights (a few small matrix products, not a full-resolution
  Gaussian filter). Mirroring is a flip; intensity transforms act on each channel
  with its own parameters, float32 throughout.

The anchor is nnU-Net v2's default training augmentation (``nnUNetTrainer.
get_training_transforms``, batchgeneratorsv2): its probabilities and ranges, its
order (spatial, noise, blur, brightness, contrast, inverted gamma, gamma, mirroring)
and its two-sided draws of factors (``BGContrast``: half the time below 1, half above).
The differences: elastic deformation fires in ``default`` with batchgenerators'
classic p 0.2 (nnU-Net v2 switched it off); the simulated low resolution is left out;
the noise's sigma is relative to the channel's std (nnU-Net's images are z-scored,
ours may be windowed to [0, 1]); masks are resampled by nearest neighbour.

=====================  =====================================  ============================
transform              ``default`` (nnU-Net)                  ``light``
=====================  =====================================  ============================
rotation               p 0.2; 2D +-180 deg; 3D +-30 deg       p 0.2; +-15 deg (3D: about
                       about each axis (a slab flatter than   each axis; a flat slab:
                       ``ANISOTROPY``: +-180 deg in-plane)    in-plane)
scaling                p 0.2; x0.7-1.4, all axes alike       p 0.2; x0.85-1.15
elastic                p 0.2; node std 0-4 % of the edge      --
mirroring              p 0.5 per spatial axis                 p 0.5 per spatial axis
Gaussian noise         p 0.1; sigma 0-0.1 x channel std       --
Gaussian blur          p 0.2; each channel p 0.5, sigma       --
                       0.5-1 per axis
brightness (x)         p 0.15; x0.75-1.25 per channel         p 0.15; x0.75-1.25
contrast               p 0.15; x0.75-1.25 about the mean,     p 0.15; x0.75-1.25
                       clipped to the channel's range
gamma, inverted        p 0.1; gamma 0.7-1.5, stats kept       --
gamma                  p 0.3; gamma 0.7-1.5, stats kept       --
=====================  =====================================  ============================

Scaling by s samples the input over s times the output's extent: s > 1 shows the
anatomy smaller (nnU-Net's convention). In a slab flatter than ``ANISOTROPY`` (depth
x3 smaller than its largest edge; nnU-Net's "dummy 2D" rule) rotation, scaling and the
elastic field stay in-plane. ``light`` is the cheap subset: mirroring and the two
linear intensity transforms cost microseconds, and the small rotation or scaling (no
elastic field) is one resampling in 2 of 5 samples.

numpy and scipy only: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
from scipy import ndimage

#: Mixed into every sample's seed, so augmentation draws never coincide with another
#: stream seeded by (seed, epoch) (the shard permutation of ``data.sharding``).
SALT = 0x617567
#: Control points of the coarse elastic grid per axis.
ELASTIC_NODES = 5
#: A 3D sample whose largest edge exceeds its depth this many times is augmented
#: in-plane (nnU-Net's ``ANISO_THRESHOLD``).
ANISOTROPY = 3.0
#: Keeps gamma and contrast finite on a constant channel.
EPS = 1e-7


@dataclass(frozen=True)
class Preset:
    """Probabilities (per sample unless said) and ranges of the transforms; all zero
    is the identity."""

    p_rotation: float = 0.0
    rotation_deg: float = 0.0
    """In-plane: 2D samples and 3D slabs flatter than ``ANISOTROPY``."""
    rotation_deg_3d: float = 0.0
    """About each axis of other 3D samples."""
    p_scaling: float = 0.0
    scaling: tuple[float, float] = (1.0, 1.0)
    p_elastic: float = 0.0
    elastic: tuple[float, float] = (0.0, 0.0)
    """Std of the coarse grid's displacements, a fraction of each axis' edge."""
    p_mirror: float = 0.0
    """Per spatial axis."""
    p_noise: float = 0.0
    noise: tuple[float, float] = (0.0, 0.0)
    """Sigma, relative to the channel's std (one sigma for all channels)."""
    p_blur: float = 0.0
    p_blur_channel: float = 0.0
    blur: tuple[float, float] = (0.0, 0.0)
    """Sigma in voxels, drawn per channel and axis."""
    p_brightness: float = 0.0
    brightness: tuple[float, float] = (1.0, 1.0)
    p_contrast: float = 0.0
    contrast: tuple[float, float] = (1.0, 1.0)
    p_gamma_inverted: float = 0.0
    p_gamma: float = 0.0
    gamma: tuple[float, float] = (1.0, 1.0)

    def is_identity(self) -> bool:
        return not any(getattr(self, f.name) for f in dataclasses.fields(self)
                       if f.name.startswith("p_"))


DEFAULT = Preset(
    p_rotation=0.2, rotation_deg=180.0, rotation_deg_3d=30.0,
    p_scaling=0.2, scaling=(0.7, 1.4), p_elastic=0.2, elastic=(0.0, 0.04), p_mirror=0.5,
    p_noise=0.1, noise=(0.0, 0.1), p_blur=0.2, p_blur_channel=0.5, blur=(0.5, 1.0),
    p_brightness=0.15, brightness=(0.75, 1.25), p_contrast=0.15, contrast=(0.75, 1.25),
    p_gamma_inverted=0.1, p_gamma=0.3, gamma=(0.7, 1.5))
LIGHT = Preset(
    p_rotation=0.2, rotation_deg=15.0, rotation_deg_3d=15.0, p_scaling=0.2, scaling=(0.85, 1.15),
    p_mirror=0.5, p_brightness=0.15, brightness=DEFAULT.brightness,
    p_contrast=0.15, contrast=DEFAULT.contrast)
#: ``data.augment`` -> its preset (``core.config.AUGMENTS``).
PRESETS = {"none": Preset(), "light": LIGHT, "default": DEFAULT}


class Draw(NamedTuple):
    """One sample's random choices; None (or empty): the transform did not fire."""

    rotation: tuple[float, ...] | None
    """Radians: 2D one angle; 3D one about each axis (a flat slab: about the depth
    axis only)."""
    scale: tuple[float, ...] | None
    """Per spatial axis (1 along the depth of a flat slab)."""
    elastic: np.ndarray | None
    """(dims, *nodes) coarse displacements in voxels."""
    mirror: tuple[int, ...]
    noise: float | None
    blur: tuple[tuple[float, ...] | None, ...] | None
    """Per channel: sigmas per axis, or None for a channel left sharp."""
    brightness: np.ndarray | None
    contrast: np.ndarray | None
    gamma_inverted: np.ndarray | None
    gamma: np.ndarray | None
    field_seed: int
    """Seeds the noise fields."""

    def spatial(self) -> bool:
        return self.rotation is not None or self.scale is not None or self.elastic is not None


def sample_rng(seed: int, epoch: int, sample: int) -> np.random.Generator:
    """The one generator of sample ``sample`` in ``epoch`` of a run seeded ``seed``."""
    return np.random.default_rng([int(seed), SALT, int(epoch), int(sample)])


def two_sided(rng: np.random.Generator, lo: float, hi: float, n: int | None = None):
    """nnU-Net's ``BGContrast``: half the draws in [lo, 1), half in [1, hi] (a factor
    below 1 as likely as one above, however asymmetric the range)."""
    below = rng.random(n) < 0.5
    low, high = rng.uniform(lo, 1.0, n), rng.uniform(max(lo, 1.0), hi, n)
    return np.where(below & (lo < 1.0), low, high).astype(np.float32)


def is_flat(shape: Sequence[int]) -> bool:
    """A 3D sample augmented in-plane (nnU-Net's dummy 2D augmentation)."""
    return len(shape) == 3 and max(shape) / shape[0] > ANISOTROPY


def draw(preset: Preset, rng: np.random.Generator, shape: Sequence[int], channels: int) -> Draw:
    """One sample's ``Draw`` under ``preset`` for a sample of spatial ``shape`` with
    ``channels`` channels. Which transforms fire is drawn first, all at once, so the
    draws of one never shift the firing of another."""
    p = preset
    fired = rng.random(9) < np.array([p.p_rotation, p.p_scaling, p.p_elastic, p.p_noise, p.p_blur,
                                      p.p_brightness, p.p_contrast, p.p_gamma_inverted, p.p_gamma])
    mirror = tuple(int(a) for a in np.flatnonzero(rng.random(len(shape)) < p.p_mirror))
    rotation, scale, elastic = _draw_spatial(p, rng, tuple(shape), fired[:3])
    return Draw(
        rotation=rotation, scale=scale, elastic=elastic, mirror=mirror,
        noise=float(rng.uniform(*p.noise)) if fired[3] else None,
        blur=_draw_blur(p, rng, len(shape), channels) if fired[4] else None,
        brightness=two_sided(rng, *p.brightness, channels) if fired[5] else None,
        contrast=two_sided(rng, *p.contrast, channels) if fired[6] else None,
        gamma_inverted=two_sided(rng, *p.gamma, channels) if fired[7] else None,
        gamma=two_sided(rng, *p.gamma, channels) if fired[8] else None,
        field_seed=int(rng.integers(2**63)))


def _draw_spatial(p: Preset, rng: np.random.Generator, shape: tuple, fired) -> tuple:
    dims, flat = len(shape), is_flat(shape)
    rotation = scale = elastic = None
    if fired[0]:
        in_plane = dims == 2 or flat
        limit = math.radians(p.rotation_deg if in_plane else p.rotation_deg_3d)
        angles = [float(a) for a in rng.uniform(-limit, limit, 1 if in_plane else dims)]
        rotation = tuple(angles + [0.0, 0.0] if flat else angles)
    if fired[1]:
        s = float(rng.uniform(*p.scaling))
        scale = tuple(1.0 if flat and axis == 0 else s for axis in range(dims))
    if fired[2]:
        edges = np.array(shape, np.float32).reshape((dims,) + (1,) * dims)
        elastic = (rng.standard_normal((dims,) + (ELASTIC_NODES,) * dims, np.float32)
                   * np.float32(rng.uniform(*p.elastic)) * edges)
        if flat:
            elastic[0] = 0.0
    return rotation, scale, elastic


def _draw_blur(p: Preset, rng: np.random.Generator, dims: int, channels: int) -> tuple:
    chosen = rng.random(channels) < p.p_blur_channel
    sigmas = rng.uniform(*p.blur, (channels, dims))
    return tuple(tuple(float(s) for s in sigmas[c]) if chosen[c] else None for c in range(channels))


# --- the spatial transform ----------------------------------------------------------


@functools.lru_cache(maxsize=8)
def centred_grid(shape: tuple[int, ...]) -> np.ndarray:
    """(dims, *shape) float32 coordinates of every voxel relative to the centre."""
    axes = [np.arange(n, dtype=np.float32) - np.float32((n - 1) / 2) for n in shape]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"))
    grid.setflags(write=False)
    return grid


@functools.lru_cache(maxsize=8)
def upsampling_weights(n: int, nodes: int = ELASTIC_NODES) -> np.ndarray:
    """(n, nodes) normalised Gaussian weights of each node at each of ``n`` voxels
    (width: the node spacing), so a coarse field becomes a smooth one by products."""
    centres = np.linspace(0.0, n - 1.0, nodes)
    spacing = max((n - 1.0) / (nodes - 1), 1.0)
    w = np.exp(-0.5 * ((np.arange(n)[:, None] - centres[None, :]) / spacing) ** 2)
    w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
    w.setflags(write=False)
    return w


def elastic_field(coarse: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(dims, *shape) displacements upsampled from (dims, *nodes) ``coarse``."""
    field = coarse
    for axis, n in enumerate(shape):  # contract one node axis at a time, separably
        field = np.moveaxis(np.tensordot(field, upsampling_weights(n), axes=([1 + axis], [1])),
                            -1, 1 + axis)
    return field


def rotation_matrix(angles: Sequence[float]) -> np.ndarray:
    """2 x 2 for one angle (a plane's rotation), else 3 x 3: rotation by ``angles[k]``
    about spatial axis k, composed axis 0 first."""
    if len(angles) == 1:
        c, s = math.cos(angles[0]), math.sin(angles[0])
        return np.array([[c, -s], [s, c]])
    out = np.eye(3)
    for axis, a in enumerate(angles):
        i, j = [k for k in range(3) if k != axis]
        r = np.eye(3)
        r[i, i] = r[j, j] = math.cos(a)
        r[i, j], r[j, i] = -math.sin(a), math.sin(a)
        out = out @ r
    return out


def coordinates(d: Draw, shape: tuple[int, ...]) -> np.ndarray:
    """Where each output voxel samples the input: centre + A (x + elastic(x)), with
    A = rotation x scaling; (dims, *shape) float32."""
    grid = centred_grid(shape)
    if d.elastic is not None:
        grid = grid + elastic_field(d.elastic, shape)
    dims = len(shape)
    a = rotation_matrix(d.rotation) if d.rotation is not None else np.eye(dims)
    if d.scale is not None:
        a = a @ np.diag(d.scale)
    coords = np.einsum("ij,j...->i...", a.astype(np.float32), grid)
    coords += np.array([(n - 1) / 2 for n in shape], np.float32).reshape((dims,) + (1,) * dims)
    return coords


def resample(image: np.ndarray, mask: np.ndarray, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (*spatial, C) linearly, each channel's outside at its minimum, and
    ``mask`` by nearest neighbour, outside 0, at ``coords``."""
    out = np.empty(image.shape, np.float32)
    for c in range(image.shape[-1]):
        channel = np.ascontiguousarray(image[..., c])
        out[..., c] = ndimage.map_coordinates(channel, coords, order=1, mode="constant",
                                              cval=float(channel.min()), output=np.float32,
                                              prefilter=False)
    labels = ndimage.map_coordinates(mask, coords, order=0, mode="constant", cval=0,
                                     output=mask.dtype, prefilter=False)
    return out, labels


# --- intensity ----------------------------------------------------------------------


def add_noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> None:
    """Adds N(0, (sigma x std(x))^2) to channel ``x`` in place."""
    x += rng.standard_normal(x.shape, np.float32) * np.float32(sigma * x.std())


def contrast(x: np.ndarray, factor: float) -> None:
    """Scales channel ``x`` about its mean, clipped to its range, in place."""
    lo, hi, mean = x.min(), x.max(), x.mean()
    x -= mean
    x *= np.float32(factor)
    x += mean
    np.clip(x, lo, hi, out=x)


def gamma(x: np.ndarray, g: float, inverted: bool) -> None:
    """nnU-Net's gamma on channel ``x`` in place: the range mapped to [0, 1], raised
    to ``g`` and mapped back, the mean and std kept; ``inverted`` applies it to -x."""
    if inverted:
        np.negative(x, out=x)
    mean, std = x.mean(), x.std()
    lo, span = x.min(), x.max() - x.min()
    x -= lo
    x /= max(span, np.float32(EPS))
    np.power(x, np.float32(g), out=x)
    x *= span
    x += lo
    x -= x.mean()
    x *= std / max(x.std(), np.float32(EPS))
    x += mean
    if inverted:
        np.negative(x, out=x)


def intensity(d: Draw, image: np.ndarray) -> None:
    """The intensity transforms that fired, on each channel of ``image`` (*spatial, C)
    in nnU-Net's order, in place."""
    rng = np.random.default_rng(d.field_seed) if d.noise is not None else None
    for c in range(image.shape[-1]):
        x = image[..., c]
        if d.noise is not None:
            add_noise(x, d.noise, rng)
        if d.blur is not None and d.blur[c] is not None:
            x[...] = ndimage.gaussian_filter(x, d.blur[c], mode="nearest")
        if d.brightness is not None:
            x *= d.brightness[c]
        if d.contrast is not None:
            contrast(x, d.contrast[c])
        if d.gamma_inverted is not None:
            gamma(x, d.gamma_inverted[c], inverted=True)
        if d.gamma is not None:
            gamma(x, d.gamma[c], inverted=False)


def apply(d: Draw, image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One sample transformed by draw ``d``: (image float32 (*spatial, C), mask
    (*spatial)). The input image is left as it is; the mask comes back as it is (or
    a view of it) when no spatial transform fired."""
    if d.spatial():
        image, mask = resample(image, mask, coordinates(d, mask.shape))
    else:
        image, mask = image.astype(np.float32, copy=True), mask
    intensity(d, image)
    if d.mirror:
        image, mask = np.flip(image, d.mirror), np.flip(mask, d.mirror)
    return image, mask


class Augmenter:
    """A training batch's augmentation: ``augmenter(ids, epoch, images, masks)``.

    Args:
      kind: a name of ``PRESETS`` (``data.augment``) or a ``Preset``.
      seed: the run's seed (``train.seed``).
      spatial_dims: 2 (slices) or 3 (slabs).

    Raises:
      ValueError: an unknown kind or spatial_dims.
    """

    def __init__(self, kind: str | Preset, seed: int, spatial_dims: int):
        if isinstance(kind, str) and kind not in PRESETS:
            raise ValueError(f"data.augment must be one of {tuple(PRESETS)}, got {kind!r}")
        if spatial_dims not in (2, 3):
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims!r}")
        self.preset = PRESETS[kind] if isinstance(kind, str) else kind
        self.seed, self.spatial_dims = int(seed), spatial_dims

    def draw(self, epoch: int, sample: int, shape: Sequence[int], channels: int) -> Draw:
        """Sample ``sample``'s draw in ``epoch`` (what ``__call__`` applies)."""
        return draw(self.preset, sample_rng(self.seed, epoch, sample), shape, channels)

    def __call__(self, ids, epoch: int, images: np.ndarray, masks: np.ndarray):
        """(images float32 (B, *spatial, C), masks (B, *spatial)), augmented per sample;
        the inputs themselves when the preset is the identity."""
        if self.preset.is_identity():
            return images, masks
        self._check(ids, images, masks)
        shape, channels = masks.shape[1:], images.shape[-1]
        out_images = np.empty(images.shape, np.float32)
        out_masks = np.empty_like(masks)
        for row, sample in enumerate(ids):
            d = self.draw(epoch, int(sample), shape, channels)
            out_images[row], out_masks[row] = apply(d, images[row], masks[row])
        return out_images, out_masks

    def _check(self, ids, images: np.ndarray, masks: np.ndarray) -> None:
        dims = self.spatial_dims
        if images.ndim != dims + 2 or masks.shape != images.shape[:-1] or len(ids) != len(images):
            raise ValueError(f"augment ({dims}D): need images (B, *spatial, C) and masks "
                             f"(B, *spatial) for {len(ids)} ids, got {images.shape} and {masks.shape}")


def for_training(kind: str, seed: int, spatial_dims: int) -> Augmenter | None:
    """The reader thread's transform for ``data.augment`` ``kind``: None for ``none``
    (nothing to call)."""
    augmenter = Augmenter(kind, seed, spatial_dims)
    return None if augmenter.preset.is_identity() else augmenter


def with_only(preset: Preset, *names: str) -> Preset:
    """``preset`` with every probability but ``p_<name>`` of ``names`` set to 0 (one
    transform alone, for tests and studies)."""
    probabilities = {f.name: 0.0 for f in dataclasses.fields(preset)
                     if f.name.startswith("p_") and f.name[2:] not in names
                     and f.name != "p_blur_channel"}
    return dataclasses.replace(preset, **probabilities)
