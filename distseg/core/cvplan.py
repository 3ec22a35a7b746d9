"""The plan of a cross-validation: which recipes, folds and node counts train, and where
each run lives. Written by ``distseg-jobs cv`` as ``CV/cv.json``, read by the job
runner, ``distseg-report`` (the CV tables) and ``distseg-predict --cv`` (the fold
ensemble).

Plain Python (no TensorFlow, no Horovod): ``analysis`` and ``distseg-jobs`` import it::

    CV/
      cv.json                         this plan
      runs/RECIPE/nN-rR/fold-I/       one run directory per recipe x node count x fold
      jobs/RECIPE-nN-fold-I.sbatch    its Slurm job (or the local runner's command)
      report/                         distseg-report over every run

A recipe is a name and the ``distseg-train`` flags that make it (``--preset demo
--loss dice``), and the data file it trains: the plan's, or its own (a 2D recipe trains
a slice file, a 3D recipe a volume file of the same cases and folds); every run of the
plan trains its recipe's data file with ``--fold I`` added.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from distseg.core.errors import InputError

#: The plan's file in the CV directory.
PLAN_FILE = "cv.json"
#: The plan's layout; a newer one is refused.
SCHEMA = 1
#: A recipe's name: what a folder and a Slurm job name can hold.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


@dataclass(frozen=True)
class Recipe:
    """One way to train: a name, its ``distseg-train`` flags and its data file."""

    name: str
    flags: tuple[str, ...] = ()
    data: str = ""
    """The data file its runs train (absolute path); "": the plan's ``data``. A plan
    written before recipes had their own reads as ""."""


@dataclass(frozen=True)
class CvRun:
    """One run of the plan: a recipe trained on one fold at one node count."""

    recipe: str
    fold: int
    nodes: int
    ranks: int
    """All ranks of the run (nodes x ranks per node)."""
    run_dir: str
    """Relative to the CV directory."""

    @property
    def label(self) -> str:
        """The run's name in jobs and tables: ``RECIPE-n2-fold-3``."""
        return f"{self.recipe}-n{self.nodes}-fold-{self.fold}"


@dataclass(frozen=True)
class CvPlan:
    """A whole cross-validation."""

    data: str
    """The data file of every recipe that names none (absolute path)."""
    k: int
    """Folds in the data file's fold table."""
    folds: tuple[int, ...]
    """The folds the plan runs (all of 0..k-1 unless a subset was asked)."""
    recipes: tuple[Recipe, ...]
    nodes: tuple[int, ...]
    ranks_per_node: int
    runs: tuple[CvRun, ...]
    target_dice: float | None = None
    """The validation Dice (mean over foreground classes) that "hours to target" counts to."""
    base_flags: tuple[str, ...] = ()
    """``distseg-train`` flags every recipe starts from (a recipe's own flags follow and
    win: the last of a repeated flag counts)."""
    schema: int = SCHEMA
    extra: dict = field(default_factory=dict)
    """What the writer adds for its own use (partition, time limit); readers ignore it."""

    def run_path(self, cv_dir: str, run: CvRun) -> str:
        return os.path.join(cv_dir, run.run_dir)

    def data_of(self, recipe: str) -> str:
        """The data file the runs of ``recipe`` train: its own, else the plan's."""
        return self.recipe(recipe).data or self.data

    def data_files(self) -> tuple[str, ...]:
        """Every data file the plan trains, the plan's first, each once."""
        return tuple(dict.fromkeys([self.data, *(r.data for r in self.recipes if r.data)]))

    def run_flags(self, run: CvRun) -> list[str]:
        """The training flags of ``run`` (what a job script passes after its own
        ``--data`` and ``--run-dir``): the base flags, the recipe's, its ``--fold``."""
        return [*self.base_flags, *self.recipe(run.recipe).flags, "--fold", str(run.fold)]

    def train_args(self, cv_dir: str, run: CvRun) -> list[str]:
        """The ``distseg-train`` arguments of ``run``: the one command line its Slurm job
        and the local runner both start (the launcher and threads aside)."""
        return ["--data", self.data_of(run.recipe), "--run-dir", self.run_path(cv_dir, run),
                *self.run_flags(run)]

    def recipe(self, name: str) -> Recipe:
        for r in self.recipes:
            if r.name == name:
                return r
        raise InputError(f"no recipe {name!r} in the plan (it has "
                         f"{', '.join(r.name for r in self.recipes)})")

    def write(self, cv_dir: str) -> str:
        from distseg.core.partial import write_json
        path = os.path.join(cv_dir, PLAN_FILE)
        write_json(path, asdict(self))
        return path


def run_dir_of(recipe: str, nodes: int, ranks: int, fold: int) -> str:
    """Where a run of the plan lives, relative to the CV directory."""
    return os.path.join("runs", recipe, f"n{nodes}-r{ranks}", f"fold-{fold}")


def make(data: str, k: int, folds: Sequence[int], recipes: Sequence[Recipe],
         nodes: Sequence[int], ranks_per_node: int, target_dice: float | None = None,
         base_flags: Sequence[str] = (), extra: dict | None = None) -> CvPlan:
    """The plan of every recipe x node count x fold, recipes first, then node counts,
    then folds (the order the local runner trains them in)."""
    runs = tuple(CvRun(r.name, f, n, n * ranks_per_node,
                       run_dir_of(r.name, n, n * ranks_per_node, f))
                 for r in recipes for n in nodes for f in folds)
    recipes = tuple(replace(r, data=os.path.abspath(r.data)) if r.data else r for r in recipes)
    return CvPlan(os.path.abspath(data), int(k), tuple(int(f) for f in folds), recipes,
                  tuple(int(n) for n in nodes), int(ranks_per_node), runs, target_dice,
                  tuple(base_flags), extra=dict(extra or {}))


def is_cv_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, PLAN_FILE))


def read(cv_dir: str) -> CvPlan:
    """The plan in ``cv_dir``.

    Raises:
      InputError: no plan, not JSON, a newer schema, or a field missing or of the wrong
        kind (one line naming the file and the field).
    """
    path = os.path.join(cv_dir, PLAN_FILE)
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{cv_dir}: not a cross-validation directory (no {PLAN_FILE}; "
                         f"write one with distseg-jobs cv)") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON plan ({e})") from None
    return _parsed(path, raw)


def _parsed(path: str, raw) -> CvPlan:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object")
    if int(raw.get("schema", 0)) > SCHEMA:
        raise InputError(f"{path}: field schema: {raw.get('schema')} is newer than this "
                         f"distseg reads ({SCHEMA}); upgrade distseg")
    try:
        recipes = tuple(Recipe(str(r["name"]), tuple(str(a) for a in r["flags"]),
                               str(r.get("data") or ""))
                        for r in raw["recipes"])
        runs = tuple(CvRun(str(r["recipe"]), int(r["fold"]), int(r["nodes"]), int(r["ranks"]),
                           str(r["run_dir"])) for r in raw["runs"])
        target = raw.get("target_dice")
        return CvPlan(str(raw["data"]), int(raw["k"]), tuple(int(f) for f in raw["folds"]),
                      recipes, tuple(int(n) for n in raw["nodes"]), int(raw["ranks_per_node"]),
                      runs, None if target is None else float(target),
                      tuple(str(a) for a in raw.get("base_flags", ())),
                      extra=dict(raw.get("extra") or {}))
    except KeyError as e:
        raise InputError(f"{path}: field {e.args[0]} is missing") from None
    except (TypeError, ValueError) as e:
        raise InputError(f"{path}: a field has the wrong kind ({e})") from None
