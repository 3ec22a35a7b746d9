"""From a scanner volume to distseg's axial slices, and exactly back.

Forward (``to_slices`` then ``resample``): reorient the volume to RAS, the closest
canonical orientation of its affine (``nibabel.as_closest_canonical`` does the same),
lay it out as axial slices, keep slices ``z0:z1`` and resample each slice in-plane to
``size`` x ``size``. Inverse (``from_slices``, ``resample`` back, ``uncrop``): the same
steps undone, onto the input's own voxel grid.

Slice layout, the one of every distseg dataset: axis 0 runs inferior -> superior, rows
anterior -> posterior and columns from the patient's right to left, so a slice shows as
radiologists view an axial CT (patient's right on the image's left, anterior up).

In-plane resampling maps the field of view onto the new grid edge to edge: output pixel
``u`` of ``n_out`` samples input position ``(u + 0.5) * n_in / n_out - 0.5``. Linear
interpolation is used for images and probabilities, nearest (the input pixel that holds
the output pixel's centre) for labels. Upsampling labels with nearest and sampling
them back is exact. Nothing here reads files or imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nibabel import orientations

#: How a slice is laid out, recorded in every converted file.
LAYOUT = ("axial slices, RAS reoriented: axis 0 inferior->superior, rows "
          "anterior->posterior, columns patient right->left")


def ornt_of(affine: np.ndarray) -> np.ndarray:
    """The (3, 2) nibabel orientation that takes the array of ``affine`` to RAS."""
    return orientations.io_orientation(np.asarray(affine, dtype=np.float64))


def to_slices(volume: np.ndarray, ornt: np.ndarray) -> np.ndarray:
    """(X, Y, Z[, ...]) array on its own grid -> (D, H, W[, ...]) axial slices (a view)."""
    ras = orientations.apply_orientation(volume, ornt)
    # RAS (x: left->right, y: posterior->anterior, z: inferior->superior) to
    # (z, y reversed, x reversed) = (superior, anterior->posterior, right->left).
    return np.swapaxes(ras, 0, 2)[:, ::-1, ::-1]


def from_slices(slices: np.ndarray, ornt: np.ndarray) -> np.ndarray:
    """The inverse of ``to_slices``: axial slices back to the input's array order."""
    ras = np.swapaxes(slices[:, ::-1, ::-1], 0, 2)
    back = orientations.ornt_transform(orientations.axcodes2ornt("RAS"), ornt)
    return orientations.apply_orientation(ras, back)


def voxel_sizes(affine: np.ndarray) -> np.ndarray:
    """Voxel edge lengths in mm along the array's own axes (columns of the affine)."""
    return np.sqrt((np.asarray(affine, dtype=np.float64)[:3, :3] ** 2).sum(axis=0))


def slice_spacing(affine: np.ndarray, ornt: np.ndarray) -> np.ndarray:
    """(slice, row, column) spacing in mm of the ``to_slices`` layout."""
    zooms = voxel_sizes(affine)
    ras = np.empty(3)
    ras[ornt[:, 0].astype(int)] = zooms  # input axis i becomes RAS axis ornt[i, 0]
    return ras[::-1].copy()


def _positions(n_in: int, n_out: int) -> np.ndarray:
    return (np.arange(n_out) + 0.5) * n_in / n_out - 0.5


def _axis(a: np.ndarray, axis: int, n_out: int, order: int) -> np.ndarray:
    n_in = a.shape[axis]
    if n_in == n_out:
        return a
    if order == 0:
        idx = np.minimum(np.floor((np.arange(n_out) + 0.5) * n_in / n_out), n_in - 1)
        return np.take(a, idx.astype(np.intp), axis=axis)
    x = np.clip(_positions(n_in, n_out), 0, n_in - 1)
    lo = np.floor(x).astype(np.intp)
    hi = np.minimum(lo + 1, n_in - 1)
    shape = [1] * a.ndim
    shape[axis] = n_out
    frac = (x - lo).astype(np.float32).reshape(shape)
    return np.take(a, lo, axis=axis) * (1 - frac) + np.take(a, hi, axis=axis) * frac


def resample(slices: np.ndarray, height: int, width: int, order: int) -> np.ndarray:
    """Resamples (B, H, W[, C]) in-plane to (B, height, width[, C]).

    ``order`` 1: linear (images, probabilities; float32 out); 0: nearest (labels;
    dtype kept). Field of view kept edge to edge (see the module docstring).
    """
    if order not in (0, 1):
        raise ValueError(f"order must be 0 (nearest) or 1 (linear), got {order}")
    a = slices if order == 0 else slices.astype(np.float32, copy=False)
    return _axis(_axis(a, 1, height, order), 2, width, order)


