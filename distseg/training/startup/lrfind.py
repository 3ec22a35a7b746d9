"""``--lr auto``: the base learning rate found by a range test at a new run's start.

The test (Smith 2017, "Cyclical learning rates"; fastai's ``lr_find``, Lightning's
``Tuner.lr_find``) trains ``STEPS`` steps of the run's own train step on its real
global batch, all ranks together, the lr rising exponentially from ``LR_LOW`` to
``LR_HIGH``, and stops early once the smoothed loss diverges (``diverged``). Rank
0 reads the curve (``suggest``), snaps the lr to a grid of sqrt(2) steps (``snap``) and
broadcasts it, so every rank trains with the same lr, and 1 x 8 and 2 x 4 of one global
batch, whose losses differ only in their last bits, land on the same point of the grid.

It leaves no trace in the run: the model's variables (weights, BatchNorm statistics,
dropout seeds) and the optimizer's state are put back afterwards, its batches come from
an epoch of their own (``FIND_EPOCH``, read by a reader of its own, augmented with that
epoch's draws), and nothing reaches the noise scale, the step count, the batch policy or
the logs' steps. What it found is the run's ``train.lr`` in config.json, so a resume
keeps it and everything that reads ``train.lr`` works unchanged; the curve is in the
run record's ``lr_find`` field.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from distseg.core import config as config_lib
from distseg.core import lr
from distseg.core.errors import EXIT_BAD_INPUT, RunError
from distseg.data import feeds, prefetch
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.progress.plan import EpochPlan
from distseg.training.step import factory, steps

#: Steps of the sweep, at most (it stops once the loss has diverged).
STEPS = 60
LR_LOW, LR_HIGH = 1e-5, 1.0
#: Exponential smoothing of the loss (debiased, as fastai's).
SMOOTHING = 0.9
#: The sweep stops once the smoothed loss has climbed back above its lowest value by this
#: many times what it had fallen from the start (shift- and scale-free: the Dice loss
#: is negative).
DIVERGED = 2.0
#: ... or, while it has fallen less than this share of its size, climbed back by
#: ``DIVERGED`` x this share (a flat, noisy start is no divergence); and never within
#: the first 2 x ``SKIP_START`` steps.
DIVERGE_FLOOR = 0.1
#: A fall of the smoothed loss smaller than this share of its size counts as none.
MIN_FALL = 0.01
#: A steepest fall this late in the sweep (share of its steps), where the loss never
#: turned (still at its lowest at the sweep's end), is not trusted: the fall was still
#: speeding up when the lrs ran out, so the test found no upper end of the useful range
#: (on the phantom such a choice lay far above the best of a sweep of fixed lrs,
#: docs/studies/lr-phantom-2026-11-26.md). The run keeps its configured lr.
LATE = 2 / 3
#: Steps at the start of the curve the suggestion never picks (the average settles).
SKIP_START = 5
#: The epoch number whose shuffle and augmentation draws the sweep uses: one the run
#: never trains.
FIND_EPOCH = 1_000_003


def sweep_lrs(n: int = STEPS) -> list[float]:
    """The lr of each of ``n`` steps: exponential from ``LR_LOW`` to ``LR_HIGH``."""
    return [LR_LOW * (LR_HIGH / LR_LOW) ** (k / (n - 1)) for k in range(n)]


def smooth(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average of ``losses``."""
    out, avg = [], 0.0
    for k, loss in enumerate(losses, start=1):
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta ** k))
    return out


def smooth_both_ways(losses: list[float]) -> list[float]:
    """``smooth`` forwards, then backwards over the result: no lag, so the steepest
    point is not pushed to higher lrs (a one-way average of 0.9 lags about 9 steps,
    here 0.75 of a decade)."""
    return smooth(smooth(losses)[::-1])[::-1]


def snap(lr: float) -> float:
    """``lr`` on the grid 2^(k/2); halfway between two points, the lower one (the
    safer: a lower lr trains slower, a higher one can diverge)."""
    k = math.ceil(2 * math.log2(lr) - 0.5)
    return 2.0 ** (k / 2)


