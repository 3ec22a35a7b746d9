"""The distseg HDF5 dataset format: what every distseg data file holds, whatever its
layout, and the rules every reader applies to it.

One HDF5 file per dataset (``FORMAT_VERSION`` 1). File attributes: ``format_version``,
``source``, ``num_classes``, ``class_names``, ``hu_window`` (low, high), ``spacing``
(z, y, x in mm; NaN where unknown) and, optionally, ``channel_names`` (one name per
input channel: ``FLAIR``, ``T1w``, ...; ``channel_names_of``) and ``target_spacing``
(z, y, x in mm: the one spacing ``convert --spacing`` resampled every case to;
``target_spacing_of``). Readers refuse a file
whose ``format_version`` is newer than ``FORMAT_VERSION`` (it may hold renamed fields
they would misread); a file without the attribute is read as version 1.

The attribute ``layout`` tells the two kinds of distseg file apart: absent or
``"slices"`` for the 2D format (``distseg.data.slices``), ``"volumes"`` for whole 3D
volumes per case (``distseg.data.volumes``). Each reader refuses the other kind with one
line saying what to use instead; both share ``open_file`` and its ``format_version``
rules, ``DatasetError``, the class attributes' checks and ``H5Reader``.

Datasets are chunked so a batch reads only its own samples: the file is never loaded
whole. Plain Python and h5py: no TensorFlow, no Horovod (the report's coverage check
reads the file's split through this module).
"""

from __future__ import annotations

import contextlib
import os
import reprlib
from typing import Iterator, Sequence

import h5py
import numpy as np

from distseg.core import errors, schema
from distseg.core.config import LIVER_CLASSES

FORMAT_VERSION = 1

SPLITS = schema.SPLITS

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

#: What one sample of each layout is (``summary_of``'s ``sample``).
SAMPLE_WORDS = {"slices": "slice", "volumes": "slab"}

def summary_of(path: str, layout: str, attrs: dict, dtype: str, num_classes: int,
               class_names: Sequence[str], case_ids: np.ndarray, case_splits: np.ndarray,
               sample_splits: np.ndarray, sample: str | None = None, channels: int = 1,
               channel_names: Sequence[str] = ()) -> dict:
    """The keys every data summary has, whatever the layout: the file (``path``,
    ``layout``, ``format_version``, ``source``, ``dtype``), its classes (``num_classes``,
    ``class_names``), its input ``channels`` and their ``channel_names`` (empty when the
    file records none), its samples per split (``samples``, ``train_samples``,
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
        "channels": int(channels), "channel_names": list(channel_names),
        "sample": sample or SAMPLE_WORDS[layout], **counts, **cases,
    }

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

def _names_attribute(path: str, f: h5py.File, name: str, count: int, why: str) -> tuple[str, ...]:
    """The attribute ``name``: ``count`` distinct, non-empty, printable strings, or one
    line naming the file, the attribute and ``why`` that count is expected."""
    raw = f.attrs[name]
    names = None
    if isinstance(raw, np.ndarray) and raw.ndim == 1:
        try:
            names = tuple(v.decode() if isinstance(v, bytes) else v for v in raw.tolist())
        except UnicodeDecodeError:
            names = None
    if (names is None or len(names) != count or len(set(names)) != len(names)
            or not all(isinstance(n, str) and n.strip() and n.isprintable() for n in names)):
        raise DatasetError(f"{path}: attribute {name} is {shown(raw)}, expected "
                           f"{count} distinct names ({why})")
    return names

def class_names_of(path: str, f: h5py.File, num_classes: int) -> tuple[str, ...]:
    """The ``class_names`` attribute (``default_class_names`` when absent), refusing
    anything but ``num_classes`` distinct, non-empty, printable strings."""
    if "class_names" not in f.attrs:
        return default_class_names(num_classes)
    return _names_attribute(path, f, "class_names", num_classes,
                            f"attribute num_classes={num_classes}")

def channel_names_of(path: str, f: h5py.File, channels: int) -> tuple[str, ...]:
    """The optional ``channel_names`` attribute (empty when absent), refusing anything
    but ``channels`` distinct, non-empty, printable strings."""
    if "channel_names" not in f.attrs:
        return ()
    return _names_attribute(path, f, "channel_names", channels,
                            f"the images hold {channels} channel(s)")

def target_spacing_of(path: str, attrs) -> tuple[float, float, float] | None:
    """The optional ``target_spacing`` attribute (None when absent: each case kept its
    own spacing), refusing anything but three positive, finite numbers (mm)."""
    if "target_spacing" not in attrs:
        return None
    try:
        values = np.asarray(attrs["target_spacing"], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        values = np.array([])
    if values.shape != (3,) or not (np.isfinite(values).all() and (values > 0).all()):
        raise DatasetError(f"{path}: attribute target_spacing={shown(attrs['target_spacing'])}, "
                           "expected three positive spacings in mm (z, y, x)")
    return tuple(float(v) for v in values)


class H5Reader:
    """What every reader of an open HDF5 file does with it: close, and ``with``."""

    _file = None

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
