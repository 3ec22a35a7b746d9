"""Parts that change the model between epochs, told apart from the observers, which
only read what the loop logs (``observers``).

A ``ModelPart`` swaps the weights, recomputes statistics or chooses the checkpoint to
keep. What is validated and saved depends on when each does so, so the moments are
named by the hooks and the parts' order is ``ORDER``, here and nowhere else; the loop
calls each hook on every part in that order, on every rank (some are collectives):

1. ``on_epoch_start``, then ``on_step`` after each step's record is written (before
   the observers see it);
2. ``before_validation``, once the epoch's steps are done (BatchNorm averaged over the
   ranks, weights checked, training time taken): the model becomes what is validated
   and saved. ``weight_average`` first (the model takes the average of the weights),
   then ``precise_bn`` (statistics of the weights now in the model), both before the
   observers' ``on_epoch_trained``;
3. ``epoch_fields`` into the ``epoch`` record, before the observers' own;
4. ``before_checkpoint`` with the ``epoch`` record, after the observers' ``on_epoch_end``:
   ``best`` chooses whether the epoch's checkpoint is the best (its line follows the
   epoch's);
5. ``after_checkpoint``, once the epoch's checkpoint is written (or was not due): the
   model goes back to what training goes on from (``weight_average``: the live
   weights), before the observers' ``on_epoch_closed``.

Every checkpoint keeps every part through one hook (``saved``): each part's
``state()`` (JSON, the manifest's ``parts``, by ``key``) and ``arrays()`` (the state
file's, by the part's own names). ``--resume`` gives them back through one hook too
(``restore``), so ``resume`` knows no part. A part that swapped the model's weights
when a checkpoint was written keeps the live ones among its arrays as
``checkpoint.TRAINING_WEIGHTS``: the weights training goes on from, which the
checkpoint's own ``load`` puts back before rank 0 broadcasts the model. Plain Python:
no TensorFlow, no Horovod.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distseg.core.errors import InputError

#: The parts' keys: in a checkpoint's manifest (``parts``) and in ``ORDER``.
WEIGHT_AVERAGE, PRECISE_BN, BEST = "weight_average", "precise_bn", "best"
#: The parts' order: the average of the weights before precise BatchNorm (the
#: statistics are those of the averaged weights), the best checkpoint's choice last
#: (it reads the validation of what the others made).
ORDER = (WEIGHT_AVERAGE, PRECISE_BN, BEST)


class ModelPart:
    """A do-nothing part that changes the model: a part overrides the hooks it needs
    and names itself by ``key`` (one of ``ORDER``)."""

    key = ""

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        """``epoch`` starts, with ``steps`` steps left to train in this launch."""

    def on_step(self, record: dict) -> None:
        """A ``step`` record of this rank, as the log has it."""

    def before_validation(self) -> None:
        """The epoch's steps are done: make the model what is validated and saved."""

    def epoch_fields(self) -> dict:
        """Fields this part adds to the epoch's ``epoch`` record."""
        return {}

    def before_checkpoint(self, record: dict) -> None:
        """This rank's ``epoch`` record is written; the epoch's checkpoint follows."""

    def after_checkpoint(self) -> None:
        """The epoch's checkpoint is written (or was not due): back to training."""

    def state(self) -> dict | None:
        """What a checkpoint's manifest keeps of this part (None: nothing)."""
        return None

    def arrays(self) -> dict:
        """Named arrays a checkpoint's state file keeps of this part (names of its own,
        apart from every other part's and the checkpoint's)."""
        return {}

    def restore(self, state: dict | None, arrays: dict) -> None:
        """Continues what a checkpoint kept: this part's ``state()`` (None: none kept)
        and the checkpoint's part arrays (this part's among them). Raises ``ValueError``
        for a kept state that does not fit the model."""


@dataclass
class Kept:
    """What a checkpoint kept of the parts: each part's ``state()`` by ``key`` and
    every part's ``arrays()``; ``where``: the checkpoint's state file, for messages."""

    states: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)
    where: str = ""


def ordered(*parts: ModelPart | None) -> tuple[ModelPart, ...]:
    """The parts that are on (None: off), in ``ORDER`` whatever order they are given
    in. Raises ``ValueError`` for a key not in ``ORDER``, or twice."""
    on = [p for p in parts if p is not None]
    keys = [p.key for p in on]
    if not set(keys) <= set(ORDER) or len(set(keys)) != len(keys):
        raise ValueError(f"model parts {keys}: each must be one of {ORDER}, once")
    return tuple(sorted(on, key=lambda p: ORDER.index(p.key)))


def saved(parts) -> Kept:
    """What a checkpoint keeps of ``parts``: the one hook every part is saved through."""
    states = {p.key: s for p in parts if (s := p.state()) is not None}
    arrays: dict = {}
    for p in parts:
        mine = p.arrays()
        if set(mine) & set(arrays):
            raise ValueError(f"model part {p.key}: arrays {sorted(set(mine) & set(arrays))} "
                             "are another part's")
        arrays.update(mine)
    return Kept(states, arrays)


def restore(parts, kept: Kept | None) -> None:
    """Every part continues what a resumed checkpoint ``kept`` (None: a new run, or an
    elastic run's commit: the parts start afresh). A kept state that does not fit
    raises ``InputError`` naming the checkpoint's file."""
    if kept is None:
        return
    for p in parts:
        try:
            p.restore(kept.states.get(p.key), kept.arrays)
        except ValueError as e:
            raise InputError(f"{kept.where}: {e}") from e
