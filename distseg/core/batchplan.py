"""How a run of R ranks batches its samples and scales its learning rate: the one
definition (``batch_plan``) that the loop's epoch plan, the data feed's checks, the
report's projection and the benchmarks read.

A config asks for a fixed global batch G (``train.global_batch``: each rank takes G/R,
the lr is not scaled; grown past the ranks when they cannot share it and the config
allows), or a per-rank batch (``train.batch_size``: the global batch grows with R and
the lr by ``train.lr_scaling``); the ``goodput`` policy may choose another per-rank
batch in a run (``chosen``). Plain Python: the report imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from distseg.core import lr
from distseg.core.config import TrainConfig
from distseg.core.errors import InputError

#: Plan kinds whose ranks cut their batches from fixed global batches of
#: ``global_batch`` (the others: per-rank shards); a run record's ``batch_plan``.
CUT_KINDS = ("global", "grown", "chosen")


@dataclass(frozen=True)
class BatchPlan:
    """How a run of ``ranks`` ranks batches its samples (``batch_plan``)."""

    per_rank: int
    """Samples per rank per step."""
    global_batch: int
    """Samples per step, all ranks together."""
    kind: str
    """``global`` (a fixed global batch split over the ranks), ``grown`` (a fixed global
    batch smaller than the ranks could share, grown to ``per_rank * ranks``),
    ``per_rank`` (``batch_size`` per rank) or ``chosen`` (a per-rank batch the
    ``goodput`` policy chose, cut from global batches of ``per_rank * ranks``)."""
    lr_factor: float
    """What ``train.lr`` is multiplied by at the end of the warm-up (``lr.batch_factor``;
    with a gain rule: at most)."""
    lr_scaling: str
    """The lr rule in force: ``none`` for a fixed global batch, ``train.lr_scaling`` for
    per-rank batches, ``train.grown_lr_scaling`` for a grown one."""
    base: int
    """The global batch ``train.lr`` is set for: G, or one process's ``batch_size``
    (the gradient noise scale's gain is measured against it)."""

    @property
    def cut_global(self) -> int:
        """The global batch the ranks' batches are cut from (0: per-rank shards)."""
        return self.global_batch if self.kind in CUT_KINDS else 0


def batch_plan(t: TrainConfig, ranks: int, per_rank: int | None = None) -> BatchPlan:
    """The batch and lr rule of ``t`` at ``ranks`` ranks; with ``per_rank``, of that
    per-rank batch (the ``goodput`` policy's choice) in the same run: the plan of ``t``
    where it is that plan's own batch, else global batches of ``per_rank * ranks`` with
    the lr of the rule for a batch grown past the base.

    Raises:
      InputError: a strict ``--global-batch`` G that ``ranks`` cannot share equally
        (G < ranks or G not a multiple of ranks), in one line naming both numbers.
    """
    planned = _planned(t, ranks)
    if per_rank is None or per_rank == planned.per_rank:
        return planned
    rule = t.grown_lr_scaling if t.global_batch else t.lr_scaling
    big = per_rank * ranks
    return BatchPlan(per_rank, big, "chosen", lr.batch_factor(rule, big / planned.base), rule,
                     planned.base)


def _planned(t: TrainConfig, ranks: int) -> BatchPlan:
    """``batch_plan`` of the config's own batch."""
    if not t.global_batch:
        return BatchPlan(t.batch_size, t.batch_size * ranks, "per_rank",
                         lr.batch_factor(t.lr_scaling, ranks), t.lr_scaling, t.batch_size)
    g = t.global_batch
    if g % ranks == 0:
        return BatchPlan(g // ranks, g, "global", 1.0, "none", g)
    if not t.global_batch_grows:
        raise InputError(f"--global-batch {g} cannot be shared by {ranks} ranks: it must be "
                         f"a multiple of the number of ranks (e.g. {ranks * max(1, g // ranks)}"
                         f" or {ranks * (g // ranks + 1)}), or pass --batch-size per rank")
    per_rank = -(-g // ranks)  # ceil: the global batch never shrinks below G
    grown = per_rank * ranks
    return BatchPlan(per_rank, grown, "grown", lr.batch_factor(t.grown_lr_scaling, grown / g),
                     t.grown_lr_scaling, g)
