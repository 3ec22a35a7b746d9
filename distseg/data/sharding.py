"""Which samples each rank trains on in each epoch: a permutation of the training ids
seeded by the global seed and the epoch (the same on every rank), cut into per-rank
shards or into fixed global batches, and the validation set's contiguous shares.

Plain numpy: ``rank`` and ``size`` come in as ints, no Horovod.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from distseg.core import schema

#: Mixed into the per-sample foreground seeds so they differ from the permutation's.
_SALT = 0x51AB


def epoch_permutation(indices: np.ndarray, epoch: int, seed: int) -> np.ndarray:
    """The global order of ``indices`` for ``epoch``: the same on every rank."""
    rng = np.random.default_rng([seed, epoch])
    return np.asarray(indices)[rng.permutation(len(indices))]

def shard_batches(indices: np.ndarray, rank: int, size: int, batch_size: int,
                  epoch: int, seed: int) -> list[np.ndarray]:
    """This rank's batches of sample ids for one epoch.

    A seeded permutation of ``indices`` (new each epoch, identical on all ranks) is cut
    into ``size`` contiguous shards whose lengths differ by at most one; shards are
    disjoint and together cover every sample. Each shard is split into the same number
    of batches on every rank (``schema.steps_per_epoch``), of at most ``batch_size`` samples
    and sizes differing by at most one, so all ranks run the same number of allreduce
    steps.

    Remainder: when ``n`` is not a multiple of ``size * batch_size``, some batches hold
    one sample fewer than ``batch_size`` rather than dropping or repeating samples. The
    single exception is ``batch_size == 1`` with ``n % size != 0``: the last ``n % size``
    samples of the epoch's permutation are skipped (a random few, new every epoch),
    since a rank cannot run a step on an empty batch.

    Raises:
      ValueError: fewer samples than ``size * batch_size``.
    """
    n = len(indices)
    if n < size * batch_size:
        raise ValueError(f"{n} samples are fewer than ranks x batch size = {size} x {batch_size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    order = epoch_permutation(indices, epoch, seed)
    if batch_size == 1:
        order = order[: n - n % size]
    shard = np.array_split(order, size)[rank]
    return np.array_split(shard, schema.steps_per_epoch(n, size, batch_size))

def global_batches(indices: np.ndarray, rank: int, size: int, global_batch: int,
                   epoch: int, seed: int) -> list[np.ndarray]:
    """This rank's batches of sample ids for one epoch with a fixed global batch.

    The epoch's permutation (``epoch_permutation``) is cut into steps of
    ``global_batch`` consecutive ids, the same steps at any number of ranks; rank
    ``rank`` takes the ``rank``-th of ``size`` equal parts of each step. So step k trains
    on the same samples whether 1 or ``size`` ranks share it, and with the global loss
    (``distseg.losses.global_loss``) makes the same update. The last
    ``n % global_batch`` ids of each permutation (a new random few every epoch) are left
    out of that epoch.

    Raises:
      ValueError: ``global_batch`` not a positive multiple of ``size``, or larger than
        the number of samples.
    """
    n = len(indices)
    if global_batch < size or global_batch % size:
        raise ValueError(f"global batch {global_batch} is not a multiple of the {size} ranks")
    if n < global_batch:
        raise ValueError(f"{n} samples are fewer than the global batch {global_batch}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    per_rank = global_batch // size
    order = epoch_permutation(indices, epoch, seed)
    steps = schema.steps_per_epoch(n, size, per_rank, global_batch)
    return [order[k * global_batch + rank * per_rank:k * global_batch + (rank + 1) * per_rank]
            for k in range(steps)]

def shard_eval(indices: np.ndarray, rank: int, size: int, batch_size: int) -> list[np.ndarray]:
    """This rank's validation batches: a contiguous shard, every sample exactly once.

    Ranks may get different numbers of batches (evaluation needs no collectives until
    its single allreduce at the end), and a rank may get none when there are fewer
    validation samples than ranks.
    """
    shard = np.array_split(np.asarray(indices), size)[rank]
    return [shard[i:i + batch_size] for i in range(0, len(shard), batch_size)]


def foreground_draws(ids: Sequence[int], epoch: int, seed: int, fraction: float,
                     sizes: Sequence[int]) -> list[int | None]:
    """For each sample id, an index below ``sizes[b]`` of the foreground to put in it,
    or None to keep the sample as it is: 3D, the voxel of its case's foreground sample
    to centre a slab on (``volumes.SlabReader``); 2D, the slice holding foreground that
    replaces it (``feeds.ForegroundSlices``).

    A share ``fraction`` of samples, decided per sample from (seed, epoch, id) alone,
    so every rank, every prefetch order and a resumed run decide alike. A sample with
    no foreground to draw from (size 0) stays as it is.
    """
    out: list[int | None] = []
    for sample_id, m in zip(np.asarray(ids, dtype=np.int64).tolist(), sizes):
        if fraction <= 0:
            out.append(None)
            continue
        rng = np.random.default_rng([_SALT, seed % 2**64, epoch, sample_id])
        biased = rng.random() < fraction
        out.append(int(rng.integers(m)) if biased and m > 0 else None)
    return out
