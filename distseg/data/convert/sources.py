"""Finding the cases of a dataset folder and reading their volumes.

Three layouts are recognised:

* a Medical Segmentation Decathlon task folder (``dataset.json``, ``imagesTr/``,
  ``labelsTr/``, ``imagesTs/``): any task, its label set (``labels``: id -> name) and
  its channels' modalities (``modality``) from ``dataset.json``; a multi-channel image
  is one 4-D file, channels last. An nnU-Net v1 task (the same dataset.json, each
  channel in its own ``CASE_XXXX`` file) is read as the nnU-Net v2 layout below reads
  its channels;
* an nnU-Net v2 raw dataset (``dataset.json`` with ``channel_names`` {"0": "T2", ...},
  ``labels`` name -> id {"background": 0, ...} and ``file_ending``): the cases are the
  label files ``labelsTr/CASE<file_ending>``, channel c of a case is
  ``imagesTr/CASE_<c:04d><file_ending>``, one 3-D file per channel on one grid;
  unlabelled cases are those of ``imagesTs/CASE_0000<file_ending>``;
* a folder (searched recursively) of LiTS-style pairs ``volume-N`` / ``segmentation-N``
  (``.nii``, ``.nii.gz``, or ``.nrrd`` when pynrrd is installed), with unlabelled
  ``test-volume-N`` beside them.

Volumes are read with nibabel; an NRRD file becomes a nibabel image with its RAS affine,
so everything after reading is the same for both formats. ``case_channels`` reads every
channel of a case, from one 4-D file or from one file per channel.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from distseg.core.config import LIVER_CLASSES
from distseg.core.errors import DistsegError, InputError

EXTENSIONS = (".nii.gz", ".nii", ".nrrd")
_PAIR = re.compile(r"^(test-volume|volume|segmentation)-(\d+)(\.nii\.gz|\.nii|\.nrrd)$")
#: nnU-Net's suffix of channel c's file: ``CASE_0000.nii.gz``, ``CASE_0001.nii.gz``, ...
CHANNEL_SUFFIX = "_{:04d}"
#: Largest affine difference (mm) between files read as one grid (an image and its
#: labels, or the channel files of a case).
GRID_TOLERANCE = 1e-3


class VolumeError(InputError):
    """A volume cannot be read, or does not match its partner (exit 2)."""


@dataclass(frozen=True)
class Case:
    """One volume and, for training cases, its label volume."""

    name: str
    """Name without extension (``liver_3``, ``volume-17``): names the outputs."""
    image: str
    label: str | None
    case_id: int
    """Integer id written to the data file (the trailing number of the name when the
    names' numbers are unique, else the position)."""
    channel_files: tuple[str, ...] = ()
    """One 3-D file per channel, channel 0 (``image``) first (nnU-Net layouts); empty:
    ``image`` holds every channel (3-D, or 4-D channels last)."""

    @property
    def files(self) -> tuple[str, ...]:
        """The image files to read, in channel order."""
        return self.channel_files or (self.image,)


@dataclass(frozen=True)
class Source:
    """What a dataset folder holds."""

    kind: str
    """``msd``, ``nnunet`` (v2 raw layout, or v1 channel files) or ``pairs``."""
    root: str
    cases: tuple[Case, ...]
    """Cases with labels (MSD ``training``, LiTS ``volume-N``), sorted by name."""
    unlabelled: tuple[Case, ...]
    """Cases without labels (MSD ``test``, LiTS ``test-volume-N``)."""
    class_names: tuple[str, ...]
    modalities: tuple[str, ...]
    """One modality name per image channel (``CT``, ``T2``, ``FLAIR``, ...)."""
    name: str
    where: str = ""
    """The file that declares the channels and classes (``dataset.json``), for messages."""


def strip_extension(path: str) -> str:
    base = os.path.basename(path)
    for ext in EXTENSIONS:
        if base.endswith(ext):
            return base[:-len(ext)]
    return os.path.splitext(base)[0]


def _with_ids(cases: list[tuple]) -> tuple[Case, ...]:
    """``Case`` s of (name, image, label[, channel_files]) rows, sorted by name."""
    cases = sorted(tuple(c) + ((),) * (4 - len(c)) for c in cases)
    numbers = [re.search(r"(\d+)$", c[0]) for c in cases]
    ids = [int(m.group(1)) if m else -1 for m in numbers]
    if -1 in ids or len(set(ids)) != len(ids):
        ids = list(range(len(cases)))
    return tuple(Case(name, image, label, i, tuple(files))
                 for (name, image, label, files), i in zip(cases, ids))


def discover(path: str) -> Source:
    """The cases of an MSD task folder or a folder of LiTS-style pairs.

    Raises:
      InputError: a missing folder, a bad dataset.json, or neither layout.
    """
    if not os.path.isdir(path):
        raise InputError(f"{path}: no such folder (expected an MSD task folder or a folder "
                         "of volume-N / segmentation-N pairs)")
    if os.path.exists(os.path.join(path, "dataset.json")):
        return _dataset_json(path)
    return _pairs(path)


def _dataset_json(root: str) -> Source:
    """An MSD task (``modality``) or an nnU-Net v2 raw dataset (``channel_names``)."""
    where = os.path.join(root, "dataset.json")
    try:
        with open(where, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{where}: not an MSD dataset.json ({type(e).__name__}: {e}); need "
                         "'labels', 'modality' and 'training' [{image, label}] (nnU-Net v2: "
                         "'channel_names', 'labels' and 'file_ending')") from e
    if isinstance(meta, dict) and "channel_names" in meta:
        return _nnunet(root, where, meta)
    return _msd(root, where, meta)


def _msd(root: str, where: str, meta) -> Source:
    try:
        labels = {int(k): str(v) for k, v in meta["labels"].items()}
        modality = {int(k): str(v) for k, v in meta.get("modality", {"0": "CT"}).items()}
        training = [(e["image"], e["label"]) for e in meta["training"]]
        test = list(meta.get("test", []))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{where}: not an MSD dataset.json ({type(e).__name__}: {e}); "
                         "need 'labels', 'modality' and 'training' [{image, label}]") from e
    if sorted(labels) != list(range(len(labels))) or len(labels) < 2:
        raise InputError(f"{where}: 'labels' must number the classes 0..K-1 (K >= 2), "
                         f"got {sorted(labels)}")
    if sorted(modality) != list(range(len(modality))):
        raise InputError(f"{where}: 'modality' must number the channels 0..C-1, got {sorted(modality)}")

    def full(p):
        return os.path.normpath(os.path.join(root, p))
    channels = len(modality)

    def row(image, label):
        files = _v1_files(full(image), channels)
        return strip_extension(image), files[0] if files else full(image), label, files
    cases = _with_ids([row(i, full(lab)) for i, lab in training])
    unlabelled = _with_ids([row(t, None) for t in test])
    v1 = any(c.channel_files for c in cases)
    return Source("nnunet" if v1 else "msd", root, cases, unlabelled,
                  tuple(labels[k] for k in sorted(labels)),
                  tuple(modality[k] for k in sorted(modality)), str(meta.get("name", "")), where)


