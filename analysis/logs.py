"""Reading run directories: every rank's log combined into one ``RunData``.

Each file is read and reduced at once (``analysis.summary.reduce_file``, on
``analysis.logfile``), in parallel worker processes when there is enough to read
(``analysis.workers``), so memory does not grow with the number of steps; the
launches are matched across ranks by ``analysis.launches``.

Nothing here raises on a damaged log: every line, field or file that is skipped becomes
a ``Note`` that the report prints, so a reader can tell what the numbers rest on.
Two things are errors (``distseg.core.errors.InputError``, exit 2): a run directory that
does not exist or holds no logs at all (``RunDirError``), because then there is nothing
to report, and a log whose ``run`` record carries a ``schema_version`` newer than
``distseg.core.schema.SCHEMA_VERSION`` (``logfile.refuse_newer_schema``).

``load_run`` is a pipeline of steps, each a module-level function returning a value:
``read_config``, ``read_logs`` (each file read and reduced at once: ``reduce_file``),
``map_launches``, ``identify``, ``launch_table``, ``launch_durations``,
``global_curve``, ``epoch_table``, ``run_progress``, ``run_status`` and ``rank_notes``.
"""

from __future__ import annotations

import glob
import itertools
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from analysis import workers
from analysis.document import Note
from analysis.launches import (
    Identity,
    Launches,
    identify,
    launch_durations,
    launch_notes,
    launch_table,
    map_launches,
    offsets_of,
    placement_table,
)
from analysis.logfile import count, dict_field, number
from analysis.progress import SampleSum, Trained, at_crossings, at_epochs, progress_notes
from analysis.reduce import STAT_COLUMNS, CurveSpec, RankCurve, crossing_table
from analysis.summary import RankSummary, launch_keys, reduce_file
from distseg.core import rundir
from distseg.core.errors import InputError


class RunDirError(InputError):
    """A run directory that cannot be reported at all (missing, or without logs): exit 2."""


