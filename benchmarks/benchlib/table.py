"""The table ``make bench`` prints: one row per measure, the goal beside the measured.

Plain Python (no TensorFlow), so the driver, the tests and anything reading the JSON
results can use it. ``Goal`` says what a measure must reach; ``Row`` is one printed
line; ``format_table`` lays rows out as a Markdown table; ``stateff_rows`` reads the
statistical-efficiency rows another benchmark writes to
``bench/results/stateff-*.json`` (``{"rows": [{"measure", "goal", "measured"}, ...]}``),
tolerating fields it does not know and saying so when it cannot read a file.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import operator
import os
import re
import time
from dataclasses import dataclass

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Goal:
    """``value OP threshold`` must hold, e.g. ``Goal(">=", 1.9)``; ``unit`` is
    printed after the threshold (``%``), which is shown with ``fmt``."""

    op: str
    threshold: float
    unit: str = ""
    fmt: str = "{:.2f}"

    def met(self, value: float | None) -> bool | None:
        return None if value is None else bool(_OPS[self.op](value, self.threshold))

    def text(self) -> str:
        return f"{self.op} {self.fmt.format(self.threshold)}{self.unit}"


@dataclass(frozen=True)
class Row:
    """One line of the table: ``goal`` and ``measured`` as printed, ``met`` True,
    False or None (no goal, or not measured)."""

    measure: str
    goal: str
    measured: str
    met: bool | None = None
    detail: str = ""
    value: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def measured_row(measure: str, goal: Goal | None, value: float | None, detail: str = "",
                 fmt: str = "{:.2f}") -> Row:
    """A row for a measured number (None: not measured, said in the measured column)."""
    shown = "not measured" if value is None else fmt.format(value) + (goal.unit if goal else "")
    return Row(measure=measure, goal=goal.text() if goal else "-", measured=shown,
               met=goal.met(value) if goal else None, detail=detail, value=value)


_MET = {True: "yes", False: "NO", None: ""}


def format_table(rows: list[Row]) -> str:
    """Rows as a Markdown table: measure | goal | measured | met | detail, the goal
    and the measured number side by side."""
    header = ("measure", "goal", "measured", "met", "detail")
    cells = [header] + [(r.measure, r.goal, r.measured, _MET[r.met], r.detail) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c[i].ljust(widths[i]) for i in range(len(header))) + " |"
             for c in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# --- the statistical-efficiency rows, written by benchmarks/bench_stateff.py ---------

STATEFF_MISSING = "not measured (run make bench-stateff)"


def newest_stateff(results_dir: str) -> str | None:
    """The newest ``stateff-*.json`` in ``results_dir`` (by modification time)."""
    files = glob.glob(os.path.join(results_dir, "stateff-*.json"))
    return max(files, key=os.path.getmtime) if files else None


def _date_of(path: str, doc: dict) -> str:
    """When a results file was measured: its own date field, the date in its name, or
    the file's modification time."""
    for key in ("date", "measured", "measured_at", "created", "timestamp", "finished"):
        if isinstance(doc.get(key), (str, int, float)) and str(doc[key]).strip():
            return str(doc[key])
    found = re.search(r"\d{4}-?\d{2}-?\d{2}(?:[T_-]?\d{2}:?\d{2}(?::?\d{2})?)?", os.path.basename(path))
    if found:
        return found.group(0)
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):  # e.g. {"value": 1.8, "unit": "x"}
        inner = value.get("value", value.get("text"))
        return _text(inner) + str(value.get("unit", "")) if inner is not None else json.dumps(value)
    return "-" if value is None else str(value)


def _stateff_row(item: dict, source: str) -> Row:
    measure = str(item.get("measure") or item.get("name") or item.get("row") or "?")
    met = item.get("met")
    detail = " ".join(str(x) for x in (item.get("detail") or item.get("note") or "", source) if x)
    value = item.get("measured")
    return Row(measure=measure, goal=_text(item.get("goal")), measured=_text(value),
               met=met if isinstance(met, bool) else None, detail=detail,
               value=value if isinstance(value, (int, float)) and not isinstance(value, bool) else None)


def stateff_rows(results_dir: str, measures: tuple[str, ...] = ()) -> list[Row]:
    """The statistical rows of the newest ``stateff-*.json``, each marked with its
    file and date; without a readable file, one row per expected measure (or one
    row) saying it was not measured, or why the file could not be read."""
    path = newest_stateff(results_dir)
    if path is None:
        return [Row(measure=m, goal="-", measured=STATEFF_MISSING) for m in measures or ("statistical efficiency",)]
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        items = doc["rows"] if isinstance(doc, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ValueError('expected {"rows": [{"measure", "goal", "measured"}, ...]}')
    except (OSError, ValueError, KeyError) as e:
        why = f"unreadable: {os.path.basename(path)} ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        return [Row(measure="statistical efficiency", goal="-", measured=why)]
    source = f"(from {os.path.relpath(path)}, measured {_date_of(path, doc)})"
    return [_stateff_row(item, source) for item in items]
