"""``--compression auto``: whether a run's gradients travel as float16 or as exact
float32, decided once at its start from the link its ranks measured.

fp16 halves the bytes of the gradient allreduce and rounds the update. It pays only
where the allreduce is a large share of the step: a slow link, many gradients, a short
compute. So, on ranks of more than one host, the run predicts its step both ways with
the ring model of the link it measured at the start (``link.compression_choice``: the
compute, then the allreduce, no overlap) and takes fp16 where that predicts
``link.FP16_MIN_SPEEDUP`` times exact float32's samples/s or more. On one host (the
host's own path, not a network) and on one rank it keeps exact float32 without
measuring anything (``link.exact_reason``).

The compute time comes from the run's own step, the exact one, on its first batch: the
timed steps of ``--precision auto``'s trial where it ran (their slowest rank's median),
else ``TIMED_STEPS`` steps timed here after the one that traces it, the state put back
(``trial``). Compute is that step less the exact allreduce the link predicts
(``link.compute_seconds``), as the report takes the allreduce off a measured step.
The step timed is the step the run keeps where exact float32 stays, so nothing is
traced twice; where fp16 is taken its step is traced once more, and a timed
forward and backward pass of its own would have cost a trace in every run (and eager
passes, which need none, run much slower than the traced step: they would misjudge the
compute; docs/performance.md#gradient-compression).

Every rank takes the same decision: the link probe's medians are every rank's slowest
already, the step seconds are the slowest rank's (``precision.slowest_rank``), and
rank 0's decision is broadcast. The run record's ``compression_decision`` holds it with
its inputs, and the run's config.json the compression decided.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from distseg.core import config as config_lib
from distseg.core import link
from distseg.data import feeds
from distseg.parallel import distributed as dist
from distseg.training.progress.plan import EpochPlan
from distseg.training.startup import precision, timedsteps
from distseg.training.step import factory

#: Steps of the exact step timed where ``--precision auto``'s trial did not run, after
#: the one that traces it.
TIMED_STEPS = 3
#: How errors of the timing name it.
LABEL = "--compression auto's timing"


@dataclasses.dataclass
class Decision:
    """The config with the compression the run trains with, and the run record's
    ``compression_decision`` (None: the config named one)."""

    cfg: config_lib.Config
    record: dict | None


def _with_compression(cfg: config_lib.Config, compression: str) -> config_lib.Config:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compression=compression))


def exact(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` with ``auto`` read as exact float32: what a step is built with before the
    decision (``--precision auto``'s trial), and all an elastic run, whose ranks build
    their state before they may talk, can take."""
    return _with_compression(cfg, "none") if cfg.train.compression == config_lib.AUTO else cfg


def params_of(model) -> int:
    """The trainable parameters of ``model``: the values a step allreduces."""
    return int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))


def _traced(cfg: config_lib.Config, train_steps: factory.TrainSteps, static: int | None):
    """The run's step for ``static`` samples per rank, traced (no step runs: tracing
    needs no other rank); kept by ``train_steps`` for the run."""
    step = train_steps.for_batch(cfg, static)
    step.get_concrete_function()
    return step


def _timed(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
           train_steps: factory.TrainSteps) -> float:
    """Collective: the slowest rank's median seconds of the run's exact step on its first
    batch (``TIMED_STEPS`` after the one that traces it), the state put back."""
    batch = timedsteps.agreed(LABEL, "reading its first batch", timedsteps.first_batch, cfg, ctx, feed)
    # The values before the steps; the kind of step the run mostly takes.
    candidate = timedsteps.Candidate.of(train_steps.state, timedsteps.usual_noise_mode(cfg))
    candidate.step = timedsteps.agreed(LABEL, "tracing the step", _traced, cfg, train_steps, batch[2])
    timedsteps.timed_step(candidate, batch, LABEL, "the first step")
    seconds = [timedsteps.timed_step(candidate, batch, LABEL, f"timed step {i + 1}")
               for i in range(TIMED_STEPS)]
    timedsteps.put_back(candidate)
    return precision.slowest_rank({"none": statistics.median(seconds)})["none"]


def _measured_step(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
                   train_steps: factory.TrainSteps, tried: dict | None) -> tuple[float, str]:
    """Collective: seconds of the run's exact step and where they come from: the
    precision trial's (``tried``, its record: the chosen precision's), else timed here.
    A decision the precision cache kept is no timing of this run's link."""
    if tried and tried.get("source") == "trial" and tried.get("seconds"):
        return float(tried["seconds"][tried["choice"]]), "--precision auto's trial"
    return _timed(cfg, ctx, feed, train_steps), f"{TIMED_STEPS} steps timed"


def _predicted(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
               train_steps: factory.TrainSteps, measured: dict, tried: dict | None) -> dict:
    """Collective: ``link.compression_choice`` for the run's own step on ``measured``
    (the link probe's fit), rank 0's broadcast."""
    start = time.perf_counter()
    step_s, source = _measured_step(cfg, ctx, feed, train_steps, tried)
    params = params_of(train_steps.state.model)
    bandwidth, latency = measured["bandwidth_gbps"], measured["latency_us"]
    exact_sync = link.sync_seconds(link.gradient_bytes(params), ctx.size, bandwidth, latency)
    compute = link.compute_seconds(step_s, exact_sync, link.NO_OVERLAP)
    samples = EpochPlan.of(cfg.train, len(feed.train_ids), ctx.size).batch.global_batch
    record = link.compression_choice(compute, params, ctx.size, bandwidth, latency, samples)
    record.update(measured_step_s=step_s, step_source=source,
                  decision_s=time.perf_counter() - start)
    # Horovod: rank 0's decision, the same on every rank.
    return dist.broadcast_object(record if ctx.is_root() else None)


def decide(cfg: config_lib.Config, asked: str, ctx: dist.Context, feed: feeds.Feed,
           train_steps: factory.TrainSteps, measured: dict | None,
           tried: dict | None = None) -> Decision:
    """Collective where a step must be predicted: the compression a new run trains with,
    ``asked`` the one its config named. ``cfg``: the run's config so far (``exact``:
    its steps exact until now), ``train_steps`` its steps (the decision reaches them
    through the config their next caller holds),
    ``measured`` the link probe's fit (None on one rank), ``tried`` ``--precision
    auto``'s record (None: the config named the precision)."""
    if asked != config_lib.AUTO:
        return Decision(cfg, None)
    why = link.exact_reason(ctx.size, ctx.one_host(), (measured or {}).get("bandwidth_gbps"))
    if why:  # no collective: one host's ranks decide alike on their own
        record = {"choice": "none", "ranks": ctx.size, "one_host": ctx.one_host(),
                  "reason": f"exact float32: {why}", "decision_s": 0.0}
    else:
        record = _predicted(cfg, ctx, feed, train_steps, measured, tried)
    record = {"requested": config_lib.AUTO, **record}
    decided = _with_compression(cfg, record["choice"])
    precision.say(ctx, f"compression auto: {record['choice']}: {record['reason']}")
    return Decision(decided, record)


def given(cfg: config_lib.Config) -> dict:
    """The run record's ``compression_decision`` where the config named the compression
    (a flag, a config file, or a resumed run's config.json)."""
    return {"requested": cfg.train.compression, "choice": cfg.train.compression}
