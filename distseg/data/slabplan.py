"""``--slab auto``: a 3D run's training slab planned from its data and its network.

nnU-Net's planner in brief: start from the training cases' median shape (on the grid
the data file holds them: ``distseg-data convert --spacing`` brings them to one
spacing first), each extent rounded down to a multiple of the U-Net's pooling (so the
median case is cut, not padded), and while one training
step of the network at that input does not fit the memory budget, take one pooling
unit off the axis that is largest against the median shape (nnU-Net's rule: the axis
the patch covers most of). The memory of a step is ``distseg.networks.memory``'s
estimate (what ``distseg-memory`` prints), in float32 (bfloat16, when a run decides
it, needs less) at the per-rank batch of one process (more ranks of a fixed global
batch take fewer samples each), so every rank count plans the same slab and trains
the same model.

The budget is ``BUDGET`` per rank, whatever the machine has: the slab is part of what
a run trains, so it must not change with the node a job lands on. The planned slab is
what the run's config.json holds (``data.slab``), and the start-up says how it was
reached. The batch and the depth stay the config's.
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


class Plan(NamedTuple):
    slab: tuple[int, int, int]
    median: tuple[int, int, int]
    """The training cases' median (D, H, W)."""
    need: int
    """The estimated bytes of a step at ``slab``."""

    def describe(self) -> str:
        slab, median = ("x".join(map(str, s)) for s in (self.slab, self.median))
        return (f"--slab auto: {slab} (training cases' median {median}; a step estimated at "
                f"{memory.human(self.need)} of the {memory.human(BUDGET)} budget per rank)")


def median_shape(shapes: np.ndarray) -> tuple[int, int, int]:
    """The median (D, H, W) of ``shapes`` (K, 3), rounded to whole voxels."""
    return tuple(int(round(v)) for v in np.median(np.asarray(shapes), axis=0))


def _need(model: config_lib.ModelConfig, slab, batch: int) -> int:
    float32 = dataclasses.replace(model, precision="float32")
    return memory.estimate(spec.spec_of(float32, slab), batch).total


def plan(median, model: config_lib.ModelConfig, batch: int, budget: int = BUDGET) -> Plan:
    """The slab of ``model`` (its depth, filters, channels and classes) for cases of
    ``median`` shape at ``batch`` samples per rank (see the module docstring).

    Raises:
      InputError: not even one pooling unit on every axis fits ``budget``.
    """
    pool = 2 ** model.depth
    slab = [max(pool, int(m) // pool * pool) for m in median]
    while True:
        need = _need(model, slab, batch)
        if need <= budget:
            return Plan(tuple(slab), tuple(int(m) for m in median), need)
        shrinkable = [a for a in range(3) if slab[a] > pool]
        if not shrinkable:
            raise InputError(f"--slab auto: even a {pool}x{pool}x{pool} slab needs "
                             f"{memory.human(need)} per rank at batch {batch}, more than the "
                             f"{memory.human(budget)} budget; lower --base-filters or the batch")
        axis = max(shrinkable, key=lambda a: slab[a] / max(1, median[a]))
        slab[axis] -= pool


def resolve(cfg: config_lib.Config, shapes: np.ndarray, batch: int) -> tuple[config_lib.Config, Plan | None]:
    """``cfg`` with ``data.slab`` planned where it says ``auto`` (from the training cases'
    ``shapes``), and the plan (None: the config's own slab)."""
    if cfg.data.slab.strip().lower() != AUTO:
        return cfg, None
    if cfg.model.fn:
        raise InputError("--slab auto plans for distseg's U-Net, whose memory it can estimate; "
                         "with --model-fn give --slab D,H,W")
    if not len(shapes):
        raise InputError(f"{cfg.data.path}: --slab auto needs training volumes to plan from")
    found = plan(median_shape(shapes), cfg.model, batch)
    slab = ",".join(map(str, found.slab))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, slab=slab)), found
