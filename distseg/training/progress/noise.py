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
The same weights give B_simple's 90 % confidence interval
(``Average.b_simple_interval``) and the measured steps the average is worth
(``effective_steps``), both logged: one step's |G|^2 is a difference of two noisy
norms, so a few dozen measured steps leave B_simple uncertain by tens of percent
(docs/studies/noise-every-2026-11-28.md).

The norms come twice: of the raw gradients, and of the gradients divided by Adam's
bias-corrected sqrt(v) + epsilon (``preconditioned``; the identity in Adam's first
``PRECONDITION_AFTER`` steps, when v rests on a handful of gradients). The
preconditioned one is the noise of the update Adam actually makes; it drives the gain
(``gain``, AdaScale) and the batch policy, and B_simple = tr(Sigma) / |G|^2 of both is
logged.

The norms, and on one rank the halves, cost time (measured in
docs/studies/noise-every-2026-11-28.md), so they are taken every ``k``-th step
(``Cadence``, ``--noise-every``): under ``auto`` the run times both kinds of step and
takes the smallest ``k`` that keeps their extra time within ``COST_SHARE`` of training.
The step is traced once for both kinds (``steps.make_train_step``'s ``noise_mode``).

Plain Python: the loop feeds it floats; the log holds its ``record()``, a checkpoint
its ``state()``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from distseg.core import goodput
from distseg.core.errors import InputError
from distseg.core.stats import t_quantile

#: The moving averages' decay per ``NoiseScale.base`` samples (AdaptDL's smoothing).
DECAY = 0.999
#: The floor of tr(Sigma) when read back (AdaptDL's): the gain stays finite.
TR_SIGMA_FLOOR = 1e-6
#: The two-sided normal quantile of ``Average.b_simple_interval``: a 90 % interval
#: (widened to Student's t for the effective steps, ``t_quantile``).
INTERVAL_Z = 1.6449
#: Effective steps below which no interval is given (t's expansion needs 2 degrees
#: of freedom).
MIN_EFFECTIVE = 3
#: Adam steps before the preconditioner is Adam's own (identity before; AdaptDL's 5).
PRECONDITION_AFTER = 5
#: What ``record()`` and ``state()`` name the two estimators.
KINDS = ("preconditioned", "raw")


@dataclass
class Average:
    """A bias-corrected exponential moving average of |G|^2 and tr(Sigma), and a
    confidence interval of their ratio, B_simple."""

    g2_biased: float = 0.0
    tr_sigma_biased: float = 0.0
    weight: float = 0.0
    """1 - the product of every decay so far: what corrects the bias."""
    squares: tuple[float, ...] | None = (0.0, 0.0, 0.0, 0.0)
    """The same sums with each step's weight squared, of 1, tr(Sigma)^2,
    tr(Sigma) |G|^2 and |G|^4 (``b_simple_interval``); None: not known (an average
    restored from a checkpoint written before they were kept)."""

    def update(self, g2: float, tr_sigma: float, decay: float) -> None:
        self.g2_biased = decay * self.g2_biased + (1 - decay) * g2
        self.tr_sigma_biased = decay * self.tr_sigma_biased + (1 - decay) * tr_sigma
        self.weight = decay * self.weight + (1 - decay)
        if self.squares is not None:
            kept, w = decay * decay, (1 - decay) ** 2
            new = (1.0, tr_sigma * tr_sigma, tr_sigma * g2, g2 * g2)
            self.squares = tuple(kept * old + w * x for old, x in zip(self.squares, new))

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

    @property
    def effective_steps(self) -> float | None:
        """How many equally weighted measured steps the average is worth (Kish's
        effective sample size of its weights); None where not known."""
        if self.squares is None or self.squares[0] <= 0:
            return None
        return self.weight ** 2 / self.squares[0]

    def b_simple_interval(self) -> tuple[float, float | None] | None:
        """The 90 % confidence interval (``INTERVAL_Z``) of B_simple over the steps it
        averages: Fieller's, for a ratio of two weighted means, with each step's
        residual tr(Sigma) - B |G|^2 as its own variance (times n / (n - 1) for ``n``
        effective steps, and Student's t quantile for n - 1 degrees of freedom) and the
        steps' estimates independent (their batches are disjoint).

        Asymmetric where |G|^2 is uncertain; (low, None) where |G|^2 cannot be told
        from 0 at that level, so B_simple has no upper bound. None with fewer than
        ``MIN_EFFECTIVE`` effective steps, without ``b_simple``, or where the spread is
        not known.
        """
        ratio, n = self.b_simple, self.effective_steps
        if ratio is None or n is None or n < MIN_EFFECTIVE or self.g2_biased <= 0:
            return None
        _, tt, tg, gg = self.squares
        z2 = t_quantile(INTERVAL_Z, n - 1) ** 2 * n / (n - 1)
        t, g = self.tr_sigma_biased, self.g2_biased
        # B in the interval <=> a B^2 - 2 b B + c <= 0.
        a, b, c = g * g - z2 * gg, t * g - z2 * tg, t * t - z2 * tt
        disc = b * b - a * c
        if a > 0:  # B_simple itself is inside, so disc >= 0 up to rounding
            root = math.sqrt(max(disc, 0.0))
            return max((b - root) / a, 0.0), (b + root) / a
        # Open above: from the root below B_simple (the larger one when a < 0), or 0.
        low = (b - math.sqrt(disc)) / a if a < 0 and disc > 0 and ratio >= b / a else 0.0
        return max(low, 0.0), None

    def state(self) -> list[float]:
        """What a checkpoint keeps (``restored`` reads it back)."""
        return [self.g2_biased, self.tr_sigma_biased, self.weight, *(self.squares or ())]

    @classmethod
    def restored(cls, values, field_name: str = "noise") -> "Average":
        """The average of ``state()``; a checkpoint's from before the squares were kept
        (3 values) gives an average whose spread is not known. Raises ``InputError``
        naming ``field_name`` (the checkpoint's field) for anything else: every rank
        reads the same checkpoint, so every rank raises it."""
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError):
            got = "something that is not a list of numbers"
        else:
            if len(values) == 3:
                return cls(*values, squares=None)
            if len(values) == 7:
                return cls(*values[:3], squares=tuple(values[3:]))
            got = str(len(values))
        raise InputError(f"field training.{field_name}: expected a list of 3 or 7 numbers "
                         f"(a noise-scale average), got {got}")