@dataclass
class RunData:
    """Everything the report needs from one run directory, all ranks combined.

    Attributes:
      label: short unique name of the run (its directory name).
      path: the run directory.
      size: number of ranks (from the ``run`` records; the largest when segments differ).
      hosts: distinct host names of the launch that ran on the most hosts (the latest
        such launch); ``nodes`` is their number.
      rank_hosts: rank -> host in the last segment.
      run_record: the last segment's ``run`` record of the lowest rank that has one.
      config: ``RUN/config.json`` or ``None`` when unreadable.
      segments: one row per launch (a resumed run has several): ``segment``,
        ``start_time``, ``run_id``, ``config_hash``, ``size``, ``nodes`` (distinct
        hosts), ``ranks_logged``, ``duration_s`` (longest ``t`` any rank logged in it),
        ``offset_s`` (sum of the earlier durations).
      placement: one row per launch and rank: ``segment``, ``rank``, ``host``,
        ``local_size``, ``cores`` and ``cpus`` (``threads.cores``, and the CPUs in
        ``threads.affinity``; NaN when not logged), ``affinity`` (a tuple or ``None``).
      ranks_present / ranks_missing: ranks with / without a readable log.
      status: what the ``end`` records of the last segment say.
      finished: whether every rank of the last segment logged ``end`` with ``ok``.
      epochs: one row per rank and epoch (the last segment's when repeated).
      step_stats: per rank, ``analysis.reduce.step_stats`` (``basis`` ``steady`` and
        ``all``): steps, step and data-wait times.
      curve: the training-loss curve from one rank (``curve_rank``), thinned to at most
        ``analysis.reduce.CURVE_POINTS`` records: ``segment``, ``epoch``, ``step``,
        ``global_step``, ``t``, ``wall_s``, ``loss``, ``lr``, ``loss_smoothed``.
      curve_records: step records behind the curve (before thinning).
      curve_stride: every ``curve_stride``-th of them is in ``curve`` (and the last).
      curve_loss_min: the lowest loss of the whole curve.
      crossings: the first crossing of each loss target on the whole curve:
        ``target``, ``window`` (0: raw loss, else the smoothing window), ``reached``,
        ``segment``, ``t``, ``wall_s``, ``epoch``, ``step``, ``global_step``, and ``steps``,
        ``samples`` and ``made_up``: what all ranks trained on up to it
        (``analysis.progress``).
      classes: validation Dice class names in log order.
      notes: everything skipped or doubtful.
      trained: what all ranks trained on by the last step record (``progress.Trained``;
        the bound of a target not reached).
      epoch_progress: what all ranks trained on by the end of each epoch
        (``progress.at_epochs``).
      progress_notes: what ``crossings``, ``trained`` and ``epoch_progress`` rest on
        when not every rank's every step record (for a report with targets).
    """

    label: str
    path: str
    size: int | None
    hosts: list[str]
    rank_hosts: dict[int, str]
    run_record: dict
    config: dict | None
    segments: pd.DataFrame
    placement: pd.DataFrame
    ranks_present: list[int]
    ranks_missing: list[int]
    status: str
    finished: bool
    epochs: pd.DataFrame
    step_stats: pd.DataFrame
    curve: pd.DataFrame
    curve_rank: int | None
    curve_records: int
    curve_stride: int
    curve_loss_min: float
    crossings: pd.DataFrame
    classes: list[str]
    notes: list[Note]
    trained: Trained = Trained()
    epoch_progress: pd.DataFrame = field(default_factory=pd.DataFrame)
    progress_notes: list[Note] = field(default_factory=list)

    @property
    def nodes(self) -> int | None:
        return len(self.hosts) or None

    @property
    def dataset(self) -> dict:
        """The run record's ``dataset`` object (``{}`` when absent or not an object)."""
        return dict_field(self.run_record, "dataset") or {}

    @property
    def ranks(self) -> int:
        return self.size if self.size else len(self.ranks_present)

    @property
    def model(self) -> dict:
        """The run record's ``model`` object (``{}`` when absent or not an object)."""
        return dict_field(self.run_record, "model") or {}

    @property
    def threads(self) -> dict:
        """The run record's ``threads`` object (``{}`` when absent or not an object)."""
        return dict_field(self.run_record, "threads") or {}

    @property
    def train_samples(self) -> int | None:
        """Training samples of one epoch: ``dataset.train_samples`` (slices), or a 3D
        run's ``dataset.train_slabs``; ``None`` when neither is a count."""
        ds = self.dataset
        n = ds.get("train_samples")
        return count(ds.get("train_slabs") if n is None else n)

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        """A sample's shape, (H, W) or (D, H, W), from ``model.input_shape``; ``None``
        when not logged (older logs) or not a list of positive integers."""
        shape = self.model.get("input_shape")
        if not isinstance(shape, list) or not shape:
            return None
        dims = [count(d) for d in shape]
        return tuple(dims) if all(dims) else None

    @property
    def voxels_per_sample(self) -> float:
        """Voxels of one sample (the run record's ``voxels_per_sample``: a slice's H x W,
        a slab's D x H x W); NaN when not logged, so voxel rates stay empty."""
        voxels = count(self.run_record.get("voxels_per_sample"))
        return float(voxels) if voxels else math.nan


def log_files(run_dir: str) -> dict[int, str]:
    """Maps rank -> log path for the ``rank-NNNNN.jsonl`` files of a run directory."""
    out = {}
    for p in glob.glob(os.path.join(rundir.log_dir(run_dir), rundir.LOG_GLOB)):
        rank = rundir.rank_of(os.path.basename(p))
        if rank is not None:
            out[rank] = p
    return dict(sorted(out.items()))


def check_run_dir(run_dir: str) -> dict[int, str]:
    """Returns the run's log files, or raises ``RunDirError`` with one line for a person."""
    if not os.path.isdir(run_dir):
        what = "is not a directory" if os.path.exists(run_dir) else "does not exist"
        raise RunDirError(f"run directory {run_dir} {what}")
    files = log_files(run_dir)
    if not files:
        raise RunDirError(f"run directory {run_dir} has no logs "
                          f"({os.path.join(rundir.log_dir(run_dir), rundir.LOG_GLOB)}); "
                          "is it a distseg run directory?")
    return files


def run_label(run_dir: str) -> str:
    """A run's default name: its directory's name."""
    return os.path.basename(os.path.normpath(run_dir)) or run_dir


