"""``--precision auto``: the precision a run trains in, decided by measuring at its start.

bfloat16 pays only where the CPU has native bfloat16 arithmetic, and not always there:
it sped the demo step up on one CPU and slowed it down on another whose oneDNN also
reported bfloat16 (docs/studies/precision-auto-2026-11-26.md). So flags alone do not
decide. Where every rank's CPU reports ``avx512_bf16`` or ``amx_bf16``, the run times
``TIMED_STEPS`` steps of its own train step on its own first batch in each precision,
all ranks together; the slowest rank's median decides (a synchronous step waits for
it), and bfloat16 is kept only at ``MIN_SPEEDUP`` or more. Where any rank reports
neither flag, float32 without a trial. A resumed run keeps what its config.json holds.

The trial leaves no trace: each precision's model is built from the run's own seed and
broadcast as the run's would be, its variables (weights, BatchNorm statistics, dropout
seeds), optimizer state and the step's previous-gradient memory are put back after the
timed steps, and it reads its batch with its own reader, so the data order, the noise
scale and the logs' steps are those of a run without it. The chosen precision's model,
optimizer and traced step are the run's: its first step is not traced twice.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

import numpy as np

from distseg.core import config as config_lib
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training import factory, steps
from distseg.training.plan import EpochPlan

#: /proc/cpuinfo flags of native bfloat16 arithmetic (AVX-512 BF16, AMX).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: bfloat16 is kept when its step is at least this much faster than float32's.
MIN_SPEEDUP = 1.10
#: Steps timed per precision, after the one that traces the step.
TIMED_STEPS = 3


def bf16_flags(cpuinfo: str) -> list[str]:
    """The bfloat16 flags (``BF16_FLAGS``) of the CPU that ``cpuinfo`` (the text of
    /proc/cpuinfo) describes, from its first ``flags`` line."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            words = set(line.split(":", 1)[1].split())
            return [f for f in BF16_FLAGS if f in words]
    return []


#: Where ``read_bf16_flags`` reads the CPU's description: /proc/cpuinfo, or another
#: machine's copy (the tests decide for a CPU without bfloat16 on one that has it).
CPUINFO_ENV = "DISTSEG_CPUINFO"


def read_bf16_flags(path: str | None = None) -> list[str]:
    """``bf16_flags`` of this machine (none where its description cannot be read)."""
    path = path or os.environ.get(CPUINFO_ENV, "/proc/cpuinfo")
    try:
        with open(path) as f:
            return bf16_flags(f.read())
    except OSError:
        return []


def choose(seconds: dict[str, float]) -> str:
    """bfloat16 when its step (``seconds``: precision -> a step's seconds) is at least
    ``MIN_SPEEDUP`` times faster than float32's, else float32."""
    return "bfloat16" if seconds["float32"] >= MIN_SPEEDUP * seconds["bfloat16"] else "float32"


def slowest_rank(mine: dict[str, float]) -> dict[str, float]:
    """Collective: per precision, the slowest rank's seconds of a step (a synchronous
    step lasts as long as its slowest rank): the same on every rank."""
    # Horovod: every rank's timings.
    everyone = dist.allgather_object(mine)
    return {p: max(r[p] for r in everyone) for p in mine}


@dataclasses.dataclass
class Decision:
    """What a run's start decided: the config with the precision to train in, the run
    record's ``precision`` field (None: the config named one) and, after a trial, the
    chosen precision's state and the train step it traced (static batch -> step), for
    the run to keep (None and {}: nothing was built)."""

    cfg: config_lib.Config
    record: dict | None
    state: factory.State | None = None
    traced: dict = dataclasses.field(default_factory=dict)


def _with_precision(cfg: config_lib.Config, precision: str) -> config_lib.Config:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=precision))


def _first_batch(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed):
    """This rank's first batch of the run, read by a reader of its own, and the static
    batch size the step is traced for."""
    plan = EpochPlan.of(cfg.train, len(feed.train_ids), ctx.size)
    ids = plan.batches(feed.train_ids, ctx.rank, ctx.size, 0, cfg.train.seed)[0]
    with feed.open_reader() as reader:
        images, masks = reader.read(ids)
    return images, masks, plan.static_batch(len(feed.train_ids), ctx.size)


