"""Resuming a run across ranks: ``restore`` has rank 0 find, verify and load the newest
whole checkpoint (``distseg.training.checkpoints.checkpoint``, which also saves them) and every
rank receive it by broadcast. It runs on every rank and agrees on failures.

What the checkpoint kept of the parts that change the model goes back to them through
one hook (``Resumed.parts``, ``modelparts.restore``): nothing here knows a part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distseg.core import rundir
from distseg.core.errors import InputError, RunError
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.checkpoints import checkpoint
from distseg.training.epoch import modelparts


def local_variables(model) -> list:
    """A rank's own variables: BatchNorm statistics (averaged over ranks only at epoch
    end) and the dropout layers' seed states (different on every rank on purpose)."""
    return [v for v in model.variables if not v.trainable]


def rank_state(model, seen: list, losses: list, losses_local: list) -> checkpoint.RankState:
    return checkpoint.RankState(
        local=[np.asarray(v.numpy()) for v in local_variables(model)],
        seen=np.concatenate(seen) if seen else np.zeros(0, np.int64),
        losses=list(losses), losses_local=list(losses_local))


@dataclass
class Resumed:
    """Where a resumed run starts, and what this rank brings back from before."""

    position: checkpoint.Position
    manifest: str | None
    """The checkpoint resumed from (None: an elastic run's in-memory commit)."""
    warnings: list = field(default_factory=list)
    carried: checkpoint.RankState | None = None
    """This rank's partial epoch (same number of ranks only), else None."""
    elastic: str | None = None
    """Why an elastic run re-formed (a rank lost, hosts changed); None otherwise."""
    parts: modelparts.Kept | None = None
    """What the checkpoint kept of the parts that change the model (None: an elastic
    run's commit: the parts start afresh)."""


def _find_for_size(run_dir: str, size: int) -> tuple[dict, list[str]]:
    """Rank 0: the checkpoint to resume at ``size`` ranks. A checkpoint inside an epoch
    written at another number of ranks cannot be continued step for step (its shards
    were cut for the old size): the newest epoch-boundary checkpoint is used instead."""
    ckdir = rundir.checkpoint_dir(run_dir)
    entry, warnings = checkpoint.find(run_dir)
    if entry is None:
        raise InputError(f"{ckdir}: holds no whole checkpoint to resume from")
    pos = entry["position"]
    if pos.step and pos.size != size:
        boundary = [c for c in checkpoint.stems(ckdir) if not rundir.is_inside_epoch(c)
                    and c < rundir.checkpoint_stem(pos.epoch, pos.step)]
        if not boundary:
            raise InputError(f"{entry['manifest']}: written {pos.step} steps into an epoch at "
                             f"{pos.size} ranks; resume at {pos.size} ranks (no epoch-boundary "
                             "checkpoint to resume from at another size)")
        older = checkpoint.manifest_entry(ckdir, rundir.manifest_name(boundary[-1]), True)
        warnings.append(f"{entry['manifest']} is {pos.step} steps into epoch {pos.epoch} at "
                        f"{pos.size} ranks; resuming at {size} ranks from {older['manifest']} "
                        f"({pos.global_step - older['position'].global_step} steps redone)")
        entry = older
    return entry, warnings


def _load_on_root(run_dir: str, size: int, model, optimizer):
    entry, warnings = _find_for_size(run_dir, size)
    checkpoint.load(entry, model, optimizer)
    arrays = checkpoint.read_state(entry)
    position = entry["position"]
    states = checkpoint.rank_states(arrays, position.size)
    parts = modelparts.Kept(dict(position.parts or {}), checkpoint.part_arrays(arrays),
                            entry["state"])
    return position, entry["manifest"], warnings, states, parts


def restore(ctx, run_dir: str, model, optimizer, synced) -> Resumed:
    """Collective: loads the newest whole checkpoint on rank 0 (checksums verified,
    falling back past damaged ones) and gives it to every rank."""
    loaded = agreement.agree(_load_on_root, run_dir, ctx.size, model, optimizer) \
        if ctx.is_root() else agreement.agree(lambda: None)
    # Horovod (in distributed): every rank takes rank 0's weights and optimizer state.
    dist.broadcast_variables(synced, root=0)
    position, manifest, warnings, states, parts = dist.broadcast_object(loaded)
    carried = None
    if position.size == ctx.size:
        # The same ranks: each takes back its own statistics, seeds and partial epoch.
        carried = states[ctx.rank]
        agreement.agree(checkpoint.assign_local, manifest, local_variables(model), carried.local)
    return Resumed(position=position, manifest=manifest, warnings=warnings, carried=carried,
                   parts=parts)


def check_extends(resumed: Resumed, epochs: int) -> None:
    """Every rank, same decision: a resumed run must have epochs left to train."""
    done = resumed.position.epoch
    if done >= epochs:
        raise RunError(f"{resumed.manifest}: the run has finished {done} epoch(s) already; "
                       f"pass --epochs N with N > {done} to extend it", exit_code=2)
