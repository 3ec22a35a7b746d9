"""Goodput: samples per second times the progress each sample makes (Pollux, Qiao et al.,
OSDI 2021), the quantity the ``goodput`` batch policy maximises and the report projects.

    goodput(b) = throughput(b) x efficiency(B),   B = b x ranks

``throughput`` comes from a step-time model fitted to measured steps (``StepTimes``), or
from any callable giving the seconds of a step at a per-rank batch; ``efficiency`` is
the progress per sample of a step of B samples relative to one of the base batch B0,
from the gradient noise scale (``distseg.training.progress.noise``): AdaScale's gain

    gain(B) = (tr / B0 + |G|^2) / (tr / B + |G|^2)

divided by B / B0, that is (phi + B0) / (phi + B) with phi = tr(Sigma) / |G|^2.

Plain Python on purpose: the training loop, ``distseg-report --project-nodes`` and the
large-batch study use these same definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: The least predicted goodput gain that makes the policy switch batch (AdaptDL's 5 %:
#: below it, the batch thrashed between two sizes of nearly equal goodput).
SWITCH_GAIN = 0.05


def gain(batch: float, base: float, g2: float | None, tr_sigma: float | None) -> float:
    """AdaScale's gain of a step of ``batch`` samples over one of ``base``: between 1 and
    ``batch / base``; 1 before any estimate (``g2`` or ``tr_sigma`` None)."""
    if g2 is None or tr_sigma is None or batch <= base:
        return 1.0 if batch >= base else batch / base
    return (tr_sigma / base + g2) / (tr_sigma / batch + g2)


def efficiency(batch: float, base: float, g2: float | None, tr_sigma: float | None) -> float:
    """Progress per sample of a step of ``batch`` samples, relative to ``base``: 1 at
    ``base``, falling towards ``base / batch`` as the batch outgrows the noise scale."""
    return gain(batch, base, g2, tr_sigma) * base / batch


@dataclass
class StepTimes:
    """Measured seconds per step at each per-rank batch, and the linear model
    t(b) = alpha + beta b fitted to them (Pollux's compute model; the allreduce, the same
    for every b at a given number of ranks, is part of alpha)."""

    sums: dict = field(default_factory=dict)
    """Per-rank batch -> [steps, total seconds]."""

    def add(self, per_rank: int, seconds: float) -> None:
        entry = self.sums.setdefault(int(per_rank), [0, 0.0])
        entry[0] += 1
        entry[1] += float(seconds)

    def means(self) -> dict[int, float]:
        return {b: total / n for b, (n, total) in sorted(self.sums.items()) if n}

    def fit(self) -> tuple[float, float] | None:
        """(alpha, beta) of t(b) = alpha + beta b, both >= 0; None before any step.

        One batch measured: alpha is half its step time (AdaptDL's prior when a single
        batch size was seen: optimistic about larger batches, so the policy tries one
        and then measures it). Several: least squares over their means; a negative
        alpha (noise) is refitted through the origin."""
        means = self.means()
        if not means:
            return None
        if len(means) == 1:
            (b, t), = means.items()
            return t / 2, t / (2 * b)
        bs, ts = list(means), list(means.values())
        mb, mt = sum(bs) / len(bs), sum(ts) / len(ts)
        sxx = sum((b - mb) ** 2 for b in bs)
        beta = sum((b - mb) * (t - mt) for b, t in zip(bs, ts)) / sxx
        alpha = mt - beta * mb
        if alpha < 0 or beta <= 0:
            alpha, beta = 0.0, sum(b * t for b, t in zip(bs, ts)) / sum(b * b for b in bs)
        return alpha, beta

    def seconds(self, per_rank: int) -> float | None:
        """The model's seconds per step at ``per_rank``; None before any step."""
        params = self.fit()
        return None if params is None else params[0] + params[1] * per_rank

    def state(self) -> dict:
        return {str(b): list(v) for b, v in self.sums.items()}

    @classmethod
    def restore(cls, state: dict | None) -> "StepTimes":
        return cls({int(b): [int(v[0]), float(v[1])] for b, v in (state or {}).items()})


def candidates(ranks: int, base: int, largest: int) -> list[int]:
    """The per-rank batches the policy chooses from: powers of two up to ``largest``
    whose global batch is at least ``base`` (the batch the lr was set for: AdaptDL's
    rule, a batch below it would need a smaller lr than the one tuned), and the
    smallest per-rank batch that reaches ``base`` when no power of two does exactly."""
    least = -(-base // ranks)  # ceil
    out = {least}
    b = 1
    while b <= largest:
        if b >= least:
            out.add(b)
        b *= 2
    return sorted(x for x in out if x <= max(largest, least))


@dataclass(frozen=True)
class Choice:
    """What the policy decided at an epoch's end (logged, and broadcast to every rank)."""

    per_rank: int
    """The per-rank batch of the next epoch."""
    switched: bool
    goodput: dict
    """Per-rank batch -> predicted goodput (samples of base-batch progress per second)."""
    reason: str


def goodput(per_rank: int, ranks: int, base: int, seconds: Callable[[int], float | None],
            g2: float | None, tr_sigma: float | None) -> float | None:
    """Predicted goodput at ``per_rank``: base-batch-equivalent samples per second."""
    t = seconds(per_rank)
    if not t or t <= 0:
        return None
    big = per_rank * ranks
    return big / t * efficiency(big, base, g2, tr_sigma)


def choose(current: int, options: list[int], ranks: int, base: int,
           seconds: Callable[[int], float | None], g2: float | None, tr_sigma: float | None,
           threshold: float = SWITCH_GAIN) -> Choice:
    """The per-rank batch of greatest predicted goodput among ``options``; ``current``
    unless the best one is predicted at least ``threshold`` better."""
    table = {b: goodput(b, ranks, base, seconds, g2, tr_sigma) for b in sorted(set(options) | {current})}
    known = {b: v for b, v in table.items() if v is not None}
    if current not in known or g2 is None:
        return Choice(current, False, table, "no step time or noise scale measured yet")
    best = max(known, key=known.get)
    ratio = known[best] / known[current]
    if best != current and ratio >= 1 + threshold:
        return Choice(best, True, table, f"{best} predicted {ratio:.2f}x the goodput of {current}")
    return Choice(current, False, table,
                  f"best other predicted {ratio:.2f}x, under the {1 + threshold:.2f}x to switch"
                  if best != current else f"{current} has the greatest predicted goodput")


def samples_at(batch: float, base: float, history: list[tuple[float, float | None, float | None]]) -> float:
    """Samples a run at global batch ``batch`` needs for the progress a run at ``base``
    made over ``history``: (samples of that stretch, |G|^2, tr(Sigma)) per stretch (an
    epoch, say), each stretch costing its samples / ``efficiency`` at the noise scale
    measured then (Pollux's average over training, not one snapshot: the noise scale
    grows as training goes on). A stretch with no estimate costs as at none: samples x
    batch / base."""
    return sum(samples / efficiency(batch, base, g2, tr_sigma) for samples, g2, tr_sigma in history)
