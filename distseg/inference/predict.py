"""``distseg-predict``: a trained run's segmentations of scans, on the scans' own grids.

One path for 2D and 3D runs. ``run`` reads like its outline, on every rank:
``run_config`` (the run's config), ``training_data`` (what the training data had:
window or MR normalisation, slice size or each scan's own grid, from the data file's
attributes or flags), ``scans.collect_scans`` (input files and folders, with labels
where there are any), ``network`` (a checkpoint's U-Net, the best by default:
``choose_checkpoint``, as a sliding-window ``predict``: windows of one slice for a 2D
run, of the training slab for a 3D one; mirrored where the run's
``postprocessing.json`` says it helps, ``inference.postprocess``), then each of this rank's scans: ``segment`` (the
converter's preprocessing of every channel, the one sliding-window inferer of
``distseg.sliding``, the class probabilities resampled back, argmax, the reorientation
undone), the largest component of the classes that file names, ``write_segmentation``
(``OUT/<case>_seg.nii.gz``, uint8, the input's affine: its first channel's for a case
of one file per channel) and ``metrics.score_case`` against the labels.

A multi-channel model reads every channel of a case, from one 4-D image (MSD) or one
file per channel (nnU-Net's ``CASE_0000``, ``CASE_0001``, ...: ``scans``), and
normalises each channel as the data file's ``preprocessing`` attribute records it
(``channels``: CT windowed, MR by percentiles or z-scored per case). Rank 0 writes ``metrics.csv`` and prints the table; the overlays
of the best, median and worst cases are drawn by the rank that predicted them
(``distseg.inference.report``).

Scans are dealt to ranks by voxel count (``sliding.shard_cases``, as 3D validation
deals its volumes); Horovod is used only through ``distseg.parallel.distributed`` for
rank and size, and the ranks agree through ``distseg.parallel.agreement``, so a bad input
stops every rank with the same line.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from distseg import metrics, sliding
from distseg.core import config as config_lib
from distseg.core import rundir
from distseg.core.errors import InputError, output_dir
from distseg.data import folds, h5format, volumes
from distseg.data import slices as data
from distseg.data.convert import geometry, sources
from distseg.data.convert.intensity import Intensity, forward_channels
from distseg.inference import postprocess, report
from distseg.inference.scans import Scan, collect_scans
from distseg.training.checkpoints import checkpoint

#: Slices per prediction batch of a 2D run (a 3D run takes its training batch size).
SLICE_BATCH = 8


@dataclass(frozen=True)
class Options:
    """What ``distseg-predict`` was asked to do (each field is one flag)."""

    run_dir: str
    """Training run directory: config.json and checkpoints/."""
    inputs: tuple[str, ...]
    """Volumes (.nii, .nii.gz, .nrrd) and dataset folders (MSD or LiTS-style pairs)."""
    out: str
    labels: str | None = None
    """Folder of label volumes for input files (same name, or segmentation-N for volume-N)."""
    data: str | None = None
    """Training data file whose attributes give the preprocessing (default: the run's)."""
    window: tuple[float, float] | None = None
    modality: str | None = None
    """``ct`` or ``mr``: override the data file's intensity handling."""
    channel: int | None = None
    subset: str = "test"
    """Of a folder: ``test`` (unlabelled: MSD imagesTs, test-volume-N), ``val``/``train``
    (the cases the training data file put there), ``all``."""
    batch_size: int | None = None
    """Windows per prediction call; None: ``SLICE_BATCH`` slices (2D), the run's
    training batch size of slabs (3D)."""
    overlap: float | None = None
    """Share of a 3D window shared with its neighbour per axis; None: the run's
    validation overlap (``data.val_overlap``)."""
    tolerance_mm: float = metrics.TOLERANCE_MM
    overlays: bool = True
    progress: bool = True
    which: str = "best"
    """``best``: the run's best checkpoint (``checkpoints/best.json``) when it has one,
    else the newest; ``latest``: the newest."""
    tta: str = "auto"
    """Test-time mirroring: ``auto`` where ``postprocessing.json`` says it helps,
    ``mirror`` always, ``none`` never."""
    postprocess: str = "auto"
    """Largest-component post-processing: ``auto`` for the classes
    ``postprocessing.json`` says it helps, ``none`` for none."""
    more_runs: tuple[str, ...] = ()
    """The other runs of an ensemble, averaged with ``run_dir`` (``--checkpoint``
    repeated; ``inference.ensemble``)."""
    cv: str | None = None
    """A cross-validation directory (``CV/cv.json``) whose fold runs make the ensemble
    (``--cv``); ``run_dir`` and ``more_runs`` are then read from its plan."""
    recipe: tuple[str, ...] = ()
    """``--cv``: the recipes whose folds are averaged (needed when the plan has several;
    two or more: their configuration, e.g. a 2D and a 3D recipe)."""
    nodes: int | None = None
    """``--cv``: the node count whose folds are averaged (needed when the plan has several)."""

    @property
    def runs(self) -> tuple[str, ...]:
        """Every run predicted with: one, or the members of an ensemble."""
        return (self.run_dir, *self.more_runs)


@dataclass(frozen=True)
class Preprocessing:
    """What the training data went through, to repeat on new scans."""

    intensity: Intensity
    """The (first) channel's normalisation."""
    size: int
    """In-plane size slices were resampled to; 0: each scan kept on its own grid (the
    volumes of ``distseg-data convert --ndim 3``)."""
    channel: int | None
    """The one channel of multi-channel inputs a single-channel model takes (the data
    file's ``--channel``, or the flag); None: every channel."""
    where: str
    """Where it was read from (printed, so a user can check it)."""
    channels: tuple[Intensity, ...] = ()
    """Each input channel's normalisation, for a model of several channels; empty: one
    channel, ``intensity``."""
    channel_names: tuple[str, ...] = ()
    spacing: tuple[float, float, float] | None = None
    """The (z, y, x) spacing in mm the training data was resampled to (``convert
    --spacing``: the data file's ``target_spacing``); ``size`` is then the centre crop
    or pad of the resampled slices. None: each scan keeps its slice spacing."""

    @property
    def intensities(self) -> tuple[Intensity, ...]:
        """One normalisation per input channel the model takes."""
        return self.channels or (self.intensity,)

    def describe(self) -> str:
        grid = f"{self.size}x{self.size} slices" if self.size else "each scan's own grid"
        if self.spacing is not None:
            mm = ",".join(f"{v:g}" for v in self.spacing)
            grid = (f"resampled to {mm} mm (Z,Y,X), "
                    + (f"{self.size}x{self.size} slices (centre crop/pad)" if self.size else "volumes"))
        if len(self.intensities) == 1:
            return f"{self.intensity.describe()}, {grid} ({self.where})"
        names = self.channel_names or tuple(f"channel {c}" for c in range(len(self.intensities)))
        per = "; ".join(f"{n}: {i.describe()}" for n, i in zip(names, self.intensities))
        return f"{len(self.intensities)} channels ({per}), {grid} ({self.where})"


@dataclass(frozen=True)
class Network:
    """A trained U-Net as the sliding-window inferer runs it."""

    predict: Callable[[np.ndarray], np.ndarray]
    """(B, d, h, w, 1) float32 windows -> (B, d, h, w, C) class probabilities."""
    window: tuple[int, int, int]
    """(1, S, S) for a 2D model (one slice), the training slab (d, h, w) for a 3D one."""
    batch_size: int = SLICE_BATCH
    overlap: float = 0.5
    chosen: "Chosen | None" = None
    """The checkpoint loaded, and why."""
    post: postprocess.Applied = postprocess.Applied()
    """Test-time mirroring (already in ``predict``) and the classes whose largest
    component alone is kept (``predict_scan``)."""
    about: tuple[str, ...] = ()
    """Lines that say what ``predict`` is when not one checkpoint (an ensemble's
    members, each with its checkpoint)."""
    members: int = 1
    """How many networks ``predict`` averages (an ensemble's members on this window)."""
    others: tuple["Network", ...] = ()
    """An ensemble's members on other windows or other preprocessing (a 2D and a 3D
    recipe's folds), one ``Network`` for each: every window runs its own sliding window
    and weighs by its ``members``, so every member counts alike (``segment``)."""
    prep: "Preprocessing | None" = None
    """Its own preprocessing, where an ensemble's member reads scans otherwise than the
    first (None: the run's)."""

    @property
    def parts(self) -> tuple["Network", ...]:
        return (self, *self.others)

    def describe(self) -> str:
        return "; ".join(net.window_words() for net in self.parts)

    def window_words(self) -> str:
        what = "slices" if self.window[0] == 1 else "windows"
        return (f"{what} of {'x'.join(map(str, self.window))}, {self.batch_size} per batch"
                + (f", overlap {self.overlap:g}" if self.window[0] > 1 else ""))

    def notes(self) -> list[str]:
        """The lines that say which checkpoint and what post-processing were used."""
        lines = [f"warning: {w}" for w in ((self.chosen.warnings if self.chosen else ())
                                            + self.post.warnings)]
        if self.chosen is not None:
            lines.append(f"checkpoint: {self.chosen.words}")
        return lines + list(self.about) + [f"applied: {self.post.words}"]


@dataclass
class Result:
    name: str
    output: str
    seconds: float
    scores: list | None = None
    """``metrics.ClassScore`` per foreground class, or None without labels."""
    rank: int = 0


# --------------------------------------------------------------------- start-up


def run_config(run_dir: str) -> config_lib.Config:
    """The run's resolved config (``RUN/config.json``).

    Raises:
      InputError: not a run directory, or an unreadable config.
    """
    path = rundir.config_path(run_dir)
    if not os.path.isfile(path):
        raise InputError(f"{run_dir}: not a training run directory (no {rundir.CONFIG_FILE})")
    return config_lib.resolve("liver2d", file=path)


def model_window(cfg: config_lib.Config, data_path: str | None,
                 run_dir: str = "the run") -> tuple[int, int, int]:
    """The window the model sees: one (1, S, S) slice of a 2D model, the training slab
    of a 3D one (``--slab full``: the data file's one volume shape).

    Raises:
      InputError: ``--slab full`` without the data file to read the shape from.
    """
    if cfg.model.spatial_dims == 2:
        return (1, cfg.model.image_size, cfg.model.image_size)
    slab = volumes.parse_slab(cfg.data.slab)
    if slab == volumes.FULL:
        if not data_path:
            raise InputError(f"{run_dir}: trained with --slab full, whose "
                             "shape is the data file's; pass --data FILE.h5")
        slab = volumes.resolve_slab(volumes.examine(data_path, check_labels=False), slab)
    return tuple(int(s) for s in slab)


def input_shape(cfg: config_lib.Config, window) -> tuple[int, ...]:
    """The model's spatial input shape for ``window``: the slice (S, S) of a 2D model,
    the window itself for a 3D one."""
    return tuple(window[1:]) if cfg.model.spatial_dims == 2 else tuple(window)


@dataclass(frozen=True)
class Chosen:
    """The checkpoint predict and export load, and the words that say which and why."""

    entry: dict
    """``checkpoint.find``'s entry."""
    which: str
    """``best`` (``best.json``'s) or ``newest``."""
    words: str
    warnings: tuple[str, ...] = ()
    best: dict | None = None
    """``best.json`` of the run, when it has a readable one."""

    @property
    def stem(self) -> str:
        return os.path.basename(self.entry["manifest"]).removesuffix(".json")

    def record(self) -> dict:
        """Which checkpoint, for the files that say where a result came from."""
        out = {"stem": self.stem, "epoch": int(self.entry["epoch"]), "which": self.which}
        if self.which == "best" and self.best:
            out.update(ema_dice=self.best["ema_dice"], dice=self.best.get("dice"))
        return out


def choose_checkpoint(run_dir: str, which: str = "best") -> Chosen:
    """The checkpoint to load: with ``which="best"`` the one ``best.json`` names (the
    best EMA of validation Dice, ``training.epoch.bestcheckpoint``) when the run has one, else the
    newest; with ``"latest"`` the newest. A damaged ``best.json``, or one naming a
    damaged checkpoint, falls back to the newest with one warning; a run without one
    (trained before it was kept, or without validation) takes the newest silently.

    Raises:
      InputError: the run has no whole checkpoint.
    """
    newest, skipped = checkpoint.find(run_dir)
    if newest is None:
        raise InputError(f"{run_dir}: no checkpoint to predict with "
                         f"({rundir.CHECKPOINT_DIR}/{rundir.LATEST_CHECKPOINT})")
    entry, info, problem = checkpoint.best(run_dir)
    name = os.path.basename(newest["manifest"]).removesuffix(".json")
    warnings_ = tuple(skipped)
    if problem:
        warnings_ += (f"{problem}; using the newest checkpoint {name}",)
    if which == "best" and entry is not None:
        newer = "" if entry["manifest"] == newest["manifest"] else f"; the newest is {name}"
        return Chosen(entry, "best", f"{info['stem']} (best: EMA of the validation Dice "
                      f"{info['ema_dice']:.4f} after {info['epoch']} epoch(s){newer})",
                      warnings_, info)
    if which == "latest":
        why = "--which latest" + (f"; the best is {info['stem']}" if info else "")
    else:
        why = "best.json unusable" if problem else "the run has no best.json"
    return Chosen(newest, "newest", f"{name} (newest after {newest['epoch']} epoch(s); {why})",
                  warnings_, info)


def build_model(cfg: config_lib.Config, run_dir: str, input_shape=None,
                chosen: Chosen | None = None):
    """The run's U-Net (for inputs of ``input_shape``: the 2D slice or the 3D window;
    None: ``image_size`` on every axis) with the weights of checkpoint ``chosen``
    (None: ``choose_checkpoint``'s default, the best else the newest).

    Raises:
      InputError: no checkpoint, or one of another model or class count.
    """
    from distseg.networks import models
    entry = (chosen or choose_checkpoint(run_dir)).entry
    net = models.build(cfg.model, input_shape, run_dir=run_dir)
    try:
        with warnings.catch_warnings():
            # Keras warns once per layer it cannot fill before it raises: one line is ours.
            warnings.simplefilter("ignore")
            checkpoint.load(entry, net)
    except InputError as e:
        raise InputError(f"{e}; {run_dir}/{rundir.CONFIG_FILE} describes {_described(cfg.model)}") from None
    return net


def _described(m: config_lib.ModelConfig) -> str:
    if m.fn:
        return f"the model of --model-fn {m.fn} for {m.num_classes} classes"
    return (f"a {m.spatial_dims}D U-Net of {m.num_classes} classes, image size {m.image_size}, "
            f"depth {m.depth}, base filters {m.base_filters}")


def inference(net):
    """``net`` in inference mode as one TensorFlow function, traced once for any number
    of windows: a scan's last batch is shorter than the others, and a function traced
    per batch size traced again at nearly every scan."""
    import tensorflow as tf
    spec = tf.TensorSpec([None, *net.input_shape[1:]], tf.float32)
    return tf.function(lambda x: net(x, training=False), input_signature=[spec])


def predictor(net, spatial_dims: int) -> Callable[[np.ndarray], np.ndarray]:
    """The Keras model as a sliding-window ``predict`` (numpy in and out, ``inference``);
    a 2D model through ``sliding.slicewise``."""
    import tensorflow as tf
    fn = inference(net)
    predict = lambda x: fn(tf.convert_to_tensor(x, tf.float32)).numpy()  # noqa: E731
    return sliding.slicewise(predict) if spatial_dims == 2 else predict


def inferer_settings(cfg: config_lib.Config, opts: Options) -> tuple[int, float]:
    """(windows per batch, overlap) of the sliding-window inferer: the flags', else
    ``SLICE_BATCH`` slices (2D) or the run's training batch of slabs (3D), and the run's
    validation overlap.

    Raises:
      InputError: an overlap outside [0, 1).
    """
    batch = opts.batch_size or (SLICE_BATCH if cfg.model.spatial_dims == 2 else cfg.train.batch_size)
    overlap = cfg.data.val_overlap if opts.overlap is None else opts.overlap
    if not 0.0 <= overlap < 1.0:
        raise InputError(f"--overlap {overlap}: expected 0 <= overlap < 1")
    return batch, overlap


def network(cfg: config_lib.Config, opts: Options, data_path: str | None) -> Network:
    """The run's checkpoint (``opts.which``: the best, else the newest) as the
    sliding-window inferer runs it, with test-time mirroring where the run's
    ``postprocessing.json`` (or ``--tta``) says so."""
    window = model_window(cfg, data_path, opts.run_dir)
    chosen = choose_checkpoint(opts.run_dir, opts.which)
    net = build_model(cfg, opts.run_dir, input_shape(cfg, window), chosen)
    batch, overlap = inferer_settings(cfg, opts)
    names = list(cfg.model.class_names) or h5format.default_class_names(cfg.model.num_classes)
    post = postprocess.choose(opts.run_dir, names, chosen.stem, opts.tta, opts.postprocess)
    fn = predictor(net, cfg.model.spatial_dims)
    if post.mirror:
        fn = postprocess.mirrored(fn, postprocess.mirror_axes(window))
    return Network(fn, window, batch, overlap, chosen, post)


def data_file(cfg: config_lib.Config, opts: Options) -> str | None:
    """The training data file: ``--data``, else the run's when it is still there."""
    if opts.data:
        if not os.path.isfile(opts.data):
            raise InputError(f"--data {opts.data}: no such file")
        return opts.data
    return cfg.data.path if cfg.data.path and os.path.isfile(cfg.data.path) else None


@dataclass(frozen=True)
class TrainingData:
    """What predict takes from the run's training data file."""

    prep: Preprocessing
    class_names: tuple[str, ...]
    cases: dict | None
    """Case name -> split, from a file written by ``distseg-data convert``."""
    path: str | None = None
    """The data file, if one was found."""


_LAYOUT_WORDS = {"slices": "2D slices", "volumes": "3D volumes"}


def _data_info(path: str, cfg: config_lib.Config, run_dir: str):
    """(attributes, class count, in-plane size or 0, channels, channel names) of the
    data file, which must be of the model's layout."""
    layout = h5format.file_layout(path)
    wanted = "volumes" if cfg.model.spatial_dims == 3 else "slices"
    if layout != wanted:
        raise InputError(f"{path}: holds {_LAYOUT_WORDS[layout]}, but the model of {run_dir} "
                         f"is a {cfg.model.spatial_dims}D U-Net trained on {_LAYOUT_WORDS[wanted]}")
    if layout == "volumes":
        info = volumes.examine(path, check_labels=False)
        return info.attrs, info.num_classes, 0, info.channels, info.channel_names
    info = data.examine(path, check_labels=False)
    return info.attrs, info.num_classes, info.height, info.channels, info.channel_names


def training_data(cfg: config_lib.Config, opts: Options) -> TrainingData:
    """The training data's preprocessing (flags win), class names and case table.

    Without the data file (moved, another machine) and without flags, CT with the
    distseg HU window is assumed, and said: at the model's image size for a 2D run, on
    each scan's own grid for a 3D one (as ``convert --ndim 3`` keeps volumes). A model
    of several channels needs the data file (each channel's normalisation is recorded
    there) or ``--modality``. ``--modality`` and ``--window`` apply to every channel.

    Raises:
      InputError: a data file of the other layout, other classes or other channels than
        the model's, or bad flags.
    """
    import json
    path = data_file(cfg, opts)
    described, where, table, channel_names, target = None, "defaults", None, (), None
    size = cfg.model.image_size if cfg.model.spatial_dims == 2 else 0
    names = list(getattr(cfg.model, "class_names", ()) or h5format.default_class_names(cfg.model.num_classes))
    channels = int(getattr(cfg.model, "in_channels", 0) or 1)
    if path:
        attrs, num_classes, size, file_channels, channel_names = _data_info(path, cfg, opts.run_dir)
        if num_classes != cfg.model.num_classes:
            raise InputError(f"{path}: {num_classes} classes, but the model of "
                             f"{opts.run_dir} predicts {cfg.model.num_classes}")
        if file_channels != channels:
            raise InputError(f"{path}: images of {file_channels} channel(s), but the model of "
                             f"{opts.run_dir} takes {channels}")
        where = f"attributes of {path}"
        target = h5format.target_spacing_of(path, attrs)
        names = list(attrs.get("class_names", names))
        if "preprocessing" in attrs:
            described = json.loads(attrs["preprocessing"])
        elif all(math.isfinite(v) for v in attrs.get("hu_window", [math.nan])):
            described = {"intensity": "window", "window": attrs["hu_window"]}
        table = _case_table(path, cfg.data.fold)
    intensities, by_flags = _intensities(described, channels, opts)
    if by_flags:
        where = "flags"
    channel = opts.channel if opts.channel is not None else (described or {}).get("channel")
    if channels > 1 and channel is not None:
        raise InputError(f"--channel {channel}: the model of {opts.run_dir} takes {channels} "
                         "channels, every channel of each input")
    n = cfg.model.num_classes
    names = (names + [f"class{c}" for c in range(len(names), n)])[:n]
    prep = Preprocessing(intensities[0], int(size), channel, where,
                         intensities if channels > 1 else (), tuple(channel_names), target)
    return TrainingData(prep, tuple(names), table, path)


def _intensities(described: dict | None, channels: int, opts: Options) -> tuple[tuple, bool]:
    """(each input channel's normalisation, whether flags set it): the data file's
    record (``preprocessing``: ``channels``, else its one normalisation), else CT with
    distseg's window; ``--modality`` and ``--window`` override every channel."""
    if described and len(described.get("channels") or ()) == channels:
        recorded = tuple(Intensity.from_description(d) for d in described["channels"])
    elif described and channels == 1:
        recorded = (Intensity.from_description(described),)
    elif channels == 1:
        recorded = (Intensity.ct(),)
    elif opts.modality:
        recorded = (Intensity.ct() if opts.modality == "ct" else Intensity.zscore(),) * channels
    else:
        raise InputError(f"the model of {opts.run_dir} takes {channels} channels, whose "
                         "normalisation its training data file records; pass --data FILE.h5 "
                         "(or --modality ct|mr)")
    if opts.modality == "mr" and opts.window:
        raise InputError("--window is a CT (HU) window; it does not apply with --modality mr")
    out, changed = [], False
    for intensity in recorded:
        modality = opts.modality or intensity.modality
        if opts.window and modality == "ct" or modality != intensity.modality:
            mr = Intensity.zscore() if channels > 1 else Intensity.mr()
            intensity = Intensity.ct(*(opts.window or ())) if modality == "ct" else mr
            changed = True
        out.append(intensity)
    return tuple(out), changed


def _case_table(path: str, fold: int = -1) -> dict | None:
    """Case name -> split of a file written by ``distseg-data convert``: the file's own
    split, or, for a run trained with ``--fold I``, fold I's roles (``data.folds``), so
    ``--subset val`` is the cases that run validated."""
    import h5py
    with h5py.File(path, "r", locking=False) as f:
        if "cases" not in f:
            return None
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["cases/name"][:]]
        splits = [int(s) for s in f["cases/split"][:]]
        ids = f["cases/case_id"][:] if fold >= 0 and "case_id" in f["cases"] else None
    if ids is not None:
        table = folds.read_table(path)
        if table is None or fold >= table.k:
            raise InputError(f"{path}: holds no fold {fold} (its fold table has "
                             f"{table.k if table else 0}), which the run was trained on")
        splits = [int(s) for s in folds.roles_of(table, fold, ids, path)]
    return dict(zip(names, splits))