@dataclasses.dataclass
class _Candidate:
    """One precision's state, its traced step and what its variables held when built."""

    state: tuple
    step: object
    kept: list
    seconds: list = dataclasses.field(default_factory=list)

    @property
    def variables(self) -> list:
        model, optimizer, _ = self.state
        return steps.trial_variables(model, optimizer)


def _prepare(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed, batch):
    """Collective: ``cfg``'s state, built as the run builds it, and its step, traced on
    ``batch``."""
    images, masks, static = batch
    state = factory.build_state(cfg, ctx, feed.input_shape)
    step = factory.train_step(cfg, state, feed.input_shape, ctx.size, static)
    candidate = _Candidate(state, step, [])
    candidate.kept = [v.numpy() for v in candidate.variables]
    float(step(images, masks, np.zeros(2, np.float32)).loss)  # traces the step
    return candidate


def _time_step(candidate: _Candidate, batch) -> None:
    """Collective: one more timed step of ``candidate``."""
    images, masks, _ = batch
    start = time.perf_counter()
    float(candidate.step(images, masks, np.zeros(2, np.float32)).loss)
    candidate.seconds.append(time.perf_counter() - start)


def _put_back(candidate: _Candidate) -> None:
    """The variables as built, and no memory of the trial's gradients."""
    steps.put_back(candidate.variables, candidate.kept, candidate.step)


def _trial(cfg, ctx, feed, flags: list) -> Decision:
    """Collective: both precisions timed on every rank, in alternation (a drift of a
    shared machine's speed then touches both alike); the slowest rank's decide."""
    start = time.perf_counter()
    batch = agreement.agree(_first_batch, cfg, ctx, feed)
    candidates = {p: _prepare(_with_precision(cfg, p), ctx, feed, batch)
                  for p in config_lib.PRECISIONS}
    for _ in range(TIMED_STEPS):
        for candidate in candidates.values():
            _time_step(candidate, batch)
    slowest = slowest_rank({p: statistics.median(c.seconds) for p, c in candidates.items()})
    choice = choose(slowest)
    chosen = candidates[choice]
    _put_back(chosen)
    speedup = slowest["float32"] / slowest["bfloat16"]
    record = {"requested": config_lib.AUTO, "flags": flags, "seconds": slowest,
              "speedup": speedup, "choice": choice, "steps": TIMED_STEPS,
              "trial_s": time.perf_counter() - start,
              "reason": f"bfloat16 step {speedup:.2f}x float32's "
                        f"(kept at {MIN_SPEEDUP:.2f}x or more)"}
    static = batch[2]
    return Decision(_with_precision(cfg, choice), record, chosen.state, {static: chosen.step})


def without_trial(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` where no trial can run (an elastic run, whose ranks build their state
    before they may talk): ``auto`` means float32 there."""
    return _with_precision(cfg, "float32") if cfg.model.precision == config_lib.AUTO else cfg


def decide(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed) -> Decision:
    """Collective: the precision a new run trains in; where a trial ran, the chosen
    precision's state and traced step too (nothing is built otherwise)."""
    if cfg.model.precision != config_lib.AUTO:
        return Decision(cfg, None)
    flags = read_bf16_flags()
    # Horovod: every rank's flags; one rank without bfloat16 decides for all.
    if not all(dist.allgather_object(flags)):
        chosen = _with_precision(cfg, "float32")
        record = {"requested": config_lib.AUTO, "flags": flags, "seconds": None,
                  "choice": "float32", "trial_s": 0.0,
                  "reason": "no bfloat16 flag (avx512_bf16, amx_bf16) on "
                            f"{'this' if ctx.size == 1 else 'some rank'}'s CPU: no trial"}
        return Decision(chosen, record)
    return _trial(cfg, ctx, feed, flags)
