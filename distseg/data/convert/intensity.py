"""Intensity normalisation to [0, 1]: a fixed Hounsfield window for CT, per-volume
percentiles for MR (whose intensities have no absolute scale)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distseg.data.h5format import HU_WINDOW, window

#: Percentiles of an MR volume's non-zero voxels mapped to 0 and 1.
MR_PERCENTILES = (0.5, 99.5)


def modality_kind(name: str) -> str:
    """``ct`` for a CT modality name (as in an MSD dataset.json), else ``mr``."""
    return "ct" if name.strip().upper() == "CT" else "mr"


@dataclass(frozen=True)
class Intensity:
    """How a volume's values become [0, 1]."""

    kind: str
    """``ct``: clip to the HU window ``(low, high)``; ``mr``: clip to the volume's
    ``(low, high)`` percentiles of its non-zero voxels."""
    low: float
    high: float

    @classmethod
    def ct(cls, low: float = HU_WINDOW[0], high: float = HU_WINDOW[1]) -> "Intensity":
        if not high > low:
            raise ValueError(f"window {low},{high}: the high end must be above the low end")
        return cls("ct", float(low), float(high))

    @classmethod
    def mr(cls, low: float = MR_PERCENTILES[0], high: float = MR_PERCENTILES[1]) -> "Intensity":
        return cls("mr", float(low), float(high))

    def bounds(self, voxels) -> tuple[float, float]:
        """The values of a volume (``sources.Voxels``) that map to 0 and 1."""
        if self.kind == "ct":
            return self.low, self.high
        # A strided sample of at most ~4M voxels: percentiles of a whole 50M-voxel
        # volume cost seconds and a sorted copy of it; the sample moves them by < 0.1%.
        flat = voxels.raw.reshape(-1)
        sample = voxels.values(flat[::max(1, flat.size // 4_000_000)])
        nonzero = sample[sample != 0]
        lo, hi = np.percentile(nonzero if nonzero.size else sample, [self.low, self.high])
        hi = hi if hi > lo else lo + 1.0  # a constant volume: avoid dividing by zero
        return float(lo), float(hi)

    def normaliser(self, voxels, bounds: tuple[float, float]):
        """block of ``voxels.raw`` -> its values mapped to [0, 1] float32 (the numbers of
        ``data.window``), for ``geometry.forward`` to apply a block at a time."""
        lo, hi = bounds

        def normalise(block: np.ndarray) -> np.ndarray:
            values = voxels.values(block)
            if values is block or not values.flags.writeable:
                return window(values, lo, hi)
            np.clip(values, lo, hi, out=values)
            values -= np.float32(lo)
            values /= np.float32(hi - lo)
            return values
        return normalise

    def describe(self) -> dict:
        if self.kind == "ct":
            return {"modality": "CT", "intensity": "window", "window": [self.low, self.high]}
        return {"modality": "MR", "intensity": "percentile", "percentiles": [self.low, self.high]}

    @classmethod
    def from_description(cls, d: dict) -> "Intensity":
        if d.get("intensity") == "percentile":
            return cls.mr(*d["percentiles"])
        return cls.ct(*d["window"])
