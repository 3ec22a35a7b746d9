"""Streaming writer of a converted dataset: the distseg format plus per-case geometry.

Slices are appended case by case to resizable datasets of ``OUT.h5.partial``; only
``finish`` renames it to ``OUT.h5``, so an interrupted or failed conversion never
leaves a file that looks complete. Besides the format's ``images``, ``masks``,
``case_id`` and ``split`` (one chunk per slice), the group ``cases/`` holds one row per
case, enough to put a prediction back on the case's original grid:

``name``, ``image``, ``label``  the case name and its files (relative to ``source_root``)
``case_id``, ``split``, ``fold`` its id in ``case_id``, its split and cross-validation fold
``first``, ``slices``            its rows ``first:first + slices`` in ``images``/``masks``
``affine`` (4, 4), ``shape`` (3) the input volume's voxel-to-RAS affine and array shape
``ornt`` (3, 2)                  nibabel orientation from the input array to RAS
``z_range`` (2)                  kept slices ``z0:z1`` of the reoriented volume
``inplane`` (2)                  rows, columns of a slice before resampling
``spacing`` (3)                  slice, row, column spacing in mm before resampling
``bounds`` (2), or (C, 2)        the values mapped to 0 and 1 (HU window, MR percentiles,
                                 or a z-score's mean and mean + sd), per channel when
                                 the file holds C > 1
``grid`` (3), ``offset`` (2)     only with ``convert --spacing``: the kept slices' shape
                                 at the target spacing, and the row and column of it where
                                 the stored slices start (the centre crop, or a pad when
                                 negative); the file attribute ``target_spacing`` (3) is
                                 that spacing (z, y, x mm)

``VolumeCaseWriter`` (``convert --ndim 3``) writes the volume layout of
``distseg.data.volumes`` instead, one volume per case on its own grid, with the same
``cases/`` rows less ``first`` and ``slices`` (row k is ``volumes/k``).
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from distseg.core.partial import PartialFile
from distseg.data import h5format, volumes
from distseg.data.convert.geometry import Geometry

#: Filters compared in docs/studies/convert-and-compression-2026-11-23.md (the choice:
#: docs/data.md#choosing-the-compression).
COMPRESSIONS = {
    "none": {},
    "lzf": {"compression": "lzf"},
    "gzip": {"compression": "gzip", "compression_opts": 1, "shuffle": True},
}

_STR = h5py.string_dtype()
#: cases/ columns: (dtype, per-row shape).
COLUMNS = {
    "name": (_STR, ()), "image": (_STR, ()), "label": (_STR, ()),
    "case_id": (np.int32, ()), "split": (np.uint8, ()), "fold": (np.int16, ()),
    "first": (np.int64, ()), "slices": (np.int64, ()),
    "affine": (np.float64, (4, 4)), "shape": (np.int64, (3,)), "ornt": (np.float64, (3, 2)),
    "z_range": (np.int64, (2,)), "inplane": (np.int64, (2,)), "spacing": (np.float64, (3,)),
    "bounds": (np.float64, (2,)),
}


#: The columns a volume file's cases/ group leaves out: its rows are its volumes.
SLICE_ROWS = ("first", "slices")
#: The columns a file converted with ``--spacing`` adds: the kept slices' shape at
#: the target spacing (before the centre crop or pad to ``size``) and where the stored
#: slices start in it (row, column; negative: padding).
SPACED = {"grid": (np.int64, (3,)), "offset": (np.int64, (2,))}


def columns_for(channels: int, leave_out=(), spaced: bool = False) -> dict:
    """``COLUMNS`` for images of ``channels`` channels (``bounds`` per channel when
    there are several), less ``leave_out``, plus ``SPACED`` when ``spaced``."""
    out = {k: v for k, v in COLUMNS.items() if k not in leave_out}
    if channels > 1:
        out["bounds"] = (np.float64, (channels, 2))
    return {**out, **SPACED} if spaced else out


def _append(ds: h5py.Dataset, rows: np.ndarray, block: int = 32) -> None:
    # In blocks: h5py and the filter pipeline buffer what one write holds, and a whole
    # case would double the memory of a case.
    start = ds.shape[0]
    ds.resize(start + len(rows), axis=0)
    for i in range(0, len(rows), block):
        ds[start + i:start + i + block] = rows[i:i + block]


def case_row(*, name: str, image: str, label: str, case_id: int, split: int, fold: int,
             geometry: Geometry, bounds: tuple[float, float]) -> dict:
    """A case's cases/ row, less the slice rows (``SLICE_ROWS``); with a target
    spacing, its ``SPACED`` columns too."""
    row = {
        "name": name, "image": image, "label": label, "case_id": case_id, "split": split,
        "fold": fold, "affine": geometry.affine, "shape": geometry.shape, "ornt": geometry.ornt,
        "z_range": (geometry.z0, geometry.z1), "inplane": geometry.slices_shape[1:],
        "spacing": geometry.spacing, "bounds": bounds,
    }
    if geometry.target is not None:
        row.update(grid=geometry.grid, offset=geometry.offset)
    return row


class CaseTable:
    """The resizable cases/ group: one row per case, the columns of ``columns``."""

    def __init__(self, f: h5py.File, columns: dict):
        self.group = f.create_group("cases")
        for name, (kind, shape) in columns.items():
            self.group.create_dataset(name, shape=(0,) + shape, maxshape=(None,) + shape,
                                      chunks=(256,) + shape, dtype=kind)

    def append(self, **row) -> None:
        for key, value in row.items():
            ds = self.group[key]
            value = np.asarray(value, dtype=object if ds.dtype == _STR else ds.dtype)
            _append(ds, value.reshape((1,) + ds.shape[1:]))


class SliceWriter:
    """Appends cases to ``OUT.h5.partial``; ``finish`` renames it, ``abort`` removes it."""

    def __init__(self, out: str, size: int, dtype: str = "float32", compression: str = "lzf",
                 channels: int = 1, spaced: bool = False):
        self.out, self.channels = out, int(channels)
        self._partial = PartialFile(out)
        self.partial = self._partial.partial
        self.rows = 0
        self.spacings: list[np.ndarray] = []
        filters = COMPRESSIONS[compression]
        try:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            self._f = h5py.File(self.partial, "w")
        except OSError as e:
            raise h5format.DatasetError(f"{out}: cannot be written ({e.strerror or e})") from e
        f = self._f
        c = self.channels
        f.create_dataset("images", shape=(0, size, size, c), maxshape=(None, size, size, c),
                         chunks=(1, size, size, c), dtype=dtype, **filters)
        f.create_dataset("masks", shape=(0, size, size), maxshape=(None, size, size),
                         chunks=(1, size, size), dtype=np.uint8, **filters)
        f.create_dataset("case_id", shape=(0,), maxshape=(None,), chunks=(4096,), dtype=np.int32)
        f.create_dataset("split", shape=(0,), maxshape=(None,), chunks=(4096,), dtype=np.uint8)
        self.table = CaseTable(f, columns_for(c, spaced=spaced))

    def append(self, *, name: str, image: str, label: str, case_id: int, split: int, fold: int,
               images: np.ndarray, masks: np.ndarray, geometry: Geometry,
               bounds) -> None:
        """Adds one case's slices (normalised (n, S, S) images of one channel, or
        (n, S, S, C), and masks) and its row."""
        f, n = self._f, len(images)
        if images.ndim == 3:
            images = images[..., None]
        if images.shape[3:] != (self.channels,):
            raise h5format.DatasetError(f"{self.out}: case {name}: images of shape {images.shape}, "
                                        f"expected {self.channels} channel(s)")
        _append(f["images"], images.astype(f["images"].dtype, copy=False))
        _append(f["masks"], masks)
        _append(f["case_id"], np.full(n, case_id, dtype=np.int32))
        _append(f["split"], np.full(n, split, dtype=np.uint8))
        self.table.append(first=self.rows, slices=n, **case_row(
            name=name, image=image, label=label, case_id=case_id, split=split, fold=fold,
            geometry=geometry, bounds=bounds))
        self.rows += n
        self.spacings.append(geometry.resampled_spacing)

    def finish(self, *, source: str, class_names, hu_window, preprocessing: dict,
               splitting: dict, extra: dict, channel_names=None) -> None:
        """Writes the file attributes, closes and renames ``OUT.h5.partial`` to ``OUT.h5``."""
        f = self._f
        f.attrs["format_version"] = h5format.FORMAT_VERSION
        f.attrs["layout"] = "slices"
        f.attrs["source"] = source
        f.attrs["num_classes"] = len(class_names)
        f.attrs["class_names"] = list(class_names)
        if channel_names is not None:
            f.attrs["channel_names"] = list(channel_names)
        f.attrs["hu_window"] = np.asarray(hu_window, dtype=np.float64)
        # Cases differ in spacing; the median is the file's nominal one (each case's
        # own is in cases/spacing).
        f.attrs["spacing"] = (np.median(np.asarray(self.spacings), axis=0) if self.spacings
                              else np.full(3, np.nan))
        f.attrs["preprocessing"] = json.dumps(preprocessing, sort_keys=True)
        f.attrs["splitting"] = json.dumps(splitting, sort_keys=True)
        for key, value in extra.items():
            f.attrs[key] = value
        f.close()
        self._partial.finish()

    def abort(self) -> None:
        """Closes and removes ``OUT.h5.partial``; ``OUT.h5`` (if any) is untouched."""
        self._partial.abort(self._f.close)


class VolumeCaseWriter:
    """``SliceWriter``'s interface for ``convert --ndim 3``: each case one volume
    (``volumes.VolumeWriter``), plus its cases/ row."""

    def __init__(self, out: str, size: int | None = None, dtype: str = "float32",
                 compression: str = "lzf", channels: int = 1, spaced: bool = False):
        self.out = out
        self._volumes = volumes.VolumeWriter(out, dtype, COMPRESSIONS[compression])
        self.partial = self._volumes.partial
        self.table = CaseTable(self._volumes.file, columns_for(channels, SLICE_ROWS, spaced))

    def append(self, *, name: str, image: str, label: str, case_id: int, split: int, fold: int,
               images: np.ndarray, masks: np.ndarray, geometry: Geometry,
               bounds) -> None:
        """Adds one case: its normalised (D, H, W) or (D, H, W, C) volume, its labels
        and its row."""
        self._volumes.append(images, masks, case_id, split, spacing=geometry.resampled_spacing)
        self.table.append(**case_row(name=name, image=image, label=label, case_id=case_id,
                                     split=split, fold=fold, geometry=geometry, bounds=bounds))

    def finish(self, *, source: str, class_names, hu_window, preprocessing: dict,
               splitting: dict, extra: dict, channel_names=None) -> None:
        """Writes the tables and attributes, closes and renames the file."""
        self._volumes.finish(source=source, hu_window=hu_window, class_names=class_names,
                             channel_names=channel_names, extra={
            "preprocessing": json.dumps(preprocessing, sort_keys=True),
            "splitting": json.dumps(splitting, sort_keys=True), **extra})

    def abort(self) -> None:
        self._volumes.abort()
