"""``analysis.stepmodel`` and ``analysis.project``: the step-time model's and the
projection's pieces alone (points, fit, rows, assumptions).

The end-to-end hand computation is ``test_analysis.py::test_projection_matches_a_hand_
computation``; here each step gets numbers small enough to check in one's head.
"""

import math

import pytest

from analysis import logs, project, stepmodel, tables
from analysis.stepmodel import EpochModel, Fabric, Point
from tests.analysis_fixtures.runs import RunSpec, write_run

NO_LATENCY = Fabric(bandwidth_gbps=8.0, latency_us=0.0)  # 1e9 bytes/s, no latency


def _point(run, ranks, epoch_s, steps, capped=False):
    return Point(run=run, ranks=ranks, nodes=1, epoch_s=epoch_s, steps=steps,
                 train_samples=64, batch_size=2, capped=capped)


def test_fit_points_take_the_median_training_time_and_the_run_record(tmp_path):
    common = dict(epochs=3, train_samples=64, batch_size=2)
    runs = [logs.load_run(write_run(str(tmp_path / "np1"), RunSpec(size=1, **common))),
            logs.load_run(write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=1.1,
                                                                   **common)))]
    points = stepmodel.fit_points(runs, tables.time_per_epoch(runs))
    assert points == [_point("np1", 1, 32.0, 32), _point("np2", 2, pytest.approx(17.6), 16)]
    assert points[1].step_s == pytest.approx(1.1)


def test_fit_subtracts_the_allreduce_and_takes_the_base_runs_dataset():
    # 1e6 gradient bytes at 1e9 bytes/s: allreduce 2 x 1/2 x 1e-3 s = 1e-3 s at 2 ranks.
    points = [_point("a", 1, 32.0, 32), _point("b", 2, 16.0 * 1.003, 16)]
    model = stepmodel.fit(points, 1e6, NO_LATENCY)
    assert model.compute_s == pytest.approx((1.0 + 1.002) / 2)
    assert (model.train_samples, model.batch_size, model.cap) == (64, 2, None)
    assert stepmodel.fit([_point("a", 1, 20.0, 10, capped=True)], 1e6, NO_LATENCY).cap == 10
    # A negative residual (allreduce slower than the step) fits as zero compute.
    assert stepmodel.fit([_point("a", 2, 1e-4, 1)], 1e6, NO_LATENCY).compute_s == 0.0


def test_epoch_model_caps_steps_and_adds_the_allreduce():
    model = EpochModel(compute_s=1.0, grad_bytes=1e6, fabric=NO_LATENCY, train_samples=64,
                       batch_size=2, cap=10)
    assert model.epoch(1) == (10.0, 0.0, 10)  # 32 steps, capped at 10; no allreduce alone
    epoch_s, comm, steps = model.epoch(4)  # 8 steps; 2 x 3/4 x 1e-3 s per step
    assert (steps, comm) == (8, pytest.approx(1.5e-3))
    assert epoch_s == pytest.approx(8 * 1.0015)


def test_rows_give_residuals_efficiency_and_flag_infeasible_sizes():
    model = EpochModel(compute_s=1.0, grad_bytes=0.0, fabric=NO_LATENCY, train_samples=64,
                       batch_size=2, cap=None)
    base, other = _point("a", 1, 33.0, 32), _point("b", 2, 18.0, 16)
    measured = project.measured_rows([base, other], model, base)
    assert [r["model_epoch_s"] for r in measured] == [32.0, 16.0]
    assert [r["residual_s"] for r in measured] == [1.0, 2.0]
    assert measured[1]["efficiency"] == pytest.approx(33.0 / 36.0)
    projected = project.projected_rows([2, 64], 2, model, base)
    assert [(r["ranks"], r["steps_per_epoch"], r["epoch_s"]) for r in projected] == [
        (4, 8, 8.0), (128, 1, 1.0)]
    assert projected[0]["efficiency"] == 1.0  # 32 s x 1 rank = 8 s x 4 ranks
    assert projected[1]["note"] == "infeasible: 64 samples < ranks x batch = 128 x 2"
    assert math.isnan(projected[0]["residual_s"]) and projected[0]["note"] == ""


def test_assumptions_say_what_the_model_rests_on():
    model = EpochModel(compute_s=0.5, grad_bytes=4e6, fabric=Fabric(latency_term="log"),
                       train_samples=64, batch_size=2, cap=10)
    lines = project.assumptions(model, 2, "--grad-bytes", 4, True, _point("a", 1, 5.0, 10))
    assert lines[0] == "PROJECTION from a model, not a measurement."
    assert "latency x 2 log2 R for R ranks" in lines[1]
    assert lines[2].startswith("t_compute = 0.5 s per step: the mean over 2 measured run(s)")
    assert lines[3] == ("G = 4,000,000 gradient bytes (--grad-bytes); B = 100 Gb/s; "
                        "latency = 2 us per message.")
    assert lines[4].startswith("4 rank(s) per node (from --ranks-per-node)")
    assert lines[5].endswith(", capped at 10 steps per epoch.")
    assert lines[6].startswith("Efficiency is against a (1 rank(s))")


def test_overlap_is_fitted_where_the_allreduce_is_a_share_of_the_step():
    # 5e8 gradient bytes at 1e9 bytes/s: 0.5 s of allreduce at 2 ranks, 0.75 s at 4.
    # 1 rank computes 1.0 s a step; at 2 ranks the step is (1 + 0.5^2)^(1/2): gamma 2.
    overlapped = [_point("a", 1, 32.0, 32), _point("b", 2, 16 * math.sqrt(1.25), 16)]
    model = stepmodel.fit(overlapped, 5e8, NO_LATENCY)
    assert (model.gamma, model.gamma_points) == (pytest.approx(2.0), 1)
    assert model.compute_s == pytest.approx(1.0, rel=1e-3)
    assert model.step(4) == pytest.approx(math.sqrt(1 + 0.75 ** 2), rel=1e-3)
    assert project.overlap_line(model).startswith("gamma = 2.00, FITTED")
    # A step that is compute plus allreduce fits gamma 1: no overlap, measured.
    summed = stepmodel.fit([_point("a", 1, 32.0, 32), _point("b", 2, 16 * 1.5, 16)], 5e8,
                           NO_LATENCY)
    assert (summed.gamma, summed.gamma_points, summed.step(4)) == (1.0, 1, pytest.approx(1.75))


def test_overlap_is_not_fitted_where_the_runs_cannot_tell():
    # 1 ms of allreduce in a 1 s step (a one-host run's path): noise would decide gamma.
    tiny = [_point("a", 1, 32.0, 32), _point("b", 2, 16.0, 16)]
    assert stepmodel.fit_overlap(tiny, 1e6, NO_LATENCY) == (1.0, 0)
    # One point, or one per batch of a two-parameter line: any gamma fits exactly.
    assert stepmodel.fit_overlap([_point("b", 2, 24.0, 16)], 5e8, NO_LATENCY) == (1.0, 0)
    one_each = [_point("a", 1, 32.0, 32),
                Point(run="b", ranks=2, nodes=2, epoch_s=24.0, steps=16, train_samples=64,
                      batch_size=4, capped=False)]
    assert stepmodel.fit_overlap(one_each, 5e8, NO_LATENCY) == (1.0, 0)
    model = stepmodel.fit(tiny, 1e6, NO_LATENCY)
    assert project.overlap_line(model).startswith("gamma = 1 (no overlap), not fitted")