def read_config(run_dir: str, label: str) -> tuple[dict | None, list[Note]]:
    """``RUN/config.json``, or ``None`` with a note: the run records still say enough
    for every table, the config only adds to the cross-run comparisons."""
    cfg_path = rundir.config_path(run_dir)
    try:
        with open(cfg_path, encoding="utf-8") as f:
            return json.load(f), []
    except FileNotFoundError:
        return None, [Note("info", label, f"{cfg_path} is missing; config comparisons use "
                           "the run records only")]
    except (OSError, ValueError) as e:
        return None, [Note("warning", label, f"{cfg_path} cannot be read as JSON ({e})")]


def _steps_per_epoch(run: dict) -> int | None:
    """A ``run`` record's ``steps_per_epoch`` when it is a positive number."""
    value = number(run.get("steps_per_epoch"))
    return int(value) if math.isfinite(value) and value >= 1 else None


@dataclass
class LogSet:
    """A run's logs once read and reduced (what ``read_logs`` keeps of them).

    Attributes:
      logs: every rank's ``RankSummary``, without its curve.
      curve: the reduced curve of the rank with the most placed steps (``None``: no
        steps); the lowest such rank on ties.
      curve_rank: that rank.
      samples: every rank's samples per launch and step, added up
        (``analysis.progress.SampleSum``, keyed by ``launch_keys``).
      unknown_fields: ``type.field`` -> number of logs that hold it.
      notes: what was skipped while reading, in file order.
    """

    logs: list[RankSummary] = field(default_factory=list)
    curve: RankCurve | None = None
    curve_rank: int | None = None
    samples: SampleSum = field(default_factory=SampleSum)
    unknown_fields: Counter = field(default_factory=Counter)
    notes: list[Note] = field(default_factory=list)


def read_logs(files: dict[int, str], progress: Callable[[int], None] | None = None,
              spec: CurveSpec | None = None,
              summaries: Iterable[RankSummary] | None = None) -> LogSet:
    """Reads each rank's log and reduces it at once to what the tables need.

    Only one file's steps are alive at a time (per file, ``reduce_file``); of the
    loss curves, only the best so far is kept; the samples per step are added up as
    they come. Memory is bounded by one file plus a small summary per rank, not
    by ranks x steps.

    Args:
      files: rank -> log path.
      progress: called with the number of bytes of each file once it is read.
      spec: what the loss curve is reduced for (default: no targets, no smoothing).
      summaries: the files' ``RankSummary`` in the order of ``files``, when they were
        reduced elsewhere (worker processes); default: reduced here, one by one.

    Raises:
      InputError: a log was written by a newer distseg (``refuse_newer_schema``).
    """
    spec = spec or CurveSpec()
    if summaries is None:
        summaries = (reduce_file(rank, path, spec) for rank, path in files.items())
    out = LogSet()
    for summary in summaries:
        out.notes.extend(summary.notes)
        summary.notes = []
        out.unknown_fields.update(summary.unknown_fields)
        curve, summary.curve = summary.curve, None
        if curve is not None and (out.curve is None or (curve.records, -summary.rank)
                                  > (out.curve.records, -out.curve_rank)):
            out.curve, out.curve_rank = curve, summary.rank
        out.samples.add(launch_keys(summary.runs),
                        [_steps_per_epoch(r) for r in summary.runs], summary.sample_runs)
        summary.sample_runs = None
        out.logs.append(summary)
        if progress:
            progress(summary.size_bytes)
    return out


def unknown_fields_notes(counts: Counter, n_logs: int, label: str) -> list[Note]:
    """One note naming the fields outside the schema (at most 8, with their counts)."""
    if not counts:
        return []
    shown = ", ".join(f"{name} ({n} of {n_logs} logs)" for name, n in sorted(counts.items())[:8])
    more = f" and {len(counts) - 8} more" if len(counts) > 8 else ""
    return [Note("skipped", label, f"ignored field(s) not in distseg.core.schema: {shown}{more}")]


def combine_stats(logs: Sequence[RankSummary]) -> pd.DataFrame:
    """Every rank's ``step_stats`` in one frame, in rank order (frees them)."""
    frames = [log.stats for log in logs if log.stats is not None]
    for log in logs:
        log.stats = None
    if not frames:
        return pd.DataFrame({c: [] for c in STAT_COLUMNS})
    return pd.concat(frames, ignore_index=True)


