"""``--lr auto``'s arithmetic (``distseg.training.startup.lrfind``): the sweep's lrs, the grid
every rank snaps to, the suggestion on curves whose steepest point is known, and the
curves it refuses. The range test in real runs: tests/e2e/test_lr_auto.py."""

from __future__ import annotations

import math
import random

import pytest

from distseg.training.startup import lrfind

LRS = lrfind.sweep_lrs()


def _curve(best: float, noise: float = 0.0, seed: int = 0) -> list[float]:
    """A loss that falls fastest at ``best`` (-tanh of log lr) and climbs steeply past
    10 x ``best``; with gaussian ``noise``."""
    rng = random.Random(seed)
    out = []
    for lr in LRS:
        x = math.log(lr / best)
        climb = 5 * math.log(lr / (10 * best)) ** 2 if lr > 10 * best else 0.0
        out.append(-math.tanh(x) + climb + rng.gauss(0, noise))
    return out


def test_the_sweep_rises_exponentially_from_low_to_high():
    assert len(LRS) == lrfind.STEPS <= 100
    assert LRS[0] == lrfind.LR_LOW and LRS[-1] == pytest.approx(lrfind.LR_HIGH)
    ratios = {round(b / a, 12) for a, b in zip(LRS, LRS[1:])}
    assert len(ratios) == 1


def test_snap_puts_an_lr_on_the_sqrt2_grid_halfway_going_lower():
    for k in range(-30, 2):
        point = 2.0 ** (k / 2)
        assert lrfind.snap(point) == point
        assert lrfind.snap(point * 1.1) == point and lrfind.snap(point / 1.1) == point
    assert lrfind.snap(2 ** 0.25) == 1.0  # halfway between 1 and sqrt(2)
    assert lrfind.snap(1e-3) == pytest.approx(2 ** -10)


@pytest.mark.parametrize("best", [1e-4, 1e-3, 1e-2, 3e-2])
@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_the_suggestion_is_the_known_steepest_point(best, noise):
    lr, why = lrfind.suggest(LRS, _curve(best, noise))
    assert best / 1.25 <= lr <= best * 1.25, (lr, why)
    assert "steepest" in why


def test_a_curve_that_stops_at_divergence_is_read_up_to_there():
    losses = _curve(1e-3)[:45] + [math.nan]
    lr, _ = lrfind.suggest(LRS, losses)
    assert 1e-3 / 1.25 <= lr <= 1e-3 * 1.25


@pytest.mark.parametrize("losses", [
    [-0.2] * lrfind.STEPS,  # flat: nothing learns
    [-0.2 + 0.01 * k for k in range(20)],  # worse from the first step on
    [-0.2, math.nan],  # diverged at once
])
def test_a_loss_that_never_falls_is_one_clear_error(losses):
    with pytest.raises(lrfind.NoDescent, match="--lr auto: the training loss fell at no lr") as e:
        lrfind.suggest(LRS, losses)
    assert "set --lr by hand" in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_divergence_is_told_for_negative_losses_too():
    flat = [-0.1] * 10
    assert not lrfind.diverged(lrfind.smooth(flat + [-0.2, -0.3, -0.4]))
    assert lrfind.diverged(lrfind.smooth(flat + [-0.5, -0.6, 0.9, 2.0, 3.0]))
    assert lrfind.diverged([-0.1, math.inf])
    assert not lrfind.diverged(lrfind.smooth([1.0] * 10 + [0.5, 0.6]))


def test_a_flat_noisy_start_is_no_divergence():
    # The phantom's first steps (seed 2 of the 2026-11-26 study): the loss wanders by
    # 0.01 around -0.12 while the lr is too small to move it.
    rng = random.Random(2)
    start = [-0.12 + rng.uniform(-0.01, 0.01) for _ in range(25)]
    for k in range(2, len(start) + 1):
        assert not lrfind.diverged(lrfind.smooth(start[:k]))
    assert lrfind.diverged(lrfind.smooth(start + [-0.05, 0.0, 0.05]))


def test_a_fall_still_speeding_up_at_the_sweeps_end_keeps_the_configured_lr():
    # A loss that falls ever faster up to the last lr, never turning (the phantom's
    # GroupNorm U-Net): no upper end was found, so no choice is trusted.
    accelerating = [-0.2 - 0.5 * (k / (lrfind.STEPS - 1)) ** 4 for k in range(lrfind.STEPS)]
    with pytest.raises(lrfind.Inconclusive, match="no upper end"):
        lrfind.suggest(LRS, accelerating)
    kept = lrfind.decide(LRS, accelerating, 1e-3)
    assert kept["lr"] == 1e-3 and kept["kept"] and "kept the configured lr 0.001" in kept["why"]
    # The same fall turning before the end is read as before.
    turned = accelerating[:50] + [accelerating[49] + 0.05 * k for k in range(1, 11)]
    lr, _ = lrfind.suggest(LRS, turned)
    assert lr < LRS[50]


def test_smoothing_is_debiased_and_the_two_way_one_has_no_lag():
    assert lrfind.smooth([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])
    ramp = [float(k) for k in range(40)]
    assert lrfind.smooth(ramp)[20] < 15  # one way: lags the ramp
    assert lrfind.smooth_both_ways(ramp)[20] == pytest.approx(20, abs=1.5)  # about none
