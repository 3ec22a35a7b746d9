"""Projection beyond the measured node counts: time per epoch and time to target, from
the step-time model of ``analysis.stepmodel`` fitted to the measured runs, labelled as a
projection wherever it is shown, with every assumption listed (the link's included:
measured, given or assumed, ``analysis.links``). Residuals at the measured points are
shown so the fit can be judged; where a one-batch fit's prior (AdaptDL's alpha = half
the step time) decides a projected time, the lines say ``ASSUMED`` and a warning
repeats it.

With targets, time to each target is projected too: the base's measured time divided
by the model's throughput speedup and a statistical efficiency (``analysis.stateff``:
a trend over ranks where measured at enough rank counts, else assumed 1 and flagged;
predicted from the gradient noise scale averaged over training where the runs measured
it, ``analysis.noise``). ``project`` also builds the prediction per node count
(``analysis.pernode``).
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import pandas as pd

from analysis import pernode, stateff
from analysis.document import Note, Projection
from analysis.logs import RunData
from analysis.stateff import Scaled
from analysis.stepmodel import (
    EpochModel,
    Fabric,
    Point,
    fit,
    fit_points,
    grad_bytes_of,
    policy_of,
    rule_text,
    train_config,
)


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


def overlap_line(model: EpochModel) -> str:
    """Where the projection's gamma comes from."""
    if model.gamma_points:
        return (f"gamma = {model.gamma:.2f}, FITTED: the gamma whose compute line fits all "
                f"measured points best, {model.gamma_points} of them with an allreduce of at "
                "least a tenth of the step on the link their own ranks measured (least "
                "squares of the log step time).")
    return ("gamma = 1 (no overlap), not fitted: distseg's step allreduces once the whole "
            "backward pass is done, and the runs cannot tell otherwise (a fit needs more "
            "measured points than the compute line's parameters, one with an allreduce of at "
            "least a tenth of its step: e.g. 1 rank, and 2 ranks on two nodes over a slow "
            "link, at the same per-rank batch).")


def assumptions(model: EpochModel, n_points: int, g_source: str, rpn: int,
                rpn_given: bool, base: Point, assumed: bool = False,
                link_lines: Sequence[str] = ()) -> list[str]:
    """The lines printed with the table; the first labels it a projection.
    ``link_lines``: where B and the latency come from, after the line that names them."""
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
        f"t_step = (t_compute^gamma + t_sync^gamma)^(1/gamma), t_sync = 2(R-1)/R x G/B + "
        f"latency x {rounds} for R ranks (ring allreduce of one fused gradient buffer per "
        "step; Pollux's overlap gamma: 1 is none, the sum, large is full, the max).",
        fitted,
        f"G = {model.grad_bytes:,.0f} gradient bytes ({g_source}); B = "
        f"{fabric.bandwidth_gbps:g} Gb/s; latency = {fabric.latency_us:g} us per message.",
        *link_lines,
        f"{rpn} rank(s) per node (from "
        f"{'--ranks-per-node' if rpn_given else 'the largest measured run'}); "
        "every rank's link is assumed to run at B (no NIC sharing, no faster intra-node path).",
        f"Dataset of {model.train_samples} train samples, {rule_text(model)} (strong scaling: "
        "the epoch is split over more ranks)" + (f", capped at {cap} steps per epoch." if cap
                                                 else "."),
        f"Efficiency is against {base.run} ({base.ranks} rank(s)): measured rows use "
        "measured times, projected rows the model's time for that run.",
        compute_line(model, assumed),
        overlap_line(model),
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


def noise_lines(predictions: Mapping, model: EpochModel) -> list[str]:
    """The assumption lines of targets predicted from the noise scale (none without)."""
    if not predictions:
        return []
    return ["Where the runs measured the gradient noise scale, a target's projected "
            "statistical efficiency is PREDICTED from it instead of the trend: the base "
            "run's samples to the target / the samples predicted at B(R), B(R) the "
            f"throughput model's global batch ({rule_text(model)}); predicted samples = the "
            "sum over the epochs of the history named below, up to the target, of its "
            "samples x (phi + B) / (phi + B_epoch), phi the noise scale at that epoch's "
            "end (the noise scale averaged over training progress as Pollux does, not one "
            "snapshot; analysis/noise.py, docs/report.md)."]


def global_batch_at(model: EpochModel, ranks: int) -> float:
    """The global batch the model's rule runs at ``ranks`` (NaN where it cannot)."""
    shape = model.shape(ranks)
    return float(shape.plan.global_batch) if shape.plan is not None else math.nan


def target_projection(efficiency: pd.DataFrame, model: EpochModel, nodes: Sequence[int],
                      rpn: int, predictions: Mapping | None = None,
                      ) -> tuple[pd.DataFrame, list[str]]:
    """Projected time to each target (``stateff.project_rows``) and the lines that say
    how; empty when no target was given or no run is the base of one. ``predictions``:
    (metric, target) -> ``noise.NoisePrediction``, the targets predicted from the noise
    scale."""
    if not len(efficiency):
        return pd.DataFrame(columns=stateff.PROJECT_COLUMNS), []
    base_run = str(efficiency["base"].iloc[0])
    base_ranks = int(efficiency.loc[efficiency["run"] == base_run, "ranks"].iloc[0])
    rows, lines = stateff.project_rows(
        efficiency, scaled(efficiency, model, nodes, rpn, base_ranks), base_ranks,
        predictions,
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
        "besides the base's.", *noise_lines(predictions, model), *lines]


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
            predictions: Mapping | None = None,
            link_lines: Sequence[str] = ()) -> Projection:
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
      predictions: (metric, target) -> ``noise.NoisePrediction``: targets whose
        statistical efficiency is predicted from the measured noise scale.
      link_lines: where ``fabric`` comes from (``links.LinkChoice.lines``), listed
        with the assumptions after the gradient size and link.

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
    targets, target_lines = target_projection(efficiency, model, nodes, rpn,
                                                    predictions)
    per_node, lines = pernode.node_rows(model, runs, points, tpe, efficiency, nodes, rpn)
    assumed = other_batches(points, table, per_node, model)
    return Projection(table=table, compute_s=model.compute_s,
                      assumptions=assumptions(model, len(points), g_source, rpn,
                                              bool(ranks_per_node), base, assumed,
                                              link_lines),
                      targets=targets, target_assumptions=target_lines,
                      nodes=per_node,
                      node_assumptions=pernode.node_assumptions(model, per_node, lines))


def warnings(projection: Projection) -> list[Note]:
    """A warning for an assumption that decides projected numbers (AdaptDL's prior for
    the compute line); the targets' are ``stateff.projection_notes``'."""
    return [Note("warning", "projection", line) for line in projection.assumptions
            if "ASSUMED" in line]
