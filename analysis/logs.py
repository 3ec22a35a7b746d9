"""Reading run directories: per-rank JSON-lines logs into pandas frames.

The contract is ``distseg.core.schema``. Step records dominate a log (one per training
step per rank, millions in a large study), so the lines that start as
``distseg.training.runlog`` writes a step record are parsed together by pyarrow's JSON reader
against an explicit schema; the few other records (``run``, ``epoch``, ``end``) are
parsed with ``json`` because they hold nested fields. A file whose step lines pyarrow
cannot parse (a corrupt line in the middle, a field that changed type) is parsed line
by line instead, which is slower but skips only the bad lines. Fields outside the
schema are ignored and named in a note.

Nothing here raises on a damaged log: every line, field or file that is skipped becomes
a ``Note`` that the report prints, so a reader can tell what the numbers rest on.
Two things are errors (``distseg.core.errors.InputError``, exit 2): a run directory that
does not exist or holds no logs at all (``RunDirError``), because then there is nothing
to report, and a log whose ``run`` record carries a ``schema_version`` newer than
``distseg.core.schema.SCHEMA_VERSION``, because its fields may mean something else now.

Memory does not grow with the number of steps: each file is reduced as soon as it is
parsed (``reduce_log``: per-rank step statistics, a thinned loss curve with the exact
target crossings, the epoch records as a small frame; see ``analysis.reduce``), and
only those summaries are kept. Files are reduced in parallel worker processes when
there is enough to read (``analysis.workers``).

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
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

from analysis import workers
from analysis.document import Note
from analysis.progress import SampleSum, Trained, at_crossings, at_epochs, progress_notes
from analysis.reduce import STAT_COLUMNS, CurveSpec, RankCurve, crossing_table, reduce_curve, sample_runs, step_stats
from distseg.core import rundir, schema
from distseg.core.errors import InputError, refuse_newer

#: Step-record fields read into the step frames. All are parsed as float64 so that a
#: producer writing ``1`` or ``1.0`` for an integer field does not break the fast path;
#: integer columns are converted after parsing.
STEP_FIELDS = ("epoch", "step", "global_step", "t", "step_time", "data_wait", "loss", "lr",
               "samples")
#: Fields the report knows but does not read from step records (parsed, then dropped;
#: any other field is reported as unknown).
_UNUSED_STEP_FIELDS = tuple(f for f in schema.COMMON + schema.FIELDS["step"]
                            if f not in STEP_FIELDS and f != "type")
_ARROW_SCHEMA = pa.schema([("type", pa.string())]
                          + [(f, pa.float64()) for f in STEP_FIELDS + _UNUSED_STEP_FIELDS])
#: How ``distseg.training.runlog`` starts every step line (compact JSON, ``type`` first).
_STEP_PREFIX = b'{"type":"step",'

#: Fields in the schema; any other is reported as unknown and ignored.
KNOWN_FIELDS = {kind: frozenset(schema.COMMON + fields + schema.OPTIONAL[kind])
                for kind, fields in schema.FIELDS.items()}
_RECORD_START = re.compile(rb'\{\s*"type"\s*:')
_OPEN_BRACE = ord("{")
_NEWLINE = ord("\n")


class RunDirError(InputError):
    """A run directory that cannot be reported at all (missing, or without logs): exit 2."""


def dict_field(record: dict, key: str) -> dict | None:
    """``record[key]`` when it is a JSON object, else ``None`` (absent or garbled).

    The one check of the nested objects of a ``run`` record (``dataset``, ``model``):
    a producer may omit them, and a reader must not trust their type.
    """
    value = record.get(key)
    return value if isinstance(value, dict) else None


def count(value: Any) -> int | None:
    """``value`` as a count (a non-negative integer, ``16`` or ``16.0``), else ``None``:
    a logged size is used only when it is one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


