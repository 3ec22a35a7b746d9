"""The step-time model the projection and the per-node prediction share: one training
step at R ranks and b samples per rank, fitted to the measured runs::

    t_step(R, b) = (t_compute(b)^gamma + t_allreduce(R)^gamma)^(1/gamma)
    t_compute(b) = alpha + beta b
    t_allreduce(R) = 2 (R - 1) / R * G / B  +  latency * L(R)
    t_epoch(R) = steps(R) * t_step(R, b(R))

with ``b(R)`` the per-rank batch the run's batch rule gives at ``R``
(``distseg.core.batchplan.batch_plan``: ``batch_size`` per rank, or a fixed global batch
split G/R and grown to ceil(G/R) past G ranks), ``G`` gradient bytes (parameters x 4,
float32), ``B`` the link bandwidth, ``latency`` per message and ``L(R) = 2 (R - 1)``
message rounds for a ring (``--latency-term ring``) or ``2 log2 R`` for a
tree/recursive-doubling algorithm (``--latency-term log``); ``Fabric`` holds B, the
latency and the term (``analysis.links`` says which: measured, given or assumed).
``steps(R)`` is the number of steps each rank runs per epoch, from the dataset size and
the batch, as ``distseg.data`` shards. ``t_compute(b)`` is one rank's compute per step,
Pollux's linear model (``goodput.StepTimes``), fitted to ``measured step time -
t_allreduce(R)`` at the per-rank batches the runs ran (``Point``: the median steady
training time per epoch, ``train_time``, no validation, divided by the steps per
epoch): least squares over two or more per-rank batches; with one, AdaptDL's prior
alpha = half the step time.

``gamma`` is Pollux's overlap of the allreduce with compute (``distseg.core.link``:
1, none, their sum; large, full, their max). ``fit_overlap`` fits it where the runs
can tell: more points than the compute line has parameters, at least one whose
allreduce is a tenth of its step (``MIN_SYNC_SHARE``), so that a point's compute (its step with the allreduce taken off at that
gamma) must agree with the others' line. Elsewhere it is 1, and the report says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import pandas as pd

from analysis import tables
from analysis.logfile import count, dict_field, number
from analysis.logs import RunData
from distseg.core import goodput, link
from distseg.core.batchplan import BatchPlan, batch_plan
from distseg.core.config import LR_SCALINGS, TrainConfig
from distseg.core.errors import InputError
from distseg.core.schema import epoch_samples, steps_per_epoch

LATENCY_TERMS = ("ring", "log")


@dataclass(frozen=True)
class Fabric:
    """Interconnect assumptions of the projection.

    Attributes:
      bandwidth_gbps: link bandwidth in Gbit/s (default: a 100 Gb/s fabric such as
        Omni-Path or EDR InfiniBand).
      latency_us: per-message latency in microseconds.
      latency_term: ``ring`` (2 (R-1) rounds) or ``log`` (2 log2 R rounds).
    """

    bandwidth_gbps: float = 100.0
    latency_us: float = 2.0
    latency_term: str = "ring"

    def validate(self) -> "Fabric":
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"--bandwidth-gbps must be > 0, got {self.bandwidth_gbps}")
        if not self.latency_us >= 0:
            raise ValueError(f"--latency-us must be >= 0, got {self.latency_us}")
        if self.latency_term not in LATENCY_TERMS:
            raise ValueError(f"--latency-term must be one of {LATENCY_TERMS}, "
                             f"got {self.latency_term!r}")
        return self


def allreduce_seconds(ranks: int, grad_bytes: float, fabric: Fabric) -> float:
    """Ring-allreduce time of ``grad_bytes`` over ``ranks`` ranks on ``fabric``
    (``link.sync_seconds``, its latency paid 2 (R - 1) or 2 log2 R times; 0 for one rank)."""
    if ranks <= 1:
        return 0.0
    rounds = link.ring_rounds(ranks) if fabric.latency_term == "ring" else 2.0 * math.log2(ranks)
    return link.sync_seconds(grad_bytes, ranks, fabric.bandwidth_gbps, fabric.latency_us, rounds)


def grad_bytes_of(runs: Sequence[RunData], override: float | None) -> tuple[float | None, str]:
    """Gradient bytes: ``--grad-bytes``, else ``link.gradient_bytes`` of the logged
    parameter count."""
    if override:
        return float(override), "--grad-bytes"
    for run in runs:
        model = dict_field(run.run_record, "model")
        if model and model.get("params"):
            return (link.gradient_bytes(float(model["params"])),
                    f"{int(model['params']):,} parameters x 4 bytes")
    return None, "unknown"


def train_config(run: RunData) -> tuple[TrainConfig, str]:
    """The run's train settings and where they come from: its ``config.json``'s
    ``train`` (the fields this distseg knows), else what its run record says (batch per
    rank or a fixed global batch, ``lr_base``, ``lr_scaling``)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    train = (run.config or {}).get("train")
    if isinstance(train, dict):
        try:
            return (TrainConfig(**{k: v for k, v in train.items() if k in known}),
                    f"{run.label}'s config.json")
        except (TypeError, ValueError):
            pass
    rec = run.run_record
    fixed = count(rec.get("global_batch_size")) if rec.get("batch_plan") == "global" else 0
    lr = number(rec.get("lr_base"))
    return (TrainConfig(batch_size=count(rec.get("batch_size")) or 1, global_batch=fixed or 0,
                        lr=lr if math.isfinite(lr) else TrainConfig.lr,
                        lr_scaling=(rec.get("lr_scaling") if rec.get("lr_scaling") in LR_SCALINGS
                                    else "linear")),
            f"{run.label}'s run record (no readable config.json)")


