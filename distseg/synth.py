"""A seeded synthetic liver-CT phantom, for tests and benchmarks.

Each case is a small volume: air around an elliptical body (fat rim, soft tissue), a
vertebra, a liver ellipsoid on the patient's right with a few hypodense spherical
lesions, in Hounsfield units plus Gaussian noise, then windowed to [0, 1] like the real
data. Masks are the exact shapes (0 background, 1 liver, 2 lesion).
"""

from __future__ import annotations

import numpy as np

from distseg import data
from distseg.data import HU_WINDOW, window
from distseg.errors import InputError


def phantom_case(rng: np.random.Generator, size: int, slices: int) -> tuple[np.ndarray, np.ndarray]:
    """One phantom volume: (HU float32 (D, S, S), labels uint8 (D, S, S))."""
    z, y, x = np.meshgrid(np.linspace(-1, 1, slices), np.linspace(-1, 1, size),
                          np.linspace(-1, 1, size), indexing="ij")
    hu = np.full(z.shape, -1000.0, dtype=np.float32)
    labels = np.zeros(z.shape, dtype=np.uint8)

    ax, ay = rng.uniform(0.75, 0.9), rng.uniform(0.55, 0.7)
    body = (x / ax) ** 2 + (y / ay) ** 2
    hu[body <= 1.0] = -90.0                                   # subcutaneous fat
    hu[body <= 0.8] = 40.0                                    # soft tissue
    spine = (x / 0.12) ** 2 + ((y - 0.4 * ay) / 0.12) ** 2 <= 1.0
    hu[spine] = 650.0

    cx, cy, cz = rng.uniform(-0.45, -0.3), rng.uniform(-0.15, 0.05), rng.uniform(-0.2, 0.2)
    rx, ry, rz = rng.uniform(0.25, 0.35), rng.uniform(0.22, 0.3), rng.uniform(0.5, 0.8)
    liver = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 + ((z - cz) / rz) ** 2 <= 1.0
    hu[liver] = rng.uniform(55.0, 70.0)
    labels[liver] = 1

    for _ in range(rng.integers(1, 4)):
        lx = cx + rng.uniform(-0.5, 0.5) * rx
        ly = cy + rng.uniform(-0.5, 0.5) * ry
        lz = cz + rng.uniform(-0.5, 0.5) * rz
        r = rng.uniform(0.06, 0.12)
        lesion = liver & (((x - lx) ** 2 + (y - ly) ** 2 + ((z - lz) * 0.5) ** 2) <= r * r)
        hu[lesion] = rng.uniform(5.0, 25.0)
        labels[lesion] = 2

    hu += rng.normal(0.0, 15.0, size=hu.shape).astype(np.float32)
    return hu, labels


def make_dataset(path: str, cases: int, size: int, seed: int = 0, slices_per_case: int = 16,
                 val_fraction: float = 0.2, dtype: str = "float32") -> data.DatasetInfo:
    """Writes ``cases`` phantom volumes as 2D slices to ``path`` and returns its info.

    The split is by case: ``round(val_fraction * cases)`` whole cases (at least one
    when there are two or more cases) go to validation.

    Raises:
      InputError: a count out of range (also a ``ValueError``).
    """
    if cases < 1 or size < 8 or slices_per_case < 1:
        raise InputError("need cases >= 1, size >= 8 and slices_per_case >= 1")
    rng = np.random.default_rng(seed)
    n_val = min(cases - 1, max(1 if cases >= 2 else 0, round(val_fraction * cases)))
    val_cases = set(rng.choice(cases, size=n_val, replace=False).tolist())
    images, masks, case_ids, splits = [], [], [], []
    for case in range(cases):
        hu, labels = phantom_case(rng, size, slices_per_case)
        images.append(window(hu).astype(dtype))
        masks.append(labels)
        case_ids.append(np.full(slices_per_case, case, dtype=np.int32))
        splits.append(np.full(slices_per_case, data.SPLITS["val" if case in val_cases else "train"],
                              dtype=np.uint8))
    data.write_dataset(
        path, np.concatenate(images)[..., None], np.concatenate(masks),
        np.concatenate(case_ids), np.concatenate(splits),
        source=f"distseg synthetic phantom (seed={seed}, cases={cases}, size={size})",
        hu_window=HU_WINDOW,
        # Nominal geometry: a 350 mm field of view, 5 mm slices.
        spacing=(5.0, 350.0 / size, 350.0 / size))
    return data.inspect(path)
