"""The goodput batch policy's arithmetic (``distseg.core.goodput``) and its run state
(``distseg.training.progress.batchpolicy``), on step times and noise scales known by hand."""

import dataclasses
import math

import pytest

from distseg.core import batchplan, goodput, lr
from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.training.progress.batchpolicy import BatchPolicy, kept_per_rank


def test_efficiency_is_the_noise_scale_ratio():
    # phi = tr_sigma / g2 = 24: efficiency (phi + B0) / (phi + B)
    g2, tr_sigma = 0.5, 12.0
    assert goodput.efficiency(8, 8, g2, tr_sigma) == pytest.approx(1.0)
    assert goodput.efficiency(32, 8, g2, tr_sigma) == pytest.approx((24 + 8) / (24 + 32))
    assert goodput.gain(32, 8, g2, tr_sigma) == pytest.approx(4 * (24 + 8) / (24 + 32))
    # pure noise (|G|^2 clipped to 0): every sample counts, the gain is the growth
    assert goodput.efficiency(64, 8, 0.0, 3.0) == pytest.approx(1.0)
    # nothing measured: no gain assumed, the worst case
    assert goodput.efficiency(16, 8, None, None) == pytest.approx(0.5)


def test_the_gain_rule_scales_the_lr_by_the_root_of_the_gain_never_below_1():
    assert [lr.gain_factor(g) for g in (4.0, 2.25, 1.0, 0.5)] == [2.0, 1.5, 1.0, 1.0]
    # The loop's lr once warmed up (``lr.gain_lr``) is the base x this factor.
    for gain in (0.5, 1.0, 2.25, 4.0, 7.3):
        assert lr.gain_lr(1e-3, gain, progress=10.0, warmup=5.0) == (
            1e-3 * lr.gain_factor(gain))


def test_step_times_fit_a_known_line():
    times = goodput.StepTimes()
    for b in (1, 2, 4, 8):
        for _ in range(3):
            times.add(b, 0.2 + 0.05 * b)
    alpha, beta = times.fit()
    assert alpha == pytest.approx(0.2) and beta == pytest.approx(0.05)
    assert times.seconds(16) == pytest.approx(1.0)
    assert goodput.StepTimes.restore(times.state()).fit() == pytest.approx((alpha, beta))


def test_one_measured_batch_takes_the_optimistic_prior():
    times = goodput.StepTimes()
    times.add(4, 0.4)
    times.add(4, 0.6)
    assert times.fit() == pytest.approx((0.25, 0.0625))  # half the mean step is fixed cost
    assert goodput.StepTimes().fit() is None


def test_noisy_fit_never_gives_a_negative_fixed_cost():
    times = goodput.StepTimes()
    times.add(1, 0.09)
    times.add(8, 1.0)  # steeper than proportional: least squares would give alpha < 0
    alpha, beta = times.fit()
    assert alpha == 0.0 and beta > 0


def test_candidates_never_go_below_the_base():
    assert goodput.candidates(ranks=32, base=8, largest=8) == [1, 2, 4, 8]
    assert goodput.candidates(ranks=2, base=8, largest=8) == [4, 8]
    assert goodput.candidates(ranks=3, base=8, largest=8) == [3, 4, 8]
    assert goodput.candidates(ranks=1, base=8, largest=4) == [8]


def _table(per_sample: dict):
    """Seconds per step from a per-rank throughput table (samples per second)."""
    return lambda b: b / per_sample[b] if b in per_sample else None


def test_the_choice_on_a_known_model():
    # Per-rank throughput as measured by make bench (1/2/4/8 slices: 0.84/0.94/1.01/1.0).
    seconds = _table({1: 0.84, 2: 0.94, 4: 1.01, 8: 1.0})
    options = [1, 2, 4, 8]
    # A small noise scale (phi = 50): one slice per rank at 32 ranks is best.
    early = goodput.choose(2, options, 32, 8, seconds, g2=1.0, tr_sigma=50.0)
    assert early.per_rank == 1 and early.switched
    expected = {b: 32 * b / seconds(b) * (50 + 8) / (50 + 32 * b) for b in options}
    assert early.goodput == pytest.approx(expected)
    # A large one (phi = 500): 2 slices per rank win.
    late = goodput.choose(1, options, 32, 8, seconds, g2=1.0, tr_sigma=500.0)
    assert late.per_rank == 2 and late.switched
    assert max(late.goodput, key=late.goodput.get) == 2