def policy_of(train: TrainConfig | None) -> str:
    """``train.batch_policy`` (``fixed`` without a train config)."""
    return train.batch_policy if train is not None else "fixed"


@dataclass(frozen=True)
class Point:
    """One measured run (at one per-rank batch) the model is fitted to.

    Attributes:
      run: its label.
      ranks / nodes: its size.
      epoch_s: median steady training time per epoch.
      steps: steps per epoch each rank ran.
      train_samples / batch_size: its dataset size and per-rank batch (run record).
      capped: whether ``max_steps_per_epoch`` cut its epochs short.
      per_rank: the mean per-rank batch its steps trained on where that is not
        ``batch_size`` (remainder batches, or a batch the ``goodput`` policy chose).
      link: the link its own ranks measured (its run record's ``link``, a host's own
        path included), which its allreduce is taken off its steps with; None: not
        measured (the projection's link is used).
    """

    run: str
    ranks: int
    nodes: int
    epoch_s: float
    steps: int
    train_samples: int
    batch_size: int
    capped: bool
    per_rank: float | None = None
    link: Fabric | None = None

    @property
    def step_s(self) -> float:
        return self.epoch_s / self.steps

    @property
    def batch(self) -> float:
        """The per-rank batch its steps ran (mean over the steps)."""
        return self.batch_size if self.per_rank is None else self.per_rank


def _run_points(run: RunData, n_train: int, spe: int, batch: int) -> list[Point]:
    """One point per per-rank batch ``run``'s steady epochs ran (one, unless the
    ``goodput`` policy changed it): median training time and steps of those epochs."""
    rows = tables.epoch_batches(run)
    steady = rows[~rows["warmup"].astype(bool)] if (~rows["warmup"].astype(bool)).any() else rows
    steady = steady.assign(per_rank=steady["per_rank"].astype(float).fillna(batch).round(6))
    fixed = batch_plan(train_config(run)[0], run.ranks).cut_global
    capped = spe < steps_per_epoch(n_train, run.ranks, batch, fixed)
    points, link = [], own_link(run)
    for per_rank, group in steady.groupby("per_rank", sort=False):
        steps = float(group["steps"].median())
        if not (math.isfinite(steps) and steps > 0):
            continue
        points.append(Point(run=run.label, ranks=run.ranks, nodes=run.nodes or 1,
                            epoch_s=float(group["train_s"].median()), steps=int(round(steps)),
                            train_samples=n_train, batch_size=batch, capped=capped,
                            per_rank=None if per_rank == batch else float(per_rank),
                            link=link))
    return points