def _channels_of(scan: Scan, img, shape: tuple) -> int:
    """The channels of ``scan`` from its headers: its channel files (each checked to be
    on the first one's grid), or the fourth axis of its one image."""
    if len(scan.files) == 1:
        return shape[3] if len(shape) == 4 else 1
    for path in scan.files[1:]:
        try:
            sources.check_grid(path, sources.load(path), scan.files[0], img)
        except InputError as e:
            raise InputError(f"case {scan.name}: {e}") from None
    return len(scan.files)


def check_scan(scan: Scan, prep: Preprocessing, run_dir: str) -> int:
    """Header checks of one input (no voxel data read): 3-D volumes, or 4-D ones,
    with as many channels as the model takes (or the one channel chosen), channel files
    on one grid; labels of the same shape. Returns its voxel count (the work it makes,
    by which scans are dealt to ranks).

    Raises:
      InputError: one line naming the input and the run.
    """
    img = sources.load(scan.image)
    shape = sources.spatial_shape(img.shape)
    if len(shape) not in (3, 4):
        raise InputError(f"{scan.image}: image of shape {shape}, but the model of {run_dir} "
                         "segments 3-D volumes (X, Y, Z)")
    found, want = _channels_of(scan, img, shape), len(prep.intensities)
    if prep.channel is not None and found > 1 and not 0 <= prep.channel < found:
        raise InputError(f"{scan.image}: --channel {prep.channel} is outside 0..{found - 1}")
    if prep.channel is None and found != want:
        if want == 1:
            raise InputError(f"{scan.image}: image of shape {shape} has {found} channels, but the "
                             f"model of {run_dir} takes 1; pick one with --channel")
        names = f" ({', '.join(prep.channel_names)})" if prep.channel_names else ""
        raise InputError(f"{scan.image}: {found} channel(s), but the model of {run_dir} takes "
                         f"{want}{names}: give a 4-D image (X, Y, Z, {want}) or CASE_0000 with "
                         f"CASE_0001..CASE_{want - 1:04d} beside it")
    if scan.label:
        lab_shape = sources.spatial_shape(sources.load(scan.label).shape)
        if lab_shape != shape[:3]:
            raise InputError(f"{scan.label}: labels of shape {lab_shape}, but the image "
                             f"{scan.image} is {shape[:3]}")
    return int(np.prod(shape[:3]))


