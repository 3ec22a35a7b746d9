"""Timed steps of a run's own train step before it trains, that leave no trace: the
pieces ``--precision auto``'s trial (``precision``) and ``--compression auto``'s timing
(``compression``) share.

The batch is the rank's first batch of the run, read with a reader of its own; after
the timed steps the variables (weights, BatchNorm statistics, dropout seeds) and the
optimizer state are put back as they were and the step forgets its last gradient
(``put_back``), so the data order, the noise scale and the logs' steps are those of a
run that timed nothing. The timed steps are of the kind most of the run's steps are
(``usual_noise_mode``): with the noise scale measured every few steps, steps that do not
measure, so the trial compares what training will run.

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
from distseg.training.progress import noise
from distseg.training.progress.plan import EpochPlan
from distseg.training.progress.state import noise_steers
from distseg.training.step import steps


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


def usual_noise_mode(cfg: config_lib.Config) -> int:
    """What most of ``cfg``'s training steps do for the noise scale
    (``noise.Cadence.usual_mode``): the kind of step the trial times."""
    return noise.Cadence.of(cfg.train.noise_every, noise_steers(cfg.train)).usual_mode


@dataclasses.dataclass
class Candidate:
    """A state, its traced step, what its variables held before the timed steps, and
    the kind of step timed (``usual_noise_mode``)."""

    state: tuple
    step: object
    kept: list
    noise_mode: int = noise.MEASURE
    seconds: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, state, noise_mode: int = noise.MEASURE) -> "Candidate":
        """``state`` with its variables' values now (what ``put_back`` restores); its
        step set later."""
        return cls(state, None, [v.numpy() for v in steps.trial_variables(state[0], state[1])],
                   noise_mode)

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
    candidate.step.noise_mode.assign(candidate.noise_mode)
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
    """The variables as they were before the timed steps, no memory of their gradients,
    and the step measuring again until the run's cadence says otherwise."""
    steps.put_back(candidate.variables, candidate.kept, candidate.step)
    candidate.step.noise_mode.assign(noise.MEASURE)
