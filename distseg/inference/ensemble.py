"""Fold ensembles: ``distseg-predict`` with several trained runs, averaged.

Cross-validation trains one model per fold; their ensemble predicts new scans as
nnU-Net's does. The members come from ``--checkpoint`` given several times, or from a
cross-validation plan (``--cv CV_DIR``, ``core.cvplan``): the fold runs of one recipe
at one node count (``cv_runs``).

``run`` reads like its outline, on every rank: ``resolved`` (the member runs),
``start`` (each member's config and training data, ``check_agree``: what the data
file decides is the same for every member; then predict's own checks of the scans), and
``predict.run``'s loop over this rank's scans with the ensemble's ``network``:

* **probabilities, averaged.** ``averaged`` runs every member on the same window batch
  and returns the mean of their softmax probabilities, so the one sliding-window
  inferer (``distseg.sliding``) blends and reassembles the ensemble's windows as it
  does one model's. Since the inferer is linear in the probabilities, this is the mean
  of the members' own predictions of the volume.
* **one decision for the ensemble.** Mirroring and the largest component per class are
  decided on the pooled validation rows of the members' ``postprocessing.json``
  (``postprocess.choose_pooled``: out of fold, for the folds of one cross-validation).

``export`` writes the ensemble as one plain Keras model that averages the members'
outputs (``export.ensemble_model``), with the input convention of a single run.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from distseg.core import config as config_lib
from distseg.core import cvplan, rundir
from distseg.core import oof as oof_lib
from distseg.core.errors import InputError
from distseg.inference import postprocess, predict


@dataclass(frozen=True)
class Member:
    """One run of an ensemble, as predict reads it before loading weights."""

    run_dir: str
    cfg: config_lib.Config
    known: predict.TrainingData
    window: tuple[int, int, int]


# --------------------------------------------------------------- which runs


def _one_of(values: Sequence, given, flag: str, what: str, path: str):
    """``given`` if it is one of ``values``; with ``given`` None, the only value."""
    listed = ", ".join(map(str, values))
    if given is None:
        if len(values) != 1:
            raise InputError(f"{path}: holds {len(values)} {what}s ({listed}); pick one with {flag}")
        return values[0]
    if given not in values:
        raise InputError(f"{flag} {given}: not in {path} (its {what}s: {listed})")
    return given


def cv_runs(cv_dir: str, recipe: str | None = None, nodes: int | None = None) -> tuple[str, ...]:
    """The run directories of the folds of ``recipe`` at ``nodes`` nodes in the plan of
    ``cv_dir``, by fold; either may be None when the plan has only one.

    Raises:
      InputError: no plan, a recipe or node count it lacks, one left out where it has
        several, or a fold not trained yet (no config.json).
    """
    plan = cvplan.read(cv_dir)
    path = os.path.join(cv_dir, cvplan.PLAN_FILE)
    recipe = _one_of(list(dict.fromkeys(r.recipe for r in plan.runs)), recipe, "--recipe",
                     "recipe", path)
    nodes = _one_of(list(dict.fromkeys(r.nodes for r in plan.runs if r.recipe == recipe)),
                    nodes, "--nodes", "node count", path)
    runs = sorted((r for r in plan.runs if r.recipe == recipe and r.nodes == nodes),
                  key=lambda r: r.fold)
    for r in runs:
        where = plan.run_path(cv_dir, r)
        if not os.path.isfile(rundir.config_path(where)):
            raise InputError(f"{where}: fold {r.fold} of {r.label} has no trained run (no "
                             f"{rundir.CONFIG_FILE}); train it before predicting with the folds")
    return tuple(plan.run_path(cv_dir, r) for r in runs)


def resolved(opts: predict.Options) -> predict.Options:
    """``opts`` with every member run in ``run_dir`` and ``more_runs`` (``--cv``'s
    folds, or the ``--checkpoint`` runs as given).

    Raises:
      InputError: a run given twice, or any of ``cv_runs``' errors.
    """
    if opts.cv:
        runs = tuple(r for recipe in (opts.recipe or (None,))
                     for r in cv_runs(opts.cv, recipe, opts.nodes))
    else:
        runs = opts.runs
    seen: dict[str, str] = {}
    for run in runs:
        key = os.path.realpath(run)
        if key in seen:
            raise InputError(f"{run}: given twice in the ensemble (also as {seen[key]})")
        seen[key] = run
    return dataclasses.replace(opts, run_dir=runs[0], more_runs=tuple(runs[1:]))


# --------------------------------------------------------------- agreement


def member(run_dir: str, opts: predict.Options) -> Member:
    """One run's config, training data and window (predict's own checks of each)."""
    cfg = predict.run_config(run_dir)
    own = dataclasses.replace(opts, run_dir=run_dir)
    known = predict.training_data(cfg, own)
    return Member(run_dir, cfg, known, predict.model_window(cfg, known.path, run_dir))


def facts(m: Member) -> dict[str, object]:
    """What the members must share, by name: the classes they predict, and the input
    channels they read from a scan. The layout, window, normalisation and grid may
    differ: members that read a scan alike are averaged window batch by window batch,
    and groups that read it otherwise are averaged on the scan's own grid
    (``network``, ``predict.segment``)."""
    prep = m.known.prep
    return {
        "class_names": tuple(m.known.class_names),
        "channels": len(prep.intensities),
        "channel": prep.channel,
    }


def check_agree(members: Sequence[Member]) -> None:
    """Every member shares ``facts`` with the first.

    Raises:
      InputError: one line naming both runs, the field and both values.
    """
    first = facts(members[0])
    for m in members[1:]:
        for name, value in facts(m).items():
            if value != first[name]:
                raise InputError(
                    f"{members[0].run_dir} and {m.run_dir} differ in {name} ({first[name]} vs "
                    f"{value}): the members of an ensemble see one input and predict one set "
                    "of classes")


def check_subset(members: Sequence[Member], subset: str) -> None:
    """``--subset val|train`` names the cases of one split: refused when the members'
    data files (or folds) split the cases differently."""
    if subset not in ("val", "train"):
        return
    for m in members[1:]:
        if m.known.cases != members[0].known.cases:
            raise InputError(f"--subset {subset}: {members[0].run_dir} and {m.run_dir} split the "
                             "cases differently (other folds); give test, all or the files")


def members_of(opts: predict.Options) -> list[Member]:
    """Every member of ``opts.runs``, checked to agree.

    Raises:
      InputError: a member's own start-up error, or a disagreement.
    """
    members = [member(run, opts) for run in opts.runs]
    check_agree(members)
    check_subset(members, opts.subset)
    return members


# ------------------------------------------------------------------ the network


def mean_of(outputs: Iterable[np.ndarray]) -> np.ndarray:
    """The mean of members' softmax probabilities (summed in float64 one member at a
    time, returned in float32): how an ensemble combines its members, for a window batch
    (``averaged``) or a whole case (``inference.oof``)."""
    total, n = None, 0
    for out in outputs:
        out = np.asarray(out, dtype=np.float64)
        total, n = (out if total is None else total + out), n + 1
    return (total / n).astype(np.float32)


def averaged(predicts: Sequence[Callable[[np.ndarray], np.ndarray]]) -> Callable[[np.ndarray], np.ndarray]:
    """One ``predict`` of the mean of ``predicts``' outputs (``mean_of``): the
    ensemble's probabilities of a window batch."""
    def run(x: np.ndarray) -> np.ndarray:
        return mean_of(fn(x) for fn in predicts)
    return run


