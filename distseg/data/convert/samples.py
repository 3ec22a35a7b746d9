"""Sample dataset folders for tests, benchmarks and trying ``convert`` and ``predict``.

``write_task``: seeded MSD-style or LiTS-style folders of phantom CT volumes on any
orientation and spacing. Each volume is ``synth.phantom_case`` (a body, a vertebra, a
liver on the patient's right with lesions, in HU) written with the affine that an
orientation code such as ``LPS`` or ``PIR`` and a RAS spacing give, so its content
sits at the same place in the patient whatever the array's axis order.

``write_multichannel_task``: the same phantoms as multi-channel cases, an MSD task of
4-D images or an nnU-Net v2 raw dataset of one file per channel.

``write_phantoms``: phantoms drawn in mm at given (or random, LiTS-like) voxel
spacings, as LiTS-style pairs (``distseg-data synth --spacing``), so that
``convert --spacing`` has cases of many spacings to bring to one.

``write_lits117``: the real LiTS case 117 of ``liver-ct-segmentation-package`` as a
LiTS-style NIfTI pair.
"""

from __future__ import annotations

import json
import os

import numpy as np

from distseg.data import lits, synth
from distseg.data.convert import geometry

_AXES = {"R": (0, 1), "L": (0, -1), "A": (1, 1), "P": (1, -1), "S": (2, 1), "I": (2, -1)}


def affine_for(orientation: str, spacing_ras=(0.8, 0.8, 2.5), origin=(-100.0, 20.0, 50.0)) -> np.ndarray:
    """The voxel-to-RAS affine of an array whose axes run towards ``orientation``
    (nibabel axis codes, e.g. ``RAS``, ``LPS``, ``PIR``), with voxels of ``spacing_ras``
    mm along x, y, z."""
    affine = np.eye(4)
    affine[:3, :3] = 0
    for i, code in enumerate(orientation.upper()):
        axis, sign = _AXES[code]
        affine[axis, i] = sign * spacing_ras[axis]
    affine[:3, 3] = origin
    return affine


def case_arrays(seed: int, size: int, slices: int, orientation: str, width: int | None = None):
    """(HU int16 array, labels uint8 array) of one phantom in ``orientation``'s axis order,
    ``slices`` axial slices of ``size`` rows x ``width`` (default ``size``) columns."""
    width = width or size
    n = max(size, width)
    hu, labels = synth.phantom_case(np.random.default_rng(seed), n, slices)
    r0, c0 = (n - size) // 2, (n - width) // 2  # a non-square field of view: the middle
    hu, labels = hu[:, r0:r0 + size, c0:c0 + width], labels[:, r0:r0 + size, c0:c0 + width]
    ornt = geometry.ornt_of(affine_for(orientation))
    return (np.round(geometry.from_slices(hu, ornt)).astype(np.int16),
            geometry.from_slices(labels, ornt).astype(np.uint8))


def save_volume(path: str, array: np.ndarray, affine: np.ndarray) -> None:
    """Writes ``array`` with ``affine`` as NIfTI, or as NRRD (LPS space) for a .nrrd path."""
    if path.endswith(".nrrd"):
        import nrrd
        lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine
        nrrd.write(path, array, {"space": "left-posterior-superior",
                                 "space directions": lps[:3, :3].T,
                                 "space origin": lps[:3, 3]})
        return
    import nibabel as nib
    nib.save(nib.Nifti1Image(array, affine), path)


