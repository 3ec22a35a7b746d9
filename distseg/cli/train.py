"""``distseg-train``: parse options, build a config, call ``distseg.training.loop.run``.

TensorFlow and Horovod are imported inside the command, so ``--help`` is instant.
"""

from __future__ import annotations

import json
import os

import click

from distseg.cli import quickexit
from distseg.core import config as config_lib
from distseg.core import rundir
from distseg.core.errors import fail
from distseg.training import stopping
from distseg.training.startup import precision_cache


class LrType(click.ParamType):
    """A positive number, or ``auto``."""

    name = "LR|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, float):
            return value
        try:
            lr = float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number nor 'auto'", param, ctx)
        if not lr > 0:
            self.fail(f"{value!r} must be > 0", param, ctx)
        return lr


class EveryType(click.ParamType):
    """A whole number of steps >= 1, or ``auto`` (0 in the config)."""

    name = "K|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or value == 0:
            return 0
        try:
            every = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither a whole number nor 'auto'", param, ctx)
        if every < 1:
            self.fail(f"{value!r} must be >= 1 (or auto)", param, ctx)
        return every


TRAIN_FLAGS = {
    # flag name -> (config path, click type, help)
    "epochs": ("train.epochs", click.IntRange(1), "Passes over the training slices."),
    "batch_size": ("train.batch_size", click.IntRange(1), "Samples per rank per step: the global batch is this x ranks and the lr is scaled (--lr-scaling). Replaces a preset's --global-batch."),
    "global_batch": ("train.global_batch", click.IntRange(1), "A fixed global batch G: each of N ranks takes G/N samples per step, the lr is not scaled, and N ranks make the update 1 process makes (G must be a multiple of N). The demo and liver2d presets use 8."),
    "image_size": ("model.image_size", click.IntRange(8), "Input size; slices of another size are rejected unless --resize."),
    "base_filters": ("model.base_filters", click.IntRange(1), "U-Net filters at the first level (64: ~31M parameters)."),
    "depth": ("model.depth", click.IntRange(1), "U-Net poolings."),
    "dropout": ("model.dropout", click.FloatRange(0, 1, max_open=True), "Bottleneck dropout rate."),
    "bn_ghost_batch": ("model.bn_ghost_batch", click.IntRange(0), "BatchNorm statistics over runs of this many samples (0: each rank's whole batch); G/N keeps BatchNorm runs exact up to N ranks (docs/training.md)."),
    "norm": ("model.norm", click.Choice(config_lib.NORMS), "Normalisation after each convolution."),
    "lr": ("train.lr", LrType(), "Single-process learning rate (before scaling), or auto: found by an lr range test of up to 60 steps before training, all ranks on the real global batch, then kept in config.json (docs/training.md#finding-the-learning-rate)."),
    "lr_from": ("train.lr_from", click.Path(file_okay=False), "Take the lr of this run directory's config.json (one found by --lr auto, say), so that every node count of a scaling sweep trains at one lr."),
    "lr_scaling": ("train.lr_scaling", click.Choice(config_lib.LR_SCALINGS), "How the lr grows with the ranks' per-rank batches (gain: x sqrt of the gain measured from the gradient noise scale, AdamScale; adascale: x the gain, AdaScale's and McCandlish et al.'s rule for SGD)."),
    "grown_lr_scaling": ("train.grown_lr_scaling", click.Choice(config_lib.LR_SCALINGS), "How the lr grows when more ranks than a preset's global batch grow it (default sqrt)."),
    "batch_policy": ("train.batch_policy", click.Choice(config_lib.BATCH_POLICIES), "fixed: the batch of --batch-size or --global-batch for the whole run. goodput: at each epoch end choose the next epoch's per-rank batch (powers of two up to --max-batch-per-rank, global batch never below the base) for the most predicted goodput, from this run's step times and gradient noise scale; switches for a predicted gain of 5 % or more (docs/training.md)."),
    "max_batch_per_rank": ("train.max_batch_per_rank", click.IntRange(1), "The largest per-rank batch --batch-policy goodput may choose (default 8)."),
    "compression": ("train.compression", click.Choice(config_lib.COMPRESSION_CHOICES), "How gradients travel between ranks: auto (the presets' default): on ranks of several hosts, fp16 where the link measured at the start predicts at least 10 % more samples/s with it, else exact; on one host exact. Or none (exact float32) or fp16 (half the bytes, a rounded update). Recorded in config.json and the run record (docs/performance.md#gradient-compression)."),
    "warmup_epochs": ("train.warmup_epochs", click.FloatRange(0), "Epochs of linear lr warm-up to the scaled lr."),
    "lr_schedule": ("train.lr_schedule", click.Choice(config_lib.LR_SCHEDULES), "The lr after the warm-up: constant, cosine (down to 0 at the last planned sample) or poly (nnU-Net's (1 - f)^0.9). Counted in samples, so any rank count follows the same curve; a resume with more --epochs stretches it from there (docs/training.md#learning-rate-schedule)."),
    "loss": ("train.loss", click.Choice(config_lib.LOSSES), "dice: -mean soft Dice; dice_ce: plus cross-entropy."),
    "optimizer": ("train.optimizer", click.Choice(config_lib.OPTIMIZERS), "adam, or sgd: SGD with Nesterov momentum (--momentum; nnU-Net's optimizer with --lr 1e-2 --lr-schedule poly --weight-decay 3e-5 --clip-norm 12)."),
    "momentum": ("train.momentum", click.FloatRange(0, 1, max_open=True), "SGD's Nesterov momentum (default 0.99)."),
    "weight_decay": ("train.weight_decay", click.FloatRange(0), "Decoupled weight decay per step, times the lr (0: none)."),
    "clip_norm": ("train.clip_norm", click.FloatRange(0), "Clip the averaged gradient's global norm to this before the update (0: off)."),
    "intra_op_threads": ("train.intra_op_threads", click.IntRange(0), "TF intra-op threads per rank (0: OMP_NUM_THREADS or cores per rank)."),
    "inter_op_threads": ("train.inter_op_threads", click.IntRange(0), "TF inter-op threads per rank (0: 1 on <= 2 cores per rank, else 2)."),
    "seed": ("train.seed", int, "Global seed: init weights and shard permutations."),
    "max_steps_per_epoch": ("train.max_steps_per_epoch", click.IntRange(0), "Cap steps per epoch (0: full pass)."),
    "checkpoint_every": ("train.checkpoint_every", click.IntRange(0), "Checkpoint every N epochs on rank 0 (0: last only)."),
    "hang_timeout": ("train.hang_timeout", click.FloatRange(0), "Seconds a rank may wait in a collective before it ends the run naming the ranks that stopped answering (0: forever)."),
    "precise_bn": ("train.precise_bn", click.IntRange(0), "Precise BatchNorm: after each epoch, replace BatchNorm's moving statistics by the mean batch statistics of K steps (the epoch's first, then earlier epochs' where it has fewer), weights frozen, averaged over the ranks, so validation and checkpoints normalise with statistics of their own weights (0: off; docs/training.md#precise-batchnorm)."),
    "weight_ema": ("train.weight_ema", click.FloatRange(0, 1, max_open=True), "Validate and save an exponential moving average of the weights with this decay a step (e.g. 0.95; 0: off): after each epoch's steps the model takes the average for precise BatchNorm, validation and the checkpoint (what predict and --export read), then trains on from its live weights; the same at any rank count (docs/training.md#an-average-of-the-weights)."),
    "noise_every": ("train.noise_every", EveryType(), "Measure the gradient noise scale (and, on one rank, take the batch as two halves for it) every K-th step, or auto (the default): every step where the estimate steers the lr or batch (--lr-scaling gain/adascale, --batch-policy goodput); else time both kinds of step in the first epoch, then the smallest K whose measured steps take at most 1 % of training (docs/training.md#gradient-noise-scale). The update is the same either way."),
    "on_nonfinite": ("train.on_nonfinite", click.Choice(config_lib.NONFINITE), "A non-finite loss or gradient on any rank: stop every rank, or skip that step's update everywhere."),
    "slab": ("data.slab", str, "3D: training input D,H,W cut from each volume (multiples of 2**depth), 'full', or 'auto': the slab, --depth and the batch (--global-batch, or --batch-size per rank) all planned as nnU-Net's planner plans them, from the training volumes' median shape and the network's memory estimate (4 GiB per rank); give D,H,W, --depth and the batch to fix them (docs/training.md#3d-u-net-on-volumes)."),
    "foreground_fraction": ("data.foreground_fraction", click.FloatRange(0, 1), "Share of training samples made to hold foreground, drawn per sample from seed, epoch and id (any rank count alike): 3D slabs re-centred on a foreground voxel, 2D slices replaced by a slice holding foreground (nnU-Net: 0.33)."),
    "val_overlap": ("data.val_overlap", click.FloatRange(0, 1, max_open=True), "3D: overlap of the sliding windows validating whole volumes."),
    "fold": ("data.fold", click.IntRange(0), "Cross-validation: validate fold I of the data file's fold table and train on the other folds' cases; the file's test cases stay out of every fold (distseg-data folds; docs/cross-validation.md). Without it, the split the file was written with."),
    "augment": ("data.augment", click.Choice(config_lib.AUGMENTS), "On-the-fly augmentation of training samples (never validation): none, light (mirroring, small rotation and scaling, brightness, contrast) or default (nnU-Net's set: rotation, scaling, elastic, mirroring, brightness, contrast, gamma, noise, blur). Each sample's draw depends on the seed, epoch and sample id only: any rank count makes the same update (docs/augmentation.md)."),
    "precision": ("model.precision", click.Choice(config_lib.PRECISION_CHOICES), "auto (the presets' default): bfloat16 where the CPU reports AVX512_BF16 or AMX and a timed trial of the run's own step finds it at least 10 % faster on every rank, else float32; or float32, or bfloat16 activations (Keras mixed precision, float32 softmax: less memory). A resumed run keeps its choice (docs/training.md#precision)."),
}


