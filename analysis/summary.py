"""What is kept of one rank's log: its summary, made as soon as the file is parsed.

A real allocation logs about 90 M step records; keeping them would make memory grow
with the steps. ``reduce_file`` reads one file (``analysis.logfile``) and reduces it at
once to a ``RankSummary``: the ``run`` and ``end`` records, the epoch records as a small
frame, the largest time of each launch, and the step reductions of ``analysis.reduce``
(per-rank step statistics, a thinned loss curve with the exact target crossings, the
samples per step). It needs no other rank, so worker processes can make it
(``analysis.workers``).

Also here: the key that names a launch across ranks (``launch_key``), which orders a
file's launches in time (``launch_order``) as ``analysis.launches`` orders them across
files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from analysis.document import Note
from analysis.logfile import RankLog, dict_field, number, read_rank_log
from analysis.reduce import CurveSpec, RankCurve, reduce_curve, sample_runs, step_stats
from distseg.core import timeline


def placed_steps(steps: pd.DataFrame, path: str) -> tuple[pd.DataFrame, list[Note]]:
    """The step records that can be placed in time: after a ``run`` record, with ``t``."""
    notes = []
    after_run = (steps["segment"] >= 0).to_numpy()
    has_t = np.isfinite(steps["t"].to_numpy())
    orphan = int((~after_run).sum())
    if orphan:
        notes.append(Note("skipped", path, f"{orphan} step record(s) before any run "
                          "record (cannot be placed in time)"))
    no_t = int((~has_t & after_run).sum())
    if no_t:
        notes.append(Note("skipped", path, f"{no_t} step record(s) without a time t"))
    return steps[after_run & has_t], notes


def _int_column(values: np.ndarray, dtype) -> np.ndarray:
    """A float column as integers, -1 where missing."""
    return np.nan_to_num(values, nan=-1).astype(dtype)


def compact_steps(rank: int, steps: pd.DataFrame) -> pd.DataFrame:
    """The per-step columns the rank-balance figures need from one rank's placed steps.

    Columns: ``rank``, ``segment`` (local to the file), ``epoch``, ``warmup`` (first
    epoch of its segment), ``step_time``, ``data_wait``, ``samples``.
    """
    seg = steps["segment"].to_numpy(np.int32)
    epoch = steps["epoch"].to_numpy()
    first_epoch = pd.Series(epoch).groupby(seg).transform("first").to_numpy()
    return pd.DataFrame({
        "rank": np.full(len(steps), rank, np.int32),
        "segment": seg,
        "epoch": _int_column(epoch, np.int32),
        "warmup": epoch == first_epoch,
        "step_time": steps["step_time"].to_numpy(np.float64),
        "data_wait": steps["data_wait"].to_numpy(np.float64),
        "samples": steps["samples"].to_numpy(np.float64),
    })


def curve_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One rank's loss curve: ``segment`` (local), ``epoch``, ``step``, ``global_step``,
    ``t``, ``loss``, ``lr``. ``loss`` is the mean over ranks, so one rank's is enough."""
    return pd.DataFrame({
        "segment": steps["segment"].to_numpy(np.int32),
        "epoch": _int_column(steps["epoch"].to_numpy(), np.int32),
        "step": _int_column(steps["step"].to_numpy(), np.int64),
        "global_step": _int_column(steps["global_step"].to_numpy(), np.int64),
        "t": steps["t"].to_numpy(),
        "loss": steps["loss"].to_numpy(),
        "lr": steps["lr"].to_numpy(),
    })


#: The ``noise_scale`` fields of an epoch record read into ``noise_*`` columns.
NOISE_FIELDS = ("b_simple", "b_simple_low", "b_simple_high", "effective_steps", "g2",
                "tr_sigma", "small_batch", "big_batch")