# ----------------------------------------------------------------- one volume


def _to_model_size(volume: np.ndarray, window) -> np.ndarray:
    """Slices ((D, H, W) or (D, H, W, C)) of a 2D run trained with ``--resize`` (its
    data file's slices of another size than the model's input) resized bilinearly as
    training resized them."""
    size = window[1]
    if window[0] != 1 or volume.shape[1:3] == tuple(window[1:]):
        return volume
    four = volume if volume.ndim == 4 else volume[..., None]
    out = np.empty((len(volume), size, size, four.shape[3]), np.float32)
    for start in range(0, len(volume), 32):
        out[start:start + 32] = data.resize_bilinear(four[start:start + 32], size)
    return out if volume.ndim == 4 else out[..., 0]


def segment(voxels, affine: np.ndarray, prep: Preprocessing, net: Network) -> np.ndarray:
    """Label volume (uint8, on the grid of the first channel's ``raw``) of a scan:
    ``voxels`` is one ``sources.Voxels`` or one per channel.

    The scan is preprocessed as ``distseg-data convert`` made the training data
    (``intensity.forward_channels``: RAS slice layout, each channel's window or MR
    normalisation, slices resampled linearly to ``prep.size``, or left on the scan's
    own grid when it is 0, or with ``prep.spacing`` resampled to that spacing and
    centre cropped or padded to ``prep.size``; then, for a 2D model trained with
    ``--resize``, the bilinear resize training applied). ``sliding.sliding_window``
    predicts the whole volume window by window (one slice per window for a 2D model),
    and the class probabilities are resampled linearly back onto the scan's own grid
    before the argmax (``geometry.labels_on_scan``, the inverse of the same geometry).
    An ensemble whose members read the scan on other grids (a 2D recipe's slices and a
    3D recipe's volumes of other preprocessing) has each grid's probabilities resampled
    back onto the scan's grid and averaged there, as nnU-Net ensembles its
    configurations (``_on_scan_grid``).
    """
    channels = (voxels,) if isinstance(voxels, sources.Voxels) else tuple(voxels)
    grids = _by_grid(net, prep)
    weight = sum(n.members for n in net.parts)
    if len(grids) > 1:
        return _on_scan_grid(channels, affine, grids, weight)
    geom = geometry.Geometry.of(affine, channels[0].raw.shape, size=prep.size, target=prep.spacing)
    probs = _probabilities(net.parts, forward_channels(channels, geom, prep.intensities)[0],
                           weight)
    return geometry.labels_on_scan(probs, geom)