@dataclass
class RankLog:
    """The parsed content of one rank's log file.

    Attributes:
      rank: rank from the file name.
      path: the file.
      runs: ``run`` records in file order.
      epochs: ``epoch`` records; each has ``_segment``, the index in ``runs`` of the
        ``run`` record it follows (-1 when none does).
      ends: ``end`` records, with ``_segment`` likewise.
      steps: one row per step record, columns ``segment`` (local, as above) and
        ``STEP_FIELDS``.
      notes: what was skipped while reading.
      unknown_fields: ``"type.field"`` names of fields outside the schema (ignored).
    """

    rank: int
    path: str
    runs: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    ends: list[dict] = field(default_factory=list)
    steps: pd.DataFrame | None = None
    notes: list[Note] = field(default_factory=list)
    unknown_fields: set[str] = field(default_factory=set)


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


# --------------------------------------------------------------------------- one file


def _empty_steps() -> pd.DataFrame:
    cols = {"segment": np.array([], np.int32)}
    cols.update({f: np.array([], np.float64) for f in STEP_FIELDS})
    return pd.DataFrame(cols)


def _salvage(line: bytes) -> dict | None:
    """Recovers a record written after a truncated one on the same line.

    A killed job leaves its last line without a newline; when the run is resumed the
    log is opened for appending and the next record lands on that same line.
    """
    for m in _RECORD_START.finditer(line, 1):
        try:
            rec = json.loads(line[m.start():])
        except ValueError:
            continue
        if isinstance(rec, dict):
            return rec
    return None


def _split_lines(data: bytes, path: str, notes: list[Note]) -> tuple[bytes, np.ndarray]:
    """Returns the complete lines of ``data`` and their start offsets.

    An unterminated last line is kept only if it is a whole JSON record (a file that
    merely lacks its final newline); otherwise it is the line a killed or running
    job was writing, and is dropped with a note.
    """
    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == _NEWLINE)
    end = int(nl[-1]) + 1 if len(nl) else 0
    if end < len(data):
        tail = data[end:]
        if tail.strip():
            try:
                ok = isinstance(json.loads(tail), dict)
            except ValueError:
                ok = False
            if ok:
                data = data + b"\n"
                nl = np.append(nl, len(data) - 1)
                end = len(data)
            else:
                notes.append(Note("skipped", path, f"line {len(nl) + 1}: truncated last line "
                                  f"({len(tail)} bytes; job killed or still running)"))
    starts = np.concatenate(([0], nl[:-1] + 1)) if len(nl) else np.array([], np.int64)
    return data[:end], starts


def _records_from_lines(lines: Iterable[tuple[int, bytes]], path: str,
                        notes: list[Note]) -> list[tuple[int, dict]]:
    """Parses ``(line_index, bytes)`` pairs with ``json``, skipping what does not parse."""
    out, bad = [], []
    for i, raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = _salvage(raw)
            if rec is None:
                bad.append(i + 1)
                continue
            notes.append(Note("skipped", path, f"line {i + 1}: a truncated record followed by "
                              "another on the same line (resumed after a kill); kept the latter"))
        if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
            bad.append(i + 1)
            continue
        out.append((i, rec))
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        notes.append(Note("skipped", path, f"{len(bad)} line(s) that are not log records "
                          f"(not valid JSON objects with a type): line {shown}"))
    return out


def _steps_from_records(recs: Sequence[tuple[int, dict]]) -> pd.DataFrame:
    if not recs:
        return pd.DataFrame({"_line": np.array([], np.int64),
                             **{f: np.array([], np.float64) for f in STEP_FIELDS}})
    frame = pd.DataFrame.from_records([r for _, r in recs], columns=list(STEP_FIELDS))
    frame = frame.apply(pd.to_numeric, errors="coerce").astype(np.float64)
    frame.insert(0, "_line", np.fromiter((i for i, _ in recs), np.int64, len(recs)))
    return frame


def _read_steps(blob: bytes, block: int, behaviour: str) -> pa.Table:
    options = pa_json.ParseOptions(explicit_schema=_ARROW_SCHEMA,
                                   unexpected_field_behavior=behaviour)
    return pa_json.read_json(pa.BufferReader(pa.py_buffer(blob)),
                             read_options=pa_json.ReadOptions(block_size=block),
                             parse_options=options)