class NoDescent(RunError):
    """The loss fell at no lr of the sweep."""

    exit_code = EXIT_BAD_INPUT


class Inconclusive(Exception):
    """The sweep found no upper end of the useful lrs (``LATE``): the run keeps its own."""


def suggest(lrs: list[float], losses: list[float]) -> tuple[float, str]:
    """The lr of the steepest descent of the loss (smoothed both ways) against log(lr),
    before its lowest point; and why. Raises ``NoDescent`` when the curve never falls."""
    s = smooth_both_ways(_until_lowest(losses))
    best = int(np.argmin(s))
    start = s[min(SKIP_START, len(s) - 1)]
    if best <= SKIP_START or start - s[best] <= MIN_FALL * max(abs(start), 1e-3):
        raise NoDescent(
            f"--lr auto: the training loss fell at no lr from {lrs[0]:.2g} to "
            f"{lrs[len(losses) - 1]:.2g} (it was {losses[0]:.4g} at the first step and "
            f"{_shown(losses[-1])} at the last): set --lr by hand, or check the data and the model")
    x = np.log(np.asarray(lrs[:best + 1]))
    slope = np.gradient(np.asarray(s[:best + 1]), x)
    k = SKIP_START + int(np.argmin(slope[SKIP_START:]))
    why = (f"steepest fall of the smoothed loss at {lrs[k]:.3g} (step {k}); "
           f"lowest {s[best]:.4g} at {lrs[best]:.3g}")
    if _never_turned(losses) and k >= LATE * (len(lrs) - 1):
        raise Inconclusive(f"{why}, still falling at the sweep's end: no upper end of the "
                           f"useful lrs found")
    return lrs[k], why


def _never_turned(losses: list[float], margin: int = 3) -> bool:
    """Whether the sweep ran to its end with its one-way smoothed loss still at (within
    ``margin`` steps of) its lowest."""
    if len(losses) < STEPS or not all(math.isfinite(v) for v in losses):
        return False
    forward = smooth(losses)
    return min(range(len(forward)), key=forward.__getitem__) >= len(forward) - 1 - margin


def _until_lowest(losses: list[float], margin: int = 3) -> list[float]:
    """``losses`` up to ``margin`` steps past the lowest point of their one-way average:
    the climb after it, often by orders of magnitude, would leak into a two-way average."""
    finite = [k for k, v in enumerate(losses) if math.isfinite(v)]
    if not finite:
        return losses[:1]
    forward = smooth(losses[:finite[-1] + 1])
    lowest = min(range(len(forward)), key=forward.__getitem__)
    return losses[:min(lowest + margin + 1, finite[-1] + 1)]


def _shown(loss: float) -> str:
    return f"{loss:.4g}" if math.isfinite(loss) else str(loss)


@dataclasses.dataclass
class Found:
    """What the range test gave: the config with the found lr and the run record's
    ``lr_find`` (the step it traced stays in the run's ``factory.TrainSteps``)."""

    cfg: config_lib.Config
    record: dict | None


def batch_ids(plan: EpochPlan, ids, rank: int, size: int, seed: int) -> list:
    """Rank ``rank``'s ``STEPS`` batches of sample ids for the sweep: epochs of their own
    (``FIND_EPOCH`` on), as many as needed."""
    out, epoch = [], FIND_EPOCH
    while len(out) < STEPS:
        out += plan.batches(ids, rank, size, epoch, seed)[:plan.steps]
        epoch += 1
    return out[:STEPS]


def diverged(s: list[float]) -> bool:
    """Whether the smoothed loss ``s`` has climbed back from its lowest point by
    ``DIVERGED`` x its fall from the start, or x ``DIVERGE_FLOOR`` of its size if it
    fell less, after 2 x ``SKIP_START`` steps (or is not finite)."""
    if not math.isfinite(s[-1]):
        return True
    if len(s) <= 2 * SKIP_START:
        return False
    fall, rise = s[0] - min(s), s[-1] - min(s)
    return rise > DIVERGED * max(fall, DIVERGE_FLOOR * max(abs(s[0]), 1e-3))


