"""``distseg-predict``: a trained run's segmentations of scans, on the scans' own grids.

``run`` reads like its outline, on every rank: ``load_run`` (the run's config and its
newest checkpoint), ``training_data`` (what the training data had: window or MR
normalisation and slice size, from the data file's attributes or flags),
``collect_jobs`` (input files and folders, with labels where there are any), then each
of this rank's cases: ``segment`` (reorient, normalise, resample, predict in batches,
resample the class probabilities back, argmax, undo the reorientation) and
``write_segmentation`` (``OUT/<case>_seg.nii.gz``, uint8, the input's affine), and
``metrics.score_case`` against the labels. Rank 0 writes ``metrics.csv`` and prints
the table; the overlays of the best, median and worst cases are drawn by the rank
that predicted them.

Cases are dealt to ranks by size (largest first, to the least loaded rank); Horovod is
used only through ``distseg.distributed`` for rank, size and agreement, so a bad input
stops every rank with the same line.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import slices as data
from distseg.data.convert import geometry, sources
from distseg.data.convert.intensity import Intensity
from distseg.inference import metrics
from distseg.training import checkpoint

SUBSETS = ("test", "val", "train", "all")
OVERLAY_PICKS = ("best", "median", "worst")
#: Truth and prediction contour colours per foreground class (1, 2, ...).
TRUTH_COLOURS = ("#00e000", "#00c8ff", "#ffd000", "#ffffff")
PRED_COLOURS = ("#ff2020", "#ff40ff", "#ff8c00", "#a0a0ff")


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
    batch_size: int = 8
    tolerance_mm: float = metrics.TOLERANCE_MM
    overlays: bool = True
    progress: bool = True


@dataclass(frozen=True)
class Preprocessing:
    """What the training data's slices went through, to repeat on new scans."""

    intensity: Intensity
    size: int
    channel: int | None
    where: str
    """Where it was read from (printed, so a user can check it)."""


@dataclass(frozen=True)
class Job:
    name: str
    image: str
    label: str | None


@dataclass
class Result:
    name: str
    output: str
    seconds: float
    scores: list | None = None
    """``metrics.ClassScore`` per foreground class, or None without labels."""
    rank: int = 0


# --------------------------------------------------------------------- start-up


def load_run(run_dir: str) -> config_lib.Config:
    """The run's resolved config (``RUN/config.json``).

    Raises:
      InputError: not a run directory, or an unreadable config.
    """
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        raise InputError(f"{run_dir}: not a training run directory (no config.json)")
    return config_lib.resolve("liver2d", file=path)


def build_model(cfg: config_lib.Config, run_dir: str):
    """The run's U-Net with the weights of its newest checkpoint.

    Raises:
      InputError: no checkpoint, or one of another model or class count.
    """
    from distseg.networks import unet as model_lib
    entry = checkpoint.latest(run_dir)
    if entry is None:
        raise InputError(f"{run_dir}: no checkpoint to predict with (checkpoints/latest.json)")
    net = model_lib.from_config(cfg.model)
    m = cfg.model
    try:
        with warnings.catch_warnings():
            # Keras warns once per layer it cannot fill before it raises: one line is ours.
            warnings.simplefilter("ignore")
            checkpoint.load(entry, net)
    except InputError as e:
        raise InputError(f"{e}; {run_dir}/config.json describes a U-Net of {m.num_classes} "
                         f"classes, image size {m.image_size}, depth {m.depth}, base filters "
                         f"{m.base_filters}") from None
    return net


def _data_file(cfg: config_lib.Config, opts: Options) -> str | None:
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