def own_link(run: RunData) -> Fabric | None:
    """The link ``run``'s ranks measured at its start as a ``Fabric`` (ring), or None
    where it logged none or no bandwidth."""
    link = run.run_record.get("link") or {}
    if not link.get("bandwidth_gbps"):
        return None
    return Fabric(float(link["bandwidth_gbps"]), float(link.get("latency_us") or 0.0), "ring")


def fit_points(runs: Sequence[RunData], tpe: pd.DataFrame) -> list[Point]:
    """The runs that can be fitted (a finished epoch and the run record's sizes), one
    point per per-rank batch each ran."""
    points = []
    for run in runs:
        row = tpe[tpe["run"] == run.label].iloc[0]
        rec, n_train = run.run_record, run.train_samples
        spe = rec.get("steps_per_epoch")
        if not (math.isfinite(row["median_train_s"]) and spe and n_train
                and rec.get("batch_size")):
            continue
        try:
            points += _run_points(run, n_train, int(spe), int(rec["batch_size"]))
        except InputError:  # a config.json its own ranks cannot share: not fitted
            continue
    return points


class Shape(NamedTuple):
    """One epoch at a number of ranks and a per-rank batch (``EpochModel.shape``).

    Attributes:
      plan: the batch plan (``None``: the ranks cannot share the fixed global batch).
      steps, samples: steps per rank and samples of all ranks per epoch.
      mean_batch: the mean per-rank batch of a step (remainder batches included).
      why: ``infeasible: ...`` where the ranks cannot train on the dataset, else "".
    """

    plan: BatchPlan | None
    steps: int
    samples: int
    mean_batch: float
    why: str


