"""The link model (``distseg.core.link``): the fit of timed allreduces, the ring's
allreduce time, and Pollux's step time with overlap, on numbers known by hand."""

import pytest

from distseg.core import link


def test_the_fit_recovers_a_known_ring_link():
    # 4 ranks, 2.5 Gbit/s, 40 us per round: t = 6 x 40e-6 + 1.5 n x 8 / 2.5e9
    sizes = [4 << 10, 1 << 20, 16 << 20]
    seconds = [6 * 40e-6 + 1.5 * n * 8 / 2.5e9 for n in sizes]
    got = link.fit(sizes, seconds, ranks=4)
    assert got["bandwidth_gbps"] == pytest.approx(2.5)
    assert got["latency_us"] == pytest.approx(40.0)
    assert link.sync_seconds(16 << 20, 4, 2.5, 40.0) == pytest.approx(seconds[-1])


def test_a_ring_takes_2_r_minus_1_rounds_and_a_gradient_4_bytes_a_parameter():
    assert [link.ring_rounds(r) for r in (1, 2, 4, 8)] == [0, 2, 6, 14]
    # Each round carries 1 / R of the message through every rank's link.
    assert link.ring_bytes(1000, 4) == 1500.0 and link.ring_bytes(1000, 1) == 0.0
    assert link.gradient_bytes(31_000_000) == 124_000_000  # liver2d's 124 MB
    # The ring's rounds unless told otherwise (a tree's 2 log2 R = 4 at 4 ranks).
    ring = link.sync_seconds(1 << 20, 4, 10.0, 25.0)
    assert ring == link.sync_seconds(1 << 20, 4, 10.0, 25.0, rounds=6)
    assert ring - link.sync_seconds(1 << 20, 4, 10.0, 25.0, rounds=4) == pytest.approx(50e-6)


def test_what_cannot_be_fitted_says_so():
    assert link.fit([1 << 20], [0.01], ranks=2) is None  # one size
    assert link.fit([1, 2], [0.1, 0.2], ranks=1) is None  # one rank: no link
    flat = link.fit([4 << 10, 64 << 10], [0.002, 0.001], ranks=2)  # slower when smaller
    assert flat["bandwidth_gbps"] is None and flat["latency_us"] >= 0


def test_the_step_time_runs_from_no_overlap_to_full_overlap():
    assert link.step_seconds(0.4, 0.1, 1.0) == pytest.approx(0.5)
    assert link.step_seconds(0.4, 0.1, 10.0) == pytest.approx(0.4, rel=1e-5)
    assert link.step_seconds(0.4, 0.0, 2.0) == 0.4
    assert link.sync_seconds(1e9, 1, 1.0, 10.0) == 0.0


def test_compute_is_the_step_with_the_allreduce_taken_off_at_gamma():
    for gamma in (1.0, 2.37, 10.0):
        step = link.step_seconds(0.4, 0.15, gamma)
        assert link.compute_seconds(step, 0.15, gamma) == pytest.approx(0.4, rel=1e-9)
    assert link.compute_seconds(0.4, 0.0, 3.0) == 0.4  # no allreduce
    assert link.compute_seconds(0.1, 0.2, 1.0) == 0.0  # the allreduce alone is longer
    assert link.GAMMA_GRID[0] == 1.0 and link.GAMMA_GRID[-1] == pytest.approx(10.0)
