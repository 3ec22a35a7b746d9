"""Timed steps of a run's own train step before it trains, that leave no trace: the
pieces ``--precision auto``'s trial (``precision``) and ``--compression auto``'s timing
(``compression``) share.

The batch is the rank's first batch of the run, read with a reader of its own; after
the timed steps the variables (weights, BatchNorm statistics, dropout seeds) and the
optimizer state are put back as they were and the step forgets its last gradient
(``put_back``), so the data order, the noise scale and the logs' steps are those of a
run that timed nothing.

No rank fails alone: each piece that may fail on some ranks runs inside an agreement
point (``agreed``) before the next collective, and a rank whose timed step fails steps
once more with a blank batch and the failed flag (``timed_step``), so the others leave
the step's allreduce and every rank raises the same error. ``label`` names the caller
in that error (``--precision auto's trial``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from distseg.core import config as config_lib
from distseg.core.errors import Interrupted, RunError
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training import steps
from distseg.training.plan import EpochPlan


def failure(label: str, what: str, e: BaseException) -> tuple[str, int]:
    """``e`` as one line naming the caller and the piece, with its exit code."""
    message, code = agreement.failure_of(e)
    return f"{label}, {what}: {message}", code


def _named(label: str, what: str, fn, *args):
    """``fn(*args)``, its error re-raised as a ``RunError`` that names the piece."""
    try:
        return fn(*args)
    except Interrupted:
        raise
    except Exception as e:  # noqa: BLE001 - named here, shared by agreement.agree
        raise RunError(*failure(label, what, e)) from e


def agreed(label: str, what: str, fn, *args):
    """Collective: ``fn(*args)`` on every rank; a failure on any raises the same
    ``RunError`` on every rank, naming ``label``, the piece ``what`` and the rank."""
    return agreement.agree(_named, label, what, fn, *args)


def first_batch(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed):
    """This rank's first batch of the run, read by a reader of its own, and the static
    batch size the step is traced for: ``(images, masks, static)``."""
    plan = EpochPlan.of(cfg.train, len(feed.train_ids), ctx.size)
    ids = plan.batches(feed.train_ids, ctx.rank, ctx.size, 0, cfg.train.seed)[0]
    with feed.open_reader() as reader:
        images, masks = reader.read(ids)
    return images, masks, plan.static_batch(len(feed.train_ids), ctx.size)


@dataclasses.dataclass
class Candidate:
    """A state, its traced step and what its variables held before the timed steps."""

    state: tuple
    step: object
    kept: list
    seconds: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, state, step=None) -> "Candidate":
        """``state`` (and ``step``, or one set later), with its variables' values now:
        what ``put_back`` restores."""
        return cls(state, step, [v.numpy() for v in steps.trial_variables(state[0], state[1])])

    @property
    def variables(self) -> list:
        model, optimizer, _ = self.state
        return steps.trial_variables(model, optimizer)


def _flags(failed: bool) -> np.ndarray:
    flags = np.zeros(2, np.float32)
    flags[steps.FAILED] = 1.0 if failed else 0.0
    return flags


def timed_step(candidate: Candidate, batch, label: str, what: str,
               before: Callable[[], None] | None = None) -> float:
    """Collective: one step of ``candidate`` on ``batch``, its seconds (``before``: called
    first, inside the step's guard: a test hook). A rank whose step fails steps again on
    a blank batch with the failed flag (the failure rides the step's allreduce, as a
    failed read does in training), and every rank raises it."""
    images, masks, _ = batch
    error = None
    start = time.perf_counter()
    try:
        if before is not None:
            before()
        out = candidate.step(images, masks, _flags(False))
        float(out.loss)
    except Interrupted:
        raise
    except Exception as e:  # noqa: BLE001 - shared through the step's flags
        error = failure(label, what, e)
        out = candidate.step(np.zeros_like(images), np.zeros_like(masks), _flags(True))
    seconds = time.perf_counter() - start
    if steps.Flags.of(out.flags).failed:
        agreement.raise_agreed(error)
    return seconds


def put_back(candidate: Candidate) -> None:
    """The variables as they were before the timed steps, and no memory of their
    gradients."""
    steps.put_back(candidate.variables, candidate.kept, candidate.step)