def _v1_files(image: str, channels: int) -> tuple[str, ...]:
    """nnU-Net v1 keeps an MSD dataset.json whose ``image`` entries name no file, and
    each channel of the case as ``<image stem>_XXXX<ext>``: those files, when
    ``image`` itself is missing and its ``_0000`` file exists (else none)."""
    if os.path.exists(image):
        return ()
    stem = strip_extension(image)
    ext = os.path.basename(image)[len(stem):]
    folder = os.path.dirname(image)
    files = tuple(os.path.join(folder, stem + CHANNEL_SUFFIX.format(c) + ext) for c in range(channels))
    return files if os.path.exists(files[0]) else ()


def _nnunet_labels(where: str, raw) -> tuple[str, ...]:
    """Class names by id of an nnU-Net v2 ``labels`` (name -> id).

    Raises:
      InputError: region-based labels (lists of ids), ids that are not integers
        numbering the classes 0..K-1 (K >= 2).
    """
    if not isinstance(raw, dict):
        raise InputError(f"{where}: 'labels' must map each class name to its id, got {raw!r}")
    regions = {n: v for n, v in raw.items() if isinstance(v, (list, tuple))}
    if regions:
        name, ids = next(iter(regions.items()))
        raise InputError(f"{where}: 'labels' are region-based ({name}: {list(ids)}); distseg "
                         "trains one class per voxel: give each label one integer id 0..K-1")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in raw.values()):
        raise InputError(f"{where}: 'labels' must map each class name to an integer id, got {raw}")
    if sorted(raw.values()) != list(range(len(raw))) or len(raw) < 2:
        raise InputError(f"{where}: 'labels' ids must number the classes 0..K-1 (K >= 2), "
                         f"got {sorted(raw.values())}")
    return tuple(name for name, _ in sorted(raw.items(), key=lambda item: item[1]))


