"""Converts LiTS case 117, shipped by ``liver-ct-segmentation-package==1.6.0``, into
the distseg HDF5 format.

The package (install it with ``pip install --no-deps``: it pins an ancient torch) holds
``data/img_117.mrc`` (CT in HU, 128x128x128 float32, cropped around the liver) and
``data/lab_117.mrc`` (uint16: 0 background, 1 liver, 2 tumour). No voxel spacing is
stored, so ``spacing`` is recorded as NaN. Axis 0 is axial: its slices are the 2D
training samples.

One case cannot be split by case. Decision: the volume is cut into 8 contiguous slabs
of 16 axial slices, each recorded as its own ``case_id`` (117 * 100 + slab); slabs 0-5
train, slab 6 is a 16-slice buffer (``test`` split, unused in training) and slab 7
validates. Neighbouring slices are nearly identical, so a random per-slice split
would leak; the buffer slab keeps validation slices at least 16 slices away from any
training slice.

As volumes (``convert_volumes``, ``distseg-data lits-sample --ndim 3``), the same rule
with 3D-sized parts. Decision: slices 0-79 (slabs 0-4) are one training case (case id
11700), slices 80-95 (slab 5) the buffer (11705, ``test``), slices 96-127 (slabs 6-7)
one validation case (11706); ids are ``117 * 100 +`` the first 16-slice slab, as in
2D. Halves would leave 64 training slices (two slabs of 32 deep) and validation next
to them; this keeps the 16-slice buffer, gives training 80 slices (three 32-deep slabs
on the grid, more positions with ``--foreground-fraction``) and makes validation exactly
one 32-slice window deep, so sliding-window validation at the usual slab depth needs no
padding. It holds 36k liver and 16k tumour voxels; the 2D sample's validation slab
(112-127) lies inside it.

One split says more about its slab than about a recipe, so both layouts also come in
folds (``--folds K --fold I``, ``fold_splits``): the 8 slabs cut into K contiguous
folds, fold I validating its slabs behind a one-slab buffer on each side, the rest
training (as volumes, each contiguous run one case). The defaults above are fold 7 of
8 (2D) and fold 3 of 4 (3D). ``--folds K`` alone writes one file of every fold, in
either layout with the same 8 slab cases and fold table (``convert_folds``,
``convert_volume_folds``), so a 2D and a 3D recipe of one cross-validation validate
the same cases.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from distseg.core.errors import InputError
from distseg.data import h5format, volumes
from distseg.data import slices as data
from distseg.data.h5format import HU_WINDOW, window

PACKAGE = "liver_ct_segmentation_package"
SLAB = 16
#: 16-slice slabs of the 128-slice volume.
SLABS = 8
#: Fold counts the slabs divide into (each fold validates ``SLABS // folds`` slabs).
FOLD_COUNTS = (2, 4, 8)
#: (folds, fold) of the files written without ``--folds``: 2D validates slab 7, 3D the
#: 32 slices of slabs 6-7 (one slab window deep), each behind a one-slab buffer.
DEFAULT_FOLD = {2: (8, 7), 3: (4, 3)}
#: The CT normalisation of the files written without ``--ct-norm``: nnU-Net's, by the
#: training slabs' foreground, which beat the HU window -150..250 on every fold of this
#: case at 2 seeds and at 1 and 2 ranks (docs/studies/recipe-real-ct-2026-11-27.md). The
#: file's ``preprocessing`` attribute records it, so predict repeats it on scans.
CT_NORM = "foreground"


def fold_splits(folds: int, fold: int) -> list[str]:
    """The split of each slab when the volume's slabs are cut into ``folds`` contiguous
    folds and fold ``fold`` validates: its slabs ``val``, the slab on each side of them
    a buffer (``test``: unused, so no training slice lies within 16 slices of a
    validation one), the rest ``train``.

    Raises:
      InputError: a fold count the slabs do not divide, or a fold outside it.
    """
    if folds not in FOLD_COUNTS:
        raise InputError(f"--folds must be one of {FOLD_COUNTS} (the 8 slabs of 16 slices "
                         f"cut into equal folds), got {folds}")
    if not 0 <= fold < folds:
        raise InputError(f"--fold must be 0 to {folds - 1} for --folds {folds}, got {fold}")
    width = SLABS // folds
    first, end = fold * width, (fold + 1) * width
    return ["val" if first <= s < end else "test" if s in (first - 1, end) else "train"
            for s in range(SLABS)]


def _described(folds: int, fold: int, splits: list[str]) -> str:
    named = {k: [s for s, v in enumerate(splits) if v == k] for k in ("train", "test", "val")}
    return (f"fold {fold} of {folds}: slabs {named['train']} train, {named['test']} buffer "
            f"(test), {named['val']} val")


def package_data_dir() -> str:
    """Directory of the packaged MRC files, without importing the package (its
    ``__init__`` pulls torch)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise h5format.DatasetError(
            f"the package {PACKAGE} is not installed; run "
            "`pip install --no-deps liver-ct-segmentation-package==1.6.0` (or make install)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def read_mrc(path: str) -> np.ndarray:
    import mrcfile
    try:
        with mrcfile.open(path, permissive=True) as m:
            return np.array(m.data)
    except (OSError, ValueError) as e:
        raise h5format.DatasetError(f"{path}: cannot be read as MRC ({e})") from e


def read_case(source_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LiTS case 117: (HU float32 (128, 128, 128), labels uint8), checked."""
    src = source_dir or package_data_dir()
    img = read_mrc(os.path.join(src, "img_117.mrc")).astype(np.float32)
    lab = read_mrc(os.path.join(src, "lab_117.mrc"))
    if img.shape != lab.shape or img.ndim != 3:
        raise h5format.DatasetError(f"{src}: image {img.shape} and labels {lab.shape} differ")
    if lab.max() > 2:
        raise h5format.DatasetError(f"{src}/lab_117.mrc: label {lab.max()} outside 0..2")
    return img, lab.astype(np.uint8)


def normalised(img: np.ndarray, lab: np.ndarray, splits: list[str], ct_norm: str):
    """(the CT normalised for the network, its ``Intensity``): the HU window
    (``window``), or nnU-Net's normalisation by the training slabs' foreground
    (``foreground``: ``Intensity.ct_foreground``; validation and buffer slabs unseen)."""
    from distseg.data.convert.intensity import Intensity, foreground_voxels
    from distseg.data.convert.sources import Voxels
    if ct_norm == "window":
        return window(img, *HU_WINDOW), Intensity.ct(*HU_WINDOW)
    train = np.repeat([s == "train" for s in splits], SLAB)[:len(img)]
    norm = Intensity.ct_foreground(foreground_voxels(img[train], lab[train], seed=117))
    voxels = Voxels(img)
    out = norm.normaliser(voxels, norm.bounds(voxels))(img)
    return out.astype(np.float32, copy=False), norm


def _how(norm) -> str:
    """The words of the file's ``source`` for ``norm``."""
    if norm.kind == "ct":
        return f"HU window {norm.low:g},{norm.high:g}"
    return (f"CT normalised by the training slabs' foreground (clip {norm.low:.1f},{norm.high:.1f} HU, "
            f"z-score by mean {norm.mean:.1f} and std {norm.std:.1f})")


def preprocessing(norm, ndim: int, size: int) -> dict:
    """The file attribute ``preprocessing`` (as ``convert`` writes it): what
    ``distseg-predict`` repeats on a scan, the CT channel's normalisation ``norm``
    (``Intensity``) at the top and under ``channels``."""
    return {**norm.describe(), "ndim": ndim, "size": size if ndim == 2 else 0,
            "channels": [{"name": "CT", **norm.describe()}]}


def _attrs(norm, ndim: int, size: int) -> dict:
    """``hu_window`` (NaN unless the window) and ``preprocessing`` of a written file."""
    import json
    return {"hu_window": (norm.low, norm.high) if norm.kind == "ct" else (np.nan, np.nan),
            "preprocessing": json.dumps(preprocessing(norm, ndim, size), sort_keys=True)}


def convert(out: str, source_dir: str | None = None,
            fold: tuple[int, int] = DEFAULT_FOLD[2], ct_norm: str = CT_NORM) -> data.DatasetInfo:
    """Writes the distseg HDF5 file of LiTS case 117's slices to ``out``, each 16-slice
    slab a case, split by ``fold`` (folds, fold: ``fold_splits``), the CT normalised by
    ``ct_norm`` from that fold's training slabs (``normalised``)."""
    splits = fold_splits(*fold)
    img, lab = read_case(source_dir)
    _write_slices(out, img, lab, splits, normalised(img, lab, splits, ct_norm),
                  _described(*fold, splits))
    return data.examine(out)


def convert_folds(out: str, folds: int, source_dir: str | None = None,
                  ct_norm: str = CT_NORM) -> data.DatasetInfo:
    """Writes LiTS case 117's slices to ``out`` once for a whole cross-validation: the
    fold table of ``folds`` contiguous folds (``fold_splits``: each fold's buffer slabs
    unused while it validates), the file's own split fold 0's. Every slab trains in some
    fold, so the CT is normalised by the foreground of all 8 (as nnU-Net's fingerprint
    covers every case of its folds)."""
    img, lab = read_case(source_dir)
    _write_slices(out, img, lab, fold_splits(folds, 0),
                  normalised(img, lab, ["train"] * SLABS, ct_norm), _ALL_FOLDS.format(folds))
    _write_fold_table(out, folds)
    return data.examine(out)


#: The ``source`` words of a file of every fold.
_ALL_FOLDS = "a fold table of {} contiguous folds (folds/), the file's split fold 0's"


def _write_fold_table(out: str, folds: int) -> None:
    """The table of ``folds`` contiguous folds of the 8 slab cases (``fold_splits``)."""
    from distseg.data import folds as folds_lib
    roles = np.array([[h5format.SPLITS[r] for r in fold_splits(folds, k)] for k in range(folds)],
                     dtype=np.uint8)
    folds_lib.write_table(out, folds_lib.FoldTable(117 * 100 + np.arange(SLABS), roles,
                                                   f"{folds} contiguous folds of 16-slice slabs, "
                                                   "a buffer slab on each side of validation"))


def convert_volume_folds(out: str, folds: int, source_dir: str | None = None,
                         ct_norm: str = CT_NORM) -> volumes.VolumeInfo:
    """Writes LiTS case 117 in the volume layout once for a whole cross-validation, the
    3D twin of ``convert_folds``: each 16-slice slab one case volume (16x128x128, the
    same case ids, voxels and labels as the slab's slices there), the same fold table,
    the CT normalised by the foreground of all 8 slabs. A 2D and a 3D recipe of one CV
    then validate the same cases on one grid (``distseg-predict --out-of-fold`` averages
    their probabilities case by case). A 3D U-Net trains on a case whole with ``--slab
    16,128,128``; a deeper slab pads each case (``volumes.PAD_IMAGE``)."""
    img, lab = read_case(source_dir)
    values, norm = normalised(img, lab, ["train"] * SLABS, ct_norm)
    attrs = _attrs(norm, 3, img.shape[-1])
    splits = fold_splits(folds, 0)
    slabs = [slice(s * SLAB, (s + 1) * SLAB) for s in range(SLABS)]
    volumes.write_volumes(
        out, [values[z] for z in slabs], [lab[z] for z in slabs],
        [117 * 100 + s for s in range(SLABS)], [h5format.SPLITS[x] for x in splits],
        source="LiTS case 117 via liver-ct-segmentation-package 1.6.0 (img_117.mrc, "
               f"lab_117.mrc) as volumes, each 16-slice slab a case: {_ALL_FOLDS.format(folds)}; "
               f"{_how(norm)}",
        hu_window=attrs.pop("hu_window"), spacing=[(np.nan,) * 3] * SLABS, attrs=attrs)
    _write_fold_table(out, folds)
    return volumes.examine(out)


def _write_slices(out: str, img: np.ndarray, lab: np.ndarray, splits: list[str], normed,
                  described: str) -> None:
    """The slice file of the case, slab ``s`` a case of split ``splits[s]``, its CT
    ``normed`` (``normalised``'s values and ``Intensity``)."""
    values, norm = normed
    slab = np.arange(img.shape[0]) // SLAB
    split = np.array([h5format.SPLITS[splits[int(s)]] for s in slab], dtype=np.uint8)
    attrs = _attrs(norm, 2, img.shape[-1])
    data.write_dataset(
        out, values[..., None], lab, 117 * 100 + slab, split,
        source="LiTS case 117 via liver-ct-segmentation-package 1.6.0 (img_117.mrc, lab_117.mrc); "
               f"axial slabs of 16 slices as case ids, {described}; {_how(norm)}",
        hu_window=attrs.pop("hu_window"), spacing=(np.nan, np.nan, np.nan), attrs=attrs)


def volume_parts(splits: list[str]) -> list[tuple[int, int, str]]:
    """(first slab, end slab, split) of each run of slabs of one split: the volumes."""
    parts, start = [], 0
    for s in range(1, SLABS + 1):
        if s == SLABS or splits[s] != splits[start]:
            parts.append((start, s, splits[start]))
            start = s
    return parts


def convert_volumes(out: str, source_dir: str | None = None,
                    fold: tuple[int, int] = DEFAULT_FOLD[3],
                    ct_norm: str = CT_NORM) -> volumes.VolumeInfo:
    """Writes LiTS case 117 to ``out`` in the volume layout, each run of slabs of one
    split (``fold_splits`` of ``fold``) a volume, the CT normalised by ``ct_norm``."""
    splits = fold_splits(*fold)
    img, lab = read_case(source_dir)
    hu, norm = normalised(img, lab, splits, ct_norm)
    attrs = _attrs(norm, 3, img.shape[-1])
    parts = [(slice(a * SLAB, b * SLAB), 117 * 100 + a, h5format.SPLITS[split])
             for a, b, split in volume_parts(splits) if a * SLAB < len(hu)]
    return volumes.write_volumes(
        out, [hu[z] for z, _, _ in parts], [lab[z] for z, _, _ in parts],
        [c for _, c, _ in parts], [s for _, _, s in parts],
        source="LiTS case 117 via liver-ct-segmentation-package 1.6.0 (img_117.mrc, "
               f"lab_117.mrc) as volumes, runs of 16-slice slabs: {_described(*fold, splits)}; {_how(norm)}",
        hu_window=attrs.pop("hu_window"), spacing=[(np.nan,) * 3] * len(parts), attrs=attrs)
