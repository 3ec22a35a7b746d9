"""Segmentation metrics of a predicted label volume against the truth, per class.

Dice counts voxels. The 95th-percentile Hausdorff distance (HD95) and the normalised
surface Dice (NSD, the share of both surfaces within ``tolerance_mm`` of the other) come
from DeepMind's ``surface-distance`` package (Nikolov et al. 2018, the reference NSD
implementation): surfaces are made of surface elements weighted by their area in mm2,
on the voxel spacing of the scan, so anisotropic voxels are measured in mm.

Empty masks, where those functions have no answer (or raise under numpy 2):

* class absent from both truth and prediction: every metric is NaN (nothing to score;
  left out of means);
* absent from exactly one: Dice 0, NSD 0, HD95 infinite.

Plain numpy and scipy: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

#: Default NSD tolerance in mm (about two voxels of a 0.8 mm CT slice in-plane).
TOLERANCE_MM = 2.0


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


def dice(truth: np.ndarray, pred: np.ndarray) -> float:
    """2|T & P| / (|T| + |P|) of boolean masks; NaN when both are empty."""
    total = int(truth.sum()) + int(pred.sum())
    return math.nan if total == 0 else 2.0 * int(np.logical_and(truth, pred).sum()) / total


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