def _parse_fast(data: bytes, starts: np.ndarray, path: str, notes: list[Note],
                unknown: set[str]) -> tuple[pd.DataFrame, list[tuple[int, dict]]] | None:
    """Parses step lines with pyarrow, the rest with ``json``; ``None``: use the slow path.

    Lines that start exactly as ``distseg.training.runlog`` writes a step record
    (``{"type":"step",``) are gathered into one buffer and parsed by pyarrow, one row
    per line; every other line (run, epoch and end records, blank or odd lines) goes
    through ``json``, which also parses a step record written differently.
    """
    if len(starts) == 0:
        return _steps_from_records([]), []
    buf = np.frombuffer(data, np.uint8)
    ends = np.append(starts[1:], len(data))
    lengths = ends - starts
    k = len(_STEP_PREFIX)
    probe = np.minimum(starts[:, None] + np.arange(k), len(buf) - 1)
    is_step = (lengths > k) & (buf[probe] == np.frombuffer(_STEP_PREFIX, np.uint8)).all(axis=1)
    del probe
    # A step record holds no nested object: a second "{" on a line is a truncated record
    # followed by another (a job killed, then resumed) or a field outside the schema;
    # such lines take the json path, which salvages what it can.
    braces = np.bincount(np.searchsorted(starts, np.flatnonzero(buf == _OPEN_BRACE),
                                         side="right") - 1, minlength=len(starts))
    is_step &= braces == 1
    step_lines = np.flatnonzero(is_step)
    if len(step_lines):
        # Runs of consecutive step lines, copied once each (other lines are few).
        edges = np.flatnonzero(np.diff(np.concatenate(([0], is_step.view(np.int8), [0]))))
        view = memoryview(data)
        blob = b"".join(view[starts[a]:ends[b - 1]] for a, b in edges.reshape(-1, 2))
        del view
        block = max(1 << 20, 2 * int(lengths[step_lines].max()))
        try:
            table = _read_steps(blob, block, "infer")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            # Unknown fields whose types vary between lines cannot be inferred.
            try:
                table = _read_steps(blob, block, "ignore")
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                notes.append(Note("info", path, "fast parse failed "
                                  f"({str(e).splitlines()[0][:120]}); read line by line"))
                return None
            for i in (step_lines[0], step_lines[-1]):
                try:
                    unknown.update(f"step.{f}" for f in json.loads(data[starts[i]:ends[i]]).keys()
                                   - KNOWN_FIELDS["step"])
                except (ValueError, AttributeError):
                    pass
        del blob
        if table.num_rows != len(step_lines):
            return None
        unknown.update(f"step.{n}" for n in table.column_names
                       if n not in _ARROW_SCHEMA.names and n not in KNOWN_FIELDS["step"])
        steps = table.select(list(STEP_FIELDS)).to_pandas()
        del table
    else:
        steps = pd.DataFrame({f: np.array([], np.float64) for f in STEP_FIELDS})
    steps.insert(0, "_line", step_lines)
    other = np.flatnonzero(~is_step)
    others = _records_from_lines(((int(i), data[starts[i]:ends[i]]) for i in other), path, notes)
    moved = [(i, r) for i, r in others if r["type"] == "step"]
    if moved:
        for _, r in moved:
            unknown.update(f"step.{f}" for f in r.keys() - KNOWN_FIELDS["step"])
        steps = pd.concat([steps, _steps_from_records(moved)], ignore_index=True)
        steps = steps.sort_values("_line", kind="stable").reset_index(drop=True)
        others = [(i, r) for i, r in others if r["type"] != "step"]
    return steps, others