def write_task(root: str, cases: int = 4, *, kind: str = "msd", size: int = 48, slices: int = 24,
               seed: int = 0, orientations=("RAS",), spacing_ras=(0.8, 0.8, 2.5),
               ext: str = ".nii.gz", test_cases: int = 0) -> list[str]:
    """Writes an MSD task folder (``kind="msd"``: dataset.json, imagesTr/, labelsTr/,
    imagesTs/) or a folder of LiTS-style pairs (``kind="pairs"``: volume-N,
    segmentation-N, test-volume-N) of phantoms; case i has orientation
    ``orientations[i % len(orientations)]``. Returns the case names."""
    os.makedirs(root, exist_ok=True)
    names, training, test = [], [], []
    for i in range(cases + test_cases):
        orientation = orientations[i % len(orientations)]
        hu, labels = case_arrays(seed * 1000 + i, size, slices, orientation)
        affine = affine_for(orientation, spacing_ras)
        labelled = i < cases
        if kind == "msd":
            name = f"liver_{i}"
            folder = "imagesTr" if labelled else "imagesTs"
            image = f"./{folder}/{name}{ext}"
            os.makedirs(os.path.join(root, folder), exist_ok=True)
            save_volume(os.path.join(root, image), hu, affine)
            if labelled:
                os.makedirs(os.path.join(root, "labelsTr"), exist_ok=True)
                save_volume(os.path.join(root, f"labelsTr/{name}{ext}"), labels, affine)
                training.append({"image": image, "label": f"./labelsTr/{name}{ext}"})
            else:
                test.append(image)
        else:
            name = f"volume-{i}" if labelled else f"test-volume-{i}"
            save_volume(os.path.join(root, f"{name}{ext}"), hu, affine)
            if labelled:
                save_volume(os.path.join(root, f"segmentation-{i}{ext}"), labels, affine)
        names.append(name)
    if kind == "msd":
        with open(os.path.join(root, "dataset.json"), "w", encoding="utf-8") as f:
            json.dump({"name": "PhantomLiver", "modality": {"0": "CT"},
                       "labels": {"0": "background", "1": "liver", "2": "cancer"},
                       "numTraining": cases, "numTest": test_cases,
                       "training": training, "test": test}, f, indent=1)
    return names


def write_phantoms(root: str, cases: int, spacings, *, extent=synth.EXTENT_MM, seed: int = 0,
                   orientation: str = "LPS") -> list[tuple[float, float, float]]:
    """Writes ``cases`` phantoms as LiTS-style pairs ``volume-N.nii.gz`` /
    ``segmentation-N.nii.gz`` (HU int16, labels uint8) in ``orientation``'s axis order.
    Case i is ``synth.phantom_mm`` of ``extent`` (z, y, x mm) at ``spacings[i % n]``
    (each (z, y, x) mm), or, for ``spacings="random"``, at a seeded
    ``synth.random_spacing``. Its body depends on (``seed``, i) alone, so one seed
    written at two spacings is the same body sampled twice. Returns each case's spacing.
    """
    os.makedirs(root, exist_ok=True)
    draw = np.random.default_rng([seed, 1])
    used = []
    for i in range(cases):
        spacing = (synth.random_spacing(draw) if isinstance(spacings, str)
                   else tuple(float(v) for v in spacings[i % len(spacings)]))
        hu, labels = synth.phantom_mm(np.random.default_rng([seed, 0, i]), spacing, extent)
        affine = affine_for(orientation, spacing[::-1])
        ornt = geometry.ornt_of(affine)
        save_volume(os.path.join(root, f"volume-{i}.nii.gz"),
                    np.round(geometry.from_slices(hu, ornt)).astype(np.int16), affine)
        save_volume(os.path.join(root, f"segmentation-{i}.nii.gz"),
                    geometry.from_slices(labels, ornt).astype(np.uint8), affine)
        used.append(spacing)
    return used


#: (scale, offset) of the phantom's non-CT channels, one per channel: each is the
#: phantom's HU + 1024 scaled and shifted, 0 outside the body (as a masked MR scan).
MR_CHANNELS = ((1.0, 0.0), (0.5, 100.0), (2.0, -50.0), (0.25, 300.0))


def channel_arrays(hu: np.ndarray, names) -> list[np.ndarray]:
    """One array per channel of ``names`` from a phantom's HU: ``CT`` the HU (int16),
    any other name its entry of ``MR_CHANNELS`` (float32), cycling through them."""
    body = hu > -500
    out = []
    for c, name in enumerate(names):
        if name.strip().upper() == "CT":
            out.append(hu.astype(np.int16))
            continue
        a, b = MR_CHANNELS[c % len(MR_CHANNELS)]
        out.append(np.where(body, (hu.astype(np.float32) + 1024.0) * a + b, 0.0).astype(np.float32))
    return out


