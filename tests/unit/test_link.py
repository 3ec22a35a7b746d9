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


# --- --compression auto's decision, on links fitted as a run fits its probe ------------

#: The demo U-Net's trainable parameters (7.8 MB of float32 gradients).
DEMO_PARAMS = 1_950_000
#: A 2-rank demo step's compute (4 slices per rank of the global batch of 8): 0.09 s in
#: bfloat16 on the development machine (docs/studies/precision-auto-2026-11-26.md).
DEMO_COMPUTE_S = 0.09


def _fitted(bandwidth_gbps, latency_us, ranks=2):
    """The link a run's probe fits to allreduces of ``link.PROBE_BYTES`` that took what
    the ring model gives at that bandwidth and latency."""
    sizes = list(link.PROBE_BYTES)
    seconds = [link.sync_seconds(n, ranks, bandwidth_gbps, latency_us) for n in sizes]
    return link.fit(sizes, seconds, ranks)


def _choice(fitted, compute_s=DEMO_COMPUTE_S, params=DEMO_PARAMS):
    assert link.exact_reason(fitted["ranks"], False, fitted["bandwidth_gbps"]) is None
    return link.compression_choice(compute_s, params, fitted["ranks"], fitted["bandwidth_gbps"],
                                   fitted["latency_us"], samples_per_step=8)


def test_fp16_is_taken_on_a_1_gbit_link_with_the_demos_gradients():
    got = _choice(_fitted(1.0, 50.0))
    assert got["choice"] == "fp16"
    # 7.8 MB through each rank's link at 1 Gbit/s, 2 rounds of 50 us; half the bytes in fp16.
    exact = 7.8e6 * 8 / 1e9 + 100e-6
    assert got["allreduce_s"]["none"] == pytest.approx(exact)
    assert got["allreduce_s"]["fp16"] == pytest.approx(exact / 2 + 50e-6)
    assert got["gradient_bytes"] == {"none": 7.8e6, "fp16": 3.9e6}
    # No overlap: the step is compute plus allreduce, samples/s the global batch over it.
    assert got["step_s"]["none"] == pytest.approx(DEMO_COMPUTE_S + exact)
    assert got["samples_per_s"]["none"] == pytest.approx(8 / (DEMO_COMPUTE_S + exact))
    assert got["speedup"] == pytest.approx(got["samples_per_s"]["fp16"] / got["samples_per_s"]["none"])
    assert got["speedup"] > 1.25 and got["threshold"] == link.FP16_MIN_SPEEDUP == 1.10
    assert got["reason"].startswith(f"fp16 predicted {got['speedup']:.2f}x")
    assert "taken at 1.10x or more" in got["reason"]


def test_exact_float32_is_kept_on_a_10_gbit_link():
    got = _choice(_fitted(10.0, 50.0))
    assert got["choice"] == "none"
    assert 1.0 < got["speedup"] < 1.10
    assert "exact float32 kept below 1.10x" in got["reason"]


def test_one_host_or_one_rank_keeps_exact_float32_with_no_link_measured():
    assert link.exact_reason(2, True, None).startswith("every rank on one host")
    assert link.exact_reason(1, True, None).startswith("one rank")
    # Across hosts, a probe that fitted no bandwidth gives nothing to predict from.
    assert "no bandwidth" in link.exact_reason(4, False, None)
    assert link.exact_reason(4, False, 0.9) is None


def test_fp16_is_taken_from_exactly_ten_percent_more_samples_per_second():
    fitted = _fitted(1.0, 50.0)
    sync = link.sync_seconds(link.gradient_bytes(DEMO_PARAMS), 2, fitted["bandwidth_gbps"],
                             fitted["latency_us"])
    half = link.sync_seconds(link.gradient_bytes(DEMO_PARAMS, "fp16"), 2,
                             fitted["bandwidth_gbps"], fitted["latency_us"])
    # (c + sync) / (c + half) = 1.10 at c = (sync - 1.10 half) / 0.10.
    edge = (sync - 1.10 * half) / 0.10
    assert _choice(fitted, edge * (1 - 1e-9))["choice"] == "fp16"
    assert _choice(fitted, edge * (1 + 1e-9))["choice"] == "none"
    assert _choice(fitted, edge)["speedup"] == pytest.approx(1.10, rel=1e-12)


def test_a_gradient_is_2_bytes_a_parameter_in_fp16():
    assert link.gradient_bytes(31_000_000, "fp16") == 62_000_000
    assert link.gradient_bytes(10, "none") == link.gradient_bytes(10) == 40
