"""One rank's log file: its bytes, parsed into records by type and a frame of steps.

The contract is ``distseg.core.schema``, and so is the rule for a damaged line
(``schema.parse_line``: a truncated last line is skipped, a record after a cut-off one
on the same line is kept, any other bad line is skipped, each with a note). Step
records dominate a log (one per training step per rank, millions in a large study), so
the lines that start as ``distseg.training.runlog`` writes a step record are parsed
together by pyarrow's JSON reader against an explicit schema; the few other records
(``run``, ``epoch``, ``end``) are parsed with ``json`` because they hold nested fields.
A file whose step lines pyarrow cannot parse (a corrupt line in the middle, a field
that changed type) is parsed line by line instead, which is slower but skips only the
bad lines. Fields outside the schema are ignored and named in a note.

Nothing here raises on a damaged log: every line or field that is skipped becomes a
``Note``. One thing is an error (``distseg.core.errors.InputError``, exit 2): a ``run``
record whose ``schema_version`` is newer than ``distseg.core.schema.SCHEMA_VERSION``,
because its fields may mean something else now (``refuse_newer_schema``).

Also here, as the lowest module that reads records: ``dict_field``, ``count`` and
``number``, the checks every reader applies to a record's values.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

from analysis.document import Note
from distseg.core import schema
from distseg.core.errors import refuse_newer

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
_OPEN_BRACE = ord("{")
_NEWLINE = ord("\n")


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


def number(value: Any) -> float:
    """``value`` as a float, NaN when it is not a number: a logged time or size that
    is missing or garbled leaves its cell empty."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


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


def _empty_steps() -> pd.DataFrame:
    cols = {"segment": np.array([], np.int32)}
    cols.update({f: np.array([], np.float64) for f in STEP_FIELDS})
    return pd.DataFrame(cols)


def _split_lines(data: bytes, path: str, notes: list[Note]) -> tuple[bytes, np.ndarray]:
    """Returns the complete lines of ``data`` and their start offsets.

    An unterminated last line is kept unless ``schema.parse_line`` calls it a truncated
    write (a file that merely lacks its final newline is whole); that one is the line
    a killed or running job was writing, and is dropped with a note.
    """
    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == _NEWLINE)
    end = int(nl[-1]) + 1 if len(nl) else 0
    if end < len(data):
        tail = data[end:]
        if tail.strip():
            line = schema.parse_line(tail, terminated=False)
            if line.damage == schema.TRUNCATED:
                notes.append(Note("skipped", path, f"line {len(nl) + 1}: {line.problem}"))
            else:
                data = data + b"\n"
                nl = np.append(nl, len(data) - 1)
                end = len(data)
    starts = np.concatenate(([0], nl[:-1] + 1)) if len(nl) else np.array([], np.int64)
    return data[:end], starts


def _records_from_lines(lines: Iterable[tuple[int, bytes]], path: str,
                        notes: list[Note]) -> list[tuple[int, dict]]:
    """Parses ``(line_index, bytes)`` pairs by ``schema.parse_line``: a salvaged record
    is kept with a note, the lines that hold none are named in one note."""
    out, bad = [], []
    for i, raw in lines:
        line = schema.parse_line(raw)
        if line.damage == schema.DAMAGED:
            bad.append(i + 1)
            continue
        if line.damage:
            notes.append(Note("skipped", path, f"line {i + 1}: {line.problem}"))
        if line.record is not None:
            out.append((i, line.record))
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