def _by_grid(net: Network, prep: Preprocessing) -> list[tuple[Preprocessing, list[Network]]]:
    """The ensemble's windows grouped by the preprocessing they read the scan with."""
    out: list[tuple[Preprocessing, list[Network]]] = []
    for part in net.parts:
        own = part.prep or prep
        found = next((nets for p, nets in out if p == own), None)
        if found is None:
            out.append((own, [part]))
        else:
            found.append(part)
    return out


def _probabilities(nets: Sequence[Network], volume: np.ndarray, weight: int) -> np.ndarray:
    """Class probabilities of a preprocessed volume on its grid: each window's sliding
    window over it (a 2D model's slices first brought to its size, ``_to_model_size``),
    weighed by its members out of ``weight``."""
    total = None
    for net in nets:
        probs = sliding.sliding_window(net.predict, _to_model_size(volume, net.window),
                                       net.window, net.overlap, batch=net.batch_size)
        if net.members != weight:
            probs *= np.float32(net.members / weight)
        total = probs if total is None else total + probs
    return total


def _on_scan_grid(channels, affine: np.ndarray, grids, weight: int) -> np.ndarray:
    """Labels of an ensemble whose members read the scan on other grids: each grid's
    probabilities (``_probabilities``) taken back linearly onto the scan's own voxels
    (``geometry.inverse``; background where a grid left voxels out), added up, then the
    argmax. Costs one float copy of the scan's probabilities per class."""
    total = None
    for prep, nets in grids:
        geom = geometry.Geometry.of(affine, channels[0].raw.shape, size=prep.size,
                                    target=prep.spacing)
        probs = _probabilities(nets, forward_channels(channels, geom, prep.intensities)[0], weight)
        background = np.eye(probs.shape[-1], dtype=np.float32)[0] * np.float32(
            sum(n.members for n in nets) / weight)
        back = geometry.inverse(probs, geom, order=1, fill=background)
        total = back if total is None else total + back
    return np.argmax(total, axis=-1).astype(np.uint8)