CURVE_COLUMNS = ("segment", "epoch", "step", "global_step", "t", "wall_s", "loss", "lr",
                 "loss_smoothed")
CROSSING_COLUMNS = ["target", "window", "reached", "segment", "t", "wall_s", "epoch",
                    "step", "global_step"]
#: What ``run_progress`` adds to the crossings: steps and samples, all ranks.
PROGRESS_COLUMNS = ["steps", "samples", "made_up"]


@dataclass(frozen=True)
class Curve:
    """The run's loss curve on its wall clock (``global_curve``).

    Attributes:
      frame: the kept records (``RunData.curve``).
      crossings: ``RunData.crossings``.
      records, stride, loss_min: as in ``analysis.reduce.RankCurve`` (0, 1, NaN: none).
      notes: no curve at all, or how it was thinned.
    """

    frame: pd.DataFrame
    crossings: pd.DataFrame
    records: int = 0
    stride: int = 1
    loss_min: float = math.nan
    notes: tuple[Note, ...] = ()


def _global_crossings(curve: RankCurve, rank: int, launches: Launches,
                      offsets: np.ndarray) -> pd.DataFrame:
    cross = crossing_table(curve.crossings)
    reached = cross["reached"].to_numpy(bool)
    seg = cross["segment"].to_numpy(np.int64, copy=True)
    if reached.any():
        seg[reached] = launches.to_global(rank, seg[reached])
    cross["segment"] = seg
    cross["wall_s"] = np.where(reached, offsets[np.where(reached, seg, 0)] + cross["t"], np.nan)
    return cross[CROSSING_COLUMNS]


def global_curve(curve: RankCurve | None, rank: int | None, launches: Launches,
                 offsets: np.ndarray, label: str) -> Curve:
    """The loss curve and its target crossings on the run's wall clock (``wall_s``:
    launch offset + ``t``)."""
    if curve is None:
        return Curve(pd.DataFrame({c: [] for c in CURVE_COLUMNS}),
                     pd.DataFrame({c: [] for c in CROSSING_COLUMNS}),
                     notes=(Note("warning", label, "no step records; no loss curve"),))
    frame = curve.thin
    frame["segment"] = launches.to_global(rank, frame["segment"].to_numpy())
    frame.insert(5, "wall_s", offsets[frame["segment"].to_numpy()] + frame["t"].to_numpy())
    frame = frame.sort_values("wall_s", kind="stable").reset_index(drop=True)
    notes = ()
    if curve.stride > 1:
        notes = (Note("info", label, f"loss curve thinned for plotting: 1 in every "
                      f"{curve.stride} of {curve.records:,} step records (and the last) in "
                      "loss_vs_time.csv; targets are found on all of them"),)
    return Curve(frame[list(CURVE_COLUMNS)], _global_crossings(curve, rank, launches, offsets),
                 curve.records, curve.stride, curve.loss_min, notes)


@dataclass(frozen=True)
class RunProgress:
    """What the run trained on up to each target and epoch (``run_progress``).

    Attributes:
      crossings: the curve's crossings with ``PROGRESS_COLUMNS`` added.
      trained: by the last step record.
      epochs: by the end of each epoch (``progress.at_epochs``).
      notes: what the numbers rest on, when not every rank's every record.
    """

    crossings: pd.DataFrame
    trained: Trained
    epochs: pd.DataFrame
    notes: list[Note]


def run_progress(curve: Curve, samples: SampleSum, launches: Launches,
                 segments: pd.DataFrame, epochs: pd.DataFrame, label: str) -> RunProgress:
    """Steps and samples of all ranks up to each loss-target crossing, to the end of
    each epoch and to the last step (``analysis.progress``)."""
    sizes = [None if pd.isna(n) else int(n) for n in segments["size"]]
    path = samples.trajectory(launches.keys, sizes)
    at = at_crossings(path, curve.crossings)
    crossings = pd.concat([curve.crossings, at], axis=1)[CROSSING_COLUMNS + PROGRESS_COLUMNS]
    done = at_epochs(path, epochs)
    made_up = int(max([0, *at["made_up"], *done["made_up"]]))
    return RunProgress(crossings, path.last(), done, progress_notes(path, made_up, label))


