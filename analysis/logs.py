"""Reading run directories: per-rank JSON-lines logs into pandas frames.

The contract is ``distseg.schema``. Step records dominate a log (one per training
step per rank, millions in a large study), so the lines that start as
``distseg.runlog`` writes a step record are parsed together by pyarrow's JSON reader
against an explicit schema; the few other records (``run``, ``epoch``, ``end``) are
parsed with ``json`` because they hold nested fields. A file whose step lines pyarrow
cannot parse (a corrupt line in the middle, a field that changed type) is parsed line
by line instead, which is slower but skips only the bad lines. Fields outside the
schema are ignored and named in a note.

Nothing here raises on a damaged log: every line, field or file that is skipped becomes
a ``Note`` that the report prints, so a reader can tell what the numbers rest on.
Only a run directory that does not exist or holds no logs at all is an error
(``RunDirError``), because then there is nothing to report.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

from distseg import schema

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
#: How ``distseg.runlog`` starts every step line (compact JSON, ``type`` first).
_STEP_PREFIX = b'{"type":"step",'

#: Fields in the schema; any other is reported as unknown and ignored.
KNOWN_FIELDS = {kind: frozenset(schema.COMMON + fields + schema.OPTIONAL[kind])
                for kind, fields in schema.FIELDS.items()}
_RECORD_START = re.compile(rb'\{\s*"type"\s*:')
_LOG_NAME = re.compile(r"^rank-(\d+)\.jsonl$")
_OPEN_BRACE = ord("{")
_NEWLINE = ord("\n")


class RunDirError(ValueError):
    """A run directory that cannot be reported at all (missing, or without logs)."""


@dataclass(frozen=True)
class Note:
    """One thing the report skipped, doubts or wants a reader to know.

    Attributes:
      level: ``skipped`` (data left out), ``warning`` (numbers may mislead) or ``info``.
      where: the run label or file the note is about.
      message: one line for a person.
    """

    level: str
    where: str
    message: str

    def line(self) -> str:
        return f"[{self.level}] {self.where}: {self.message}"


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
      hosts: distinct host names of the last segment's ranks.
      rank_hosts: rank -> host in the last segment.
      run_record: the last segment's ``run`` record of the lowest rank that has one.
      config: ``RUN/config.json`` or ``None`` when unreadable.
      segments: one row per launch (a resumed run has several): ``segment``,
        ``start_time``, ``run_id``, ``config_hash``, ``size``, ``duration_s`` (longest
        ``t`` any rank logged in it), ``offset_s`` (sum of the earlier durations).
      ranks_present / ranks_missing: ranks with / without a readable log.
      status: what the ``end`` records of the last segment say.
      finished: whether every rank of the last segment logged ``end`` with ``ok``.
      epochs: one row per rank and epoch (the last segment's when repeated).
      steps: one row per step and rank (compact): ``rank``, ``segment``, ``epoch``,
        ``warmup`` (first epoch of its segment), ``step_time``, ``data_wait``, ``samples``.
      curve: the training-loss curve from one rank (``curve_rank``): ``segment``,
        ``epoch``, ``step``, ``global_step``, ``t``, ``wall_s``, ``loss``, ``lr``.
      classes: validation Dice class names in log order.
      notes: everything skipped or doubtful.
    """

    label: str
    path: str
    size: int | None
    hosts: list[str]
    rank_hosts: dict[int, str]
    run_record: dict
    config: dict | None
    segments: pd.DataFrame
    ranks_present: list[int]
    ranks_missing: list[int]
    status: str
    finished: bool
    epochs: pd.DataFrame
    steps: pd.DataFrame
    curve: pd.DataFrame
    curve_rank: int | None
    classes: list[str]
    notes: list[Note]

    @property
    def nodes(self) -> int | None:
        return len(self.hosts) or None

    @property
    def ranks(self) -> int:
        return self.size if self.size else len(self.ranks_present)


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

    Lines that start exactly as ``distseg.runlog`` writes a step record
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
        known = set(_ARROW_SCHEMA.names)
        unknown.update(f"step.{n}" for n in table.column_names if n not in known)
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


