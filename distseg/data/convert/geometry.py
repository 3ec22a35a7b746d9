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

With a target spacing (``Geometry.target``, ``convert --spacing``) the kept slices
are resampled along all three axes to that spacing by the same formula
(``distseg.data.convert.spacing``), then centre cropped or padded in-plane to ``size``
(2D) or kept whole (``size`` 0, volumes); the inverse undoes the crop and resamples
back to the scan's own grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from nibabel import orientations

from distseg.data.convert import spacing as spacing_lib

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


def resample(slices: np.ndarray, height: int, width: int, order: int) -> np.ndarray:
    """Resamples (B, H, W[, C]) in-plane to (B, height, width[, C]).

    ``order`` 1: linear (images, probabilities; float32 out); 0: nearest (labels;
    dtype kept). Field of view kept edge to edge (``spacing.inplane``, the one formula).
    """
    return spacing_lib.inplane(slices, height, width, order)


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
    """In-plane size of the stored slices (0: what the resampling gives). Without
    ``target`` the slices are stretched to it, edge to edge; with ``target`` they are
    resampled to the spacing, then centre cropped or padded to it."""
    target: tuple[float, float, float] | None = None
    """(slice, row, column) spacing in mm the kept slices are resampled to
    (``convert --spacing``); None: the slice spacing is kept, in-plane goes to ``size``."""

    @classmethod
    def of(cls, affine, shape, z0: int | None = None, z1: int | None = None,
           size: int = 0, target=None) -> "Geometry":
        affine = np.asarray(affine, dtype=np.float64)
        ornt = ornt_of(affine)
        depth = tuple(shape)[int(np.flatnonzero(ornt[:, 0] == 2)[0])]
        return cls(affine=affine, shape=tuple(int(s) for s in shape[:3]), ornt=ornt,
                   z0=0 if z0 is None else int(z0), z1=depth if z1 is None else int(z1),
                   size=int(size), target=None if target is None else tuple(float(t) for t in target))

    @property
    def slices_shape(self) -> tuple[int, int, int]:
        """(D, H, W) of the whole volume in the slice layout, before crop and resample."""
        ras = np.empty(3, dtype=int)
        ras[self.ornt[:, 0].astype(int)] = self.shape
        return int(ras[2]), int(ras[1]), int(ras[0])

    @property
    def kept_shape(self) -> tuple[int, int, int]:
        """(D, H, W) of the kept slices ``z0:z1``, before resampling."""
        _, h, w = self.slices_shape
        return self.z1 - self.z0, h, w

    @property
    def spacing(self) -> np.ndarray:
        """(slice, row, column) spacing in mm before resampling."""
        return slice_spacing(self.affine, self.ornt)

    @property
    def grid(self) -> tuple[int, int, int]:
        """(D', H', W') of the kept slices resampled: at ``target`` spacing
        (``spacing.new_shape``), before any crop or pad to ``size``; without a target,
        the kept slices at ``out_inplane``."""
        if self.target is None:
            return (self.z1 - self.z0,) + self.out_inplane
        return spacing_lib.new_shape(self.kept_shape, self.spacing, self.target)

    @property
    def out_inplane(self) -> tuple[int, int]:
        """(rows, columns) of a stored slice: ``size`` x ``size``; when ``size`` is 0,
        the resampled grid's (``target``) or the volume's own (volumes kept on their
        grid, ``convert --ndim 3``)."""
        if self.size:
            return self.size, self.size
        if self.target is not None:
            return self.grid[1:]
        _, h, w = self.slices_shape
        return h, w

    @property
    def offset(self) -> tuple[int, int]:
        """Row and column of the resampled grid where a stored slice starts: the centre
        crop (positive) or pad (negative) from ``grid`` to ``size``; (0, 0) without a
        target."""
        if self.target is None:
            return 0, 0
        (rows, cols), (_, gh, gw) = self.out_inplane, self.grid
        return spacing_lib.centre_offset(gh, rows), spacing_lib.centre_offset(gw, cols)

    @property
    def resampled_spacing(self) -> np.ndarray:
        """(slice, row, column) spacing in mm of the stored slices (with a target: the
        target up to the rounding of ``grid``, see ``spacing.new_extent``)."""
        if self.target is not None:
            return np.asarray(self.spacing) * np.asarray(self.kept_shape) / np.asarray(self.grid)
        _, h, w = self.slices_shape
        rows, cols = self.out_inplane
        dz, dy, dx = self.spacing
        return np.array([dz, dy * h / rows, dx * w / cols])


