"""``distseg-predict --checkpoint RUN --decide``: where test-time mirroring and
largest-component post-processing help, decided on the run's validation cases and
written to ``RUN/postprocessing.json`` (``inference.postprocess``).

A separate step, not the end of ``distseg-train``: it decides for the checkpoint
predict will load (the best by default, ``--which latest`` for the newest), so it can
be redone when a resumed run finds a new best, it runs on runs trained before it
existed, and the training loop (its time, its collectives, its tests) is untouched.

The cases are the validation split of the run's data file (``--data`` to name
another), read as training validated them: a 2D run's slices at the model's size,
stacked in file order into one volume per case (so the largest component is taken over
the whole case, as ``distseg-predict`` takes it on a scan); a 3D run's volumes whole.
Each goes through the sliding-window inferer with the network as predict runs it,
plain and mirrored (``postprocess.mirrored``), and ``postprocess.case_row`` scores both
with and without each class's largest component. The cases are shared over the ranks
by voxel count, the rows gathered, and rank 0 writes the file and the lines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from distseg import sliding
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.data import folds, volumes
from distseg.data import slices as data
from distseg.inference import postprocess, predict


@dataclass(frozen=True)
class Case:
    """One validation case of the data file."""

    name: str
    rows: tuple[int, ...]
    """Its slices (2D, in file order), or its one volume row (3D)."""
    voxels: int
    case_id: int = -1
    """Its id in the file (``case_id``)."""


def validation_cases(cfg: config_lib.Config, path: str) -> list[Case]:
    """The validation cases of data file ``path`` (metadata only).

    Raises:
      InputError: the file holds no validation case.
    """
    info = folds.examine(path, cfg.model.spatial_dims, cfg.data.fold)
    if cfg.model.spatial_dims == 3:
        cases = [Case(f"case {int(info.case_ids[k])}", (int(k),), int(np.prod(info.shapes[k])),
                      int(info.case_ids[k])) for k in info.val_cases]
    else:
        val = np.sort(info.val_indices)
        ids = info.case_ids[val]
        cases = [Case(f"case {int(c)}", tuple(int(i) for i in val[ids == c]),
                      int((ids == c).sum()) * info.height * info.width, int(c))
                 for c in np.unique(ids)]
    if not cases:
        raise InputError(f"{path}: holds no validation cases; --decide scores the run's "
                         "validation split (pass --data FILE.h5 with one)")
    return cases


def open_reader(cfg: config_lib.Config, path: str, window):
    """The reader of the cases: slices at the model's size (2D), whole volumes (3D)."""
    if cfg.model.spatial_dims == 3:
        return volumes.SlabReader(path, window)
    return data.SliceReader(path, image_size=cfg.model.image_size, resize=cfg.data.resize)


def read_case(reader, case: Case, spatial_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """(image (D, H, W, C) float32, truth (D, H, W)) of one case."""
    if spatial_dims == 3:
        return reader.read_case(case.rows[0])
    return reader.read(list(case.rows))


def score_case(image: np.ndarray, truth: np.ndarray, net: predict.Network,
               num_classes: int) -> dict:
    """``postprocess.case_row`` of one case: predicted plain and mirrored."""
    mirror = postprocess.mirrored(net.predict, postprocess.mirror_axes(net.window))
    segs = [np.argmax(sliding.sliding_window(fn, image, net.window, net.overlap,
                                             batch=net.batch_size), axis=-1)
            for fn in (net.predict, mirror)]
    return postprocess.case_row(truth, *segs, num_classes)


@dataclass
class Start:
    """What every rank has agreed on before scoring."""

    cfg: config_lib.Config
    path: str
    cases: list[Case]
    net: predict.Network
    class_names: tuple[str, ...]


def start(opts: predict.Options) -> Start:
    """The run, its data file, the validation cases and the plain network (the
    checkpoint of ``--which``).

    Raises:
      InputError: inputs or --out given, no data file, no validation cases, or any of
        predict's start-up errors.
    """
    if opts.inputs or opts.out:
        raise InputError("--decide scores the run's validation cases; predict INPUTS with "
                         "--out in a separate distseg-predict")
    cfg = predict.run_config(opts.run_dir)
    known = predict.training_data(cfg, opts)
    if known.path is None:
        raise InputError(f"{opts.run_dir}: its data file {cfg.data.path or '(none)'} is not "
                         "there; --decide scores its validation cases: pass --data FILE.h5")
    cases = validation_cases(cfg, known.path)
    plain = dataclasses.replace(opts, tta="none", postprocess="none")
    net = predict.network(cfg, plain, known.path)
    return Start(cfg, known.path, cases, net, known.class_names)


def score_mine(s: Start, rank: int, size: int) -> list[tuple[str, dict]]:
    """This rank's cases (by voxel count, ``sliding.shard_cases``), scored."""
    mine = sliding.shard_cases(range(len(s.cases)), rank, size,
                               voxels=[c.voxels for c in s.cases])
    with open_reader(s.cfg, s.path, s.net.window) as reader:
        out = []
        for k in mine:
            image, truth = read_case(reader, s.cases[k], s.cfg.model.spatial_dims)
            out.append((s.cases[k].name, score_case(image, truth, s.net, s.cfg.model.num_classes)))
    return out


def lines(s: Start, decisions: dict, path: str) -> list[str]:
    """What rank 0 prints: the checkpoint, both decisions with their Dice, the file."""
    m, lcc = decisions["mirror"], decisions["largest_component"]
    n = postprocess.number
    out = [f"checkpoint: {s.net.chosen.words}",
           f"decided on {len(s.cases)} validation case(s) of {s.path} (mean per-case Dice "
           "of the foreground classes)",
           f"mirroring: {n(m['dice_plain'])} plain, {n(m['dice_mirror'])} mirrored -> "
           f"{'apply' if m['apply'] else 'do not apply'}"]
    for name, d in lcc["classes"].items():
        out.append(f"largest component of {name} (on the {lcc['on']} prediction): "
                   f"{n(d['dice_without'])} without, {n(d['dice_with'])} with -> "
                   f"{'apply' if d['apply'] else 'do not apply'}")
    return out + [f"wrote {path}"]


def run(opts: predict.Options) -> list[str]:
    """Every rank: scores its share of the validation cases; rank 0 writes
    ``RUN/postprocessing.json`` and returns the lines to print (the others: none).

    Raises:
      InputError / RunError: one line, the same on every rank.
    """
    from distseg.parallel import agreement, threads
    from distseg.parallel import distributed as dist
    ctx = dist.init()
    threads.configure_threads(config_lib.TrainConfig(), ctx.cores)
    s = agreement.agree(start, opts)
    rows = agreement.agree(score_mine, s, ctx.rank, ctx.size)
    everyone = sorted((r for part in dist.allgather_object(rows) for r in part),
                      key=lambda r: r[0])
    return agreement.agree(conclude, s, everyone, opts.run_dir, ctx.is_root())


def conclude(s: Start, everyone: list[tuple[str, dict]], run_dir: str, root: bool) -> list[str]:
    """Rank 0: the decisions from every case's row, ``RUN/postprocessing.json`` and the
    lines to print; the other ranks: nothing."""
    if not root:
        return []
    decisions = postprocess.decide([row for _, row in everyone], s.class_names)
    decisions["per_case"] = dict(everyone)
    path = postprocess.write(run_dir, decisions, s.net.chosen.record(), s.path,
                             [name for name, _ in everyone])
    return lines(s, decisions, path)