def write_segmentation(path: str, seg: np.ndarray, img) -> None:
    """Writes ``seg`` as uint8 NIfTI with the input image's affine (and, for NIfTI
    inputs, its header's qform/sform codes), so it overlays the scan in ITK-SNAP or
    3D Slicer."""
    import nibabel as nib
    header = img.header.copy() if isinstance(img, nib.Nifti1Image) else None
    out = nib.Nifti1Image(seg.astype(np.uint8), img.affine, header=header)
    out.set_data_dtype(np.uint8)
    out.header.set_slope_inter(1, 0)
    out.header["cal_min"], out.header["cal_max"] = 0, max(1, int(seg.max()))
    out.header["descrip"] = b"distseg-predict segmentation"
    tmp = path.replace(".nii.gz", ".tmp.nii.gz")
    nib.save(out, tmp)
    os.replace(tmp, path)


def score(scan: Scan, img, seg: np.ndarray, num_classes: int, tolerance_mm: float) -> list:
    """``metrics.score_case`` of ``seg`` against the scan's labels.

    Raises:
      InputError: labels on another grid, or with a class the model lacks.
    """
    lab = sources.load(scan.label)
    diff = float(np.abs(np.asarray(lab.affine) - np.asarray(img.affine)).max())
    if diff > 1e-3:
        raise InputError(f"{scan.label}: not on the grid of {scan.image} (affines differ by "
                         f"up to {diff:.3g} mm)")
    truth = sources.label_array(lab, scan.label)
    if int(truth.max()) >= num_classes:
        raise InputError(f"{scan.label}: label {int(truth.max())}, but the model predicts "
                         f"classes 0..{num_classes - 1}")
    return metrics.score_case(truth, seg, geometry.voxel_sizes(img.affine), num_classes,
                              tolerance_mm)