def _nnunet(root: str, where: str, meta: dict) -> Source:
    """An nnU-Net v2 raw dataset folder (see the module docstring)."""
    try:
        channel = {int(k): str(v) for k, v in meta["channel_names"].items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise InputError(f"{where}: 'channel_names' must map channel numbers to names "
                         f"({type(e).__name__}: {e})") from e
    if sorted(channel) != list(range(len(channel))) or not channel:
        raise InputError(f"{where}: 'channel_names' must number the channels 0..C-1, "
                         f"got {sorted(channel)}")
    if "labels" not in meta:
        raise InputError(f"{where}: an nnU-Net dataset.json needs 'labels' (name -> id)")
    class_names = _nnunet_labels(where, meta["labels"])
    if "regions_class_order" in meta:
        raise InputError(f"{where}: 'regions_class_order' declares region-based training; "
                         "distseg trains one class per voxel")
    if "dataset" in meta:
        raise InputError(f"{where}: an explicit 'dataset' case list is not read; put the "
                         "cases in imagesTr/ and labelsTr/")
    ending = meta.get("file_ending", ".nii.gz")
    if ending not in EXTENSIONS:
        raise InputError(f"{where}: file_ending {ending!r} is not read by distseg "
                         f"(one of {', '.join(EXTENSIONS)})")
    n = len(channel)

    def files(folder: str, name: str) -> tuple[str, ...]:
        return tuple(os.path.join(root, folder, name + CHANNEL_SUFFIX.format(c) + ending)
                     for c in range(n))
    labelled = sorted(glob.glob(os.path.join(glob.escape(root), "labelsTr", "*" + ending)))
    cases = []
    for label in labelled:
        name = os.path.basename(label)[:-len(ending)]
        cases.append((name, files("imagesTr", name)[0], label, files("imagesTr", name)))
    first = "_0000" + ending
    tests = sorted(glob.glob(os.path.join(glob.escape(root), "imagesTs", "*" + first)))
    unlabelled = [(os.path.basename(t)[:-len(first)], t, None, files("imagesTs", os.path.basename(t)[:-len(first)]))
                  for t in tests]
    return Source("nnunet", root, _with_ids(cases), _with_ids(unlabelled), class_names,
                  tuple(channel[c] for c in range(n)), str(meta.get("name", "")), where)


def _pairs(root: str) -> Source:
    found: dict[tuple[str, int], str] = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for fname in sorted(files):
            m = _PAIR.match(fname)
            if not m:
                continue
            key = (m.group(1), int(m.group(2)))
            if key in found:
                raise InputError(f"{os.path.join(folder, fname)}: {m.group(1)}-{m.group(2)} "
                                 f"is also {found[key]}")
            found[key] = os.path.join(folder, fname)
    volumes = {n: p for (kind, n), p in found.items() if kind == "volume"}
    if not volumes and not any(kind == "test-volume" for kind, _ in found):
        raise InputError(f"{root}: neither an MSD task folder (no dataset.json) nor a folder of "
                         f"LiTS-style pairs volume-N / segmentation-N ({', '.join(EXTENSIONS)})")
    cases = _with_ids([(f"volume-{n}", p, found.get(("segmentation", n)))
                       for n, p in volumes.items()])
    unlabelled = _with_ids([(f"test-volume-{n}", p, None)
                            for (kind, n), p in found.items() if kind == "test-volume"])
    return Source("pairs", root, cases, unlabelled, LIVER_CLASSES, ("CT",),
                  os.path.basename(os.path.abspath(root)), root)


# ------------------------------------------------------------------------ reading


def load(path: str):
    """The nibabel image of a ``.nii``/``.nii.gz``/``.nrrd`` file (header read; NIfTI
    voxel data read lazily).

    Raises:
      VolumeError: a missing or unreadable file.
    """
    if not os.path.exists(path):
        raise VolumeError(f"{path}: no such file")
    try:
        if path.endswith(".nrrd"):
            return _load_nrrd(path)
        import nibabel as nib
        return nib.load(path)
    except DistsegError:  # ours, or Interrupted by a signal handler: not a bad file
        raise
    except Exception as e:  # noqa: BLE001 - nibabel raises many types for a bad header
        raise VolumeError(f"{path}: cannot be read as a volume ({_why(e)})") from e


def _why(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _load_nrrd(path: str):
    try:
        import nrrd
    except ImportError:
        raise VolumeError(f"{path}: reading NRRD needs pynrrd (pip install pynrrd)") from None
    import nibabel as nib
    data, header = nrrd.read(path)  # index order F: axes match 'space directions' rows
    affine = np.eye(4)
    dirs = header.get("space directions")
    if dirs is not None:
        dirs = np.asarray([d for d in dirs if d is not None and not np.isnan(d).any()],
                          dtype=np.float64)
        affine[:3, :3] = dirs.T
        affine[:3, 3] = np.asarray(header.get("space origin", np.zeros(3)), dtype=np.float64)
    elif "spacings" in header:
        affine[:3, :3] = np.diag(np.asarray(header["spacings"], dtype=np.float64)[:3])
    space = str(header.get("space", "right-anterior-superior")).lower()
    if space in ("left-posterior-superior", "lps"):
        affine = np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine
    elif space not in ("right-anterior-superior", "ras"):
        raise VolumeError(f"{path}: NRRD space {space!r} is not RAS or LPS")
    return nib.Nifti1Image(np.asarray(data), affine)


def spatial_shape(shape: tuple) -> tuple:
    """``shape`` without trailing axes of length 1 beyond the third."""
    shape = tuple(shape)
    while len(shape) > 3 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def channels(img) -> int:
    """Image channels: 1 for a 3-D volume, the fourth axis of a 4-D one."""
    shape = spatial_shape(img.shape)
    return 1 if len(shape) == 3 else int(shape[3]) if len(shape) == 4 else 0


@dataclass(frozen=True)
class Voxels:
    """An image's stored voxel values and the scaling that makes them real values.

    The stored values (int16 for most CT) are kept as they are, and turned into float32
    a block of slices at a time (``values``): a float32 copy of a whole 512x512x800 CT
    would be 800 MB on top of its 400 MB of int16.
    """

    raw: np.ndarray
    """3-D stored values."""
    slope: float = 1.0
    inter: float = 0.0

    def values(self, block: np.ndarray) -> np.ndarray:
        """Real values (HU for CT) of a part of ``raw``, float32."""
        out = np.asarray(block, dtype=np.float32)
        if self.slope != 1.0:
            out = out * np.float32(self.slope)
        if self.inter != 0.0:
            out = out + np.float32(self.inter)
        return out


def _scaling(img) -> tuple[float, float]:
    slope = float(getattr(img.dataobj, "slope", 1.0))
    inter = float(getattr(img.dataobj, "inter", 0.0))
    return (1.0 if not np.isfinite(slope) or slope == 0 else slope,
            0.0 if not np.isfinite(inter) else inter)


def image_voxels(img, path: str, channel: int | None = None) -> Voxels:
    """The image's 3-D voxels, ``channel`` of a 4-D image.

    Raises:
      VolumeError: not 3-D (or 4-D without a channel), a channel out of range, or
      voxel data that cannot be read (truncated, corrupt).
    """
    shape = spatial_shape(img.shape)
    if len(shape) == 4 and channel is None:
        raise VolumeError(f"{path}: a {shape[3]}-channel image {shape}; pick one with --channel")
    if len(shape) not in (3, 4):
        raise VolumeError(f"{path}: image of shape {shape}, expected a 3-D volume (X, Y, Z)")
    if len(shape) == 4 and not 0 <= channel < shape[3]:
        raise VolumeError(f"{path}: --channel {channel} is outside 0..{shape[3] - 1}")
    try:
        if len(shape) == 4:  # one channel, scaled by nibabel
            return Voxels(np.array(img.dataobj[..., channel], dtype=np.float32).reshape(shape[:3]))
        proxy = img.dataobj
        raw = proxy.get_unscaled() if hasattr(proxy, "get_unscaled") else np.asarray(proxy)
        return Voxels(np.asarray(raw).reshape(shape), *_scaling(img))
    except DistsegError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated gzip, short file, corrupt data
        raise VolumeError(f"{path}: voxel data cannot be read ({_why(e)})") from e


def image_channels(img, path: str, channel: int | None = None) -> tuple[Voxels, ...]:
    """Every channel of an image as its own ``Voxels``: one for a 3-D volume, the C of a
    4-D (X, Y, Z, C) one, or only ``channel`` of it. A 4-D image is read once; its
    channels are views of that array, each scaled (nibabel's slope) a block at a time.

    Raises:
      VolumeError: neither 3-D nor 4-D, a channel out of range, or voxel data that
      cannot be read.
    """
    shape = spatial_shape(img.shape)
    if len(shape) == 3 or channel is not None:
        return (image_voxels(img, path, channel),)
    if len(shape) != 4:
        raise VolumeError(f"{path}: image of shape {shape}, expected a 3-D volume (X, Y, Z) "
                          "or a 4-D one (X, Y, Z, channels)")
    try:
        proxy = img.dataobj
        raw = np.asarray(proxy.get_unscaled() if hasattr(proxy, "get_unscaled") else proxy)
        raw = raw.reshape(shape)
    except DistsegError:
        raise
    except Exception as e:  # noqa: BLE001 - as image_voxels
        raise VolumeError(f"{path}: voxel data cannot be read ({_why(e)})") from e
    slope, inter = _scaling(img)
    return tuple(Voxels(raw[..., c], slope, inter) for c in range(shape[3]))


def check_grid(path: str, img, first: str, first_img) -> None:
    """Checks that ``img`` (read from ``path``) is a 3-D volume on the grid of
    ``first_img`` (read from ``first``): the same shape and an affine within
    ``GRID_TOLERANCE`` mm.

    Raises:
      VolumeError: one line naming both files.
    """
    shape, want = spatial_shape(img.shape), spatial_shape(first_img.shape)[:3]
    if shape != want:
        raise VolumeError(f"{path}: shape {shape}, but the first channel {first} is {want} "
                          "(every channel of a case must be on one grid)")
    diff = float(np.abs(np.asarray(img.affine) - np.asarray(first_img.affine)).max())
    if not diff <= GRID_TOLERANCE:
        raise VolumeError(f"{path}: not on the grid of the first channel {first} (affines "
                          f"differ by up to {diff:.3g} mm)")


def case_channels(files: Sequence[str], channel: int | None = None) -> tuple[object, tuple[Voxels, ...]]:
    """(the first file's image, every channel's ``Voxels``) of one case: the channels
    of its one image (``image_channels``), or one 3-D file per channel, each on the
    first file's grid (nnU-Net). ``channel`` keeps that channel only.

    Raises:
      VolumeError: a missing or unreadable file, a channel out of range, or a channel
      file of another shape or affine than the first (the line names both files).
    """
    first = load(files[0])
    if len(files) == 1:
        return first, image_channels(first, files[0], channel)
    if channel is not None and not 0 <= channel < len(files):
        raise VolumeError(f"{files[0]}: --channel {channel} is outside 0..{len(files) - 1}")
    out = []
    for c, path in enumerate(files):
        if channel is not None and c != channel:
            continue
        img = first if c == 0 else load(path)
        if c:
            check_grid(path, img, files[0], first)
        out.append(image_voxels(img, path))
    return first, tuple(out)


def label_array(img, path: str) -> np.ndarray:
    """The label volume as uint8 class ids.

    Raises:
      VolumeError: not 3-D, unreadable, or non-integer / negative / > 255 values.
    """
    shape = spatial_shape(img.shape)
    if len(shape) != 3:
        raise VolumeError(f"{path}: labels of shape {shape}, expected a 3-D volume")
    try:
        raw = np.asanyarray(img.dataobj).reshape(shape)
    except DistsegError:
        raise
    except Exception as e:  # noqa: BLE001 - as image_voxels
        raise VolumeError(f"{path}: voxel data cannot be read ({_why(e)})") from e
    if raw.dtype == np.uint8:
        return raw
    lo, hi = raw.min(), raw.max()
    if lo < 0 or hi > 255 or (raw.dtype.kind == "f" and not np.array_equal(raw, np.round(raw))):
        raise VolumeError(f"{path}: labels must be integers 0..255, found values in [{lo}, {hi}]")
    return raw.astype(np.uint8)
