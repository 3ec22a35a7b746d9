"""Sliding-window inference over whole volumes, and the split of cases over ranks: the
one inferer of 3D validation and of ``distseg-predict`` (2D and 3D). Plain numpy: the
model comes in as a ``predict`` callable. Volumes are channels last, (D, H, W, C) for
C input channels (a (D, H, W) volume is one channel), and every window carries all C.

A 3D U-Net is run on windows of its training slab shape; a 2D U-Net on windows of one
slice, (1, H, W), through ``slicewise``, which drops the depth axis for it. One window
per slice then covers the volume, each exactly once, and the result is the model's
output itself (a single window's weight divides out exactly).

``sliding_window`` tiles a volume with windows of the training slab shape, overlapping
by ``overlap`` (nnU-Net's scheme: evenly spaced origins, the last window ending at the
volume's edge), and blends the windows' probabilities with a Gaussian importance map
centred on each window (sigma = ``sigma_scale`` x the window's edge), so a voxel is
decided mostly by the windows that see it near their centre, where a convolutional
network has the most context.

Reassembly is exact: the Gaussian is quantised to integer weights 1..2**22 and the
weighted sums are kept in float64. A float32 probability has a 24-bit significand, so
its product with a weight, and the sum of such products over up to 2**29 / 2**22 = 128
windows overlapping a voxel (at most 5 per axis, 125 in all, for overlaps up to 0.75),
are exact when the windows agree; a voxel's result is then their value bit for bit (a
constant model, or one that maps each voxel's intensity to a value), and otherwise the
correctly rounded weighted mean. Where a Gaussian falls below 2**-22 of its peak (the
far corners of a window) it weighs 1, like nnU-Net's floor at its smallest non-zero
weight. Memory: a float64 sum of the (padded) volume x classes, one float64 weight
per voxel, and the float32 result: (12 x classes + 8) bytes per voxel.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from distseg.data.volumes import PAD_IMAGE

#: The largest Gaussian weight; the smallest is 1 (never 0: every voxel gets a vote).
WEIGHT_SCALE = 2 ** 22
#: The Gaussian's sigma as a share of the window's edge (nnU-Net's 1/8).
SIGMA_SCALE = 0.125


def window_starts(n: int, w: int, overlap: float) -> np.ndarray:
    """Origins of windows of length ``w`` over ``0..n``, at most ``w * (1 - overlap)``
    apart, evenly spaced from 0 to ``n - w``; a single origin 0 when ``n <= w``."""
    if n <= w:
        return np.zeros(1, dtype=np.int64)
    step = max(1.0, w * (1.0 - overlap))
    count = int(np.ceil((n - w) / step)) + 1
    return np.round(np.linspace(0, n - w, count)).astype(np.int64)


def gaussian_weights(window: Sequence[int], sigma_scale: float = SIGMA_SCALE) -> np.ndarray:
    """(d, h, w) float64 integer weights 1..``WEIGHT_SCALE``: a Gaussian centred on the
    window with sigma ``sigma_scale`` x each edge, scaled so its peak is WEIGHT_SCALE."""
    profiles = []
    for w in window:
        x = np.arange(w, dtype=np.float64) - (w - 1) / 2.0
        sigma = max(sigma_scale * w, 1e-6)
        profiles.append(np.exp(-(x ** 2) / (2.0 * sigma ** 2)))
    g = np.einsum("i,j,k->ijk", *profiles)
    return np.maximum(1.0, np.round(g / g.max() * WEIGHT_SCALE))


def _check_args(volume: np.ndarray, window: Sequence[int], overlap: float, batch: int) -> np.ndarray:
    """``volume`` as (D, H, W, C), after the arguments' checks."""
    if volume.ndim == 3:
        volume = volume[..., None]
    if volume.ndim != 4 or volume.shape[-1] < 1:
        raise ValueError(f"volume has shape {volume.shape}, expected (D, H, W) or (D, H, W, C)")
    if len(window) != 3 or min(window) < 1:
        raise ValueError(f"window {tuple(window)}: expected three positive sizes (d, h, w)")
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap {overlap}: expected 0 <= overlap < 1")
    if batch < 1:
        raise ValueError(f"batch {batch}: expected >= 1")
    return volume


def padded_to(volume: np.ndarray, window: Sequence[int]) -> np.ndarray:
    """``volume`` ((D, H, W) or (D, H, W, C)) padded at the high end of each spatial
    axis shorter than ``window`` with ``PAD_IMAGE``, as ``volumes.SlabReader`` pads
    training slabs."""
    pad = [(0, max(0, w - n)) for n, w in zip(volume.shape, window)]
    pad += [(0, 0)] * (volume.ndim - len(pad))
    if not any(p for _, p in pad):
        return volume
    return np.pad(volume, pad, constant_values=PAD_IMAGE)


