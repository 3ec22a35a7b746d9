"""Cross-validation statistics, as pure functions on plain data (no pandas, no logs).

A cross-validation trains every recipe on every fold at every node count
(``distseg.core.cvplan``). Each run gives a ``Fold``: its final and best validation Dice
per class, each validation case's Dice at the final epoch (``val_cases_local``), its
hours. ``summarise`` reduces the folds of one recipe at one node count to a ``Group``:

* fold mean, sd and 95 % interval (Student's t over the folds, ``interval``) of the
  final and of the best Dice per class (best: the epoch of the highest mean foreground
  Dice, ``best_epoch``);
* the out-of-fold Dice per class as nnU-Net scores a cross-validation (``pooled``): the
  mean over every case of the Dice from the fold that validated it; where a fold has no
  per-case Dice, the mean of the folds' final Dice instead (``Group.oof_basis`` says);
* hours: to the target per fold (mean over the folds that reached it), all folds' hours
  added up, and the longest fold's (the CV's wall time with its folds side by side).

``paired`` compares each recipe with the best recipe fold by fold (same fold, same node
count) and ``decide`` makes "The answer": the recipe to ship and the node count that
reaches the target soonest.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from analysis.tables import foreground
from distseg.core.stats import Z_95, t_quantile

#: The class name of the mean over the foreground classes.
FOREGROUND = "mean_foreground"
#: Folds an interval needs: Student's t at 1 degree of freedom is beyond the
#: expansion of ``t_quantile`` (and wider than any use).
MIN_FOLDS = 3

Dice = Mapping[str, float]


@dataclass(frozen=True)
class Interval:
    """Mean, sd and two-sided 95 % Student t interval of ``n`` values; ``low`` and
    ``high`` are NaN below ``MIN_FOLDS`` values, ``sd`` below 2."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    def covers_zero(self) -> bool | None:
        """Whether the interval holds 0 (``None``: no interval)."""
        if math.isnan(self.low):
            return None
        return self.low <= 0.0 <= self.high


def interval(values: Sequence[float]) -> Interval:
    """``Interval`` of the finite ``values``: mean +- t(0.975, n-1) sd / sqrt(n)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if not n:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if n >= 2 else math.nan
    if n < MIN_FOLDS:
        return Interval(n, mean, sd, math.nan, math.nan)
    half = t_quantile(Z_95, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def mean_foreground(dice: Dice, classes: Sequence[str]) -> float:
    """Mean of ``dice`` over the foreground classes that have a value (NaN: none)."""
    values = [float(dice[c]) for c in foreground(classes) if _finite(dice.get(c))]
    return statistics.fmean(values) if values else math.nan


def best_epoch(per_epoch: Mapping[int, Dice], classes: Sequence[str]) -> int | None:
    """The epoch of the highest mean foreground Dice (the earliest on ties)."""
    scored = [(mean_foreground(d, classes), -e, e) for e, d in per_epoch.items()]
    scored = [s for s in scored if math.isfinite(s[0])]
    return max(scored)[2] if scored else None


def largest_fall(values: Sequence[float]) -> float:
    """The largest fall of a run's validation Dice between two consecutive
    validations in its second half (0: none): how far the last epochs swing, which a
    final-epoch Dice alone hides (docs/studies/folds-2026-11-27.md)."""
    half = [v for v in values[len(values) // 2:] if _finite(v)]
    return max([0.0] + [a - b for a, b in zip(half, half[1:])])


def falls(per_epoch: Mapping[int, Dice], classes: Sequence[str]) -> dict[str, float]:
    """Per class (and ``FOREGROUND``) the ``largest_fall`` over the epochs in order."""
    epochs = [per_epoch[e] for e in sorted(per_epoch)]
    out = {c: largest_fall([d.get(c, math.nan) for d in epochs]) for c in classes}
    out[FOREGROUND] = largest_fall([mean_foreground(d, classes) for d in epochs])
    return out


def case_means(cases: Mapping[str, Dice], classes: Sequence[str]) -> dict[str, float]:
    """Per class, the mean Dice over ``cases`` (a case without a Dice for a class, the
    class absent from its truth and prediction, is left out of that class), and the
    ``FOREGROUND`` mean of the foreground classes' means."""
    out = {}
    for c in classes:
        values = [float(d[c]) for d in cases.values() if _finite(d.get(c))]
        out[c] = statistics.fmean(values) if values else math.nan
    out[FOREGROUND] = mean_foreground(out, classes)
    return out


