"""3D volumes in one HDF5 file, their slab grid, and the slab reader of 3D training.

The ``volumes`` layout (file attribute ``layout="volumes"``, ``format_version`` 1; see
docs/data.md#volumes): per case ``k`` (0..K-1, in file order)

``volumes/k/image``       (D, H, W) float32 or float16, normalised (windowed to [0, 1],
                          or z-scored), one channel; or (D, H, W, C): C channels, last
``volumes/k/mask``        (D, H, W) uint8 class ids
``volumes/k/foreground``  (M, 3) int32 (z, y, x) of up to ``FOREGROUND_SAMPLES``
                          foreground voxels, evenly spaced in scan order (M = 0: none)

and the per-case tables ``case_id`` (K,) int, ``split`` (K,) uint8 (0 train, 1 val,
2 test), ``shape`` (K, 3) int and ``spacing`` (K, 3) float (mm, NaN unknown). Cases
differ in shape, never in channel count: every image of a file has the same C (a
(D, H, W) image counts as C = 1). Images and masks are chunked ``CHUNK`` (clipped to
the volume; an image's channels share a chunk), so a slab reads only the chunks it
overlaps. File attributes are those of the slice format (``data``, ``channel_names``
included) plus ``layout``. Readers give images channels last, whatever the stored form:
(B, d, h, w, C) slabs and (D, H, W, C) whole cases.

Training samples are **slabs**: for a slab shape (d, h, w) each case is tiled along
each axis (``tile_starts``: the last tile shifted inward to end at the volume's edge;
an axis shorter than the slab has one tile, zero-padded at read time). Every tile of
every case has one integer id, unique in the file (``SlabGrid``); training shards,
digests and coverage work on these ids exactly as on 2D slice ids. ``--slab full``
makes one sample per case, the whole volume. Nothing here imports TensorFlow or Horovod.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Sequence

import h5py
import numpy as np

from distseg.core.config import LIVER_CLASSES
from distseg.core.partial import PartialFile
from distseg.data import h5format
from distseg.data import slices as data
from distseg.data.h5format import DatasetError
from distseg.data.sharding import foreground_draws

LAYOUT = "volumes"
#: Chunk shape of images and masks (z, y, x), clipped to each volume: a 32x128x128 slab
#: overlaps 8 to 27 chunks of 256 KiB (float32).
CHUNK = (16, 64, 64)
#: Foreground voxels kept per case for foreground-biased slabs (as nnU-Net's 10,000).
FOREGROUND_SAMPLES = 10_000
#: What a volume shorter than the slab is padded with, at the high end of each short
#: axis: image 0 (the bottom of the intensity window: air in CT) and mask 0 (background).
PAD_IMAGE, PAD_MASK = 0.0, 0
#: Slab shape meaning one sample per case, the whole volume.
FULL = "full"


# ------------------------------------------------------------------- writing


def foreground_sample(mask: np.ndarray, limit: int = FOREGROUND_SAMPLES) -> np.ndarray:
    """(M, 3) int32 coordinates of up to ``limit`` voxels of ``mask`` > 0, evenly spaced
    over the foreground in scan order (all of them when there are fewer)."""
    flat = np.flatnonzero(mask)
    if len(flat) > limit:
        flat = flat[np.linspace(0, len(flat) - 1, limit).round().astype(np.int64)]
    return np.stack(np.unravel_index(flat, mask.shape), axis=1).astype(np.int32)


def chunks_for(shape: Sequence[int]) -> tuple[int, ...]:
    """``CHUNK`` clipped to a (D, H, W) or (D, H, W, C) shape; all C channels of a
    voxel in one chunk."""
    return tuple(int(min(c, s)) for c, s in zip(CHUNK, shape)) + tuple(int(c) for c in shape[3:])


class VolumeWriter:
    """Appends cases to ``OUT.partial``; ``finish`` writes the attributes and renames it
    to ``OUT``, ``abort`` removes it (an existing ``OUT`` stays untouched until then)."""

    def __init__(self, out: str, dtype: str = "float32", compression: dict | None = None):
        self.channels: int | None = None
        self._partial = PartialFile(out)
        self.out, self.partial = out, self._partial.partial
        self.dtype, self.compression = np.dtype(dtype), dict(compression or {})
        self.rows: list[tuple[int, int, tuple, tuple]] = []
        try:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            self.file = h5py.File(self.partial, "w")
        except OSError as e:
            raise DatasetError(f"{out}: cannot be written ({e.strerror or e})") from e
        self.file.create_group("volumes")

    def append(self, image: np.ndarray, mask: np.ndarray, case_id: int, split: int,
               spacing: Sequence[float] = (math.nan,) * 3) -> int:
        """Writes one case (a normalised (D, H, W) or (D, H, W, C) image and its (D, H, W)
        mask); returns its row. One channel is stored (D, H, W), as before channels
        existed; every case of a file must have the same C.

        Raises:
          DatasetError: shapes that do not match, or another C than the first case's.
        """
        channels = image.shape[3] if image.ndim == 4 else 1
        if (image.ndim not in (3, 4) or mask.shape != image.shape[:3] or min(image.shape) < 1):
            raise DatasetError(f"{self.out}: case {case_id}: image {image.shape} and mask "
                               f"{mask.shape} must be (D, H, W[, C]) and (D, H, W), at least 1x1x1")
        if self.channels is not None and channels != self.channels:
            raise DatasetError(f"{self.out}: case {case_id}: image of {channels} channel(s), but "
                               f"the file's first case has {self.channels}; every image of a "
                               "file has the same channels")
        self.channels = channels
        if image.ndim == 4 and channels == 1:
            image = image[..., 0]
        k = len(self.rows)
        group = self.file["volumes"].create_group(str(k))
        chunks = chunks_for(image.shape)
        group.create_dataset("image", data=image.astype(self.dtype, copy=False), chunks=chunks,
                             **self.compression)
        group.create_dataset("mask", data=mask.astype(np.uint8, copy=False), chunks=chunks[:3],
                             **self.compression)
        group.create_dataset("foreground", data=foreground_sample(mask))
        self.rows.append((int(case_id), int(split), tuple(int(s) for s in image.shape[:3]),
                          tuple(float(s) for s in spacing)))
        return k

    def finish(self, *, source: str, hu_window: Sequence[float],
               class_names: Sequence[str] = LIVER_CLASSES,
               spacing: Sequence[float] | None = None, extra: dict | None = None,
               channel_names: Sequence[str] | None = None) -> None:
        """Writes the per-case tables and the attributes, closes and renames the file.
        ``spacing`` (the file's nominal one) defaults to the median of the cases';
        ``channel_names``, when given, names the images' channels.

        Raises:
          DatasetError: ``channel_names`` not one per channel.
        """
        if channel_names is not None and self.channels is not None and len(channel_names) != self.channels:
            raise DatasetError(f"{self.out}: {len(channel_names)} channel_names for images of "
                               f"{self.channels} channel(s)")
        f = self.file
        case_id, split, shape, spacings = zip(*self.rows) if self.rows else ((),) * 4
        f.create_dataset("case_id", data=np.asarray(case_id, dtype=np.int32))
        f.create_dataset("split", data=np.asarray(split, dtype=np.uint8))
        f.create_dataset("shape", data=np.asarray(shape, dtype=np.int64).reshape(-1, 3))
        spacings = np.asarray(spacings, dtype=np.float64).reshape(-1, 3)
        f.create_dataset("spacing", data=spacings)
        f.attrs["format_version"] = h5format.FORMAT_VERSION
        f.attrs["layout"] = LAYOUT
        f.attrs["source"] = source
        f.attrs["num_classes"] = len(class_names)
        f.attrs["class_names"] = list(class_names)
        f.attrs["hu_window"] = np.asarray(hu_window, dtype=np.float64)
        nominal = spacing if spacing is not None else (
            np.median(spacings, axis=0) if len(spacings) else np.full(3, np.nan))
        f.attrs["spacing"] = np.asarray(nominal, dtype=np.float64)
        if channel_names is not None:
            f.attrs["channel_names"] = list(channel_names)
        for key, value in (extra or {}).items():
            f.attrs[key] = value
        f.close()
        self._partial.finish()

    def abort(self) -> None:
        """Closes and removes ``OUT.partial``; ``OUT`` (if any) is untouched."""
        self._partial.abort(self.file.close)


# ------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class VolumeInfo:
    """What a volume file holds, from its metadata (no voxel data). Cases are rows
    0..K-1 in file order; ``case_ids`` are the ids the data came with."""

    path: str
    dtype: str
    num_classes: int
    class_names: tuple[str, ...]
    """One name per class (``h5format.class_names_of``)."""
    case_ids: np.ndarray
    splits: np.ndarray
    shapes: np.ndarray
    """(K, 3) int: each case's (D, H, W)."""
    spacing: np.ndarray
    """(K, 3) float: each case's (z, y, x) spacing in mm, NaN where unknown."""
    attrs: dict
    channels: int = 1
    """Input channels per voxel (1 for (D, H, W) images)."""
    channel_names: tuple[str, ...] = ()
    """One name per channel (attribute ``channel_names``), or empty: none recorded."""

    @property
    def cases(self) -> int:
        return len(self.case_ids)

    def with_splits(self, splits: np.ndarray) -> "VolumeInfo":
        """This file's info with ``splits`` (one per case) in place of the file's own
        (a cross-validation fold's, ``folds.applied``)."""
        return dataclasses.replace(self, splits=np.asarray(splits, np.uint8))

    def rows(self, split: str) -> np.ndarray:
        """Row indices of the cases in ``split`` ("train", "val" or "test")."""
        return np.flatnonzero(self.splits == h5format.SPLITS[split])

    @property
    def train_cases(self) -> np.ndarray:
        return self.rows("train")

    @property
    def val_cases(self) -> np.ndarray:
        return self.rows("val")

    def summary(self, slab: Sequence[int] | None = None) -> dict:
        """What ``distseg-data info`` prints and a 3D run logs as ``dataset``: the keys
        every data summary has (``h5format.summary_of``), where a sample is a slab of
        ``slab`` (a whole volume without one, as ``--slab full``), plus the shapes and,
        with ``slab``, the grid it makes."""
        grid = SlabGrid.of(self.shapes, slab if slab is not None else self.shapes.max(axis=0))
        per_sample = np.repeat(self.splits, grid.counts.prod(axis=1))
        out = h5format.summary_of(self.path, LAYOUT, self.attrs, self.dtype, self.num_classes,
                              self.class_names, self.case_ids, self.splits, per_sample,
                              sample=None if slab is not None else "volume",
                              channels=self.channels, channel_names=self.channel_names)
        out.update(shape_min=self.shapes.min(axis=0).tolist(),
                   shape_max=self.shapes.max(axis=0).tolist(),
                   voxels=int(self.shapes.prod(axis=1).sum()))
        if slab is not None:
            out.update(slab=list(grid.slab), train_slabs=out["train_samples"],
                       val_slabs=out["val_samples"],
                       padded_cases=[int(self.case_ids[k]) for k in grid.padded()])
        return out


#: Per-case tables: name -> (columns, kind) with kind "int" or "float".
TABLES = {"case_id": ((), "int"), "split": ((), "int"), "shape": ((3,), "int"),
          "spacing": ((3,), "float")}


def _table(path: str, f: h5py.File, name: str, k: int | None) -> np.ndarray:
    cols, kind = TABLES[name]
    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise DatasetError(f"{path}: missing dataset '{name}' (a volume file needs "
                           f"{', '.join(TABLES)} and the group 'volumes')")
    want = (k if k is not None else obj.shape[0],) + cols
    ok_kind = (np.issubdtype(obj.dtype, np.integer) if kind == "int"
               else np.issubdtype(obj.dtype, np.number))
    if obj.ndim != len(want) or obj.shape != want or not ok_kind:
        shown = "(K,)" if not cols else "(K, 3)"
        raise DatasetError(f"{path}: '{name}' is {obj.shape} {obj.dtype}, expected {shown} "
                           f"{'integers' if kind == 'int' else 'numbers'}"
                           + (f" with K = {k} cases" if k is not None else ""))
    return obj[()]


def _check_tables(path: str, case_ids: np.ndarray, splits: np.ndarray, shapes: np.ndarray) -> None:
    if len(case_ids) == 0:
        raise DatasetError(f"{path}: holds no cases")
    if not np.isin(splits, list(h5format.SPLITS.values())).all():
        raise DatasetError(f"{path}: 'split' holds values other than 0 (train), 1 (val), 2 (test)")
    if len(np.unique(case_ids)) != len(case_ids):
        raise DatasetError(f"{path}: 'case_id' repeats a case (each case is one volume)")
    if (shapes < 1).any():
        k = int(np.argwhere(shapes < 1)[0, 0])
        raise DatasetError(f"{path}: case {case_ids[k]} has shape {tuple(shapes[k])}, "
                           "expected at least 1 voxel along each axis")


def _check_case(path: str, f: h5py.File, k: int, case_id: int, shape: tuple) -> int:
    """Checks ``volumes/k`` against the tables (metadata only); returns its image's
    channel count (1 for a (D, H, W) image)."""
    where = f"{path}: case {case_id} (volumes/{k})"
    group = f.get(f"volumes/{k}")
    if not isinstance(group, h5py.Group):
        raise DatasetError(f"{where}: missing group, expected image, mask and foreground")
    channels = 1
    for name, dtypes in (("image", (np.float32, np.float16)), ("mask", (np.uint8,))):
        obj = group.get(name)
        if not isinstance(obj, h5py.Dataset):
            raise DatasetError(f"{where}: missing dataset '{name}'")
        if name == "image" and obj.ndim == 4 and obj.shape[:3] == shape and obj.shape[3] >= 1:
            channels = int(obj.shape[3])
        elif obj.shape != shape:
            want = f"{shape} or ({', '.join(map(str, shape))}, C)" if name == "image" else f"{shape}"
            raise DatasetError(f"{where}: '{name}' has shape {obj.shape}, expected {want} "
                               "(its row of 'shape')")
        if obj.dtype not in dtypes:
            raise DatasetError(f"{where}: '{name}' has dtype {obj.dtype}, expected "
                               f"{' or '.join(np.dtype(d).name for d in dtypes)}")
    fg = group.get("foreground")
    if (not isinstance(fg, h5py.Dataset) or fg.ndim != 2 or fg.shape[1] != 3
            or not np.issubdtype(fg.dtype, np.integer)):
        raise DatasetError(f"{where}: 'foreground' must be an (M, 3) integer dataset")
    return channels


def _check_labels(path: str, f: h5py.File, k: int, case_id: int, num_classes: int) -> None:
    """Every label of case ``k`` below ``num_classes``, read 16 slices at a time."""
    mask = f[f"volumes/{k}/mask"]
    for z in range(0, mask.shape[0], 16):
        top = int(mask[z:z + 16].max())
        if top >= num_classes:
            raise DatasetError(f"{path}: case {case_id} (volumes/{k}/mask) has label {top} near "
                               f"slice {z}, expected 0..{num_classes - 1} (attribute "
                               f"num_classes={num_classes})")


def read_info(path: str, f: h5py.File, check_labels: bool = False) -> VolumeInfo:
    """``examine`` on an open file."""
    with h5format.damaged(path):
        case_ids = _table(path, f, "case_id", None)
        k = len(case_ids)
        splits, shapes = _table(path, f, "split", k), _table(path, f, "shape", k)
        spacing = (_table(path, f, "spacing", k).astype(np.float64) if "spacing" in f
                   else np.full((k, 3), np.nan))
        _check_tables(path, case_ids, splits, shapes)
        num_classes = h5format.num_classes_of(path, f)
        class_names = h5format.class_names_of(path, f, num_classes)
        channels = None
        for row in range(k):
            found = _check_case(path, f, row, int(case_ids[row]), tuple(int(s) for s in shapes[row]))
            if channels is not None and found != channels:
                raise DatasetError(f"{path}: case {case_ids[row]} (volumes/{row}/image) has "
                                   f"{found} channel(s), but case {case_ids[0]} (volumes/0/image) "
                                   f"has {channels}; every image of a file has the same channels")
            channels = found
            if check_labels:
                _check_labels(path, f, row, int(case_ids[row]), num_classes)
        channel_names = h5format.channel_names_of(path, f, channels)
        attrs = {key: (v.tolist() if isinstance(v, np.ndarray) else v) for key, v in f.attrs.items()}
        dtype = str(f["volumes/0/image"].dtype)
    return VolumeInfo(path=path, dtype=dtype, num_classes=num_classes, class_names=class_names,
                      case_ids=case_ids.astype(np.int64), splits=splits.astype(np.uint8),
                      shapes=shapes.astype(np.int64), spacing=spacing, attrs=attrs,
                      channels=channels, channel_names=channel_names)


def examine(path: str, check_labels: bool = True) -> VolumeInfo:
    """Validates a volume file's structure and returns what it holds.

    With ``check_labels``, reads every mask once (16 slices at a time) to catch labels
    outside the declared classes before training.

    Raises:
      DatasetError: one line naming the file (and case) and what was expected; a file
      of 2D slices is refused with what to use instead.
    """
    with h5format.open_file(path, layout=LAYOUT) as f:
        return read_info(path, f, check_labels)


def describe(path: str, slab: str | None = None) -> dict:
    """What ``distseg-data info`` prints for a file of either layout: its summary and
    attributes; for a volume file with ``slab`` (``--slab`` text), its slab grid too.

    Raises:
      DatasetError: a bad file, or ``slab`` for a slice file.
      ValueError: a malformed ``slab``.
    """
    if h5format.file_layout(path) != LAYOUT:
        if slab:
            raise DatasetError(f"{path}: --slab applies to volume files, and this one holds "
                               "2D slices")
        found = data.examine(path)
        return {**found.summary(), "attrs": found.attrs}
    found = examine(path)
    shape = resolve_slab(found, parse_slab(slab)) if slab else None
    return {**found.summary(shape), "attrs": found.attrs}


# ------------------------------------------------------------------- slab grid


def parse_slab(text: str) -> tuple[int, int, int] | str:
    """``"D,H,W"`` (e.g. ``"32,128,128"``) or ``"full"``, for ``--slab``.

    Raises:
      ValueError: anything else (the message names the flag).
    """
    if text.strip().lower() == FULL:
        return FULL
    try:
        slab = tuple(int(v) for v in text.split(","))
    except ValueError:
        slab = ()
    if len(slab) != 3 or min(slab) < 1:
        raise ValueError(f"--slab {text!r}: expected D,H,W (three positive integers, e.g. "
                         "32,128,128) or full")
    return slab


def resolve_slab(info: VolumeInfo, slab) -> tuple[int, int, int]:
    """The slab shape for ``slab`` ((d, h, w) or ``"full"``): ``full`` is the volumes'
    one shape.

    Raises:
      DatasetError: ``full`` with volumes of more than one shape.
    """
    if slab != FULL:
        return tuple(int(s) for s in slab)
    lo, hi = info.shapes.min(axis=0), info.shapes.max(axis=0)
    if (lo != hi).any():
        raise DatasetError(
            f"{info.path}: --slab full needs volumes of one shape, but they range from "
            f"{'x'.join(map(str, lo))} to {'x'.join(map(str, hi))}; pass --slab D,H,W "
            "(e.g. 32,128,128) to train on slabs")
    return tuple(int(s) for s in lo)


def tile_starts(n: int, s: int) -> np.ndarray:
    """Starts of the tiles of length ``s`` covering ``0..n``: every ``s``, the last one
    shifted inward to end at ``n``; one tile at 0 when ``n <= s`` (padded when read)."""
    if n <= s:
        return np.zeros(1, dtype=np.int64)
    starts = np.arange(-(-n // s), dtype=np.int64) * s
    starts[-1] = n - s
    return starts


@dataclass(frozen=True)
class SlabGrid:
    """The tiles of every case for one slab shape, numbered 0..total-1: case ``k``
    owns ids ``offsets[k]:offsets[k+1]``, its tiles in (z, y, x) row-major order."""

    slab: tuple[int, int, int]
    shapes: np.ndarray
    counts: np.ndarray
    """(K, 3): tiles along each axis."""
    offsets: np.ndarray
    """(K + 1,): the first id of each case, then the total."""

    @classmethod
    def of(cls, shapes: np.ndarray, slab: Sequence[int]) -> "SlabGrid":
        shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        slab = tuple(int(s) for s in slab)
        counts = np.maximum(1, -(-shapes // np.asarray(slab)))
        offsets = np.concatenate([[0], np.cumsum(counts.prod(axis=1))]).astype(np.int64)
        return cls(slab=slab, shapes=shapes, counts=counts, offsets=offsets)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def ids(self, cases: Sequence[int]) -> np.ndarray:
        """Every slab id of the cases (rows) ``cases``, ascending."""
        parts = [np.arange(self.offsets[k], self.offsets[k + 1]) for k in cases]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def locate(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(cases (B,), starts (B, 3)) of slab ids: their case row and grid origin.

        Raises:
          ValueError: an id outside 0..total-1.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.total):
            raise ValueError(f"slab ids must be in 0..{self.total - 1}, got {ids.min()}..{ids.max()}")
        cases = np.searchsorted(self.offsets, ids, side="right") - 1
        local = ids - self.offsets[cases]
        starts = np.zeros((len(ids), 3), dtype=np.int64)
        for b, (k, i) in enumerate(zip(cases, local)):
            tile = np.unravel_index(int(i), tuple(self.counts[k]))
            starts[b] = [tile_starts(int(n), s)[t] for n, s, t in zip(self.shapes[k], self.slab, tile)]
        return cases, starts

    def padded(self) -> np.ndarray:
        """Rows of the cases shorter than the slab along some axis (zero-padded)."""
        return np.flatnonzero((self.shapes < np.asarray(self.slab)).any(axis=1))


def slab_ids(info: VolumeInfo, slab, split: str = "train") -> np.ndarray:
    """The slab ids of ``split``'s cases for ``slab`` ((d, h, w) or ``"full"``): the
    "indices" 3D training shards, digests and covers."""
    return SlabGrid.of(info.shapes, resolve_slab(info, slab)).ids(info.rows(split))


def check_fit(info: VolumeInfo, *, ranks: int, batch_size: int, slab,
              num_classes: int | None = None) -> tuple[int, int, int]:
    """Checks that a volume file suits a 3D run; returns the resolved slab shape.

    Raises:
      DatasetError: one line naming the file and what would fix it.
    """
    shape = resolve_slab(info, slab)
    if num_classes is not None and info.num_classes != num_classes:
        raise DatasetError(f"{info.path}: attribute num_classes={info.num_classes}, "
                           f"but the model predicts {num_classes} classes")
    n = len(slab_ids(info, shape, "train"))
    if n < ranks * batch_size:
        raise DatasetError(
            f"{info.path}: {n} training slabs of {'x'.join(map(str, shape))}, fewer than "
            f"ranks x batch size = {ranks} x {batch_size} = {ranks * batch_size}; "
            "pass a smaller --slab")
    return shape


# ------------------------------------------------------------------- reading


def centred_start(voxel: np.ndarray, shape: np.ndarray, slab: Sequence[int]) -> np.ndarray:
    """The origin of a slab centred on ``voxel``, moved inside the volume (0 on an
    axis shorter than the slab)."""
    slab = np.asarray(slab, dtype=np.int64)
    return np.clip(np.asarray(voxel, dtype=np.int64) - slab // 2, 0, np.maximum(shape - slab, 0))


class SlabReader(h5format.H5Reader):
    """Reads batches of slab ids of a volume file, chunk by chunk.

    ``read(ids, epoch)`` gives (images float32 (B, d, h, w, C), masks uint8 (B, d, h, w)).
    With ``foreground_fraction`` f, a share f of slabs is re-centred on a random
    foreground voxel of its case (``foreground_draws``); the id is unchanged, so the
    sample digests still count every grid slab once per epoch. Cases shorter than the
    slab are zero-padded (``PAD_IMAGE``, ``PAD_MASK``). The reader holds no state that
    reads change, and h5py serialises its own calls, so the prefetch thread and a
    validation loop may share it.
    """

    def __init__(self, path: str, slab, foreground_fraction: float = 0.0, seed: int = 0):
        if not 0.0 <= foreground_fraction <= 1.0:
            raise ValueError(f"--foreground-fraction {foreground_fraction}: expected 0..1")
        self.path, self.fraction, self.seed = path, float(foreground_fraction), int(seed)
        self._file = h5format.open_file(path, layout=LAYOUT)
        try:
            self.info = read_info(path, self._file)
            self.slab = resolve_slab(self.info, slab)
            with h5format.damaged(path):
                groups = [self._file[f"volumes/{k}"] for k in range(self.info.cases)]
                self._images = [g["image"] for g in groups]
                self._masks = [g["mask"] for g in groups]
                self._foreground = [g["foreground"][()].astype(np.int64) for g in groups]
        except BaseException:
            self._file.close()
            raise
        self.grid = SlabGrid.of(self.info.shapes, self.slab)

    def plan(self, ids: Sequence[int], epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cases, origins (B, 3), re-centred (B,) bool) of the slabs ``ids`` read in
        ``epoch``: what ``read`` will read, without reading it."""
        cases, starts = self.grid.locate(ids)
        sizes = [len(self._foreground[k]) for k in cases]
        picks = foreground_draws(ids, epoch, self.seed, self.fraction, sizes)
        biased = np.array([p is not None for p in picks], dtype=bool)
        for b, pick in enumerate(picks):
            if pick is not None:
                k = cases[b]
                starts[b] = centred_start(self._foreground[k][pick], self.info.shapes[k], self.slab)
        return cases, starts, biased

    def read(self, ids: Sequence[int], epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The slabs ``ids`` of ``epoch``, in the order given.

        Raises:
          DatasetError: a chunk could not be read (damaged file, failing storage).
        """
        cases, starts, _ = self.plan(ids, epoch)
        images = np.full((len(cases),) + self.slab + (self.info.channels,), PAD_IMAGE,
                         dtype=np.float32)
        masks = np.full((len(cases),) + self.slab, PAD_MASK, dtype=np.uint8)
        for b, (k, start) in enumerate(zip(cases, starts)):
            region = tuple(slice(int(a), int(min(a + s, n)))
                           for a, s, n in zip(start, self.slab, self.info.shapes[k]))
            inside = tuple(slice(0, r.stop - r.start) for r in region)
            image, mask = self._region(int(k), region)
            images[(b,) + inside] = image
            masks[(b,) + inside] = mask
        return images, masks

    def read_case(self, case: int) -> tuple[np.ndarray, np.ndarray]:
        """Case row ``case`` whole: (image float32 (D, H, W, C), mask uint8 (D, H, W)),
        for sliding-window validation."""
        region = tuple(slice(0, int(n)) for n in self.info.shapes[case])
        image, mask = self._region(int(case), region)
        return image.astype(np.float32, copy=False), mask

    def _region(self, k: int, region: tuple) -> tuple[np.ndarray, np.ndarray]:
        """(image (d, h, w, C), mask (d, h, w)) of ``region`` of case row ``k``."""
        try:
            image = self._images[k][region]
            return (image if image.ndim == 4 else image[..., None]), self._masks[k][region]
        except OSError as e:
            box = ", ".join(f"{r.start}:{r.stop}" for r in region)
            raise DatasetError(f"{self.path}: case {self.info.case_ids[k]} (volumes/{k}) "
                               f"region [{box}] cannot be read ({str(e).splitlines()[0]})") from e



def write_volumes(path: str, images: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                  case_ids: Sequence[int], splits: Sequence[int], *, source: str,
                  hu_window: Sequence[float], spacing: Sequence[Sequence[float]] | None = None,
                  dtype: str = "float32", compression: dict | None = None,
                  class_names: Sequence[str] = LIVER_CLASSES,
                  channel_names: Sequence[str] | None = None,
                  attrs: dict | None = None) -> VolumeInfo:
    """Writes whole volumes ((D, H, W) or (D, H, W, C) images) in the volume layout,
    atomically, with ``attrs`` as further file attributes; returns the file's info."""
    writer = VolumeWriter(path, dtype, compression)
    try:
        for i, (image, mask) in enumerate(zip(images, masks)):
            writer.append(image, mask, case_ids[i], splits[i],
                          spacing[i] if spacing is not None else (math.nan,) * 3)
        writer.finish(source=source, hu_window=hu_window, class_names=class_names,
                      channel_names=channel_names, extra=attrs)
    except BaseException:
        writer.abort()
        raise
    return examine(path)

