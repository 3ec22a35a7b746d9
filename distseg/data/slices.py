"""The distseg HDF5 dataset format, its reader, and per-rank sharding.

One HDF5 file per dataset (``FORMAT_VERSION`` 1):

``images``   (N, H, W, 1) float32 or float16, already windowed and normalised to [0, 1].
``masks``    (N, H, W) uint8 class ids: 0 background, 1 liver, 2 lesion.
``case_id``  (N,) int: the volume each slice came from.
``split``    (N,) uint8: 0 train, 1 val, 2 test; assigned per case, never per slice.

File attributes: ``format_version``, ``source``, ``num_classes``, ``class_names``,
``hu_window`` (low, high), ``spacing`` (z, y, x in mm; NaN where unknown). Readers refuse
a file whose ``format_version`` is newer than ``FORMAT_VERSION`` (it may hold renamed
fields they would misread); a file without the attribute is read as version 1.

Datasets are chunked one slice per chunk, so a batch reads only its own slices: the
file is never loaded whole. Nothing here imports TensorFlow or Horovod; callers pass
``rank`` and ``size`` as ints.

The attribute ``layout`` tells the two kinds of distseg file apart: absent or
``"slices"`` for this 2D format, ``"volumes"`` for whole 3D volumes per case (read by
``distseg.data.volumes``). Each reader refuses the other kind with one line saying what to
use instead; both share ``open_file`` and its ``format_version`` rules.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import reprlib
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import h5py
import numpy as np

from distseg.core import errors, schema
from distseg.core.config import LIVER_CLASSES

FORMAT_VERSION = 1
SPLITS = schema.SPLITS
REQUIRED = ("images", "masks", "case_id", "split")

#: Values of the file attribute ``layout``; a file without it holds slices.
LAYOUTS = ("slices", "volumes")
#: What to do with a file of each layout, for the line that refuses it elsewhere.
LAYOUT_USE = {
    "slices": "a 2D model (the default --model), or write volumes with "
              "distseg-data synth/lits-sample/convert --ndim 3",
    "volumes": "the 3D path (distseg-train --model unet3d --slab D,H,W|full), or write "
               "slices with distseg-data synth/lits-sample/convert without --ndim 3",
}

#: Hounsfield-unit window of every distseg dataset (phantom and LiTS alike): soft tissue,
#: liver and lesions span it, while air and bone clip to 0 and 1.
HU_WINDOW = (-150.0, 250.0)


class DatasetError(errors.InputError):
    """A data file is missing, unreadable or not in the distseg format (exit 2).

    An ``InputError``, hence also a ``ValueError``.
    """


def window(hu: np.ndarray, low: float = HU_WINDOW[0], high: float = HU_WINDOW[1]) -> np.ndarray:
    """Clips Hounsfield units to [low, high] and maps them to [0, 1] (float32)."""
    return ((np.clip(hu, low, high) - low) / (high - low)).astype(np.float32)


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

    def summary(self) -> dict:
        """What ``distseg-data info`` prints and a run logs as ``dataset``: the keys of
        ``summary_of`` (shared with volume files), plus ``image_size``."""
        return {**summary_of(self.path, "slices", self.attrs, self.dtype, self.num_classes,
                             self.class_names, self.case_ids, self.splits, self.splits),
                "image_size": [self.height, self.width]}


#: What one sample of each layout is (``summary_of``'s ``sample``).
SAMPLE_WORDS = {"slices": "slice", "volumes": "slab"}


def summary_of(path: str, layout: str, attrs: dict, dtype: str, num_classes: int,
               class_names: Sequence[str], case_ids: np.ndarray, case_splits: np.ndarray,
               sample_splits: np.ndarray, sample: str | None = None) -> dict:
    """The keys every data summary has, whatever the layout: the file (``path``,
    ``layout``, ``format_version``, ``source``, ``dtype``), its classes (``num_classes``,
    ``class_names``), its samples per split (``samples``, ``train_samples``,
    ``val_samples``, ``test_samples``: slices, or a 3D run's slabs) and its cases per
    split (``cases``, ``train_cases``, ...). ``case_splits`` holds one split per entry
    of ``case_ids`` (per slice in a slice file), ``sample_splits`` one per sample."""
    cases = {}
    for name, code in (("", None), *((f"{k}_", v) for k, v in SPLITS.items())):
        rows = case_ids if code is None else case_ids[case_splits == code]
        cases[f"{name}cases"] = int(len(np.unique(rows)))
    counts = {"samples": int(len(sample_splits))}
    counts.update({f"{k}_samples": int((sample_splits == v).sum()) for k, v in SPLITS.items()})
    return {
        "path": os.path.abspath(path), "layout": layout,
        "format_version": int(attrs.get("format_version", FORMAT_VERSION)),
        "source": attrs.get("source", ""), "dtype": dtype,
        "num_classes": int(num_classes), "class_names": list(class_names),
        "sample": sample or SAMPLE_WORDS[layout], **counts, **cases,
    }


def write_dataset(path: str, images: np.ndarray, masks: np.ndarray, case_id: np.ndarray,
                  split: np.ndarray, *, source: str, hu_window: Sequence[float],
                  spacing: Sequence[float] = (math.nan, math.nan, math.nan),
                  class_names: Sequence[str] = LIVER_CLASSES) -> None:
    """Writes arrays in the distseg format (one chunk per slice), atomically."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    n, h, w, _ = images.shape
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
        f.create_dataset("images", data=images, chunks=(1, h, w, 1))
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
    os.replace(tmp, path)


def _h5(path: str) -> h5py.File:
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such data file")
    try:
        # Locking off: many ranks open the same file read-only, often on Lustre/NFS.
        return h5py.File(path, "r", locking=False)
    except OSError as e:
        raise DatasetError(f"{path}: not a readable HDF5 file ({e.__class__.__name__})") from e


def open_file(path: str, layout: str = "slices") -> h5py.File:
    """Opens a distseg file read-only, checking ``format_version`` and that it holds
    ``layout`` ("slices" or "volumes").

    Raises:
      DatasetError: missing, not HDF5, too new, or of the other layout (the line says
      what reads it instead).
    """
    f = _h5(path)
    try:
        _check_version(path, f)
        found = layout_of(path, f)
        if found != layout:
            said = f"attribute layout={found!r}" if "layout" in f.attrs else "no attribute layout"
            raise errors.InputError(f"{path}: holds {_LAYOUT_WORDS[found]} ({said}), not "
                                    f"{_LAYOUT_WORDS[layout]}; use {LAYOUT_USE[found]}")
    except errors.InputError as e:
        f.close()
        raise DatasetError(str(e)) from None
    return f


def file_layout(path: str) -> str:
    """The layout of the distseg file at ``path`` ("slices" or "volumes"), after the
    checks ``open_file`` makes first (exists, HDF5, ``format_version``).

    Raises:
      DatasetError: one line naming the file.
    """
    with _h5(path) as f:
        try:
            _check_version(path, f)
            return layout_of(path, f)
        except errors.InputError as e:
            raise DatasetError(str(e)) from None


_LAYOUT_WORDS = {"slices": "2D slices", "volumes": "3D volumes"}


def _check_version(path: str, f: h5py.File) -> None:
    garbage = f"{path}: format_version is {{}}, expected an integer <= {FORMAT_VERSION}"
    with damaged(path):  # an attribute h5py cannot decode
        version = _scalar(f.attrs.get("format_version", 1))
    if isinstance(version, np.ndarray):  # its repr spans lines
        raise errors.InputError(garbage.format(shown(version)))
    try:
        errors.refuse_newer(path, "format_version", version, FORMAT_VERSION)
    except OverflowError:  # inf, which int() cannot convert
        raise errors.InputError(garbage.format(shown(version))) from None


def layout_of(path: str, f: h5py.File) -> str:
    """The open file's ``layout`` attribute ("slices" when absent).

    Raises:
      InputError: a value other than those of ``LAYOUTS``.
    """
    with damaged(path):
        raw = _scalar(f.attrs.get("layout", "slices"))
    value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not isinstance(value, str) or value not in LAYOUTS:
        raise errors.InputError(f"{path}: attribute layout is {shown(raw)}, expected "
                                f"{' or '.join(repr(v) for v in LAYOUTS)}")
    return value


@contextlib.contextmanager
def damaged(path: str) -> Iterator[None]:
    """h5py's own errors on a damaged file (a KeyError for an object header it cannot
    decode, a RuntimeError, an OSError for a bad chunk...) as one line naming the file."""
    try:
        yield
    except errors.InputError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:
        why = (str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)).splitlines()
        raise DatasetError(f"{path}: damaged HDF5 file ({e.__class__.__name__}: "
                           f"{why[0] if why else 'no detail'})") from e


