"""Projection of time per epoch beyond the measured node counts.

A deliberately simple model, fitted to the measured runs and labelled as a projection
wherever it is shown::

    t_step(R) = t_compute + t_allreduce(R)
    t_allreduce(R) = 2 (R - 1) / R * G / B  +  alpha * L(R)
    t_epoch(R) = steps(R) * t_step(R)

with ``R`` ranks, ``G`` gradient bytes (parameters x 4, float32), ``B`` the link
bandwidth, ``alpha`` the per-message latency and ``L(R) = 2 (R - 1)`` message rounds
for a ring (``--latency-term ring``) or ``2 log2 R`` for a tree/recursive-doubling
algorithm (``--latency-term log``). ``steps(R)`` is the number of steps each rank runs
per epoch, from the dataset size and the per-rank batch, as ``distseg.data`` shards.
The one free parameter, ``t_compute``, is the least-squares fit (the mean) of
``measured step time - t_allreduce(R)`` over the measured runs, where the measured step
time is the median steady training time per epoch (``train_time``, no validation)
divided by the steps per epoch; the residuals at the
measured points are shown so the fit can be judged.

With targets, time to each target is projected too: the base's measured time divided
by the model's throughput speedup and a statistical efficiency (``analysis.stateff``:
a trend over ranks where measured at enough rank counts, else assumed 1 and flagged;
predicted from the gradient noise scale where the runs measured it, ``analysis.noise``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analysis import stateff
from analysis.document import Projection
from analysis.logfile import dict_field
from analysis.logs import RunData
from analysis.stateff import Scaled
from distseg.core.schema import steps_per_epoch

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


@dataclass(frozen=True)
class Point:
    """One measured run the model is fitted to.

    Attributes:
      run: its label.
      ranks / nodes: its size.
      epoch_s: median steady training time per epoch.
      steps: steps per epoch each rank ran.
      train_samples / batch_size: its dataset size and per-rank batch.
      capped: whether ``max_steps_per_epoch`` cut its epochs short.
    """

    run: str
    ranks: int
    nodes: int
    epoch_s: float
    steps: int
    train_samples: int
    batch_size: int
    capped: bool

    @property
    def step_s(self) -> float:
        return self.epoch_s / self.steps


def fit_points(runs: Sequence[RunData], tpe: pd.DataFrame) -> list[Point]:
    """The runs that can be fitted: a finished epoch and the run record's sizes."""
    points = []
    for run in runs:
        row = tpe[tpe["run"] == run.label].iloc[0]
        rec, n_train = run.run_record, run.train_samples
        spe = rec.get("steps_per_epoch")
        if not (math.isfinite(row["median_train_s"]) and spe and n_train
                and rec.get("batch_size")):
            continue
        batch = int(rec["batch_size"])
        points.append(Point(run=run.label, ranks=run.ranks, nodes=run.nodes or 1,
                            epoch_s=float(row["median_train_s"]), steps=int(spe),
                            train_samples=n_train, batch_size=batch,
                            capped=int(spe) < steps_per_epoch(n_train, run.ranks, batch)))
    return points


@dataclass(frozen=True)
class EpochModel:
    """The fitted model of one training epoch at any number of ranks.

    Attributes:
      compute_s: fitted per-step compute time.
      grad_bytes: gradient bytes allreduced per step.
      fabric: bandwidth and latency assumptions.
      train_samples / batch_size: the dataset and per-rank batch (from the base run).
      cap: steps per epoch when the measured runs were capped, else ``None``.
    """

    compute_s: float
    grad_bytes: float
    fabric: Fabric
    train_samples: int
    batch_size: int
    cap: int | None

    def epoch(self, ranks: int) -> tuple[float, float, int]:
        """``(epoch seconds, allreduce seconds per step, steps per epoch)`` at ``ranks``."""
        steps = steps_per_epoch(self.train_samples, ranks, self.batch_size)
        if self.cap:
            steps = min(steps, self.cap)
        comm = allreduce_seconds(ranks, self.grad_bytes, self.fabric)
        return steps * (self.compute_s + comm), comm, steps

    def throughput(self, ranks: int) -> float:
        """Training samples per second at ``ranks``: an epoch's samples (the dataset as
        ``distseg.data`` shards it, or the capped steps' batches) / its seconds."""
        n = self.train_samples - (self.train_samples % ranks if self.batch_size == 1 else 0)
        epoch_s, _, steps = self.epoch(ranks)
        if self.cap:
            n = min(n, steps * ranks * self.batch_size)
        return n / epoch_s if epoch_s > 0 else math.nan


def fit(points: Sequence[Point], grad_bytes: float, fabric: Fabric) -> EpochModel:
    """Least-squares ``t_compute`` (the mean residual step time, at least 0); the
    dataset, batch and step cap of the run with the fewest ranks."""
    residual = [p.step_s - allreduce_seconds(p.ranks, grad_bytes, fabric) for p in points]
    base = min(points, key=lambda p: p.ranks)
    return EpochModel(compute_s=max(float(np.mean(residual)), 0.0), grad_bytes=grad_bytes,
                      fabric=fabric, train_samples=base.train_samples,
                      batch_size=base.batch_size, cap=base.steps if base.capped else None)


