"""The gradient noise scale in the report: over training, near each target, and what it
predicts for another global batch.

The trainer logs McCandlish et al.'s simple noise scale B_simple = tr(Sigma) / |G|^2
(samples; "An Empirical Model of Large-Batch Training", 2018, Appendix A) in each
``epoch`` record's ``noise_scale`` (``distseg.training.noise``): moving averages up to
the end of that epoch, ``null`` where not estimable (1-rank logs from before
2026-11-25: ``method`` ``none``; since then one rank differences consecutive gradients).

Near a target it predicts the samples another global batch B needs, from the base
run's (``stateff.base_run``) measured samples E(B0) at its global batch B0::

    E(B) / E(B0) = (B_noise + B) / (B_noise + B0)

(McCandlish's E = E_min (1 + B / B_noise)), so the statistical efficiency against
the base is (B_noise + B0) / (B_noise + B). B_noise is ``measured_near``: the
``noise_scale`` of the epoch record of the epoch in which the run first reached the
target (``tables.hours_to_target``'s ``epoch``), else of the latest earlier epoch that
has one. It is taken from the base run; where the base has none (an older 1-rank
base), from the run with the fewest ranks that reached the target and
has one, and ``noise_measured_at`` names it.

``--project-nodes`` predicts samples to target from the noise scale averaged over
training progress instead (Pollux, Qiao et al. 2021): a run's ``History`` splits its
training up to the target into its epochs, each with the global batch it ran and the
noise scale measured over it, and a batch B costs each epoch's samples x
(phi + B) / (phi + B_epoch) (``distseg.core.goodput.samples_at``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from analysis.document import Note
from analysis.logfile import count
from analysis.logs import RunData
from analysis.tables import epoch_batches, first_per_epoch
from distseg.core import goodput

SERIES_COLUMNS = ["run", "ranks", "nodes", "global_batch_size", "epoch", "hours", "samples",
                  "b_simple", "g2", "trace", "small_batch", "big_batch", "method"]
TABLE_COLUMNS = ["run", "ranks", "nodes", "global_batch_size", "small_batch", "big_batch",
                 "at", "metric", "target", "target_epoch", "epoch", "samples", "b_simple"]
PREDICTION_COLUMNS = ["run", "ranks", "nodes", "metric", "target", "global_batch_size", "base",
                      "base_global_batch", "base_samples", "b_noise", "noise_measured_at",
                      "predicted_samples", "samples", "samples_text",
                      "measured_over_predicted"]
#: ``statistical_efficiency_basis`` of a projection row predicted from the noise scale.
NOISE_BASIS = "noise scale"
END = "end of training"


def global_batch(run: RunData) -> float:
    """The run record's ``global_batch_size`` (NaN when not a count)."""
    value = count(run.run_record.get("global_batch_size"))
    return float(value) if value else math.nan


def _run_series(run: RunData) -> pd.DataFrame:
    e = first_per_epoch(run).sort_values("epoch")
    done = (run.epoch_progress.set_index("epoch")["samples"] if len(run.epoch_progress)
            else pd.Series(dtype=float))
    return pd.DataFrame({
        "run": run.label, "ranks": run.ranks, "nodes": run.nodes,
        "global_batch_size": global_batch(run), "epoch": e["epoch"].to_numpy(),
        "hours": e["wall_s"].to_numpy() / 3600.0,
        "samples": e["epoch"].map(done).astype(float).to_numpy(),
        **{c: e[f"noise_{c}"].to_numpy() for c in ("b_simple", "g2", "trace", "small_batch",
                                                    "big_batch", "method")}})