def predict_scan(scan: Scan, prep: Preprocessing, net: Network, opts: Options,
                 num_classes: int) -> Result:
    """Segments one scan, writes it, and scores it when it has labels."""
    started = time.perf_counter()
    img, voxels = sources.case_channels(scan.files, prep.channel)
    seg = segment(voxels, img.affine, prep, net)
    del voxels
    if net.post.largest:  # on the whole volume: a 2D run's slices are one case here
        seg = postprocess.keep_largest(seg, net.post.largest)
    output = os.path.join(opts.out, f"{scan.name}_seg.nii.gz")
    write_segmentation(output, seg, img)
    result = Result(scan.name, output, 0.0)
    if scan.label:
        result.scores = score(scan, img, seg, num_classes, opts.tolerance_mm)
    result.seconds = time.perf_counter() - started
    return result


# ------------------------------------------------------------------ orchestration


@dataclass
class Outcome:
    """What a whole prediction produced (rank 0's view: every rank's results)."""

    results: list[Result] = field(default_factory=list)
    csv: str | None = None
    overlays: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True,
                disable=not enabled, desc="predict")


def make_out_dir(opts: Options) -> None:
    if not opts.out:
        raise InputError("--out DIR is required to predict (or --export DIR to write the model)")
    output_dir(opts.out, "--out")


