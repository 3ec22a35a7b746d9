"""``distseg-data``: build, convert and check distseg HDF5 files (a thin click group;
the work is in ``distseg.data``)."""

from __future__ import annotations

import click

from distseg.core.errors import DistsegError, Interrupted, fail
from distseg.data import lits


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


def parse_spacing(ctx, param, value):
    """``auto`` or ``Z,Y,X`` in mm -> ``"auto"`` or (z, y, x); None when not given."""
    from distseg.data.convert import spacing
    try:
        return spacing.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def parse_spacings(ctx, param, values):
    """Repeated ``Z,Y,X`` (mm), or one ``random`` -> a list of (z, y, x), ``"random"``
    or None."""
    from distseg.data.convert import spacing
    if not values:
        return None
    if len(values) == 1 and values[0].strip().lower() == "random":
        return "random"
    try:
        return [spacing.parse_mm(v, "expected Z,Y,X: three positive numbers in mm, Z between "
                                    "slices (e.g. 2.5,0.8,0.8), or random") for v in values]
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def parse_extent(ctx, param, value):
    from distseg.data.convert import spacing
    if value is None:
        return None
    try:
        return spacing.parse_mm(value, "expected Z,Y,X: the field of view in mm (e.g. 80,350,350)")
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


#: synth's options for an HDF5 file, refused with --spacing (which writes NIfTI pairs).
_H5_ONLY = ("ndim", "size", "slices_per_case", "jitter", "val_fraction", "dtype")


def _synth_nifti(ctx, out, cases, spacings, extent, seed) -> str:
    """``synth --spacing``: phantoms at those spacings as NIfTI pairs in the folder ``out``."""
    from distseg.data import synth as synth_lib
    from distseg.data.convert import samples
    given = [n for n in _H5_ONLY
             if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]
    if given:
        fail(f"--{given[0].replace('_', '-')}: not with --spacing, which writes NIfTI pairs "
             "(the grid comes from --spacing and --extent)")
    used = samples.write_phantoms(out, cases, spacings, extent=extent or synth_lib.EXTENT_MM, seed=seed)
    shown = sorted({",".join(f"{v:g}" for v in s) for s in used})
    return (f"wrote {out}: {cases} phantom(s) as volume-N.nii.gz / segmentation-N.nii.gz at "
            f"spacing(s) {'; '.join(shown)} mm (Z,Y,X)")


@data.command("synth")
@click.option("--out", required=True, type=click.Path(), help="HDF5 file to write (with --spacing: a folder).")
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
@click.option("--spacing", "spacings", multiple=True, callback=parse_spacings, metavar="Z,Y,X|random",
              help="Write NIfTI pairs (volume-N, segmentation-N) into the folder --out instead, "
                   "the same bodies drawn in mm at these voxel spacings (repeat: case i takes "
                   "the (i mod n)-th; random: in-plane 0.6-1.0 mm, slices 1-5 mm), for "
                   "convert --spacing.")
@click.option("--extent", default=None, callback=parse_extent, metavar="Z,Y,X",
              help="With --spacing: the field of view in mm [default: 80,350,350].")
@click.pass_context
def synth(ctx, out, ndim, cases, size, slices_per_case, jitter, val_fraction, dtype, seed, spacings, extent):
    """Write a seeded synthetic liver-CT phantom dataset (for tests and benchmarks), or
    with --spacing the phantoms as NIfTI at given voxel spacings."""
    from distseg.data import synth as synth_lib
    if extent is not None and spacings is None:
        fail("--extent: only with --spacing (the HDF5 phantom's grid is --size and --slices-per-case)")
    if spacings is not None:
        click.echo(_synth_nifti(ctx, out, cases, spacings, extent, seed))
        return
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
@click.option("--folds", default=None, type=int, metavar="K",
              help="Cut the 8 slabs into K (2, 4 or 8) contiguous folds. Without --fold: "
                   "one file holding every fold (distseg-train --fold I picks one; the CT "
                   "normalised over all slabs), each slab a case (3D: a 16x128x128 volume); "
                   "with --fold, a file of that fold alone.")
@click.option("--fold", default=None, type=int, metavar="I",
              help="The validating fold, 0 to K-1: its slabs validate, the slab on each "
                   "side is a buffer (unused), the rest train.")
@click.option("--ct-norm", default=lits.CT_NORM, show_default=True,
              type=click.Choice(["window", "foreground"]),
              help="foreground: nnU-Net's CT normalisation from the training slabs' foreground "
                   "(clip to its 0.5-99.5 percentiles, z-score by its mean and std; on folds of "
                   "this case it beat the window); window: the HU window -150,250 to [0, 1]. "
                   "The file records it (attribute preprocessing) and predict repeats it.")
def lits_sample(out, ndim, source_dir, folds, fold, ct_norm):
    """Convert the real LiTS case 117 (128^3 CT, liver and tumour labels) to HDF5.

    2D: the volume is cut into 8 axial slabs of 16 slices used as cases: slabs 0-5
    train, slab 6 is a buffer, slab 7 validates (fold 7 of 8). 3D: slices 0-79 train,
    80-95 are the buffer, 96-127 validate, each part one volume (fold 3 of 4). --folds K
    --fold I picks another fold (see distseg/data/lits.py for why).
    """
    if fold is not None and folds is None:
        fail("--fold needs --folds (e.g. --folds 4 --fold 0)")
    try:
        if folds is not None and fold is None:
            every = lits.convert_volume_folds if ndim == 3 else lits.convert_folds
            info = every(out, folds, source_dir, ct_norm=ct_norm)
        else:
            split = lits.DEFAULT_FOLD[ndim] if folds is None else (folds, fold)
            info = (lits.convert_volumes if ndim == 3 else lits.convert)(out, source_dir, split,
                                                                         ct_norm=ct_norm)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(_wrote(out, info))