def read_rank_log(path: str, rank: int) -> RankLog:
    """Reads one rank's log, never raising on its content.

    Args:
      path: the ``rank-NNNNN.jsonl`` file.
      rank: the rank its name says.

    Returns:
      The records by type, step records as a frame, and notes on what was skipped.
    """
    log = RankLog(rank=rank, path=path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        log.notes.append(Note("skipped", path, f"cannot be read ({e.strerror or e})"))
        log.steps = _empty_steps()
        return log
    data, starts = _split_lines(data, path, log.notes)
    parsed = _parse_fast(data, starts, path, log.notes, log.unknown_fields)
    if parsed is None:
        ends = np.append(starts[1:], len(data))
        recs = _records_from_lines(((i, data[s:e]) for i, (s, e) in enumerate(zip(starts, ends))),
                                   path, log.notes)
        step_recs = [(i, r) for i, r in recs if r["type"] == "step"]
        for _, r in step_recs:
            log.unknown_fields.update(f"step.{k}" for k in r.keys() - KNOWN_FIELDS["step"])
        steps = _steps_from_records(step_recs)
        others = [(i, r) for i, r in recs if r["type"] != "step"]
    else:
        steps, others = parsed
    del data

    run_lines = []
    unknown_types: dict[str, int] = {}
    for i, rec in others:
        kind = rec["type"]
        if kind not in schema.FIELDS:
            unknown_types[kind] = unknown_types.get(kind, 0) + 1
            continue
        log.unknown_fields.update(f"{kind}.{k}" for k in rec.keys() - KNOWN_FIELDS[kind])
        try:
            schema.validate_record(rec)
        except ValueError as e:
            if kind == "end" and "status" in str(e) and "lacks" not in str(e):
                log.notes.append(Note("warning", path, f"line {i + 1}: {e}"))
            else:
                log.notes.append(Note("warning", path, f"line {i + 1}: {e}; used what is there"))
        if kind == "run":
            run_lines.append(i)
            log.runs.append(rec)
        elif kind in ("epoch", "end"):
            rec["_segment"] = len(run_lines) - 1
            (log.epochs if kind == "epoch" else log.ends).append(rec)
    for kind, n in unknown_types.items():
        log.notes.append(Note("info", path, f"{n} record(s) of unknown type {kind!r} ignored"))
    for rec in log.runs:
        if rec.get("rank") not in (None, rank):
            log.notes.append(Note("warning", path, f"run record says rank {rec.get('rank')}, "
                                  f"file name says {rank}; using {rank}"))
            break

    seg = np.searchsorted(np.asarray(run_lines, np.int64), steps["_line"].to_numpy(),
                          side="right") - 1
    steps = steps.drop(columns="_line")
    steps.insert(0, "segment", seg.astype(np.int32))
    for name in STEP_FIELDS:
        if len(steps) and steps[name].isna().all():
            log.notes.append(Note("warning", path, f"step records lack field {name!r}"))
    log.steps = steps
    return log


# --------------------------------------------------------------------------- one run


def log_files(run_dir: str) -> dict[int, str]:
    """Maps rank -> log path for the ``rank-NNNNN.jsonl`` files of a run directory."""
    out = {}
    for p in glob.glob(os.path.join(run_dir, schema.LOG_DIR, "*.jsonl")):
        m = _LOG_NAME.match(os.path.basename(p))
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def check_run_dir(run_dir: str) -> dict[int, str]:
    """Returns the run's log files, or raises ``RunDirError`` with one line for a person."""
    if not os.path.isdir(run_dir):
        what = "is not a directory" if os.path.exists(run_dir) else "does not exist"
        raise RunDirError(f"run directory {run_dir} {what}")
    files = log_files(run_dir)
    if not files:
        raise RunDirError(f"run directory {run_dir} has no logs "
                          f"({os.path.join(run_dir, schema.LOG_DIR, 'rank-*.jsonl')}); "
                          "is it a distseg run directory?")
    return files


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


def _segment_key(rec: dict, local: int) -> tuple:
    """Identifies a launch across ranks: the agreed start time and run id.

    ``start_time`` is broadcast from rank 0, so it is the same on every rank of a launch.
    """
    st = _num(rec.get("start_time"))
    return (round(st, 3) if math.isfinite(st) else float(local), str(rec.get("run_id", "")))


def _epoch_rows(log: RankLog, seg_map: dict[int, int], classes: list[str]) -> list[dict]:
    rows = []
    for rec in log.epochs:
        seg = seg_map.get(rec["_segment"])
        if seg is None:
            continue
        row = {"rank": log.rank, "segment": seg, "epoch": rec.get("epoch"),
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
        rows.append(row)
    return rows


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


def load_run(run_dir: str, label: str | None = None,
             progress: Callable[[int], None] | None = None) -> RunData:
    """Reads every rank's log of a run directory and combines them.

    Args:
      run_dir: the run directory.
      label: name used in tables; defaults to the directory name.
      progress: called with the number of bytes of each log file once it is read.

    Returns:
      The run, with notes on everything skipped.

    Raises:
      RunDirError: the directory does not exist or holds no logs.
    """
    files = check_run_dir(run_dir)
    label = label or os.path.basename(os.path.normpath(run_dir)) or run_dir
    notes: list[Note] = []

    config = None
    cfg_path = os.path.join(run_dir, schema.CONFIG_FILE)
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        notes.append(Note("info", label, f"{cfg_path} is missing; config comparisons use "
                          "the run records only"))
    except (OSError, ValueError) as e:
        notes.append(Note("warning", label, f"{cfg_path} cannot be read as JSON ({e})"))

    logs: list[RankLog] = []
    unknown_fields: dict[str, int] = {}
    compact: dict[int, pd.DataFrame] = {}
    step_tmax: dict[int, dict[int, float]] = {}
    best: tuple[tuple[int, int], pd.DataFrame] | None = None  # ((n steps, -rank), curve)
    # Each file is reduced as soon as it is read (compact per-rank columns, plus the
    # loss curve of the rank with the most steps), so memory stays bounded by one
    # file's full frame; segments are mapped to launches once all run records are in.
    for rank, path in files.items():
        size_bytes = os.path.getsize(path) if os.path.exists(path) else 0
        log = read_rank_log(path, rank)
        notes.extend(log.notes)
        log.notes = []
        for name in log.unknown_fields:
            unknown_fields[name] = unknown_fields.get(name, 0) + 1
        logs.append(log)
        st, log.steps = log.steps, None
        orphan = int((st["segment"] < 0).sum())
        if orphan:
            notes.append(Note("skipped", path, f"{orphan} step record(s) before any run "
                              "record (cannot be placed in time)"))
        no_t = int((~np.isfinite(st["t"].to_numpy()) & (st["segment"] >= 0).to_numpy()).sum())
        if no_t:
            notes.append(Note("skipped", path, f"{no_t} step record(s) without a time t"))
        st = st[(st["segment"] >= 0).to_numpy() & np.isfinite(st["t"].to_numpy())]
        if len(st):
            seg = st["segment"].to_numpy(np.int32)
            step_tmax[rank] = st.groupby("segment")["t"].max().to_dict()
            epoch = st["epoch"].to_numpy()
            first_epoch = pd.Series(epoch).groupby(seg).transform("first").to_numpy()
            compact[rank] = pd.DataFrame({
                "rank": np.full(len(st), rank, np.int32),
                "segment": seg,
                "epoch": np.nan_to_num(epoch, nan=-1).astype(np.int32),
                "warmup": epoch == first_epoch,
                "step_time": st["step_time"].to_numpy(np.float64),
                "data_wait": st["data_wait"].to_numpy(np.float64),
                "samples": st["samples"].to_numpy(np.float64),
            })
            if best is None or (len(st), -rank) > best[0]:
                best = ((len(st), -rank), pd.DataFrame({
                    "segment": seg,
                    "epoch": np.nan_to_num(epoch, nan=-1).astype(np.int32),
                    "step": np.nan_to_num(st["step"].to_numpy(), nan=-1).astype(np.int64),
                    "global_step": np.nan_to_num(st["global_step"].to_numpy(),
                                                 nan=-1).astype(np.int64),
                    "t": st["t"].to_numpy(),
                    "loss": st["loss"].to_numpy(),
                    "lr": st["lr"].to_numpy(),
                }))
        del st
        if progress:
            progress(size_bytes)

    if unknown_fields:
        shown = ", ".join(f"{name} ({n} of {len(files)} logs)"
                          for name, n in sorted(unknown_fields.items())[:8])
        more = f" and {len(unknown_fields) - 8} more" if len(unknown_fields) > 8 else ""
        notes.append(Note("skipped", label, f"ignored field(s) not in distseg.schema: "
                          f"{shown}{more}"))

    keys = sorted({_segment_key(r, i) for log in logs for i, r in enumerate(log.runs)})
    key_index = {k: i for i, k in enumerate(keys)}
    seg_maps = {log.rank: {i: key_index[_segment_key(r, i)] for i, r in enumerate(log.runs)}
                for log in logs}
    n_seg = len(keys)

    # Sizes, hosts and the reference run record.
    sizes = [int(_num(r.get("size"))) for log in logs for r in log.runs
             if math.isfinite(_num(r.get("size")))]
    size = max(sizes) if sizes else None
    last = n_seg - 1
    last_runs = {log.rank: r for log in logs for i, r in enumerate(log.runs)
                 if seg_maps[log.rank][i] == last}
    run_record = last_runs[min(last_runs)] if last_runs else {}
    rank_hosts = {rank: str(r["host"]) for rank, r in last_runs.items() if r.get("host") is not None}
    hosts = sorted(set(rank_hosts.values()))
    if n_seg == 0:
        notes.append(Note("warning", label, "no run record in any log; ranks, nodes and "
                          "dataset size are unknown"))

    seg_rows = []
    for k, (st, run_id) in enumerate(keys):
        recs = [r for log in logs for i, r in enumerate(log.runs) if seg_maps[log.rank][i] == k]
        hashes = sorted({str(r.get("config_hash")) for r in recs})
        seg_sizes = [int(_num(r.get("size"))) for r in recs if math.isfinite(_num(r.get("size")))]
        seg_rows.append({"segment": k, "start_time": _num(recs[0].get("start_time")),
                         "run_id": run_id, "config_hash": ",".join(hashes),
                         "size": max(seg_sizes) if seg_sizes else None, "ranks_logged": len(recs),
                         "duration_s": 0.0})
    segments = pd.DataFrame(seg_rows, columns=["segment", "start_time", "run_id", "config_hash",
                                               "size", "ranks_logged", "duration_s"])
    if n_seg > 1:
        notes.append(Note("info", label, f"resumed run: {n_seg} launches; wall-clock time is "
                          "the sum of their durations"))
        if segments["config_hash"].nunique() > 1:
            notes.append(Note("warning", label, "the config changed between launches "
                              f"(config hashes {', '.join(segments['config_hash'])})"))
        if segments["size"].nunique() > 1:
            notes.append(Note("warning", label, "the number of ranks changed between launches "
                              f"({', '.join(map(str, segments['size']))})"))

    # Segment durations: the longest t any rank logged in a launch.
    durations = np.zeros(max(n_seg, 1))
    for log in logs:
        m = seg_maps[log.rank]
        for rec in log.epochs + log.ends:
            seg = m.get(rec["_segment"])
            t = _num(rec.get("t"))
            if seg is not None and math.isfinite(t):
                durations[seg] = max(durations[seg], t)
        for local, t in step_tmax.get(log.rank, {}).items():
            if local in m and math.isfinite(t):
                durations[m[local]] = max(durations[m[local]], t)
    offsets = np.concatenate(([0.0], np.cumsum(durations)[:-1]))
    segments["duration_s"] = durations[:n_seg]
    segments["offset_s"] = offsets[:n_seg]

    def to_global(rank: int, local: np.ndarray) -> np.ndarray:
        m = seg_maps[rank]
        lut = np.array([m[i] for i in range(len(m))], np.int32)
        return lut[local]

    for rank, frame in compact.items():
        frame["segment"] = to_global(rank, frame["segment"].to_numpy())
    steps = (pd.concat(list(compact.values()), ignore_index=True) if compact else pd.DataFrame(
        {"rank": np.array([], np.int32), "segment": np.array([], np.int32),
         "epoch": np.array([], np.int32), "warmup": np.array([], bool),
         "step_time": np.array([], np.float64), "data_wait": np.array([], np.float64),
         "samples": np.array([], np.float64)}))
    compact.clear()
    if best is None:
        curve = pd.DataFrame({c: [] for c in ("segment", "epoch", "step", "global_step", "t",
                                               "wall_s", "loss", "lr")})
        curve_rank = None
        notes.append(Note("warning", label, "no step records; no loss curve"))
    else:
        curve, curve_rank = best[1], -best[0][1]
        curve["segment"] = to_global(curve_rank, curve["segment"].to_numpy())
        curve.insert(5, "wall_s", offsets[curve["segment"].to_numpy()] + curve["t"].to_numpy())
        curve = curve.sort_values("wall_s", kind="stable").reset_index(drop=True)

    # Epoch records.
    classes: list[str] = []
    rows = [row for log in logs for row in _epoch_rows(log, seg_maps[log.rank], classes)]
    epochs = pd.DataFrame(rows)
    if len(epochs):
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
    orphan_epochs = sum(1 for log in logs for r in log.epochs if r["_segment"] < 0)
    if orphan_epochs:
        notes.append(Note("skipped", label, f"{orphan_epochs} epoch record(s) before any run "
                          "record"))

    ends = [r for log in logs for r in log.ends if seg_maps[log.rank].get(r["_segment"]) == last]
    status, finished = _status(ends, len(last_runs) or size)
    present = [log.rank for log in logs]
    missing = sorted(set(range(size)) - set(present)) if size else []
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        notes.append(Note("skipped", label, f"log of rank(s) {shown} missing "
                          f"({len(missing)} of {size}); sums over ranks are extrapolated"))
    extra = sorted(set(present) - set(range(size))) if size else []
    if extra:
        notes.append(Note("warning", label, f"logs of rank(s) {extra} beyond the run size {size}"))
    if not finished:
        notes.append(Note("info", label, f"status: {status}"))

    return RunData(label=label, path=run_dir, size=size, hosts=hosts, rank_hosts=rank_hosts, run_record=run_record,
                   config=config, segments=segments, ranks_present=present,
                   ranks_missing=missing, status=status, finished=finished, epochs=epochs,
                   steps=steps, curve=curve, curve_rank=curve_rank, classes=classes,
                   notes=notes)


def unique_labels(run_dirs: Sequence[str]) -> list[str]:
    """Directory names, or the paths as given where two names collide."""
    names = [os.path.basename(os.path.normpath(p)) or p for p in run_dirs]
    return [p if names.count(n) > 1 else n for n, p in zip(names, run_dirs)]


def load_runs(run_dirs: Sequence[str], show_progress: bool | None = None) -> list[RunData]:
    """Checks every run directory, then reads them with a progress bar on stderr.

    Args:
      run_dirs: run directories, in the order the report lists them.
      show_progress: ``True``/``False`` forces the bar on/off; ``None`` shows it when
        stderr is a terminal.

    Raises:
      RunDirError: a directory is missing or has no logs (checked before any reading,
        so a typo fails fast).
    """
    from tqdm import tqdm

    all_files = [check_run_dir(p) for p in run_dirs]
    total = sum(os.path.getsize(p) for files in all_files for p in files.values()
                if os.path.exists(p))
    disable = None if show_progress is None else not show_progress
    with tqdm(total=total, unit="B", unit_scale=True, desc="reading logs", disable=disable,
              leave=False, dynamic_ncols=True) as bar:
        return [load_run(p, label, progress=bar.update)
                for p, label in zip(run_dirs, unique_labels(run_dirs))]

