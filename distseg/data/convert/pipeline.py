"""``distseg-data convert``: a dataset folder in, one distseg HDF5 file out, streaming.

``run`` reads like its outline: discover the cases, decide the preprocessing, assign
splits, then prepare each case (read, check, reorient, normalise, resample; in
``workers`` processes) and append it to the file in case order, then finish the file.
Memory stays at about one volume per worker whatever the dataset's size: a case is
read, written and dropped before the next is taken. With ``ndim`` 3 the same steps
keep each case as one volume on its own grid (no in-plane resampling) and write the
volume layout (``distseg.data.volumes``).

Every channel of a multi-channel case is kept (one input channel each, channels last),
unless ``--channel`` picks one; each is normalised on its own (``choose_intensities``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import resource
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from distseg.core.errors import InputError, Interrupted
from distseg.core.stopflag import StopFlag
from distseg.data import folds as data_folds
from distseg.data import h5format
from distseg.data.convert import geometry, sources, splits
from distseg.data.convert import spacing as spacing_lib
from distseg.data.convert.intensity import (
    CT_NORMS,
    MR_NORMS,
    Intensity,
    foreground_voxels,
    forward_channels,
    modality_kind,
)
from distseg.data.convert.sources import Case, Source, VolumeError
from distseg.data.convert.writer import COMPRESSIONS, SliceWriter, VolumeCaseWriter

#: Chosen on file size, conversion time and reading rate (docs/data.md#choosing-the-compression).
DEFAULT_COMPRESSION = "lzf"
ON_ERROR = ("stop", "skip")
#: In-plane size of converted slices unless --size says otherwise.
DEFAULT_SIZE = 240
#: Largest affine difference (mm) between an image and its labels read as one grid.
AFFINE_TOLERANCE = sources.GRID_TOLERANCE


class CaseError(InputError):
    """One case cannot be converted; the message names the case and the file."""


@dataclass(frozen=True)
class Options:
    """How ``distseg-data convert`` converts (each field is one flag)."""

    size: int | None = None
    """In-plane size of the slices (linear for images, nearest for labels); None:
    ``DEFAULT_SIZE``, or with ``spacing`` the largest resampled slice (nothing cropped).
    With ``spacing`` the slices are centre cropped or padded to it, not stretched.
    Volumes (``ndim`` 3) are not cropped or stretched: it must stay None."""
    spacing: str | tuple[float, float, float] | None = None
    """Target (slice, row, column) spacing in mm every case is resampled to
    (``spacing`` module: linear images, nearest labels), ``"auto"`` (nnU-Net's
    choice from the cases, ``spacing.target_spacing``), or None: each case keeps its
    slice spacing, and slices are stretched in-plane to ``size`` (volumes: own grid)."""
    ndim: int = 2
    """2: slices (the slice format); 3: one volume per case (the volume layout)."""
    window: tuple[float, float] | None = None
    """CT window in HU; None: ``h5format.HU_WINDOW``."""
    modality: str = "auto"
    """``auto`` (each channel's name in dataset.json, CT for pairs), ``ct`` (HU window)
    or ``mr`` (per-case normalisation, ``mr_norm``), for every channel."""
    mr_norm: str = "auto"
    """How MR (non-CT) channels are normalised: ``percentile`` (the volume's 0.5 and
    99.5 percentiles to [0, 1]), ``zscore`` (per case and channel, as nnU-Net), or
    ``auto``: z-score when the file gets several channels or the source is an nnU-Net
    dataset, percentiles otherwise (distseg's single-channel MR as before channels)."""
    ct_norm: str = "window"
    """How CT channels are normalised: ``window`` (the HU window, ``window``) or
    ``foreground`` (nnU-Net's: the training cases' foreground HU clipped to its 0.5-99.5
    percentiles and z-scored by its mean and std; one pass over the training cases
    first, ``foreground_intensities``)."""
    channel: int | None = None
    """Keep only this channel of multi-channel images; None: every channel."""
    roi_margin: int | None = None
    """Keep only slices within the labelled region plus this many on each side; None: all."""
    val_fraction: float = 0.2
    """Share of cases that validate (ignored with ``folds``)."""
    folds: int = 0
    """K-fold cross-validation: K folds of cases, fold ``fold`` validates (0: off)."""
    fold: int = 0
    seed: int = 0
    """Seed of the case split."""
    workers: int = 1
    """Processes that read and prepare cases (1: in this process)."""
    on_error: str = "stop"
    """``stop``: a bad case stops the conversion, nothing written; ``skip``: leave it out."""
    compression: str = DEFAULT_COMPRESSION
    dtype: str = "float32"
    progress: bool = True


@dataclass
class Prepared:
    """One case, ready to append."""

    case: Case
    images: np.ndarray
    masks: np.ndarray
    geometry: geometry.Geometry
    bounds: np.ndarray
    """(C, 2): each channel's values mapped to 0 and 1 (``Intensity.bounds``)."""
    bytes_read: int
    peak_rss_mib: float = 0.0
    """Of the process that prepared it."""


@dataclass
class Summary:
    out: str
    ndim: int = 2
    channels: tuple[str, ...] = ()
    """Each kept channel's name and normalisation, when there are several."""
    cases: int = 0
    slices: int = 0
    train_cases: int = 0
    val_cases: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    spacing: str = ""
    """What ``--spacing`` did, one line (empty without it)."""
    seconds: float = 0.0
    bytes_read: int = 0
    peak_rss_mib: float = 0.0
    peak_worker_rss_mib: float = 0.0

    def lines(self) -> list[str]:
        rate = self.cases / self.seconds if self.seconds else 0.0
        mb = self.bytes_read / 1e6 / self.seconds if self.seconds else 0.0
        what = (f"{self.cases} volumes ({self.slices} slices)" if self.ndim == 3
                else f"{self.slices} slices from {self.cases} cases")
        out = [f"wrote {self.out}: {what} "
               f"({self.train_cases} train, {self.val_cases} val) in {self.seconds:.1f} s, "
               f"{rate:.2f} cases/s, {mb:.1f} MB/s of volumes read, peak RSS "
               f"{self.peak_rss_mib:.0f} MiB"
               + (f" (largest worker {self.peak_worker_rss_mib:.0f} MiB)"
                  if self.peak_worker_rss_mib else "")]
        if len(self.channels) > 1:
            out.append(f"{len(self.channels)} channels: {', '.join(self.channels)}")
        if self.spacing:
            out.append(self.spacing)
        if self.skipped:
            out.append(f"skipped {len(self.skipped)} case(s):")
            out += [f"  {name}: {why}" for name, why in self.skipped]
        return out


# ----------------------------------------------------------------- preprocessing


def kept_channels(source: Source, opts: Options) -> tuple[str, ...]:
    """The names of the channels the file will hold: every channel of the source, or
    the one ``--channel`` picks.

    Raises:
      InputError: a channel out of range.
    """
    n = len(source.modalities)
    if opts.channel is not None and not 0 <= opts.channel < n:
        raise InputError(f"--channel {opts.channel}: {source.root} has channels 0..{n - 1} "
                         f"({', '.join(source.modalities)})")
    return (source.modalities[opts.channel],) if opts.channel is not None else source.modalities


def choose_intensities(source: Source, opts: Options) -> tuple[Intensity, ...]:
    """Each kept channel's window or normalisation, by nnU-Net's rule: a channel named
    ``CT`` gets the HU window (``--window``, else distseg's), any other is MR,
    normalised per case (``Options.mr_norm``). ``--modality ct|mr`` makes every
    channel that.

    Raises:
      InputError: a channel out of range, or ``--window`` when no channel is CT.
    """
    names = kept_channels(source, opts)
    kinds = [modality_kind(n) if opts.modality == "auto" else opts.modality for n in names]
    if opts.window is not None and "ct" not in kinds:
        raise InputError(f"--window is a CT (HU) window, but the modality is {', '.join(names)} "
                         "(MR: per-volume normalisation); pass --modality ct to force it")
    mr_norm = opts.mr_norm
    if mr_norm == "auto":
        mr_norm = "zscore" if len(names) > 1 or source.kind == "nnunet" else "percentile"
    return tuple(Intensity.of_modality(k, mr_norm, opts.window) for k in kinds)


def foreground_intensities(source: Source, opts: Options, intensities, split, fold) -> tuple:
    """``intensities`` with every CT channel's replaced, under ``--ct-norm foreground``,
    by ``Intensity.ct_foreground`` of the training cases' foreground (with ``--folds``,
    of every fold's cases, as nnU-Net's fingerprint covers its whole training set: the
    one file serves every fold) (up to
    ``FOREGROUND_VOXELS`` per case, drawn by a generator of the split seed and the
    case's position). A training case that cannot be read is left out here:
    ``prepare_case`` names it.

    Raises:
      InputError: no training case holds a foreground voxel.
    """
    ct = [c for c, i in enumerate(intensities) if i.kind == "ct"]
    if opts.ct_norm != "foreground" or not ct:
        return tuple(intensities)
    samples: dict[int, list] = {c: [] for c in ct}
    for k, case in enumerate(source.cases):
        if (fold[k] < 0) if opts.folds else (split[k] != h5format.SPLITS["train"]):
            continue
        try:
            _, voxels = sources.case_channels(case.files, opts.channel)
            labels = sources.label_array(sources.load(case.label), case.label)
        except InputError:
            continue
        for c in ct:
            samples[c].append(foreground_voxels(voxels[c].values(voxels[c].raw), labels,
                                                seed=opts.seed * 100_003 + k))
    try:
        return tuple(Intensity.ct_foreground(np.concatenate(samples[c] or [np.zeros(0)]))
                     if c in samples else i for c, i in enumerate(intensities))
    except ValueError as e:
        raise InputError(str(e)) from None


def hu_window(intensities) -> tuple[float, float]:
    """The file attribute ``hu_window``: the CT channels' window, NaN without one."""
    ct = [i for i in intensities if i.kind == "ct"]
    return (ct[0].low, ct[0].high) if ct else (np.nan, np.nan)


def preprocessing_record(intensities, names, opts: Options) -> dict:
    """What predict must repeat, stored as the file attribute ``preprocessing``: the
    first channel's normalisation at the top (what readers from before channels
    read) and each channel's under ``channels``."""
    record = {**intensities[0].describe(), "size": opts.size, "ndim": opts.ndim, "orientation": "RAS",
              "layout": geometry.LAYOUT, "image_interpolation": "linear",
              "label_interpolation": "nearest", "roi_margin": opts.roi_margin,
              "channel": opts.channel,
              "channels": [{"name": n, **i.describe()} for n, i in zip(names, intensities)]}
    if opts.spacing is not None:  # only then: files converted without it stay as they were
        record["target_spacing"] = list(opts.spacing)
        record["inplane"] = ("resampled to target_spacing, then centre cropped or padded "
                             "(with 0) to size" if opts.ndim == 2 else "resampled to target_spacing")
    return record


def _check_pair(case: Case, img, lab) -> None:
    shape_i, shape_l = sources.spatial_shape(img.shape)[:3], sources.spatial_shape(lab.shape)
    if shape_i != shape_l:
        raise CaseError(f"case {case.name}: image {case.image} has shape {shape_i} but labels "
                        f"{case.label} {shape_l}")
    diff = float(np.abs(np.asarray(img.affine) - np.asarray(lab.affine)).max())
    if not diff <= AFFINE_TOLERANCE:
        raise CaseError(f"case {case.name}: image {case.image} and labels {case.label} are not "
                        f"on one grid (affines differ by up to {diff:.3g} mm)")


def _check_labels(case: Case, labels: np.ndarray, class_names) -> None:
    top = int(labels.max())
    if top >= len(class_names):
        declared = ", ".join(f"{i} {n}" for i, n in enumerate(class_names))
        raise CaseError(f"case {case.name}: {case.label} holds label {top}, not declared "
                        f"({declared})")
    if top == 0:
        raise CaseError(f"case {case.name}: {case.label} holds no labelled voxel (all 0)")


def _check_channels(case: Case, found: int, source: Source, opts: Options) -> None:
    want = 1 if opts.channel is not None else len(source.modalities)
    if found != want:
        hint = "; pick one with --channel" if want == 1 and found > 1 else ""
        raise CaseError(f"case {case.name}: {case.image} has {found} channel(s), but "
                        f"{source.where or source.root} declares {len(source.modalities)} "
                        f"({', '.join(source.modalities)}){hint}")


def prepare_case(case: Case, opts: Options, intensities, class_names,
                 source: Source | None = None) -> Prepared:
    """Reads, checks and preprocesses one case (runs in a worker process): every kept
    channel, each normalised by its entry of ``intensities``.

    Raises:
      CaseError: the one line that names the case and what is wrong with it.
    """
    if isinstance(intensities, Intensity):
        intensities = (intensities,)
    try:
        if case.label is None:
            raise CaseError(f"case {case.name}: {case.image} has no labels beside it "
                            f"(segmentation-{case.name.split('-')[-1]})")
        img, lab = sources.load(case.image), sources.load(case.label)
        _check_pair(case, img, lab)
        labels = sources.label_array(lab, case.label)
        _check_labels(case, labels, class_names)
        img, channels = sources.case_channels(case.files, opts.channel)
        if source is not None:
            _check_channels(case, len(channels), source, opts)
        elif len(channels) != len(intensities):
            raise CaseError(f"case {case.name}: {case.image} has {len(channels)} channel(s), "
                            f"expected {len(intensities)}")
    except VolumeError as e:
        raise CaseError(f"case {case.name}: {e}") from None
    geom = geometry.Geometry.of(img.affine, channels[0].raw.shape, size=opts.size or 0,
                                target=opts.spacing)
    z0, z1 = geometry.roi_range(geometry.to_slices(labels, geom.ornt), opts.roi_margin)
    geom = dataclasses.replace(geom, z0=z0, z1=z1)
    images, bounds = forward_channels(channels, geom, intensities)
    return Prepared(case, images, geometry.forward(labels, geom, order=0), geom, bounds,
                    bytes_read=sum(os.path.getsize(f) for f in case.files) + os.path.getsize(case.label))


def _attempt(case: Case, opts: Options, intensities, class_names, source: Source | None = None):
    """``prepare_case``, with a bad case's line returned instead of raised."""
    try:
        prepared = prepare_case(case, opts, intensities, class_names, source)
    except CaseError as e:
        return str(e)
    prepared.peak_rss_mib = peak_rss_mib()
    return prepared


# ------------------------------------------------------------------ streaming


def _worker_signals() -> None:
    # Ctrl-C reaches the whole process group; the parent alone decides what to do.
    # SIGTERM ends a worker (a batch system killing the group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def prepared_in_order(cases, opts: Options, intensities, class_names, source: Source | None = None):
    """Yields each case's ``Prepared`` (or its error line) in case order, with at most
    ``workers`` cases in flight, so memory stays at about a volume per worker."""
    if opts.workers <= 1:
        for case in cases:
            yield _attempt(case, opts, intensities, class_names, source)
        return
    pending: collections.deque = collections.deque()
    todo = iter(cases)
    with ProcessPoolExecutor(opts.workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_worker_signals) as pool:
        try:
            for case in todo:
                pending.append(pool.submit(_attempt, case, opts, intensities, class_names, source))
                if len(pending) >= opts.workers:
                    break
            while pending:
                result = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(_attempt, nxt, opts, intensities, class_names, source))
                yield result
        finally:
            for fut in pending:
                fut.cancel()


def _on_signal(flag: StopFlag, signum, frame) -> None:
    """SIGTERM or Ctrl-C: the conversion stops at the next case boundary (``flag``).

    Only recorded: raising here could land in a finaliser, where Python prints and
    drops the exception. A second signal raises at once.
    """
    name = signal.Signals(signum).name
    if flag.requested:
        raise Interrupted(f"signal {name} (second)")
    flag.request(f"signal {name}")


@contextlib.contextmanager
def _signals_stop(flag: StopFlag):
    handler = functools.partial(_on_signal, flag)
    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True,
                disable=not enabled, desc="convert")


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB.

    VmHWM of /proc/self/status, not ``getrusage``: Linux carries ``ru_maxrss`` across
    ``execve``, so a command started by a big process would report that process's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root) if path else ""