def training_data(cfg: config_lib.Config, opts: Options) -> TrainingData:
    """The training data's preprocessing (flags win), class names and case table.

    Without the data file (moved, another machine) and without flags, CT with the
    distseg HU window at the model's image size is assumed, and said.

    Raises:
      InputError: the data file's classes differ from the model's, or bad flags.
    """
    import json
    path = _data_file(cfg, opts)
    described, size, where, table = None, cfg.model.image_size, "defaults", None
    names = list(config_lib.CLASS_NAMES)
    if path:
        info = data.inspect(path, check_labels=False)
        if info.num_classes != cfg.model.num_classes:
            raise InputError(f"{path}: {info.num_classes} classes, but the model of "
                             f"{opts.run_dir} predicts {cfg.model.num_classes}")
        attrs, size, where = info.attrs, info.height, f"attributes of {path}"
        names = list(attrs.get("class_names", names))
        if "preprocessing" in attrs:
            described = json.loads(attrs["preprocessing"])
        elif all(math.isfinite(v) for v in attrs.get("hu_window", [math.nan])):
            described = {"intensity": "window", "window": attrs["hu_window"]}
        table = _case_table(path)
    intensity = Intensity.from_description(described) if described else Intensity.ct()
    modality = opts.modality or intensity.kind
    if modality == "mr" and opts.window:
        raise InputError("--window is a CT (HU) window; it does not apply with --modality mr")
    if opts.window or modality != intensity.kind:
        intensity = Intensity.ct(*(opts.window or ())) if modality == "ct" else Intensity.mr()
        where = "flags"
    channel = opts.channel if opts.channel is not None else (described or {}).get("channel")
    n = cfg.model.num_classes
    names = (names + [f"class{c}" for c in range(len(names), n)])[:n]
    return TrainingData(Preprocessing(intensity, int(size), channel, where), tuple(names), table)


def _case_table(path: str) -> dict | None:
    import h5py
    with h5py.File(path, "r", locking=False) as f:
        if "cases" not in f:
            return None
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["cases/name"][:]]
        return dict(zip(names, (int(s) for s in f["cases/split"][:])))


def _label_for(image: str, labels_dir: str | None) -> str | None:
    """The label file of ``image`` in ``labels_dir``: ``segmentation-N`` for
    ``volume-N`` (LiTS), else the same name (MSD labelsTr); never the image itself."""
    if not labels_dir:
        return None
    stem = sources.strip_extension(image)
    stems = ([stem.replace("volume-", "segmentation-", 1)] if stem.startswith("volume-") else []) + [stem]
    for s in stems:
        for ext in sources.EXTENSIONS:
            candidate = os.path.join(labels_dir, s + ext)
            if os.path.isfile(candidate) and not os.path.samefile(candidate, image):
                return candidate
    return None


def _folder_jobs(folder: str, subset: str, table: dict | None) -> list[Job]:
    src = sources.discover(folder)
    if subset == "test":
        picked = src.unlabelled
    elif subset == "all":
        picked = src.cases + src.unlabelled
    else:
        if table is None:
            raise InputError(f"--subset {subset} needs the case table of a training data file "
                             "written by distseg-data convert (pass --data FILE.h5)")
        wanted = data.SPLITS[subset]
        picked = tuple(c for c in src.cases if table.get(c.name) == wanted)
    if not picked:
        raise InputError(f"{folder}: no cases in --subset {subset} ({len(src.cases)} labelled, "
                         f"{len(src.unlabelled)} unlabelled)")
    return [Job(c.name, c.image, c.label) for c in picked]


def collect_jobs(opts: Options, table: dict | None) -> list[Job]:
    """Every case to predict, with its label file where there is one.

    Raises:
      InputError: a missing input, an empty folder subset, or two cases of one name.
    """
    if opts.subset not in SUBSETS:
        raise InputError(f"--subset {opts.subset!r}: expected one of {', '.join(SUBSETS)}")
    jobs: list[Job] = []
    for path in opts.inputs:
        if os.path.isdir(path):
            jobs += _folder_jobs(path, opts.subset, table)
        elif os.path.isfile(path):
            jobs.append(Job(sources.strip_extension(path), path, _label_for(path, opts.labels)))
        else:
            raise InputError(f"{path}: no such file or folder")
    seen: dict[str, str] = {}
    for job in jobs:
        if job.name in seen:
            raise InputError(f"{job.image}: case name {job.name} is also {seen[job.name]}; "
                             "outputs would overwrite each other")
        seen[job.name] = job.image
    if not jobs:
        raise InputError("no input volumes given")
    return jobs


