"""The ``goodput`` batch policy in a run (``train.batch_policy``): what it measured, what
it chose, and what a checkpoint keeps of it.

Every rank times its steps; at an epoch's end rank 0 fits the step-time model to its
own times (``goodput.StepTimes``), reads the noise scale all ranks share, chooses the
next epoch's per-rank batch (``goodput.choose``) and broadcasts it, so every rank
switches together. A step that traced the train step (the first of a launch, the first
at a new batch) is not timed. Plain Python: the loop does the collective and the
switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distseg.core import goodput


@dataclass
class BatchPolicy:
    """The policy's state over one run's epochs at one number of ranks."""

    ranks: int
    base: int
    """The global batch the lr was set for: the policy never goes below it."""
    largest: int
    """``train.max_batch_per_rank``."""
    per_rank: int
    """The per-rank batch in force."""
    times: goodput.StepTimes = field(default_factory=goodput.StepTimes)
    last: goodput.Choice | None = None
    """The latest choice taken."""

    @property
    def options(self) -> list[int]:
        return goodput.candidates(self.ranks, self.base, self.largest)

    def observe(self, seconds: float) -> None:
        """One timed step at the batch in force."""
        self.times.add(self.per_rank, seconds)

    def decide(self, g2: float | None, tr_sigma: float | None, seconds=None) -> goodput.Choice:
        """The next epoch's per-rank batch from what this rank measured (rank 0's
        decision is the one every rank takes); ``seconds`` (per-rank batch -> a step's
        seconds) stands in for the measured step times where given (the benchmark's
        emulation, which measures samples, not time)."""
        return goodput.choose(self.per_rank, self.options, self.ranks, self.base,
                              seconds or self.times.seconds, g2, tr_sigma)

    def take(self, choice: goodput.Choice) -> bool:
        """Adopts ``choice`` (rank 0's, broadcast); returns whether the batch changed."""
        self.last = choice
        changed = choice.per_rank != self.per_rank
        self.per_rank = choice.per_rank
        return changed

    def record(self, ran: int, choice: goodput.Choice | None) -> dict:
        """The ``goodput`` field of an ``epoch`` record: the per-rank batch the epoch
        ``ran``, the step-time model, and ``choice`` for the next epoch (None after the
        last epoch): each option's predicted goodput and the batch chosen."""
        fit = self.times.fit()
        return {"policy": "goodput", "per_rank": ran, "options": self.options,
                "step_time_model": None if fit is None else {"alpha": fit[0], "beta": fit[1]},
                "measured_step_time": {str(b): t for b, t in self.times.means().items()},
                "goodput": None if choice is None else {str(b): v for b, v in choice.goodput.items()},
                "next_per_rank": None if choice is None else choice.per_rank,
                "switched": bool(choice and choice.switched),
                "reason": None if choice is None else choice.reason}

    def state(self) -> dict:
        """What a checkpoint keeps (``restore`` reads it back)."""
        return {"ranks": self.ranks, "per_rank": self.per_rank, "times": self.times.state()}

    def restore(self, state: dict | None) -> None:
        """Continues from ``state()`` of a run at the same number of ranks (else afresh,
        from the config's batch)."""
        if state and state.get("ranks") == self.ranks:
            self.per_rank = int(state["per_rank"])
            self.times = goodput.StepTimes.restore(state.get("times"))


def kept_per_rank(kept: dict | None, ranks: int) -> int | None:
    """The per-rank batch a checkpoint's training state (``kept``) was training with under the
    policy at ``ranks`` ranks (None: none kept, or kept at another number of ranks)."""
    state = (kept or {}).get("policy")
    if state and state.get("ranks") == ranks:
        return int(state["per_rank"])
    return None