def interval_fields(average: Average) -> dict:
    """An ``epoch`` record's ``b_simple_low`` and ``b_simple_high`` (``None``: not known;
    ``b_simple_high`` alone ``None``: no upper bound)."""
    interval = average.b_simple_interval()
    low, high = interval if interval else (None, None)
    return {"b_simple_low": low, "b_simple_high": high}


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

    def update(self, small_sq: float, big_sq: float, small_pre: float, big_pre: float,
               steps: int = 1) -> None:
        """One step's squared norms, raw and preconditioned (``steps.StepResult.grad_sq``),
        standing for ``steps`` steps (``Cadence.every``: the averages decay by the samples
        those steps trained, so their horizon in samples does not depend on the cadence);
        a step with a non-finite one (or none: the first of a one-rank launch) is skipped."""
        values = (small_sq, big_sq, small_pre, big_pre)
        if not all(math.isfinite(v) for v in values):
            return
        count, part = self.count, self.gradient_samples
        decay = DECAY ** (part * count * steps / self.base)
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
                **interval_fields(pre), "effective_steps": pre.effective_steps,
                "b_simple_raw": raw.b_simple, "g2_raw": raw.g2, "tr_sigma_raw": raw.tr_sigma,
                "small_batch": self.gradient_samples, "big_batch": self.big, "base_batch": self.base,
                "method": self.method, "ema": DECAY, "preconditioned": True}

    def state(self) -> dict:
        """What a checkpoint keeps, so ``--resume`` continues the averages exactly."""
        return {k: a.state() for k, a in self.averages.items()}

    def restore(self, state: dict | None) -> None:
        """Continues from ``state()`` (None or a state of other kinds: from scratch)."""
        averages = self.averages_of(state)
        if averages:
            self.averages = averages

    @staticmethod
    def averages_of(state) -> dict | None:
        """The averages of a checkpoint's ``state()`` (None: none, or of other kinds).
        Raises ``InputError`` for an average it cannot read; the checkpoint's manifest
        is read through it, so such an average makes a damaged checkpoint (skipped for
        an older one, as a file that fails its checksum is) before anything is written."""
        if not isinstance(state, dict) or set(state) != set(KINDS):
            return None
        return {k: Average.restored(v, f"noise.{k}") for k, v in state.items()}


#: What a step does for the noise scale (``steps.make_train_step``'s ``noise_mode``):
#: nothing, keep its gradient for the next step's estimate (one rank without halves:
#: the difference estimator), or measure.
SKIP, KEEP, MEASURE = 0, 1, 2
#: ``--noise-every auto``: the measured steps' extra time, at most this share of the
#: training time.
COST_SHARE = 0.01
#: ``auto``'s cadence until both kinds of step are timed: every 4th step measures.
FIRST_EVERY = 4
#: Timed steps of each kind ``auto`` decides from (a launch's first step, which traces,
#: is not timed).
TIMED_EACH = 2
#: The longest cadence ``auto`` takes, whatever the cost: the batch policy and the gain
#: rule still see an estimate every so many steps.
MOST_EVERY = 64