def roi_range(labels: np.ndarray, margin: int | None) -> tuple[int, int]:
    """Slices ``z0:z1`` of (D, H, W) ``labels`` that hold any label, widened by
    ``margin`` on each side (clipped to the volume); all slices when ``margin`` is None."""
    depth = labels.shape[0]
    if margin is None:
        return 0, depth
    labelled = np.flatnonzero(labels.max(axis=(1, 2)))  # no copy of a strided view
    if not len(labelled):
        return 0, depth
    return max(0, int(labelled[0]) - margin), min(depth, int(labelled[-1]) + 1 + margin)


@dataclass(frozen=True)
class Geometry:
    """What it takes to put a case's slices back on its original voxel grid."""

    affine: np.ndarray
    """(4, 4) voxel-to-world (RAS mm) affine of the input volume."""
    shape: tuple[int, int, int]
    """The input volume's array shape."""
    ornt: np.ndarray
    """(3, 2) nibabel orientation from the input array to RAS (``ornt_of``)."""
    z0: int
    """First kept slice (in the ``to_slices`` layout)."""
    z1: int
    """One past the last kept slice."""
    size: int
    """In-plane size the slices were resampled to (0: not resampled)."""

    @classmethod
    def of(cls, affine, shape, z0: int | None = None, z1: int | None = None,
           size: int = 0) -> "Geometry":
        affine = np.asarray(affine, dtype=np.float64)
        ornt = ornt_of(affine)
        depth = tuple(shape)[int(np.flatnonzero(ornt[:, 0] == 2)[0])]
        return cls(affine=affine, shape=tuple(int(s) for s in shape[:3]), ornt=ornt,
                   z0=0 if z0 is None else int(z0), z1=depth if z1 is None else int(z1),
                   size=int(size))

    @property
    def slices_shape(self) -> tuple[int, int, int]:
        """(D, H, W) of the whole volume in the slice layout, before crop and resample."""
        ras = np.empty(3, dtype=int)
        ras[self.ornt[:, 0].astype(int)] = self.shape
        return int(ras[2]), int(ras[1]), int(ras[0])

    @property
    def spacing(self) -> np.ndarray:
        """(slice, row, column) spacing in mm before resampling."""
        return slice_spacing(self.affine, self.ornt)

    @property
    def out_inplane(self) -> tuple[int, int]:
        """(rows, columns) of a kept slice: ``size`` x ``size``, or the volume's own
        when ``size`` is 0 (volumes kept on their grid, ``convert --ndim 3``)."""
        _, h, w = self.slices_shape
        return (self.size, self.size) if self.size else (h, w)

    @property
    def resampled_spacing(self) -> np.ndarray:
        """(slice, row, column) spacing in mm of the resampled slices."""
        _, h, w = self.slices_shape
        rows, cols = self.out_inplane
        dz, dy, dx = self.spacing
        return np.array([dz, dy * h / rows, dx * w / cols])


def forward(volume: np.ndarray, geom: Geometry, order: int, values=None) -> np.ndarray:
    """Input-grid volume -> the kept slices, resampled to ``geom.size`` (kept at their
    own in-plane size when it is 0).

    32 slices at a time, into one preallocated array: ``values`` (e.g. an intensity
    normaliser) is applied to each block before resampling, so no float copy of the
    whole volume is ever made.
    """
    slices = to_slices(volume, geom.ornt)[geom.z0:geom.z1]
    rows, cols = geom.out_inplane
    out = np.empty((len(slices), rows, cols),
                   dtype=np.float32 if order or values else volume.dtype)
    for start in range(0, len(slices), 32):
        block = slices[start:start + 32]
        if values is not None:
            block = values(block)
        out[start:start + 32] = resample(block, rows, cols, order)
    return out


def inverse(slices: np.ndarray, geom: Geometry, order: int = 0, fill=0) -> np.ndarray:
    """The kept slices (``geom.size`` in-plane) back onto the input's voxel grid;
    slices outside ``z0:z1`` are ``fill``. ``forward`` then ``inverse`` of labels with
    ``order`` 0 gives the labels back exactly when no slice was cropped and ``size``
    is at least the volume's in-plane size."""
    depth, h, w = geom.slices_shape
    full = np.full((depth, h, w) + slices.shape[3:], fill, dtype=slices.dtype)
    for start in range(0, len(slices), 32):
        block = resample(slices[start:start + 32], h, w, order)
        full[geom.z0 + start:geom.z0 + start + len(block)] = block
    return np.ascontiguousarray(from_slices(full, geom.ornt))