def start(opts: Options):
    """Every check before the first prediction, agreed by all ranks: the run's config,
    the training data, then ``started``."""
    from distseg.parallel import agreement
    cfg = agreement.agree(run_config, opts.run_dir)
    known = agreement.agree(training_data, cfg, opts)
    return started(opts, cfg, known, lambda: network(cfg, opts, known.path))


def started(opts: Options, cfg: config_lib.Config, known: "TrainingData",
            make_network: Callable[[], Network]):
    """The checks after the run's (or an ensemble's) config and training data, agreed by
    all ranks: the scans (and their voxel counts), the output folder, the network
    ``make_network`` builds. Returns what ``run`` predicts with."""
    from distseg.parallel import agreement
    scans = agreement.agree(collect_scans, opts.inputs, known.cases, opts.subset, opts.labels)
    sizes = agreement.agree(lambda: [check_scan(s, known.prep, opts.run_dir) for s in scans])
    agreement.agree(make_out_dir, opts)
    net = agreement.agree(make_network)
    return cfg, known, scans, sizes, net


def mine(scans: list[Scan], sizes: list[int], rank: int, size: int) -> list[Scan]:
    """This rank's scans: largest first, each to the least loaded rank (the split of
    3D validation, ``sliding.shard_cases``); the same answer on every rank."""
    return [scans[i] for i in sliding.shard_cases(range(len(scans)), rank, size, voxels=sizes)]


