"""Segmentation metrics of a prediction against the truth, per class: the hard Dice
that training's validation and ``distseg-predict`` report, HD95 and surface Dice.

Dice counts voxels: intersection, predicted and true voxels per class, counts that add
up over batches, cases and ranks (``sample_dice_counts`` per sample and ``dice_counts``
per batch in TensorFlow, for the eval step; ``volume_dice_counts`` in numpy for whole
volumes), and ``dice_from_counts`` turns
them into Dice. The 95th-percentile Hausdorff distance (HD95) and the normalised
surface Dice (NSD, the share of both surfaces within ``tolerance_mm`` of the other) come
from DeepMind's ``surface-distance`` package (Nikolov et al. 2018, the reference NSD
implementation): surfaces are made of surface elements weighted by their area in mm2,
on the voxel spacing of the scan, so anisotropic voxels are measured in mm.

Empty masks, where those functions have no answer (or raise under numpy 2):

* class absent from both truth and prediction: no Dice (``dice_from_counts``' one rule;
  in a ``ClassScore`` every metric is NaN: nothing to score, left out of means);
* absent from exactly one: Dice 0, NSD 0, HD95 infinite.

Plain numpy and scipy (TensorFlow inside ``sample_dice_counts`` and ``dice_counts``
alone); no Horovod.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

#: Default NSD tolerance in mm (about two voxels of a 0.8 mm CT slice in-plane).
TOLERANCE_MM = 2.0
#: Slices of a volume counted at a time (bounds the memory of the numpy forms).
_CHUNK = 16


@dataclass(frozen=True)
class ClassScore:
    dice: float
    hd95: float
    """mm; ``inf`` when one of the masks is empty."""
    nsd: float
    true_voxels: int
    pred_voxels: int


def _surface_distance():
    # The package uses scipy.ndimage.filters / .morphology, which scipy deprecates:
    # silence that here, where the call is ours to vouch for.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from surface_distance import metrics
    return metrics


def dice_from_counts(counts) -> list[float | None]:
    """Per-class hard Dice from summed counts (3, classes): intersection, predicted and
    true voxels. The one rule for an empty class: a class absent from both prediction and
    truth has no Dice, None (null in the logs; ``ClassScore`` holds NaN, for tables)."""
    out = []
    for inter, pred, true in zip(*[list(map(float, row)) for row in counts]):
        out.append(None if pred + true == 0 else 2.0 * inter / (pred + true))
    return out


def dice(truth: np.ndarray, pred: np.ndarray) -> float | None:
    """Hard Dice of two boolean masks (``dice_from_counts`` of their counts)."""
    counts = [[int(np.logical_and(truth, pred).sum())], [int(pred.sum())], [int(truth.sum())]]
    return dice_from_counts(counts)[0]


def sample_dice_counts(probs, masks, num_classes: int):
    """Hard-Dice counts of each sample of a batch in TensorFlow, shape (batch, 3,
    num_classes) float64: per sample, intersection, predicted and true voxels per class
    (what 2D validation adds up per case). TensorFlow is imported here alone, so the
    rest of this module loads without it."""
    import tensorflow as tf
    pred = tf.one_hot(tf.argmax(probs, axis=-1), num_classes, dtype=tf.float64)
    true = tf.one_hot(tf.cast(masks, tf.int32), num_classes, dtype=tf.float64)
    axes = list(range(1, len(probs.shape) - 1))
    return tf.stack([tf.reduce_sum(pred * true, axis=axes), tf.reduce_sum(pred, axis=axes),
                     tf.reduce_sum(true, axis=axes)], axis=1)


def dice_counts(probs, masks, num_classes: int):
    """Hard-Dice counts of a batch in TensorFlow, shape (3, num_classes) float64:
    ``sample_dice_counts`` added up over the batch (whole counts in float64, so the sum
    is exact in any order)."""
    import tensorflow as tf
    return tf.reduce_sum(sample_dice_counts(probs, masks, num_classes), axis=0)


def check_volume(probs: np.ndarray, mask: np.ndarray, num_classes: int) -> None:
    """Raises ``ValueError`` unless ``probs`` (..., C) and ``mask`` (...) match and every
    label is in 0..num_classes-1."""
    if probs.shape[:-1] != mask.shape or probs.shape[-1] != num_classes:
        raise ValueError(f"probabilities {probs.shape} and mask {mask.shape} do not match "
                         f"({num_classes} classes)")
    if mask.size and (int(mask.max()) >= num_classes or int(mask.min()) < 0):
        raise ValueError(f"mask holds label {int(mask.max())}, expected 0..{num_classes - 1}")


def volume_dice_counts(probs: np.ndarray, mask: np.ndarray, num_classes: int) -> np.ndarray:
    """``dice_counts`` of one volume in numpy: the argmax of ``probs`` (..., C) against
    ``mask`` (...), (3, num_classes) float64, counted ``_CHUNK`` slices at a time.

    Raises:
      ValueError: shapes that differ, or a label outside 0..num_classes-1.
    """
    check_volume(probs, mask, num_classes)
    confusion = np.zeros(num_classes * num_classes, dtype=np.int64)
    for z in range(0, mask.shape[0], _CHUNK):
        pred = np.argmax(probs[z:z + _CHUNK], axis=-1).astype(np.int64)
        true = mask[z:z + _CHUNK].astype(np.int64)
        confusion += np.bincount((pred * num_classes + true).ravel(),
                                 minlength=num_classes * num_classes)
    confusion = confusion.reshape(num_classes, num_classes)  # rows predicted, columns true
    return np.stack([np.diag(confusion), confusion.sum(axis=1),
                     confusion.sum(axis=0)]).astype(np.float64)


def score_class(truth: np.ndarray, pred: np.ndarray, spacing_mm, tolerance_mm: float) -> ClassScore:
    """Dice, HD95 (mm) and NSD at ``tolerance_mm`` of two boolean masks of one shape."""
    t, p = int(truth.sum()), int(pred.sum())
    if t == 0 and p == 0:
        return ClassScore(math.nan, math.nan, math.nan, 0, 0)
    if t == 0 or p == 0:
        return ClassScore(0.0, math.inf, 0.0, t, p)
    sd = _surface_distance()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        distances = sd.compute_surface_distances(truth, pred, [float(s) for s in spacing_mm])
    return ClassScore(dice(truth, pred), float(sd.compute_robust_hausdorff(distances, 95)),
                      float(sd.compute_surface_dice_at_tolerance(distances, tolerance_mm)), t, p)


def score_case(truth: np.ndarray, pred: np.ndarray, spacing_mm, num_classes: int,
               tolerance_mm: float = TOLERANCE_MM) -> list[ClassScore]:
    """One ``ClassScore`` per foreground class 1..num_classes-1 of two label volumes.

    Raises:
      ValueError: the volumes differ in shape.
    """
    if truth.shape != pred.shape:
        raise ValueError(f"truth {truth.shape} and prediction {pred.shape} differ in shape")
    return [score_class(truth == c, pred == c, spacing_mm, tolerance_mm)
            for c in range(1, num_classes)]


def mean_scores(rows: list[list[ClassScore]]) -> list[dict]:
    """Per class over cases: mean Dice and NSD (NaN cases left out), mean HD95 over the
    cases where it is finite, and how many cases had an infinite one."""
    out = []
    for c in range(len(rows[0]) if rows else 0):
        col = [r[c] for r in rows]

        def mean(values):
            values = [v for v in values if math.isfinite(v)]
            return float(np.mean(values)) if values else math.nan
        out.append({"dice": mean(s.dice for s in col), "hd95": mean(s.hd95 for s in col),
                    "nsd": mean(s.nsd for s in col),
                    "hd95_infinite": sum(1 for s in col if s.hd95 == math.inf)})
    return out


def foreground_dice(scores: list[ClassScore]) -> float:
    """Mean Dice over the foreground classes a case scores (ranks cases best to worst)."""
    values = [s.dice for s in scores if not math.isnan(s.dice)]
    return float(np.mean(values)) if values else math.nan
