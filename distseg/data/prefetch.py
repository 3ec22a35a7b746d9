"""The reader thread that reads the next batches while the current step runs.

Plain Python threads: whatever reader it is given (slices or slabs), no TensorFlow.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np


@dataclass(frozen=True)
class EpochBatch:
    """A batch of sample ids with the epoch it belongs to, for readers whose samples
    depend on the epoch (``volumes.SlabReader``'s foreground slabs)."""

    epoch: int
    ids: np.ndarray

def read_as_training(reader, ids: np.ndarray, epoch: int, transform: Callable | None = None):
    """``(images, masks)`` of ``ids`` as training reads them in ``epoch``: the reader's
    draws of that epoch (foreground slices or slabs, ``feeds``/``volumes``), then the
    augmentation ``transform`` of that epoch. The one way a batch is read for training:
    the prefetcher, precise BatchNorm's images and the lr range test all call it, so
    none of them sees other batches than the steps train on."""
    images, masks = reader.read(ids, epoch)
    if transform is not None:
        images, masks = transform(ids, epoch, images, masks)
    return images, masks


class Prefetcher:
    """Reads batches in a background thread and times how long the consumer waits.

    h5py releases the GIL during chunk I/O and decompression, so reading the next
    batch overlaps with the training step. ``batches`` may be a lazy iterable: one
    prefetcher fed every epoch's batches in turn keeps reading across epoch
    boundaries instead of refilling its queue in a burst at each epoch start.

    Each item of ``batches`` is an array of ids, read with ``reader.read(ids)``, or an
    ``EpochBatch``, read with ``reader.read(ids, epoch)``; either way the consumer gets
    ``(ids, images, masks)``.

    ``transform(ids, epoch, images, masks) -> (images, masks)`` (the training
    augmentation, ``distseg.data.augment``), when given, runs in this thread on each
    ``EpochBatch`` right after its read, so it overlaps the step as the read does. Plain
    id arrays have no epoch and are passed on as read.
    """

    _DONE = object()

    def __init__(self, reader, batches: Iterable, depth: int = 2,
                 transform: Callable | None = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._work, args=(reader, batches, transform),
                                        daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _work(self, reader, batches, transform):
        try:
            for item in batches:
                if self._stop.is_set():
                    return
                if isinstance(item, EpochBatch):
                    ids = item.ids
                    images, masks = read_as_training(reader, ids, item.epoch, transform)
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