def series(runs: Sequence[RunData]) -> tuple[pd.DataFrame, list[Note]]:
    """One row per epoch of each run that logged ``noise_scale`` (``SERIES_COLUMNS``;
    ``samples``: what all ranks trained on by the end of that epoch), and one note per
    run that is not drawn: no ``noise_scale`` (older logs) or none estimated."""
    parts, notes = [], []
    for run in runs:
        if "noise_b_simple" not in run.epochs.columns:
            notes.append(Note("info", run.label, "logs no noise_scale (older logs): not in "
                              "the noise scale figure and tables"))
            continue
        part = _run_series(run)
        if not np.isfinite(part["b_simple"].astype(float)).any():
            methods = ", ".join(sorted(set(part["method"].dropna().astype(str)))) or "?"
            notes.append(Note("info", run.label, f"noise scale not estimated (method "
                              f"{methods}; 1 rank has one gradient per step): not drawn"))
        parts.append(part)
    frame = (pd.concat(parts, ignore_index=True)[SERIES_COLUMNS] if parts
             else pd.DataFrame(columns=SERIES_COLUMNS))
    for c in ("epoch", "small_batch", "big_batch", "global_batch_size"):
        frame[c] = pd.to_numeric(frame[c]).astype("Int64")
    return frame, notes


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``series`` with a B_simple (what is drawn and predicted from)."""
    return frame[np.isfinite(frame["b_simple"].astype(float))]


def measured_near(frame: pd.DataFrame, run: str, epoch: int | None = None) -> pd.Series | None:
    """The ``series`` row B_noise is read from: ``run``'s epoch ``epoch`` or the latest
    earlier one with a B_simple (``None``: the last one; no row: ``None``)."""
    rows = measured(frame)
    rows = rows[rows["run"] == run]
    if epoch is not None:
        rows = rows[rows["epoch"].astype(int) <= int(epoch)]
    return rows.sort_values("epoch").iloc[-1] if len(rows) else None


def _point(row: pd.Series | None, **fields) -> dict:
    out = dict.fromkeys(["epoch", "samples", "b_simple"], None)
    if row is not None:
        out.update(epoch=row["epoch"], samples=row["samples"], b_simple=row["b_simple"])
    return {**out, **fields}


def table(frame: pd.DataFrame, hours: pd.DataFrame) -> pd.DataFrame:
    """B_simple per run (``TABLE_COLUMNS``): at the end of training, and near each
    target (``measured_near`` the epoch the run first reached it; empty when not)."""
    rows = []
    for run in dict.fromkeys(measured(frame)["run"]):
        first = frame[frame["run"] == run].iloc[0]
        who = {c: first[c] for c in ("run", "ranks", "nodes", "global_batch_size")}
        batches = measured(frame[frame["run"] == run]).iloc[-1]
        who.update(small_batch=batches["small_batch"], big_batch=batches["big_batch"])
        rows.append({**who, **_point(measured_near(frame, run), at=END)})
        for _, h in hours[hours["run"] == run].iterrows():
            reached = bool(h["reached"])
            row = measured_near(frame, run, int(h["epoch"])) if reached else None
            rows.append({**who, **_point(row, at="target" if reached else "target not reached",
                                         metric=h["metric"], target=h["target"],
                                         target_epoch=h["epoch"] if reached else None)})
    out = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for c in ("epoch", "target_epoch", "small_batch", "big_batch", "global_batch_size"):
        out[c] = pd.to_numeric(out[c]).astype("Int64")
    return out


@dataclass(frozen=True)
class NoisePrior:
    """B_noise near one target and the base run it predicts from.

    Attributes:
      b_noise: B_simple in samples.
      run, epoch: where it was measured (``measured_near``).
      base_batch: B0, the base run's global batch.
      base_samples: E(B0), the base run's samples to the target.
    """

    b_noise: float
    run: str
    epoch: int
    base_batch: float
    base_samples: float

    def efficiency(self, batch: float) -> float:
        """Statistical efficiency at global batch ``batch``: E(B0) / E(B)."""
        return (self.b_noise + self.base_batch) / (self.b_noise + batch)

    def samples(self, batch: float) -> float:
        """Predicted samples to the target at global batch ``batch``: E(B)."""
        return self.base_samples / self.efficiency(batch)

    def where(self) -> str:
        return f"B_noise = {self.b_noise:,.4g} measured at {self.run} epoch {self.epoch}"


def _source(frame: pd.DataFrame, group: pd.DataFrame, base: str) -> pd.Series | None:
    """The ``series`` row B_noise near one target comes from: the base's, else that of
    the run with the fewest ranks (then listed first) that reached it and has one."""
    reached = group[group["reached"].astype(bool)]
    order = pd.concat([reached[reached["run"] == base],
                       reached[reached["run"] != base].sort_values("ranks", kind="stable")])
    for _, h in order.iterrows():
        row = measured_near(frame, h["run"], int(h["epoch"]))
        if row is not None:
            return row
    return None


def priors(frame: pd.DataFrame, hours: pd.DataFrame,
           efficiency: pd.DataFrame) -> dict[tuple[str, float], NoisePrior]:
    """(metric, target) -> ``NoisePrior``, for each target the base reached and some
    run has a B_noise near (``_source``)."""
    out = {}
    if not len(efficiency) or not len(measured(frame)):
        return out
    batches = frame.drop_duplicates("run").set_index("run")["global_batch_size"]
    for (metric, target), group in efficiency.groupby(["metric", "target"], sort=False):
        base = group[group["run"] == group["base"]]
        if not len(base) or not base["reached"].iloc[0]:
            continue
        base = base.iloc[0]
        b0 = batches.get(base["run"], pd.NA)
        near = hours[(hours["metric"] == metric) & (hours["target"] == target)]
        row = _source(frame, near, str(base["run"]))
        if row is None or pd.isna(b0):
            continue
        out[(metric, target)] = NoisePrior(float(row["b_simple"]), str(row["run"]),
                                           int(row["epoch"]), float(b0),
                                           float(base["samples"]))
    return out


def prediction_table(efficiency: pd.DataFrame, frame: pd.DataFrame,
                     found: dict[tuple[str, float], NoisePrior]) -> pd.DataFrame:
    """Predicted beside measured samples to target, for each run but the base whose
    global batch is known (``PREDICTION_COLUMNS``; ``measured_over_predicted`` where it
    reached the target)."""
    batches = frame.drop_duplicates("run").set_index("run")["global_batch_size"]
    rows = []
    for _, r in efficiency.iterrows():
        prior = found.get((r["metric"], r["target"]))
        batch = batches.get(r["run"], pd.NA)
        if prior is None or r["run"] == r["base"] or pd.isna(batch):
            continue
        predicted = prior.samples(float(batch))
        rows.append({**{c: r[c] for c in ("run", "ranks", "nodes", "metric", "target",
                                         "base", "samples", "samples_text")},
                     "global_batch_size": int(batch), "base_global_batch": int(prior.base_batch),
                     "base_samples": prior.base_samples, "b_noise": prior.b_noise,
                     "noise_measured_at": f"{prior.run} epoch {prior.epoch}",
                     "predicted_samples": predicted,
                     "measured_over_predicted": (float(r["samples"]) / predicted
                                                 if r["reached"] else math.nan)})
    return pd.DataFrame(rows, columns=PREDICTION_COLUMNS)


def note(prior: NoisePrior, batch: float) -> str:
    """What a projection row predicted from the noise scale says (``stateff``)."""
    return (f"predicted from the noise scale {prior.where()}: "
            f"{prior.samples(batch):,.0f} samples at global batch {batch:,.0f}")


def line(goal: str, prior: NoisePrior) -> str:
    """The assumption line of one target projected from the noise scale."""
    return (f"{goal}: statistical efficiency PREDICTED from the noise scale, {prior.where()}: "
            f"(B_noise + {prior.base_batch:,.0f}) / (B_noise + B) at global batch B.")


@dataclass(frozen=True)
class NoiseReport:
    """What the report shows of the noise scale (``build``).

    Attributes:
      series: ``series``, the figure's data.
      table: ``table``.
      prediction: ``prediction_table``.
      priors: (metric, target) -> ``NoisePrior``, for the projection.
      notes: runs not drawn, and why.
    """

    series: pd.DataFrame
    table: pd.DataFrame
    prediction: pd.DataFrame
    priors: dict
    notes: list[Note]


def build(runs: Sequence[RunData], hours: pd.DataFrame,
          efficiency: pd.DataFrame) -> NoiseReport | None:
    """The noise scale's tables, or ``None`` when no run measured one (the report
    then has no noise section, as before the trainer logged it)."""
    frame, notes = series(runs)
    if not len(measured(frame)):
        return None
    found = priors(frame, hours, efficiency)
    return NoiseReport(frame, table(frame, hours), prediction_table(efficiency, frame, found),
                       found, notes)


def stat_efficiency(prior: NoisePrior, batch: float) -> tuple[float, str, str]:
    """(statistical efficiency, basis, note) of a projection row at global ``batch``."""
    return prior.efficiency(batch), NOISE_BASIS, note(prior, batch)



# ------------------------------------------------------- averaged over training progress


@dataclass(frozen=True)
class History:
    """A run's training up to a point, in stretches of one epoch each.

    Attributes:
      run: the run it was measured in.
      samples: samples of all ranks in each stretch (they add up to the point).
      batch: the global batch each stretch ran (``tables.epoch_batches``).
      g2, trace: the noise scale over each stretch: the epoch record's moving averages
        at its end (an epoch without an estimate takes the next one's, else the last
        earlier one's).
    """

    run: str
    samples: tuple[float, ...]
    batch: tuple[float, ...]
    g2: tuple[float, ...]
    trace: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.samples))

    def stretch_samples(self, batches: Sequence[float]) -> list[float]:
        """Predicted samples of each stretch at the global batch ``batches[i]`` (one per
        stretch): ``goodput.samples_at`` of that stretch against the batch it ran (Pollux's
        sum, each stretch at its own base: a run of the ``goodput`` policy changed it).
        A batch below the one run is counted at the samples run (``goodput.efficiency``
        counts no gain below its base)."""
        return [goodput.samples_at(b, ran, [(n, g, t)]) for n, b, ran, g, t
                in zip(self.samples, batches, self.batch, self.g2, self.trace)]

    def samples_at(self, batch: float) -> float:
        """Predicted samples to the same point at one global batch ``batch``."""
        return float(sum(self.stretch_samples([batch] * len(self.samples))))


def _filled(values: pd.Series) -> pd.Series:
    values = values.astype(float).where(np.isfinite(values.astype(float)))
    return values.bfill().ffill()


def history(run: RunData, samples: float | None = None) -> History | None:
    """``run``'s ``History`` up to ``samples`` trained (``None``: all its epochs; past
    its last finished epoch the last stretch runs on to ``samples``); ``None`` when no
    epoch of it has a noise scale."""
    rows = epoch_batches(run)
    if not len(rows) or not np.isfinite(rows["g2"].astype(float)).any():
        return None
    rows = rows.assign(g2=_filled(rows["g2"]), trace=_filled(rows["trace"]),
                       global_batch=rows["global_batch"].fillna(global_batch(run)))
    ends = rows["end_samples"].to_numpy(float, copy=True)
    stop = ends[-1] if samples is None else float(samples)
    ends[-1] = max(ends[-1], stop)
    starts = np.concatenate(([0.0], ends[:-1]))
    keep = starts < stop
    rows, starts, ends = rows[keep], starts[keep], np.minimum(ends[keep], stop)
    return History(run.label, tuple(ends - starts), tuple(rows["global_batch"].astype(float)),
                   tuple(rows["g2"]), tuple(rows["trace"]))


def history_for(runs: Sequence[RunData], group: pd.DataFrame | None) -> tuple[History | None, str]:
    """The history samples to one target are predicted from, or why there is none.

    ``group``: one target's ``stateff.efficiency_table`` rows (``None``: no target; the
    base's whole run). Taken from the base up to its samples to the target; where the
    base logged no noise scale, from the run with the fewest ranks (then listed first)
    that reached the target and logged one. A base that did not reach the target gives
    none: its samples to it are not known.
    """
    by_label = {r.label: r for r in runs}
    if group is None:
        found = [history(r) for r in sorted(runs, key=lambda r: r.ranks)]
        found = [h for h in found if h is not None]
        return (found[0], "") if found else (None, "no run logged a noise_scale")
    base = group[group["run"] == group["base"]].iloc[0]
    if not base["reached"]:
        return None, f"{base['run']} (the base) did not reach the target: samples unknown"
    reached = group[group["reached"].astype(bool)]
    order = pd.concat([reached[reached["run"] == base["run"]],
                       reached[reached["run"] != base["run"]].sort_values("ranks", kind="stable")])
    for _, row in order.iterrows():
        found = history(by_label[row["run"]], float(row["samples"]))
        if found is not None:
            return found, ""
    return None, "no run that reached the target logged a noise_scale"