def check_job(job: Job, prep: Preprocessing, run_dir: str) -> None:
    """Header checks of one input (no voxel data read): a 3-D volume, or a 4-D one with
    a channel chosen; labels of the same shape.

    Raises:
      InputError: one line naming the input and the run.
    """
    img = sources.load(job.image)
    shape = sources.spatial_shape(img.shape)
    if len(shape) == 4 and prep.channel is None:
        raise InputError(f"{job.image}: image of shape {shape} has {shape[3]} channels, but the "
                         f"model of {run_dir} takes 1; pick one with --channel")
    if len(shape) not in (3, 4):
        raise InputError(f"{job.image}: image of shape {shape}, but the model of {run_dir} "
                         "segments 3-D volumes (X, Y, Z) slice by slice")
    if job.label:
        lab_shape = sources.spatial_shape(sources.load(job.label).shape)
        if lab_shape != shape[:3]:
            raise InputError(f"{job.label}: labels of shape {lab_shape}, but the image "
                             f"{job.image} is {shape[:3]}")


def assign(jobs: list[Job], rank: int, size: int) -> list[Job]:
    """This rank's jobs: largest file first, each to the least loaded rank (the same
    answer on every rank)."""
    load = [0] * size
    mine = []
    for job in sorted(jobs, key=lambda j: (-os.path.getsize(j.image), j.name)):
        r = min(range(size), key=lambda k: (load[k], k))
        load[r] += os.path.getsize(job.image)
        if r == rank:
            mine.append(job)
    return mine


# ----------------------------------------------------------------- one volume


def segment(voxels: sources.Voxels, affine: np.ndarray, prep: Preprocessing, predict_fn,
            model_size: int, batch_size: int = 8) -> np.ndarray:
    """Label volume (uint8, on the grid of ``voxels.raw``) of a 3-D scan.

    ``predict_fn`` maps (B, model_size, model_size, 1) float32 images in [0, 1] to
    (B, model_size, model_size, C) class probabilities. Slices are preprocessed as in
    ``distseg-data convert`` (RAS, window or MR normalisation, linear resampling to
    ``prep.size``; then, when the model was trained with ``--resize``, the same
    bilinear resize training applied), and the probabilities are resampled linearly
    back onto each slice's own grid before the argmax.
    """
    geom = geometry.Geometry.of(affine, voxels.raw.shape, size=prep.size)
    normalise = prep.intensity.normaliser(voxels, prep.intensity.bounds(voxels))
    slices = geometry.to_slices(voxels.raw, geom.ornt)
    depth, h, w = slices.shape
    out = np.zeros((depth, h, w), dtype=np.uint8)
    for start in range(0, depth, batch_size):
        block = normalise(slices[start:start + batch_size])
        x = geometry.resample(block, prep.size, prep.size, order=1)[..., None]
        if model_size != prep.size:
            x = data.resize_bilinear(x, model_size)
        probs = np.asarray(predict_fn(x), dtype=np.float32)
        back = geometry.resample(probs, h, w, order=1)
        out[start:start + len(back)] = np.argmax(back, axis=-1)
    return np.ascontiguousarray(geometry.from_slices(out, geom.ornt))


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


def predict_job(job: Job, prep: Preprocessing, predict_fn, model_size: int, opts: Options,
                num_classes: int) -> Result:
    """Segments one case, writes it, and scores it when it has labels."""
    started = time.perf_counter()
    img = sources.load(job.image)
    voxels = sources.image_voxels(img, job.image, prep.channel)
    seg = segment(voxels, img.affine, prep, predict_fn, model_size, opts.batch_size)
    del voxels
    output = os.path.join(opts.out, f"{job.name}_seg.nii.gz")
    write_segmentation(output, seg, img)
    result = Result(job.name, output, 0.0)
    if job.label:
        lab = sources.load(job.label)
        diff = float(np.abs(np.asarray(lab.affine) - np.asarray(img.affine)).max())
        if diff > 1e-3:
            raise InputError(f"{job.label}: not on the grid of {job.image} (affines differ by "
                             f"up to {diff:.3g} mm)")
        truth = sources.label_array(lab, job.label)
        if int(truth.max()) >= num_classes:
            raise InputError(f"{job.label}: label {int(truth.max())}, but the model predicts "
                             f"classes 0..{num_classes - 1}")
        result.scores = metrics.score_case(truth, seg, geometry.voxel_sizes(img.affine),
                                           num_classes, opts.tolerance_mm)
    result.seconds = time.perf_counter() - started
    return result


