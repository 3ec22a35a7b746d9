"""Test-time mirroring and largest-connected-component post-processing, as nnU-Net does
them, and the decisions that say where each helps (``RUN/postprocessing.json``).

* **Mirroring** (``mirrored``): the network sees each window as it is and flipped along
  every combination of its spatial axes (``mirror_axes``: the two in-plane axes of a
  2D run's slice, all three of a 3D window: 4 or 8 passes); each output is flipped back
  along the same axes and the softmax probabilities are averaged. The sliding-window
  inferer then blends these windows as it blends plain ones.
* **Largest component** (``keep_largest``): for each chosen class, only its largest
  connected component is kept (full connectivity: 8 neighbours in 2D, 26 in 3D, as
  nnU-Net v2 labels), the rest becomes background. It runs on whole case volumes: a
  2D run's slices of a case are stacked first, so a liver cut into slices is still one
  component.
* **Decisions** (``decide``): ``distseg-predict --decide`` (``inference.decide``)
  scores the run's validation cases plain and mirrored, and each foreground class with
  and without its largest component; ``decide`` turns those per-case Dice into what to
  apply: mirroring when it raises the mean foreground Dice, and the largest component
  for each class whose mean Dice it raises (``core.postchoice``, the rule the
  out-of-fold configurations share; on the mirrored or plain prediction, whichever
  was chosen). ``choose`` reads them back for ``distseg-predict``, which
  applies each only where the file says it helps, for the checkpoint it was decided on.

Plain numpy and scipy; no TensorFlow, no Horovod.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from distseg import metrics
from distseg.core import partial, postchoice, rundir
from distseg.core.errors import InputError

FORMAT = "distseg-postprocessing"
FORMAT_VERSION = 1
#: The prediction each decision row scores: plain, mirrored, and each with the
#: largest component of one class kept (``_lcc``).
KINDS = ("plain", "mirror", "plain_lcc", "mirror_lcc")


# ------------------------------------------------------------------ mirroring


def flip_sets(axes: Sequence[int]) -> list[tuple[int, ...]]:
    """Every combination of ``axes`` to flip along, the empty one (as is) first."""
    axes = tuple(axes)
    return [c for n in range(len(axes) + 1) for c in itertools.combinations(axes, n)]


def mirror_axes(window: Sequence[int]) -> tuple[int, ...]:
    """The axes of a (B, d, h, w, C) window batch to mirror: the slice's two axes for a
    2D run's windows of depth 1, all three spatial axes of a 3D window."""
    return (2, 3) if int(window[0]) == 1 else (1, 2, 3)


def mirrored(predict: Callable[[np.ndarray], np.ndarray],
             axes: Sequence[int]) -> Callable[[np.ndarray], np.ndarray]:
    """``predict`` with test-time mirroring: the mean over ``flip_sets(axes)`` of the
    output of the input flipped along those axes, flipped back along the same axes (so
    each output voxel is the network's answer for that voxel)."""
    sets = flip_sets(axes)

    def run(x: np.ndarray) -> np.ndarray:
        total = None
        for flip in sets:
            seen = np.ascontiguousarray(np.flip(x, flip)) if flip else x
            out = np.asarray(predict(seen), dtype=np.float64)
            out = np.flip(out, flip) if flip else out
            total = out.copy() if total is None else total + out
        return (total / len(sets)).astype(np.float32)
    return run