def _scalar(value):
    """A one-element array attribute (``attrs["x"] = [1]``) as its element."""
    return value.item() if isinstance(value, np.ndarray) and value.size == 1 else value


def shown(value) -> str:
    """An attribute's value for a one-line message: an array by its shape, else short."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return reprlib.repr(value.item() if isinstance(value, np.generic) else value)


def _layout(path: str, f: h5py.File) -> tuple[int, int, int]:
    """Checks the datasets' kinds, shapes and dtypes (metadata only); returns (N, H, W)."""
    for name in REQUIRED:
        if name not in f:
            raise DatasetError(f"{path}: missing dataset '{name}' (need {', '.join(REQUIRED)})")
        obj = f.get(name)  # None for a link to nothing
        if not isinstance(obj, h5py.Dataset):
            what = "a link to nothing" if obj is None else f"a {type(obj).__name__}"
            raise DatasetError(f"{path}: '{name}' is {what}, expected a dataset")
    images, masks = f["images"], f["masks"]
    if images.ndim != 4 or images.shape[-1] != 1:
        raise DatasetError(f"{path}: 'images' has shape {images.shape}, expected (N, H, W, 1)")
    if images.dtype not in (np.float32, np.float16):
        raise DatasetError(f"{path}: 'images' has dtype {images.dtype}, expected float32 or float16")
    n, h, w, _ = images.shape
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
    return n, h, w