def _read_bytes(path: str, notes: list[Note]) -> bytes | None:
    """The file's bytes, or ``None`` with a note when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        notes.append(Note("skipped", path, f"cannot be read ({e.strerror or e})"))
        return None


def _parse_slow(data: bytes, starts: np.ndarray, path: str, notes: list[Note],
                unknown: set[str]) -> tuple[pd.DataFrame, list[tuple[int, dict]]]:
    """Every line through ``json``: the fallback when pyarrow cannot read the step lines."""
    ends = np.append(starts[1:], len(data))
    recs = _records_from_lines(((i, data[s:e]) for i, (s, e) in enumerate(zip(starts, ends))),
                               path, notes)
    step_recs = [(i, r) for i, r in recs if r["type"] == "step"]
    for _, r in step_recs:
        unknown.update(f"step.{k}" for k in r.keys() - KNOWN_FIELDS["step"])
    return _steps_from_records(step_recs), [(i, r) for i, r in recs if r["type"] != "step"]


def _sort_records(log: RankLog, others: Sequence[tuple[int, dict]]) -> list[int]:
    """Files the non-step records of ``log`` by type; returns the ``run`` records' lines.

    Each ``epoch`` and ``end`` record gets ``_segment``: the index of the ``run`` record
    it follows (-1 before any). A record that breaks the schema is kept with a warning
    (its other fields still count); one of an unknown type is counted and ignored.
    """
    run_lines: list[int] = []
    unknown_types: Counter = Counter()
    for i, rec in others:
        kind = rec["type"]
        if kind not in schema.FIELDS:
            unknown_types[kind] += 1
            continue
        log.unknown_fields.update(f"{kind}.{k}" for k in rec.keys() - KNOWN_FIELDS[kind])
        try:
            schema.validate_record(rec)
        except schema.UnknownStatus as e:
            log.notes.append(Note("warning", log.path, f"line {i + 1}: {e}"))
        except schema.RecordError as e:
            log.notes.append(Note("warning", log.path, f"line {i + 1}: {e}; used what is there"))
        if kind == "run":
            run_lines.append(i)
            log.runs.append(rec)
        elif kind in ("epoch", "end"):
            rec["_segment"] = len(run_lines) - 1
            (log.epochs if kind == "epoch" else log.ends).append(rec)
    for kind, n in unknown_types.items():
        log.notes.append(Note("info", log.path, f"{n} record(s) of unknown type {kind!r} ignored"))
    return run_lines


def refuse_newer_schema(log: RankLog) -> None:
    """Raises ``InputError`` naming the file when a ``run`` record of ``log`` carries a
    ``schema_version`` newer than this distseg reads (a missing one is only noted by
    the schema check, as for any missing field)."""
    for rec in log.runs:
        if rec.get("schema_version") is not None:
            refuse_newer(log.path, "schema_version", rec["schema_version"],
                         schema.SCHEMA_VERSION)


def _rank_mismatch(log: RankLog) -> list[Note]:
    for rec in log.runs:
        if rec.get("rank") not in (None, log.rank):
            return [Note("warning", log.path, f"run record says rank {rec.get('rank')}, "
                         f"file name says {log.rank}; using {log.rank}")]
    return []


def segment_steps(steps: pd.DataFrame, run_lines: Sequence[int], path: str,
                  notes: list[Note]) -> pd.DataFrame:
    """Replaces the steps' ``_line`` by ``segment``: the index of the ``run`` record
    before each (-1: none), and notes a step field that no record carries."""
    seg = np.searchsorted(np.asarray(run_lines, np.int64), steps["_line"].to_numpy(),
                          side="right") - 1
    steps = steps.drop(columns="_line")
    steps.insert(0, "segment", seg.astype(np.int32))
    for name in STEP_FIELDS:
        if len(steps) and steps[name].isna().all():
            notes.append(Note("warning", path, f"step records lack field {name!r}"))
    return steps


def read_rank_log(path: str, rank: int) -> RankLog:
    """Reads one rank's log, never raising on its content (only on its version).

    Args:
      path: the ``rank-NNNNN.jsonl`` file.
      rank: the rank its name says.

    Returns:
      The records by type, step records as a frame, and notes on what was skipped.

    Raises:
      InputError: a ``run`` record's ``schema_version`` is newer than this distseg's.
    """
    log = RankLog(rank=rank, path=path)
    data = _read_bytes(path, log.notes)
    if data is None:
        log.steps = _empty_steps()
        return log
    data, starts = _split_lines(data, path, log.notes)
    parsed = _parse_fast(data, starts, path, log.notes, log.unknown_fields)
    if parsed is None:
        parsed = _parse_slow(data, starts, path, log.notes, log.unknown_fields)
    steps, others = parsed
    del data, parsed
    run_lines = _sort_records(log, others)
    refuse_newer_schema(log)
    log.notes.extend(_rank_mismatch(log))
    log.steps = segment_steps(steps, run_lines, path, log.notes)
    return log


# --------------------------------------------------------------------------- one run


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


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


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
NOISE_FIELDS = ("b_simple", "g2", "trace", "small_batch", "big_batch")


def noise_columns(rec: dict) -> dict[str, Any]:
    """``noise_b_simple``, ``noise_g2``, ``noise_trace``, ``noise_small_batch``,
    ``noise_big_batch`` (NaN where null) and ``noise_method`` of an epoch record's
    ``noise_scale``; nothing when it has none (older logs), so their frames keep the
    columns they always had."""
    noise = dict_field(rec, "noise_scale")
    if noise is None:
        return {}
    out: dict[str, Any] = {f"noise_{k}": _num(noise.get(k)) for k in NOISE_FIELDS}
    out["noise_method"] = str(noise.get("method", ""))
    return out


def epoch_rows(log: RankLog) -> tuple[pd.DataFrame, list[str], int]:
    """The epoch records of ``log`` as a frame, the Dice classes, and the unplaceable.

    One row per epoch record placed after a ``run`` record: ``rank``, ``segment``
    (local to the file), ``epoch``, ``t``, times, losses, samples, ``sample_digest``,
    ``dice_CLASS`` and ``local_dice_CLASS``, and where logged the noise scale
    (``noise_columns``). The classes come in the order the file
    first names them; the count is of epoch records before any ``run`` record.
    """
    rows: list[dict] = []
    classes: list[str] = []
    for rec in log.epochs:
        if rec["_segment"] < 0:
            continue
        row = {"rank": log.rank, "segment": rec["_segment"], "epoch": rec.get("epoch"),
               "t": _num(rec.get("t")), "epoch_time": _num(rec.get("epoch_time")),
               "train_time": _num(rec.get("train_time")),
               "samples": _num(rec.get("samples")), "sample_digest": rec.get("sample_digest"),
               "train_loss": _num(rec.get("train_loss")), "val_loss": _num(rec.get("val_loss")),
               "val_samples_local": _num(rec.get("val_samples_local"))}
        for key, prefix in (("val_dice", "dice_"), ("val_dice_local", "local_dice_")):
            dice = rec.get(key)
            if isinstance(dice, dict):
                for cls, v in dice.items():
                    if cls not in classes:
                        classes.append(cls)
                    row[prefix + cls] = _num(v)
        row.update(noise_columns(rec))
        rows.append(row)
    orphans = sum(1 for r in log.epochs if r["_segment"] < 0)
    return pd.DataFrame(rows), classes, orphans


def record_tmax(log: RankLog, steps: pd.DataFrame) -> dict[int, float]:
    """Local segment -> the largest finite ``t`` of its placed steps, epochs and ends."""
    tmax = ({int(k): float(v) for k, v in steps.groupby("segment")["t"].max().items()}
            if len(steps) else {})
    for rec in log.epochs + log.ends:
        seg, t = rec["_segment"], _num(rec.get("t"))
        if seg >= 0 and math.isfinite(t):
            tmax[seg] = max(tmax.get(seg, -math.inf), t)
    return tmax


def _steps_per_epoch(run: dict) -> int | None:
    """A ``run`` record's ``steps_per_epoch`` when it is a positive number."""
    value = _num(run.get("steps_per_epoch"))
    return int(value) if math.isfinite(value) and value >= 1 else None


