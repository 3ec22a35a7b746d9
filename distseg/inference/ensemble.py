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
from typing import Callable, NamedTuple, Sequence

import numpy as np

from distseg.core import config as config_lib
from distseg.core import cvplan, rundir
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
    runs = cv_runs(opts.cv, opts.recipe, opts.nodes) if opts.cv else opts.runs
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
    """What the members must share, by name: what the data file decides (layout,
    classes, channels, the preprocessing of each channel, the grid) and the window the
    one sliding-window inferer runs them all on."""
    prep = m.known.prep
    return {
        "spatial_dims": m.cfg.model.spatial_dims,
        "class_names": tuple(m.known.class_names),
        "channels": len(prep.intensities),
        "intensity": tuple(i.describe() for i in prep.intensities),
        "channel": prep.channel,
        "in-plane size": prep.size,
        "spacing": prep.spacing,
        "window": tuple(m.window),
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


def averaged(predicts: Sequence[Callable[[np.ndarray], np.ndarray]]) -> Callable[[np.ndarray], np.ndarray]:
    """One ``predict`` of the mean of ``predicts``' outputs (summed in float64, returned
    in float32): the ensemble's probabilities of a window batch."""
    def run(x: np.ndarray) -> np.ndarray:
        total = None
        for fn in predicts:
            out = np.asarray(fn(x), dtype=np.float64)
            total = out if total is None else total + out
        return (total / len(predicts)).astype(np.float32)
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
    """The ensemble's mirroring and largest components (``postprocess.choose_pooled``)."""
    return postprocess.choose_pooled([(m.run_dir, c.stem) for m, c in zip(members, chosen)],
                                     members[0].known.class_names, opts.tta, opts.postprocess)


def member_lines(members: Sequence[Member], chosen: Sequence) -> tuple[str, ...]:
    """Each member's checkpoint (and its warnings), for the terminal."""
    lines = [f"warning: {m.run_dir}: {w}" for m, c in zip(members, chosen) for w in c.warnings]
    return tuple(lines + [f"member {i}: {m.run_dir}: checkpoint {c.words}"
                          for i, (m, c) in enumerate(zip(members, chosen))])


def network(members: Sequence[Member], opts: predict.Options) -> predict.Network:
    """The ensemble as the sliding-window inferer runs it: every member on each window
    batch, their probabilities averaged (then mirrored where decided); the batch size
    and overlap of the first member unless the flags set them."""
    first = members[0]
    models = loaded(members, opts)
    chosen = [one.chosen for one in models]
    post = applied(members, chosen, opts)
    fn = averaged([predict.predictor(one.model, m.cfg.model.spatial_dims)
                   for m, one in zip(members, models)])
    if post.mirror:
        fn = postprocess.mirrored(fn, postprocess.mirror_axes(first.window))
    batch, overlap = predict.inferer_settings(first.cfg, opts)
    about = member_lines(members, chosen) + (
        f"ensemble: the mean of {len(members)} members' softmax probabilities",)
    return predict.Network(fn, first.window, batch, overlap, None, post, about)


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