@dataclass(frozen=True)
class EpochModel:
    """The fitted model of one training epoch at any number of ranks.

    Attributes:
      compute_s: one rank's fitted compute time per step at ``batch_size`` per rank.
      grad_bytes: gradient bytes allreduced per step.
      fabric: bandwidth and latency assumptions.
      train_samples / batch_size: the dataset and per-rank batch (from the base run).
      cap: steps per epoch when the measured runs were capped, else ``None``.
      per_sample_s: beta, the compute seconds one more sample per rank adds to a step
        (0: the same at any batch); the line is t(b) = compute_s + beta (b - batch_size).
      train: the batch and lr rule (the base run's); ``None``: ``batch_size`` per rank
        at any number of ranks.
      batches: the per-rank batches the fit measured.
      train_source: where ``train`` comes from.
      gamma: the overlap of the allreduce with compute in a step (``link.step_seconds``).
      gamma_points: the measured points with an allreduce ``gamma`` was fitted to (0:
        not fitted, the runs cannot tell, and 1, no overlap, is assumed).
    """

    compute_s: float
    grad_bytes: float
    fabric: Fabric
    train_samples: int
    batch_size: int
    cap: int | None
    per_sample_s: float = 0.0
    train: TrainConfig | None = None
    batches: tuple[float, ...] = ()
    train_source: str = ""
    gamma: float = link.NO_OVERLAP
    gamma_points: int = 0

    @property
    def alpha(self) -> float:
        return self.compute_s - self.per_sample_s * self.batch_size

    def compute(self, per_rank: float) -> float:
        """One rank's compute seconds per step at ``per_rank`` samples (at least 0)."""
        return max(self.compute_s + self.per_sample_s * (per_rank - self.batch_size), 0.0)

    def plan(self, ranks: int, per_rank: int | None = None) -> BatchPlan:
        """``batch_plan`` of the model's rule at ``ranks`` (``per_rank``: a chosen batch).

        Raises:
          InputError: a strict fixed global batch ``ranks`` cannot share.
        """
        return batch_plan(self.train or TrainConfig(batch_size=self.batch_size), ranks, per_rank)

    def shape(self, ranks: int, per_rank: int | None = None) -> Shape:
        """Steps and samples of one epoch at ``ranks`` (``per_rank``: a chosen batch)."""
        try:
            plan = self.plan(ranks, per_rank)
        except InputError as e:
            return Shape(None, 0, 0, math.nan, f"infeasible: {e}")
        n = self.train_samples
        steps = steps_per_epoch(n, ranks, plan.per_rank, plan.cut_global)
        samples = epoch_samples(n, ranks, plan.per_rank, plan.cut_global)
        if self.cap:
            steps = min(steps, self.cap)
            samples = min(samples, steps * plan.global_batch)
        why = ("" if n >= ranks * plan.per_rank else
               f"infeasible: {n} samples < ranks x batch = {ranks} x {plan.per_rank}")
        mean = samples / (steps * ranks) if steps else float(plan.per_rank)
        return Shape(plan, steps, samples, mean, why)

    def step(self, ranks: int, per_rank: int | None = None) -> float:
        """Seconds per step at ``ranks``: compute at the mean per-rank batch and the
        allreduce, overlapped by ``gamma``."""
        shape = self.shape(ranks, per_rank)
        if shape.plan is None:
            return math.nan
        return link.step_seconds(self.compute(shape.mean_batch),
                                 allreduce_seconds(ranks, self.grad_bytes, self.fabric), self.gamma)

    def seconds(self, ranks: int, per_rank: int) -> float | None:
        """``step`` where ``ranks`` can train on the dataset at ``per_rank``, else
        ``None`` (``goodput.choose``'s step-time callable, with ``ranks`` bound)."""
        shape = self.shape(ranks, per_rank)
        return None if shape.plan is None or shape.why else self.step(ranks, per_rank)

    def epoch(self, ranks: int, per_rank: int | None = None) -> tuple[float, float, int]:
        """``(epoch seconds, allreduce seconds per step, steps per epoch)`` at ``ranks``."""
        steps = self.shape(ranks, per_rank).steps
        comm = allreduce_seconds(ranks, self.grad_bytes, self.fabric)
        return steps * self.step(ranks, per_rank), comm, steps

    def throughput(self, ranks: int, per_rank: int | None = None) -> float:
        """Training samples per second at ``ranks``: an epoch's samples (the dataset as
        ``distseg.data`` shards it, or the capped steps' batches) / its seconds."""
        samples = self.shape(ranks, per_rank).samples
        epoch_s = self.epoch(ranks, per_rank)[0]
        return samples / epoch_s if epoch_s > 0 else math.nan


#: The least share of a measured step its allreduce must take for the step to tell
#: gamma: below it (a run on one host's fast path: a few ms of a 0.5 s step) the
#: step-to-step noise, not the overlap, would decide the fit, and a gamma fitted to
#: noise can claim an overlap distseg's step does not have (it allreduces after the
#: whole backward pass) on a slower projected link.
MIN_SYNC_SHARE = 0.1


def point_sync(p: Point, grad_bytes: float, fabric: Fabric) -> float:
    """The allreduce seconds of a step of ``p``, modelled on the link its own ranks
    measured (a run on one host went through that host's path, not the network
    projected), else on ``fabric``."""
    return allreduce_seconds(p.ranks, grad_bytes, p.link or fabric)