def launch_keys(runs: Sequence[dict]) -> list[tuple]:
    """The launch key (``_segment_key``) of each of a file's ``run`` records."""
    return [_segment_key(r, i) for i, r in enumerate(runs)]


def _segment_key(rec: dict, local: int) -> tuple:
    """Identifies a launch across ranks: the agreed start time and run id.

    ``start_time`` is broadcast from rank 0, so it is the same on every rank of a launch.
    """
    st = _num(rec.get("start_time"))
    return (round(st, 3) if math.isfinite(st) else float(local), str(rec.get("run_id", "")))


def launch_order(runs: Sequence[dict]) -> np.ndarray:
    """A file's segment numbers -> their launch's place in time among this file's
    launches (the order ``map_launches`` gives them across all files)."""
    keys = [_segment_key(r, i) for i, r in enumerate(runs)]
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
        once added to ``LogSet.samples``).
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


@dataclass(frozen=True)
class Launches:
    """The launches of a run (a resumed run has several), across ranks.

    Attributes:
      keys: ``(start_time, run_id)`` of each launch, in time order; the index is the
        launch's (global) segment number.
      maps: rank -> index of a ``run`` record in that rank's file -> segment number.
    """

    keys: list[tuple]
    maps: dict[int, dict[int, int]]

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def last(self) -> int:
        return len(self.keys) - 1

    def to_global(self, rank: int, local: np.ndarray) -> np.ndarray:
        """Segment numbers of ``rank``'s file -> launch numbers."""
        m = self.maps[rank]
        return np.array([m[i] for i in range(len(m))], np.int32)[local]

    def run_records(self, logs: Sequence[RankSummary], segment: int) -> list[tuple[int, dict]]:
        """``(rank, run record)`` of each record of launch ``segment``, in rank order."""
        return [(log.rank, r) for log in logs for i, r in enumerate(log.runs)
                if self.maps[log.rank][i] == segment]


