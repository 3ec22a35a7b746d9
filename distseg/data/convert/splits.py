"""Seeded train/validation splits by case: a held-out share, or k-fold cross-validation."""

from __future__ import annotations

import numpy as np

from distseg.core.errors import InputError
from distseg.data import h5format


def assign(n_cases: int, seed: int, val_fraction: float = 0.2, folds: int = 0,
           fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(split per case, fold per case) for ``n_cases`` cases in their listed order.

    Without ``folds``: ``round(val_fraction * n)`` cases (at least one when there are two
    or more and the fraction is above 0, never all) validate; fold is -1. With ``folds``
    K: a seeded permutation of the cases is cut into K folds whose sizes differ by at
    most one; fold ``fold`` validates, the others train. The same seed gives the same
    folds, so running ``--fold 0`` .. ``--fold K-1`` covers every case exactly once.

    Raises:
      InputError: a fold out of range, or more folds than cases.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_cases)
    split = np.full(n_cases, h5format.SPLITS["train"], dtype=np.uint8)
    fold_of = np.full(n_cases, -1, dtype=np.int16)
    if folds:
        if folds < 2 or folds > n_cases:
            raise InputError(f"--folds {folds}: need 2 <= folds <= the {n_cases} cases")
        if not 0 <= fold < folds:
            raise InputError(f"--fold {fold} is outside 0..{folds - 1}")
        for k, members in enumerate(np.array_split(order, folds)):
            fold_of[members] = k
        split[fold_of == fold] = h5format.SPLITS["val"]
        return split, fold_of
    n_val = round(val_fraction * n_cases)
    if val_fraction > 0 and n_cases >= 2:
        n_val = max(1, n_val)
    n_val = min(n_val, n_cases - 1)
    split[order[:n_val]] = h5format.SPLITS["val"]
    return split, fold_of
