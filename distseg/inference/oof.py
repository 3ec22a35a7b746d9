"""``distseg-predict --cv CV --out-of-fold``: every configuration of a cross-validation
scored on the cases it never trained on, as nnU-Net's ``find_best_configuration``
scores its configurations and their pairwise ensembles.

A configuration is one recipe of the plan, or the ensemble of two recipes at one node
count. Each run predicts the validation cases of its own fold, read from its own data
file as training validated them (``decide``: a 2D run's slices at the model's size
stacked in file order, a 3D run's volumes whole), through the one sliding-window
inferer; an ensemble's prediction of a case is the mean of its members' softmax
probabilities (``ensemble.mean_of``, the fold ensemble's rule), the argmax then scored
as every single configuration is (``metrics.dice`` per foreground class). So the 2D
and the 3D recipe of a CV must see each case on one grid: their data files hold the
same cases and folds (``distseg-jobs cv`` checks it) and each case's voxels, as the two
models read them, must have one shape and the same labels, checked before anything is
predicted.

``run`` reads like its outline, on every rank: ``start`` (the plan, each run's config,
checkpoint and validation cases, the cases matched by name across recipes and their
grids compared), ``score_mine`` (this rank's share of the cases, dealt by voxel count;
each case predicted by every recipe's model of its fold, then ``score_case`` scores the
singles and every pair), then rank 0 writes ``CV/oof/`` (``core.oof``), which
``distseg-report CV`` turns into its configurations table. Configurations are ranked
on their plain predictions, before any post-processing, as nnU-Net compares them; each
case is also predicted mirrored (not with ``--tta none``) and each class scored with
its largest component alone, from which each configuration's mirroring and
post-processing are decided (``oof_lib.postprocessing``) and applied when
``distseg-predict --cv`` ships it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from distseg import metrics, sliding
from distseg.core import config as config_lib
from distseg.core import cvplan
from distseg.core import oof as oof_lib
from distseg.core.errors import InputError
from distseg.data import folds
from distseg.inference import decide, ensemble, postprocess, predict


@dataclass(frozen=True)
class Member:
    """One run of the plan as this pass predicts it."""

    recipe: str
    nodes: int
    fold: int
    run_dir: str
    cfg: config_lib.Config
    data: str
    """Its data file."""
    cases: Mapping[str, decide.Case]
    """Its fold's validation cases by name (``folds.file_cases`` names)."""
    grids: Mapping[str, tuple[int, int, int]]
    """Case name -> the (D, H, W) its model predicts the case on."""
    checkpoint: dict
    """Which checkpoint (``predict.Chosen.record``)."""


@dataclass(frozen=True)
class Item:
    """One case, predicted by every recipe's model of its fold at one node count."""

    nodes: int
    fold: int
    case: str
    voxels: int


@dataclass
class Start:
    """What every rank has agreed on before predicting."""

    cv_dir: str
    recipes: tuple[str, ...]
    members: dict[tuple[int, str, int], Member]
    """(nodes, recipe, fold) -> the run."""
    items: list[Item]
    class_names: tuple[str, ...]
    opts: predict.Options


# ------------------------------------------------------------------ start-up


def configurations(recipes: Sequence[str]) -> list[tuple[str, ...]]:
    """Every single recipe, then every pair (nnU-Net's order: singles first)."""
    return [(r,) for r in recipes] + list(itertools.combinations(recipes, 2))


def case_grid(cfg: config_lib.Config, info, case: decide.Case) -> tuple[int, int, int]:
    """The (D, H, W) a run's model predicts ``case`` on: a 2D run's slices at its image
    size, a 3D run's volume as stored."""
    if cfg.model.spatial_dims == 3:
        return tuple(int(s) for s in info.shapes[case.rows[0]])
    return (len(case.rows), cfg.model.image_size, cfg.model.image_size)