class Loaded(NamedTuple):
    """One member's network with its weights, and which checkpoint they are."""

    model: object
    """The Keras model."""
    chosen: predict.Chosen


def loaded(members: Sequence[Member], opts: predict.Options) -> list[Loaded]:
    """Every member's network with the weights of its checkpoint (``--which`` of each)."""
    out = []
    for m in members:
        chosen = predict.choose_checkpoint(m.run_dir, opts.which)
        model = predict.build_model(m.cfg, m.run_dir, predict.input_shape(m.cfg, m.window), chosen)
        out.append(Loaded(model, chosen))
    return out


def applied(members: Sequence[Member], chosen: Sequence, opts: predict.Options) -> postprocess.Applied:
    """The ensemble's mirroring and largest components: with ``--cv``, decided on this
    very configuration's out-of-fold predictions when ``CV/oof/`` scored it
    (``out_of_fold``); else on the members' own validation rows pooled
    (``postprocess.choose_pooled``)."""
    names = members[0].known.class_names
    found, why = out_of_fold(opts, members, chosen) if opts.cv else (None, None)
    if found is not None:
        post = postprocess.from_decisions(found, names, opts.tta, opts.postprocess)
        return dataclasses.replace(post, words=f"{post.words}; decided out of fold on the "
                                   f"{found['cases']} case(s) of {found['where']}")
    post = postprocess.choose_pooled([(m.run_dir, c.stem) for m, c in zip(members, chosen)],
                                     names, opts.tta, opts.postprocess)
    return dataclasses.replace(post, warnings=post.warnings + ((why,) if why else ()))


