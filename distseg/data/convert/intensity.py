"""Intensity normalisation, per channel: a fixed Hounsfield window to [0, 1] for CT,
or nnU-Net's CT normalisation by the training foreground's statistics (``--ct-norm
foreground``: clip to its 0.5-99.5 percentiles, z-score by its mean and standard
deviation, the same numbers for every case); for MR (any other modality) per-volume
percentiles to [0, 1], or a per-case z-score.

The rule for which a channel gets is nnU-Net's: a channel named ``CT`` is CT (a fixed,
dataset-wide window, since HU are absolute), anything else has no absolute scale and is
normalised per case. Single-channel MR keeps the percentile mapping distseg has always
used; the channels of a multi-channel file and the nnU-Net raw layout are z-scored, as
nnU-Net does (``distseg.data.convert.pipeline.choose_intensities``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distseg.data.convert import geometry
from distseg.data.h5format import HU_WINDOW, window

#: Percentiles of an MR volume's non-zero voxels mapped to 0 and 1.
MR_PERCENTILES = (0.5, 99.5)
#: Non-CT normalisations (``--mr-norm``): per-volume percentiles or per-case z-score.
MR_NORMS = ("percentile", "zscore")
#: Voxels a volume's statistics are taken from at most (a strided sample).
_SAMPLE = 4_000_000
#: CT normalisations (``--ct-norm``): the fixed HU window, or the training foreground's
#: percentiles and z-score (nnU-Net's ``CTNormalization``).
CT_NORMS = ("window", "foreground")
#: Percentiles of the training foreground's HU that ``foreground`` clips to (nnU-Net's).
FOREGROUND_PERCENTILES = (0.5, 99.5)
#: Foreground voxels drawn per training case for those statistics (nnU-Net's 10,000).
FOREGROUND_VOXELS = 10_000


def foreground_voxels(values: np.ndarray, labels: np.ndarray, seed: int,
                      limit: int = FOREGROUND_VOXELS) -> np.ndarray:
    """Up to ``limit`` of the values where ``labels`` > 0, drawn without replacement by
    a generator of ``seed`` (all of them when there are fewer), float64."""
    held = np.asarray(values)[np.asarray(labels) > 0].astype(np.float64, copy=False)
    if held.size <= limit:
        return held
    return np.random.default_rng(seed).choice(held, limit, replace=False)


def modality_kind(name: str) -> str:
    """``ct`` for a CT modality name (as in an MSD dataset.json or an nnU-Net
    ``channel_names`` value), else ``mr``."""
    return "ct" if name.strip().upper() == "CT" else "mr"


def _nonzero_sample(voxels) -> np.ndarray:
    """Real values of a strided sample of at most ~4M of the volume's voxels, its
    non-zero ones (all of them when every voxel is 0).

    A sample: percentiles of a whole large volume cost seconds and a sorted copy of it,
    and the sample barely moves them (docs/studies/convert-and-compression-2026-11-23.md,
    "Intensity statistics from a sample").
    """
    flat = voxels.raw.reshape(-1)
    sample = voxels.values(flat[::max(1, flat.size // _SAMPLE)])
    nonzero = sample[sample != 0]
    return nonzero if nonzero.size else sample


@dataclass(frozen=True)
class Intensity:
    """How one channel's values are normalised."""

    kind: str
    """``ct``: clip to the HU window ``(low, high)``, map it to [0, 1]; ``mr``: clip to
    the volume's ``(low, high)`` percentiles of its non-zero voxels, map them to
    [0, 1]; ``zscore``: subtract the mean of the case's non-zero voxels and divide by
    their standard deviation, zero voxels (outside a masked or skull-stripped scan)
    staying 0, as the padding of slabs and windows (``low``, ``high`` unused)."""
    low: float
    high: float
    mean: float = 0.0
    """``ct_foreground``: the training foreground's mean HU (what maps to 0)."""
    std: float = 1.0
    """``ct_foreground``: its standard deviation (what one unit is)."""

    @classmethod
    def ct_foreground(cls, samples: np.ndarray) -> "Intensity":
        """nnU-Net's CT normalisation from ``samples``, the training cases' foreground HU
        (``foreground_voxels`` of each): clip to their 0.5 and 99.5 percentiles, then
        subtract their mean and divide by their standard deviation.

        Raises:
          ValueError: no foreground voxel in any training case.
        """
        samples = np.asarray(samples, dtype=np.float64)
        if not samples.size:
            raise ValueError("--ct-norm foreground: no training case holds a foreground voxel")
        low, high = np.percentile(samples, FOREGROUND_PERCENTILES)
        std = float(np.std(samples))
        return cls("ct_foreground", float(low), float(high), float(np.mean(samples)),
                   std if std > 0 else 1.0)

    @classmethod
    def ct(cls, low: float = HU_WINDOW[0], high: float = HU_WINDOW[1]) -> "Intensity":
        if not high > low:
            raise ValueError(f"window {low},{high}: the high end must be above the low end")
        return cls("ct", float(low), float(high))

    @classmethod
    def mr(cls, low: float = MR_PERCENTILES[0], high: float = MR_PERCENTILES[1]) -> "Intensity":
        return cls("mr", float(low), float(high))

    @classmethod
    def zscore(cls) -> "Intensity":
        return cls("zscore", 0.0, 0.0)

    @classmethod
    def of_modality(cls, kind: str, mr_norm: str = "percentile",
                    window: tuple[float, float] | None = None) -> "Intensity":
        """The normalisation of a channel of modality ``kind`` (``ct`` or ``mr``)."""
        if kind == "ct":
            return cls.ct(*window) if window else cls.ct()
        return cls.zscore() if mr_norm == "zscore" else cls.mr()

    @property
    def modality(self) -> str:
        """``ct`` or ``mr`` (z-scored channels are MR)."""
        return "ct" if self.kind in ("ct", "ct_foreground") else "mr"

    def bounds(self, voxels) -> tuple[float, float]:
        """The values of a volume (``sources.Voxels``) that map to 0 and 1: the window,
        the percentiles, or (z-score) the mean and the mean plus one standard deviation
        of the non-zero voxels (``ct_foreground``: of the training foreground, the same
        for every case)."""
        if self.kind == "ct":
            return self.low, self.high
        if self.kind == "ct_foreground":
            return self.mean, self.mean + self.std
        values = _nonzero_sample(voxels)
        if self.kind == "zscore":
            mean, std = float(np.mean(values, dtype=np.float64)), float(np.std(values, dtype=np.float64))
            return mean, mean + (std if std > 0 else 1.0)  # a constant volume: no division by 0
        lo, hi = np.percentile(values, [self.low, self.high])
        hi = hi if hi > lo else lo + 1.0  # a constant volume: avoid dividing by zero
        return float(lo), float(hi)

    def normaliser(self, voxels, bounds: tuple[float, float]):
        """block of ``voxels.raw`` -> its normalised values, float32: ``bounds`` mapped to
        0 and 1, clipped to them for ``ct`` and ``mr`` (the numbers of ``data.window``),
        to the foreground's percentiles first for ``ct_foreground``, zero voxels kept
        at 0 for ``zscore``; for ``geometry.forward`` to apply a block
        at a time."""
        lo, hi = bounds
        clip = {"zscore": None, "ct_foreground": (self.low, self.high)}.get(self.kind, bounds)

        def normalise(block: np.ndarray) -> np.ndarray:
            values = voxels.values(block)
            if values is block or not values.flags.writeable:
                if clip == bounds:
                    return window(values, lo, hi)
                values = values.astype(np.float32, copy=True)
            zero = values == 0 if self.kind == "zscore" else None
            if clip is not None:
                np.clip(values, *clip, out=values)
            values -= np.float32(lo)
            values /= np.float32(hi - lo)
            if zero is not None:
                values[zero] = 0.0
            return values
        return normalise

    def describe(self) -> dict:
        if self.kind == "ct_foreground":
            return {"modality": "CT", "intensity": "foreground", "clip": [self.low, self.high],
                    "mean": self.mean, "std": self.std,
                    "statistics": f"the training cases' foreground HU: clipped to its "
                                  f"{FOREGROUND_PERCENTILES[0]}-{FOREGROUND_PERCENTILES[1]} "
                                  "percentiles, then z-scored by its mean and std"}
        if self.kind == "ct":
            return {"modality": "CT", "intensity": "window", "window": [self.low, self.high]}
        if self.kind == "zscore":
            return {"modality": "MR", "intensity": "zscore",
                    "statistics": "mean and standard deviation of the case's non-zero voxels; "
                                  "zero voxels stay 0"}
        return {"modality": "MR", "intensity": "percentile", "percentiles": [self.low, self.high]}

    @classmethod
    def from_description(cls, d: dict) -> "Intensity":
        if d.get("intensity") == "percentile":
            return cls.mr(*d["percentiles"])
        if d.get("intensity") == "zscore":
            return cls.zscore()
        if d.get("intensity") == "foreground":
            return cls("ct_foreground", *map(float, d["clip"]), float(d["mean"]), float(d["std"]))
        return cls.ct(*d["window"])


def forward_channels(channels, geom, intensities) -> tuple[np.ndarray, np.ndarray]:
    """A case's channels (``sources.Voxels`` each) as the training data holds them,
    and each channel's bounds (C, 2): every channel normalised by its own entry of
    ``intensities`` and laid out and resampled by ``geometry.forward`` on ``geom``.
    The slices are (D', H', W') for one channel, else (D', H', W', C), float32; one
    channel's float copy at a time besides the result. Convert and predict both call it.

    Raises:
      ValueError: not one ``Intensity`` per channel.
    """
    if len(channels) != len(intensities):
        raise ValueError(f"{len(channels)} channel(s) but {len(intensities)} normalisation(s)")
    bounds = np.array([i.bounds(v) for i, v in zip(intensities, channels)], dtype=np.float64)
    out = None
    for c, (intensity, voxels) in enumerate(zip(intensities, channels)):
        one = geometry.forward(voxels.raw, geom, order=1,
                               values=intensity.normaliser(voxels, tuple(bounds[c])))
        if len(channels) == 1:
            return one, bounds
        if out is None:
            out = np.empty(one.shape + (len(channels),), np.float32)
        out[..., c] = one
    return out, bounds
