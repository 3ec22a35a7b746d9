"""How fast and how evenly the ranks of a synchronous run train: the throughput and the
imbalance ratio that the report's tables, the TensorBoard scalars and the benchmarks
all show.

Every rank waits for the others at each step's allreduce, so an epoch lasts as long as
its slowest rank: the throughput is the samples of all ranks over the slowest rank's
training time (``train_time``, no validation), summed over the epochs counted; the
imbalance ratio is the slowest rank's mean step time over the mean of the ranks' (1:
balanced). Plain Python: the light side (``analysis``, ``distseg.core.tbscalars``)
imports it.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def throughput(samples: float, seconds: float) -> float | None:
    """Training samples per second: ``samples`` of all ranks over ``seconds``, the sum
    of the epochs' slowest-rank training times; None without a positive time."""
    return samples / seconds if seconds > 0 else None


def epochs_throughput(epochs: Iterable[Sequence[tuple[float, float | None]]]) -> float | None:
    """``throughput`` of ``epochs``, each given as its ranks' (samples, training
    seconds) pairs: every rank's samples over the sum of each epoch's slowest rank's
    seconds (a rank without a time adds none); None without a positive time."""
    samples, seconds = 0, 0.0
    for ranks in epochs:
        samples += sum(n for n, _ in ranks)
        seconds += max((t for _, t in ranks if t is not None), default=0.0)
    return throughput(samples, seconds)


def imbalance(slowest: float, mean: float) -> float | None:
    """The imbalance ratio of an epoch or a run: the ``slowest`` rank's mean step time
    over the ``mean`` of the ranks' mean step times (1: balanced); None without a
    positive mean."""
    return slowest / mean if mean > 0 else None
