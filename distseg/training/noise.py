"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", Appendix A), measured in every run at no extra pass, as AdaptDL measures it
for Adam.

Each step gives two squared gradient norms (``steps.make_train_step``): |G_b|^2, the mean
over ``count`` gradients of b samples each (one per rank), and |G_B|^2, the norm of their
average (B = count x b). Unbiased estimates of the true gradient's squared norm and of
the trace of the per-sample gradient covariance:

    |G|^2     = (count |G_B|^2 - |G_b|^2) / (count - 1)
    tr(Sigma) = (|G_b|^2 - |G_B|^2) b count / (count - 1)

On one rank the step takes its gradient as two halves of its batch, each its own
forward and backward pass, exactly as two ranks of half the batch would (method
``halves``, ``steps.can_halve``): b is half the batch and ``count`` 2, at no extra pass.
Where the model does not allow that (BatchNorm over the whole batch, an odd batch), the
previous step's gradient is the second (AdaptDL's difference estimator; method
``consecutive``). Its two gradients were taken at weights one update apart, which biases
tr(Sigma) up by the change of the true gradient: on the demo's runs it read several
times the two-rank estimate (docs/studies/noise-halves-2026-11-26.md); the first step of a launch
has no previous gradient and estimates nothing.

Both are smoothed separately (the ratio of two noisy estimates is biased; the averages
are not) by a bias-corrected exponential moving average whose decay is tied to the
samples a step covers: ``DECAY`` per ``base`` samples, so a step of B samples decays
by DECAY^(B / base) (AdaptDL: 0.999 per initial batch). Read back, |G|^2 is clipped at
0 and tr(Sigma) at ``TR_SIGMA_FLOOR``; a step whose norms are not finite is skipped.

The norms come twice: of the raw gradients, and of the gradients divided by Adam's
bias-corrected sqrt(v) + epsilon (``preconditioned``; the identity in Adam's first
``PRECONDITION_AFTER`` steps, when v rests on a handful of gradients). The
preconditioned one is the noise of the update Adam actually makes; it drives the gain
(``gain``, AdaScale) and the batch policy, and B_simple = tr(Sigma) / |G|^2 of both is
logged.

Plain Python: the loop feeds it floats; the log holds its ``record()``, a checkpoint
its ``state()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distseg.core import goodput

#: The moving averages' decay per ``NoiseScale.base`` samples (AdaptDL's smoothing).
DECAY = 0.999
#: The floor of tr(Sigma) when read back (AdaptDL's): the gain stays finite.
TR_SIGMA_FLOOR = 1e-6
#: Adam steps before the preconditioner is Adam's own (identity before; AdaptDL's 5).
PRECONDITION_AFTER = 5
#: What ``record()`` and ``state()`` name the two estimators.
KINDS = ("preconditioned", "raw")


@dataclass
class Average:
    """A bias-corrected exponential moving average of |G|^2 and tr(Sigma)."""

    g2_biased: float = 0.0
    tr_sigma_biased: float = 0.0
    weight: float = 0.0
    """1 - the product of every decay so far: what corrects the bias."""

    def update(self, g2: float, tr_sigma: float, decay: float) -> None:
        self.g2_biased = decay * self.g2_biased + (1 - decay) * g2
        self.tr_sigma_biased = decay * self.tr_sigma_biased + (1 - decay) * tr_sigma
        self.weight = decay * self.weight + (1 - decay)

    @property
    def g2(self) -> float | None:
        """|G|^2, clipped at 0; None before any step."""
        return max(self.g2_biased / self.weight, 0.0) if self.weight else None

    @property
    def tr_sigma(self) -> float | None:
        """tr(Sigma) per sample, at least ``TR_SIGMA_FLOOR``; None before any step."""
        return max(self.tr_sigma_biased / self.weight, TR_SIGMA_FLOOR) if self.weight else None

    @property
    def b_simple(self) -> float | None:
        """tr(Sigma) / |G|^2 in samples; None before a step or while |G|^2 is 0."""
        if self.weight == 0 or self.g2 == 0:
            return None
        return self.tr_sigma / self.g2