def map_launches(logs: Sequence[RankSummary]) -> Launches:
    """Matches the ``run`` records of all ranks into launches."""
    keys = sorted({key for log in logs for key in launch_keys(log.runs)})
    index = {k: i for i, k in enumerate(keys)}
    maps = {log.rank: {i: index[_segment_key(r, i)] for i, r in enumerate(log.runs)}
            for log in logs}
    return Launches(keys=keys, maps=maps)


def _sizes(records: Iterable[dict]) -> list[int]:
    """The ``size`` fields of ``records`` that are numbers."""
    return [int(_num(r.get("size"))) for r in records if math.isfinite(_num(r.get("size")))]


def _hosts(records: Iterable[tuple[int, dict]]) -> list[str]:
    """Distinct host names of ``(rank, run record)`` pairs, sorted."""
    return sorted({str(r["host"]) for _, r in records if r.get("host") is not None})


@dataclass(frozen=True)
class Identity:
    """Who ran: the size, the hosts and the reference ``run`` record.

    Attributes:
      size: ranks of the run (the largest any launch logged; ``None``: no run record).
      last_runs: rank -> ``run`` record of the last launch.
      run_record: the last launch's record of the lowest rank that has one.
      rank_hosts: rank -> host in the last launch.
      hosts: distinct hosts of the launch that ran on the most (the latest of those).
        Like ``size``, the most any one launch used: a run resumed on a fresh
        allocation of as many nodes never ran on both at once.
    """

    size: int | None
    last_runs: dict[int, dict]
    run_record: dict
    rank_hosts: dict[int, str]
    hosts: list[str]


def identify(logs: Sequence[RankSummary], launches: Launches) -> Identity:
    """The run's size, hosts and reference record, from its ``run`` records."""
    sizes = _sizes(r for log in logs for r in log.runs)
    last_runs = dict(launches.run_records(logs, launches.last))
    rank_hosts = {rank: str(r["host"]) for rank, r in last_runs.items()
                  if r.get("host") is not None}
    hosts: list[str] = []
    for k in range(launches.count):
        launch_hosts = _hosts(launches.run_records(logs, k))
        if len(launch_hosts) >= len(hosts):
            hosts = launch_hosts
    return Identity(size=max(sizes) if sizes else None, last_runs=last_runs,
                    run_record=last_runs[min(last_runs)] if last_runs else {},
                    rank_hosts=rank_hosts, hosts=hosts)