def out_of_fold(opts: predict.Options, members: Sequence[Member],
                chosen: Sequence) -> tuple[dict | None, str | None]:
    """(the decisions ``oof_lib.postprocessing`` made for the configuration of these
    members, None) when ``CV/oof/`` scored it with these very checkpoints; else (None,
    why not, or None where the CV has no out-of-fold scores)."""
    plan = cvplan.read(opts.cv)
    where = {os.path.realpath(plan.run_path(opts.cv, r)): r for r in plan.runs}
    runs = [where[os.path.realpath(m.run_dir)] for m in members]
    try:
        scores = oof_lib.read(opts.cv)
    except InputError as e:
        return None, f"{e}; its decisions not used"
    if scores is None:
        return None, None
    recipes = [r.name for r in plan.recipes if r.name in {x.recipe for x in runs}]
    name = oof_lib.ensemble_name(recipes)
    recorded = {(x["recipe"], x["fold"], x["nodes"]): x["checkpoint"].get("stem")
                for x in scores.info.get("runs", ())}
    if any(recorded.get((r.recipe, r.fold, r.nodes)) != c.stem for r, c in zip(runs, chosen)):
        return None, (f"{oof_lib.path_of(opts.cv, oof_lib.DIR)} scored other checkpoints of "
                      f"{name}: its decisions not used (run --out-of-fold again)")
    found = oof_lib.postprocessing(scores, runs[0].nodes, name)
    if found is None:
        return None, None
    return {**found, "where": f"{oof_lib.path_of(opts.cv, oof_lib.DIR)} ({name})"}, None


def member_lines(members: Sequence[Member], chosen: Sequence) -> tuple[str, ...]:
    """Each member's checkpoint (and its warnings), for the terminal."""
    lines = [f"warning: {m.run_dir}: {w}" for m, c in zip(members, chosen) for w in c.warnings]
    return tuple(lines + [f"member {i}: {m.run_dir}: checkpoint {c.words}"
                          for i, (m, c) in enumerate(zip(members, chosen))])


def reading(m: Member) -> tuple:
    """How a member reads a scan: its window and its preprocessing (members alike in
    both are averaged window batch by window batch)."""
    return tuple(m.window), dataclasses.replace(m.known.prep, where="")


def on_window(members: Sequence[Member], models: Sequence[Loaded], post: postprocess.Applied,
              opts: predict.Options, first: Member) -> predict.Network:
    """The members that read a scan alike, as the sliding-window inferer runs them:
    every member on each window batch, their probabilities averaged (then mirrored where
    decided); the batch size and overlap of the first of them unless the flags set
    them; their preprocessing kept where it is not the ensemble's ``first``'s."""
    one = members[0]
    fn = averaged([predict.predictor(x.model, m.cfg.model.spatial_dims)
                   for m, x in zip(members, models)])
    if post.mirror:
        fn = postprocess.mirrored(fn, postprocess.mirror_axes(one.window))
    batch, overlap = predict.inferer_settings(one.cfg, opts)
    prep = None if reading(one)[1] == reading(first)[1] else one.known.prep
    return predict.Network(fn, one.window, batch, overlap, None, post, members=len(members),
                           prep=prep)


def network(members: Sequence[Member], opts: predict.Options) -> predict.Network:
    """The ensemble as predict runs it: the members grouped by how they read a scan
    (``reading``; a 2D and a 3D recipe are two groups, ``on_window`` each), every
    member's probabilities weighing alike (``predict.segment``)."""
    models = loaded(members, opts)
    chosen = [x.chosen for x in models]
    post = applied(members, chosen, opts)
    kinds = [k for i, k in enumerate(map(reading, members)) if k not in map(reading, members[:i])]
    nets = [on_window([m for m in members if reading(m) == k],
                      [x for m, x in zip(members, models) if reading(m) == k], post, opts,
                      members[0]) for k in kinds]
    about = member_lines(members, chosen) + (
        f"ensemble: the mean of {len(members)} members' softmax probabilities"
        + (f" over {len(kinds)} windows or grids" if len(kinds) > 1 else ""),)
    return dataclasses.replace(nets[0], about=about, others=tuple(nets[1:]))