def test_no_switch_under_the_threshold():
    seconds = _table({4: 1.0, 8: 1.0})
    # The same throughput per sample: a larger batch only loses efficiency (408 / 416).
    small = goodput.choose(4, [4, 8], 2, 8, seconds, g2=1.0, tr_sigma=400.0)
    ratio = small.goodput[8] / small.goodput[4]
    assert ratio < 1.0 and not small.switched and small.per_rank == 4
    # A throughput gain of 4 % and no efficiency loss: under the 5 % to switch.
    flat = goodput.choose(4, [4, 8], 2, 8, _table({4: 1.0, 8: 1.04}), g2=0.0, tr_sigma=1.0)
    assert flat.goodput[8] / flat.goodput[4] == pytest.approx(1.04)
    assert not flat.switched and "under" in flat.reason
    # The same at 6 %: it switches.
    assert goodput.choose(4, [4, 8], 2, 8, _table({4: 1.0, 8: 1.06}), g2=0.0, tr_sigma=1.0).switched


def test_nothing_measured_keeps_the_batch():
    choice = goodput.choose(4, [4, 8], 2, 8, goodput.StepTimes().seconds, g2=None, tr_sigma=None)
    assert choice.per_rank == 4 and not choice.switched


def test_the_run_state_round_trips_and_stays_with_its_ranks():
    policy = BatchPolicy(ranks=4, base=8, largest=8, per_rank=2)
    for t in (0.3, 0.31):
        policy.observe(t)
    choice = goodput.choose(2, policy.options, 4, 8, policy.times.seconds, 1.0, 1000.0)
    assert policy.take(choice) == choice.switched
    record = policy.record(2, choice)
    assert record["per_rank"] == 2 and record["next_per_rank"] == choice.per_rank
    state = policy.state()
    again = BatchPolicy(ranks=4, base=8, largest=8, per_rank=2)
    again.restore(state)
    assert again.per_rank == policy.per_rank and again.times.means() == policy.times.means()
    assert kept_per_rank({"policy": state}, 4) == policy.per_rank
    other = BatchPolicy(ranks=8, base=8, largest=8, per_rank=1)
    other.restore(state)  # another number of ranks: afresh
    assert other.per_rank == 1 and not other.times.sums
    assert kept_per_rank({"policy": state}, 8) is None and kept_per_rank(None, 4) is None


def test_the_plan_of_a_chosen_batch():
    t = config_lib.default().train  # G = 8, grows, sqrt past it
    assert batchplan.batch_plan(t, 2, 4) == batchplan.batch_plan(t, 2)  # the config's own
    plan = batchplan.batch_plan(t, 2, 8)
    assert (plan.per_rank, plan.global_batch, plan.kind, plan.cut_global) == (8, 16, "chosen", 16)
    assert plan.lr_factor == pytest.approx(math.sqrt(2)) and plan.lr_scaling == "sqrt"
    assert plan.base == 8
    per_rank = config_lib.TrainConfig(batch_size=2, lr_scaling="linear")
    chosen = batchplan.batch_plan(per_rank, 4, 4)
    assert chosen.global_batch == 16 and chosen.lr_factor == pytest.approx(8.0) and chosen.base == 2


def test_bad_policy_settings_are_refused_in_one_line():
    for field, value in (("batch_policy", "adaptive"), ("max_batch_per_rank", 0)):
        cfg = config_lib.default()
        bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **{field: value}))
        with pytest.raises(InputError, match=f"train.{field}"):
            bad.validate()