def measured_rows(points: Sequence[Point], model: EpochModel, base: Point) -> list[dict]:
    """One row per measured run: its time beside the model's, and its efficiency."""
    rows = []
    for p in points:
        epoch_m, comm, _ = model.epoch(p.ranks)
        rows.append({"kind": "measured", "run": p.run, "nodes": p.nodes, "ranks": p.ranks,
                     "steps_per_epoch": p.steps, "step_s": p.step_s,
                     "allreduce_s": comm, "epoch_s": p.epoch_s, "model_epoch_s": epoch_m,
                     "residual_s": p.epoch_s - epoch_m,
                     "efficiency": base.epoch_s * base.ranks / (p.epoch_s * p.ranks),
                     "note": ""})
    return rows


def infeasible(model: EpochModel, ranks: int) -> str:
    """Why ``ranks`` cannot train on the model's dataset ("" when they can)."""
    n_train, batch = model.train_samples, model.batch_size
    if n_train < ranks * batch:
        return f"infeasible: {n_train} samples < ranks x batch = {ranks} x {batch}"
    return ""


def projected_rows(nodes: Sequence[int], ranks_per_node: int, model: EpochModel,
                   base: Point) -> list[dict]:
    """One row per projected node count; efficiency against the model's base run."""
    base_model = model.epoch(base.ranks)[0]
    rows = []
    for n in nodes:
        ranks = int(n) * ranks_per_node
        note = infeasible(model, ranks)
        epoch_m, comm, steps = model.epoch(ranks)
        rows.append({"kind": "projection", "run": f"projected {n} nodes", "nodes": int(n),
                     "ranks": ranks, "steps_per_epoch": steps,
                     "step_s": model.compute_s + comm, "allreduce_s": comm, "epoch_s": epoch_m,
                     "model_epoch_s": epoch_m, "residual_s": math.nan,
                     "efficiency": base_model * base.ranks / (epoch_m * ranks), "note": note})
    return rows


def assumptions(model: EpochModel, n_points: int, g_source: str, rpn: int,
                rpn_given: bool, base: Point) -> list[str]:
    """The lines printed with the table; the first labels it a projection."""
    fabric, cap = model.fabric, model.cap
    rounds = "2(R-1)" if fabric.latency_term == "ring" else "2 log2 R"
    return [
        "PROJECTION from a model, not a measurement.",
        f"t_step = t_compute + 2(R-1)/R x G/B + latency x {rounds}"
        f" for R ranks (ring allreduce of one fused gradient buffer per step).",
        f"t_compute = {model.compute_s:.4g} s per step: the mean over {n_points} measured "
        "run(s) of (median steady training time per epoch / steps per epoch - modelled "
        "allreduce time). Validation is not modelled: epoch_s is training time only.",
        f"G = {model.grad_bytes:,.0f} gradient bytes ({g_source}); B = "
        f"{fabric.bandwidth_gbps:g} Gb/s; latency = {fabric.latency_us:g} us per message.",
        f"{rpn} rank(s) per node (from "
        f"{'--ranks-per-node' if rpn_given else 'the largest measured run'}); "
        "every rank's link is assumed to run at B (no NIC sharing, no faster intra-node path, "
        "no overlap of communication with compute).",
        f"Dataset of {model.train_samples} train samples, {model.batch_size} per rank per "
        "step (strong scaling: the epoch is split over more ranks)"
        + (f", capped at {cap} steps per epoch." if cap else "."),
        f"Efficiency is against {base.run} ({base.ranks} rank(s)): measured rows use "
        "measured times, projected rows the model's time for that run.",
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
            "(B_noise + B0) / (B_noise + B(R)), B0 the base run's global batch, B(R) = R x "
            f"{model.batch_size} (the throughput model's batch per rank), B_noise as "
            "named below (analysis/noise.py, docs/report.md)."]


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
        lambda ranks: float(ranks * model.batch_size))
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
        each (``target_projection``).
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
    model = fit(points, g_bytes, fabric)
    largest = max(points, key=lambda p: p.ranks)
    rpn = ranks_per_node or max(1, round(largest.ranks / largest.nodes))
    base = min(points, key=lambda p: p.ranks)
    table = pd.DataFrame(measured_rows(points, model, base)
                         + projected_rows(nodes, rpn, model, base))
    targets, target_lines = target_projection(
        efficiency if efficiency is not None else pd.DataFrame(), model, nodes, rpn, priors)
    return Projection(table=table, compute_s=model.compute_s,
                      assumptions=assumptions(model, len(points), g_source, rpn,
                                              bool(ranks_per_node), base),
                      targets=targets, target_assumptions=target_lines)
