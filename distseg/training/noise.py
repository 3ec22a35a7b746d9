"""The gradient noise scale of McCandlish et al. 2018 ("An Empirical Model of
Large-Batch Training", Appendix A), measured in every multi-rank run at no extra pass.

Each step gives two squared gradient norms (``steps.make_train_step``): |G_b|^2, the mean
over ranks of each rank's own gradient (a batch of b samples: the small batch), and
|G_B|^2, the averaged gradient (B = N x b: the big batch). Unbiased estimates of the
true gradient's squared norm and of the trace of the per-sample gradient covariance:

    |G|^2     = (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) = (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

each smoothed by an exponential moving average before the ratio
B_simple = tr(Sigma) / |G|^2 is taken (the ratio of two noisy estimates is biased;
the averages are not). B_simple is in samples: the batch size beyond which a larger
batch buys little.

The gradients are the raw ones, not preconditioned by Adam's second moments (AdaptDL's
``AdamGradientNoiseScale`` divides by them). Measured in the step-exact emulation
(docs/statistical-efficiency.md), the preconditioned B_simple predicted the samples of
8 ranks x 8 slices better (1.26x the measured against the raw one's 2.05x), but in a
run's first steps Adam's second moments rest on a handful of gradients, and dividing
by them made the estimate unusable in short runs (|g|^2 of 1e7 at step 2, |G|^2 < 0
for a whole 12-step run), so the log keeps the raw one. On one rank there is one gradient per step, so B = b and
nothing is estimated (``method: none``).

Plain Python: the loop feeds it floats; the log holds its ``record()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The moving averages' decay per step.
DECAY = 0.95
#: The norms are of raw gradients, not divided by Adam's second moments.
PRECONDITIONED = False


@dataclass
class NoiseScale:
    """Moving averages of |G|^2 and tr(Sigma) over the steps of a run."""

    small: int
    """b: samples per rank per step."""
    big: int
    """B: samples per step, all ranks."""
    g2: float | None = None
    trace: float | None = None

    @property
    def method(self) -> str:
        return "ranks" if self.big > self.small else "none"

    def update(self, small_sq: float, big_sq: float) -> None:
        """One step's [mean |g_rank|^2, |g_averaged|^2]; non-finite values are skipped."""
        b, B = self.small, self.big
        if B <= b or not (math.isfinite(small_sq) and math.isfinite(big_sq)):
            return
        g2 = (B * big_sq - b * small_sq) / (B - b)
        trace = (small_sq - big_sq) / (1.0 / b - 1.0 / B)
        self.g2 = g2 if self.g2 is None else DECAY * self.g2 + (1 - DECAY) * g2
        self.trace = trace if self.trace is None else DECAY * self.trace + (1 - DECAY) * trace

    @property
    def b_simple(self) -> float | None:
        """tr(Sigma) / |G|^2 from the averages; None before a step or where |G|^2 <= 0."""
        if self.g2 is None or self.trace is None or self.g2 <= 0:
            return None
        return self.trace / self.g2

    def record(self) -> dict:
        """The ``noise_scale`` field of an ``epoch`` record."""
        return {"b_simple": self.b_simple, "g2": self.g2, "trace": self.trace,
                "small_batch": self.small, "big_batch": self.big, "method": self.method,
                "ema": DECAY, "preconditioned": PRECONDITIONED}