# ------------------------------------------------------------ largest component


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest connected component of a boolean mask, full connectivity (ties: the
    first in scan order); an empty mask stays empty."""
    from scipy import ndimage
    labels, count = ndimage.label(mask, structure=np.ones((3,) * mask.ndim, bool))
    if count <= 1:
        return mask.astype(bool, copy=True)
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(np.argmax(sizes))


def keep_largest(seg: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """A copy of label volume ``seg`` where each of ``classes`` keeps only its largest
    connected component; the voxels removed become background (0)."""
    out = np.array(seg, copy=True)
    for c in classes:
        mask = out == c
        if mask.any():
            out[mask & ~largest_component(mask)] = 0
    return out


# ----------------------------------------------------------------- the decision


def case_row(truth: np.ndarray, plain: np.ndarray, mirror: np.ndarray,
             num_classes: int) -> dict:
    """One validation case's Dice per foreground class for each of ``KINDS``
    (``*_lcc``: that class alone reduced to its largest component; the other classes
    are untouched by it, so their Dice does not change)."""
    row = {}
    for kind, seg in (("plain", plain), ("mirror", mirror)):
        row[kind] = [metrics.dice(truth == c, seg == c) for c in range(1, num_classes)]
        row[f"{kind}_lcc"] = [metrics.dice(truth == c, largest_component(seg == c))
                              for c in range(1, num_classes)]
    return row


def _means(rows: list[dict], kind: str, classes: int) -> list[float | None]:
    """Per foreground class, the mean Dice over the cases that have one
    (``postchoice.class_mean``)."""
    return [postchoice.class_mean(r[kind][c] for r in rows) for c in range(classes)]


def decide(rows: list[dict], class_names: Sequence[str]) -> dict:
    """The decisions from every validation case's ``case_row`` by the rules of
    ``postchoice``: mirroring where it raises the mean foreground Dice, then, on the
    prediction so chosen, the largest component of each class whose mean Dice it
    raises. Every number behind a decision is kept beside it."""
    names = list(class_names)[1:]
    plain, mirror = _means(rows, "plain", len(names)), _means(rows, "mirror", len(names))
    chosen = postchoice.mirroring(plain, mirror)
    on = "mirror" if chosen["apply"] else "plain"
    without, with_ = _means(rows, on, len(names)), _means(rows, f"{on}_lcc", len(names))
    return {
        "mirror": {**chosen, "classes_plain": dict(zip(names, plain)),
                   "classes_mirror": dict(zip(names, mirror))},
        "largest_component": {"on": on, "classes": postchoice.largest_component(names, without, with_)},
    }


def write(run_dir: str, decisions: dict, checkpoint: dict, data: str, cases: list[str]) -> str:
    """Writes ``RUN/postprocessing.json`` (through a temporary file) and returns its path."""
    path = rundir.postprocessing_path(run_dir)
    partial.write_json(path, {"format": FORMAT, "format_version": FORMAT_VERSION,
                              "checkpoint": checkpoint, "data": data, "cases": cases,
                              "connectivity": "full (8 neighbours in 2D, 26 in 3D)",
                              **decisions})
    return path


# ------------------------------------------------------------ what predict applies


@dataclass(frozen=True)
class Applied:
    """What ``distseg-predict`` applies, and the words that say so."""

    mirror: bool = False
    largest: tuple[int, ...] = ()
    """Classes (ids) reduced to their largest connected component."""
    words: str = "no test-time mirroring, no post-processing"
    warnings: tuple[str, ...] = field(default_factory=tuple)


def read(run_dir: str) -> dict | None:
    """``RUN/postprocessing.json`` (None: the run has none).

    Raises:
      InputError: not JSON, or without ``checkpoint.stem``, ``mirror.apply`` or
        ``largest_component.classes``.
    """
    path = rundir.postprocessing_path(run_dir)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        missing = [f"{key}.{inner}" for key, inner in (("checkpoint", "stem"), ("mirror", "apply"),
                                                       ("largest_component", "classes"))
                   if not isinstance(doc.get(key), dict) or inner not in doc[key]]
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a post-processing decisions file ({type(e).__name__}: "
                         f"{e}); expected checkpoint.stem, mirror.apply and "
                         "largest_component.classes") from e
    return doc


def from_decisions(doc: dict, class_names: Sequence[str], tta: str, postprocess: str) -> Applied:
    """What ``doc`` (for this checkpoint) says, with the flags' overrides."""
    m = doc["mirror"]
    mirror = m["apply"] if tta == "auto" else tta == "mirror"
    said = f"mirroring {'on' if mirror else 'off'} ({_mirror_basis(m, tta)})"
    classes = doc["largest_component"]["classes"]
    largest, parts = [], []
    for c, name in enumerate(class_names):
        d = classes.get(name)
        if c == 0 or d is None or postprocess == "none":
            continue
        if d["apply"]:
            largest.append(c)
        parts.append(f"{name} {'yes' if d['apply'] else 'no'} ({number(d.get('dice_without'))}"
                     f" -> {number(d.get('dice_with'))})")
    lcc = (f"largest component: {', '.join(parts)}" if parts else
           "largest component: none (--postprocess none)" if postprocess == "none" else
           "largest component: none")
    return Applied(bool(mirror), tuple(largest), f"{said}; {lcc}")


