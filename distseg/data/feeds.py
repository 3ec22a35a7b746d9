"""What the training loop reads: slices for the 2D U-Net, slabs of volumes for the 3D one.

A feed knows its sample ids (what the shards, the sample digests and the report's
coverage check count), the model's input shape and how to open its reader.
``distseg.training.loop`` holds one feed and never asks which kind it has: one loop for
2D and 3D (how a rank scores its share of the validation set is
``distseg.training.step.validation``).

No Horovod here: ``rank`` and ``size`` come in as ints.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from distseg.core import batchplan
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import folds, h5format, sharding, slabplan, volumes
from distseg.data import slices as data


class SliceFeed:
    """2D: slices of a slice file, validated slice by slice."""

    def __init__(self, cfg: config_lib.Config, info: data.DatasetInfo):
        self.info, self.path, self.resize = info, cfg.data.path, cfg.data.resize
        self.input_shape = (cfg.model.image_size, cfg.model.image_size)
        self.train_ids = info.train_indices
        self.val_count = len(info.val_indices)
        self.foreground_fraction, self.seed = cfg.data.foreground_fraction, cfg.train.seed

    def summary(self) -> dict:
        return self.info.summary()

    def open_reader(self):
        """A ``data.SliceReader``; under ``data.foreground_fraction``, wrapped in
        ``ForegroundSlices``."""
        reader = data.SliceReader(self.path, image_size=self.input_shape[0], resize=self.resize)
        if self.foreground_fraction <= 0:
            return reader
        try:
            held = data.foreground_slices(self.path, self.train_ids)
        except BaseException:
            reader.close()
            raise
        return ForegroundSlices(reader, held, self.foreground_fraction, self.seed)


class ForegroundSlices:
    """2D foreground oversampling (nnU-Net's ``oversample_foreground_percent``): of the
    training slices read for an epoch, a share ``fraction`` is replaced by a training
    slice holding foreground, drawn from (seed, epoch, id) alone
    (``sharding.foreground_draws``), so any rank count and a resumed run read the same
    slices. The ids reported stay the ones asked for (coverage counts them; the
    augmentation draw is the id's). Reads without an epoch (validation) are plain."""

    def __init__(self, reader: data.SliceReader, held: np.ndarray, fraction: float, seed: int):
        self.reader, self.held, self.fraction, self.seed = reader, held, fraction, seed

    def substitutes(self, ids: Sequence[int], epoch: int) -> np.ndarray:
        """The slices read in place of ``ids`` in ``epoch``."""
        picks = sharding.foreground_draws(ids, epoch, self.seed, self.fraction,
                                          [len(self.held)] * len(ids))
        return np.array([i if p is None else self.held[p] for i, p in zip(ids, picks)],
                        dtype=np.int64)

    def read(self, ids: Sequence[int], epoch: int | None = None):
        if epoch is None:
            return self.reader.read(ids)
        return self.reader.read(self.substitutes(ids, epoch), epoch)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class VolumeFeed:
    """3D: slabs of a volume file (``--slab``), validated by sliding windows over each
    whole validation volume."""

    def __init__(self, cfg: config_lib.Config, info: volumes.VolumeInfo,
                 slab: Sequence[int], plan: slabplan.Plan | None = None):
        self.info, self.path, self.seed, self.plan = info, cfg.data.path, cfg.train.seed, plan
        self.foreground_fraction = cfg.data.foreground_fraction
        self.input_shape = tuple(int(s) for s in slab)
        self.train_ids = volumes.slab_ids(info, self.input_shape, "train")
        self.val_count = len(info.val_cases)

    def summary(self) -> dict:
        planned = {} if self.plan is None else {"slab_plan": self.plan.describe()}
        return {**self.info.summary(self.input_shape), **planned}

    def open_reader(self) -> volumes.SlabReader:
        return volumes.SlabReader(self.path, self.input_shape,
                                  foreground_fraction=self.foreground_fraction, seed=self.seed)


Feed = SliceFeed | VolumeFeed


class Opened(NamedTuple):
    """A run's config checked against its data file, with the file's classes filled in
    (``with_data_classes``: what the run builds, trains and saves), and its feed. The
    feed keeps only where and how it reads: the config is the caller's."""

    cfg: config_lib.Config
    feed: Feed


def open_feed(cfg: config_lib.Config, ranks: int, check_labels: bool) -> Opened:
    """The feed of ``cfg`` after every check of the data file against the run
    (``check_labels``: read every mask once; rank 0 does, the others trust it), and
    ``cfg`` with the file's classes (and ``--slab auto``'s slab, depth and batch).

    Raises:
      DatasetError: one line naming the file and what would fix it (a volume file
        given to the 2D model, or the reverse, included).
        A class count or names in the config that differ from the file's included.
      InputError: a ``--global-batch`` the ranks cannot share (``batchplan.batch_plan``).
    """
    if cfg.model.spatial_dims == 3:
        return _open_volumes(cfg, ranks, check_labels)
    per_rank = batchplan.batch_plan(cfg.train, ranks).per_rank
    info = folds.examine(cfg.data.path, 2, cfg.data.fold, check_labels=check_labels)
    cfg = _with_file_classes(cfg, info)
    data.check_fit(info, ranks=ranks, batch_size=per_rank, image_size=cfg.model.image_size,
                   resize=cfg.data.resize, num_classes=cfg.model.num_classes)
    return Opened(cfg, SliceFeed(cfg, info))


def _open_volumes(cfg: config_lib.Config, ranks: int, check_labels: bool) -> Opened:
    """``open_feed`` of a 3D run: planned first, since ``--slab auto`` may set the batch
    the ranks share."""
    info = folds.examine(cfg.data.path, 3, cfg.data.fold, check_labels=check_labels)
    cfg, plan = planned(_with_file_classes(cfg, info), info)
    slab = volumes.check_fit(info, ranks=ranks, batch_size=_per_rank(cfg, ranks, plan),
                             slab=volumes.parse_slab(cfg.data.slab),
                             num_classes=cfg.model.num_classes)
    _check_pooling(cfg, slab)
    return Opened(cfg, VolumeFeed(cfg, info, slab, plan))


def _per_rank(cfg: config_lib.Config, ranks: int, plan: slabplan.Plan | None) -> int:
    try:
        return batchplan.batch_plan(cfg.train, ranks).per_rank
    except InputError as e:
        if plan is None:
            raise
        raise InputError(f"{e} (the global batch is --slab auto's plan; give --slab D,H,W, "
                         f"--depth and --global-batch, or plan per-rank batches with "
                         f"--batch-size)") from None


def with_classes(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` with its data file's classes filled in, from the file's metadata alone
    (on this rank only: no collective; ``open_feed`` does the same among its checks).

    Raises:
      DatasetError: as ``open_feed``.
    """
    reader = volumes if cfg.model.spatial_dims == 3 else data
    return _with_file_classes(cfg, reader.examine(cfg.data.path, check_labels=False))


def _with_file_classes(cfg: config_lib.Config, info) -> config_lib.Config:
    try:
        return config_lib.with_data_classes(cfg, info.path, info.num_classes, info.class_names,
                                            info.channels)
    except InputError as e:  # a data error, as every other mismatch of file and run
        raise h5format.DatasetError(str(e)) from None


def planned(cfg: config_lib.Config, info: volumes.VolumeInfo):
    """(``cfg`` with ``--slab auto``'s slab, depth and batch planned from ``info``'s
    training volumes, the same at any rank count; the ``slabplan.Plan``, or None where
    the config gave the slab)."""
    return slabplan.resolve(cfg, info.shapes[info.train_cases])


def with_plan(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` with its data file's classes and, under ``--slab auto``, the slab, depth
    and batch ``open_feed`` plans, from the file's metadata alone (on this rank only:
    no collective; what an elastic run builds its model from)."""
    if cfg.model.spatial_dims == 3 and slabplan.asks(cfg):
        info = folds.examine(cfg.data.path, 3, cfg.data.fold)
        return planned(_with_file_classes(cfg, info), info)[0]
    return with_classes(cfg)


def input_shape(cfg: config_lib.Config) -> tuple[int, ...]:
    """The model's input shape from the config alone (a whole-volume ``--slab full``
    or a planned ``--slab auto`` reads the file's metadata, on this rank only: no
    collective)."""
    if cfg.model.spatial_dims == 2:
        return (cfg.model.image_size, cfg.model.image_size)
    if slabplan.asks(cfg):
        cfg = with_plan(cfg)
    slab = volumes.parse_slab(cfg.data.slab)
    if slab == "full":
        slab = volumes.resolve_slab(volumes.examine(cfg.data.path, check_labels=False), slab)
    return tuple(int(x) for x in slab)


def _check_pooling(cfg: config_lib.Config, slab: Sequence[int]) -> None:
    pool = 2 ** cfg.model.depth
    if any(s % pool for s in slab):
        raise h5format.DatasetError(
            f"{cfg.data.path}: slab {'x'.join(map(str, slab))} is not divisible by "
            f"2**depth = {pool} in every axis; pass --slab with multiples of {pool}")
