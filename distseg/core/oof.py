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
                  only its largest connected component kept; then the same two of
                  the prediction mirrored at test time, mirror_dice_<class> and
                  mirror_lcc_<class> (empty: not scored, ``--tta none``)
      oof.json    what was predicted: schema, classes, ``tta``, per run its
                  checkpoint and the seconds its cases took to predict

An ensemble is named by its members joined with ``" + "`` (recipe names hold no
spaces: ``cvplan.NAME``); ``members`` lists them separated by spaces.

Configurations are ranked on their plain predictions, before any post-processing, as
nnU-Net ranks them. ``postprocessing`` then decides, per configuration, whether to
mirror at test time and which classes keep only their largest component
(``core.postchoice``, on the cases as scored): the report prints it and
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
#: The Dice columns, ``<prefix>_<class>``: plain, its largest component, mirrored, and
#: mirrored with its largest component (the last two absent from files written before
#: mirroring was scored).
PREFIXES = ("dice", "lcc", "mirror_dice", "mirror_lcc")
#: What the mirroring decision was made on, in predict's words.
BASIS = "out-of-fold Dice"


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
    mirror: Mapping[str, float] = field(default_factory=dict)
    """``dice`` of the prediction mirrored at test time; empty where not scored."""
    mirror_lcc: Mapping[str, float] = field(default_factory=dict)
    """``dice_lcc`` of the prediction mirrored at test time; empty where not scored."""


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
        out.writerow([*KEYS, *(f"{prefix}_{c}" for prefix in PREFIXES for c in scores.classes)])
        for r in scores.rows:
            kinds = (r.dice, r.dice_lcc, r.mirror, r.mirror_lcc)
            out.writerow([r.nodes, r.configuration, " ".join(r.members), r.fold, r.case,
                          *(_cell(kind.get(c, math.nan)) for kind in kinds for c in scores.classes)])
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
                               int(r["fold"]), r["case"],
                               *(_dice(r, prefix, classes) for prefix in PREFIXES))
                     for r in table)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not the per-case table distseg-predict --out-of-fold "
                         f"writes (columns {', '.join(KEYS)}, dice_<class>, lcc_<class>; "
                         f"{e})") from None


def _dice(row: Mapping[str, str], prefix: str, classes: Sequence[str]) -> dict[str, float]:
    """The row's ``<prefix>_<class>`` Dice (NaN where empty); empty where the file has
    no such columns, or all its cells are empty (not scored)."""
    cells = [row.get(f"{prefix}_{c}") or "" for c in classes]
    if prefix in PREFIXES[2:] and not any(cells):
        return {}
    return {c: float(v) if v else math.nan for c, v in zip(classes, cells)}


def postprocessing(scores: Scores, nodes: int, configuration: str) -> dict | None:
    """What one configuration applies after its network, decided on its out-of-fold
    cases at ``nodes`` (None: the configuration was not scored there) by the rules of
    ``postchoice``: mirroring where it raises the mean foreground Dice (``--tta mirror``
    forces it, ``--tta none`` left it unscored and off), then, on the prediction so
    chosen, each class's largest component where it raises that class's mean Dice. The
    layout of ``RUN/postprocessing.json``'s decisions, so predict reads both alike."""
    rows = [r for r in scores.rows if (r.nodes, r.configuration) == (nodes, configuration)]
    if not rows:
        return None
    mirror = mirroring(scores, rows)
    # The CaseScore fields of the prediction mirroring chose (a one-pass file's ``dice``
    # is that pass, mirrored or not).
    mirrored = mirror["apply"] and not mirror.get("as_scored")
    chosen, chosen_lcc = ("mirror", "mirror_lcc") if mirrored else ("dice", "dice_lcc")
    without = [postchoice.class_mean(getattr(r, chosen).get(c) for r in rows)
               for c in scores.classes]
    with_ = [postchoice.class_mean(getattr(r, chosen_lcc).get(c) for r in rows)
             for c in scores.classes]
    on = "mirror" if mirror["apply"] else "plain"
    return {"cases": len(rows), "mirror": mirror,
            "largest_component": {"on": on, "classes": postchoice.largest_component(
                scores.classes, without, with_)}}


def mirroring(scores: Scores, rows: Sequence[CaseScore]) -> dict:
    """The mirroring decision of one configuration's ``rows`` (``postprocessing``).
    A file from before mirroring was scored (no ``tta`` in ``oof.json``): as its one
    pass predicted (``as_scored``)."""
    tta = scores.info.get("tta")
    if tta is None:
        return {"apply": bool(scores.info.get("mirror", False)), "as_scored": True}
    if not all(r.mirror for r in rows):
        return {"apply": False, "dice_plain": None, "dice_mirror": None, "scored": False,
                "basis": BASIS}
    decided = postchoice.mirroring(
        [postchoice.class_mean(r.dice.get(c) for r in rows) for c in scores.classes],
        [postchoice.class_mean(r.mirror.get(c) for r in rows) for c in scores.classes])
    return {**decided, "apply": decided["apply"] or tta == "mirror", "scored": True,
            "basis": BASIS, **({"forced": True} if tta == "mirror" else {})}
