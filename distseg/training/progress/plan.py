"""The epoch plan: which batches each rank trains in every epoch, how many steps an
epoch has, and the learning rate those batches were planned with.

``EpochPlan.of`` turns a config's batch (``batchplan.batch_plan``: a fixed global batch
split over the ranks, a grown one, per-rank batches, or the ``goodput`` policy's
choice) into steps per epoch, the warm-up and the lr target (whose rules are
``core.lr``'s); ``EpochPlan.batches`` cuts one rank's batches of an epoch. Plain
Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

from dataclasses import dataclass

from distseg.core import batchplan, schema
from distseg.data import prefetch, sharding


@dataclass(frozen=True)
class EpochPlan:
    """The batches (``batchplan.batch_plan``), steps per epoch and the learning rate of
    every step."""

    steps: int
    lr_base: float
    lr_target: float
    """The lr after the warm-up (with the ``gain`` rule: the most it can reach)."""
    warmup_steps: int
    batch: batchplan.BatchPlan
    warmup_progress: float = 0.0
    """The ``gain`` rule's warm-up: steps of the base batch (``batch.base``)."""

    @classmethod
    def of(cls, train_cfg, train_samples: int, size: int,
           per_rank: int | None = None) -> "EpochPlan":
        """The plan of the config's batch, or of the ``goodput`` policy's ``per_rank``
        batch (``train.max_steps_per_epoch`` then caps the samples of an epoch as it
        caps them at the config's batch)."""
        batch = batchplan.batch_plan(train_cfg, size, per_rank)
        n = schema.steps_per_epoch(train_samples, size, batch.per_rank, batch.cut_global)
        if train_cfg.max_steps_per_epoch:
            samples = train_cfg.max_steps_per_epoch * batchplan.batch_plan(train_cfg, size).global_batch
            n = min(n, max(1, samples // batch.global_batch))
        return cls(steps=n, lr_base=train_cfg.lr, lr_target=train_cfg.lr * batch.lr_factor,
                   warmup_steps=int(round(train_cfg.warmup_epochs * n)), batch=batch,
                   warmup_progress=train_cfg.warmup_epochs * n * batch.global_batch / batch.base)

    def batches(self, ids, rank: int, size: int, epoch: int, seed: int) -> list:
        """This rank's batches of ``ids`` for ``epoch``: parts of fixed global batches,
        or per-rank shards."""
        if self.batch.cut_global:
            return sharding.global_batches(ids, rank, size, self.batch.cut_global, epoch, seed)
        return sharding.shard_batches(ids, rank, size, self.batch.per_rank, epoch, seed)

    def static_batch(self, train_samples: int, size: int) -> int | None:
        """The one size of every batch of every rank, when there is one (the step is
        then traced for it: BatchNorm's ghost batches split statically, faster than at
        a size known only at run time, docs/studies/fixed-global-batch-2026-11-24.md);
        None where per-rank shards of a split that
        does not divide hold some batches one sample short."""
        per_rank = self.batch.per_rank
        if self.batch.cut_global or per_rank == 1 or train_samples % (size * per_rank) == 0:
            return per_rank
        return None


def epoch_batches(plan: EpochPlan, ids, rank: int, size: int, epochs: int, seed: int,
                  start: tuple[int, int]):
    """This rank's batches of ``plan`` from (epoch, step) ``start`` to the end of
    training (``epochs``, the run's seed ``seed``), each tagged with its epoch (what the
    prefetcher reads)."""
    for e in range(start[0], epochs):
        first = start[1] if e == start[0] else 0
        for batch_ids in plan.batches(ids, rank, size, e, seed)[first:plan.steps]:
            yield prefetch.EpochBatch(e, batch_ids)


def origin_step(kept_global_step: int, plan: EpochPlan, start: tuple[int, int]) -> int:
    """The global step a launch starts at: the checkpoint's own count where it kept one
    (epochs of several batch sizes under the ``goodput`` policy), else counted from the
    position at this plan."""
    return kept_global_step or start[0] * plan.steps + start[1]


class PlannedBatches:
    """This rank's batches under the plan in force, read ahead by one prefetcher (which
    reads the next epoch's first batches while an epoch ends); ``use`` a new plan from
    an (epoch, step) on. Close it when done.

    ``transform`` (the training augmentation, ``data.augment.for_training``; None: none)
    runs in the prefetcher's thread on every batch as it is read. It takes the two
    values of the run's config it reads, ``epochs`` and ``seed``, not the config."""

    def __init__(self, reader, ids, rank: int, size: int, epochs: int, seed: int, depth: int,
                 transform=None):
        self.reader, self.ids, self.rank, self.size = reader, ids, rank, size
        self.epochs, self.seed = epochs, seed
        self.depth, self.transform = depth, transform
        self.plan: EpochPlan | None = None
        """The plan in force (``use``)."""
        self._prefetcher = None
        self._batches = iter(())

    def use(self, plan: EpochPlan, start: tuple[int, int]) -> None:
        self.close()
        self.plan = plan
        batches = epoch_batches(plan, self.ids, self.rank, self.size, self.epochs, self.seed,
                                start)
        self._prefetcher = prefetch.Prefetcher(self.reader, batches, depth=self.depth,
                                               transform=self.transform)
        self._batches = iter(self._prefetcher)

    def next(self):
        """The next batch: (sample ids, images, masks)."""
        return next(self._batches)

    def images(self, epoch: int, steps: int) -> list:
        """This rank's images of ``steps`` steps under the plan in force, read and
        augmented as training read them: the first of ``epoch``, and where it has fewer
        steps, those of the epochs before it, newest first (precise BatchNorm's: an
        epoch of one step would otherwise give statistics of one batch)."""
        out = []
        for e in range(epoch, -1, -1):
            for ids in self.plan.batches(self.ids, self.rank, self.size, e,
                                         self.seed)[:steps - len(out)]:
                out.append(prefetch.read_as_training(self.reader, ids, e, self.transform)[0])
            if len(out) >= steps:
                break
        return out

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