def estimates(small_sq: float, big_sq: float, small: int, count: int) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) of one step: ``count`` gradients of ``small`` samples whose
    squared norms average ``small_sq`` and whose average has squared norm ``big_sq``."""
    g2 = (count * big_sq - small_sq) / (count - 1)
    tr_sigma = (small_sq - big_sq) * small * count / (count - 1)
    return g2, tr_sigma


@dataclass
class NoiseScale:
    """The two estimators' moving averages over the steps of a run."""

    small: int
    """b: samples per rank per step."""
    big: int
    """B: samples per step, all ranks."""
    base: int
    """The batch the lr was set for (the gain's base; the decay's unit of samples)."""
    averages: dict = field(default_factory=lambda: {k: Average() for k in KINDS})
    gradients_per_rank: int = 1
    """Gradients each rank's step gives (the train step's ``gradients_per_rank``: 2 when
    one rank takes its batch as two halves)."""

    @property
    def gradient_samples(self) -> int:
        """Samples behind each of the small gradients."""
        return max(self.small // self.gradients_per_rank, 1)

    @property
    def count(self) -> int:
        """Gradients per estimate: one per rank (or half), or this step's and the
        previous one."""
        return max(self.big // self.gradient_samples, 1) if self.big > self.gradient_samples else 2

    @property
    def method(self) -> str:
        if self.big > self.small:
            return "ranks"
        return "halves" if self.gradients_per_rank > 1 else "consecutive"

    def update(self, small_sq: float, big_sq: float, small_pre: float, big_pre: float) -> None:
        """One step's squared norms, raw and preconditioned (``steps.StepResult.grad_sq``);
        a step with a non-finite one (or none: the first of a one-rank launch) is skipped."""
        values = (small_sq, big_sq, small_pre, big_pre)
        if not all(math.isfinite(v) for v in values):
            return
        count, part = self.count, self.gradient_samples
        decay = DECAY ** (part * count / self.base)
        for kind, (s, b) in zip(KINDS, ((small_pre, big_pre), (small_sq, big_sq))):
            self.averages[kind].update(*estimates(s, b, part, count), decay)

    @property
    def b_simple(self) -> float | None:
        """The preconditioned B_simple (samples)."""
        return self.averages["preconditioned"].b_simple

    def gain(self, batch: float) -> float:
        """AdaScale's gain of a step of ``batch`` samples over one of ``base``
        (``goodput.gain``), from the preconditioned averages; 1 before any estimate.
        Between 1 and batch/base: the progress a step of ``batch`` samples makes, in
        steps of ``base``."""
        avg = self.averages["preconditioned"]
        return goodput.gain(batch, self.base, avg.g2, avg.tr_sigma)

    def resize(self, small: int, big: int) -> None:
        """A new batch (the ``goodput`` policy's): the averages, per sample, carry on."""
        self.small, self.big = small, big

    def record(self) -> dict:
        """The ``noise_scale`` field of an ``epoch`` record: the preconditioned estimate
        (``b_simple``, ``g2``, ``tr_sigma``) and the raw one (``*_raw``)."""
        pre, raw = self.averages["preconditioned"], self.averages["raw"]
        return {"b_simple": pre.b_simple, "g2": pre.g2, "tr_sigma": pre.tr_sigma,
                "b_simple_raw": raw.b_simple, "g2_raw": raw.g2, "tr_sigma_raw": raw.tr_sigma,
                "small_batch": self.gradient_samples, "big_batch": self.big, "base_batch": self.base,
                "method": self.method, "ema": DECAY, "preconditioned": True}

    def state(self) -> dict:
        """What a checkpoint keeps, so ``--resume`` continues the averages exactly."""
        return {k: [a.g2_biased, a.tr_sigma_biased, a.weight] for k, a in self.averages.items()}

    def restore(self, state: dict | None) -> None:
        """Continues from ``state()`` (None or a state of other kinds: from scratch)."""
        if state and set(state) == set(KINDS):
            self.averages = {k: Average(*map(float, v)) for k, v in state.items()}