@dataclass(frozen=True)
class Fold:
    """What one run of the plan gave (``counted`` False: missing or unfinished, left out
    of every statistic)."""

    recipe: str
    nodes: int
    fold: int
    run: str
    status: str
    counted: bool
    spatial_dims: int | None = None
    final_epoch: int | None = None
    final: Dice = field(default_factory=dict)
    best_epoch: int | None = None
    best: Dice = field(default_factory=dict)
    cases: Mapping[str, Dice] | None = None
    """Case id -> Dice per class at the final epoch; ``None``: not logged."""
    hours: float = math.nan
    """Wall-clock hours of the run (its launches added up)."""
    to_target: Mapping[float, float] = field(default_factory=dict)
    """Target -> hours until the validation Dice first reached it (NaN: not reached)."""
    fall: Dice = field(default_factory=dict)
    """Per class the largest fall of the Dice in the second half (``falls``)."""

    def score(self, classes: Sequence[str]) -> float:
        """The fold's mean foreground Dice as the paired comparison takes it: over its
        cases where logged, else its final validation Dice."""
        if self.cases:
            return case_means(self.cases, classes)[FOREGROUND]
        return mean_foreground(self.final, classes)


def pooled(folds: Sequence[Fold], classes: Sequence[str]) -> tuple[dict[str, float], str]:
    """The out-of-fold Dice per class (and ``FOREGROUND``) and what it rests on.

    Every case's Dice from the fold that validated it, averaged per class over all
    cases of all folds; where a fold has no per-case Dice, the mean over the folds of
    their final Dice instead."""
    lacking = [f.fold for f in folds if not f.cases]
    if not folds:
        return {}, "no fold counted"
    if lacking:
        means = {c: interval([f.final.get(c, math.nan) for f in folds]).mean
                 for c in classes}
        means[FOREGROUND] = interval([mean_foreground(f.final, classes) for f in folds]).mean
        shown = ", ".join(map(str, lacking))
        return means, f"mean of folds (no per-case Dice in fold {shown})"
    cases = {f"{f.fold}/{case}": dice for f in folds for case, dice in f.cases.items()}
    return case_means(cases, classes), f"per case ({len(cases)} cases)"


@dataclass(frozen=True)
class Group:
    """One recipe at one node count, over its folds."""

    recipe: str
    nodes: int
    spatial_dims: int | None
    planned: int
    folds: tuple[Fold, ...]
    """The counted folds, in fold order."""
    final: dict[str, Interval]
    best: dict[str, Interval]
    oof: dict[str, float]
    oof_basis: str
    to_target: dict[float, Interval]
    """Target -> hours to it over the folds that reached it (``n`` says how many)."""
    hours_total: float
    hours_side_by_side: float

    @property
    def score(self) -> float:
        return self.oof.get(FOREGROUND, math.nan)

    @property
    def hours_per_fold(self) -> float:
        return interval([f.hours for f in self.folds]).mean


def _per_class(folds: Sequence[Fold], classes: Sequence[str], which: str) -> dict[str, Interval]:
    out = {c: interval([getattr(f, which).get(c, math.nan) for f in folds]) for c in classes}
    out[FOREGROUND] = interval([mean_foreground(getattr(f, which), classes) for f in folds])
    return out


def summarise(folds: Sequence[Fold], classes: Sequence[str],
              targets: Sequence[float]) -> list[Group]:
    """One ``Group`` per recipe and node count, in the order of ``folds``."""
    keys = list(dict.fromkeys((f.recipe, f.nodes) for f in folds))
    out = []
    for recipe, nodes in keys:
        mine = [f for f in folds if (f.recipe, f.nodes) == (recipe, nodes)]
        counted = tuple(sorted((f for f in mine if f.counted), key=lambda f: f.fold))
        oof, basis = pooled(counted, classes)
        dims = next((f.spatial_dims for f in mine if f.spatial_dims), None)
        hours = [f.hours for f in counted if math.isfinite(f.hours)]
        out.append(Group(recipe, nodes, dims, len(mine), counted,
                         _per_class(counted, classes, "final"),
                         _per_class(counted, classes, "best"), oof, basis,
                         {t: interval([f.to_target.get(t, math.nan) for f in counted])
                          for t in targets},
                         sum(hours) if hours else math.nan, max(hours) if hours else math.nan))
    return out


@dataclass(frozen=True)
class Paired:
    """``recipe`` minus ``best``, fold by fold, at ``nodes`` (``None``: every node
    count, each fold's differences averaged over the node counts)."""

    nodes: int | None
    recipe: str
    best: str
    folds: tuple[int, ...]
    differences: tuple[float, ...]
    diff: Interval

    @property
    def within_noise(self) -> bool | None:
        """Whether the interval covers 0 (``None``: too few folds for one)."""
        return self.diff.covers_zero()