def member_of(run: cvplan.CvRun, run_dir: str,
              opts: predict.Options) -> tuple[Member, tuple[str, ...]]:
    """The run's config, data file, validation cases and checkpoint; and its class names.

    Raises:
      InputError: its data file is gone, or any of predict's start-up errors.
    """
    cfg = predict.run_config(run_dir)
    known = predict.training_data(cfg, dataclasses.replace(opts, run_dir=run_dir, data=None))
    if known.path is None:
        raise InputError(f"{run_dir}: its data file {cfg.data.path or '(none)'} is not there; "
                         "--out-of-fold predicts the cases its fold validated from it")
    listed = folds.file_cases(known.path)
    names = dict(zip(listed.case_ids.tolist(), listed.names))
    info = folds.examine(known.path, cfg.model.spatial_dims, cfg.data.fold)
    cases = {names[c.case_id]: c for c in decide.validation_cases(cfg, known.path)}
    chosen = predict.choose_checkpoint(run_dir, opts.which)
    return Member(run.recipe, run.nodes, run.fold, run_dir, cfg, known.path, cases,
                  {n: case_grid(cfg, info, c) for n, c in cases.items()},
                  chosen.record()), known.class_names


def _agree_on_cases(first: Member, other: Member) -> None:
    """The two recipes' runs of one fold validate the same cases on one grid.

    Raises:
      InputError: naming both data files, the case and what differs.
    """
    if set(first.cases) != set(other.cases):
        case = sorted(set(first.cases) ^ set(other.cases))[0]
        raise InputError(f"{first.data} and {other.data}: fold {first.fold} validates case "
                         f"{case!r} in one only; the recipes of a CV must validate the same "
                         "cases (distseg-jobs cv checks the fold tables)")
    for name, grid in first.grids.items():
        if other.grids[name] != grid:
            shown = [f"{m.data} gives {'x'.join(map(str, m.grids[name]))} "
                     f"({m.cfg.model.spatial_dims}D)" for m in (first, other)]
            raise InputError(f"case {name!r}: {shown[0]}, {shown[1]}; averaging needs both on "
                             "one grid (docs/cross-validation.md#configurations)")


def items_of(members: Mapping[tuple[int, str, int], Member], recipes: Sequence[str],
             nodes: Sequence[int], fold_list: Sequence[int]) -> list[Item]:
    """Every (node count, fold, case) to predict, each case checked across recipes."""
    out = []
    for n, f in itertools.product(nodes, fold_list):
        first = members[(n, recipes[0], f)]
        for r in recipes[1:]:
            _agree_on_cases(first, members[(n, r, f)])
        out += [Item(n, f, name, int(np.prod(first.grids[name]))) for name in sorted(first.cases)]
    return out


def _chosen_nodes(plan: cvplan.CvPlan, opts: predict.Options, path: str) -> tuple[int, ...]:
    if opts.nodes is None:
        return plan.nodes
    if opts.nodes not in plan.nodes:
        raise InputError(f"--nodes {opts.nodes}: not in {path} (its node counts: "
                         f"{', '.join(map(str, plan.nodes))})")
    return (opts.nodes,)


def start(opts: predict.Options) -> Start:
    """The plan's runs at the node counts asked for, every one trained, their classes
    the same, their cases matched (``items_of``).

    Raises:
      InputError: inputs, --out, --recipe or --data given; a run not trained; runs of
        other classes; recipes whose folds validate other cases, or a case on other
        grids (its labels are compared as it is read: ``check_truths``).
    """
    if opts.inputs or opts.out or opts.recipe or opts.data:
        raise InputError("--out-of-fold predicts every recipe's folds on their own "
                         "validation cases into CV/oof/: no INPUTS, --out, --recipe or --data")
    plan = cvplan.read(opts.cv)
    nodes = _chosen_nodes(plan, opts, f"{opts.cv}/{cvplan.PLAN_FILE}")
    recipes = tuple(r.name for r in plan.recipes)
    members, classes = {}, {}
    for r in recipes:
        for n in nodes:
            runs = sorted((x for x in plan.runs if (x.recipe, x.nodes) == (r, n)),
                          key=lambda x: x.fold)
            for run, run_dir in zip(runs, ensemble.cv_runs(opts.cv, r, n)):
                members[(n, r, run.fold)], classes[run_dir] = member_of(run, run_dir, opts)
    first = next(iter(classes))
    for run_dir, names in classes.items():
        if names != classes[first]:
            raise InputError(f"{first} and {run_dir} differ in class_names ({classes[first]} vs "
                             f"{names}): the configurations of a CV predict one set of classes")
    return Start(opts.cv, recipes, members, items_of(members, recipes, nodes, plan.folds),
                 classes[first], opts)


# ------------------------------------------------------------------ predicting


