"""``--slab auto``: a 3D run's training slab, U-Net depth and batch planned from its
data and its network, as nnU-Net's experiment planner plans its patch, poolings and
batch.

**Slab and depth.** Start from the training cases' median shape (on the grid the data
file holds them: ``distseg-data convert --spacing`` brings them to one spacing first).
nnU-Net pools each axis while its feature map stays at least ``MIN_EDGE`` voxels;
distseg's U-Net has one depth for all three axes, so the depth planned is the largest
at which every axis of the slab is still ``MIN_EDGE`` voxels or more at the bottleneck,
at least 1 and at most ``MAX_DEPTH``. Each extent is rounded down to a multiple of
2**depth (the median case is cut, not padded). While one training step at that slab
and depth does not fit the memory budget, one pooling unit comes off the axis that is
largest against the median shape (nnU-Net's rule: the axis the slab covers most of)
and the depth is derived again from the smaller slab.

**Batch.** nnU-Net's: its reference batch (2, ``MIN_BATCH``) scaled by how far the
budget exceeds the step's estimate at that batch, capped so one batch covers at most
``DATASET_SHARE`` of the training volumes' voxels (summed here; nnU-Net approximates
them by the median shape times the case count), and never below ``MIN_BATCH``. One
departure: the batch also stays within the budget (``memory.largest_batch``), which
nnU-Net's rounding may pass; its budget is a target, distseg's the limit of a rank.

The batch planned is one process's: a config with a fixed global batch
(``train.global_batch`` > 0) gets it as its global batch, which N ranks share as
``distseg.core.batchplan`` says (``train.global_batch_grows`` kept as the config set
it); a config of per-rank batches gets it as ``train.batch_size``. The memory of a
step is ``distseg.networks.memory``'s estimate (what ``distseg-memory`` prints), in
float32 (bfloat16, when a run decides it, needs less), at one process's batch, so
every rank count plans the same slab, depth and batch and trains the same model. The
learning rate is the config's: nnU-Net does not scale it with the batch either.

The budget is ``BUDGET`` per rank, whatever the machine has: the plan is part of what
a run trains, so it must not change with the node a job lands on. What is planned is
what the run's config.json holds (``data.slab``, ``model.depth``, and
``train.global_batch`` or ``train.batch_size``), so a resumed run reads it and plans
nothing; the start-up and the run record's ``dataset.slab_plan`` say how it was
reached. A user who wants any of the three fixed gives ``--slab D,H,W`` and the depth
and batch: then nothing is planned.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.networks import memory, spec

#: The memory one rank's training step may take under ``--slab auto`` (bytes): 4 GiB,
#: a quarter of a 16 GB GPU or of a 96 GB, 24-rank share of a KNL node's, ample
#: on the Xeon nodes.
BUDGET = 4 * 2 ** 30
#: ``data.slab`` asking for the plan.
AUTO = "auto"
#: The fewest voxels an axis keeps at the bottleneck (nnU-Net's
#: ``featuremap_min_edge_length``), and the thinnest a slab is shrunk to.
MIN_EDGE = 4
#: The deepest U-Net planned. nnU-Net caps its features at 320 per level, so its deep
#: levels are cheap; distseg's filters double at every level, so a 6th level would
#: hold 4 x the parameters of the 5th, more than the coarser context it adds is worth.
MAX_DEPTH = 5
#: nnU-Net's reference batch, at which the memory is estimated, and its smallest batch.
MIN_BATCH = 2
#: The largest share of the training volumes' voxels one batch may cover (nnU-Net's
#: ``max_dataset_covered``): more would make an epoch a handful of steps.
DATASET_SHARE = 0.05


class Plan(NamedTuple):
    slab: tuple[int, int, int]
    depth: int
    """The U-Net's poolings (``model.depth``)."""
    batch: int
    """One process's batch (``batch_field``)."""
    median: tuple[int, int, int]
    """The training cases' median (D, H, W)."""
    need: int
    """The estimated bytes of a step at ``slab``, ``depth`` and ``batch``."""
    batch_field: str = "batch"
    """The config field that holds ``batch`` (``resolve``)."""

    def describe(self) -> str:
        slab, median = ("x".join(map(str, s)) for s in (self.slab, self.median))
        return (f"--slab auto: slab {slab}, depth {self.depth}, {self.batch_field} "
                f"{self.batch} (training cases' median {median}; one process's step "
                f"estimated at {memory.human(self.need)} of the {memory.human(BUDGET)} "
                f"budget per rank)")