def batch_overrides(batch_size, global_batch) -> dict:
    """--batch-size asks for per-rank batches (clearing a preset's global batch);
    --global-batch for a strict fixed global batch (no growth past the ranks)."""
    if batch_size and global_batch:
        raise ValueError("pass --batch-size (per rank) or --global-batch (all ranks), not both")
    if batch_size:
        return {"train.global_batch": 0}
    if global_batch:
        return {"train.global_batch_grows": False}
    return {}


def lr_overrides(lr, lr_from) -> dict:
    """The config fields of ``--lr`` (a number, or ``auto``) and ``--lr-from RUN``."""
    if lr is not None and lr_from:
        raise ValueError("pass --lr or --lr-from, not both")
    if lr == "auto":
        return {"train.lr": None, "train.lr_auto": True, "train.lr_from": None}
    if lr is not None:
        return {"train.lr_auto": False}
    if not lr_from:
        return {}
    path = rundir.config_path(lr_from)
    try:
        with open(path) as f:
            found = json.load(f)["train"]["lr"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--lr-from {lr_from}: {path} holds no train.lr ({e})") from None
    return {"train.lr": float(found), "train.lr_auto": False,
            "train.lr_from": os.path.abspath(lr_from)}


def model_overrides(model_name, model_fn, model_args, data_path) -> dict:
    """The config fields of ``--model``, ``--model-fn`` and ``--model-arg``. With
    ``--model-fn`` the data file's layout says 2D or 3D (left to the config when the
    file cannot be read: the run's start-up names what is wrong with it)."""
    if model_name and model_fn:
        raise ValueError("pass --model (distseg's U-Net) or --model-fn (your own), not both")
    if model_args and not model_fn:
        raise ValueError("--model-arg is for --model-fn (the U-Net takes its own flags)")
    out = {"model.spatial_dims": config_lib.MODELS.get(model_name)}
    if model_fn:
        from distseg.networks import userfn
        out["model.fn"] = userfn.absolute(model_fn)
        out["model.args"] = dict(parse_model_arg(a) for a in model_args)
        out["model.spatial_dims"] = _file_dims(data_path)
    return out


def parse_model_arg(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` as (key, VALUE read as JSON, else the string itself)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise ValueError(f"--model-arg {text!r}: expected KEY=VALUE, KEY a Python name")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _file_dims(data_path) -> int | None:
    from distseg.data import h5format
    try:
        return 3 if data_path and h5format.file_layout(data_path) == "volumes" else 2
    except h5format.DatasetError:
        return None


def _train_config(resume: bool, preset, config_file, overrides) -> config_lib.Config:
    """A new run's config (preset -> --config -> flags), or a resumed run's own."""
    if not resume:
        return config_lib.resolve(preset or "liver2d", config_file, overrides)
    for flag, given in (("--preset", preset), ("--config", config_file)):
        if given:
            raise ValueError(f"{flag} cannot be combined with --resume: a resumed run "
                             "keeps the config.json of its run directory")
    return config_lib.for_resume(overrides["run_dir"], overrides)


def config_from(params: dict) -> config_lib.Config:
    """The config of distseg-train's parsed flags ``params``: a new run's (preset ->
    --config -> flags) or a resumed run's own.

    Raises:
      ValueError: a flag the config refuses, naming it.
    """
    overrides = {path: params[name] for name, (path, _, _) in TRAIN_FLAGS.items()}
    overrides.update({"data.path": params["data_path"], "run_dir": params["run_dir"],
                      "data.resize": params["resize"], "train.validate": params["validate"],
                      "train.tensorboard": params["tensorboard"],
                      "model.recompute": params["recompute"]})
    overrides.update(model_overrides(params["model_name"], params["model_fn"],
                                     params["model_args"], params["data_path"]))
    overrides.update(batch_overrides(params["batch_size"], params["global_batch"]))
    overrides.update(lr_overrides(params["lr"], params["lr_from"]))
    return _train_config(params["resume"], params["preset"], params["config_file"], overrides)


def parse_config(args: list[str]) -> config_lib.Config:
    """The config distseg-train would train with for the command line ``args``, without
    running it (what distseg-jobs checks a recipe with).

    Raises:
      ValueError: an unknown flag or a bad value, in distseg-train's words.
    """
    try:
        with train.make_context("distseg-train", list(args)) as ctx:
            return config_from(ctx.params)
    except click.ClickException as e:
        raise ValueError(e.format_message()) from None


def _train_options(fn):
    for name, (_, kind, text) in reversed(list(TRAIN_FLAGS.items())):
        fn = click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None, help=text)(fn)
    return fn


@click.command(context_settings={"max_content_width": 100})
@click.option("--data", "data_path", default=None, type=click.Path(dir_okay=False),
              help="HDF5 dataset (distseg-data synth / lits-sample / convert); required unless "
                   "--resume. Its class count and names decide the model's.")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False),
              help="New directory for config.json, logs/rank-NNNNN.jsonl and checkpoints/.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the run in --run-dir from its newest whole checkpoint, with its "
                   "config.json; --epochs may extend it, flags that change what is trained are refused.")
@click.option("--preset", default=None, type=click.Choice(sorted(config_lib.PRESETS)),
              help="Defaults to start from: liver2d (the default; 240x240, 64 filters, GroupNorm, --augment default), demo "
                   "(128x128, 16 filters), smoke (tiny), liver3d (3D, 16 filters, 32x128x128 "
                   "slabs), smoke3d (tiny 3D).")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="JSON config (e.g. another run's config.json) applied over the preset.")
@click.option("--resize/--no-resize", default=None, help="Resize slices to --image-size instead of refusing them.")
@click.option("--validate/--no-validate", default=None, help="Sharded validation after each epoch.")
@click.option("--tensorboard/--no-tensorboard", default=None,
              help="Rank 0 writes TensorBoard scalars to RUN_DIR/tensorboard/ (default on).")
@click.option("--model", "model_name", default=None, type=click.Choice(sorted(config_lib.MODELS)),
              help="unet2d on slices (default), or unet3d on slabs of volumes (--slab; "
                   "data from distseg-data ... --ndim 3).")
@click.option("--model-fn", default=None, metavar="FILE.py:FUNCTION",
              help="Your own Keras model instead of distseg's U-Net: FUNCTION(input_shape, "
                   "num_classes, **args) returns a keras.Model with one softmax output of the "
                   "input's spatial shape (or package.module:FUNCTION). 2D or 3D follows the "
                   "data file. The file is copied into the run directory and its hash recorded "
                   "(docs/own-model.md).")
@click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE",
              help="A keyword argument for --model-fn's function (VALUE read as JSON, else a "
                   "string); repeatable. Kept in config.json as model.args.")
@click.option("--recompute/--no-recompute", default=None,
              help="Gradient checkpointing of every convolution unit of every U-Net level: less memory, more time (docs/memory.md).")
@click.option("--precision-trial", type=click.Choice(precision_cache.TRIAL_MODES), default=None,
              help="With --precision auto: cached (the default) takes the decision kept from an "
                   "earlier launch on the same CPU, TensorFlow, model, input, per-rank batch, "
                   "threads and ranks (in $DISTSEG_CACHE_DIR, else $XDG_CACHE_HOME/distseg or "
                   "~/.cache/distseg) and skips the trial; always measures again and keeps the "
                   "new answer. Not part of the config (also $DISTSEG_PRECISION_TRIAL; "
                   "docs/training.md#precision).")
@_train_options
def train(data_path, run_dir, resume, preset, config_file, resize, validate, tensorboard,
          model_name, model_fn, model_args, recompute, precision_trial, **flags):
    """Train a 2D U-Net on slices, or a 3D U-Net on slabs of volumes, data-parallel over
    Horovod ranks.

    Run it the same way at any scale: as one process, or under
    `horovodrun -np 16 -H node1:4,node2:4,...`, `mpirun`, `srun` or `ibrun`. Each rank
    trains on its own disjoint shard of every epoch; gradients are averaged with one
    Horovod allreduce per step; the learning rate is scaled to the number of ranks
    with a warm-up. Rank 0 writes RUN_DIR/config.json, checkpoints and the progress
    bar; every rank writes RUN_DIR/logs/rank-NNNNN.jsonl for distseg-report.

    SIGTERM or SIGUSR1 on any rank (or the end of horovodrun) stops every rank at the
    next step after a checkpoint (exit 130); `--resume` continues from there.
    """
    # First, before TensorFlow and Horovod load: a stop signal from now on is recorded
    # and becomes a clean stop at the first step instead of killing the rank.
    stopping.install_early(stopping.stop_signals(os.environ.get("HOROVOD_ELASTIC") == "1"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if precision_trial:  # every rank parses the same flags: the same mode on each
        os.environ[precision_cache.TRIAL_ENV] = precision_trial
    try:
        cfg = config_from(click.get_current_context().params)
    except ValueError as e:
        fail(str(e))
    from distseg.parallel import agreement
    from distseg.training import loop as train_lib
    agreement.run_command(train_lib.run, cfg, resuming=resume)


def main() -> None:
    """The ``distseg-train`` console script: the command, then the exit without the
    interpreter's teardown of TensorFlow (``quickexit``)."""
    quickexit.run(train)