def num_classes_of(path: str, f: h5py.File) -> int:
    """The ``num_classes`` attribute (3 when absent), refusing anything but an integer >= 2."""
    raw = _scalar(f.attrs.get("num_classes", 3))
    try:
        value = int(raw) if np.ndim(raw) == 0 else None
    except (TypeError, ValueError, OverflowError):  # a string, NaN, inf
        value = None
    if value is None or value != raw or value < 2:
        raise DatasetError(f"{path}: attribute num_classes is {shown(raw)}, "
                           "expected an integer >= 2")
    return value


def default_class_names(num_classes: int) -> tuple[str, ...]:
    """Names for a file that records none: the format's documented three classes, or
    ``background``, ``class1``, ``class2``, ... for another count."""
    if num_classes == len(LIVER_CLASSES):
        return LIVER_CLASSES
    return ("background",) + tuple(f"class{c}" for c in range(1, num_classes))


def class_names_of(path: str, f: h5py.File, num_classes: int) -> tuple[str, ...]:
    """The ``class_names`` attribute (``default_class_names`` when absent), refusing
    anything but ``num_classes`` distinct, non-empty, printable strings."""
    if "class_names" not in f.attrs:
        return default_class_names(num_classes)
    raw = f.attrs["class_names"]
    names = None
    if isinstance(raw, np.ndarray) and raw.ndim == 1:
        try:
            names = tuple(v.decode() if isinstance(v, bytes) else v for v in raw.tolist())
        except UnicodeDecodeError:
            names = None
    if (names is None or len(names) != num_classes or len(set(names)) != len(names)
            or not all(isinstance(n, str) and n.strip() and n.isprintable() for n in names)):
        raise DatasetError(f"{path}: attribute class_names is {shown(raw)}, expected "
                           f"{num_classes} distinct names (attribute num_classes={num_classes})")
    return names


def examine(path: str, check_labels: bool = True) -> DatasetInfo:
    """Validates a data file's structure and returns what it holds.

    Reads metadata plus, with ``check_labels``, every mask once (slice by slice, uint8,
    so a few MB at a time) to catch labels outside the declared classes before training.

    Raises:
      DatasetError: one line naming the file, the field and what was expected.
    """
    with open_file(path) as f, damaged(path):
        n, h, w = _layout(path, f)
        images, masks = f["images"], f["masks"]
        num_classes = num_classes_of(path, f)
        class_names = class_names_of(path, f, num_classes)
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
            attrs=attrs, splits=split, case_ids=case_id,
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


class H5Reader:
    """What every reader of an open HDF5 file does with it: close, and ``with``."""

    _file = None

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
        """Returns (images float32 (B,S,S,1), masks uint8 (B,S,S)) in the order given.

        ``epoch`` is accepted for the ``Prefetcher``'s sake and ignored: a slice is the
        same every epoch (``volumes.SlabReader`` uses it to place foreground slabs).

        Raises:
          DatasetError: an index outside the file, or a chunk that could not be read
            (damaged file, failing storage).
        """
        # One slice at a time into one array: h5py's fancy selection of a few slices
        # costs ~2.3 ms of CPU per slice against ~0.12 ms for this (a 128x128 slice),
        # time a rank pinned to its core takes from its own training step.
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


def epoch_permutation(indices: np.ndarray, epoch: int, seed: int) -> np.ndarray:
    """The global order of ``indices`` for ``epoch``: the same on every rank."""
    rng = np.random.default_rng([seed, epoch])
    return np.asarray(indices)[rng.permutation(len(indices))]


