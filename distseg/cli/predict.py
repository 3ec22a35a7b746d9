"""The ``distseg-predict`` entry point: parse options, call ``distseg.inference.predict.run``
(or, with ``--export``, ``distseg.inference.export.run``; with ``--decide``,
``distseg.inference.decide.run``; with ``--cv --out-of-fold``,
``distseg.inference.oof.run``).

TensorFlow and Horovod are imported inside the command, so ``--help`` is instant.
"""

from __future__ import annotations

import os

import click

from distseg.cli import quickexit
from distseg.cli.data import parse_window


@click.command(context_settings={"max_content_width": 100})
@click.argument("inputs", nargs=-1, type=click.Path())
@click.option("--checkpoint", "run_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Training run directory (config.json, checkpoints/latest.json). Repeated: an "
                   "ensemble, the mean of the runs' probabilities (docs/predict.md#fold-ensembles).")
@click.option("--cv", default=None, type=click.Path(file_okay=False),
              help="Instead of --checkpoint: the ensemble of the fold runs of a cross-validation "
                   "directory (CV/cv.json) for one --recipe and --nodes.")
@click.option("--recipe", multiple=True,
              help="--cv: the recipe whose folds are averaged [default: the plan's only one]; "
                   "repeated, the configuration of several (e.g. the 2D and 3D recipes "
                   "distseg-report ships: every fold model of each, averaged).")
@click.option("--nodes", default=None, type=click.IntRange(1),
              help="--cv: the node count whose folds are averaged [default: the plan's only one].")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Folder for <case>_seg.nii.gz, metrics.csv and overlays/ (required to predict).")
@click.option("--export", "export_dir", default=None, type=click.Path(file_okay=False),
              help="Instead of predicting, write the network as DIR/model.keras (plain Keras: "
                   "keras.models.load_model, no distseg) and its input convention as "
                   "DIR/model.json. No INPUTS or --out.")
@click.option("--decide", is_flag=True, default=False,
              help="Instead of predicting, score the run's validation cases (its data file's, or "
                   "--data's) plain and mirrored, and each class with and without its largest "
                   "connected component, and write RUN/postprocessing.json: what predict then "
                   "applies. No INPUTS or --out.")
@click.option("--out-of-fold", "out_of_fold", is_flag=True, default=False,
              help="With --cv: instead of predicting INPUTS, predict every run's own validation "
                   "cases, score each recipe and each pair's ensemble (the mean of their "
                   "probabilities) per case, and write CV/oof/ for distseg-report's "
                   "configurations table (docs/cross-validation.md#configurations).")
@click.option("--which", default="best", show_default=True, type=click.Choice(["best", "latest"]),
              help="Checkpoint: best (checkpoints/best.json, the best EMA of the validation Dice; "
                   "the newest when the run has none) or latest (the newest).")
@click.option("--tta", default="auto", show_default=True, type=click.Choice(["auto", "mirror", "none"]),
              help="Test-time mirroring: auto where RUN/postprocessing.json (or the CV's "
                   "out-of-fold scores) says it helps, mirror always, none never. With "
                   "--out-of-fold: auto and mirror also score every case mirrored (mirror: "
                   "then applied), none does not.")
@click.option("--postprocess", default="auto", show_default=True, type=click.Choice(["auto", "none"]),
              help="Keep only the largest connected component of the classes RUN/postprocessing.json "
                   "says it helps (auto), or of none.")
@click.option("--labels", default=None, type=click.Path(file_okay=False, exists=True),
              help="Folder of label volumes for input files (same name, or segmentation-N for volume-N).")
@click.option("--data", default=None, type=click.Path(dir_okay=False),
              help="Training data file whose attributes give the preprocessing (default: the run's).")
@click.option("--subset", default="test", show_default=True,
              type=click.Choice(["test", "val", "train", "all"]),
              help="Cases of a folder input: test (unlabelled, e.g. imagesTs), val/train (the "
                   "training file's split), all.")
@click.option("--window", default=None, callback=parse_window, metavar="LOW,HIGH",
              help="CT window in HU (default: the training data's).")
@click.option("--modality", default=None, type=click.Choice(["ct", "mr"]),
              help="Override the training data's intensity handling.")
