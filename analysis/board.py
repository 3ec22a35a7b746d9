"""``distseg-report --tensorboard DIR``: any run's logs as TensorBoard event files.

Each run directory becomes one TensorBoard run, ``DIR/NAME`` (``NAME`` as the report
names runs: the directory's name, or its path where two names collide), written from
the JSON-line logs of every rank by the report's reader (``analysis.logfile``) and the
mapping the live writer uses (``distseg.core.tbscalars``): rank 0's series as the live
writer writes them, and every rank's step time as its own series
(``ranks/step_time/rank-NNNNN``). Runs at different numbers of ranks, and runs made
before training wrote TensorBoard scalars, so sit side by side.

A resumed run's logs hold the steps a killed launch ran past its checkpoint and the
resumed launch ran again; as the report's progress counts them once, so here each
launch keeps only its steps before the first global step of any later launch in the
same file (and the epochs those steps end). What the export writes replaces the event
files of an earlier export in ``DIR/NAME``.

Plain Python: no TensorFlow (tensorboardX writes the files).
"""

from __future__ import annotations

import glob
import math
import os
import sys
from typing import Iterable, Sequence, TextIO

import numpy as np
import pandas as pd

from analysis.logfile import RankLog, read_rank_log
from analysis.logs import check_run_dir, unique_labels
from analysis.summary import launch_key
from distseg.core import tbscalars

#: Step-record fields the mapping reads (``tbscalars.step_scalars``).
_STEP_COLUMNS = ["global_step", "t", "step_time", "data_wait", "loss", "lr", "samples"]


def run_name(label: str) -> str:
    """A report label as a TensorBoard run inside the export directory (a path's parts
    without the root, ``.`` or ``..``)."""
    parts = [p for p in os.path.normpath(label).split(os.sep) if p not in ("", ".", "..")]
    return os.path.join(*parts) if parts else "run"


def kept_steps(log: RankLog) -> pd.DataFrame:
    """The step records of ``log`` on the run's trajectory: each launch's (segment's)
    steps before the first global step of any later launch in the file, one per global
    step, in order."""
    steps = log.steps[(log.steps["segment"] >= 0) & log.steps["global_step"].notna()]
    first = steps.groupby("segment")["global_step"].min()
    cut, later = {}, math.inf
    for seg in sorted(first.index, reverse=True):
        cut[seg], later = later, min(later, float(first[seg]))
    steps = steps[steps["global_step"] < steps["segment"].map(cut)]
    return (steps.drop_duplicates(["segment", "global_step"], keep="last")
            .sort_values(["segment", "global_step"], kind="stable").reset_index(drop=True))


def _starts(log: RankLog) -> list[float | None]:
    """Each segment's agreed start time (``run`` record ``start_time``)."""
    return [tbscalars.number(r.get("start_time")) for r in log.runs]


def _records(frame: pd.DataFrame) -> Iterable[tuple[int, dict]]:
    """``(segment, step record)`` of each row (the fields the mapping reads)."""
    segments = frame["segment"].to_numpy()
    for seg, rec in zip(segments, frame[_STEP_COLUMNS].to_dict("records")):
        yield int(seg), rec


def step_series(log: RankLog, steps: pd.DataFrame, main: bool) -> list[tbscalars.Scalar]:
    """``log``'s rank's step-time series, and the global series when it is the ``main``
    rank (rank 0, or the lowest rank with a log)."""
    starts = _starts(log)
    out = []
    for seg, rec in _records(steps):
        out += tbscalars.rank_step_scalars(rec, log.rank, starts[seg])
        if main:
            size = tbscalars.number(log.runs[seg].get("size")) or 1
            out += tbscalars.step_scalars(rec, int(size), starts[seg])
    return out


def _epoch_steps(steps: pd.DataFrame) -> dict[tuple[int, int], tuple[int, float]]:
    """(segment, epoch) -> (its last kept global step, its steps' mean step time)."""
    grouped = steps.dropna(subset=["epoch"]).groupby(["segment", "epoch"])
    last, mean = grouped["global_step"].max(), grouped["step_time"].mean()
    return {(int(s), int(e)): (int(last[(s, e)]), float(mean[(s, e)])) for s, e in last.index}


def epoch_series(logs: Sequence[RankLog], kept: dict[int, pd.DataFrame],
                 main: RankLog) -> list[tbscalars.Scalar]:
    """The ``main`` rank's epoch scalars and each epoch's balance across the ranks of
    its launch, at the global step of the epoch's last kept step (an epoch with none,
    one a later launch ran again, is left out)."""
    per_rank = {log.rank: _epoch_steps(kept[log.rank]) for log in logs}
    # (launch, epoch) -> every rank's part of its balance
    parts: dict[tuple, list[tbscalars.RankEpoch]] = {}
    for log in logs:
        for rec in log.epochs:
            seg, epoch = rec.get("_segment", -1), tbscalars.number(rec.get("epoch"))
            if seg < 0 or epoch is None:
                continue
            mean = per_rank[log.rank].get((seg, int(epoch)), (None, math.nan))[1]
            parts.setdefault((launch_key(log.runs[seg], seg), int(epoch)), []).append(
                tbscalars.RankEpoch(log.rank, mean, rec.get("samples"), rec.get("train_time")))
    out = []
    starts = _starts(main)
    for rec in main.epochs:
        seg, epoch = rec.get("_segment", -1), tbscalars.number(rec.get("epoch"))
        where = per_rank[main.rank].get((seg, int(epoch))) if epoch is not None else None
        if seg < 0 or where is None:
            continue
        ranks = sorted(parts.get((launch_key(main.runs[seg], seg), int(epoch)), []))
        out += tbscalars.epoch_scalars(rec, where[0], starts[seg])
        out += tbscalars.balance_scalars(ranks, where[0], tbscalars.wall_time(rec, starts[seg]))
    return out


def _clear(logdir: str) -> None:
    """Removes the event files an earlier export left in ``logdir``."""
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        os.remove(path)


def export_run(files: dict[int, str], logdir: str) -> int:
    """Writes one run's logs (rank -> log file) to the TensorBoard run ``logdir``;
    returns the number of scalars written."""
    logs = [read_rank_log(path, rank) for rank, path in sorted(files.items())]
    kept = {log.rank: kept_steps(log) for log in logs}
    main = logs[0]  # rank 0 where its log exists
    scalars = [s for log in logs for s in step_series(log, kept[log.rank], log is main)]
    scalars += epoch_series(logs, kept, main)
    scalars += [s for run in main.runs[:1] for s in tbscalars.lr_find_scalars(run)]
    os.makedirs(logdir, exist_ok=True)
    _clear(logdir)
    writer = tbscalars.ScalarWriter(logdir)
    try:
        writer.write(scalars)
    finally:
        writer.close()
    return len(scalars)


def export(run_dirs: Sequence[str], out_dir: str, stream: TextIO | None = sys.stderr) -> dict:
    """Every run of ``run_dirs`` as a TensorBoard run under ``out_dir``; returns run
    name -> scalars written and says where on ``stream``.

    Raises:
      RunDirError: a directory is missing or holds no logs (before anything is written).
      InputError: a log was written by a newer distseg.
    """
    all_files = [check_run_dir(p) for p in run_dirs]
    written = {}
    for label, files in zip(unique_labels(run_dirs), all_files):
        name = run_name(label)
        written[name] = export_run(files, os.path.join(out_dir, name))
    if stream is not None:
        total = int(np.sum(list(written.values())))
        stream.write(f"tensorboard: {total:,} scalars of {len(written)} run(s) in {out_dir} "
                     f"(tensorboard --logdir {out_dir})\n")
    return written
