"""The 2D slice layout of the distseg HDF5 format (``distseg.data.h5format``), and its
reader.

``images``   (N, H, W, C) float32 or float16, already normalised: windowed to [0, 1]
             (CT, MR percentiles) or z-scored (MR channels of a multi-channel file);
             C >= 1 input channels, last (CT: 1), named by the optional attribute
             ``channel_names``.
``masks``    (N, H, W) uint8 class ids: 0 background, 1 liver, 2 lesion (or the file's
             ``class_names``).
``case_id``  (N,) int: the volume each slice came from.
``split``    (N,) uint8: 0 train, 1 val, 2 test; assigned per case, never per slice.

Datasets are chunked one slice per chunk, so a batch reads only its own slices. Nothing
here imports TensorFlow or Horovod.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Sequence

import h5py
import numpy as np

from distseg.core import errors
from distseg.core.config import LIVER_CLASSES
from distseg.data.h5format import (
    FORMAT_VERSION,
    SPLITS,
    DatasetError,
    H5Reader,
    channel_names_of,
    class_names_of,
    damaged,
    num_classes_of,
    open_file,
    summary_of,
)

REQUIRED = ("images", "masks", "case_id", "split")

@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds, read from its metadata (no pixel data)."""

    path: str
    samples: int
    height: int
    width: int
    dtype: str
    num_classes: int
    train_indices: np.ndarray
    val_indices: np.ndarray
    attrs: dict
    class_names: tuple[str, ...]
    """One name per class, from the attribute ``class_names`` (``default_class_names``
    when the file has none)."""
    splits: np.ndarray
    """(N,) each slice's split; ``case_ids`` (N,) its case."""
    case_ids: np.ndarray
    channels: int = 1
    """Input channels per slice (the last axis of ``images``)."""
    channel_names: tuple[str, ...] = ()
    """One name per channel (attribute ``channel_names``), or empty: none recorded."""

    def with_splits(self, splits: np.ndarray) -> "DatasetInfo":
        """This file's info with ``splits`` (one per slice) in place of the file's own
        (a cross-validation fold's, ``folds.applied``)."""
        return dataclasses.replace(
            self, splits=splits, train_indices=np.flatnonzero(splits == SPLITS["train"]),
            val_indices=np.flatnonzero(splits == SPLITS["val"]))

    def summary(self) -> dict:
        """What ``distseg-data info`` prints and a run logs as ``dataset``: the keys of
        ``summary_of`` (shared with volume files), plus ``image_size``."""
        return {**summary_of(self.path, "slices", self.attrs, self.dtype, self.num_classes,
                             self.class_names, self.case_ids, self.splits, self.splits,
                             channels=self.channels, channel_names=self.channel_names),
                "image_size": [self.height, self.width]}