def write_cases(source: Source, opts: Options, intensities, writer,
                split: np.ndarray, fold: np.ndarray, summary: Summary, stop: StopFlag) -> None:
    """Prepares every labelled case and appends it; a bad case stops (``CaseError``) or
    is recorded in ``summary.skipped``; a signal stops at the next case (``Interrupted``)."""
    with _progress(len(source.cases), opts.progress) as bar:
        results = prepared_in_order(source.cases, opts, intensities, source.class_names, source)
        for i, (case, result) in enumerate(zip(source.cases, results)):
            stop.check()
            bar.update(1)
            if isinstance(result, str):
                if opts.on_error == "stop":
                    raise CaseError(result)
                summary.skipped.append((case.name, result))
                bar.write(f"skipped {result}", file=sys.stderr)
                continue
            writer.append(name=case.name, image=_rel(case.image, source.root),
                          label=_rel(case.label, source.root), case_id=case.case_id,
                          split=int(split[i]), fold=int(fold[i]), images=result.images,
                          masks=result.masks, geometry=result.geometry, bounds=result.bounds)
            summary.cases += 1
            summary.slices += len(result.images)
            summary.bytes_read += result.bytes_read
            summary.peak_worker_rss_mib = max(summary.peak_worker_rss_mib, result.peak_rss_mib)
            del result  # not held while the next case is read
            summary.val_cases += int(split[i] == h5format.SPLITS["val"])
            summary.train_cases += int(split[i] == h5format.SPLITS["train"])