def network_of(m: Member, opts: predict.Options) -> predict.Network:
    """The run's checkpoint (``--which``) as predict runs it, plain and never
    post-processed (``predict_case`` mirrors it)."""
    own = dataclasses.replace(opts, run_dir=m.run_dir, tta="none", postprocess="none")
    return predict.network(m.cfg, own, m.data)


def scores_mirrored(opts: predict.Options) -> bool:
    """Whether the pass also predicts every case mirrored (all but ``--tta none``), so
    mirroring is decided out of fold (``oof_lib.postprocessing``)."""
    return opts.tta != "none"


@dataclass(frozen=True)
class Predicted:
    """One case as one run's model predicted it."""

    plain: np.ndarray
    """Class probabilities (D, H, W, C)."""
    mirror: np.ndarray | None
    """The same mirrored at test time (``postprocess.mirrored``); None: not asked."""
    truth: np.ndarray
    seconds: float


def predict_case(m: Member, net: predict.Network, reader, case: str, mirror: bool) -> Predicted:
    """One case, plain and (``mirror``) mirrored, through the sliding-window inferer."""
    image, truth = decide.read_case(reader, m.cases[case], m.cfg.model.spatial_dims)
    began = time.perf_counter()
    fns = [net.predict] + ([postprocess.mirrored(net.predict, postprocess.mirror_axes(net.window))]
                           if mirror else [])
    probs = [sliding.sliding_window(fn, image, net.window, net.overlap, batch=net.batch_size)
             for fn in fns]
    return Predicted(probs[0], probs[1] if mirror else None, truth, time.perf_counter() - began)


def check_truths(case: str, truths: Mapping[str, np.ndarray], members: Mapping[str, Member]) -> None:
    """Every recipe's labels of ``case`` are the same voxels.

    Raises:
      InputError: naming both data files, the case and how many voxels differ.
    """
    (first, a), *rest = truths.items()
    for other, b in rest:
        if a.shape != b.shape or not np.array_equal(a, b):
            differ = int((a != b).sum()) if a.shape == b.shape else "all"
            raise InputError(f"case {case!r}: the labels in {members[first].data} and "
                             f"{members[other].data} differ ({differ} voxels); the recipes' "
                             "data files must hold the same case on one grid")


def score_case(item: Item, predicted: Mapping[str, Predicted], truth: np.ndarray,
               class_names: Sequence[str]) -> list[oof_lib.CaseScore]:
    """One case's Dice per foreground class under every configuration of the recipes
    in ``predicted`` (recipe -> its prediction): each recipe alone, and every pair by
    the mean of their probabilities (``ensemble.mean_of``); plain and, where predicted,
    mirrored; each class also with only its largest connected component kept (the
    other classes untouched, as ``--decide`` scores it), for ``oof_lib.postprocessing``."""
    out = []
    for members in configurations(list(predicted)):
        plain = dice_of(ensemble.mean_of(predicted[r].plain for r in members), truth, class_names)
        unmirrored = any(predicted[r].mirror is None for r in members)
        mirror = ({}, {}) if unmirrored else dice_of(
            ensemble.mean_of(predicted[r].mirror for r in members), truth, class_names)
        out.append(oof_lib.CaseScore(item.nodes, oof_lib.ensemble_name(members), members,
                                     item.fold, item.case, *plain, *mirror))
    return out


