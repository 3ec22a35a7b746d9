"""A local copy of the reader distseg had before it read slice by slice, for A/B runs.

Until 2026-11-25 ``distseg.data.slices.SliceReader.read`` selected a batch's slices
with one h5py fancy-index selection (``dataset[sorted ids]``). h5py builds that
selection point by point: about 9 ms of CPU per batch of 4 demo slices, against 0.7 ms
for reading the same slices one ``read_direct`` at a time. On one rank the reader
thread runs on the idle second core, but with one rank per core it takes that time
from the rank's own training step. ``read_by_fancy_selection`` returns exactly what
distseg's reader returns; ``benchlib.train_variant --reader fancy`` runs distseg with
it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def read_by_fancy_selection(self, indices: Sequence[int], epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``SliceReader.read`` as one fancy selection of the sorted unique slices
    (``epoch`` is ignored, as the original ignores it)."""
    from distseg.data.h5format import DatasetError
    uniq, inverse = np.unique(np.asarray(indices, dtype=np.int64), return_inverse=True)
    try:
        images = self._images[uniq][inverse].astype(np.float32, copy=False)
        masks = self._masks[uniq][inverse]
    except OSError as e:
        shown = ", ".join(str(i) for i in uniq[:4]) + (", ..." if len(uniq) > 4 else "")
        raise DatasetError(f"{self.path}: slices {shown} of 'images'/'masks' cannot be read "
                           f"({str(e).splitlines()[0]})") from e
    if self._resize:
        from distseg.data.slices import resize_bilinear, resize_nearest
        images = resize_bilinear(images, self.image_size)
        masks = resize_nearest(masks, self.image_size)
    return images, masks


VARIANTS = {"distseg": None, "fancy": read_by_fancy_selection}