def noise_columns(rec: dict) -> dict[str, Any]:
    """``noise_<field>`` of each of ``NOISE_FIELDS`` (NaN where null or absent: logs
    from before 2026-11-28 have no interval or ``effective_steps``) and
    ``noise_method`` of an epoch record's ``noise_scale``; nothing when it has none
    (older logs), so their frames keep the columns they always had."""
    noise = dict_field(rec, "noise_scale")
    if noise is None:
        return {}
    out: dict[str, Any] = {f"noise_{k}": number(noise.get(k)) for k in NOISE_FIELDS}
    out["noise_method"] = str(noise.get("method", ""))
    return out


#: The ``comm`` fields of an epoch record read into ``comm_*`` columns: the steps
#: traced and ``distseg.core.timeline.MEDIANS``.
COMM_FIELDS = ("steps", *timeline.MEDIANS)


def comm_columns(rec: dict) -> dict[str, Any]:
    """``comm_steps``, ``comm_gradient_s``, ... of an epoch record's ``comm`` (rank 0 of
    a traced epoch; NaN where a field is missing or the trace could not be read);
    nothing when it has none."""
    comm = dict_field(rec, "comm")
    if comm is None:
        return {}
    return {f"comm_{k}": number(comm.get(k)) for k in COMM_FIELDS}


def epoch_rows(log: RankLog) -> tuple[pd.DataFrame, list[str], int]:
    """The epoch records of ``log`` as a frame, the Dice classes, and the unplaceable.

    One row per epoch record placed after a ``run`` record: ``rank``, ``segment``
    (local to the file), ``epoch``, ``t``, times, losses, samples, ``sample_digest``,
    ``dice_CLASS`` and ``local_dice_CLASS``, and where logged ``val_cases_local`` (the
    record's {case: {class: Dice}}), the noise scale (``noise_columns``) and the traced
    communication (``comm_columns``). The classes come in the order the file
    first names them; the count is of epoch records before any ``run`` record.
    """
    rows: list[dict] = []
    classes: list[str] = []
    for rec in log.epochs:
        if rec["_segment"] < 0:
            continue
        row = {"rank": log.rank, "segment": rec["_segment"], "epoch": rec.get("epoch"),
               "t": number(rec.get("t")), "epoch_time": number(rec.get("epoch_time")),
               "train_time": number(rec.get("train_time")),
               "samples": number(rec.get("samples")), "sample_digest": rec.get("sample_digest"),
               "train_loss": number(rec.get("train_loss")), "val_loss": number(rec.get("val_loss")),
               "val_samples_local": number(rec.get("val_samples_local"))}
        for key, prefix in (("val_dice", "dice_"), ("val_dice_local", "local_dice_")):
            dice = rec.get(key)
            if isinstance(dice, dict):
                for cls, v in dice.items():
                    if cls not in classes:
                        classes.append(cls)
                    row[prefix + cls] = number(v)
        cases = dict_field(rec, "val_cases_local")
        if cases is not None:  # each validation case's Dice, for the cross-validation
            row["val_cases_local"] = cases
        row.update(noise_columns(rec))
        row.update(comm_columns(rec))
        rows.append(row)
    orphans = sum(1 for r in log.epochs if r["_segment"] < 0)
    return pd.DataFrame(rows), classes, orphans


def record_tmax(log: RankLog, steps: pd.DataFrame) -> dict[int, float]:
    """Local segment -> the largest finite ``t`` of its placed steps, epochs and ends."""
    tmax = ({int(k): float(v) for k, v in steps.groupby("segment")["t"].max().items()}
            if len(steps) else {})
    for rec in log.epochs + log.ends:
        seg, t = rec["_segment"], number(rec.get("t"))
        if seg >= 0 and math.isfinite(t):
            tmax[seg] = max(tmax.get(seg, -math.inf), t)
    return tmax


def launch_keys(runs: Sequence[dict]) -> list[tuple]:
    """The launch key (``launch_key``) of each of a file's ``run`` records."""
    return [launch_key(r, i) for i, r in enumerate(runs)]