def write_dataset(path: str, images: np.ndarray, masks: np.ndarray, case_id: np.ndarray,
                  split: np.ndarray, *, source: str, hu_window: Sequence[float],
                  spacing: Sequence[float] = (math.nan, math.nan, math.nan),
                  class_names: Sequence[str] = LIVER_CLASSES,
                  channel_names: Sequence[str] | None = None, attrs: dict | None = None) -> None:
    """Writes arrays in the distseg format (one chunk per slice), atomically.

    ``images`` is (N, H, W) (one channel) or (N, H, W, C); ``channel_names``, when
    given, names the C channels (attribute ``channel_names``); ``attrs``: further file
    attributes (``preprocessing``).
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] < 1:
        raise DatasetError(f"{path}: images shape {images.shape}, expected (N, H, W) or (N, H, W, C)")
    n, h, w, c = images.shape
    if channel_names is not None and len(channel_names) != c:
        raise DatasetError(f"{path}: {len(channel_names)} channel_names for images of {c} channel(s)")
    if masks.shape != (n, h, w):
        raise DatasetError(f"{path}: masks shape {masks.shape} != images {(n, h, w)}")
    parent = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(parent, exist_ok=True)
        f = h5py.File(tmp, "w")
    except OSError as e:
        raise DatasetError(f"{path}: cannot be written ({e.strerror or e})") from e
    with f:
        f.create_dataset("images", data=images, chunks=(1, h, w, c))
        f.create_dataset("masks", data=masks.astype(np.uint8), chunks=(1, h, w))
        f.create_dataset("case_id", data=np.asarray(case_id, dtype=np.int32))
        f.create_dataset("split", data=np.asarray(split, dtype=np.uint8))
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["layout"] = "slices"
        f.attrs["source"] = source
        f.attrs["num_classes"] = len(class_names)
        f.attrs["class_names"] = list(class_names)
        f.attrs["hu_window"] = np.asarray(hu_window, dtype=np.float64)
        f.attrs["spacing"] = np.asarray(spacing, dtype=np.float64)
        if channel_names is not None:
            f.attrs["channel_names"] = list(channel_names)
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
    os.replace(tmp, path)

def _layout(path: str, f: h5py.File) -> tuple[int, int, int, int]:
    """Checks the datasets' kinds, shapes and dtypes (metadata only); returns
    (N, H, W, C)."""
    for name in REQUIRED:
        if name not in f:
            raise DatasetError(f"{path}: missing dataset '{name}' (need {', '.join(REQUIRED)})")
        obj = f.get(name)  # None for a link to nothing
        if not isinstance(obj, h5py.Dataset):
            what = "a link to nothing" if obj is None else f"a {type(obj).__name__}"
            raise DatasetError(f"{path}: '{name}' is {what}, expected a dataset")
    images, masks = f["images"], f["masks"]
    if images.ndim != 4 or images.shape[-1] < 1:
        raise DatasetError(f"{path}: 'images' has shape {images.shape}, expected (N, H, W, C) "
                           "with C >= 1 channels")
    if images.dtype not in (np.float32, np.float16):
        raise DatasetError(f"{path}: 'images' has dtype {images.dtype}, expected float32 or float16")
    n, h, w, c = images.shape
    if masks.shape != (n, h, w):
        raise DatasetError(
            f"{path}: 'masks' has shape {masks.shape}, expected {(n, h, w)} to match 'images'")
    if masks.dtype != np.uint8:
        raise DatasetError(f"{path}: 'masks' has dtype {masks.dtype}, expected uint8")
    for name in ("case_id", "split"):
        if f[name].shape != (n,):
            raise DatasetError(f"{path}: '{name}' has shape {f[name].shape}, expected ({n},)")
        if not np.issubdtype(f[name].dtype, np.integer):
            raise DatasetError(f"{path}: '{name}' has dtype {f[name].dtype}, expected integers")
    if n == 0:
        raise DatasetError(f"{path}: 'images' holds no slices")
    if h == 0 or w == 0:
        raise DatasetError(f"{path}: 'images' slices are {h}x{w}, expected at least 1x1")
    return n, h, w, c

def examine(path: str, check_labels: bool = True) -> DatasetInfo:
    """Validates a data file's structure and returns what it holds.

    Reads metadata plus, with ``check_labels``, every mask once (slice by slice, uint8,
    so a few MB at a time) to catch labels outside the declared classes before training.

    Raises:
      DatasetError: one line naming the file, the field and what was expected.
    """
    with open_file(path) as f, damaged(path):
        n, h, w, channels = _layout(path, f)
        images, masks = f["images"], f["masks"]
        num_classes = num_classes_of(path, f)
        class_names = class_names_of(path, f, num_classes)
        channel_names = channel_names_of(path, f, channels)
        split = f["split"][:]
        case_id = f["case_id"][:]
        if not np.isin(split, list(SPLITS.values())).all():
            raise DatasetError(f"{path}: 'split' holds values other than 0 (train), 1 (val), 2 (test)")
        for case in np.unique(case_id):
            if len(np.unique(split[case_id == case])) > 1:
                raise DatasetError(f"{path}: case {case} has slices in more than one split "
                                   "(splits must be by case, never by slice)")
        if check_labels:
            for start in range(0, n, 64):
                block = masks[start:start + 64]
                top = int(block.max())
                if top >= num_classes:
                    bad = start + int(np.argmax(block.reshape(len(block), -1).max(axis=1) >= num_classes))
                    raise DatasetError(f"{path}: 'masks' slice {bad} has label {top}, expected "
                                       f"0..{num_classes - 1} (attribute num_classes={num_classes})")
        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
        return DatasetInfo(
            path=path, samples=n, height=h, width=w, dtype=str(images.dtype),
            num_classes=num_classes, class_names=class_names,
            train_indices=np.flatnonzero(split == SPLITS["train"]),
            val_indices=np.flatnonzero(split == SPLITS["val"]),
            attrs=attrs, splits=split, case_ids=case_id, channels=channels,
            channel_names=channel_names,
        )

def _size_problem(path: str, height: int, width: int, image_size: int, resize: bool) -> str | None:
    """Why slices of ``height`` x ``width`` cannot feed a model of ``image_size`` (0: any)."""
    if image_size and (height, width) != (image_size, image_size) and not resize:
        return (f"{path}: slices are {height}x{width} but --image-size is {image_size}; "
                f"pass --resize or --image-size {height}")
    return None

def check_fit(info: DatasetInfo, *, ranks: int, batch_size: int, image_size: int,
              resize: bool, num_classes: int | None = None) -> None:
    """Checks that a dataset suits a run of ``ranks`` x ``batch_size`` at ``image_size``.

    The same check at ``distseg-train`` start-up and before ``distseg-jobs`` queues a job.
    An ``image_size`` of 0 is not checked.

    Raises:
      DatasetError: one line naming the file and what would fix it.
    """
    problem = _size_problem(info.path, info.height, info.width, image_size, resize)
    if problem:
        raise DatasetError(problem)
    if num_classes is not None and info.num_classes != num_classes:
        raise DatasetError(f"{info.path}: attribute num_classes={info.num_classes}, "
                           f"but the model predicts {num_classes} classes")
    need = ranks * batch_size
    if len(info.train_indices) < need:
        raise DatasetError(
            f"{info.path}: {len(info.train_indices)} training slices, fewer than ranks x "
            f"batch size = {ranks} x {batch_size} = {need}")

def resize_nearest(a: np.ndarray, size: int) -> np.ndarray:
    """Nearest-neighbour resize of (B, H, W[, C]) to (B, size, size[, C])."""
    h, w = a.shape[1:3]
    rows = (np.arange(size) * h // size).astype(np.intp)
    cols = (np.arange(size) * w // size).astype(np.intp)
    return a[:, rows][:, :, cols]

def resize_bilinear(a: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of (B, H, W, C) float images to (B, size, size, C)."""
    h, w = a.shape[1:3]
    def grid(n_in):
        x = (np.arange(size) + 0.5) * n_in / size - 0.5
        x = np.clip(x, 0, n_in - 1)
        lo = np.floor(x).astype(np.intp)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (x - lo).astype(np.float32)
    r0, r1, fr = grid(h)
    c0, c1, fc = grid(w)
    top = a[:, r0] * (1 - fr)[None, :, None, None] + a[:, r1] * fr[None, :, None, None]
    return top[:, :, c0] * (1 - fc)[None, None, :, None] + top[:, :, c1] * fc[None, None, :, None]

