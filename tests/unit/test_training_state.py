"""The training state that changes with progress (``distseg.training.progress.state.TrainingState``),
without Horovod: the lr's clocks, what a step feeds it, the ``goodput`` policy's
decide / take / restore, and a checkpoint's ``scaling`` state written before the state
was one object."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

from distseg.core import config as config_lib
from distseg.training.progress.noise import Average
from distseg.training.progress.state import TrainingState

from support import REPO

SAMPLES = 64


def _train(**changes) -> config_lib.TrainConfig:
    return dataclasses.replace(config_lib.smoke().train, lr=1e-3, **changes)


def _goodput_train() -> config_lib.TrainConfig:
    return _train(batch_size=2, global_batch=0, batch_policy="goodput", max_batch_per_rank=8,
                  warmup_epochs=0.0)


def _goodput(ranks: int = 2, samples: int = SAMPLES) -> TrainingState:
    return TrainingState.initial(_goodput_train(), samples, ranks)


def _noisy(s: TrainingState, phi: float) -> None:
    """A noise scale of ``phi`` samples (|G|^2 = 1, tr(Sigma) = phi)."""
    s.noise.averages["preconditioned"] = Average(1.0, phi, 1.0)


def test_a_step_feeds_the_noise_the_progress_the_samples_and_the_policy():
    s = _goodput()
    s.observe([4.0, 1.0, 4.0, 1.0], applied=True, seconds=None)  # traced: not timed
    assert s.samples == 4 and s.policy.times.means() == {}
    assert s.noise.averages["preconditioned"].g2 is not None
    progress = s.progress
    assert progress >= 1.0  # a step adds its gain, at least 1
    s.observe([math.nan, 1.0, 4.0, 1.0], applied=False, seconds=0.5)  # skipped update
    assert s.samples == 8 and s.progress == progress
    assert s.policy.times.means() == {2: 0.5}


def test_the_warm_up_counts_steps_or_under_the_policy_samples():
    fixed = TrainingState.initial(_train(batch_size=2, global_batch=0, lr_scaling="linear",
                                 warmup_epochs=1.0), SAMPLES, 4)
    plan = fixed.plan  # b = 2, B = 8: 8 steps an epoch, lr 1e-3 -> 4e-3
    assert (plan.steps, plan.warmup_steps, plan.lr_target) == (8, 8, pytest.approx(4e-3))
    assert fixed.lr(4) == pytest.approx(2.5e-3) and fixed.lr_now == fixed.lr(4)
    policy = TrainingState.initial(_train(batch_size=2, global_batch=0, lr_scaling="linear",
                                  warmup_epochs=1.0, batch_policy="goodput"), SAMPLES, 4)
    policy.samples = 32  # half an epoch of samples, whatever the step count says
    assert policy.lr(0) == pytest.approx(2.5e-3)


def test_the_policy_switches_to_a_larger_batch_when_the_noise_scale_pays_for_it():
    s = _goodput()
    for _ in range(3):
        s.observe([4.0, 1.0, 4.0, 1.0], applied=True, seconds=0.4)
    _noisy(s, 1e4)
    choice = s.decide()
    assert choice.switched and choice.per_rank > 2
    assert s.take(choice, _goodput_train())
    batch = s.plan.batch
    assert (batch.per_rank, batch.global_batch, batch.kind) == (choice.per_rank, 2 * choice.per_rank,
                                                                 "chosen")
    assert s.plan.steps == SAMPLES // batch.global_batch
    assert (s.noise.small, s.noise.big) == (batch.per_rank, batch.global_batch)
    record = s.epoch_fields(2, choice)["goodput"]
    assert (record["per_rank"], record["next_per_rank"], record["switched"]) == (2, choice.per_rank, True)


def test_the_policy_keeps_its_batch_until_it_has_measured_and_never_goes_below_the_base():
    s = _goodput()
    choice = s.decide()  # no step timed, no noise scale yet
    assert not choice.switched and not s.take(choice, _goodput_train()) and s.plan.batch.per_rank == 2
    for _ in range(3):
        s.observe([4.0, 1.0, 4.0, 1.0], applied=True, seconds=0.4)
    _noisy(s, 0.5)
    choice = s.decide()  # little noise: the smallest batch the lr was set for (2 = 2 x 1)
    assert choice.per_rank == 1 and min(choice.goodput) == 1 and s.take(choice, _goodput_train())
    assert (s.plan.batch.global_batch, s.noise.big) == (2, 2)
    assert not s.take(None, _goodput_train())  # after the last epoch
    fixed = TrainingState.initial(_train(batch_size=2, global_batch=0), SAMPLES, 2)
    assert fixed.decide() is None and "goodput" not in fixed.epoch_fields(2, None)


def test_a_restored_state_continues_the_batch_the_averages_and_the_clocks():
    s = _goodput()
    for _ in range(3):
        s.observe([4.0, 1.0, 4.0, 1.0], applied=True, seconds=0.4)
    _noisy(s, 1e4)
    s.take(s.decide(), _goodput_train())
    s.observe([5.0, 2.0, 5.0, 2.0], applied=True, seconds=None)
    kept = json.loads(json.dumps(s.state()))  # as a checkpoint's JSON holds it
    again = TrainingState.initial(_goodput_train(), SAMPLES, 2, kept)
    again.restore(kept, global_step=4)
    assert again.plan == s.plan
    assert again.state() == s.state()
    assert again.noise.record() == s.noise.record()
    # Another number of ranks: the policy and the averages start afresh.
    other = TrainingState.initial(_goodput_train(), SAMPLES, 4, kept)
    other.restore(kept, global_step=4)
    assert other.plan.batch.per_rank == 2 and other.progress == 0.0 and other.samples == 0
    assert other.noise.averages["preconditioned"].g2 is None


def test_a_checkpoint_written_before_the_state_was_one_object_restores():
    """The ``scaling`` entry of ``tests/fixtures/checkpoint-v2``'s epoch-2 checkpoint (a
    2-rank goodput run that had switched to 8 per rank)."""
    path = os.path.join(REPO, "tests", "fixtures", "checkpoint-v2", "checkpoints", "epoch-0002.json")
    with open(path) as f:
        manifest = json.load(f)
    kept = manifest["scaling"]
    with open(os.path.join(os.path.dirname(os.path.dirname(path)), "config.json")) as f:
        train = config_lib.TrainConfig(**json.load(f)["train"])
    s = TrainingState.initial(train, 40, 2, kept)
    s.restore(kept, manifest["global_step"])
    assert (s.plan.batch.per_rank, s.plan.batch.global_batch) == (8, 16)
    assert s.policy.per_rank == 8 and s.policy.times.means() == {2: pytest.approx(0.6935559 / 19)}
    assert {k: v for k, v in s.state().items() if k in kept} == kept
    assert s.trained == kept["samples"]  # the schedule's clock, from before it existed