def window_origins(shape: Sequence[int], window: Sequence[int], overlap: float) -> list[tuple]:
    """Every window origin (z, y, x) over a volume of ``shape`` (already padded)."""
    return list(itertools.product(*(window_starts(int(n), int(w), overlap).tolist()
                                    for n, w in zip(shape, window))))


def _predicted(predict: Callable, x: np.ndarray, window: tuple) -> np.ndarray:
    probs = np.asarray(predict(x), dtype=np.float32)
    if probs.ndim != 5 or probs.shape[:4] != (len(x),) + window:
        raise ValueError(f"predict returned shape {probs.shape} for input {x.shape}; "
                         f"expected ({len(x)}, {', '.join(map(str, window))}, classes)")
    return probs


def sliding_window(predict: Callable[[np.ndarray], np.ndarray], volume: np.ndarray,
                   window: Sequence[int], overlap: float = 0.5, sigma_scale: float = SIGMA_SCALE,
                   batch: int = 1) -> np.ndarray:
    """Class probabilities (D, H, W, C) float32 of a whole volume, window by window.

    Args:
      predict: (B, d, h, w, C_in) float32 -> (B, d, h, w, C) probabilities (a Keras
        model's ``predict_on_batch``, or any array-returning callable).
      volume: (D, H, W) (one channel) or (D, H, W, C_in) image, channels last; padded
        (``padded_to``) where shorter than ``window``, and the result cropped back.
      window: (d, h, w), the training slab shape.
      overlap: share of a window shared with its neighbour along each axis (0..1).
      sigma_scale: the Gaussian's sigma as a share of the window's edge.
      batch: windows per ``predict`` call.

    Raises:
      ValueError: bad arguments, or ``predict`` returning another shape.
    """
    volume = _check_args(np.asarray(volume), window, overlap, batch)
    window = tuple(int(w) for w in window)
    padded = padded_to(volume, window)
    weights = gaussian_weights(window, sigma_scale)
    origins = window_origins(padded.shape[:3], window, overlap)
    total, norm = None, np.zeros(padded.shape[:3], dtype=np.float64)
    for i in range(0, len(origins), batch):
        boxes = [tuple(slice(o, o + w) for o, w in zip(origin, window))
                 for origin in origins[i:i + batch]]
        x = np.stack([padded[box] for box in boxes]).astype(np.float32)
        probs = _predicted(predict, x, window)
        if total is None:
            total = np.zeros(padded.shape[:3] + probs.shape[-1:], dtype=np.float64)
        for box, p in zip(boxes, probs):
            total[box] += p * weights[..., None]
            norm[box] += weights
    total /= norm[..., None]  # in place: no second float64 volume
    d, h, w = volume.shape[:3]
    return total[:d, :h, :w].astype(np.float32)


def slicewise(predict2d: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """A 2D model as a 3D ``predict`` for windows of depth 1: (B, 1, H, W, C_in) windows
    go to ``predict2d`` as (B, H, W, C_in) slices, and its (B, H, W, C) probabilities come
    back as (B, 1, H, W, C).

    Raises (when called):
      ValueError: a window deeper than one slice.
    """
    def predict(x: np.ndarray) -> np.ndarray:
        if x.ndim != 5 or x.shape[1] != 1:
            raise ValueError(f"a 2D model takes windows of depth 1, got input {x.shape}")
        return np.asarray(predict2d(x[:, 0]))[:, None]
    return predict


def shard_cases(cases: Sequence[int], rank: int, size: int,
                voxels: Sequence[int] | None = None) -> np.ndarray:
    """This rank's cases (validation volumes, or ``distseg-predict``'s scans): every
    case exactly once over the ranks.

    Without ``voxels``, contiguous shards of counts differing by at most one. With
    ``voxels`` (each case's size), cases go largest first to the least-loaded rank
    (ties: the earlier case, then the lowest rank), so ranks get similar work; every
    rank computes the same assignment. A rank may get none (fewer cases than ranks).
    Returned ascending.
    """
    cases = np.asarray(cases, dtype=np.int64)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    if voxels is None:
        return np.array_split(cases, size)[rank]
    voxels = np.asarray(voxels, dtype=np.int64)
    if voxels.shape != cases.shape:
        raise ValueError(f"voxels has {voxels.shape[0]} entries for {len(cases)} cases")
    load, owner = np.zeros(size, dtype=np.int64), np.empty(len(cases), dtype=np.int64)
    for i in np.argsort(-voxels, kind="stable"):
        owner[i] = int(np.argmin(load))
        load[owner[i]] += voxels[i]
    return np.sort(cases[owner == rank])