# ------------------------------------------------------------------ the command


def start(opts: predict.Options):
    """``predict.start`` for an ensemble, agreed by all ranks: the member runs
    (``resolved``), their configs and training data (``members_of``), then predict's
    checks of the scans, with the ensemble's network."""
    from distseg.parallel import agreement
    opts = agreement.agree(resolved, opts)
    members = agreement.agree(members_of, opts)
    return predict.started(opts, members[0].cfg, members[0].known,
                           lambda: network(members, opts))


def run(opts: predict.Options) -> predict.Outcome:
    """``distseg-predict`` with an ensemble: predict's one path (this rank's share of
    the scans), started by ``start``.

    Raises:
      InputError / RunError: one line, the same on every rank.
    """
    return predict.run(opts, start=start)


def twins(members: Sequence[Member], models: Sequence[Loaded]) -> list:
    """Each member's inference twin (``export.inference_twin``: Keras' own layers,
    float32) with its weights, named ``member_I``, all for the first member's input."""
    from distseg.inference import export as export_lib
    shape = predict.input_shape(members[0].cfg, members[0].window)
    out = []
    for i, (m, one) in enumerate(zip(members, models)):
        twin = export_lib.inference_twin(m.cfg.model, shape, m.run_dir, name=f"member_{i}")
        export_lib.copy_weights(one.model, twin)
        out.append(twin)
    return out


def export(opts: predict.Options, out_dir: str) -> list[str]:
    """``--export`` of an ensemble: one plain Keras model whose output is the mean of
    the members' softmax probabilities (``export.ensemble_model``), and its input
    convention, as ``export.run`` writes them for one run; ``members`` in
    ``model.json`` say which runs and checkpoints it holds.

    Raises:
      InputError: inputs given too, members that disagree, members of different
        ``--model-fn`` sources, or any of predict's start-up errors.
    """
    from distseg.inference import export as export_lib
    if opts.inputs or opts.out:
        raise InputError(f"--export {out_dir}: writes the model only; predict INPUTS with "
                         "--out in a separate distseg-predict")
    opts = resolved(opts)
    members = members_of(opts)
    sources = {(m.cfg.model.fn, m.cfg.model.fn_sha256) for m in members}
    if len(sources) > 1 and any(fn for fn, _ in sources):
        raise InputError(f"--export {out_dir}: the members' networks come from different "
                         "--model-fn sources; export needs one source beside the model")
    if any(reading(m) != reading(members[0]) for m in members):
        raise InputError(f"--export {out_dir}: the members read a scan on other windows or "
                         "grids (e.g. a 2D and a 3D recipe); the exported model takes one "
                         "input: export each recipe's folds")
    models = loaded(members, opts)
    chosen = [one.chosen for one in models]
    first = members[0]
    model = export_lib.ensemble_model(twins(members, models))
    _, overlap = predict.inferer_settings(first.cfg, opts)
    info = export_lib.convention(first.cfg, first.known, first.window, overlap, first.run_dir, 0)
    del info["run"], info["epoch"], info["model"]  # each member's, in members
    info["output"]["meaning"] = ("the mean of the members' softmax probabilities over the "
                                 "classes (last axis, in class_names order); argmax gives the label")
    info["members"] = [{"run": os.path.abspath(m.run_dir), "epoch": int(c.entry["epoch"]),
                        "checkpoint": c.record(), "model": dataclasses.asdict(m.cfg.model)}
                       for m, c in zip(members, chosen)]
    post = applied(members, chosen, opts)
    info["postprocessing"] = export_lib.decisions_of(post, first.known.class_names)
    lines = [*member_lines(members, chosen), f"preprocessing: {first.known.prep.describe()}"]
    return lines + export_lib.write(out_dir, model, info, first.cfg,
                                    first.run_dir, f"the mean of {len(members)} members")
