"""Out-of-fold scores of a cross-validation's configurations: the files
``distseg-predict --cv CV --out-of-fold`` writes and ``distseg-report CV`` reads.

A configuration is one recipe of the plan (its fold models, each on the cases its fold
validated) or the ensemble of two recipes at one node count (the mean of their
softmax probabilities, case by case), as nnU-Net's ``find_best_configuration`` scores
its configurations and their pairwise ensembles::

    CV/oof/
      cases.csv   one row per node count x configuration x case: nodes,
                  configuration, members, fold, case, then dice_<class> for every
                  foreground class (empty: the class is in neither the truth nor the
                  prediction of that case), then lcc_<class>: that class's Dice with
                  only its largest connected component kept
      oof.json    what was predicted: schema, classes, mirroring, per run its
                  checkpoint and the seconds its cases took to predict

An ensemble is named by its members joined with ``" + "`` (recipe names hold no
spaces: ``cvplan.NAME``); ``members`` lists them separated by spaces.

``postprocessing`` decides, per configuration, which classes keep only their largest
component (``core.postchoice``, on the cases as scored): the report prints it and
``distseg-predict --cv`` applies it to the configuration it ships.

Plain Python (csv, json): the report reads these files through this module.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from distseg.core import postchoice
from distseg.core.errors import InputError

DIR = "oof"
CASES_FILE = "cases.csv"
INFO_FILE = "oof.json"
#: The files' layout; a newer one is refused.
SCHEMA = 1
#: Between the members of an ensemble's name.
JOIN = " + "
#: The columns before the classes' Dice.
KEYS = ("nodes", "configuration", "members", "fold", "case")


def ensemble_name(members: Sequence[str]) -> str:
    """``a + b``: the name of the ensemble of recipes ``members`` (one recipe: its name)."""
    return JOIN.join(members)


@dataclass(frozen=True)
class CaseScore:
    """One case's Dice per foreground class under one configuration."""

    nodes: int
    configuration: str
    members: tuple[str, ...]
    """The recipes averaged (one: a single configuration)."""
    fold: int
    """The fold that validated the case (whose models predicted it)."""
    case: str
    dice: Mapping[str, float]
    """Foreground class -> Dice (NaN: the class in neither truth nor prediction)."""
    dice_lcc: Mapping[str, float] = field(default_factory=dict)
    """Foreground class -> its Dice with only its largest connected component kept
    (the other classes untouched); empty where not scored."""


@dataclass(frozen=True)
class RunCost:
    """What predicting one run's validation cases took (the inference cost)."""

    nodes: int
    recipe: str
    fold: int
    seconds: float
    """Wall seconds of its network over its cases, on the rank that predicted each."""
    cases: int


@dataclass(frozen=True)
class Scores:
    """The out-of-fold scores of a CV (``read``), as written (``write``)."""

    classes: tuple[str, ...]
    """The foreground classes, in the model's order."""
    rows: tuple[CaseScore, ...]
    costs: tuple[RunCost, ...] = ()
    info: dict = field(default_factory=dict)
    """The rest of ``oof.json`` (mirroring, checkpoints), for the record."""

    def seconds(self, nodes: int, members: Sequence[str]) -> float:
        """Seconds the members' networks took over every out-of-fold case at ``nodes``
        (an ensemble runs each member's network, so it costs their sum); NaN where
        a member has none."""
        found = [c.seconds for c in self.costs if c.nodes == nodes and c.recipe in members]
        mine = {c.recipe for c in self.costs if c.nodes == nodes and c.recipe in members}
        return sum(found) if mine == set(members) else math.nan


def path_of(cv_dir: str, name: str) -> str:
    return os.path.join(cv_dir, DIR, name)


def _cell(value: float) -> str:
    return "" if value is None or not math.isfinite(value) else repr(float(value))