# -------------------------------------------------------------- reports


def class_columns(class_names) -> list[str]:
    cols = []
    for name in class_names[1:]:
        cols += [f"dice_{name}", f"hd95_mm_{name}", f"nsd_{name}", f"voxels_true_{name}",
                 f"voxels_pred_{name}"]
    return cols


def write_csv(path: str, results: list[Result], class_names, tolerance_mm: float) -> None:
    """One row per scored case, then a ``mean`` row (see ``metrics.mean_scores``)."""
    scored = [r for r in results if r.scores is not None]
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["case", "seconds", "tolerance_mm"] + class_columns(class_names))
        for r in scored:
            row = [r.name, f"{r.seconds:.2f}", tolerance_mm]
            for s in r.scores:
                row += [_num(s.dice), _num(s.hd95), _num(s.nsd), s.true_voxels, s.pred_voxels]
            out.writerow(row)
        row = ["mean", "", tolerance_mm]
        for m in metrics.mean_scores([r.scores for r in scored]):
            row += [_num(m["dice"]), _num(m["hd95"]), _num(m["nsd"]), "", ""]
        out.writerow(row)


def _num(v: float) -> str:
    return "nan" if math.isnan(v) else "inf" if math.isinf(v) else f"{v:.4f}"


def table_lines(results: list[Result], class_names, tolerance_mm: float) -> list[str]:
    """The terminal table: every scored case (the best, median and worst of more than
    20), then the mean; Dice / HD95 mm / NSD per class."""
    scored = ranked(results)
    if not scored:
        return []
    names = class_names[1:]
    head = f"{'case':<24}" + "".join(f"{n[:10] + ' Dice':>16}{'HD95 mm':>9}{'NSD':>7}" for n in names)
    lines = [f"metrics (NSD at {tolerance_mm:g} mm):", head]
    shown = scored if len(scored) <= 20 else [scored[i] for i in _pick_indices(len(scored))]
    for r in shown:
        lines.append(f"{r.name[:24]:<24}" + "".join(
            f"{_num(s.dice):>16}{_num(s.hd95):>9}{_num(s.nsd):>7}" for s in r.scores))
    means = metrics.mean_scores([r.scores for r in scored])
    lines.append(f"{'mean of ' + str(len(scored)):<24}" + "".join(
        f"{_num(m['dice']):>16}{_num(m['hd95']):>9}{_num(m['nsd']):>7}" for m in means))
    return lines


def ranked(results: list[Result]) -> list[Result]:
    """Scored cases from the best foreground Dice to the worst (NaN last, then name)."""
    scored = [r for r in results if r.scores is not None]
    def key(r):
        d = metrics.foreground_dice(r.scores)
        return (math.isnan(d), -d if not math.isnan(d) else 0.0, r.name)
    return sorted(scored, key=key)