def _latest_epochs(epochs: pd.DataFrame, offsets: np.ndarray,
                   label: str) -> tuple[pd.DataFrame, list[Note]]:
    """Numbered epochs on the wall clock, one per rank and epoch (a resumed launch's)."""
    notes = []
    epochs["epoch"] = pd.to_numeric(epochs["epoch"], errors="coerce")
    unplaced = int(epochs["epoch"].isna().sum())
    if unplaced:
        notes.append(Note("skipped", label, f"{unplaced} epoch record(s) without an epoch "
                          "number"))
    epochs = epochs.dropna(subset=["epoch"])
    epochs["epoch"] = epochs["epoch"].astype(np.int64)
    epochs["wall_s"] = offsets[epochs["segment"].to_numpy()] + epochs["t"].to_numpy()
    before = len(epochs)
    epochs = (epochs.sort_values(["rank", "epoch", "segment"], kind="stable")
              .drop_duplicates(["rank", "epoch"], keep="last").reset_index(drop=True))
    if len(epochs) < before:
        notes.append(Note("info", label, f"{before - len(epochs)} epoch record(s) repeated "
                          "by a resumed launch; the later ones are used"))
    return epochs, notes


def epoch_table(logs: Sequence[RankSummary], launches: Launches, offsets: np.ndarray,
                label: str) -> tuple[pd.DataFrame, list[str], list[Note]]:
    """One row per rank and epoch, the Dice classes in log order, and notes.

    Columns: ``rank``, ``segment``, ``epoch``, ``t``, ``wall_s``, the epoch record's
    times, losses, samples and digest, and ``dice_CLASS`` / ``local_dice_CLASS``.
    """
    classes: list[str] = []
    frames = []
    for log in logs:
        classes += [c for c in log.classes if c not in classes]
        if len(log.epochs):
            frame = log.epochs.copy()
            frame["segment"] = launches.to_global(
                log.rank, frame["segment"].to_numpy(np.int64)).astype(np.int64)
            frames.append(frame)
    epochs, notes = (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), []
    if len(epochs):
        epochs, notes = _latest_epochs(epochs, offsets, label)
    orphans = sum(log.orphan_epochs for log in logs)
    if orphans:
        notes.append(Note("skipped", label, f"{orphans} epoch record(s) before any run record"))
    return epochs, classes, notes


def _status(ends: list[dict], size: int | None) -> tuple[str, bool]:
    if not ends:
        return "no end record (still running, or killed)", False
    by = {}
    for e in ends:
        by.setdefault(str(e.get("status")), []).append(e)
    n = size or len(ends)
    for bad in ("error", "interrupted"):
        if bad in by:
            reason = str(by[bad][0].get("reason", "")).strip()
            return f"{bad}: {reason}" if reason else bad, False
    if "ok" in by and len(by["ok"]) >= n:
        return "ok", True
    return f"ok on {len(by.get('ok', []))} of {n} ranks (others still running or killed)", False


def run_status(logs: Sequence[RankSummary], launches: Launches,
               who: Identity) -> tuple[str, bool]:
    """What the last launch's ``end`` records say, and whether every rank ended ``ok``."""
    ends = [r for log in logs for r in log.ends
            if launches.maps[log.rank].get(r["_segment"]) == launches.last]
    return _status(ends, len(who.last_runs) or who.size)


def rank_notes(present: Sequence[int], size: int | None, label: str) -> list[Note]:
    """Notes on ranks whose log is missing, or logs beyond the run's size."""
    if not size:
        return []
    notes = []
    missing = sorted(set(range(size)) - set(present))
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        notes.append(Note("skipped", label, f"log of rank(s) {shown} missing "
                          f"({len(missing)} of {size}); sums over ranks are extrapolated"))
    extra = sorted(set(present) - set(range(size)))
    if extra:
        notes.append(Note("warning", label, f"logs of rank(s) {extra} beyond the run size {size}"))
    return notes