def asks(cfg: config_lib.Config) -> bool:
    """Whether ``cfg``'s ``data.slab`` asks for the plan."""
    return cfg.data.slab.strip().lower() == AUTO


def median_shape(shapes: np.ndarray) -> tuple[int, int, int]:
    """The median (D, H, W) of ``shapes`` (K, 3), rounded to whole voxels."""
    return tuple(int(round(v)) for v in np.median(np.asarray(shapes), axis=0))


def depth_for(extents) -> int:
    """The most poolings (1 to ``MAX_DEPTH``) after which every one of ``extents`` is
    still ``MIN_EDGE`` voxels or more."""
    depth = 1
    while depth < MAX_DEPTH and all(e >= MIN_EDGE * 2 ** (depth + 1) for e in extents):
        depth += 1
    return depth


def _spec(model: config_lib.ModelConfig, slab, depth: int) -> spec.UNetSpec:
    planned = dataclasses.replace(model, precision="float32", depth=depth)
    return spec.spec_of(planned, slab)


def _shrunk(slab: list[int], median, depth: int, need: int, budget: int) -> list[int]:
    """``slab`` with one pooling unit off the axis largest against ``median``.

    Raises:
      InputError: no axis can lose one and stay ``MIN_EDGE`` voxels or more.
    """
    unit = 2 ** depth
    shrinkable = [a for a in range(3) if slab[a] - unit >= MIN_EDGE]
    if not shrinkable:
        raise InputError(f"--slab auto: even a {'x'.join(map(str, slab))} slab at depth {depth} "
                         f"needs {memory.human(need)} per rank at batch {MIN_BATCH}, more than "
                         f"the {memory.human(budget)} budget; lower --base-filters, or give "
                         f"--slab D,H,W, --depth and the batch")
    axis = max(shrinkable, key=lambda a: slab[a] / max(1, median[a]))
    return [s - unit if a == axis else s for a, s in enumerate(slab)]


def _batch(found: spec.UNetSpec, need: int, train_voxels: int, budget: int) -> int:
    """nnU-Net's batch of a step that needs ``need`` bytes at ``MIN_BATCH`` (see the
    module docstring)."""
    by_memory = round(budget / need * MIN_BATCH)
    by_data = round(DATASET_SHARE * train_voxels / np.prod(found.spatial, dtype=np.float64))
    return max(MIN_BATCH, min(by_memory, by_data, memory.largest_batch(found, budget)))


def plan(median, model: config_lib.ModelConfig, train_voxels: int,
         budget: int = BUDGET) -> Plan:
    """The slab, depth and batch of ``model`` (its filters, norm, channels and classes;
    its own depth is replaced) for training cases of ``median`` shape holding
    ``train_voxels`` voxels together (see the module docstring).

    Raises:
      InputError: not even a slab of ``MIN_EDGE`` voxels an axis fits ``budget``.
    """
    median = tuple(int(m) for m in median)
    depth = depth_for(median)
    slab = [max(2 ** depth, m // 2 ** depth * 2 ** depth) for m in median]
    while (need := memory.estimate(_spec(model, slab, depth), MIN_BATCH).total) > budget:
        slab = _shrunk(slab, median, depth, need, budget)
        depth = depth_for(slab)
    found = _spec(model, slab, depth)
    batch = _batch(found, need, train_voxels, budget)
    return Plan(tuple(slab), depth, batch, median, memory.estimate(found, batch).total)


def resolve(cfg: config_lib.Config, shapes: np.ndarray) -> tuple[config_lib.Config, Plan | None]:
    """``cfg`` with its slab, depth and batch planned where ``data.slab`` says ``auto``
    (from the training cases' ``shapes``), and the plan (None: the config's own)."""
    if not asks(cfg):
        return cfg, None
    if cfg.model.fn:
        raise InputError("--slab auto plans for distseg's U-Net, whose memory it can estimate; "
                         "with --model-fn give --slab D,H,W")
    if not len(shapes):
        raise InputError(f"{cfg.data.path}: --slab auto needs training volumes to plan from")
    voxels = int(np.prod(np.asarray(shapes, dtype=np.int64), axis=1).sum())
    found = plan(median_shape(shapes), cfg.model, voxels)
    field = "global_batch" if cfg.train.global_batch else "batch_size"
    planned = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, slab=",".join(map(str, found.slab))),
        model=dataclasses.replace(cfg.model, depth=found.depth),
        train=dataclasses.replace(cfg.train, **{field: found.batch}))
    return planned, found._replace(batch_field=f"train.{field}")