def forward(volume: np.ndarray, geom: Geometry, order: int, values=None) -> np.ndarray:
    """Input-grid volume -> the kept slices, resampled to ``geom.size`` (kept at their
    own in-plane size when it is 0), or with ``geom.target`` to that spacing along
    every axis and then centre cropped or padded (with 0) to ``geom.size``.

    32 output slices at a time, into one preallocated array: ``values`` (e.g. an
    intensity normaliser) is applied to the input slices a block needs before
    resampling, so no float copy of the whole volume is ever made.
    """
    slices = to_slices(volume, geom.ornt)[geom.z0:geom.z1]
    rows, cols = geom.out_inplane
    out = np.empty((geom.grid[0], rows, cols),
                   dtype=np.float32 if order or values else volume.dtype)

    def get(lo: int, hi: int) -> np.ndarray:
        return slices[lo:hi] if values is None else values(slices[lo:hi])
    for start, block in spacing_lib.resample_blocks(get, len(slices), geom.grid, order):
        out[start:start + len(block)] = spacing_lib.shift(block, geom.offset, rows, cols, 0)
    return out


def _back_blocks(slices: np.ndarray, geom: Geometry, order: int, fill):
    """(start, block) of the stored slices taken back to the kept slices' own grid
    (``geom.kept_shape``): with a target spacing, first brought to ``out_inplane``
    if they are of another size (a model trained with ``--resize``) and the crop or
    pad undone (``fill`` where nothing was stored); then resampled back."""
    rows, cols = geom.out_inplane
    gh, gw = geom.grid[1:]
    back = tuple(-o for o in geom.offset)

    def get(lo: int, hi: int) -> np.ndarray:
        block = slices[lo:hi]
        if geom.target is None:  # in-plane straight from their size to the scan's
            return block
        if block.shape[1:3] != (rows, cols):
            block = spacing_lib.inplane(block, rows, cols, order)
        return spacing_lib.shift(block, back, gh, gw, fill)
    return spacing_lib.resample_blocks(get, len(slices), geom.kept_shape, order)


def inverse(slices: np.ndarray, geom: Geometry, order: int = 0, fill=0) -> np.ndarray:
    """The stored slices back onto the input's voxel grid; slices outside ``z0:z1``
    are ``fill``. ``forward`` then ``inverse`` of labels with ``order`` 0 gives the
    labels back exactly when no slice was cropped and the resampling only upsampled
    (``size`` at least the volume's in-plane size; a target spacing an integer
    fraction of the scan's, with nothing cropped)."""
    depth, h, w = geom.slices_shape
    full = np.full((depth, h, w) + slices.shape[3:], fill, dtype=slices.dtype)
    for start, block in _back_blocks(slices, geom, order, fill):
        full[geom.z0 + start:geom.z0 + start + len(block)] = block
    return np.ascontiguousarray(from_slices(full, geom.ornt))


def labels_on_scan(probs: np.ndarray, geom: Geometry) -> np.ndarray:
    """Class probabilities (D', S, S, C) of the stored slices -> uint8 labels on the
    input's own voxel grid: resampled back linearly a block at a time and the argmax
    taken (never a float copy of the whole scan's probabilities). Pixels the crop to
    ``size`` left out, and slices outside ``z0:z1``, are background (class 0)."""
    depth, h, w = geom.slices_shape
    out = np.zeros((depth, h, w), dtype=np.uint8)
    background = np.eye(probs.shape[-1], dtype=np.float32)[0]
    for start, block in _back_blocks(probs, geom, 1, background):
        out[geom.z0 + start:geom.z0 + start + len(block)] = np.argmax(block, axis=-1)
    return np.ascontiguousarray(from_slices(out, geom.ornt))