def launch_key(rec: dict, local: int) -> tuple:
    """Identifies a launch across ranks: the agreed start time and run id.

    ``start_time`` is broadcast from rank 0, so it is the same on every rank of a launch.
    """
    st = number(rec.get("start_time"))
    return (round(st, 3) if math.isfinite(st) else float(local), str(rec.get("run_id", "")))


def launch_order(runs: Sequence[dict]) -> np.ndarray:
    """A file's segment numbers -> their launch's place in time among this file's
    launches (the order ``launches.map_launches`` gives them across all files)."""
    keys = [launch_key(r, i) for i, r in enumerate(runs)]
    place = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([place[k] for k in keys], np.int64)


@dataclass
class RankSummary:
    """What is kept of one rank's log once read and reduced (``reduce_log``): a few
    records and small frames, whatever the number of steps, and picklable, so that a
    worker process can send it back.

    Attributes:
      rank, path: as in ``RankLog``.
      size_bytes: the file's size (for the progress bar).
      runs: the ``run`` records in file order.
      ends: the ``end`` records, each with ``_segment``.
      epochs: ``epoch_rows`` (``segment`` local to the file).
      classes: the Dice classes the file names, in order.
      orphan_epochs: epoch records before any ``run`` record.
      tmax: local segment -> the largest ``t`` logged in it (``record_tmax``).
      stats: ``analysis.reduce.step_stats`` of the placed steps (``None``: none).
      curve: ``analysis.reduce.reduce_curve`` of them (``None``: none).
      sample_runs: ``analysis.reduce.sample_runs`` of them (``None``: none; freed
        once added to ``logs.LogSet.samples``).
      notes: what was skipped while reading, in file order.
      unknown_fields: ``"type.field"`` names outside the schema.
    """

    rank: int
    path: str
    size_bytes: int = 0
    runs: list[dict] = field(default_factory=list)
    ends: list[dict] = field(default_factory=list)
    epochs: pd.DataFrame = field(default_factory=pd.DataFrame)
    classes: list[str] = field(default_factory=list)
    orphan_epochs: int = 0
    tmax: dict[int, float] = field(default_factory=dict)
    stats: pd.DataFrame | None = None
    curve: RankCurve | None = None
    sample_runs: pd.DataFrame | None = None
    notes: list[Note] = field(default_factory=list)
    unknown_fields: set[str] = field(default_factory=set)


def reduce_log(log: RankLog, spec: CurveSpec, size_bytes: int = 0) -> RankSummary:
    """Reduces one parsed log to its ``RankSummary``; frees ``log.steps``."""
    steps, notes = placed_steps(log.steps, log.path)
    log.steps = None
    epochs, classes, orphans = epoch_rows(log)
    out = RankSummary(rank=log.rank, path=log.path, size_bytes=size_bytes, runs=log.runs,
                      ends=log.ends, epochs=epochs, classes=classes, orphan_epochs=orphans,
                      tmax=record_tmax(log, steps), notes=log.notes + notes,
                      unknown_fields=log.unknown_fields)
    if len(steps):
        out.stats = step_stats(compact_steps(log.rank, steps))
        out.curve = reduce_curve(curve_steps(steps), launch_order(log.runs), spec)
        out.sample_runs = sample_runs(steps["segment"].to_numpy(),
                                      _int_column(steps["epoch"].to_numpy(), np.int64),
                                      _int_column(steps["step"].to_numpy(), np.int64),
                                      steps["samples"].to_numpy(np.float64))
    return out


def reduce_file(rank: int, path: str, spec: CurveSpec) -> RankSummary:
    """Reads and reduces one rank's log (what a worker process runs per file).

    Raises:
      InputError: the log was written by a newer distseg (``refuse_newer_schema``).
    """
    size_bytes = os.path.getsize(path) if os.path.exists(path) else 0
    return reduce_log(read_rank_log(path, rank), spec, size_bytes)