LAUNCH_COLUMNS = ["segment", "start_time", "run_id", "config_hash", "size", "nodes",
                  "ranks_logged", "duration_s"]


def launch_table(logs: Sequence[RankSummary], launches: Launches) -> pd.DataFrame:
    """One row per launch (durations still 0: see ``launch_durations``)."""
    rows = []
    for k, (_, run_id) in enumerate(launches.keys):
        pairs = launches.run_records(logs, k)
        recs = [r for _, r in pairs]
        seg_sizes = _sizes(recs)
        rows.append({"segment": k, "start_time": _num(recs[0].get("start_time")),
                     "run_id": run_id,
                     "config_hash": ",".join(sorted({str(r.get("config_hash")) for r in recs})),
                     "size": max(seg_sizes) if seg_sizes else None,
                     "nodes": len(_hosts(pairs)) or None, "ranks_logged": len(recs),
                     "duration_s": 0.0})
    return pd.DataFrame(rows, columns=LAUNCH_COLUMNS)


def launch_notes(segments: pd.DataFrame, label: str) -> list[Note]:
    """Notes on the launches: none at all, or several that differ in config, size or
    nodes."""
    if not len(segments):
        return [Note("warning", label, "no run record in any log; ranks, nodes and dataset "
                     "size are unknown")]
    if len(segments) == 1:
        return []
    notes = [Note("info", label, f"resumed run: {len(segments)} launches; wall-clock time is "
                  "the sum of their durations")]
    if segments["config_hash"].nunique() > 1:
        notes.append(Note("warning", label, "the config changed between launches "
                          f"(config hashes {', '.join(segments['config_hash'])})"))
    if segments["size"].nunique() > 1:
        notes.append(Note("warning", label, "the number of ranks changed between launches "
                          f"({', '.join(map(str, segments['size']))})"))
    if "nodes" in segments and segments["nodes"].nunique() > 1:
        counts = ", ".join("?" if pd.isna(n) else str(int(n)) for n in segments["nodes"])
        notes.append(Note("warning", label, f"the number of nodes changed between launches "
                          f"({counts}); nodes is the most any launch ran on"))
    return notes


def _affinity(threads: dict) -> tuple[int, ...] | None:
    """The CPUs of ``threads.affinity`` (``None``: not logged, or not a list of ints)."""
    cpus = threads.get("affinity")
    if not isinstance(cpus, list) or not all(isinstance(c, int) for c in cpus):
        return None
    return tuple(sorted(set(cpus)))


PLACEMENT_COLUMNS = ["segment", "rank", "host", "local_size", "cores", "cpus", "affinity"]


def placement_table(logs: Sequence[RankSummary], launches: Launches) -> pd.DataFrame:
    """One row per launch and rank: where it ran and on which CPUs (``RunData.placement``)."""
    rows = []
    for k in range(launches.count):
        for rank, rec in launches.run_records(logs, k):
            threads = dict_field(rec, "threads") or {}
            cpus = _affinity(threads)
            rows.append({"segment": k, "rank": rank,
                         "host": None if rec.get("host") is None else str(rec["host"]),
                         "local_size": _num(rec.get("local_size")),
                         "cores": _num(threads.get("cores")),
                         "cpus": math.nan if cpus is None else float(len(cpus)),
                         "affinity": cpus})
    return pd.DataFrame(rows, columns=PLACEMENT_COLUMNS)


def launch_durations(logs: Sequence[RankSummary], launches: Launches) -> np.ndarray:
    """Seconds each launch lasted: the largest ``t`` any rank logged in it (steps,
    epochs, ends).

    Always at least one entry (0 when there is no launch), so offsets can be taken.
    """
    durations = np.zeros(max(launches.count, 1))
    for log in logs:
        m = launches.maps[log.rank]
        for local, t in log.tmax.items():
            if local in m:
                durations[m[local]] = max(durations[m[local]], t)
    return durations


def offsets_of(durations: np.ndarray) -> np.ndarray:
    """Start of each launch on the run's wall clock: the sum of the earlier durations."""
    return np.concatenate(([0.0], np.cumsum(durations)[:-1]))


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