def step_times(points: Sequence[Point], grad_bytes: float, fabric: Fabric,
               gamma: float = 1.0) -> goodput.StepTimes:
    """Compute seconds per step at each per-rank batch measured: each point's step time
    with its allreduce (``point_sync``) taken off at overlap ``gamma`` (at least 0).
    Keys are the mean per-rank batches as they ran (remainder batches make them
    fractional), not rounded as ``StepTimes.add`` does."""
    times = goodput.StepTimes()
    for p in points:
        entry = times.sums.setdefault(p.batch, [0, 0.0])
        entry[0] += 1
        entry[1] += link.compute_seconds(p.step_s, point_sync(p, grad_bytes, fabric), gamma)
    return times


def overlap_error(points: Sequence[Point], grad_bytes: float, fabric: Fabric,
                  gamma: float) -> float:
    """Sum of squared log errors of the points' steps as modelled at ``gamma``: the
    compute line fitted at that gamma, each point's allreduce put back."""
    alpha, beta = step_times(points, grad_bytes, fabric, gamma).fit()
    error = 0.0
    for p in points:
        modelled = link.step_seconds(max(alpha + beta * p.batch, 0.0),
                                     point_sync(p, grad_bytes, fabric), gamma)
        error += math.log(max(modelled, 1e-12) / p.step_s) ** 2
    return error


def fit_overlap(points: Sequence[Point], grad_bytes: float, fabric: Fabric) -> tuple[float, int]:
    """``(gamma, points with an allreduce)``: the gamma of ``link.GAMMA_GRID`` whose
    model fits the points best (``overlap_error``; a tie keeps the smaller), or
    ``(1.0, 0)`` where the runs cannot tell: no point's allreduce is ``MIN_SYNC_SHARE``
    of its step, or there are no more points than the compute line has parameters (1
    for one per-rank batch, 2 for several), so any gamma fits them exactly."""
    synced = sum(1 for p in points
                 if point_sync(p, grad_bytes, fabric) >= MIN_SYNC_SHARE * p.step_s)
    parameters = 1 if len({p.batch for p in points}) < 2 else 2
    if not synced or len(points) <= parameters:
        return link.NO_OVERLAP, 0
    best, best_error = 1.0, math.inf
    for gamma in link.GAMMA_GRID:
        error = overlap_error(points, grad_bytes, fabric, gamma)
        if error < best_error * (1 - 1e-9) - 1e-15:
            best, best_error = gamma, error
    return best, synced


def fit(points: Sequence[Point], grad_bytes: float, fabric: Fabric,
        train: TrainConfig | None = None, train_source: str = "") -> EpochModel:
    """The overlap ``fit_overlap`` finds and the compute line ``goodput.StepTimes.fit``
    gives the points' compute times at that overlap (least squares over two or more
    per-rank batches; one batch: alpha = half its time); the dataset, batch and step
    cap of the run with the fewest ranks."""
    gamma, gamma_points = fit_overlap(points, grad_bytes, fabric)
    times = step_times(points, grad_bytes, fabric, gamma)
    alpha, beta = times.fit()
    base = min(points, key=lambda p: p.ranks)
    return EpochModel(compute_s=max(alpha + beta * base.batch_size, 0.0), grad_bytes=grad_bytes,
                      fabric=fabric, train_samples=base.train_samples,
                      batch_size=base.batch_size, cap=base.steps if base.capped else None,
                      per_sample_s=beta, train=train, batches=tuple(times.means()),
                      train_source=train_source, gamma=gamma, gamma_points=gamma_points)


def rule_text(model: EpochModel) -> str:
    """The batch rule in words: ``2 per rank per step``, or the fixed global batch's."""
    t = model.train
    if t is None or not t.global_batch:
        return f"{model.batch_size} per rank per step"
    grows = (f", grown past G ranks to ceil(G/R) per rank with the lr x "
             f"{t.grown_lr_scaling} of the growth" if t.global_batch_grows else "")
    return f"a fixed global batch G = {t.global_batch} split G/R per rank{grows}"
