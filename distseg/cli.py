"""Command-line entry points: parse options, build a config, call one function.

TensorFlow and Horovod are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import os

import click

from distseg import config as config_lib
from distseg.errors import DistsegError, Interrupted, fail


@click.group(help="Build distseg HDF5 datasets: 2D slices (masks, case ids, by-case splits) "
                  "or, with --ndim 3, whole 3D volumes per case.")
def data():
    pass


NDIM = click.option("--ndim", default=2, show_default=True, type=click.IntRange(2, 3),
                    help="2: slices (2D U-Net); 3: whole volumes per case (3D U-Net, "
                         "docs/data.md#volumes).")


def _wrote(out: str, info, cases: int | None = None) -> str:
    """The closing line of a data command, for a slice or a volume file."""
    if hasattr(info, "shapes"):
        lo, hi = ("x".join(map(str, v)) for v in (info.shapes.min(axis=0), info.shapes.max(axis=0)))
        return (f"wrote {out}: {info.cases} volumes of {lo}" + (f" to {hi}" if lo != hi else "")
                + f" ({len(info.train_cases)} train, {len(info.val_cases)} val cases)")
    return (f"wrote {out}: {info.samples} slices {info.height}x{info.width} "
            + (f"from {cases} cases " if cases else "")
            + f"({len(info.train_indices)} train, {len(info.val_indices)} val)")


@data.command("synth")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HDF5 file to write.")
@NDIM
@click.option("--cases", default=8, show_default=True, type=click.IntRange(1), help="Phantom volumes.")
@click.option("--size", default=128, show_default=True, type=click.IntRange(8), help="Slice height/width in pixels.")
@click.option("--slices-per-case", default=None, type=click.IntRange(1),
              help="Axial slices per volume [default: 16; 64 with --ndim 3].")
@click.option("--jitter", default=None, type=click.FloatRange(0, 1, max_open=True),
              help="--ndim 3: each volume's D, H and W scaled by its own factor in "
                   "[1-j, 1+j] [default: 0.25; 0: one shape, for --slab full].")
@click.option("--val-fraction", default=0.2, show_default=True, type=click.FloatRange(0, 1), help="Share of cases (not slices) held out for validation.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16"]))
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same file.")
def synth(out, ndim, cases, size, slices_per_case, jitter, val_fraction, dtype, seed):
    """Write a seeded synthetic liver-CT phantom dataset (for tests and benchmarks)."""
    from distseg import synth as synth_lib
    try:
        info = synth_lib.make(out, ndim=ndim, cases=cases, size=size, seed=seed,
                              slices_per_case=slices_per_case, val_fraction=val_fraction,
                              dtype=dtype, jitter=jitter)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(_wrote(out, info, cases))


@data.command("lits-sample")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HDF5 file to write.")
@NDIM
@click.option("--source-dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="Folder holding img_117.mrc and lab_117.mrc (default: the installed "
                   "liver-ct-segmentation-package).")
def lits_sample(out, ndim, source_dir):
    """Convert the real LiTS case 117 (128^3 CT, liver and tumour labels) to HDF5.

    2D: the volume is cut into 8 axial slabs of 16 slices used as cases: slabs 0-5
    train, slab 6 is a buffer, slab 7 validates. 3D: slices 0-79 train, 80-95 are the
    buffer, 96-127 validate, each part one volume (see distseg/lits.py for why).
    """
    from distseg import lits
    try:
        info = (lits.convert_volumes if ndim == 3 else lits.convert)(out, source_dir)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(_wrote(out, info))


@data.command("info")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--slab", default=None, metavar="D,H,W|full",
              help="Volume files: also count the training slabs of this shape and list "
                   "the cases shorter than it (zero-padded when read).")
def info(path, slab):
    """Check a dataset file (slices or volumes) and print what it holds."""
    import json
    from distseg import volumes
    try:
        summary = volumes.describe(path, slab)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    except ValueError as e:  # a malformed --slab
        fail(str(e))
    click.echo(json.dumps(summary, indent=2, default=str))


def parse_window(ctx, param, value):
    """``LOW,HIGH`` in HU -> (low, high); shared with distseg-predict."""
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected LOW,HIGH in HU, e.g. -100,400") from None
    if not high > low:
        raise click.BadParameter(f"{value!r}: HIGH must be above LOW")
    return low, high


@data.command("convert", context_settings={"max_content_width": 100})
@click.argument("source", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@NDIM
@click.option("--size", default=None, type=click.IntRange(8),
              help="In-plane slice size (linear resampling for images, nearest for labels) "
                   "[default: 240]; not with --ndim 3, which keeps each scan's own grid.")
@click.option("--window", default=None, callback=parse_window, metavar="LOW,HIGH",
              help="CT window in HU (default -150,250, the window of every distseg dataset).")
@click.option("--modality", default="auto", show_default=True, type=click.Choice(["auto", "ct", "mr"]),
              help="auto: from dataset.json (pairs: CT); ct: HU window; mr: per-volume percentiles.")
@click.option("--channel", default=None, type=click.IntRange(0),
              help="Channel of 4-D multi-channel MSD images (required for them).")
@click.option("--roi-margin", default=None, type=click.IntRange(0),
              help="Keep only slices within the labelled region plus this many on each side (default: all).")
@click.option("--val-fraction", default=0.2, show_default=True, type=click.FloatRange(0, 1),
              help="Share of cases (not slices) that validate; ignored with --folds.")
@click.option("--folds", default=0, show_default=True, type=click.IntRange(0),
              help="K-fold cross-validation by case (0: off); --fold picks the validating fold.")
@click.option("--fold", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the case split.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1),
              help="Processes reading cases (memory: about one volume each).")
@click.option("--on-error", default="stop", show_default=True, type=click.Choice(["stop", "skip"]),
              help="A bad case stops the conversion (nothing written) or is skipped and listed.")
@click.option("--compression", default="lzf", show_default=True, type=click.Choice(["lzf", "gzip", "none"]),
              help="HDF5 filter (benchmarked in docs/data.md).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16"]))
@click.option("--progress/--no-progress", default=True, help="Progress bar on stderr.")
def convert(source, out, **options):
    """Convert an MSD task folder or LiTS-style NIfTI/NRRD pairs into a distseg HDF5 file.

    Volumes are reoriented to RAS, windowed (CT) or normalised (MR), resampled in-plane
    to --size and split by case; what prediction needs to go back to each scan is
    recorded. With --ndim 3 each case is kept as one volume on its own grid (no
    resampling). The file is written as OUT.partial and renamed only when complete.
    """
    from distseg.convert import pipeline
    try:
        summary = pipeline.run(source, out, pipeline.Options(**options))
    except Interrupted as e:
        fail(f"interrupted: {e}; nothing written", e.exit_code)
    except KeyboardInterrupt:
        fail("interrupted; nothing written", Interrupted.exit_code)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo("\n".join(summary.lines()))


TRAIN_FLAGS = {
    # flag name -> (config path, click type, help)
    "epochs": ("train.epochs", click.IntRange(1), "Passes over the training slices."),
    "batch_size": ("train.batch_size", click.IntRange(1), "Slices per rank per step (global batch = this x ranks)."),
    "image_size": ("model.image_size", click.IntRange(8), "Input size; slices of another size are rejected unless --resize."),
    "base_filters": ("model.base_filters", click.IntRange(1), "U-Net filters at the first level (64: ~31M parameters)."),
    "depth": ("model.depth", click.IntRange(1), "U-Net poolings."),
    "dropout": ("model.dropout", click.FloatRange(0, 1, max_open=True), "Bottleneck dropout rate."),
    "norm": ("model.norm", click.Choice(config_lib.NORMS), "Normalisation after each convolution."),
    "lr": ("train.lr", click.FloatRange(0, min_open=True), "Single-process learning rate (before scaling)."),
    "lr_scaling": ("train.lr_scaling", click.Choice(config_lib.LR_SCALINGS), "How the lr grows with the number of ranks."),
    "warmup_epochs": ("train.warmup_epochs", click.FloatRange(0), "Epochs of linear lr warm-up to the scaled lr."),
    "loss": ("train.loss", click.Choice(config_lib.LOSSES), "dice: -mean soft Dice; dice_ce: plus cross-entropy."),
    "intra_op_threads": ("train.intra_op_threads", click.IntRange(0), "TF intra-op threads per rank (0: OMP_NUM_THREADS or cores per rank)."),
    "inter_op_threads": ("train.inter_op_threads", click.IntRange(0), "TF inter-op threads per rank (0: 1 on <= 2 cores per rank, else 2)."),
    "seed": ("train.seed", int, "Global seed: init weights and shard permutations."),
    "max_steps_per_epoch": ("train.max_steps_per_epoch", click.IntRange(0), "Cap steps per epoch (0: full pass)."),
    "checkpoint_every": ("train.checkpoint_every", click.IntRange(0), "Checkpoint every N epochs on rank 0 (0: last only)."),
    "hang_timeout": ("train.hang_timeout", click.FloatRange(0), "Seconds a rank may wait in a collective before it ends the run naming the ranks that stopped answering (0: forever)."),
    "on_nonfinite": ("train.on_nonfinite", click.Choice(config_lib.NONFINITE), "A non-finite loss or gradient on any rank: stop every rank, or skip that step's update everywhere."),
    "slab": ("data.slab", str, "3D: training input D,H,W cut from each volume (multiples of 2**depth), or 'full'."),
    "foreground_fraction": ("data.foreground_fraction", click.FloatRange(0, 1), "3D: share of slabs re-centred on a random foreground voxel."),
    "val_overlap": ("data.val_overlap", click.FloatRange(0, 1, max_open=True), "3D: overlap of the sliding windows validating whole volumes."),
    "precision": ("model.precision", click.Choice(config_lib.PRECISIONS), "float32, or bfloat16 (Keras mixed precision): less memory, and faster where the CPU has AVX512_BF16 or AMX; measured here, step time 0.61x float32's on the 3D U-Net at 96^3 (docs/memory.md), 0.60x on the 2D demo U-Net (docs/performance.md)."),
}


def _train_config(resume: bool, preset, config_file, overrides) -> config_lib.Config:
    """A new run's config (preset -> --config -> flags), or a resumed run's own."""
    if not resume:
        return config_lib.resolve(preset or "liver2d", config_file, overrides)
    for flag, given in (("--preset", preset), ("--config", config_file)):
        if given:
            raise ValueError(f"{flag} cannot be combined with --resume: a resumed run "
                             "keeps the config.json of its run directory")
    return config_lib.for_resume(overrides["run_dir"], overrides)


def _train_options(fn):
    for name, (_, kind, text) in reversed(list(TRAIN_FLAGS.items())):
        fn = click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None, help=text)(fn)
    return fn


@click.command(context_settings={"max_content_width": 100})
@click.option("--data", "data_path", default=None, type=click.Path(dir_okay=False),
              help="HDF5 dataset (distseg-data synth / lits-sample); required unless --resume.")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False),
              help="New directory for config.json, logs/rank-NNNNN.jsonl and checkpoints/.")
@click.option("--resume", is_flag=True, default=False,
              help="Continue the run in --run-dir from its newest whole checkpoint, with its "
                   "config.json; --epochs may extend it, flags that change what is trained are refused.")
@click.option("--preset", default=None, type=click.Choice(sorted(config_lib.PRESETS)),
              help="Defaults to start from: liver2d (the default; 240x240, 64 filters), demo "
                   "(128x128, 16 filters), smoke (tiny), liver3d (3D, 16 filters, 32x128x128 "
                   "slabs), smoke3d (tiny 3D).")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="JSON config (e.g. another run's config.json) applied over the preset.")
@click.option("--resize/--no-resize", default=None, help="Resize slices to --image-size instead of refusing them.")
@click.option("--validate/--no-validate", default=None, help="Sharded validation after each epoch.")
@click.option("--model", "model_name", default=None, type=click.Choice(sorted(config_lib.MODELS)),
              help="unet2d on slices (default), or unet3d on slabs of volumes (--slab; "
                   "data from distseg-data ... --ndim 3).")
@click.option("--recompute/--no-recompute", default=None,
              help="Gradient checkpointing of every convolution unit of every U-Net level: less memory, more time (docs/memory.md).")
@_train_options
def train(data_path, run_dir, resume, preset, config_file, resize, validate, model_name,
          recompute, **flags):
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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    overrides = {path: flags[name] for name, (path, _, _) in TRAIN_FLAGS.items()}
    overrides.update({"data.path": data_path, "run_dir": run_dir, "data.resize": resize,
                      "train.validate": validate, "model.recompute": recompute,
                      "model.spatial_dims": config_lib.MODELS.get(model_name)})
    try:
        cfg = _train_config(resume, preset, config_file, overrides)
    except ValueError as e:
        fail(str(e))
    from distseg import distributed, train as train_lib
    distributed.run_command(train_lib.run, cfg, resuming=resume)
