"""A seeded synthetic liver-CT phantom, for tests and benchmarks.

Each case is a small volume: air around an elliptical body (fat rim, soft tissue), a
vertebra, a liver ellipsoid on the patient's right with a few hypodense spherical
lesions, in Hounsfield units plus Gaussian noise, then windowed to [0, 1] like the real
data. Masks are the exact shapes (0 background, 1 liver, 2 lesion). ``make_dataset``
writes the cases as 2D slices, ``make_volumes`` as whole 3D volumes of varying shape.

The anatomy is drawn in coordinates of the body, -1 to 1 across the field of view on
each axis, so it is one continuous body whatever grid samples it: ``phantom_case``
samples it edge to edge on a grid of voxels, ``phantom_mm`` at a voxel spacing in mm
over a field of view in mm (``distseg-data synth --spacing``, written as NIfTI by
``distseg.data.convert.samples.write_phantoms``), so the same seed at two spacings is
the same body sampled twice.
"""

from __future__ import annotations

import numpy as np

from distseg.core.errors import InputError
from distseg.data import h5format, volumes
from distseg.data import slices as data
from distseg.data.h5format import HU_WINDOW, window

#: Nominal geometry of a phantom: a 350 mm field of view in-plane, 5 mm slices.
FIELD_OF_VIEW_MM, SLICE_MM = 350.0, 5.0
#: Default field of view (z, y, x mm) of a phantom drawn at a spacing (``phantom_mm``):
#: 16 slices of 5 mm, the nominal in-plane field of view.
EXTENT_MM = (80.0, FIELD_OF_VIEW_MM, FIELD_OF_VIEW_MM)
#: The spacings ``random_spacing`` draws from (mm), as in LiTS: in-plane and between slices.
INPLANE_MM, SLICE_RANGE_MM = (0.6, 1.0), (1.0, 5.0)