def load_run(run_dir: str, label: str | None = None,
             progress: Callable[[int], None] | None = None,
             files: dict[int, str] | None = None, spec: CurveSpec | None = None,
             summaries: Iterable[RankSummary] | None = None) -> RunData:
    """Reads every rank's log of a run directory and combines them.

    Args:
      run_dir: the run directory.
      label: name used in tables; defaults to the directory name.
      progress: called with the number of bytes of each log file once it is read.
      files: rank -> log path, when ``check_run_dir`` was already called.
      spec: the loss targets and smoothing the curve is reduced for.
      summaries: the files already reduced, in the order of ``files`` (``read_logs``).

    Returns:
      The run, with notes on everything skipped.

    Raises:
      RunDirError: the directory does not exist or holds no logs.
      InputError: a log was written by a newer distseg.
    """
    files = check_run_dir(run_dir) if files is None else files
    label = label or run_label(run_dir)
    config, notes = read_config(run_dir, label)
    read = read_logs(files, progress, spec, summaries)
    notes += read.notes + unknown_fields_notes(read.unknown_fields, len(files), label)
    launches = map_launches(read.logs)
    who = identify(read.logs, launches)
    segments = launch_table(read.logs, launches)
    notes += launch_notes(segments, label)
    durations = launch_durations(read.logs, launches)
    offsets = offsets_of(durations)
    segments["duration_s"] = durations[:launches.count]
    segments["offset_s"] = offsets[:launches.count]
    curve = global_curve(read.curve, read.curve_rank, launches, offsets, label)
    epochs, classes, epoch_notes = epoch_table(read.logs, launches, offsets, label)
    done = run_progress(curve, read.samples, launches, segments, epochs, label)
    status, finished = run_status(read.logs, launches, who)
    present = [log.rank for log in read.logs]
    notes += [*curve.notes, *epoch_notes, *rank_notes(present, who.size, label)]
    if not finished:
        notes.append(Note("info", label, f"status: {status}"))
    missing = sorted(set(range(who.size)) - set(present)) if who.size else []
    return RunData(label=label, path=run_dir, size=who.size, hosts=who.hosts,
                   rank_hosts=who.rank_hosts, run_record=who.run_record, config=config,
                   segments=segments, placement=placement_table(read.logs, launches),
                   ranks_present=present, ranks_missing=missing, status=status,
                   finished=finished, epochs=epochs, step_stats=combine_stats(read.logs),
                   curve=curve.frame, curve_rank=read.curve_rank,
                   curve_records=curve.records, curve_stride=curve.stride,
                   curve_loss_min=curve.loss_min, crossings=done.crossings,
                   classes=classes, notes=notes, trained=done.trained,
                   epoch_progress=done.epochs, progress_notes=done.notes)


def unique_labels(run_dirs: Sequence[str]) -> list[str]:
    """Directory names, or the paths as given where two names collide."""
    names = [run_label(p) for p in run_dirs]
    return [p if names.count(n) > 1 else n for n, p in zip(names, run_dirs)]


def load_runs(run_dirs: Sequence[str], show_progress: bool | None = None,
              spec: CurveSpec | None = None, processes: int | None = None) -> list[RunData]:
    """Checks every run directory, then reads them with a progress bar on stderr.

    The files of all runs are reduced in worker processes when there is enough to
    read and more than one core (``analysis.workers.worker_count``), else here.

    Args:
      run_dirs: run directories, in the order the report lists them.
      show_progress: ``True``/``False`` forces the bar on/off; ``None`` shows it when
        stderr is a terminal.
      spec: the loss targets and smoothing the curves are reduced for.
      processes: worker processes (0: none); default: ``worker_count``.

    Raises:
      RunDirError: a directory is missing or has no logs (checked before any reading,
        so a typo fails fast).
      InputError: a log was written by a newer distseg.
    """
    from tqdm import tqdm

    spec = spec or CurveSpec()
    all_files = [check_run_dir(p) for p in run_dirs]
    sizes = [os.path.getsize(p) if os.path.exists(p) else 0
             for files in all_files for p in files.values()]
    if processes is None:
        processes = workers.worker_count(sum(sizes), max(sizes), len(sizes))
    tasks = [(rank, path, spec) for files in all_files for rank, path in files.items()]
    disable = None if show_progress is None else not show_progress
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, desc="reading logs",
              disable=disable, leave=False, dynamic_ncols=True) as bar, \
            workers.ordered_map(reduce_file, tasks, processes) as reduced:
        return [load_run(p, label, progress=bar.update, files=files, spec=spec,
                         summaries=itertools.islice(reduced, len(files)))
                for p, label, files in zip(run_dirs, unique_labels(run_dirs), all_files)]