def predict_mine(scans: list[Scan], prep: Preprocessing, net: Network, cfg, opts: Options,
                 ctx) -> tuple[list, tuple | None]:
    """This rank's scans; stops at the first failure and returns it (message, code)
    instead of raising, so that every rank reaches the agreement after the loop."""
    from distseg.parallel import agreement
    results, failure = [], None
    with _progress(len(scans), opts.progress and ctx.is_root()) as bar:
        for scan in scans:
            try:
                result = predict_scan(scan, prep, net, opts, cfg.model.num_classes)
            except Exception as e:  # noqa: BLE001 - shared with every rank, then raised
                failure = agreement.failure_of(e)
                break
            result.rank = ctx.rank
            results.append(result)
            bar.update(1)
    return results, failure


def run(opts: Options, start: Callable = start) -> Outcome:
    """Predicts every input on every rank's share of the scans; see the module docstring.
    ``start``: the checks and the network (``inference.ensemble.start`` for several runs).

    Raises:
      RunError / InputError: one line, the same on every rank (exit 2 for bad input).
    """
    from distseg.parallel import agreement, threads
    from distseg.parallel import distributed as dist
    ctx = dist.init()
    # Training's thread rule (OMP_NUM_THREADS, else this rank's cores), not the run's
    # flags: those were chosen for the machine it trained on.
    threads.configure_threads(config_lib.TrainConfig(), ctx.cores)
    cfg, known, scans, sizes, net = start(opts)
    results, failure = predict_mine(mine(scans, sizes, ctx.rank, ctx.size), known.prep, net,
                                    cfg, opts, ctx)
    agreement.raise_agreed(failure)
    everyone = sorted((r for part in dist.allgather_object(results) for r in part),
                      key=lambda r: r.name)
    drawn = agreement.agree(_draw_mine, everyone, scans, known, opts, ctx)
    overlays = sorted(p for part in dist.allgather_object(drawn) for p in part)
    outcome = Outcome(results=everyone, overlays=overlays)
    if ctx.is_root():
        summarise(outcome, known, net, opts, len(scans), ctx.size)
    return outcome


def summarise(outcome: Outcome, known: TrainingData, net: Network, opts: Options, cases: int,
              ranks: int) -> None:
    """Rank 0: ``metrics.csv`` and the lines to print."""
    outcome.lines = [*net.notes(), f"preprocessing: {known.prep.describe()}; {net.describe()}; "
                     f"{cases} case(s) on {ranks} rank(s)"]
    if any(r.scores is not None for r in outcome.results):
        outcome.csv = os.path.join(opts.out, "metrics.csv")
        report.write_csv(outcome.csv, outcome.results, known.class_names, opts.tolerance_mm)
        outcome.lines += report.table_lines(outcome.results, known.class_names, opts.tolerance_mm)
    outcome.lines.append(
        f"wrote {len(outcome.results)} segmentation(s) to {opts.out}"
        + (f", {outcome.csv}" if outcome.csv else "")
        + (f" and {len(outcome.overlays)} overlay(s) in {os.path.join(opts.out, 'overlays')}"
           if outcome.overlays else ""))


def _draw_mine(results, scans, known: TrainingData, opts: Options, ctx) -> list[str]:
    """The overlays of the picked cases this rank predicted."""
    if not opts.overlays:
        return []
    by_name = {s.name: s for s in scans}
    return [report.draw_overlay(pick, r, by_name[r.name], known.prep, opts.out, known.class_names)
            for pick, r in report.overlay_picks(results).items() if r.rank == ctx.rank]