def _read(reader, ids, k: int, plan: EpochPlan, transform, cfg, feed):
    """Step ``k``'s batch and the failure that stopped its read (then a blank one)."""
    try:
        images, masks = prefetch.read_as_training(reader, ids, FIND_EPOCH + k // plan.steps,
                                                  transform)
        return images, masks, None
    except Exception as e:  # noqa: BLE001 - shared in the step's allreduce
        _, images, masks = factory.stand_in(cfg, feed.input_shape, len(ids))
        return images, masks, agreement.failure_of(e)


def _sweep(cfg, ctx, feed, plan: EpochPlan, optimizer, step) -> tuple[list[float], list[float]]:
    """Collective: the sweep's losses (the global batch's, the same on every rank),
    until it diverges; every rank stops at rank 0's word. A rank's read error rides in
    the step's flags, so every rank raises it."""
    transform = factory.transform(cfg)
    lrs, losses = sweep_lrs(), []
    with feed.open_reader() as reader:
        for k, ids in enumerate(batch_ids(plan, feed.train_ids, ctx.rank, ctx.size,
                                          cfg.train.seed)):
            images, masks, failure = _read(reader, ids, k, plan, transform, cfg, feed)
            lr.assign(optimizer, lrs[k] * plan.lr_target / plan.lr_base)
            out = step(images, masks, np.array([failure is not None, 0], np.float32))
            failed, _, nonfinite = steps.Flags.of(out.flags)
            if failed:
                agreement.raise_agreed(failure)
            losses.append(float(out.loss))
            ended = nonfinite or diverged(smooth(losses))
            if dist.broadcast_object(ended if ctx.is_root() else None):
                break
    return lrs, losses


def decide(lrs: list[float], losses: list[float], configured: float) -> dict:
    """Rank 0 (and the emulation of ``benchmarks/``): the lr to train with and why, or
    the error's message (``error``). An inconclusive test (``Inconclusive``) keeps the
    ``configured`` lr (``kept``)."""
    try:
        raw, why = suggest(lrs, losses)
    except NoDescent as e:
        return {"error": str(e)}
    except Inconclusive as e:
        return {"lr": configured, "raw": None, "kept": True,
                "why": f"{e}; kept the configured lr {configured:g}"}
    return {"lr": snap(raw), "raw": raw, "why": why}


def find(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
         train_steps: factory.TrainSteps) -> Found:
    """Collective: ``cfg`` with the lr the range test found (unchanged without
    ``train.lr_auto``). The found lr is the base lr: the one the run's lr rule scales for
    a global batch above the base (the sweep's lrs were scaled the same way)."""
    if not cfg.train.lr_auto:
        return Found(cfg, None)
    began = time.perf_counter()
    model, optimizer, _ = train_steps.state
    variables = steps.trial_variables(model, optimizer)
    kept = [v.numpy() for v in variables]
    plan = EpochPlan.of(cfg.train, len(feed.train_ids), ctx.size)
    step = train_steps.for_batch(cfg, plan.static_batch(len(feed.train_ids), ctx.size))
    lrs, losses = _sweep(cfg, ctx, feed, plan, optimizer, step)
    steps.put_back(variables, kept, step)
    decided = dist.broadcast_object(decide(lrs, losses, cfg.train.lr) if ctx.is_root() else None)
    if "error" in decided:
        raise NoDescent(decided["error"])
    lr.assign(optimizer, decided["lr"])
    record = {**decided, "steps": len(losses), "lrs": lrs[:len(losses)], "losses": losses,
              "smoothed": smooth_both_ways(losses), "seconds": time.perf_counter() - began}
    found = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=decided["lr"]))
    return Found(found, record)


def refuse_elastic(cfg: config_lib.Config) -> None:
    """An elastic run's ranks build their state before they may talk: no range test
    there (the same one line on every rank)."""
    if cfg.train.lr_auto and not cfg.train.lr_from:
        raise RunError(f"--lr auto cannot run in an elastic run (its ranks start before they "
                       f"may talk); find the lr in a fixed run and pass --lr-from RUN, or --lr "
                       f"(the config's is {cfg.train.lr:g})", exit_code=EXIT_BAD_INPUT)