def settled(opts: Options) -> Options:
    """``opts`` with ``size`` decided: ``DEFAULT_SIZE`` for slices, None for volumes.

    Raises:
      InputError: ``ndim`` other than 2 or 3, or a size given for volumes.
    """
    if opts.ndim not in (2, 3):
        raise InputError(f"--ndim {opts.ndim}: expected 2 (slices) or 3 (volumes)")
    if opts.ndim == 3 and opts.size is not None:
        raise InputError(f"--size {opts.size}: --ndim 3 keeps each volume on its own grid "
                         "(no resampling); leave --size out")
    try:
        target = spacing_lib.parse(opts.spacing)
    except ValueError as e:
        raise InputError(f"--spacing {e}") from None
    opts = dataclasses.replace(opts, spacing=target)
    if opts.ndim == 2 and opts.size is None and target is None:
        return dataclasses.replace(opts, size=DEFAULT_SIZE)
    return opts


def survey(cases) -> tuple[np.ndarray, np.ndarray]:
    """Each readable case's (slice, row, column) spacing in mm and (D, H, W) in the
    slice layout, from its image's header (a NIfTI's voxels are not read; an NRRD is
    read whole). A case that cannot be read is left out here: ``prepare_case`` names it."""
    spacings, shapes = [], []
    for case in cases:
        try:
            img = sources.load(case.image)
        except InputError:
            continue
        geom = geometry.Geometry.of(img.affine, sources.spatial_shape(img.shape)[:3])
        spacings.append(geom.spacing)
        shapes.append(geom.slices_shape)
    return np.asarray(spacings, dtype=np.float64).reshape(-1, 3), np.asarray(shapes).reshape(-1, 3)