def dice_of(probs: np.ndarray, truth: np.ndarray,
            class_names: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
    """(Dice per foreground class of the argmax of ``probs``, the same with each class
    alone reduced to its largest connected component)."""
    seg = np.argmax(probs, axis=-1)
    dice, lcc = {}, {}
    for c, name in enumerate(class_names[1:], start=1):
        dice[name] = _number(metrics.dice(truth == c, seg == c))
        lcc[name] = _number(metrics.dice(truth == c, postprocess.largest_component(seg == c)))
    return dice, lcc


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def score_group(s: Start, nodes: int, fold: int, items: Sequence[Item],
                seconds: dict) -> list[oof_lib.CaseScore]:
    """The cases of one fold at one node count: each recipe's model loaded once, every
    case predicted by each and scored (``score_case``); ``seconds`` collects each run's."""
    runs = {r: s.members[(nodes, r, fold)] for r in s.recipes}
    nets = {r: network_of(m, s.opts) for r, m in runs.items()}
    rows = []
    with contextlib.ExitStack() as stack:
        readers = {r: stack.enter_context(decide.open_reader(m.cfg, m.data, nets[r].window))
                   for r, m in runs.items()}
        for item in items:
            predicted = {r: predict_case(m, nets[r], readers[r], item.case,
                                         scores_mirrored(s.opts)) for r, m in runs.items()}
            for r, p in predicted.items():
                seconds[(nodes, r, fold)] = seconds.get((nodes, r, fold), 0.0) + p.seconds
            check_truths(item.case, {r: p.truth for r, p in predicted.items()}, runs)
            rows += score_case(item, predicted, predicted[s.recipes[0]].truth, s.class_names)
    return rows


def score_mine(s: Start, rank: int, size: int) -> tuple[list[oof_lib.CaseScore], dict]:
    """This rank's cases (by voxel count, ``sliding.shard_cases``), grouped by fold and
    node count; and the seconds each run took over them."""
    mine = [s.items[k] for k in sliding.shard_cases(range(len(s.items)), rank, size,
                                                     voxels=[i.voxels for i in s.items])]
    rows, seconds = [], {}
    for (nodes, fold), group in itertools.groupby(mine, key=lambda i: (i.nodes, i.fold)):
        rows += score_group(s, nodes, fold, list(group), seconds)
    return rows, seconds


# ------------------------------------------------------------------ the command


def costs_of(s: Start, gathered: Sequence[dict]) -> tuple[oof_lib.RunCost, ...]:
    """Each run's predicting seconds over every rank, and its case count."""
    out = []
    for (nodes, recipe, fold), m in sorted(s.members.items()):
        total = sum(g.get((nodes, recipe, fold), 0.0) for g in gathered)
        out.append(oof_lib.RunCost(nodes, recipe, fold, total, len(m.cases)))
    return tuple(out)


def record(s: Start) -> dict:
    """What ``oof.json`` says was predicted, beside the scores."""
    return {"which": s.opts.which, "tta": s.opts.tta, "mirror_scored": scores_mirrored(s.opts),
            "recipes": list(s.recipes),
            "runs": [{"nodes": n, "recipe": r, "fold": f, "run": os.path.abspath(m.run_dir),
                      "data": m.data, "checkpoint": m.checkpoint}
                     for (n, r, f), m in sorted(s.members.items())]}


def conclude(s: Start, rows: list[oof_lib.CaseScore], gathered: Sequence[dict],
             root: bool) -> list[str]:
    """Rank 0: ``CV/oof/`` written and the lines to print; the other ranks: nothing."""
    if not root:
        return []
    order = {c: i for i, c in enumerate(oof_lib.ensemble_name(m) for m in configurations(s.recipes))}
    rows = sorted(rows, key=lambda r: (r.nodes, order[r.configuration], r.fold, r.case))
    scores = oof_lib.Scores(tuple(s.class_names[1:]), tuple(rows), costs_of(s, gathered),
                            record(s))
    paths = oof_lib.write(s.cv_dir, scores)
    configs = len(configurations(s.recipes))
    return [f"out of fold: {len(s.items)} case prediction(s) x {len(s.recipes)} recipe(s), "
            f"{configs} configuration(s) (each recipe, each pair's mean probabilities); "
            + ("each also mirrored, mirroring decided per configuration"
               + (" (--tta mirror: applied)" if s.opts.tta == "mirror" else "")
               if scores_mirrored(s.opts) else "not mirrored (--tta none)")
            + "; each class also scored with its largest component alone",
            *(f"wrote {p}" for p in paths),
            f"next: distseg-report {s.cv_dir} (its configurations table and answer)"]


def run(opts: predict.Options) -> list[str]:
    """Every rank: predicts its share of the cases; rank 0 writes ``CV/oof/`` and
    returns the lines to print.

    Raises:
      InputError / RunError: one line, the same on every rank.
    """
    from distseg.parallel import agreement, threads
    from distseg.parallel import distributed as dist
    ctx = dist.init()
    threads.configure_threads(config_lib.TrainConfig(), ctx.cores)
    s = agreement.agree(start, opts)
    rows, seconds = agreement.agree(score_mine, s, ctx.rank, ctx.size)
    everyone = dist.allgather_object((rows, seconds))
    return agreement.agree(conclude, s, [r for part, _ in everyone for r in part],
                           [g for _, g in everyone], ctx.is_root())

