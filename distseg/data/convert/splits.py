"""Seeded train/validation splits by case: a held-out share, or k-fold cross-validation."""

from __future__ import annotations

import numpy as np

from distseg.core.errors import InputError
from distseg.data import folds as data_folds
from distseg.data import h5format


def assign(n_cases: int, seed: int, val_fraction: float = 0.2, folds: int = 0,
           fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(split per case, fold per case) for ``n_cases`` cases in their listed order.

    Without ``folds``: ``round(val_fraction * n)`` cases (at least one when there are two
    or more and the fraction is above 0, never all) validate; fold is -1. With ``folds``
    K: a seeded permutation of the cases is cut into K folds whose sizes differ by at
    most one (``folds.draw``); fold ``fold`` validates, the others train. The same seed gives the same
    folds, so running ``--fold 0`` .. ``--fold K-1`` covers every case exactly once.

    Raises:
      InputError: a fold out of range, or more folds than cases.
    """
    split = np.full(n_cases, h5format.SPLITS["train"], dtype=np.uint8)
    fold_of = np.full(n_cases, -1, dtype=np.int16)
    if folds:
        if not 0 <= fold < folds:
            raise InputError(f"--fold {fold} is outside 0..{folds - 1}")
        fold_of = data_folds.draw(n_cases, folds, seed).astype(np.int16)
        split[fold_of == fold] = h5format.SPLITS["val"]
        return split, fold_of
    n_val = round(val_fraction * n_cases)
    if val_fraction > 0 and n_cases >= 2:
        n_val = max(1, n_val)
    n_val = min(n_val, n_cases - 1)
    order = np.random.default_rng(seed).permutation(n_cases)
    split[order[:n_val]] = h5format.SPLITS["val"]
    return split, fold_of
