"""``--lr auto``'s range tests as the report shows them: the curve each run's first
launch swept (lrs, losses and their two-way smoothing) and the lr it chose, from the
``lr_find`` field of the first ``run`` record of rank 0's log; and each run's lr, how it
was decided, in one line.

The first record of the log is read, not the whole file: the range test runs once, at
a run's first launch, so a resumed run's later ``run`` records do not repeat it.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import pandas as pd

from analysis.logs import RunData, log_files

#: Columns of the ``lr_find`` table (``lr_find.csv``).
COLUMNS = ["run", "ranks", "step", "lr", "loss", "smoothed", "chosen_lr"]


def first_run_record(run_dir: str) -> dict | None:
    """The first ``run`` record of the lowest rank's log (None where there is none)."""
    files = log_files(run_dir)
    if not files:
        return None
    try:
        with open(next(iter(files.values())), encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                if record.get("type") == "run":
                    return record
    except (OSError, ValueError):
        return None
    return None


def table(runs: Sequence[RunData]) -> pd.DataFrame:
    """One row per step of each run's range test (no rows for runs without one)."""
    rows = []
    for run in runs:
        found = (first_run_record(run.path) or {}).get("lr_find")
        if not isinstance(found, dict):
            continue
        series = zip(found.get("lrs") or (), found.get("losses") or (), found.get("smoothed") or ())
        rows += [{"run": run.label, "ranks": run.size, "step": k, "lr": lr, "loss": loss,
                  "smoothed": smoothed, "chosen_lr": found.get("lr")}
                 for k, (lr, loss, smoothed) in enumerate(series)]
    return pd.DataFrame(rows, columns=COLUMNS)


def lr_text(run: RunData) -> str | None:
    """The run's base lr and how it was decided: ``0.00354 (found)`` by ``--lr auto``
    (``(range test inconclusive, kept)`` where it kept the configured lr),
    ``0.00354 (from np1)`` by ``--lr-from``, the bare number where it was set; None
    where the config does not say."""
    train = (run.config or {}).get("train") if isinstance(run.config, dict) else None
    lr = train.get("lr") if isinstance(train, dict) else None
    if not isinstance(lr, (int, float)):
        return None
    if train.get("lr_auto"):
        found = (first_run_record(run.path) or {}).get("lr_find")
        kept = isinstance(found, dict) and found.get("kept")
        return f"{lr:.3g} ({'range test inconclusive, kept' if kept else 'found'})"
    if train.get("lr_from"):
        return f"{lr:.3g} (from {os.path.basename(os.path.normpath(train['lr_from']))})"
    return f"{lr:.3g}"
