"""Warnings about what a reader of the tables would otherwise miss.

Each check looks at the loaded runs and returns ``warning`` notes, printed under
"Warnings" ahead of the numbers they qualify; each is silent on a healthy run.

* ``oversubscription``: more ranks on a host than CPUs to run them (from the ``run``
  records' ``host`` and ``threads.affinity``). 8 ranks on 2 cores read as efficiency
  0.19, which measures the oversubscription, not Horovod.
* ``dice_drops``: the global validation Dice fell by more than ``DICE_DROP`` from one
  epoch to the next, a sign of unstable training that a time-to-target hides.
* ``smoothing_misses``: a loss target that single steps reached but the trailing mean
  (``--smooth N``) never did; the table says "not reached", which looks like a slow
  run rather than a noisy one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from analysis.document import HOURS, Note, TimeUnit
from analysis.logs import RunData
from analysis.tables import dice_metric, dice_name, first_per_epoch

#: A fall of the validation Dice between consecutive epochs larger than this is warned of.
DICE_DROP = 0.1


def _host_load(placement: pd.DataFrame) -> pd.DataFrame:
    """Per launch and host: ``ranks`` that ran there and the ``cpus`` they could use.

    ``cpus`` counts the CPUs in the union of the ranks' ``threads.affinity``. Where
    every rank has the same affinity (nobody pinned: all compete for the same CPUs),
    ranks also counts the ``local_size`` they logged, so a missing log does not hide
    the others. Hosts where a rank did not log its affinity are left out.
    """
    rows = []
    known = placement.dropna(subset=["host"])
    for (segment, host), g in known.groupby(["segment", "host"], sort=True):
        sets = list(g["affinity"])
        if any(a is None for a in sets):
            continue
        ranks = len(g)
        if len(set(sets)) == 1 and g["local_size"].notna().any():
            ranks = max(ranks, int(g["local_size"].max()))
        rows.append({"segment": segment, "host": host, "ranks": ranks,
                     "cpus": len(set().union(*sets))})
    return pd.DataFrame(rows, columns=["segment", "host", "ranks", "cpus"])


def oversubscription(run: RunData) -> list[Note]:
    """A warning when more ranks ran on a host than the CPUs they were given."""
    load = _host_load(run.placement)
    over = load[load["ranks"] > load["cpus"]]
    if not len(over):
        return []
    first = over.iloc[0]
    where = f"host {first['host']}"
    if len(run.segments) > 1:
        where += f" (launch {int(first['segment'])})"
    more = len(over) - 1
    return [Note("warning", run.label, f"{int(first['ranks'])} ranks shared "
                 f"{int(first['cpus'])} CPU(s) on {where}"
                 + (f", and {more} more host(s) or launch(es) likewise" if more else "")
                 + ": more ranks than cores (threads.affinity in the run records), so this "
                 "run's times, speedup and efficiency measure the oversubscription, not "
                 "Horovod")]


def dice_drops(run: RunData, dice_class: str | None = None) -> list[Note]:
    """A warning when the global validation Dice fell by more than ``DICE_DROP``
    between two consecutive epochs (the largest fall is named, the others counted)."""
    e = first_per_epoch(run)
    if len(e) < 2:
        return []
    e = e.sort_values("epoch")
    dice = dice_metric(e, run.classes, dice_class).to_numpy(float)
    epochs = e["epoch"].to_numpy()
    fall = dice[:-1] - dice[1:]
    drops = np.flatnonzero((fall > DICE_DROP) & (np.diff(epochs) == 1))
    if not len(drops):
        return []
    i = int(drops[np.argmax(fall[drops])])
    more = f"; {len(drops) - 1} more such fall(s)" if len(drops) > 1 else ""
    name = dice_name(run.classes, dice_class)
    return [Note("warning", run.label, f"validation Dice ({name}) fell "
                 f"by {fall[i]:.2f} from epoch {epochs[i]} ({dice[i]:.3f}) to epoch "
                 f"{epochs[i + 1]} ({dice[i + 1]:.3f}){more}: unstable training (learning "
                 "rate too high for this many ranks?); times to a Dice target may hide it")]


def smoothing_misses(run: RunData, targets: Sequence[float], smooth: int,
                     unit: TimeUnit = HOURS) -> list[Note]:
    """A warning per loss target reached by the raw step loss but never by its
    trailing mean over ``smooth`` steps (only with ``--smooth`` > 1)."""
    if smooth <= 1 or not len(run.crossings):
        return []
    c = run.crossings
    notes = []
    for target in dict.fromkeys(targets):
        raw = c[(c["target"] == target) & (c["window"] == 0) & c["reached"]]
        mean = c[(c["target"] == target) & (c["window"] == smooth) & c["reached"]]
        if len(raw) and not len(mean):
            hit = raw.iloc[0]
            notes.append(Note("warning", run.label, f"--target-loss {target:g} is reached by "
                              f"the raw step loss (at {unit.text(float(hit['wall_s']))}, global "
                              f"step {int(hit['global_step'])}) but never by its trailing mean "
                              f"over {smooth} steps: single steps dipped below the target, the "
                              "trend did not"))
    return notes


def check_runs(runs: Sequence[RunData], target_loss: Sequence[float] = (), smooth: int = 0,
               dice_class: str | None = None, unit: TimeUnit = HOURS) -> list[Note]:
    """Every check on every run, run by run."""
    notes = []
    for run in runs:
        notes += oversubscription(run)
        notes += dice_drops(run, dice_class)
        notes += smoothing_misses(run, target_loss, smooth, unit)
    return notes