def write_multichannel_task(root: str, cases: int = 4, *, kind: str = "msd",
                            channels=("FLAIR", "T1w", "T1gd", "T2w"), size: int = 32,
                            slices: int = 12, seed: int = 0, orientations=("RAS",),
                            spacing_ras=(0.8, 0.8, 2.5), test_cases: int = 0) -> list[str]:
    """Writes phantoms of several channels (``channel_arrays``): an MSD task
    (``kind="msd"``: imagesTr/NAME.nii.gz 4-D (X, Y, Z, C), labelsTr/NAME.nii.gz,
    dataset.json with ``modality`` {"0": "FLAIR", ...} and ``labels`` {"0":
    "background", "1": "edema", "2": "tumour"}) or an nnU-Net v2 raw dataset
    (``kind="nnunet"``: imagesTr/NAME_XXXX.nii.gz one 3-D file per channel,
    labelsTr/NAME.nii.gz, dataset.json with ``channel_names``, ``labels`` {"background": 0,
    "tumor": 1} (liver and lesion) and ``file_ending``). Case i has orientation
    ``orientations[i % len(orientations)]``; unlabelled cases go to imagesTs. Returns
    the case names."""
    import nibabel as nib
    os.makedirs(os.path.join(root, "imagesTr"), exist_ok=True)
    os.makedirs(os.path.join(root, "labelsTr"), exist_ok=True)
    names, training, test = [], [], []
    for i in range(cases + test_cases):
        orientation = orientations[i % len(orientations)]
        hu, labels = case_arrays(seed * 1000 + i, size, slices, orientation)
        affine = affine_for(orientation, spacing_ras)
        arrays = channel_arrays(hu, channels)
        folder = "imagesTr" if i < cases else "imagesTs"
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        name = f"{'brats' if kind == 'msd' else 'prostate'}_{i:03d}"
        if kind == "msd":
            four = np.stack([a.astype(np.float32) for a in arrays], axis=-1)
            nib.save(nib.Nifti1Image(four, affine), os.path.join(root, folder, f"{name}.nii.gz"))
        else:
            for c, a in enumerate(arrays):
                nib.save(nib.Nifti1Image(a, affine), os.path.join(root, folder, f"{name}_{c:04d}.nii.gz"))
            labels = (labels > 0).astype(np.uint8)
        if i < cases:
            nib.save(nib.Nifti1Image(labels, affine), os.path.join(root, "labelsTr", f"{name}.nii.gz"))
            training.append({"image": f"./imagesTr/{name}.nii.gz", "label": f"./labelsTr/{name}.nii.gz"})
        else:
            test.append(f"./imagesTs/{name}.nii.gz")
        names.append(name)
    if kind == "msd":
        meta = {"name": "PhantomBrats", "modality": {str(c): n for c, n in enumerate(channels)},
                "labels": {"0": "background", "1": "edema", "2": "tumour"},
                "numTraining": cases, "numTest": test_cases, "training": training, "test": test}
    else:
        meta = {"name": "PhantomProstate", "channel_names": {str(c): n for c, n in enumerate(channels)},
                "labels": {"background": 0, "tumor": 1}, "numTraining": cases,
                "file_ending": ".nii.gz"}
    with open(os.path.join(root, "dataset.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    return names


def write_lits117(folder: str, orientation: str = "LPS", spacing_ras=(1.0, 1.0, 1.0),
                  source_dir: str | None = None) -> tuple[str, str]:
    """Writes LiTS case 117 as ``volume-117.nii.gz`` / ``segmentation-117.nii.gz``.

    The MRC files store no geometry. Their axis 0 is axial and their slices are taken
    to be in distseg's slice layout (what ``distseg-data lits-sample`` trains on), so
    converting the pair gives back the same slices; the spacing, unknown, is
    ``spacing_ras``. Returns the two paths.
    """
    src = source_dir or lits.package_data_dir()
    hu = lits.read_mrc(os.path.join(src, "img_117.mrc")).astype(np.float32)
    labels = lits.read_mrc(os.path.join(src, "lab_117.mrc")).astype(np.uint8)
    affine = affine_for(orientation, spacing_ras)
    ornt = geometry.ornt_of(affine)
    os.makedirs(folder, exist_ok=True)
    paths = (os.path.join(folder, "volume-117.nii.gz"), os.path.join(folder, "segmentation-117.nii.gz"))
    save_volume(paths[0], np.round(geometry.from_slices(hu, ornt)).astype(np.int16), affine)
    save_volume(paths[1], geometry.from_slices(labels, ornt), affine)
    return paths
