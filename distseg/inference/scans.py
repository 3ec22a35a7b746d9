"""The scans ``distseg-predict`` segments: input files and folders (MSD or LiTS-style
pairs) turned into ``Scan`` s, each with its label file where there is one.

A folder gives the cases of one ``--subset``: ``test`` (unlabelled: MSD imagesTs,
test-volume-N), ``val`` or ``train`` (the cases the training data file's case table
put there) or ``all``; a file finds its labels in ``--labels`` (``segmentation-N`` for
``volume-N``, else the same name). Two cases of one name are refused: their outputs
would overwrite each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from distseg.core.errors import InputError
from distseg.data import h5format
from distseg.data.convert import sources

SUBSETS = ("test", "val", "train", "all")


@dataclass(frozen=True)
class Scan:
    """One input volume to segment, and its labels where there are any."""

    name: str
    image: str
    label: str | None


def _label_for(image: str, labels_dir: str | None) -> str | None:
    """The label file of ``image`` in ``labels_dir``: ``segmentation-N`` for
    ``volume-N`` (LiTS), else the same name (MSD labelsTr); never the image itself."""
    if not labels_dir:
        return None
    stem = sources.strip_extension(image)
    stems = ([stem.replace("volume-", "segmentation-", 1)] if stem.startswith("volume-") else []) + [stem]
    for s in stems:
        for ext in sources.EXTENSIONS:
            candidate = os.path.join(labels_dir, s + ext)
            if os.path.isfile(candidate) and not os.path.samefile(candidate, image):
                return candidate
    return None


def _folder_scans(folder: str, subset: str, table: dict | None) -> list[Scan]:
    src = sources.discover(folder)
    if subset == "test":
        picked = src.unlabelled
    elif subset == "all":
        picked = src.cases + src.unlabelled
    else:
        if table is None:
            raise InputError(f"--subset {subset} needs the case table of a training data file "
                             "written by distseg-data convert (pass --data FILE.h5)")
        wanted = h5format.SPLITS[subset]
        picked = tuple(c for c in src.cases if table.get(c.name) == wanted)
    if not picked:
        raise InputError(f"{folder}: no cases in --subset {subset} ({len(src.cases)} labelled, "
                         f"{len(src.unlabelled)} unlabelled)")
    return [Scan(c.name, c.image, c.label) for c in picked]


def collect_scans(inputs: Sequence[str], table: dict | None, subset: str = "test",
                  labels: str | None = None) -> list[Scan]:
    """Every case to predict in ``inputs`` (``--subset`` of each folder's cases; a file
    with its label file from ``labels``), with its label file where there is one.

    Raises:
      InputError: a missing input, an empty folder subset, or two cases of one name.
    """
    if subset not in SUBSETS:
        raise InputError(f"--subset {subset!r}: expected one of {', '.join(SUBSETS)}")
    scans: list[Scan] = []
    for path in inputs:
        if os.path.isdir(path):
            scans += _folder_scans(path, subset, table)
        elif os.path.isfile(path):
            scans.append(Scan(sources.strip_extension(path), path, _label_for(path, labels)))
        else:
            raise InputError(f"{path}: no such file or folder")
    seen: dict[str, str] = {}
    for scan in scans:
        if scan.name in seen:
            raise InputError(f"{scan.image}: case name {scan.name} is also {seen[scan.name]}; "
                             "outputs would overwrite each other")
        seen[scan.name] = scan.image
    if not scans:
        raise InputError("no input volumes given")
    return scans
