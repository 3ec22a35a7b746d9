"""One voxel spacing: the interpolation that takes a volume to a target spacing and
back, and the choice of that spacing for a dataset (``convert --spacing auto``).

Convert (``geometry.forward``) and predict (``geometry.labels_on_scan``) call these
functions, and nothing else resamples: one copy of the formula.

**The grid.** An axis of ``n`` voxels of ``s`` mm resampled to ``t`` mm gets
``new_extent(n, s, t) = round(n * s / t)`` voxels that cover the same field of view
edge to edge (nnU-Net's ``compute_new_shape`` and ``resize``): output voxel ``u`` of
``m`` samples input position ``(u + 0.5) * n / m - 0.5``. Its spacing is then
``s * n / m``, within half a voxel over the field of view of ``t``, and resampling back
to ``n`` voxels is the exact inverse map. In-plane ``--size`` resampling
(``geometry.resample``) is the same formula with ``m`` given.

**Images** are interpolated linearly along each axis (separable, float32): order 1,
what the linear in-plane resampling of slices always was; nnU-Net's cubic in-plane
would cost a spline prefilter per slice for little on CT windows.

**Labels** take the nearest voxel (the input voxel holding the output voxel's centre).
Decision: nearest rather than nnU-Net's per-class linear interpolation of one-hot
masks, because (1) it never invents a class or a voxel of a class between two others,
(2) upsampling by an integer ratio and sampling back gives the labels back exactly,
which is what predict's round trip (scan -> target spacing -> scan) leans on, (3) it
costs one index per voxel, where one-hot interpolation costs a float volume per class
(the streaming converter keeps one case per worker), and (4) it is what the in-plane
``--size`` resampling of labels already does. Its cost: boundaries of a downsampled
label volume move by up to half an output voxel; at 0.7 -> 1.0 -> 0.7 mm the phantom's
classes come back with Dice above 0.99 (tests/unit/test_spacing.py). Class
probabilities (predict) are interpolated linearly, then the argmax taken.

Volumes are resampled 32 output slices at a time (``resample_blocks``): only the input
slices a block needs are fetched (and, for images, normalised), so no float copy of a
whole volume is made. Nothing here reads files or imports TensorFlow.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

#: nnU-Net v2's ANISO_THRESHOLD: an axis is the low-resolution one when its median
#: spacing is more than this many times the largest of the other axes' medians.
ANISOTROPY = 3.0
#: nnU-Net v2: the low-resolution axis of an anisotropic dataset takes this percentile
#: of its spacings instead of the median.
LOW_RES_PERCENTILE = 10.0
#: Output slices per block of ``resample_blocks``.
BLOCK = 32

_EXPECTED = "expected auto or Z,Y,X: three positive numbers in mm, Z between slices (e.g. 2.5,0.8,0.8)"


def parse_mm(value: str, expected: str = "expected Z,Y,X: three positive numbers in mm "
                                         "(e.g. 2.5,0.8,0.8)") -> tuple[float, float, float]:
    """``"Z,Y,X"`` -> three positive, finite floats (mm).

    Raises:
      ValueError: ``'VALUE': <expected>``, one line.
    """
    try:
        parts = tuple(float(v) for v in str(value).split(","))
    except ValueError:
        raise ValueError(f"{value!r}: {expected}") from None
    if len(parts) != 3 or not all(np.isfinite(p) and p > 0 for p in parts):
        raise ValueError(f"{value!r}: {expected}")
    return parts


def parse(value: str | tuple | None):
    """A ``--spacing`` value: None (keep each scan's own spacing), ``"auto"``, or
    ``Z,Y,X`` in mm (a string, or three numbers) -> None, ``"auto"`` or a tuple.

    Raises:
      ValueError: anything else (one line: the value and what was expected).
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None if value is None else "auto"
    if not isinstance(value, str):
        value = ",".join(str(v) for v in value)
    return parse_mm(value, _EXPECTED)


def target_spacing(spacings, shapes) -> tuple[float, float, float]:
    """The dataset's target spacing, by nnU-Net v2's rule
    (``ExperimentPlanner.determine_fullres_target_spacing``): the median spacing of
    each axis; but when the axis of the largest median is more than ``ANISOTROPY``
    times the largest of the others, and its median extent in voxels times
    ``ANISOTROPY`` is below the smallest of the others' (thick slices, few of them),
    that axis takes the 10th percentile of its spacings (no lower than the other axes'
    largest median), so thin-slice cases are not thrown away for the thick ones.

    ``spacings``, ``shapes``: one (z, y, x) row per case (the slice layout). nnU-Net
    measures shapes after cropping to the non-zero region; here they are whole scans.
    """
    spacings = np.asarray(spacings, dtype=np.float64).reshape(-1, 3)
    sizes = np.median(np.asarray(shapes, dtype=np.float64).reshape(-1, 3), axis=0)
    target = np.median(spacings, axis=0)
    worst = int(np.argmax(target))
    others = [i for i in range(3) if i != worst]
    aniso_spacing = target[worst] > ANISOTROPY * target[others].max()
    aniso_voxels = sizes[worst] * ANISOTROPY < sizes[others].min()
    if aniso_spacing and aniso_voxels:
        low = float(np.percentile(spacings[:, worst], LOW_RES_PERCENTILE))
        if low < target[others].max():
            low = float(target[others].max()) + 1e-5
        target[worst] = low
    return tuple(round(float(t), 5) for t in target)  # float32 headers: 0.8000000119 is 0.8


def new_extent(n: int, spacing: float, target: float) -> int:
    """Voxels along an axis of ``n`` voxels of ``spacing`` mm resampled to ``target``
    mm: the same field of view, at least one voxel."""
    return max(1, int(round(n * float(spacing) / float(target))))


def new_shape(shape, spacing, target) -> tuple[int, ...]:
    """``new_extent`` of each axis."""
    return tuple(new_extent(n, s, t) for n, s, t in zip(shape, spacing, target))


def positions(n_in: int, n_out: int) -> np.ndarray:
    """Input positions sampled by the ``n_out`` output voxels (edge to edge)."""
    return (np.arange(n_out) + 0.5) * n_in / n_out - 0.5


def nearest_index(n_in: int, n_out: int, idx: np.ndarray | None = None) -> np.ndarray:
    """The input voxel holding each output voxel's centre (output voxels ``idx``)."""
    idx = np.arange(n_out) if idx is None else idx
    return np.minimum(np.floor((idx + 0.5) * n_in / n_out), n_in - 1).astype(np.intp)


def _linear_weights(n_in: int, n_out: int, idx: np.ndarray):
    x = np.clip((idx + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    lo = np.floor(x).astype(np.intp)
    return lo, np.minimum(lo + 1, n_in - 1), (x - lo).astype(np.float32)


def resample_axis(a: np.ndarray, axis: int, n_out: int, order: int) -> np.ndarray:
    """``a`` resampled to ``n_out`` samples along ``axis``: order 0 nearest (dtype
    kept), 1 linear (float32 in, float32 out); unchanged when the size is already
    ``n_out``."""
    n_in = a.shape[axis]
    if n_in == n_out:
        return a
    if order == 0:
        return np.take(a, nearest_index(n_in, n_out), axis=axis)
    lo, hi, frac = _linear_weights(n_in, n_out, np.arange(n_out))
    shape = [1] * a.ndim
    shape[axis] = n_out
    frac = frac.reshape(shape)
    return np.take(a, lo, axis=axis) * (1 - frac) + np.take(a, hi, axis=axis) * frac


def inplane(slices: np.ndarray, rows: int, cols: int, order: int) -> np.ndarray:
    """(B, H, W[, C]) -> (B, rows, cols[, C]): order 1 linear (float32 out), 0 nearest
    (dtype kept); the field of view kept edge to edge.

    Raises:
      ValueError: an order other than 0 or 1.
    """
    if order not in (0, 1):
        raise ValueError(f"order must be 0 (nearest) or 1 (linear), got {order}")
    a = slices if order == 0 else slices.astype(np.float32, copy=False)
    return resample_axis(resample_axis(a, 1, rows, order), 2, cols, order)


def _along_z(part: np.ndarray, lo: int, n_in: int, n_out: int, idx: np.ndarray, order: int):
    """Output slices ``idx`` from ``part`` = input slices ``lo:lo + len(part)``."""
    if order == 0:
        return np.take(part, nearest_index(n_in, n_out, idx) - lo, axis=0)
    a, b, frac = _linear_weights(n_in, n_out, idx)
    frac = frac.reshape((-1,) + (1,) * (part.ndim - 1))
    part = part.astype(np.float32, copy=False)
    return part[a - lo] * (1 - frac) + part[b - lo] * frac


def _needed(n_in: int, n_out: int, idx: np.ndarray, order: int) -> tuple[int, int]:
    """Input slices ``lo:hi`` that output slices ``idx`` read."""
    if order == 0:
        src = nearest_index(n_in, n_out, idx)
        return int(src.min()), int(src.max()) + 1
    a, b, _ = _linear_weights(n_in, n_out, idx)
    return int(a.min()), int(b.max()) + 1


def resample_blocks(get: Callable[[int, int], np.ndarray], n_in: int, shape_out,
                    order: int, block: int = BLOCK) -> Iterator[tuple[int, np.ndarray]]:
    """Yields ``(start, slices)``: output slices ``start:start + len(slices)`` of a
    volume of ``n_in`` slices resampled to ``shape_out`` (D, H, W), ``block`` output
    slices at a time. ``get(lo, hi)`` returns input slices ``lo:hi`` as (k, h, w[, C])
    (normalised, shifted, ...: whatever the caller needs done to them first).

    Along slices and in-plane the same separable formula (``resample_axis``); the
    cheaper order is taken (in-plane first when a block has fewer input slices than
    output ones). A depth that does not change reads each slice once, as is.
    """
    n_out, rows, cols = (int(s) for s in shape_out)
    for start in range(0, n_out, block):
        idx = np.arange(start, min(start + block, n_out))
        if n_in == n_out:
            yield start, inplane(get(int(idx[0]), int(idx[-1]) + 1), rows, cols, order)
            continue
        lo, hi = _needed(n_in, n_out, idx, order)
        part = get(lo, hi)
        if len(part) < len(idx):
            part = inplane(part, rows, cols, order)
            yield start, _along_z(part, lo, n_in, n_out, idx, order)
        else:
            yield start, inplane(_along_z(part, lo, n_in, n_out, idx, order), rows, cols, order)


def resample_volume(volume: np.ndarray, shape_out, order: int) -> np.ndarray:
    """(D, H, W[, C]) resampled to ``shape_out`` (D', H', W') whole: order 0 nearest
    (dtype kept), 1 linear (float32)."""
    dtype = volume.dtype if order == 0 else np.float32
    out = np.empty(tuple(shape_out) + volume.shape[3:], dtype=dtype)
    for start, part in resample_blocks(lambda lo, hi: volume[lo:hi], len(volume), shape_out, order):
        out[start:start + len(part)] = part
    return out


def to_spacing(volume: np.ndarray, spacing, target, order: int) -> np.ndarray:
    """``volume`` (D, H, W[, C]) of ``spacing`` (z, y, x mm) resampled to ``target``."""
    return resample_volume(volume, new_shape(volume.shape[:3], spacing, target), order)


def centre_offset(extent: int, size: int) -> int:
    """Where a centred window of ``size`` starts in an axis of ``extent`` (negative:
    the window is larger, and starts that many voxels before the axis)."""
    return (int(extent) - int(size)) // 2


def shift(slices: np.ndarray, start, rows: int, cols: int, fill=0) -> np.ndarray:
    """(B, H, W[, C]) -> (B, rows, cols[, C]) whose pixel (i, j) is ``slices``'
    (i + start[0], j + start[1]), and ``fill`` where that is outside: a crop where
    ``start`` is positive, padding where negative. ``shift(.., -start, H, W)``
    undoes it where the window kept the pixels."""
    r0, c0 = (int(s) for s in start)
    h, w = slices.shape[1:3]
    if (r0, c0, rows, cols) == (0, 0, h, w):
        return slices
    out = np.empty((len(slices), rows, cols) + slices.shape[3:], dtype=slices.dtype)
    out[...] = fill
    src_r, src_c = slice(max(r0, 0), min(r0 + rows, h)), slice(max(c0, 0), min(c0 + cols, w))
    dst_r = slice(src_r.start - r0, src_r.stop - r0)
    dst_c = slice(src_c.start - c0, src_c.stop - c0)
    if src_r.stop > src_r.start and src_c.stop > src_c.start:
        out[:, dst_r, dst_c] = slices[:, src_r, src_c]
    return out


def round_up(n: int, multiple: int = 16) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (a U-Net of depth 4 pools 16x)."""
    return -(-int(n) // multiple) * multiple