def write(cv_dir: str, scores: Scores) -> list[str]:
    """Writes ``CV/oof/cases.csv`` and ``CV/oof/oof.json``; returns their paths."""
    from distseg.core.partial import PartialFile, write_json
    os.makedirs(os.path.join(cv_dir, DIR), exist_ok=True)
    cases = path_of(cv_dir, CASES_FILE)
    with PartialFile(cases, f"{cases}.tmp") as part, open(part.partial, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KEYS, *(f"dice_{c}" for c in scores.classes),
                      *(f"lcc_{c}" for c in scores.classes)])
        for r in scores.rows:
            out.writerow([r.nodes, r.configuration, " ".join(r.members), r.fold, r.case,
                          *(_cell(r.dice.get(c, math.nan)) for c in scores.classes),
                          *(_cell(r.dice_lcc.get(c, math.nan)) for c in scores.classes)])
    info = path_of(cv_dir, INFO_FILE)
    write_json(info, {**scores.info, "schema": SCHEMA, "classes": list(scores.classes),
                      "costs": [c.__dict__ for c in scores.costs]})
    return [cases, info]


def exists(cv_dir: str) -> bool:
    return os.path.isfile(path_of(cv_dir, CASES_FILE))


def read(cv_dir: str) -> Scores | None:
    """The out-of-fold scores of ``cv_dir`` (None: not made yet).

    Raises:
      InputError: a file that is not as ``write`` writes it (one line naming it).
    """
    if not exists(cv_dir):
        return None
    info_path = path_of(cv_dir, INFO_FILE)
    try:
        with open(info_path) as f:
            info = json.load(f)
        if int(info.get("schema", 0)) > SCHEMA:
            raise InputError(f"{info_path}: schema {info['schema']} is newer than this distseg "
                             f"reads ({SCHEMA}); upgrade distseg")
        classes = tuple(str(c) for c in info["classes"])
        costs = tuple(RunCost(int(c["nodes"]), str(c["recipe"]), int(c["fold"]),
                              float(c["seconds"]), int(c["cases"])) for c in info.get("costs", ()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{info_path}: not the out-of-fold record distseg-predict "
                         f"--out-of-fold writes ({e})") from None
    rest = {k: v for k, v in info.items() if k not in ("schema", "classes", "costs")}
    return Scores(classes, _rows(path_of(cv_dir, CASES_FILE), classes), costs, rest)


def _rows(path: str, classes: Sequence[str]) -> tuple[CaseScore, ...]:
    try:
        with open(path, newline="") as f:
            table = list(csv.DictReader(f))
        return tuple(CaseScore(int(r["nodes"]), r["configuration"], tuple(r["members"].split()),
                               int(r["fold"]), r["case"], _dice(r, "dice", classes),
                               _dice(r, "lcc", classes)) for r in table)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not the per-case table distseg-predict --out-of-fold "
                         f"writes (columns {', '.join(KEYS)}, dice_<class>, lcc_<class>; "
                         f"{e})") from None


def _dice(row: Mapping[str, str], prefix: str, classes: Sequence[str]) -> dict[str, float]:
    return {c: float(row[f"{prefix}_{c}"]) if row[f"{prefix}_{c}"] else math.nan
            for c in classes}


def postprocessing(scores: Scores, nodes: int, configuration: str) -> dict | None:
    """What one configuration applies after its network, decided on its out-of-fold
    cases at ``nodes`` (None: the configuration was not scored there): mirroring as
    the pass predicted (``--tta``), and each class's largest component where it raises
    that class's mean Dice (``postchoice.largest_component``). The layout of
    ``RUN/postprocessing.json``'s decisions, so predict reads both alike."""
    rows = [r for r in scores.rows if (r.nodes, r.configuration) == (nodes, configuration)]
    if not rows:
        return None
    mirror = bool(scores.info.get("mirror", False))
    without = [postchoice.class_mean(r.dice.get(c) for r in rows) for c in scores.classes]
    with_ = [postchoice.class_mean(r.dice_lcc.get(c) for r in rows) for c in scores.classes]
    on = "mirror" if mirror else "plain"
    return {"cases": len(rows), "mirror": {"apply": mirror, "as_scored": True},
            "largest_component": {"on": on, "classes": postchoice.largest_component(
                scores.classes, without, with_)}}
