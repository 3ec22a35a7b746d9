"""Statistical efficiency: whether more ranks reach a target with as few samples.

A user buys nodes to reach a target loss or Dice sooner. More ranks process samples
faster (throughput), but a larger global batch may need more samples to reach the
same target. For each target and run, against the base run (the scaling table's: the
fewest ranks)::

    statistical efficiency = samples to target of the base / samples of this run
    time-to-target speedup = hours of the base / hours of this run
                           = throughput speedup x statistical efficiency x other

``throughput speedup`` is the scaling table's (steady training samples per second
against the base). ``other`` is what neither explains, measured as the remainder:
warm-up epochs, validation, restarts, and the throughput before the crossing
differing from the steady one (1 when none of these differ between the runs). The
factor that limits adding ranks is the smaller of the throughput efficiency
(throughput speedup / ranks ratio) and the statistical efficiency, both 1 when ideal.

A target one run did not reach gives no made-up number: what it trained on in all is
a lower bound on its samples to target, so its statistical efficiency is an upper
bound (``< x``), or, for the base's, a lower bound on the other runs' (``> x``).

For ``--project-nodes``, ``fit_trend`` fits ``statistical efficiency = a + b log2(ranks)``
to the base (1 at its ranks) and the runs that reached the target, when they were
measured at two or more rank counts besides the base's; ``project_rows`` combines it
with the projection's throughput speedup. With fewer points it is assumed to be 1,
and every row and note says so. Where the runs measured the gradient noise scale, the
projected rows predict it from the noise scale averaged over the training to the
target instead (``analysis.noise``), and say so in their basis and note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from analysis import noise
from analysis.document import Note
from analysis.noise import NoisePrediction

COLUMNS = ["run", "ranks", "nodes", "metric", "target", "reached", "hours", "result", "steps",
           "samples", "samples_lower_bound", "samples_text", "base", "base_samples",
           "statistical_efficiency", "statistical_efficiency_text", "time_speedup",
           "throughput_speedup", "throughput_efficiency", "other_factor", "limited_by",
           "summary"]
#: Rank counts besides the base's at which statistical efficiency must be measured
#: before a trend is fitted.
TREND_POINTS = 2
ASSUMED = "assumed 1"


def comparison(metric: str) -> str:
    """How a target is met: ``<=`` for a loss, ``>=`` for a Dice."""
    return ">=" if metric.startswith("val_dice") else "<="


def base_run(scaling: pd.DataFrame, hours: pd.DataFrame) -> str | None:
    """The run the others are compared with: the scaling table's base (fewest ranks,
    then the fastest epoch), else the first run with the fewest ranks."""
    if len(scaling):
        return str(scaling["base"].iloc[0])
    if not len(hours):
        return None
    return str(hours.loc[hours["ranks"].astype(float).idxmin(), "run"])


def samples_text(reached: bool, samples: float, lower: float) -> str:
    """``1,536`` when reached, ``> 4,096`` when not (the samples trained on in all),
    ``unknown`` when not even that was logged."""
    if reached and math.isfinite(samples):
        return f"{samples:,.0f}"
    if not reached and math.isfinite(lower):
        return f"> {lower:,.0f}"
    return "unknown"


@dataclass(frozen=True)
class Efficiency:
    """Statistical efficiency of one run for one target.

    Attributes:
      value: base samples / this run's samples (NaN unless both reached the target).
      bound: ``""``, ``"<"`` (this run did not reach it: ``limit`` is an upper bound) or
        ``">"`` (the base did not: a lower bound).
      limit: the bound's value (NaN when there is none).
    """

    value: float = math.nan
    bound: str = ""
    limit: float = math.nan

    def text(self) -> str:
        if math.isfinite(self.value):
            return f"{self.value:.3g}"
        if self.bound and math.isfinite(self.limit):
            return f"{self.bound} {self.limit:.3g}"
        return "n/a"


def measured_efficiency(row: pd.Series, base: pd.Series) -> Efficiency:
    """This run's statistical efficiency as measured against the base's row for the
    same target: the base's samples to it / this run's (a bound where one of them did
    not reach it)."""
    if row["reached"] and base["reached"]:
        return Efficiency(float(base["samples"]) / float(row["samples"]))
    if row["reached"]:
        return Efficiency(bound=">", limit=float(base["samples_lower_bound"])
                          / float(row["samples"]))
    if base["reached"]:
        return Efficiency(bound="<", limit=float(base["samples"])
                          / float(row["samples_lower_bound"]))
    return Efficiency()


def limiting(throughput_efficiency: float, stat_eff: float) -> str:
    """Which factor costs more when ranks are added: the smaller efficiency below 1
    (``neither`` when both are at least 1, ``""`` when one is unknown)."""
    if not (math.isfinite(throughput_efficiency) and math.isfinite(stat_eff)):
        return ""
    if min(throughput_efficiency, stat_eff) >= 1:
        return "neither"
    return "statistical efficiency" if stat_eff < throughput_efficiency else "throughput"


def _who(row: pd.Series) -> str:
    ranks = int(row["ranks"])
    nodes = "?" if pd.isna(row["nodes"]) else int(row["nodes"])
    return (f"{row['run']} ({ranks} rank{'s' if ranks != 1 else ''}, {nodes} "
            f"node{'s' if nodes != 1 else ''})")


def goal_text(row: pd.Series) -> str:
    """``train_loss <= -0.75``: a target as people read it."""
    return f"{row['metric']} {comparison(row['metric'])} {row['target']:g}"


def _sooner(speedup: float) -> str:
    return f"{speedup:.2f}x sooner" if speedup >= 1 else f"{1 / speedup:.2f}x later"


def _num(value: float, digits: int = 2) -> str:
    """A number for a sentence, ``?`` when unknown."""
    return f"{value:.{digits}f}" if value is not None and math.isfinite(value) else "?"


def sentence(row: dict, base: pd.Series) -> str:
    """One line for a person: how much sooner, and which factor limits."""
    who, goal, took = _who(pd.Series(row)), goal_text(pd.Series(row)), row["samples_text"]
    if row["run"] == base["run"]:
        if not row["reached"]:
            return f"{who} is the base and does not reach {goal} ({took} samples)."
        return (f"{who} is the base: reaches {goal} in {row['result']} after {took} samples "
                f"({_num(float(row['steps']), 0)} steps).")
    eff = row["statistical_efficiency_text"]
    if not row["reached"]:
        return (f"{who} does not reach {goal} ({took} samples; {base['run']}: "
                f"{samples_text(base['reached'], base['samples'], base['samples_lower_bound'])}"
                f"): statistical efficiency {eff}.")
    if not base["reached"]:
        return (f"{who} reaches {goal} in {row['result']} after {took} samples; the base "
                f"{base['run']} does not: statistical efficiency {eff}.")
    limits = f"{row['limited_by']} limits" if row["limited_by"] else "the limit is unknown"
    return (f"{who} reaches {goal} {_sooner(row['time_speedup'])} than {base['run']}: "
            f"throughput {_num(row['throughput_speedup'])}x x statistical efficiency {eff} "
            f"(x {_num(row['other_factor'])} other); {limits} (throughput efficiency "
            f"{_num(row['throughput_efficiency'])}).")


def _row(row: pd.Series, base: pd.Series, scale: pd.Series | None) -> dict:
    eff = measured_efficiency(row, base)
    out = {c: row[c] for c in ("run", "ranks", "nodes", "metric", "target", "reached",
                               "hours", "result", "steps", "samples", "samples_lower_bound")}
    thr = float(scale["throughput_speedup"]) if scale is not None else math.nan
    thr_eff = float(scale["throughput_efficiency"]) if scale is not None else math.nan
    time_speedup = (float(base["hours"]) / float(row["hours"])
                    if row["reached"] and base["reached"] else math.nan)
    out.update(samples_text=samples_text(row["reached"], row["samples"],
                                         row["samples_lower_bound"]),
               base=base["run"], base_samples=base["samples"],
               statistical_efficiency=eff.value, statistical_efficiency_text=eff.text(),
               time_speedup=time_speedup, throughput_speedup=thr,
               throughput_efficiency=thr_eff,
               other_factor=time_speedup / (thr * eff.value),
               limited_by="" if row["run"] == base["run"] else limiting(thr_eff, eff.value))
    out["summary"] = sentence(out, base)
    return out


def efficiency_table(hours: pd.DataFrame, scaling: pd.DataFrame) -> pd.DataFrame:
    """One row per target and run: samples to target, statistical efficiency and the
    decomposition of the time-to-target speedup (columns: docs/report.md).

    Args:
      hours: ``tables.hours_to_target`` (with ``steps``, ``samples``,
        ``samples_lower_bound``).
      scaling: ``tables.scaling`` (its base and throughput speedups).
    """
    base_label = base_run(scaling, hours)
    rows = []
    by_run = scaling.set_index("run") if len(scaling) else None
    for _, group in hours.groupby(["metric", "target"], sort=False):
        base = group[group["run"] == base_label]
        if not len(base):
            continue
        for _, row in group.iterrows():
            scale = (by_run.loc[row["run"]] if by_run is not None and row["run"] in by_run.index
                     else None)
            rows.append(_row(row, base.iloc[0], scale))
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["steps"] = pd.to_numeric(out["steps"]).astype("Int64")
    return out


def summary_lines(table: pd.DataFrame) -> tuple[str, ...]:
    """The sentences of the table, one per run and target."""
    return tuple(table["summary"])


# --------------------------------------------------------------------------- projection


@dataclass(frozen=True)
class Trend:
    """``statistical efficiency = intercept + slope x log2(ranks)``, clipped to (0, 1].

    Attributes:
      intercept, slope: the least-squares line (NaN: no trend, assumed 1).
      rank_counts: distinct rank counts besides the base's it was fitted to.
    """

    intercept: float = math.nan
    slope: float = math.nan
    rank_counts: int = 0

    @property
    def fitted(self) -> bool:
        return math.isfinite(self.slope)

    def at(self, ranks: int) -> tuple[float, str]:
        """``(statistical efficiency, basis)`` at ``ranks``: the line clipped to at most
        1; NaN where it is 0 or below (no projection there); 1 when not fitted."""
        if not self.fitted:
            return 1.0, ASSUMED
        value = self.intercept + self.slope * math.log2(ranks)
        if value <= 0:
            return math.nan, "trend <= 0"
        # Rounding noise of a flat line (1 + 1e-16) is not worth a word.
        return min(value, 1.0), "trend" if value <= 1 + 1e-9 else "trend, clipped to 1"


def fit_trend(group: pd.DataFrame, base_ranks: int) -> Trend:
    """The trend of one target's statistical efficiency over ranks (``Trend``).

    Fitted to the base (1 at ``base_ranks``) and every run that reached the target
    with the base (an exact statistical efficiency), when those are at
    ``TREND_POINTS`` or more rank counts besides the base's; else not fitted.
    """
    exact = group[np.isfinite(group["statistical_efficiency"].astype(float))
                  & (group["run"] != group["base"])]
    counts = set(exact["ranks"].astype(int)) - {int(base_ranks)}
    if len(counts) < TREND_POINTS:
        return Trend(rank_counts=len(counts))
    x = np.log2(np.concatenate(([base_ranks], exact["ranks"].to_numpy(float))))
    y = np.concatenate(([1.0], exact["statistical_efficiency"].to_numpy(float)))
    slope, intercept = np.polyfit(x, y, 1)
    return Trend(float(intercept), float(slope), len(counts))


@dataclass(frozen=True)
class Scaled:
    """One row of the projection to scale: a measured run or a projected node count.

    Attributes:
      kind: ``measured`` or ``projection``.
      run: its label (``projected 64 nodes``).
      nodes, ranks: its size.
      throughput_speedup: against the base (measured, or the projection's model).
      note: why the projection's row is doubtful (``infeasible: ...``).
    """

    kind: str
    run: str
    nodes: int | None
    ranks: int
    throughput_speedup: float
    note: str = ""


def _target_rows(group: pd.DataFrame, scaled: Sequence[Scaled], trend: Trend,
                 prediction: NoisePrediction | None = None,
                 batch_at: Callable[[int], float] | None = None) -> list[dict]:
    base = group[group["run"] == group["base"]].iloc[0]
    rows = []
    for s in scaled:
        predicted = ""
        if s.kind == "measured":
            mine = group[group["run"] == s.run]
            if not len(mine):
                continue
            eff, basis = float(mine["statistical_efficiency"].iloc[0]), "measured"
            measured = float(mine["hours"].iloc[0])
        elif prediction is not None and batch_at is not None:
            (eff, basis, predicted), measured = (noise.stat_efficiency(prediction,
                                                                       batch_at(s.ranks)),
                                                 math.nan)
        else:
            (eff, basis), measured = trend.at(s.ranks), math.nan
        speedup = s.throughput_speedup * eff
        hours = float(base["hours"]) / speedup if base["reached"] else math.nan
        note = s.note or ("" if base["reached"] else f"{base['run']} did not reach the target")
        note = "; ".join(n for n in (note, predicted) if n)
        rows.append({"kind": s.kind, "run": s.run, "metric": base["metric"],
                     "target": base["target"], "nodes": s.nodes, "ranks": s.ranks,
                     "throughput_speedup": s.throughput_speedup,
                     "statistical_efficiency": eff, "statistical_efficiency_basis": basis,
                     "time_speedup": speedup, "hours": hours, "measured_hours": measured,
                     "note": note})
    return rows


PROJECT_COLUMNS = ["kind", "run", "metric", "target", "nodes", "ranks", "throughput_speedup",
                   "statistical_efficiency", "statistical_efficiency_basis", "time_speedup",
                   "hours", "measured_hours", "note"]


def _trend_line(group: pd.DataFrame, trend: Trend) -> str:
    goal = goal_text(group.iloc[0])
    if trend.fitted:
        slope = 0.0 if abs(trend.slope) < 1e-9 else trend.slope  # a flat line's noise
        return (f"{goal}: statistical efficiency = {trend.intercept:.3g} "
                f"{'+' if slope >= 0 else '-'} {abs(slope):.3g} x log2(ranks), "
                f"fitted to the base and {trend.rank_counts} other rank counts.")
    return (f"{goal}: statistical efficiency ASSUMED 1 (measured at {trend.rank_counts} rank "
            f"count(s) besides the base's; a trend needs {TREND_POINTS}): projected times "
            "count throughput only and are optimistic wherever it falls.")


def project_rows(table: pd.DataFrame, scaled: Sequence[Scaled], base_ranks: int,
                 predictions: Mapping[tuple[str, float], NoisePrediction] | None = None,
                 batch_at: Callable[[int], float] | None = None,
                 ) -> tuple[pd.DataFrame, list[str]]:
    """Projected time to each target: the base's measured time / (throughput speedup
    x statistical efficiency), per measured run and projected node count.

    Args:
      table: ``efficiency_table``.
      scaled: the measured runs and projected node counts with their throughput
        speedups against the base.
      base_ranks: the base run's ranks (the trend's anchor).
      predictions: (metric, target) -> samples to that target predicted from the
        noise scale over training (``analysis.noise``): the projected rows' statistical
        efficiency is then predicted from it, at the global batch ``batch_at(ranks)``,
        instead of the trend.

    Returns:
      The rows (``PROJECT_COLUMNS``) and one line per target saying how its
      statistical efficiency was projected.
    """
    rows, lines = [], []
    for (metric, target), group in table.groupby(["metric", "target"], sort=False):
        trend = fit_trend(group, base_ranks)
        prediction = (predictions or {}).get((metric, target))
        rows += _target_rows(group, scaled, trend, prediction, batch_at)
        lines.append(noise.line(goal_text(group.iloc[0]), prediction) if prediction and batch_at
                     else _trend_line(group, trend))
    return pd.DataFrame(rows, columns=PROJECT_COLUMNS), lines


def projection_notes(lines: Sequence[str]) -> list[Note]:
    """A warning for each target whose statistical efficiency was assumed 1."""
    return [Note("warning", "projection", line) for line in lines if "ASSUMED 1" in line]