def shard_batches(indices: np.ndarray, rank: int, size: int, batch_size: int,
                  epoch: int, seed: int) -> list[np.ndarray]:
    """This rank's batches of sample ids for one epoch.

    A seeded permutation of ``indices`` (new each epoch, identical on all ranks) is cut
    into ``size`` contiguous shards whose lengths differ by at most one; shards are
    disjoint and together cover every sample. Each shard is split into the same number
    of batches on every rank (``schema.steps_per_epoch``), of at most ``batch_size`` samples
    and sizes differing by at most one, so all ranks run the same number of allreduce
    steps.

    Remainder: when ``n`` is not a multiple of ``size * batch_size``, some batches hold
    one sample fewer than ``batch_size`` rather than dropping or repeating samples. The
    single exception is ``batch_size == 1`` with ``n % size != 0``: the last ``n % size``
    samples of the epoch's permutation are skipped (a random few, new every epoch),
    since a rank cannot run a step on an empty batch.

    Raises:
      ValueError: fewer samples than ``size * batch_size``.
    """
    n = len(indices)
    if n < size * batch_size:
        raise ValueError(f"{n} samples are fewer than ranks x batch size = {size} x {batch_size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    order = epoch_permutation(indices, epoch, seed)
    if batch_size == 1:
        order = order[: n - n % size]
    shard = np.array_split(order, size)[rank]
    return np.array_split(shard, schema.steps_per_epoch(n, size, batch_size))


def global_batches(indices: np.ndarray, rank: int, size: int, global_batch: int,
                   epoch: int, seed: int) -> list[np.ndarray]:
    """This rank's batches of sample ids for one epoch with a fixed global batch.

    The epoch's permutation (``epoch_permutation``) is cut into steps of
    ``global_batch`` consecutive ids, the same steps at any number of ranks; rank
    ``rank`` takes the ``rank``-th of ``size`` equal parts of each step. So step k trains
    on the same samples whether 1 or ``size`` ranks share it, and with the global loss
    (``distseg.losses.global_loss``) makes the same update. The last
    ``n % global_batch`` ids of each permutation (a new random few every epoch) are left
    out of that epoch.

    Raises:
      ValueError: ``global_batch`` not a positive multiple of ``size``, or larger than
        the number of samples.
    """
    n = len(indices)
    if global_batch < size or global_batch % size:
        raise ValueError(f"global batch {global_batch} is not a multiple of the {size} ranks")
    if n < global_batch:
        raise ValueError(f"{n} samples are fewer than the global batch {global_batch}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    per_rank = global_batch // size
    order = epoch_permutation(indices, epoch, seed)
    steps = schema.steps_per_epoch(n, size, per_rank, global_batch)
    return [order[k * global_batch + rank * per_rank:k * global_batch + (rank + 1) * per_rank]
            for k in range(steps)]


def shard_eval(indices: np.ndarray, rank: int, size: int, batch_size: int) -> list[np.ndarray]:
    """This rank's validation batches: a contiguous shard, every sample exactly once.

    Ranks may get different numbers of batches (evaluation needs no collectives until
    its single allreduce at the end), and a rank may get none when there are fewer
    validation samples than ranks.
    """
    shard = np.array_split(np.asarray(indices), size)[rank]
    return [shard[i:i + batch_size] for i in range(0, len(shard), batch_size)]


@dataclass(frozen=True)
class EpochBatch:
    """A batch of sample ids with the epoch it belongs to, for readers whose samples
    depend on the epoch (``volumes.SlabReader``'s foreground slabs)."""

    epoch: int
    ids: np.ndarray


class Prefetcher:
    """Reads batches in a background thread and times how long the consumer waits.

    h5py releases the GIL during chunk I/O and decompression, so reading the next
    batch overlaps with the training step. ``batches`` may be a lazy iterable: one
    prefetcher fed every epoch's batches in turn keeps reading across epoch
    boundaries instead of refilling its queue in a burst at each epoch start.

    Each item of ``batches`` is an array of ids, read with ``reader.read(ids)``, or an
    ``EpochBatch``, read with ``reader.read(ids, epoch)``; either way the consumer gets
    ``(ids, images, masks)``.
    """

    _DONE = object()

    def __init__(self, reader, batches: Iterable, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._work, args=(reader, batches), daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _work(self, reader, batches):
        try:
            for item in batches:
                if self._stop.is_set():
                    return
                if isinstance(item, EpochBatch):
                    ids = item.ids
                    images, masks = reader.read(ids, item.epoch)
                else:
                    ids = item
                    images, masks = reader.read(ids)
                self._queue.put((ids, images, masks))
            self._queue.put(self._DONE)
        except BaseException as e:  # surfaced in the consumer thread
            self._queue.put(e)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.1)
            except queue.Empty:
                pass