def _mm(values) -> str:
    return ",".join(f"{float(v):.4g}" for v in values)


def settle_spacing(source: Source, opts: Options) -> tuple[Options, str]:
    """``opts`` with ``spacing`` a tuple (``auto``: chosen from the cases' headers by
    ``spacing.target_spacing``) and, for slices without ``--size``, the size that
    crops nothing: the largest resampled slice edge, rounded up to a multiple of 16
    (a U-Net of depth 4 pools 16x); and the summary line that says so.

    Raises:
      InputError: ``auto`` when no case's image can be read.
    """
    if opts.spacing is None:
        return opts, ""
    auto = opts.spacing == "auto"
    spacings, shapes = (survey(source.cases) if auto or (opts.ndim == 2 and opts.size is None)
                        else (None, None))
    if auto and not len(spacings):
        raise InputError(f"--spacing auto: no case of {source.root} could be read to choose it from")
    target = spacing_lib.target_spacing(spacings, shapes) if auto else tuple(opts.spacing)
    size = opts.size
    if opts.ndim == 2 and size is None:
        edge = max(max(spacing_lib.new_shape(shape, sp, target)[1:]) for sp, shape in zip(spacings, shapes))
        size = spacing_lib.round_up(max(edge, 8))
    how = "as given"
    if auto:
        median = np.median(spacings, axis=0)
        how = f"auto: the median of {len(spacings)} case(s)"
        if not np.allclose(median, target):
            axis = int(np.argmax(np.abs(median - np.asarray(target))))
            how += (f"; axis {'ZYX'[axis]} the 10th percentile of its spacings (median "
                    f"{median[axis]:.4g} mm: anisotropic, nnU-Net's rule)")
    line = f"spacing: every case resampled to {_mm(target)} mm (Z,Y,X; {how})"
    if opts.ndim == 2:
        line += f", slices centre cropped or padded to {size}x{size}"
    return dataclasses.replace(opts, spacing=target, size=size), line