def _pick_indices(n: int) -> list[int]:
    return sorted({0, (n - 1) // 2, n - 1})


def overlay_picks(results: list[Result]) -> dict[str, Result]:
    """The best, median and worst scored cases (fewer when there are fewer cases)."""
    order = ranked(results)
    picks: dict[str, Result] = {}
    for pick, i in zip(OVERLAY_PICKS, (0, (len(order) - 1) // 2, len(order) - 1)):
        if order and order[i] not in picks.values():  # one picture per case
            picks[pick] = order[i]
    return picks


def _focus(truth: np.ndarray, pred: np.ndarray) -> tuple[int, int, int]:
    """Slice-layout voxel the overlay cuts through: the centre of the truth's last
    (lesion) class, else the prediction's, else any foreground, else the middle."""
    top = int(max(truth.max(), pred.max(), 1))
    for mask in (truth == top, pred == top, truth > 0, pred > 0):
        if mask.any():
            idx = np.argwhere(mask)
            centre = idx.mean(axis=0)
            nearest = idx[np.argmin(((idx - centre) ** 2).sum(axis=1))]  # a voxel in the mask
            return tuple(int(v) for v in nearest)
    return tuple(s // 2 for s in truth.shape)


def render_overlay(path: str, image: np.ndarray, truth: np.ndarray, pred: np.ndarray,
                   spacing, class_names, title: str) -> None:
    """Axial, coronal and sagittal slices through the lesion (slice-layout arrays,
    ``spacing`` (slice, row, column) mm): truth in solid, prediction in dashed contours,
    one colour pair per class."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    z, y, x = _focus(truth, pred)
    dz, dy, dx = spacing
    views = [  # (name, image, truth, pred, aspect = row spacing / column spacing)
        ("axial", image[z], truth[z], pred[z], dy / dx),
        ("coronal", image[::-1, y, :], truth[::-1, y, :], pred[::-1, y, :], dz / dx),
        ("sagittal", image[::-1, :, x], truth[::-1, :, x], pred[::-1, :, x], dz / dy),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8))
    for ax, (name, img, t, p, aspect) in zip(axes, views):
        ax.imshow(img, cmap="gray", vmin=0, vmax=1, aspect=aspect, interpolation="nearest")
        for c in range(1, len(class_names)):
            for mask, colour, style in ((t, TRUTH_COLOURS, "solid"), (p, PRED_COLOURS, "dashed")):
                if (mask == c).any():
                    ax.contour(mask == c, levels=[0.5], colors=[colour[(c - 1) % len(colour)]],
                               linewidths=1.2, linestyles=style)
        ax.set_title(name)
        ax.axis("off")
    handles = []
    for c in range(1, len(class_names)):
        handles.append(Line2D([], [], color=TRUTH_COLOURS[(c - 1) % 4], label=f"{class_names[c]} truth"))
        handles.append(Line2D([], [], color=PRED_COLOURS[(c - 1) % 4], linestyle="dashed",
                              label=f"{class_names[c]} prediction"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw_overlay(pick: str, result: Result, job: Job, prep: Preprocessing, out_dir: str,
                 class_names) -> str:
    """Reads the case's scan, truth and prediction back and renders its overlay PNG."""
    img = sources.load(job.image)
    voxels = sources.image_voxels(img, job.image, prep.channel)
    volume = prep.intensity.normaliser(voxels, prep.intensity.bounds(voxels))(voxels.raw)
    truth = sources.label_array(sources.load(job.label), job.label)
    pred = sources.label_array(sources.load(result.output), result.output)
    ornt = geometry.ornt_of(img.affine)
    dice = ", ".join(f"{n} {_num(s.dice)}" for n, s in zip(class_names[1:], result.scores))
    path = os.path.join(out_dir, "overlays", f"{pick}_{result.name}.png")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    render_overlay(path, geometry.to_slices(volume, ornt), geometry.to_slices(truth, ornt),
                   geometry.to_slices(pred, ornt), geometry.slice_spacing(img.affine, ornt),
                   class_names, f"{pick}: {result.name} (Dice {dice})")
    return path


# ------------------------------------------------------------------ orchestration


@dataclass
class Outcome:
    """What a whole prediction produced (rank 0's view: every rank's results)."""

    results: list[Result] = field(default_factory=list)
    csv: str | None = None
    overlays: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _threads(cores: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(cores))
    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(cores)
        tf.config.threading.set_inter_op_parallelism_threads(
            config_lib.default_inter_op_threads(cores))
    except RuntimeError:  # TensorFlow already started in this process
        pass


def predictor(net):
    """(B, S, S, 1) -> (B, S, S, C) numpy, through one traced inference function."""
    import tensorflow as tf
    fn = tf.function(lambda x: net(x, training=False), reduce_retracing=True)
    return lambda x: fn(tf.convert_to_tensor(x)).numpy()


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True,
                disable=not enabled, desc="predict")


def start(opts: Options):
    """Every check before the first prediction, agreed by all ranks."""
    from distseg.training import distributed as dist
    cfg = dist.agree(load_run, opts.run_dir)
    known = dist.agree(training_data, cfg, opts)
    jobs = dist.agree(collect_jobs, opts, known.cases)
    dist.agree(lambda: [check_job(j, known.prep, opts.run_dir) for j in jobs])
    net = dist.agree(build_model, cfg, opts.run_dir)
    dist.agree(os.makedirs, opts.out, exist_ok=True)
    return cfg, known, jobs, net


def predict_mine(mine: list[Job], prep, predict_fn, cfg, opts: Options, ctx) -> tuple[list, tuple | None]:
    """This rank's cases; stops at the first failure and returns it (message, code)
    instead of raising, so that every rank reaches the agreement after the loop."""
    from distseg.training import distributed as dist
    results, failure = [], None
    with _progress(len(mine), opts.progress and ctx.is_root()) as bar:
        for job in mine:
            try:
                result = predict_job(job, prep, predict_fn, cfg.model.image_size, opts,
                                     cfg.model.num_classes)
            except Exception as e:  # noqa: BLE001 - shared with every rank, then raised
                failure = dist.failure_of(e)
                break
            result.rank = ctx.rank
            results.append(result)
            bar.update(1)
    return results, failure


def run(opts: Options) -> Outcome:
    """Predicts every input on every rank's share of the cases; see the module docstring.

    Raises:
      RunError / InputError: one line, the same on every rank (exit 2 for bad input).
    """
    from distseg.training import distributed as dist
    ctx = dist.init()
    _threads(ctx.cores)
    cfg, known, jobs, net = start(opts)
    results, failure = predict_mine(assign(jobs, ctx.rank, ctx.size), known.prep,
                                    predictor(net), cfg, opts, ctx)
    dist.raise_agreed(failure)
    everyone = sorted((r for part in dist.allgather_object(results) for r in part),
                      key=lambda r: r.name)
    mine = dist.agree(_draw_mine, everyone, jobs, known, opts, ctx)
    overlays = sorted(p for part in dist.allgather_object(mine) for p in part)
    outcome = Outcome(results=everyone, overlays=overlays)
    if ctx.is_root():
        report(outcome, known, opts, len(jobs), ctx.size)
    return outcome


def report(outcome: Outcome, known: TrainingData, opts: Options, cases: int, ranks: int) -> None:
    """Rank 0: ``metrics.csv`` and the lines to print."""
    prep = known.prep
    outcome.lines = [f"preprocessing: {prep.intensity.describe()}, {prep.size}x{prep.size} "
                     f"slices ({prep.where}); {cases} case(s) on {ranks} rank(s)"]
    if any(r.scores is not None for r in outcome.results):
        outcome.csv = os.path.join(opts.out, "metrics.csv")
        write_csv(outcome.csv, outcome.results, known.class_names, opts.tolerance_mm)
        outcome.lines += table_lines(outcome.results, known.class_names, opts.tolerance_mm)
    outcome.lines.append(
        f"wrote {len(outcome.results)} segmentation(s) to {opts.out}"
        + (f", {outcome.csv}" if outcome.csv else "")
        + (f" and {len(outcome.overlays)} overlay(s) in {os.path.join(opts.out, 'overlays')}"
           if outcome.overlays else ""))


def _draw_mine(results, jobs, known: TrainingData, opts: Options, ctx) -> list[str]:
    """The overlays of the picked cases this rank predicted."""
    if not opts.overlays:
        return []
    by_name = {j.name: j for j in jobs}
    return [draw_overlay(pick, r, by_name[r.name], known.prep, opts.out, known.class_names)
            for pick, r in overlay_picks(results).items() if r.rank == ctx.rank]