@click.option("--channel", default=None, type=click.IntRange(0), help="Channel of 4-D images.")
@click.option("--batch-size", default=None, type=click.IntRange(1),
              help="Windows per prediction batch [default: 8 slices for a 2D run, the run's "
                   "batch size of slabs for a 3D one].")
@click.option("--overlap", default=None, type=click.FloatRange(0, 1, max_open=True),
              help="3D runs: share of a window overlapping its neighbour per axis [default: "
                   "the run's validation overlap, 0.5].")
@click.option("--tolerance-mm", default=2.0, show_default=True, type=click.FloatRange(0),
              help="Normalised surface Dice tolerance.")
@click.option("--overlays/--no-overlays", default=True, help="PNGs of the best, median and worst cases.")
@click.option("--progress/--no-progress", default=True, help="Progress bar on stderr (rank 0).")
def predict(inputs, run_dirs, cv, recipe, nodes, out, export_dir, decide, out_of_fold, **options):
    """Segment NIfTI/NRRD volumes (or a dataset folder) with a trained 2D or 3D run, or
    an ensemble of runs.

    Each input is preprocessed as the training data was, predicted by sliding windows
    (one slice each for a 2D run, the training slab for a 3D one), and written as
    OUT/<case>_seg.nii.gz on the input's own grid and affine. Where labels exist, Dice,
    HD95 and normalised surface Dice per class go to OUT/metrics.csv and the terminal.
    Under `horovodrun -np N` the cases are split across ranks.

    Several --checkpoint runs, or --cv CV_DIR's fold runs, predict as one ensemble:
    the mean of their softmax probabilities (docs/predict.md#fold-ensembles).

    With --export DIR, nothing is predicted: the network is written for use without
    distseg (docs/predict.md#export). With --decide, the run's validation cases decide
    where test-time mirroring and largest-component post-processing help
    (docs/predict.md#mirroring-and-largest-component). With --cv CV --out-of-fold, every
    recipe and every pair of recipes is scored on the cases each fold validated, for
    distseg-report CV (docs/predict.md#out-of-fold-configurations). The best checkpoint
    is used unless --which latest.
    """
    if sum(map(bool, (export_dir, decide, out_of_fold))) > 1:
        raise click.UsageError("--export, --decide and --out-of-fold are separate steps; "
                               "give one of them")
    if out_of_fold and not cv:
        raise click.UsageError("--out-of-fold scores the configurations of --cv CV_DIR")
    if bool(cv) == bool(run_dirs):
        raise click.UsageError("give --checkpoint RUN (repeated for an ensemble) or --cv CV_DIR")
    if not cv and (recipe or nodes):
        raise click.UsageError("--recipe and --nodes choose the folds of --cv CV_DIR")
    ensemble = bool(cv) or len(run_dirs) > 1
    if decide and ensemble:
        raise click.UsageError("--decide is per run: run it on each member; the ensemble "
                               "decides on their validation cases pooled")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from distseg.inference import predict as predict_lib
    from distseg.parallel import agreement
    opts = predict_lib.Options(run_dir=run_dirs[0] if run_dirs else "", inputs=tuple(inputs),
                               out=out or "", more_runs=tuple(run_dirs[1:]), cv=cv,
                               recipe=recipe, nodes=nodes, **options)
    if ensemble:
        from distseg.inference import ensemble as ensemble_lib
        export_fn, predict_fn = ensemble_lib.export, ensemble_lib.run
    else:
        from distseg.inference import export
        export_fn, predict_fn = export.run, predict_lib.run
    if out_of_fold:
        from distseg.inference import oof
        lines = agreement.run_command(oof.run, opts)
    elif export_dir:
        lines = agreement.run_command(export_fn, opts, export_dir)
    elif decide:
        from distseg.inference import decide as decide_lib
        lines = agreement.run_command(decide_lib.run, opts)
    else:
        lines = agreement.run_command(predict_fn, opts).lines
    if lines:
        click.echo("\n".join(lines))


def main() -> None:
    """The ``distseg-predict`` console script: the command, then the exit without the
    interpreter's teardown of TensorFlow (``quickexit``)."""
    quickexit.run(predict)
