"""The scans ``distseg-predict`` segments: input files and folders (MSD, nnU-Net or
LiTS-style pairs) turned into ``Scan`` s, each with its label file where there is one.

A folder gives the cases of one ``--subset``: ``test`` (unlabelled: MSD or nnU-Net
imagesTs, test-volume-N), ``val`` or ``train`` (the cases the training data file's case
table put there) or ``all``; a file finds its labels in ``--labels`` (``segmentation-N``
for ``volume-N``, ``CASE`` for ``CASE_0000``, else the same name). Two cases of one name
are refused: their outputs would overwrite each other.

Multi-channel cases come in either form: one 4-D image (MSD, channels last), or one
3-D file per channel as nnU-Net names them. A file ``CASE_0000.nii.gz`` given as an
input is case ``CASE``, its channels ``CASE_0000``, ``CASE_0001``, ... beside it (as
many as exist, consecutively); a folder of such files without a dataset.json (what
``nnUNetv2_predict -i`` takes) gives one case per ``CASE``. How many channels the model
takes is checked later, from the headers (``predict.check_scan``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Sequence

from distseg.core.errors import InputError
from distseg.data import h5format
from distseg.data.convert import sources

SUBSETS = ("test", "val", "train", "all")
#: ``CASE_0000.nii.gz``: channel 0 of case ``CASE`` in nnU-Net's naming.
_FIRST_CHANNEL = re.compile(r"^(?P<case>.+)_0000$")


@dataclass(frozen=True)
class Scan:
    """One input volume to segment, and its labels where there are any."""

    name: str
    image: str
    """The image, or its first channel's file: the grid the segmentation is written on."""
    label: str | None
    channel_files: tuple[str, ...] = ()
    """One 3-D file per channel, ``image`` first (nnU-Net naming); empty: ``image``
    holds every channel."""

    @property
    def files(self) -> tuple[str, ...]:
        """The image files to read, in channel order."""
        return self.channel_files or (self.image,)


def channel_files(first: str) -> tuple[str, ...]:
    """``CASE_0000<ext>`` and the consecutive ``CASE_0001<ext>``, ... beside it; empty
    for a file not named ``_0000``."""
    stem = sources.strip_extension(first)
    m = _FIRST_CHANNEL.match(stem)
    if not m:
        return ()
    ext = os.path.basename(first)[len(stem):]
    folder = os.path.dirname(first)
    files = [first]
    while True:
        nxt = os.path.join(folder, m.group("case") + sources.CHANNEL_SUFFIX.format(len(files)) + ext)
        if not os.path.isfile(nxt):
            return tuple(files)
        files.append(nxt)


def _file_scan(path: str, labels: str | None) -> Scan:
    files = channel_files(path)
    stem = sources.strip_extension(path)
    name = _FIRST_CHANNEL.match(stem).group("case") if files else stem
    return Scan(name, path, _label_for(path, labels), files if len(files) > 1 else ())


def _label_for(image: str, labels_dir: str | None) -> str | None:
    """The label file of ``image`` in ``labels_dir``: ``segmentation-N`` for
    ``volume-N`` (LiTS), else the same name (MSD labelsTr); never the image itself."""
    if not labels_dir:
        return None
    stem = sources.strip_extension(image)
    stems = ([stem.replace("volume-", "segmentation-", 1)] if stem.startswith("volume-") else []) + [stem]
    first = _FIRST_CHANNEL.match(stem)
    if first:  # nnU-Net: labels CASE for images CASE_0000, CASE_0001, ...
        stems.insert(0, first.group("case"))
    for s in stems:
        for ext in sources.EXTENSIONS:
            candidate = os.path.join(labels_dir, s + ext)
            if os.path.isfile(candidate) and not os.path.samefile(candidate, image):
                return candidate
    return None


def _channel_folder(folder: str) -> list[Scan]:
    """The cases of a folder of nnU-Net-named channel files without a dataset.json
    (one per ``CASE_0000<ext>``), or none."""
    if os.path.exists(os.path.join(folder, "dataset.json")):
        return []
    firsts = sorted(p for ext in sources.EXTENSIONS
                    for p in glob.glob(os.path.join(glob.escape(folder), "*_0000" + ext)))
    return [_file_scan(p, None) for p in firsts]


def _folder_scans(folder: str, subset: str, table: dict | None) -> list[Scan]:
    plain = _channel_folder(folder)
    if plain:
        if subset not in ("test", "all"):
            raise InputError(f"{folder}: a folder of unlabelled CASE_XXXX channel files has no "
                             f"--subset {subset}; use test or all")
        return plain
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
    return [Scan(c.name, c.image, c.label, c.channel_files) for c in picked]


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
            scans.append(_file_scan(path, labels))
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