def mode_of(global_step: int, every: int) -> int:
    """What step ``global_step`` does under a cadence of ``every``: ``MEASURE`` on every
    ``every``-th step, ``KEEP`` on the step before (the difference estimator's first
    gradient), else ``SKIP``."""
    if global_step % every == 0:
        return MEASURE
    return KEEP if (global_step + 1) % every == 0 else SKIP


def every_for(measured_s: float, plain_s: float, share: float = COST_SHARE) -> int:
    """The smallest cadence whose measured steps cost at most ``share`` of training:
    (measured_s - plain_s) / every <= share * plain_s, within 1 and ``MOST_EVERY``."""
    extra = max(measured_s - plain_s, 0.0)
    if plain_s <= 0 or extra == 0:
        return 1
    return min(max(math.ceil(extra / (share * plain_s)), 1), MOST_EVERY)


@dataclass
class Cadence:
    """Which steps take the noise scale's norms (and halves): every ``every``-th one. A
    fixed ``--noise-every K`` stays; ``auto`` measures every step where the estimate
    ``steers`` training, else starts at ``FIRST_EVERY``, times both
    kinds of step, and once it has ``TIMED_EACH`` of each, takes ``every_for`` of rank
    0's medians (``decide``; every rank has timed the same steps, so every rank is ready
    at the same epoch's end and takes the same cadence)."""

    every: int
    auto: bool = False
    steers: bool = False
    """The estimate steers training (the ``gain`` and ``adascale`` lr rules, the
    ``goodput`` policy): ``auto`` then measures every step and decides nothing, so the
    lr and batch follow each step's estimate and no timing changes them."""
    decision: dict | None = None
    """Under ``auto``, once decided: every, measured_s, plain_s (median step seconds of
    each kind), share (the measured steps' extra time at that cadence, as a share of
    training), global_step (where it was decided)."""
    timed: dict = field(default_factory=lambda: {MEASURE: [], SKIP: []})

    @classmethod
    def of(cls, noise_every: int, steers: bool = False) -> "Cadence":
        """The cadence of ``train.noise_every`` (0: auto) for a run whose estimate
        ``steers`` its lr or batch, or not."""
        if noise_every:
            return cls(noise_every, steers=steers)
        return cls(1 if steers else FIRST_EVERY, auto=True, steers=steers)

    def mode(self, global_step: int) -> int:
        return mode_of(global_step, self.every)

    @property
    def usual_mode(self) -> int:
        """What most of the run's steps do: ``MEASURE`` where every step measures, else
        ``SKIP`` (``auto`` settles on a cadence of several steps unless it steers). The
        kind of step a trial times (``timedsteps.timed_step``)."""
        return MEASURE if self.every == 1 else SKIP

    def observe(self, mode: int, seconds: float | None) -> None:
        """One step's kind and time (None: not timed, e.g. a step that traced)."""
        if self.auto and not self.steers and self.decision is None and seconds is not None:
            self.timed[MEASURE if mode == MEASURE else SKIP].append(seconds)

    @property
    def ready(self) -> bool:
        """Whether ``auto`` has what it decides from and has not decided yet."""
        return (self.auto and not self.steers and self.decision is None
                and min(len(t) for t in self.timed.values()) >= TIMED_EACH)

    def medians(self) -> tuple[float, float]:
        """(measured, plain) median step seconds on this rank."""
        return (statistics.median(self.timed[MEASURE]), statistics.median(self.timed[SKIP]))

    def decide(self, measured_s: float, plain_s: float, global_step: int) -> dict:
        """Takes ``every_for`` of rank 0's medians; returns the decision."""
        self.every = every_for(measured_s, plain_s)
        extra = max(measured_s - plain_s, 0.0)
        self.decision = {"every": self.every, "measured_s": measured_s, "plain_s": plain_s,
                         "share": extra / self.every / plain_s if plain_s > 0 else 0.0,
                         "global_step": global_step}
        self.timed = {MEASURE: [], SKIP: []}
        return self.decision

    def said(self) -> str:
        """Rank 0's console line on the decision ``decide`` took."""
        d = self.decision
        return (f"noise scale: measured every {d['every']} step(s) from step "
                f"{d['global_step']} (a measuring step {d['measured_s'] * 1e3:.0f} ms, another "
                f"{d['plain_s'] * 1e3:.0f} ms: {d['share']:.1%} of training)")

    def record(self) -> dict:
        """The ``noise_scale`` record's ``cadence``: every (in force), auto, decision;
        also what a checkpoint keeps (``restore``)."""
        return {"every": self.every, "auto": self.auto, "steers": self.steers,
                "decision": self.decision}

    def restore(self, kept: dict | None) -> None:
        """Under ``auto``, a checkpoint's decided cadence (``record()``): a resumed run
        measures the steps the uninterrupted run measures, and does not decide again. A
        fixed ``--noise-every`` stays as given."""
        if self.auto and kept and kept.get("auto") and kept.get("decision"):
            self.every, self.decision = int(kept["every"]), dict(kept["decision"])