@data.command("folds", context_settings={"max_content_width": 100})
@click.argument("path", type=click.Path(dir_okay=False, exists=True))
@click.option("--folds", "k", default=None, type=click.IntRange(2), metavar="K",
              help="Draw K folds over the file's cases (over patients with --patients or "
                   "--patient-pattern), seeded by --seed.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the draw.")
@click.option("--like-nnunet", is_flag=True,
              help="Draw as nnU-Net v2 does: KFold(K, shuffle, random_state=12345) over the "
                   "sorted case names (--seed then defaults to 12345; no patient grouping).")
@click.option("--patients", default=None, type=click.Path(dir_okay=False, exists=True),
              help="CSV of case,patient rows: a patient's cases always share a fold.")
@click.option("--patient-pattern", default=None, metavar="REGEX",
              help="The patient of a case: the first group of REGEX searched in its name "
                   "(e.g. '^(pat\\d+)_' ), so a patient's cases share a fold.")
@click.option("--splits-in", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Take the folds from nnU-Net v2's splits_final.json (case names as the "
                   "file's cases/name) instead of drawing them.")
@click.option("--splits-out", default=None, type=click.Path(dir_okay=False),
              help="Also write the folds as nnU-Net v2's splits_final.json.")
@click.option("--fold", "base_fold", default=0, show_default=True, type=click.IntRange(0),
              help="The fold the file's own split takes (what a run without --fold trains).")
@click.option("--test", "test", default="", metavar="CASE,CASE,...",
              help="Hold these cases (names as in the file's cases/name) out of every fold: "
                   "a test set no fold trains or validates on (the file's own test cases "
                   "always are).")
def folds(path, k, seed, like_nnunet, patients, patient_pattern, splits_in, splits_out, base_fold,
          test):
    """Give a data file K cross-validation folds by case (or read them from
    splits_final.json), kept in the file: `distseg-train --fold I` then validates fold I
    and trains the others; the file's test cases stay out of every fold. Without
    --folds or --splits-in, prints the table the file holds (and writes --splits-out).
    Everything is checked before the file is touched (docs/cross-validation.md).
    """
    from distseg.data import foldtool
    try:
        lines = foldtool.run(path, foldtool.Request(
            k, seed, like_nnunet, patients, patient_pattern, splits_in, splits_out, base_fold,
            tuple(t.strip() for t in test.split(",") if t.strip())))
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo("\n".join(lines))


@data.command("info")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--slab", default=None, metavar="D,H,W|full",
              help="Volume files: also count the training slabs of this shape and list "
                   "the cases shorter than it (zero-padded when read).")
def info(path, slab):
    """Check a dataset file (slices or volumes) and print what it holds."""
    import json

    from distseg.data import volumes
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
                   "[default: 240]; with --spacing the size slices are centre cropped or padded "
                   "to; not with --ndim 3, which keeps each scan's own grid.")
@click.option("--spacing", default=None, callback=parse_spacing, metavar="auto|Z,Y,X",
              help="Resample every case to one voxel spacing in mm (Z between slices; linear "
                   "images, nearest labels); auto: the cases' median, nnU-Net's rule for thick "
                   "slices. 2D: then centre crop/pad to --size [default: the largest slice]. "
                   "Default: each scan's own spacing (docs/data.md#one-spacing).")
@click.option("--window", default=None, callback=parse_window, metavar="LOW,HIGH",
              help="CT window in HU (default -150,250, the window of every distseg dataset).")
@click.option("--ct-norm", default="window", show_default=True, type=click.Choice(["window", "foreground"]),
              help="CT channels: window (the HU window, --window) or foreground (nnU-Net's: the "
                   "training cases' foreground HU clipped to its 0.5-99.5 percentiles, z-scored "
                   "by its mean and std; one extra pass over the training cases).")
@click.option("--modality", default="auto", show_default=True, type=click.Choice(["auto", "ct", "mr"]),
              help="auto: each channel's from dataset.json (pairs: CT); ct: HU window; mr: "
                   "per-case normalisation (--mr-norm), for every channel.")
@click.option("--mr-norm", default="auto", show_default=True,
              type=click.Choice(["auto", "percentile", "zscore"]),
              help="MR (non-CT) channels: percentile (0.5-99.5 to [0, 1]) or zscore (per case "
                   "and channel, as nnU-Net); auto: zscore for several channels or an nnU-Net "
                   "dataset, else percentile.")
@click.option("--channel", default=None, type=click.IntRange(0),
              help="Keep only this channel of multi-channel images [default: every channel, "
                   "one input channel each].")
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
    """Convert an MSD task folder, an nnU-Net v2 raw dataset or LiTS-style NIfTI/NRRD
    pairs into a distseg HDF5 file.

    Volumes are reoriented to RAS, windowed (CT) or normalised (MR) channel by channel,
    resampled in-plane to --size and split by case; what prediction needs to go back
    to each scan is recorded. With --ndim 3 each case is kept as one volume on its own
    grid (no resampling). With --spacing every case is first resampled to one voxel
    spacing (2D: then centre cropped or padded to --size). The file is written as OUT.partial and renamed only when
    complete.
    """
    from distseg.data.convert import pipeline
    try:
        summary = pipeline.run(source, out, pipeline.Options(**options))
    except Interrupted as e:
        fail(f"interrupted: {e}; nothing written", e.exit_code)
    except KeyboardInterrupt:
        fail("interrupted; nothing written", Interrupted.exit_code)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo("\n".join(summary.lines()))