def _mirror_basis(m: dict, tta: str) -> str:
    """Why mirroring is on or off, in a few words: the flag, the one pass an old
    out-of-fold file was predicted with, its not being scored, or the two Dice."""
    if tta != "auto":
        return f"--tta {tta}"
    if m.get("as_scored"):
        return "as the out-of-fold pass predicted"
    basis = m.get("basis", "validation Dice")
    if m.get("scored") is False:
        return f"not scored: no {basis} of it (--tta none)"
    forced = "; --tta mirror when scored" if m.get("forced") else ""
    return (f"{basis} {number(m.get('dice_plain'))} plain, {number(m.get('dice_mirror'))} "
            f"mirrored{forced}")


def number(value) -> str:
    """A Dice for a line: 4 decimals, or n/a."""
    return "n/a" if value is None else f"{value:.4f}"


def choose(run_dir: str, class_names: Sequence[str], stem: str, tta: str = "auto",
           postprocess: str = "auto") -> Applied:
    """What to apply with checkpoint ``stem``: ``postprocessing.json``'s decisions when
    they were made for that checkpoint, overridden by ``--tta mirror|none`` and
    ``--postprocess none``. Without a file for it (none, damaged, or decided on another
    checkpoint), ``auto`` applies nothing and says why."""
    path = rundir.postprocessing_path(run_dir)
    try:
        doc = read(run_dir)
    except InputError as e:
        doc, warnings = None, (f"{e}; nothing applied from it",)
    else:
        warnings = ()
    if doc is not None and doc["checkpoint"]["stem"] == stem:
        return from_decisions(doc, class_names, tta, postprocess)
    if doc is not None:
        why = (f"{path} was decided on {doc['checkpoint']['stem']}, not {stem}: nothing "
               "applied from it (run --decide again)")
    else:
        why = (f"no decisions for {stem} ({path}: run distseg-predict --checkpoint "
               f"{run_dir} --decide)" if not warnings else "")
    mirror = tta == "mirror"
    words = f"mirroring {'on (--tta mirror)' if mirror else 'off'}; largest component: none"
    return Applied(mirror, (), words + (f"; {why}" if why else ""), warnings)


# ------------------------------------------------------------------ an ensemble


def member_rows(run_dir: str, stem: str, classes: int) -> tuple[list[dict], str | None]:
    """(every validation case's row, None) from ``RUN/postprocessing.json`` when it was
    decided on checkpoint ``stem`` and keeps its per-case rows; else ([], why not)."""
    path = rundir.postprocessing_path(run_dir)
    try:
        doc = read(run_dir)
    except InputError as e:
        return [], str(e)
    if doc is None:
        return [], f"{run_dir} has no decisions (run distseg-predict --checkpoint {run_dir} --decide)"
    if doc["checkpoint"]["stem"] != stem:
        return [], (f"{path} was decided on {doc['checkpoint']['stem']}, not {stem} "
                    "(run --decide again)")
    rows = list((doc.get("per_case") or {}).values())
    if not rows or any(not isinstance(r, dict) or any(len(r.get(k) or ()) != classes - 1 for k in KINDS)
                       for r in rows):
        return [], f"{path}: per_case has no rows of {', '.join(KINDS)} per class (run --decide again)"
    return rows, None


def choose_pooled(members: Sequence[tuple[str, str]], class_names: Sequence[str],
                  tta: str = "auto", postprocess: str = "auto") -> Applied:
    """What an ensemble of ``members`` ((run directory, checkpoint stem) each) applies:
    ``decide`` on every member's validation rows pooled. Each member's ``--decide``
    scored its own validation cases, so for the folds of one cross-validation the pool
    is the out-of-fold prediction of every case, on which nnU-Net decides its
    post-processing for the ensemble of its folds. ``--tta`` and ``--postprocess``
    override as for one run. A member without usable rows for its checkpoint makes
    ``auto`` apply nothing, and the words say which and why."""
    rows, why = [], None
    for run_dir, stem in members:
        found, why = member_rows(run_dir, stem, len(class_names))
        if why:
            break
        rows += found
    if why is None:
        applied = from_decisions(decide(rows, class_names), class_names, tta, postprocess)
        return dataclasses.replace(applied, words=(
            f"{applied.words}; decided on the {len(rows)} validation case(s) of the "
            f"{len(members)} member(s), pooled"))
    mirror = tta == "mirror"
    words = f"mirroring {'on (--tta mirror)' if mirror else 'off'}; largest component: none"
    return Applied(mirror, (), f"{words}; no decisions for the ensemble: {why}")