def foreground_slices(path: str, ids: Sequence[int], chunk: int = 64) -> np.ndarray:
    """The ids among ``ids`` whose mask holds a label other than background (0), read
    ``chunk`` slices at a time (2D foreground oversampling draws from them).

    Raises:
      DatasetError: the masks cannot be read.
    """
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    keep = []
    with open_file(path) as f, damaged(path):
        masks = f["masks"]
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            block = masks[part[0]:part[-1] + 1]
            held = block.reshape(len(block), -1).max(axis=1) > 0
            keep.append(part[held[part - part[0]]])
    return np.concatenate(keep) if keep else ids[:0]


class SliceReader(H5Reader):
    """Reads batches of slices by index from an open dataset, chunk by chunk."""

    def __init__(self, path: str, image_size: int | None = None, resize: bool = False):
        self.path = path
        self._file = open_file(path)
        try:
            with damaged(path):
                _layout(path, self._file)
                self._images = self._file["images"]
                self._masks = self._file["masks"]
        except errors.InputError:
            self._file.close()
            raise
        self.height, self.width = self._images.shape[1:3]
        self.image_size = image_size
        problem = _size_problem(path, self.height, self.width, image_size, resize)
        if problem:
            self._file.close()
            raise DatasetError(problem)
        self._resize = bool(image_size) and (self.height, self.width) != (image_size, image_size)

    def read(self, indices: Sequence[int], epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Returns (images float32 (B,S,S,C), masks uint8 (B,S,S)) in the order given.

        ``epoch`` is accepted for the ``Prefetcher``'s sake and ignored: a slice is the
        same every epoch (``volumes.SlabReader`` uses it to place foreground slabs).

        Raises:
          DatasetError: an index outside the file, or a chunk that could not be read
            (damaged file, failing storage).
        """
        # One slice at a time into one array: h5py builds a fancy selection of a few
        # slices point by point, an order of magnitude more CPU per slice, which a rank
        # pinned to its core takes from its own training step
        # (docs/studies/first-step-reader-optimizer-2026-11-25.md).
        indices = np.asarray(indices, dtype=np.int64)
        outside = indices[(indices < 0) | (indices >= len(self._images))]
        if len(outside):
            raise DatasetError(f"{self.path}: slice {outside[0]} asked for, the file holds "
                               f"slices 0..{len(self._images) - 1}")
        images = np.empty((len(indices), *self._images.shape[1:]), self._images.dtype)
        masks = np.empty((len(indices), *self._masks.shape[1:]), self._masks.dtype)
        try:
            for row, index in enumerate(indices):
                self._images.read_direct(images, np.s_[index:index + 1], np.s_[row:row + 1])
                self._masks.read_direct(masks, np.s_[index:index + 1], np.s_[row:row + 1])
        except OSError as e:
            uniq = np.unique(indices)
            shown = ", ".join(str(i) for i in uniq[:4]) + (", ..." if len(uniq) > 4 else "")
            raise DatasetError(f"{self.path}: slices {shown} of 'images'/'masks' cannot be read "
                               f"({str(e).splitlines()[0]})") from e
        images = images.astype(np.float32, copy=False)
        if self._resize:
            images = resize_bilinear(images, self.image_size)
            masks = resize_nearest(masks, self.image_size)
        return images, masks
