"""Command-line entry points: parse options, build a config, call one function.

TensorFlow and Horovod are imported inside the commands, so ``--help`` is instant.
"""

from __future__ import annotations

import os

import click

from distseg import config as config_lib
from distseg.errors import DistsegError, Interrupted, fail


@click.group(help="Build distseg HDF5 datasets (slices, masks, case ids, by-case splits).")
def data():
    pass


@data.command("synth")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HDF5 file to write.")
@click.option("--cases", default=8, show_default=True, type=click.IntRange(1), help="Phantom volumes.")
@click.option("--size", default=128, show_default=True, type=click.IntRange(8), help="Slice height/width in pixels.")
@click.option("--slices-per-case", default=16, show_default=True, type=click.IntRange(1), help="Axial slices per volume.")
@click.option("--val-fraction", default=0.2, show_default=True, type=click.FloatRange(0, 1), help="Share of cases (not slices) held out for validation.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16"]))
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same file.")
def synth(out, cases, size, slices_per_case, val_fraction, dtype, seed):
    """Write a seeded synthetic liver-CT phantom dataset (for tests and benchmarks)."""
    from distseg import synth as synth_lib
    try:
        info = synth_lib.make_dataset(out, cases, size, seed=seed, slices_per_case=slices_per_case,
                                      val_fraction=val_fraction, dtype=dtype)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(f"wrote {out}: {info.samples} slices {size}x{size} from {cases} cases "
               f"({len(info.train_indices)} train, {len(info.val_indices)} val)")


@data.command("lits-sample")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HDF5 file to write.")
@click.option("--source-dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="Folder holding img_117.mrc and lab_117.mrc (default: the installed "
                   "liver-ct-segmentation-package).")
def lits_sample(out, source_dir):
    """Convert the real LiTS case 117 (128^3 CT, liver and tumour labels) to HDF5.

    The volume is cut into 8 axial slabs of 16 slices used as cases: slabs 0-5 train,
    slab 6 is a buffer, slab 7 validates (see distseg/lits.py for why).
    """
    from distseg import lits
    try:
        info = lits.convert(out, source_dir)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(f"wrote {out}: {info.samples} slices {info.height}x{info.width} "
               f"({len(info.train_indices)} train, {len(info.val_indices)} val)")


@data.command("info")
@click.argument("path", type=click.Path(dir_okay=False))
def info(path):
    """Check a dataset file and print what it holds."""
    import json
    from distseg import data as data_lib
    try:
        summary = data_lib.inspect(path)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(json.dumps({**summary.summary(), "attrs": summary.attrs}, indent=2, default=str))


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
}


def _train_options(fn):
    for name, (_, kind, text) in reversed(list(TRAIN_FLAGS.items())):
        fn = click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None, help=text)(fn)
    return fn


@click.command(context_settings={"max_content_width": 100})
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="HDF5 dataset (distseg-data synth / lits-sample).")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False),
              help="New directory for config.json, logs/rank-NNNNN.jsonl and checkpoints/.")
@click.option("--preset", default="liver2d", show_default=True, type=click.Choice(sorted(config_lib.PRESETS)),
              help="Defaults to start from: liver2d (240x240, 64 filters), demo (128x128, 16 filters), smoke (tiny).")
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="JSON config (e.g. another run's config.json) applied over the preset.")
@click.option("--resize/--no-resize", default=None, help="Resize slices to --image-size instead of refusing them.")
@click.option("--validate/--no-validate", default=None, help="Sharded validation after each epoch.")
@_train_options
def train(data_path, run_dir, preset, config_file, resize, validate, **flags):
    """Train a 2D U-Net on liver-CT slices, data-parallel over Horovod ranks.

    Run it the same way at any scale: as one process, or under
    `horovodrun -np 16 -H node1:4,node2:4,...`, `mpirun`, `srun` or `ibrun`. Each rank
    trains on its own disjoint shard of every epoch; gradients are averaged with one
    Horovod allreduce per step; the learning rate is scaled to the number of ranks
    with a warm-up. Rank 0 writes RUN_DIR/config.json, checkpoints and the progress
    bar; every rank writes RUN_DIR/logs/rank-NNNNN.jsonl for distseg-report.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    overrides = {path: flags[name] for name, (path, _, _) in TRAIN_FLAGS.items()}
    overrides.update({"data.path": data_path, "run_dir": run_dir, "data.resize": resize,
                      "train.validate": validate})
    try:
        cfg = config_lib.resolve(preset, config_file, overrides)
    except ValueError as e:
        fail(str(e))
    from distseg import train as train_lib
    try:
        train_lib.run(cfg)
    except Interrupted as e:
        fail(f"interrupted: {e}", e.exit_code)
    except KeyboardInterrupt as e:
        fail(f"interrupted: {e}", Interrupted.exit_code)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    finally:
        from distseg import distributed
        distributed.shutdown()