def phantom_case(rng: np.random.Generator, size: int, slices: int,
                 width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One phantom volume: (HU float32 (D, S, W), labels uint8 (D, S, W)); ``width``
    defaults to ``size`` (square slices). The anatomy spans the whole grid, so other
    shapes stretch it; the random draws do not depend on the shape."""
    return phantom_at(rng, np.linspace(-1, 1, slices), np.linspace(-1, 1, size),
                      np.linspace(-1, 1, width or size))


def voxel_centres(n: int, spacing_mm: float, extent_mm: float) -> np.ndarray:
    """The body coordinates (-1 to 1 over ``extent_mm``) of the centres of ``n`` voxels
    of ``spacing_mm``, centred on the body."""
    return (np.arange(n) + 0.5 - n / 2.0) * float(spacing_mm) / (float(extent_mm) / 2.0)


def phantom_mm(rng: np.random.Generator, spacing, extent=EXTENT_MM) -> tuple[np.ndarray, np.ndarray]:
    """One phantom (HU float32, labels uint8) in the slice layout, sampled at
    ``spacing`` (z, y, x mm) over a field of view of ``extent`` (z, y, x mm):
    round(extent / spacing) voxels per axis. The same ``rng`` state draws the same body
    at any spacing (the noise is drawn last, per voxel)."""
    shape = [max(1, round(e / s)) for e, s in zip(extent, spacing)]
    return phantom_at(rng, *(voxel_centres(n, s, e) for n, s, e in zip(shape, spacing, extent)))


def random_spacing(rng: np.random.Generator) -> tuple[float, float, float]:
    """A (z, y, x) spacing in mm as real CT comes: square in-plane pixels of
    ``INPLANE_MM``, slices of ``SLICE_RANGE_MM``, each uniform, rounded to 0.01 mm."""
    inplane = round(float(rng.uniform(*INPLANE_MM)), 2)
    return round(float(rng.uniform(*SLICE_RANGE_MM)), 2), inplane, inplane


def phantom_at(rng: np.random.Generator, zc: np.ndarray, yc: np.ndarray,
               xc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The phantom sampled at body coordinates ``zc``, ``yc``, ``xc`` (1-D, -1 to 1 over
    the field of view): (HU float32, labels uint8) of shape (len(zc), len(yc), len(xc))."""
    z, y, x = np.meshgrid(zc, yc, xc, indexing="ij")
    hu = np.full(z.shape, -1000.0, dtype=np.float32)
    labels = np.zeros(z.shape, dtype=np.uint8)

    ax, ay = rng.uniform(0.75, 0.9), rng.uniform(0.55, 0.7)
    body = (x / ax) ** 2 + (y / ay) ** 2
    hu[body <= 1.0] = -90.0                                   # subcutaneous fat
    hu[body <= 0.8] = 40.0                                    # soft tissue
    spine = (x / 0.12) ** 2 + ((y - 0.4 * ay) / 0.12) ** 2 <= 1.0
    hu[spine] = 650.0

    cx, cy, cz = rng.uniform(-0.45, -0.3), rng.uniform(-0.15, 0.05), rng.uniform(-0.2, 0.2)
    rx, ry, rz = rng.uniform(0.25, 0.35), rng.uniform(0.22, 0.3), rng.uniform(0.5, 0.8)
    liver = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 + ((z - cz) / rz) ** 2 <= 1.0
    hu[liver] = rng.uniform(55.0, 70.0)
    labels[liver] = 1

    for _ in range(rng.integers(1, 4)):
        lx = cx + rng.uniform(-0.5, 0.5) * rx
        ly = cy + rng.uniform(-0.5, 0.5) * ry
        lz = cz + rng.uniform(-0.5, 0.5) * rz
        r = rng.uniform(0.06, 0.12)
        lesion = liver & (((x - lx) ** 2 + (y - ly) ** 2 + ((z - lz) * 0.5) ** 2) <= r * r)
        hu[lesion] = rng.uniform(5.0, 25.0)
        labels[lesion] = 2

    hu += rng.normal(0.0, 15.0, size=hu.shape).astype(np.float32)
    return hu, labels


def make_dataset(path: str, cases: int, size: int, seed: int = 0, slices_per_case: int = 16,
                 val_fraction: float = 0.2, dtype: str = "float32") -> data.DatasetInfo:
    """Writes ``cases`` phantom volumes as 2D slices to ``path`` and returns its info.

    The split is by case: ``round(val_fraction * cases)`` whole cases (at least one
    when there are two or more cases) go to validation.

    Raises:
      InputError: a count out of range (also a ``ValueError``).
    """
    if cases < 1 or size < 8 or slices_per_case < 1:
        raise InputError("need cases >= 1, size >= 8 and slices_per_case >= 1")
    rng = np.random.default_rng(seed)
    val_cases = _val_cases(rng, cases, val_fraction)
    images, masks, case_ids, splits = [], [], [], []
    for case in range(cases):
        hu, labels = phantom_case(rng, size, slices_per_case)
        images.append(window(hu).astype(dtype))
        masks.append(labels)
        case_ids.append(np.full(slices_per_case, case, dtype=np.int32))
        splits.append(np.full(slices_per_case, h5format.SPLITS["val" if case in val_cases else "train"],
                              dtype=np.uint8))
    data.write_dataset(
        path, np.concatenate(images)[..., None], np.concatenate(masks),
        np.concatenate(case_ids), np.concatenate(splits),
        source=f"distseg synthetic phantom (seed={seed}, cases={cases}, size={size})",
        hu_window=HU_WINDOW,
        spacing=(SLICE_MM, FIELD_OF_VIEW_MM / size, FIELD_OF_VIEW_MM / size))
    return data.examine(path)


def _val_cases(rng: np.random.Generator, cases: int, val_fraction: float) -> set:
    """``round(val_fraction * cases)`` case numbers, at least one of two or more cases,
    never all of them."""
    n_val = min(cases - 1, max(1 if cases >= 2 else 0, round(val_fraction * cases)))
    return set(rng.choice(cases, size=n_val, replace=False).tolist())


def volume_shape(rng: np.random.Generator, size: int, slices: int, jitter: float) -> tuple:
    """A case's (D, H, W): ``slices`` x ``size`` x ``size``, each scaled by its own
    uniform factor in [1 - jitter, 1 + jitter] (at least 1 slice and 8 pixels). With
    ``jitter`` 0 nothing is drawn, so the cases that follow are those ``make_dataset``
    draws from the same seed: the 2D and the 3D file of one phantom, case for case on
    one grid (a 2D and a 3D recipe of one cross-validation compared on the same cases)."""
    if jitter == 0:
        return (slices, size, size)
    f = rng.uniform(1.0 - jitter, 1.0 + jitter, size=3)
    return (max(1, round(slices * f[0])), max(8, round(size * f[1])), max(8, round(size * f[2])))


def make_volumes(path: str, cases: int, size: int, seed: int = 0, slices_per_case: int = 64,
                 val_fraction: float = 0.2, dtype: str = "float32",
                 jitter: float = 0.25) -> volumes.VolumeInfo:
    """Writes ``cases`` phantom volumes, each of its own shape (``volume_shape``), in
    the volume layout and returns the file's info. The split is by case as in
    ``make_dataset``; ``jitter`` 0 gives every case the same shape (for ``--slab full``)
    and the same cases, on the same grid, as ``make_dataset`` of the same seed, cases,
    size and slices per case.

    Raises:
      InputError: a count out of range (also a ``ValueError``).
    """
    if cases < 1 or size < 8 or slices_per_case < 1 or not 0 <= jitter < 1:
        raise InputError("need cases >= 1, size >= 8, slices_per_case >= 1 and 0 <= jitter < 1")
    rng = np.random.default_rng(seed)
    val_cases = _val_cases(rng, cases, val_fraction)
    writer = volumes.VolumeWriter(path, dtype)
    try:
        for case in range(cases):
            d, h, w = volume_shape(rng, size, slices_per_case, jitter)
            hu, labels = phantom_case(rng, h, d, width=w)
            writer.append(window(hu), labels, case,
                          h5format.SPLITS["val" if case in val_cases else "train"],
                          spacing=(SLICE_MM, FIELD_OF_VIEW_MM / h, FIELD_OF_VIEW_MM / w))
        writer.finish(source=f"distseg synthetic phantom volumes (seed={seed}, cases={cases}, "
                             f"size={size}, slices={slices_per_case}, jitter={jitter})",
                      hu_window=HU_WINDOW)
    except BaseException:
        writer.abort()
        raise
    return volumes.examine(path)


def make(path: str, *, ndim: int, cases: int, size: int, seed: int = 0,
         slices_per_case: int | None = None, val_fraction: float = 0.2, dtype: str = "float32",
         jitter: float | None = None):
    """``distseg-data synth``: ``make_dataset`` (``ndim`` 2) or ``make_volumes`` (3),
    with their own defaults for ``slices_per_case`` (16, 64) and ``jitter`` (3D: 0.25).

    Raises:
      InputError: ``jitter`` for slices (every slice of a file has one size), or a count
      out of range.
    """
    if ndim == 3:
        return make_volumes(path, cases, size, seed=seed, slices_per_case=slices_per_case or 64,
                            val_fraction=val_fraction, dtype=dtype,
                            jitter=0.25 if jitter is None else jitter)
    if jitter is not None:
        raise InputError("--jitter varies the shape of volumes: it needs --ndim 3 "
                         "(the slices of a 2D file all have one size)")
    return make_dataset(path, cases, size, seed=seed, slices_per_case=slices_per_case or 16,
                        val_fraction=val_fraction, dtype=dtype)
