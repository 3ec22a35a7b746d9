"""The gradient noise scale in the report: over training, near each target, and what it
predicts for another global batch.

The trainer logs McCandlish et al.'s simple noise scale B_simple = tr(Sigma) / |G|^2
(samples; "An Empirical Model of Large-Batch Training", 2018, Appendix A) in each
``epoch`` record's ``noise_scale`` (``distseg.training.progress.noise``): moving averages up to
the end of that epoch, ``null`` where not estimable (1-rank logs from before
2026-11-25: ``method`` ``none``; one rank then differenced consecutive gradients, which
read well above two ranks' estimate (docs/studies/noise-halves-2026-11-26.md), and
since 2026-11-26 takes its batch as two halves, ``method`` ``halves``, where its model
allows).

It predicts the samples to each target at another global batch B from the noise scale
averaged over training progress, as Pollux does (Qiao et al. 2021), not from one
snapshot: a run's ``History`` splits its training up to the target into its epochs,
each with the global batch B_e it ran and the noise scale phi_e measured over it
(moving averages at the epoch's end), and B costs each epoch's samples x
(phi_e + B) / (phi_e + B_e) (McCandlish's E = E_min (1 + B / B_noise) per stretch,
``distseg.core.goodput.samples_at``). The history is the base run's
(``stateff``'s: fewest ranks) up to its samples to the target; where the base logged no
noise scale (an older 1-rank base), that of the run with the fewest ranks that reached
the target and logged one (``history_for``). The statistical efficiency against the
base is then the base's measured samples / the predicted ones. The same prediction
serves ``noise_prediction.csv``, the noise-scale basis of the projection to target
(``analysis.stateff``) and the prediction per node count (``analysis.pernode``).

B_simple near a target (``measured_near``: the ``noise_scale`` of the epoch record of
the epoch in which the run first reached the target, ``tables.hours_to_target``'s
``epoch``, else of the latest earlier epoch that has one) is shown in the table, not
predicted from.
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

#: B_simple's 90 % interval and the effective steps behind it: ``noise_scale`` fields
#: read beside ``b_simple`` wherever it is (null in logs from before 2026-11-28).
INTERVAL = ("b_simple_low", "b_simple_high", "effective_steps")
SERIES_COLUMNS = ["run", "ranks", "nodes", "global_batch_size", "epoch", "hours", "samples",
                  "b_simple", *INTERVAL, "g2", "trace", "small_batch", "big_batch", "method"]
#: The columns of ``SERIES_COLUMNS`` taken from the epochs' ``noise_*`` columns
#: (``summary.noise_columns``): column -> the ``noise_scale`` field it holds (the series
#: calls tr(Sigma) ``trace``).
SERIES_NOISE = {"b_simple": "b_simple", **{c: c for c in INTERVAL}, "g2": "g2", "trace": "tr_sigma",
                "small_batch": "small_batch", "big_batch": "big_batch", "method": "method"}
TABLE_COLUMNS = ["run", "ranks", "nodes", "global_batch_size", "small_batch", "big_batch",
                 "at", "metric", "target", "target_epoch", "epoch", "samples", "b_simple",
                 *INTERVAL]
PREDICTION_COLUMNS = ["run", "ranks", "nodes", "metric", "target", "global_batch_size", "base",
                      "base_global_batch", "base_samples", "noise_from", "noise_epochs",
                      "b_noise_first", "b_noise_last", "predicted_samples", "samples",
                      "samples_text", "measured_over_predicted"]
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
        **{c: e[f"noise_{f}"].to_numpy() for c, f in SERIES_NOISE.items()}})


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
    point = ("epoch", "samples", "b_simple", *INTERVAL)
    out = dict.fromkeys(point, None)
    if row is not None:
        out.update({c: row[c] for c in point})
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
class History:
    """A run's training up to a point, in stretches of one epoch each.

    Attributes:
      run: the run it was measured in.
      samples: samples of all ranks in each stretch (they add up to the point).
      batch: the global batch each stretch ran (``tables.epoch_batches``).
      g2, tr_sigma: the noise scale over each stretch: the epoch record's moving averages
        at its end (an epoch without an estimate takes the next one's, else the last
        earlier one's).
    """

    run: str
    samples: tuple[float, ...]
    batch: tuple[float, ...]
    g2: tuple[float, ...]
    tr_sigma: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.samples))

    @property
    def phi(self) -> tuple[float, ...]:
        """The noise scale of each stretch, tr(Sigma) / |G|^2 in samples."""
        return tuple(t / g if g else math.nan for g, t in zip(self.g2, self.tr_sigma))

    def text(self) -> str:
        """Where a prediction comes from, in words: ``np1's history of the noise scale:
        3 epoch(s), 48 samples at global batch 2``."""
        batches = ", ".join(f"{b:g}" for b in dict.fromkeys(self.batch))
        return (f"{self.run}'s history of the noise scale: {len(self.samples)} epoch(s), "
                f"{self.total:,.0f} samples at global batch {batches}")

    def stretch_samples(self, batches: Sequence[float]) -> list[float]:
        """Predicted samples of each stretch at the global batch ``batches[i]`` (one per
        stretch): ``goodput.samples_at`` of that stretch against the batch it ran (Pollux's
        sum, each stretch at its own base: a run of the ``goodput`` policy changed it).
        A batch below the one run is counted at the samples run (``goodput.efficiency``
        counts no gain below its base)."""
        return [goodput.samples_at(b, ran, [(n, g, t)]) for n, b, ran, g, t
                in zip(self.samples, batches, self.batch, self.g2, self.tr_sigma)]

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
    rows = rows.assign(g2=_filled(rows["g2"]), tr_sigma=_filled(rows["tr_sigma"]),
                       global_batch=rows["global_batch"].fillna(global_batch(run)))
    ends = rows["end_samples"].to_numpy(float, copy=True)
    stop = ends[-1] if samples is None else float(samples)
    ends[-1] = max(ends[-1], stop)
    starts = np.concatenate(([0.0], ends[:-1]))
    keep = starts < stop
    rows, starts, ends = rows[keep], starts[keep], np.minimum(ends[keep], stop)
    return History(run.label, tuple(ends - starts), tuple(rows["global_batch"].astype(float)),
                   tuple(rows["g2"]), tuple(rows["tr_sigma"]))


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


# --------------------------------------------------------------- samples to a target


@dataclass(frozen=True)
class NoisePrediction:
    """Samples to one target at any global batch, predicted from the noise scale over
    the training that reached it (``history_for``): each stretch's samples at its own
    noise scale (``History.samples_at``, ``goodput.samples_at``: Pollux's average over
    training, not one snapshot).

    Attributes:
      history: the stretches: the base run's up to the target, else another run's.
      base: the base run (``stateff``'s, fewest ranks).
      base_batch: B0, the base run's global batch (its run record's).
      base_samples: E(B0), the base run's measured samples to the target.
    """

    history: History
    base: str
    base_batch: float
    base_samples: float

    def samples(self, batch: float) -> float:
        """Predicted samples to the target at global batch ``batch``."""
        return self.history.samples_at(batch)

    def predicted_efficiency(self, batch: float) -> float:
        """Statistical efficiency at global batch ``batch`` as predicted: the base's
        measured samples / the samples predicted at ``batch``."""
        return self.base_samples / self.samples(batch)

    def where(self) -> str:
        return self.history.text()


def predictions(runs: Sequence[RunData],
                efficiency: pd.DataFrame) -> dict[tuple[str, float], NoisePrediction]:
    """(metric, target) -> ``NoisePrediction``, for each target the base reached and
    some run that reached it logged a noise scale for (``history_for``)."""
    out = {}
    by_label = {r.label: r for r in runs}
    groups = efficiency.groupby(["metric", "target"], sort=False) if len(efficiency) else []
    for (metric, target), group in groups:
        hist, _ = history_for(runs, group)
        if hist is None:
            continue
        base = group[group["run"] == group["base"]].iloc[0]
        out[(metric, target)] = NoisePrediction(hist, str(base["run"]),
                                                global_batch(by_label[base["run"]]),
                                                float(base["samples"]))
    return out


def prediction_table(efficiency: pd.DataFrame, runs: Sequence[RunData],
                     found: dict[tuple[str, float], NoisePrediction]) -> pd.DataFrame:
    """Predicted beside measured samples to target, for each run but the base whose
    global batch is known (``PREDICTION_COLUMNS``; ``measured_over_predicted`` where it
    reached the target)."""
    batches = {r.label: global_batch(r) for r in runs}
    rows = []
    for _, r in efficiency.iterrows():
        pred = found.get((r["metric"], r["target"]))
        batch = batches.get(r["run"], math.nan)
        if pred is None or r["run"] == r["base"] or not math.isfinite(batch):
            continue
        predicted = pred.samples(batch)
        phi = pred.history.phi
        rows.append({**{c: r[c] for c in ("run", "ranks", "nodes", "metric", "target",
                                         "base", "samples", "samples_text")},
                     "global_batch_size": batch, "base_global_batch": pred.base_batch,
                     "base_samples": pred.base_samples, "noise_from": pred.history.run,
                     "noise_epochs": len(phi), "b_noise_first": phi[0], "b_noise_last": phi[-1],
                     "predicted_samples": predicted,
                     "measured_over_predicted": (float(r["samples"]) / predicted
                                                 if r["reached"] else math.nan)})
    out = pd.DataFrame(rows, columns=PREDICTION_COLUMNS)
    for c in ("global_batch_size", "base_global_batch"):
        out[c] = pd.to_numeric(out[c]).astype("Int64")
    return out


def note(pred: NoisePrediction, batch: float) -> str:
    """What a projection row predicted from the noise scale says (``stateff``)."""
    return (f"predicted from {pred.where()}: {pred.samples(batch):,.0f} samples at global "
            f"batch {batch:,.0f}")


def line(goal: str, pred: NoisePrediction) -> str:
    """The assumption line of one target projected from the noise scale."""
    return (f"{goal}: statistical efficiency PREDICTED from the noise scale averaged over "
            f"training: {pred.base}'s {pred.base_samples:,.0f} samples / the samples "
            f"predicted at global batch B from {pred.where()}.")


@dataclass(frozen=True)
class NoiseReport:
    """What the report shows of the noise scale (``build``).

    Attributes:
      series: ``series``, the figure's data.
      table: ``table``.
      prediction: ``prediction_table``.
      predictions: (metric, target) -> ``NoisePrediction``, for the projection.
      notes: runs not drawn, and why.
    """

    series: pd.DataFrame
    table: pd.DataFrame
    prediction: pd.DataFrame
    predictions: dict
    notes: list[Note]


def build(runs: Sequence[RunData], hours: pd.DataFrame,
          efficiency: pd.DataFrame) -> NoiseReport | None:
    """The noise scale's tables, or ``None`` when no run measured one (the report
    then has no noise section, as before the trainer logged it)."""
    frame, notes = series(runs)
    if not len(measured(frame)):
        return None
    found = predictions(runs, efficiency)
    return NoiseReport(frame, table(frame, hours), prediction_table(efficiency, runs, found),
                       found, notes)


def stat_efficiency(pred: NoisePrediction, batch: float) -> tuple[float, str, str]:
    """(statistical efficiency, basis, note) of a projection row at global ``batch``."""
    return pred.predicted_efficiency(batch), NOISE_BASIS, note(pred, batch)


@dataclass(frozen=True)
class NoisePrior:
    """One snapshot of the noise scale, B_noise at the target, as a one-stretch
    ``History`` (so ``goodput.samples_at`` stays the one formula): for callers that
    have nothing more (the large-batch study's goals). The report predicts from the
    whole history (``NoisePrediction``).

    Attributes:
      b_noise: B_simple in samples; run, epoch: where it was measured.
      base_batch: B0, the global batch the samples were measured at.
      base_samples: E(B0), the samples to the target at B0.
    """

    b_noise: float
    run: str
    epoch: int
    base_batch: float
    base_samples: float

    def samples(self, batch: float) -> float:
        """E(B0) x (B_noise + B) / (B_noise + B0) for ``batch`` >= B0 (E(B0) below)."""
        return History(self.run, (self.base_samples,), (self.base_batch,), (1.0,),
                       (self.b_noise,)).samples_at(batch)