def validate(source: Source, opts: Options) -> None:
    """Option checks that need the source (before anything is written)."""
    if not source.cases:
        raise InputError(f"{source.root}: no labelled cases to convert"
                         + (f" ({len(source.unlabelled)} unlabelled ones are for "
                            "distseg-predict)" if source.unlabelled else ""))
    if opts.on_error not in ON_ERROR:
        raise InputError(f"--on-error {opts.on_error!r}: expected one of {', '.join(ON_ERROR)}")
    if opts.compression not in COMPRESSIONS:
        raise InputError(f"--compression {opts.compression!r}: expected one of "
                         f"{', '.join(COMPRESSIONS)}")
    if opts.size is not None and opts.size < 8:
        raise InputError(f"--size {opts.size}: must be >= 8")
    if opts.mr_norm not in ("auto",) + MR_NORMS:
        raise InputError(f"--mr-norm {opts.mr_norm!r}: expected auto, {', '.join(MR_NORMS)}")
    if opts.ct_norm not in CT_NORMS:
        raise InputError(f"--ct-norm {opts.ct_norm!r}: expected one of {', '.join(CT_NORMS)}")


def run(source_path: str, out: str, opts: Options) -> Summary:
    """Converts the dataset folder ``source_path`` into the distseg file ``out``.

    Raises:
      InputError: bad options or source, or a bad case with ``on_error="stop"`` (then
      nothing is written; ``out``, if it existed, is untouched).
      Interrupted: SIGTERM or Ctrl-C, acted on at the next case (the partial file is
      removed).
    """
    started = time.perf_counter()
    opts = settled(opts)
    source = sources.discover(source_path)
    validate(source, opts)
    opts, spacing_line = settle_spacing(source, opts)
    split, fold = splits.assign(len(source.cases), opts.seed, opts.val_fraction,
                                opts.folds, opts.fold)
    intensities = foreground_intensities(source, opts, choose_intensities(source, opts), split, fold)
    names = kept_channels(source, opts)
    summary, stop = Summary(out=out, ndim=opts.ndim, spacing=spacing_line), StopFlag()
    summary.channels = tuple(f"{n} ({i.describe()['intensity']})" for n, i in zip(names, intensities))
    with _signals_stop(stop):
        writer = (VolumeCaseWriter if opts.ndim == 3 else SliceWriter)(
            out, opts.size, opts.dtype, opts.compression, channels=len(names),
            spaced=opts.spacing is not None)
        try:
            write_cases(source, opts, intensities, writer, split, fold, summary, stop)
            stop.check()
            if not summary.cases:
                raise InputError(f"{source_path}: every case was skipped; nothing written")
            writer.finish(
                source=f"{source.kind} {source.name} converted from {os.path.abspath(source.root)}",
                class_names=source.class_names, channel_names=names,
                hu_window=hu_window(intensities),
                preprocessing=preprocessing_record(intensities, names, opts),
                splitting={"seed": opts.seed, "val_fraction": opts.val_fraction,
                           "folds": opts.folds, "fold": opts.fold, "by": "case"},
                extra={"source_root": os.path.abspath(source.root),
                       "skipped": [f"{n}: {w}" for n, w in summary.skipped] or "",
                       **({"target_spacing": np.asarray(opts.spacing, dtype=np.float64)}
                          if opts.spacing is not None else {})})
        except BaseException:
            writer.abort()
            raise
    if opts.folds:
        data_folds.write_table(out, data_folds.table_from_cases_column(
            out, f"convert --folds {opts.folds} --seed {opts.seed}"), base_fold=opts.fold)
    summary.seconds = time.perf_counter() - started
    summary.peak_rss_mib = peak_rss_mib()
    if opts.workers <= 1:
        summary.peak_worker_rss_mib = 0.0  # the cases were prepared in this process
    return summary