def _by_fold(groups: Sequence[Group], recipe: str, nodes: int | None,
             classes: Sequence[str]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for g in groups:
        if g.recipe == recipe and (nodes is None or g.nodes == nodes):
            for f in g.folds:
                out.setdefault(f.fold, []).append(f.score(classes))
    return out


def paired(groups: Sequence[Group], recipe: str, best: str, nodes: int | None,
           classes: Sequence[str]) -> Paired:
    """``recipe``'s fold scores (``Fold.score``) minus ``best``'s on the same folds at
    the same node count; with ``nodes`` None, per fold the mean of those differences over
    the node counts both ran it at."""
    diffs: dict[int, list[float]] = {}
    node_counts = sorted({g.nodes for g in groups}) if nodes is None else [nodes]
    for n in node_counts:
        mine, theirs = (_by_fold(groups, r, n, classes) for r in (recipe, best))
        for fold in sorted(set(mine) & set(theirs)):
            diffs.setdefault(fold, []).append(mine[fold][0] - theirs[fold][0])
    folds = tuple(sorted(diffs))
    values = tuple(statistics.fmean(diffs[f]) for f in folds)
    return Paired(nodes, recipe, best, folds, values, interval(values))


def recipe_scores(groups: Sequence[Group]) -> dict[str, float]:
    """Each recipe's out-of-fold mean foreground Dice, averaged over its node counts."""
    out: dict[str, list[float]] = {}
    for g in groups:
        if math.isfinite(g.score):
            out.setdefault(g.recipe, []).append(g.score)
    return {r: statistics.fmean(v) for r, v in out.items()}


def best_recipe(groups: Sequence[Group], nodes: int | None = None) -> str | None:
    """The recipe of the highest out-of-fold mean foreground Dice at ``nodes`` (None:
    averaged over the node counts)."""
    scores = recipe_scores([g for g in groups if nodes is None or g.nodes == nodes])
    return max(scores, key=scores.get) if scores else None


def recipe_hours(groups: Sequence[Group], recipe: str) -> float:
    """Mean wall-clock hours of one fold of ``recipe``, over all its counted runs."""
    return interval([f.hours for g in groups if g.recipe == recipe for f in g.folds]).mean


@dataclass(frozen=True)
class Answer:
    """What a cross-validation decides (``decide``).

    Attributes:
      recipe: the recipe to ship (``None``: no fold counted).
      best: the recipe of the highest out-of-fold mean foreground Dice.
      runner_up: the next one, and ``versus`` its paired difference from ``best``
        over every node count (``None`` with one recipe).
      tied: best and runner-up cannot be told apart (the interval covers 0); then
        ``recipe`` is the runner-up where it was cheaper on every fold
        (``cheaper_in_every_fold``), else the best.
      scores: recipe -> out-of-fold mean foreground Dice (over node counts).
      nodes: per target, the node count whose folds of ``recipe`` reach it soonest on
        mean, among those where the most folds reached it (``fastest_nodes``); ``None``
        where no fold did.
    """

    recipe: str | None
    best: str | None
    runner_up: str | None
    versus: Paired | None
    tied: bool
    scores: dict[str, float]
    nodes: dict[float, int | None]


def fastest_nodes(groups: Sequence[Group], recipe: str, target: float) -> int | None:
    """The node count of ``recipe`` whose folds reach ``target`` in the fewest mean
    hours, among those where the most folds reached it (all of them, where any node
    count has that); ``None`` where no fold did."""
    mine = [g for g in groups if g.recipe == recipe and g.to_target[target].n]
    if not mine:
        return None
    most = max(g.to_target[target].n / len(g.folds) for g in mine)
    done = [g for g in mine if g.to_target[target].n / len(g.folds) == most]
    return min(done, key=lambda g: g.to_target[target].mean).nodes


#: How much fewer hours a recipe must take, fold by fold, to be shipped instead of a
#: better-scoring one it cannot be told apart from: a fold's hours vary with the
#: machine's load by more than a few per cent, so a smaller margin would pick by noise.
CHEAPER = 0.10


def cheaper_in_every_fold(groups: Sequence[Group], recipe: str, than: str) -> bool:
    """Whether ``recipe`` took at least ``CHEAPER`` fewer hours than ``than`` on every
    fold and node count both ran (and they share at least one)."""
    def hours(name):
        return {(g.nodes, f.fold): f.hours for g in groups if g.recipe == name for f in g.folds
                if math.isfinite(f.hours)}
    mine, theirs = hours(recipe), hours(than)
    shared = set(mine) & set(theirs)
    return bool(shared) and all(mine[k] <= (1 - CHEAPER) * theirs[k] for k in shared)


def decide(groups: Sequence[Group], classes: Sequence[str],
           targets: Sequence[float]) -> Answer:
    """The recipe to ship and, per target, its node count that reaches it soonest."""
    scores = recipe_scores(groups)
    ranked = sorted(scores, key=lambda r: -scores[r])
    if not ranked:
        return Answer(None, None, None, None, False, scores, {t: None for t in targets})
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    versus = paired(groups, runner, best, None, classes) if runner else None
    tied = bool(versus and versus.within_noise)
    ship = runner if tied and cheaper_in_every_fold(groups, runner, best) else best
    return Answer(ship, best, runner, versus, tied, scores,
                  {t: fastest_nodes(groups, ship, t) for t in targets})


def ensemble_pair(groups: Sequence[Group]) -> tuple[str | None, str | None]:
    """The best 2D and the best 3D recipe by out-of-fold Dice (from the training logs),
    listed side by side where no out-of-fold predictions were made (``configurations``
    scores them and their ensemble)."""
    return (best_recipe([g for g in groups if g.spatial_dims == 2]),
            best_recipe([g for g in groups if g.spatial_dims == 3]))


# ---- Configurations: each recipe and each pair's ensemble, out of fold -----------------

#: Out-of-fold mean foreground Dice closer than this to the best count as a tie, which
#: goes to the configuration listed first (a single recipe before an ensemble, as
#: nnU-Net's ``find_best_configuration`` breaks its ties): a gain under the last digit
#: the report prints is no reason to train and run the networks of two recipes.
TIE = 1e-4


@dataclass(frozen=True)
class Configuration:
    """One recipe, or the ensemble of two (the mean of their probabilities), at one
    node count, scored on every case by the models of the fold that validated it."""

    name: str
    members: tuple[str, ...]
    nodes: int
    dims: str
    """``2D``, ``3D``, or the members' joined (``2D + 3D``)."""
    oof: dict[str, float]
    """Per class (and ``FOREGROUND``) the mean over cases of its Dice (``case_means``)."""
    cases: int
    case_sd: float
    """The sd over cases of each case's mean foreground Dice."""
    folds: dict[int, float]
    """Fold -> the mean foreground Dice over the cases it validated."""
    over_folds: Interval
    hours: float
    """Training: the hours of every fold of its members, added up."""
    predict_hours: float
    """Predicting its out-of-fold cases: its members' networks, added up (NaN: not
    recorded)."""
    largest: dict[str, dict] = field(default_factory=dict)
    """Foreground class -> its largest-component decision out of fold (``apply``,
    ``dice_without``, ``dice_with``, on the prediction mirroring chose:
    ``distseg.core.oof.postprocessing``)."""
    mirror: dict = field(default_factory=dict)
    """Its mirroring decision out of fold (``apply``, ``dice_plain``, ``dice_mirror``,
    ``scored``; ``as_scored`` for a file of one pass: ``distseg.core.oof.mirroring``)."""

    @property
    def score(self) -> float:
        return self.oof.get(FOREGROUND, math.nan)

    @property
    def kept(self) -> tuple[str, ...]:
        """The classes that keep only their largest component."""
        return tuple(c for c, d in self.largest.items() if d["apply"])

    @property
    def mirror_text(self) -> str:
        """``yes``, ``no``, or ``-`` where mirroring was not scored (``--tta none``)."""
        if not self.mirror or self.mirror.get("scored") is False:
            return "-"
        return "yes" if self.mirror.get("apply") else "no"

    @property
    def post_oof(self) -> dict[str, float]:
        """The Dice after post-processing: per class, of the prediction mirroring chose
        with its largest component where that was decided (``oof`` where no decision
        gives one)."""
        out = {}
        for c, v in self.oof.items():
            if c == FOREGROUND:
                continue
            d = self.largest.get(c) or {}
            chosen = d.get("dice_with") if d.get("apply") else d.get("dice_without")
            out[c] = v if chosen is None else chosen
        out[FOREGROUND] = mean_foreground(out, list(out))
        return out


def _dims_of(groups: Sequence[Group], members: Sequence[str], nodes: int) -> str:
    dims = [next((f"{g.spatial_dims}D" for g in groups if (g.recipe, g.nodes) == (m, nodes)
                  and g.spatial_dims), "?") for m in members]
    return " + ".join(dims)


def _members_hours(groups: Sequence[Group], members: Sequence[str], nodes: int) -> float:
    hours = [g.hours_total for g in groups if g.recipe in members and g.nodes == nodes]
    return sum(hours) if len(hours) == len(members) else math.nan


def configurations(rows: Sequence, classes: Sequence[str], groups: Sequence[Group],
                   predict_seconds: Callable[[int, Sequence[str]], float],
                   decided: Callable[[int, str], dict | None] = lambda n, c: None
                   ) -> list[Configuration]:
    """One ``Configuration`` per node count and configuration of ``rows`` (the
    ``distseg.core.oof.CaseScore`` rows, in their order), its hours from the recipes'
    ``groups`` and ``predict_seconds(nodes, members)``, its mirroring and
    post-processing from ``decided(nodes, configuration)``
    (``distseg.core.oof.postprocessing``)."""
    keys = list(dict.fromkeys((r.nodes, r.configuration) for r in rows))
    out = []
    for nodes, name in keys:
        mine = [r for r in rows if (r.nodes, r.configuration) == (nodes, name)]
        members = mine[0].members
        decision = decided(nodes, name) or {}
        per_fold = {f: case_means({r.case: r.dice for r in mine if r.fold == f},
                                  classes)[FOREGROUND]
                    for f in sorted({r.fold for r in mine})}
        out.append(Configuration(
            name, members, nodes, _dims_of(groups, members, nodes),
            case_means({f"{r.fold}/{r.case}": r.dice for r in mine}, classes), len(mine),
            interval([mean_foreground(r.dice, classes) for r in mine]).sd, per_fold,
            interval(list(per_fold.values())), _members_hours(groups, members, nodes),
            predict_seconds(nodes, members) / 3600.0,
            (decision.get("largest_component") or {}).get("classes", {}),
            decision.get("mirror") or {}))
    return out


@dataclass(frozen=True)
class ConfigAnswer:
    """The configuration to ship (``choose_configuration``).

    Attributes:
      name: the configuration of the highest out-of-fold mean foreground Dice, averaged
        over the node counts (ties within ``TIE``: the first listed, singles first).
      members: its recipes.
      scores: configuration -> that average.
      best_single: the best single recipe (itself when ``name`` is one).
      runner_up: the next configuration, and ``versus`` the ship's fold-by-fold
        difference from it (each fold's mean foreground Dice, averaged over the node
        counts), with its interval.
      tied: another configuration scored within ``TIE`` of the best (listed after the
        ship, which won the tie).
    """

    name: str
    members: tuple[str, ...]
    scores: dict[str, float]
    best_single: str
    runner_up: str | None
    versus: Interval | None
    tied: bool


def _fold_scores(configs: Sequence[Configuration], name: str) -> dict[int, float]:
    """Fold -> the configuration's fold score averaged over its node counts."""
    by_fold: dict[int, list[float]] = {}
    for c in configs:
        if c.name == name:
            for f, v in c.folds.items():
                by_fold.setdefault(f, []).append(v)
    return {f: statistics.fmean(v) for f, v in by_fold.items()}


def choose_configuration(configs: Sequence[Configuration]) -> ConfigAnswer | None:
    """The configuration to ship: the highest out-of-fold mean foreground Dice
    (averaged over node counts), a tie within ``TIE`` going to the one listed first."""
    order = list(dict.fromkeys(c.name for c in configs))
    scores = {n: statistics.fmean([c.score for c in configs if c.name == n]) for n in order}
    scores = {n: v for n, v in scores.items() if math.isfinite(v)}
    if not scores:
        return None
    top = max(scores.values())
    ship = next(n for n in order if n in scores and scores[n] >= top - TIE)
    members = next(c.members for c in configs if c.name == ship)
    singles = [n for n in order if n in scores and
               len(next(c.members for c in configs if c.name == n)) == 1]
    rest = sorted((n for n in scores if n != ship), key=lambda n: -scores[n])
    runner = rest[0] if rest else None
    versus = None
    if runner:
        mine, theirs = _fold_scores(configs, ship), _fold_scores(configs, runner)
        versus = interval([mine[f] - theirs[f] for f in sorted(set(mine) & set(theirs))])
    return ConfigAnswer(ship, members, scores,
                        max(singles, key=lambda n: scores[n]) if singles else ship,
                        runner, versus, any(scores[n] >= top - TIE for n in rest))
