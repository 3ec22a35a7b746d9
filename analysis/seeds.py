"""Runs that differ only in ``--seed``: one group, with the spread of time and samples
to each target over its seeds.

The run record's ``config_hash`` covers the seed, so it cannot tell seed replicas
apart from other changes. The key is the run's ``config.json`` (``distseg.core.rundir``)
without ``run_dir`` (each run has its own) and ``train.seed``, together with its ranks
(the config does not hold the number of ranks, and runs at other rank counts are the
scaling study, not replicas). Everything else stays in the key, the data path too: a
run on another data file is another experiment. A run without a readable config.json
is not grouped (a note says so).
"""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

import pandas as pd

from analysis.document import Note
from analysis.logs import RunData

COLUMNS = ["group", "runs", "seeds", "n_runs", "ranks", "nodes", "metric", "target", "reached",
           "mean_h", "min_h", "max_h", "mean_samples", "min_samples", "max_samples"]


def group_key(run: RunData) -> str | None:
    """The run's config without ``run_dir`` and ``train.seed``, hashed, and its ranks
    (``None`` without a config)."""
    cfg = run.config
    if not isinstance(cfg, dict):
        return None
    rest = {k: v for k, v in cfg.items() if k != "run_dir"}
    if isinstance(rest.get("train"), dict):
        rest["train"] = {k: v for k, v in rest["train"].items() if k != "seed"}
    blob = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str)
    return f"{hashlib.sha256(blob.encode()).hexdigest()[:16]}/{run.ranks}"


def seed_of(run: RunData):
    """The run's ``train.seed`` (``None`` when its config does not say)."""
    train = (run.config or {}).get("train")
    return train.get("seed") if isinstance(train, dict) else None


def groups(runs: Sequence[RunData]) -> list[list[RunData]]:
    """The groups of two or more runs, with two or more seeds, that differ only in seed
    (``group_key``), in the order their first runs are listed."""
    by_key: dict[str, list[RunData]] = {}
    for run in runs:
        key = group_key(run)
        if key is not None:
            by_key.setdefault(key, []).append(run)
    return [g for g in by_key.values()
            if len(g) > 1 and len({json.dumps(seed_of(r)) for r in g}) > 1]


def _stats(reached: pd.DataFrame, column: str, name: str) -> dict:
    values = reached[column].astype(float)
    return {f"mean_{name}": values.mean(), f"min_{name}": values.min(),
            f"max_{name}": values.max()}


def _group_rows(group: list[RunData], hours: pd.DataFrame) -> list[dict]:
    labels = [r.label for r in group]
    mine = hours[hours["run"].isin(labels)]
    who = {"group": labels[0], "runs": ", ".join(labels),
           "seeds": ", ".join(str(seed_of(r)) for r in group), "n_runs": len(group),
           "ranks": group[0].ranks, "nodes": group[0].nodes}
    rows = []
    for (metric, target), rows_of in mine.groupby(["metric", "target"], sort=False):
        reached = rows_of[rows_of["reached"].astype(bool)]
        rows.append({**who, "metric": metric, "target": target,
                     "reached": f"{len(reached)} of {len(group)}",
                     **_stats(reached, "hours", "h"), **_stats(reached, "samples", "samples")})
    return rows


def seed_table(runs: Sequence[RunData], hours: pd.DataFrame) -> tuple[pd.DataFrame, list[Note]]:
    """Per group of seed replicas (``groups``) and target: how many reached it, and the
    mean, min and max of the hours and samples to it over those that did
    (``COLUMNS``); with notes on the runs that could not be grouped. Empty (and no
    notes) without targets or without such a group."""
    found = groups(runs) if len(hours) else []
    rows = [row for group in found for row in _group_rows(group, hours)]
    if not rows:
        return pd.DataFrame(columns=COLUMNS), []
    notes = [Note("info", r.label, "not grouped by seed: no readable config.json")
             for r in runs if group_key(r) is None]
    return pd.DataFrame(rows, columns=COLUMNS), notes
