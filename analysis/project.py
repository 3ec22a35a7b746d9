"""Projection beyond the measured node counts: time per epoch, time to target, and per
node count the batch, lr, throughput, samples and hours to each target.

A deliberately simple model, fitted to the measured runs and labelled as a projection
(or prediction) wherever it is shown::

    t_step(R, b) = t_compute(b) + t_allreduce(R)
    t_compute(b) = alpha + beta b
    t_allreduce(R) = 2 (R - 1) / R * G / B  +  latency * L(R)
    t_epoch(R) = steps(R) * t_step(R, b(R))

with ``R`` ranks, ``b(R)`` the per-rank batch the run's batch rule gives at ``R``
(``distseg.core.config.batch_plan``: ``batch_size`` per rank, or a fixed global batch
split G/R and grown to ceil(G/R) past G ranks), ``G`` gradient bytes (parameters x 4,
float32), ``B`` the link bandwidth, ``latency`` per message and ``L(R) = 2 (R - 1)``
message rounds for a ring (``--latency-term ring``) or ``2 log2 R`` for a
tree/recursive-doubling algorithm (``--latency-term log``). ``steps(R)`` is the number
of steps each rank runs per epoch, from the dataset size and the batch, as
``distseg.data`` shards. ``t_compute(b)`` is one rank's compute per step, Pollux's
linear model (``goodput.StepTimes``), fitted to ``measured step time - t_allreduce(R)``
at the per-rank batches the runs ran (the median steady training time per epoch,
``train_time``, no validation, divided by the steps per epoch): least squares over two
or more per-rank batches; with one, AdaptDL's prior alpha = half the step time, an
assumption the lines printed with the table name. Residuals at the measured points are
shown so the fit can be judged.

With targets, time to each target is projected too: the base's measured time divided
by the model's throughput speedup and a statistical efficiency (``analysis.stateff``:
a trend over ranks where measured at enough rank counts, else assumed 1 and flagged;
predicted from the gradient noise scale where the runs measured it, ``analysis.noise``).

Per node count (``node_rows``) the prediction is built from the parts: the batch and lr
the run's rule (or the ``goodput`` policy, ``goodput.choose`` with this model as its
step time) would use, throughput from the model, samples to each target from the base
run's noise scale averaged over its training (``noise.History``), and hours = samples /
throughput; beside the measured value wherever a run ran at that count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd

from analysis import noise, stateff, tables
from analysis.document import Note, Projection
from analysis.logfile import count, dict_field, number
from analysis.logs import RunData
from analysis.noise import History
from analysis.stateff import Scaled
from distseg.core import goodput
from distseg.core.config import LR_SCALINGS, BatchPlan, TrainConfig, batch_plan
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
    """Ring-allreduce time of ``grad_bytes`` over ``ranks`` ranks (0 for one rank)."""
    if ranks <= 1:
        return 0.0
    bandwidth = fabric.bandwidth_gbps * 1e9 / 8.0
    rounds = 2.0 * (ranks - 1) if fabric.latency_term == "ring" else 2.0 * math.log2(ranks)
    return 2.0 * (ranks - 1) / ranks * grad_bytes / bandwidth + fabric.latency_us * 1e-6 * rounds


def grad_bytes_of(runs: Sequence[RunData], override: float | None) -> tuple[float | None, str]:
    """Gradient bytes: ``--grad-bytes``, else the logged parameter count x 4."""
    if override:
        return float(override), "--grad-bytes"
    for run in runs:
        model = dict_field(run.run_record, "model")
        if model and model.get("params"):
            return 4.0 * float(model["params"]), f"{int(model['params']):,} parameters x 4 bytes"
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
    fixed = count(rec.get("global_batch_size")) if rec.get("batch_policy") == "global" else 0
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
    fixed = batch_plan(train_config(run)[0], run.ranks).fixed
    capped = spe < steps_per_epoch(n_train, run.ranks, batch, fixed)
    points = []
    for per_rank, group in steady.groupby("per_rank", sort=False):
        steps = float(group["steps"].median())
        if not (math.isfinite(steps) and steps > 0):
            continue
        points.append(Point(run=run.label, ranks=run.ranks, nodes=run.nodes or 1,
                            epoch_s=float(group["train_s"].median()), steps=int(round(steps)),
                            train_samples=n_train, batch_size=batch, capped=capped,
                            per_rank=None if per_rank == batch else float(per_rank)))
    return points


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
        steps = steps_per_epoch(n, ranks, plan.per_rank, plan.fixed)
        samples = epoch_samples(n, ranks, plan.per_rank, plan.fixed)
        if self.cap:
            steps = min(steps, self.cap)
            samples = min(samples, steps * plan.global_batch)
        why = ("" if n >= ranks * plan.per_rank else
               f"infeasible: {n} samples < ranks x batch = {ranks} x {plan.per_rank}")
        mean = samples / (steps * ranks) if steps else float(plan.per_rank)
        return Shape(plan, steps, samples, mean, why)

    def step(self, ranks: int, per_rank: int | None = None) -> float:
        """Seconds per step at ``ranks``: compute at the mean per-rank batch + allreduce."""
        shape = self.shape(ranks, per_rank)
        if shape.plan is None:
            return math.nan
        return self.compute(shape.mean_batch) + allreduce_seconds(ranks, self.grad_bytes,
                                                                  self.fabric)

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


def step_times(points: Sequence[Point], grad_bytes: float, fabric: Fabric) -> goodput.StepTimes:
    """Compute seconds per step at each per-rank batch measured: each point's step time
    less the modelled allreduce (at least 0). Keys are the mean per-rank batches as they
    ran (remainder batches make them fractional), not rounded as ``StepTimes.add`` does."""
    times = goodput.StepTimes()
    for p in points:
        entry = times.sums.setdefault(p.batch, [0, 0.0])
        entry[0] += 1
        entry[1] += max(p.step_s - allreduce_seconds(p.ranks, grad_bytes, fabric), 0.0)
    return times


def fit(points: Sequence[Point], grad_bytes: float, fabric: Fabric,
        train: TrainConfig | None = None, train_source: str = "") -> EpochModel:
    """The compute line ``goodput.StepTimes.fit`` gives the points' compute times (least
    squares over two or more per-rank batches; one batch: alpha = half its time); the
    dataset, batch and step cap of the run with the fewest ranks."""
    times = step_times(points, grad_bytes, fabric)
    alpha, beta = times.fit()
    base = min(points, key=lambda p: p.ranks)
    return EpochModel(compute_s=max(alpha + beta * base.batch_size, 0.0), grad_bytes=grad_bytes,
                      fabric=fabric, train_samples=base.train_samples,
                      batch_size=base.batch_size, cap=base.steps if base.capped else None,
                      per_sample_s=beta, train=train, batches=tuple(times.means()),
                      train_source=train_source)


def _ran(p: Point) -> int | None:
    """The per-rank batch ``p`` ran where it is a whole batch other than the configured
    one (the ``goodput`` policy's choice); ``None`` for the configured one or a mean of
    remainder batches."""
    if p.per_rank is None or p.per_rank != round(p.per_rank):
        return None
    return int(round(p.per_rank))


def measured_rows(points: Sequence[Point], model: EpochModel, base: Point) -> list[dict]:
    """One row per measured point: its time beside the model's, and its efficiency."""
    rows = []
    for p in points:
        epoch_m, comm, _ = model.epoch(p.ranks, _ran(p))
        rows.append({"kind": "measured", "run": p.run, "nodes": p.nodes, "ranks": p.ranks,
                     "per_rank_batch": _ran(p) or p.batch_size, "steps_per_epoch": p.steps,
                     "step_s": p.step_s,
                     "allreduce_s": comm, "epoch_s": p.epoch_s, "model_epoch_s": epoch_m,
                     "residual_s": p.epoch_s - epoch_m,
                     "efficiency": base.epoch_s * base.ranks / (p.epoch_s * p.ranks),
                     "note": ""})
    return rows


def infeasible(model: EpochModel, ranks: int) -> str:
    """Why ``ranks`` cannot train on the model's dataset ("" when they can)."""
    return model.shape(ranks).why


def projected_rows(nodes: Sequence[int], ranks_per_node: int, model: EpochModel,
                   base: Point) -> list[dict]:
    """One row per projected node count; efficiency against the model's base run."""
    base_model = model.epoch(base.ranks)[0]
    rows = []
    for n in nodes:
        ranks = int(n) * ranks_per_node
        shape = model.shape(ranks)
        epoch_m, comm, steps = model.epoch(ranks)
        rows.append({"kind": "projection", "run": f"projected {n} nodes", "nodes": int(n),
                     "ranks": ranks,
                     "per_rank_batch": shape.plan.per_rank if shape.plan else math.nan,
                     "steps_per_epoch": steps, "step_s": model.step(ranks), "allreduce_s": comm,
                     "epoch_s": epoch_m, "model_epoch_s": epoch_m, "residual_s": math.nan,
                     "efficiency": (base_model * base.ranks / (epoch_m * ranks) if epoch_m > 0
                                    else math.nan),
                     "note": shape.why})
    return rows


def rule_text(model: EpochModel) -> str:
    """The batch rule in words: ``2 per rank per step``, or the fixed global batch's."""
    t = model.train
    if t is None or not t.global_batch:
        return f"{model.batch_size} per rank per step"
    grows = (f", grown past G ranks to ceil(G/R) per rank with the lr x "
             f"{t.grown_lr_scaling} of the growth" if t.global_batch_grows else "")
    return f"a fixed global batch G = {t.global_batch} split G/R per rank{grows}"


def compute_line(model: EpochModel, assumed: bool) -> str:
    """How ``t_compute(b)`` was fitted; ``assumed``: AdaptDL's prior decides some
    projected time (a per-rank batch other than the one measured)."""
    line = f"t_compute(b) = {model.alpha:.4g} + {model.per_sample_s:.4g} x b s per step"
    batches = ", ".join(f"{b:g}" for b in model.batches)
    if len(model.batches) > 1:
        return (f"{line} at b samples per rank (Pollux's compute model): least squares over "
                f"the per-rank batches measured ({batches}) of step time - modelled allreduce.")
    if not model.batches:
        return f"{line}: the same compute at every per-rank batch."
    if not assumed:
        return (f"{line}: one per-rank batch measured ({batches}), and every projected "
                "count runs it, so alpha's split does not enter the projection.")
    return (f"{line}: one per-rank batch measured ({batches}), so alpha = half its compute "
            "time is ASSUMED (AdaptDL's prior: optimistic about larger per-rank batches, "
            "pessimistic about smaller); the projected counts that run another per-rank "
            "batch rest on it. Measure a second batch to fit the line.")


def assumptions(model: EpochModel, n_points: int, g_source: str, rpn: int,
                rpn_given: bool, base: Point, assumed: bool = False) -> list[str]:
    """The lines printed with the table; the first labels it a projection."""
    fabric, cap = model.fabric, model.cap
    rounds = "2(R-1)" if fabric.latency_term == "ring" else "2 log2 R"
    fitted = (f"t_compute = {model.compute_s:.4g} s per step: the mean over {n_points} measured "
              "run(s) of (median steady training time per epoch / steps per epoch - modelled "
              "allreduce time). Validation is not modelled: epoch_s is training time only."
              if len(model.batches) <= 1 else
              f"t_compute = {model.compute_s:.4g} s per step at {model.batch_size} per rank "
              f"(the line below, fitted to {n_points} measured point(s) of median steady "
              "training time per epoch / steps per epoch - modelled allreduce time). "
              "Validation is not modelled: epoch_s is training time only.")
    return [
        "PROJECTION from a model, not a measurement.",
        f"t_step = t_compute + 2(R-1)/R x G/B + latency x {rounds}"
        f" for R ranks (ring allreduce of one fused gradient buffer per step).",
        fitted,
        f"G = {model.grad_bytes:,.0f} gradient bytes ({g_source}); B = "
        f"{fabric.bandwidth_gbps:g} Gb/s; latency = {fabric.latency_us:g} us per message.",
        f"{rpn} rank(s) per node (from "
        f"{'--ranks-per-node' if rpn_given else 'the largest measured run'}); "
        "every rank's link is assumed to run at B (no NIC sharing, no faster intra-node path, "
        "no overlap of communication with compute).",
        f"Dataset of {model.train_samples} train samples, {rule_text(model)} (strong scaling: "
        "the epoch is split over more ranks)" + (f", capped at {cap} steps per epoch." if cap
                                                 else "."),
        f"Efficiency is against {base.run} ({base.ranks} rank(s)): measured rows use "
        "measured times, projected rows the model's time for that run.",
        compute_line(model, assumed),
    ]


def scaled(efficiency: pd.DataFrame, model: EpochModel, nodes: Sequence[int], rpn: int,
           base_ranks: int) -> list[Scaled]:
    """The measured runs (their measured throughput speedup, ``tables.scaling``'s) and
    the projected node counts (the model's, against ``base_ranks``)."""
    runs = efficiency.drop_duplicates("run")
    out = [Scaled("measured", str(r["run"]), None if pd.isna(r["nodes"]) else int(r["nodes"]),
                  int(r["ranks"]), float(r["throughput_speedup"])) for _, r in runs.iterrows()]
    base_x = model.throughput(base_ranks)
    for n in nodes:
        ranks = int(n) * rpn
        out.append(Scaled("projection", f"projected {n} nodes", int(n), ranks,
                          model.throughput(ranks) / base_x, infeasible(model, ranks)))
    return out


def noise_lines(priors: Mapping, model: EpochModel) -> list[str]:
    """The assumption lines of targets predicted from the noise scale (none without)."""
    if not priors:
        return []
    return [f"Where the runs measured the gradient noise scale near a target, its "
            "projected statistical efficiency is PREDICTED from it instead of the trend: "
            "(B_noise + B0) / (B_noise + B(R)), B0 the base run's global batch, B(R) the "
            f"throughput model's global batch ({rule_text(model)}), B_noise as named below "
            "(analysis/noise.py, docs/report.md)."]


def global_batch_at(model: EpochModel, ranks: int) -> float:
    """The global batch the model's rule runs at ``ranks`` (NaN where it cannot)."""
    shape = model.shape(ranks)
    return float(shape.plan.global_batch) if shape.plan is not None else math.nan


def target_projection(efficiency: pd.DataFrame, model: EpochModel, nodes: Sequence[int],
                      rpn: int, priors: Mapping | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Projected time to each target (``stateff.project_rows``) and the lines that say
    how; empty when no target was given or no run is the base of one. ``priors``:
    (metric, target) -> ``noise.NoisePrior``, the targets predicted from the noise scale."""
    if not len(efficiency):
        return pd.DataFrame(columns=stateff.PROJECT_COLUMNS), []
    base_run = str(efficiency["base"].iloc[0])
    base_ranks = int(efficiency.loc[efficiency["run"] == base_run, "ranks"].iloc[0])
    rows, lines = stateff.project_rows(
        efficiency, scaled(efficiency, model, nodes, rpn, base_ranks), base_ranks, priors,
        functools.partial(global_batch_at, model))
    return rows, [
        "PROJECTION to target from models, not a measurement.",
        f"hours(R) = hours of {base_run} to the target (measured) / (throughput speedup(R) "
        "x statistical efficiency(R)); throughput speedup from the time-per-epoch model "
        f"above (samples per epoch / t_epoch, against {base_ranks} rank(s)); warm-up, "
        "validation and restarts are assumed to scale like training.",
        "statistical efficiency(R) = a + b x log2(R), least squares over the base (1) and "
        "the runs that reached the target, clipped to at most 1; none projected where the "
        f"line reaches 0; fitted only with {stateff.TREND_POINTS} or more rank counts "
        "besides the base's.", *noise_lines(priors, model), *lines]


# ------------------------------------------------------------------ per node count

NODE_COLUMNS = ["kind", "run", "metric", "target", "nodes", "ranks", "batch_policy", "lr_rule",
                "predicted_per_rank_batch", "measured_per_rank_batch", "predicted_global_batch",
                "measured_global_batch", "predicted_lr", "measured_lr", "predicted_step_s",
                "measured_step_s", "predicted_throughput", "measured_throughput",
                "predicted_samples", "measured_samples", "predicted_hours", "measured_hours",
                "measured_train_hours", "note"]


def lr_at(train: TrainConfig, plan: BatchPlan, g2: float | None, trace: float | None) -> float:
    """The lr the rule sets after the warm-up: ``train.lr`` x the plan's factor; with
    the ``gain`` rule x sqrt(gain) of the global batch over the base at the noise scale
    (``goodput.gain``; 1 before any estimate)."""
    if plan.lr_scaling == "gain":
        return train.lr * math.sqrt(goodput.gain(plan.global_batch, plan.base, g2, trace))
    return train.lr * plan.lr_factor


def batch_path(model: EpochModel, ranks: int, hist: History | None) -> list[int]:
    """The per-rank batch of each stretch of ``hist`` at ``ranks``: the config's batch;
    under the ``goodput`` policy, from the second stretch on, ``goodput.choose``'s at the
    end of the stretch before (the loop decides at an epoch's end for the next), with
    this model's step time and that stretch's noise scale."""
    plan = model.plan(ranks)
    path = [plan.per_rank]
    if hist is None:
        return path
    if policy_of(model.train) != "goodput":
        return path * len(hist.samples)
    options = goodput.candidates(ranks, plan.base, model.train.max_batch_per_rank)
    seconds = functools.partial(model.seconds, ranks)
    for g2, trace in zip(hist.g2[:-1], hist.trace[:-1]):
        path.append(goodput.choose(path[-1], options, ranks, plan.base, seconds, g2,
                                   trace).per_rank)
    return path


def _to_target(model: EpochModel, ranks: int, hist: History, path: Sequence[int]) -> dict:
    """Predicted samples and hours to the target: each stretch of ``hist`` at the global
    batch its per-rank batch in ``path`` runs, at the model's throughput there."""
    shapes = [model.shape(ranks, b) for b in path]
    samples = hist.stretch_samples([s.samples / s.steps if s.steps else math.nan
                                    for s in shapes])
    seconds = sum(n / model.throughput(ranks, b) for n, b in zip(samples, path))
    return {"predicted_samples": float(sum(samples)), "predicted_hours": seconds / 3600.0}


def predict(model: EpochModel, ranks: int, hist: History | None, target: bool) -> dict:
    """The predicted columns of ``NODE_COLUMNS`` at ``ranks``: the batch and lr in force
    at the end of ``hist`` (the target, or the base run's end), step time and
    throughput there, and with a ``target`` and a ``hist`` the samples and hours to it."""
    shape = model.shape(ranks)
    if shape.plan is None or shape.why:
        return {"predicted_per_rank_batch": shape.plan.per_rank if shape.plan else math.nan,
                "predicted_global_batch": shape.plan.global_batch if shape.plan else math.nan,
                "lr_rule": shape.plan.lr_scaling if shape.plan else "", "note": shape.why}
    path = batch_path(model, ranks, hist)
    plan = model.plan(ranks, path[-1])
    g2, trace = (hist.g2[-1], hist.trace[-1]) if hist is not None else (None, None)
    out = {"predicted_per_rank_batch": plan.per_rank, "predicted_global_batch": plan.global_batch,
           "lr_rule": plan.lr_scaling, "predicted_lr": lr_at(model.train, plan, g2, trace),
           "predicted_step_s": model.step(ranks, path[-1]),
           "predicted_throughput": model.throughput(ranks, path[-1]), "note": ""}
    if len(set(path)) > 1:
        out["note"] = "goodput: per-rank batch by epoch " + ", ".join(map(str, path))
    if target and hist is not None:
        out.update(_to_target(model, ranks, hist, path))
    return out


def measured_values(run: RunData, points: Sequence[Point], tpe: pd.DataFrame) -> dict:
    """The measured columns of ``NODE_COLUMNS`` that do not depend on a target: the
    batch of its last epoch, the lr of its last step, its step time at that batch (its
    point's) and its steady throughput (``tables.time_per_epoch``)."""
    rows = tables.epoch_batches(run)
    lr = (run.curve["lr"].astype(float).dropna() if "lr" in run.curve.columns
          else pd.Series(dtype=float))
    last = rows.iloc[-1] if len(rows) else pd.Series({"per_rank": math.nan,
                                                      "global_batch": math.nan})
    mine = [p for p in points if p.run == run.label]
    at_last = [p for p in mine if abs(p.batch - last["per_rank"]) < 1e-6] or mine
    return {"measured_per_rank_batch": last["per_rank"],
            "measured_global_batch": last["global_batch"],
            "measured_lr": float(lr.iloc[-1]) if len(lr) else math.nan,
            "measured_step_s": at_last[-1].step_s if at_last else math.nan,
            "measured_throughput": float(tpe.loc[tpe["run"] == run.label,
                                                 "throughput_samples_s"].iloc[0])}


def train_hours_to(run: RunData, samples: float) -> float:
    """Hours of training (the epochs' ``train_time``, warm-up included) until ``run``
    had trained on ``samples``: each epoch in full before, the epoch it happened in in
    proportion to its samples; NaN past the last finished epoch."""
    rows = tables.epoch_batches(run)
    ends = rows["end_samples"].to_numpy(float)
    if not len(rows) or not samples <= ends[-1]:
        return math.nan
    starts = np.concatenate(([0.0], ends[:-1]))
    width = np.maximum(ends - starts, 1e-12)  # an epoch of no samples adds nothing
    share = np.clip((samples - starts) / width, 0.0, 1.0)
    return float((share * rows["train_s"].to_numpy(float)).sum()) / 3600.0


def measured_target(group: pd.DataFrame | None, run: RunData | None) -> tuple[dict, str]:
    """The run's measured samples and hours to the target (``stateff.efficiency_table``
    row) and its training hours to it (``train_hours_to``), or a note where it did not
    reach it."""
    mine = group[group["run"] == run.label] if group is not None and run is not None else None
    if mine is None or not len(mine):
        return {}, ""
    row = mine.iloc[0]
    if not row["reached"]:
        return {}, f"{run.label}: not reached ({row['samples_text']} samples)"
    return {"measured_samples": float(row["samples"]), "measured_hours": float(row["hours"]),
            "measured_train_hours": train_hours_to(run, float(row["samples"]))}, ""


@dataclass(frozen=True)
class Count:
    """One row's size in the node table: a measured run, or a projected node count."""

    kind: str
    run: str
    nodes: int | None
    ranks: int


def counts(runs: Sequence[RunData], points: Sequence[Point], nodes: Sequence[int],
           rpn: int) -> list[Count]:
    """The measured runs that were fitted, then each projected node count whose ranks
    no measured run ran at (that run's row carries the prediction beside it)."""
    fitted = {p.run for p in points}
    out = [Count("measured", r.label, r.nodes, r.ranks) for r in runs if r.label in fitted]
    measured_ranks = {c.ranks for c in out}
    out += [Count("projection", f"projected {n} nodes", int(n), int(n) * rpn) for n in nodes
            if int(n) * rpn not in measured_ranks]
    return out


def _goal(metric: str, target: float) -> str:
    return f"{metric} {stateff.comparison(metric)} {target:g}"


def history_line(metric: str | None, target: float | None, hist: History | None,
                 why: str) -> str:
    """Where one target's predicted samples come from (or why there are none)."""
    goal = _goal(metric, target) if metric is not None else "without a target"
    if hist is None:
        return f"{goal}: no samples predicted: {why}."
    batches = ", ".join(f"{b:g}" for b in dict.fromkeys(hist.batch))
    return (f"{goal}: samples PREDICTED from {hist.run}'s history of the noise scale: "
            f"{len(hist.samples)} epoch(s), {hist.total:,.0f} samples at global batch "
            f"{batches}.")


def node_rows(model: EpochModel, runs: Sequence[RunData], points: Sequence[Point],
              tpe: pd.DataFrame, efficiency: pd.DataFrame, nodes: Sequence[int],
              rpn: int) -> tuple[pd.DataFrame, list[str]]:
    """One row per target (or one set without targets) and count (``counts``): the
    predicted columns beside the measured ones (``NODE_COLUMNS``), and one line per
    target saying where its samples come from."""
    groups = (list(efficiency.groupby(["metric", "target"], sort=False)) if len(efficiency)
              else [((None, None), None)])
    by_label = {r.label: r for r in runs}
    sizes = counts(runs, points, nodes, rpn)
    measured = {c.run: measured_values(by_label[c.run], points, tpe)
                for c in sizes if c.kind == "measured"}
    rows, lines = [], []
    for (metric, target), group in groups:
        hist, why = noise.history_for(runs, group)
        if group is not None:
            lines.append(history_line(metric, target, hist, why))
        for c in sizes:
            row = {"kind": c.kind, "run": c.run, "metric": metric, "target": target,
                   "nodes": c.nodes, "ranks": c.ranks, "batch_policy": policy_of(model.train)}
            row.update(predict(model, c.ranks, hist, group is not None))
            reached, note = measured_target(group, by_label.get(c.run))
            row.update(measured.get(c.run, {}), **reached)
            row["note"] = "; ".join(n for n in (row["note"], note) if n)
            rows.append(row)
    return pd.DataFrame(rows, columns=NODE_COLUMNS), lines


def node_assumptions(model: EpochModel, per_node: pd.DataFrame, lines: Sequence[str]) -> list[str]:
    """The lines printed with the node table (``per_node``); the first labels it a
    prediction. The samples' and the gain rule's lines only where they apply."""
    t = model.train
    gain = (", with the gain rule x sqrt(gain(B)) at the noise scale at the target (or the "
            "run's end)" if (per_node["lr_rule"] == "gain").any() else "")
    goodput_line = [f"train.batch_policy goodput: from the second epoch on, each epoch's "
                    "per-rank batch is goodput.choose's at the end of the epoch before "
                    "(powers of two up to train.max_batch_per_rank = "
                    f"{t.max_batch_per_rank}, never a global batch below the base), with "
                    "the step time below as its seconds and that epoch's noise scale; "
                    "the batch and lr shown are those in force at the target."]
    samples_lines = [
        "predicted_samples at global batch B = sum over the epochs of the history named "
        "below, up to the target, of (its samples x (phi + B) / (phi + B_epoch)), phi = "
        "tr(Sigma) / |G|^2 the Adam-preconditioned noise scale at that epoch's end and "
        "B_epoch the global batch it ran (McCandlish's E(B) per stretch, summed over "
        "training progress as Pollux does; distseg.core.goodput.samples_at; a batch "
        "below B_epoch counts that epoch's samples as run).",
        "predicted_hours = sum of each epoch's predicted samples / predicted_throughput: "
        "steady training only, without start-up, the warm-up epoch's tracing and "
        "validation, which measured_hours (wall clock, Time to target) include; "
        "measured_train_hours is the run's training time (train_time) to the target, "
        "warm-up epoch included."]
    return [
        "PREDICTION from models, not a measurement: every predicted_* column; measured_* "
        "where a run ran at that count.",
        f"Batch and lr at R ranks: distseg.core.config.batch_plan of {model.train_source} "
        f"({rule_text(model)}; train.lr = {t.lr:g}); the lr after the warm-up{gain}.",
        *(goodput_line if policy_of(t) == "goodput" else []),
        "predicted_step_s = t_compute(b) + t_allreduce(R) of the projection above at the "
        "mean per-rank batch b; predicted_throughput = samples per epoch / (steps x "
        "predicted_step_s).",
        *(samples_lines if per_node["predicted_samples"].notna().any() else []),
        *lines]


def other_batches(points: Sequence[Point], table: pd.DataFrame, per_node: pd.DataFrame,
                  model: EpochModel) -> bool:
    """Whether a feasible projected count, or a ``goodput`` choice, runs a per-rank batch
    (as the rule names it, remainder batches aside) no measured run ran: where a
    one-batch fit's assumed alpha decides the time."""
    ran = {_ran(p) or p.batch_size for p in points}
    batches = table.loc[(table["kind"] == "projection") & (table["note"] == ""), "per_rank_batch"]
    if policy_of(model.train) == "goodput":
        batches = pd.concat([batches, per_node["predicted_per_rank_batch"]])
    return bool(set(batches.dropna().astype(int)) - ran)


def project(runs: Sequence[RunData], tpe: pd.DataFrame, nodes: Sequence[int],
            fabric: Fabric, grad_bytes: float | None = None,
            ranks_per_node: int | None = None,
            efficiency: pd.DataFrame | None = None,
            priors: Mapping | None = None) -> Projection:
    """Fits the model to the measured runs and projects ``nodes`` node counts.

    Args:
      runs: the measured runs.
      tpe: their ``tables.time_per_epoch`` frame (median steady training time per
        epoch, ``median_train_s``; validation is not modelled).
      nodes: node counts to project.
      fabric: bandwidth and latency assumptions.
      grad_bytes: overrides the logged parameter count x 4.
      ranks_per_node: defaults to that of the largest measured run.
      efficiency: ``stateff.efficiency_table`` of the targets, to project time to
        each (``target_projection``) and predict samples to each (``node_rows``).
      priors: (metric, target) -> ``noise.NoisePrior``: targets whose statistical
        efficiency is predicted from the measured noise scale.

    Raises:
      ValueError: nothing to fit (no run with a finished epoch and a dataset size) or
        no gradient size; the message says which option helps.
    """
    fabric.validate()
    g_bytes, g_source = grad_bytes_of(runs, grad_bytes)
    if g_bytes is None:
        raise ValueError("projection needs the gradient size: the run records hold no "
                         "model.params; pass --grad-bytes")
    points = fit_points(runs, tpe)
    if not points:
        raise ValueError("projection needs at least one run with a finished epoch and a run "
                         "record giving steps_per_epoch, batch_size and dataset.train_samples "
                         "(or train_slabs)")
    base = min(points, key=lambda p: p.ranks)
    train, source = train_config(next(r for r in runs if r.label == base.run))
    model = fit(points, g_bytes, fabric, train, source)
    largest = max(points, key=lambda p: p.ranks)
    rpn = ranks_per_node or max(1, round(largest.ranks / largest.nodes))
    efficiency = efficiency if efficiency is not None else pd.DataFrame()
    table = pd.DataFrame(measured_rows(points, model, base)
                         + projected_rows(nodes, rpn, model, base))
    targets, target_lines = target_projection(efficiency, model, nodes, rpn, priors)
    per_node, lines = node_rows(model, runs, points, tpe, efficiency, nodes, rpn)
    assumed = other_batches(points, table, per_node, model)
    return Projection(table=table, compute_s=model.compute_s,
                      assumptions=assumptions(model, len(points), g_source, rpn,
                                              bool(ranks_per_node), base, assumed),
                      targets=targets, target_assumptions=target_lines,
                      nodes=per_node, node_assumptions=node_assumptions(model, per_node, lines))


def warnings(projection: Projection) -> list[Note]:
    """A warning for an assumption that decides projected numbers (AdaptDL's prior for
    the compute line); the targets' are ``stateff.projection_notes``'."""
    return [Note("warning", "projection", line) for line in projection.assumptions
            if "ASSUMED" in line]
