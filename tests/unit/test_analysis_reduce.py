"""``analysis.reduce``: per-rank reductions give what the full step records would.

Each test compares a reduction with the same figure computed the way the report did
before it reduced while reading (a group-by over every rank's steps, a scan of the
whole curve), on records whose answers are known.
"""

import math

import numpy as np
import pandas as pd
import pytest

from analysis import logs, reduce, summary
from analysis.reduce import CurveSpec
from tests.analysis_fixtures.runs import RunSpec, run_record, step, write_log, write_run


def _compact(rank, n, rng, warm=3):
    steps = pd.DataFrame({"segment": np.zeros(n, np.int32),
                          "epoch": np.repeat(np.arange(n // warm + 1), warm)[:n].astype(float),
                          "step_time": rng.random(n), "data_wait": rng.random(n) / 10,
                          "samples": 2.0})
    steps.loc[5, "step_time"] = np.nan  # a step without its time: skipped, still counted
    return summary.compact_steps(rank, steps)


def test_step_stats_per_rank_equal_a_group_by_over_all_ranks():
    rng = np.random.default_rng(0)
    compact = [_compact(r, 40 + 7 * r, rng) for r in range(3)]
    per_rank = pd.concat([reduce.step_stats(c) for c in compact], ignore_index=True)
    every = pd.concat(compact, ignore_index=True)
    for basis, rows in (("steady", every[~every["warmup"]]), ("all", every)):
        g = rows.groupby("rank")
        got = per_rank[per_rank["basis"] == basis].set_index("rank")
        assert list(got["steps"]) == list(g.size())
        # bit for bit: the same aggregation over the same rows in the same order
        assert list(got["median_step_s"]) == list(g["step_time"].median())
        assert list(got["mean_step_s"]) == list(g["step_time"].mean())
        assert list(got["max_step_s"]) == list(g["step_time"].max())
        assert list(got["data_wait_share"]) == list(g["data_wait"].sum() / g["step_time"].sum())
    assert list(per_rank.columns) == reduce.STAT_COLUMNS


def test_thin_index_keeps_every_kth_and_the_last():
    assert list(reduce.thin_index(10, 3)) == [0, 4, 8, 9]
    assert list(reduce.thin_index(9, 3)) == [0, 3, 6, 8]
    assert list(reduce.thin_index(5, 20)) == [0, 1, 2, 3, 4]
    assert list(reduce.thin_index(0, 20)) == []


def test_first_at_or_below_skips_nan():
    assert reduce.first_at_or_below(np.array([0.0, np.nan, -1.0, -2.0]), -1.0) == 2
    assert reduce.first_at_or_below(np.array([0.0, np.nan]), -1.0) is None
    assert reduce.first_at_or_below(np.array([]), -1.0) is None


def _noisy(n):
    k = np.arange(n)
    return -0.9 * (1 - np.exp(-k / (n / 4))) + 0.05 * np.sin(k * 0.7)


def test_crossings_are_found_on_every_record_though_the_curve_is_thinned():
    n = 50_001
    loss = _noisy(n)
    curve = pd.DataFrame({"segment": np.zeros(n, np.int32), "epoch": np.arange(n) // 100,
                          "step": np.arange(n) % 100, "global_step": np.arange(n),
                          "t": 2.0 * (np.arange(n) + 1), "loss": loss, "lr": 0.1})
    spec = CurveSpec(targets=(-0.8, -0.9, -2.0), smooth=50, points=1000)
    out = reduce.reduce_curve(curve, np.array([0]), spec)
    assert out.records == n and out.stride == 51 and len(out.thin) == 982  # 981 + the last
    assert out.thin["global_step"].iloc[-1] == n - 1 and out.loss_min == loss.min()
    smooth = pd.Series(loss).rolling(50, min_periods=1).mean().to_numpy()
    for c in out.crossings:
        values = smooth if c.window == 50 else loss
        hit = np.flatnonzero(values <= c.target)
        if not len(hit):
            assert not c.reached
            continue
        assert (c.index, c.global_step, c.t) == (hit[0], hit[0], 2.0 * (hit[0] + 1))
    # -0.9: single noisy steps reach it, the trailing mean of 50 does not
    assert {(c.target, c.window) for c in out.crossings if not c.reached} == {
        (-0.9, 50), (-2.0, 0), (-2.0, 50)}
    raw = {c.target: c.index for c in out.crossings if c.window == 0}
    assert raw[-0.8] % 51 != 0  # found exactly, between two kept records
    # the kept records carry the smoothing of the whole curve
    np.testing.assert_array_equal(out.thin["loss_smoothed"],
                                  smooth[out.thin["global_step"].to_numpy()])


def test_curve_order_lays_launches_end_to_end_whatever_the_file_order():
    # A file whose later launch (start 100) was written first: seg_rank [1, 0].
    segment = np.array([0, 0, 1, 1])
    t = np.array([2.0, 1.0, 5.0, 3.0])
    assert list(reduce.curve_order(np.array([1, 0]), segment, t)) == [3, 2, 1, 0]


def test_launch_order_ranks_a_files_run_records_by_start():
    runs = [run_record(0, 1, start_time=200.0, run_id="b"),
            run_record(0, 1, start_time=100.0, run_id="a"),
            run_record(0, 1, start_time=200.0, run_id="b")]
    assert list(summary.launch_order(runs)) == [1, 0, 1]


def test_a_long_run_reads_as_a_short_curve_with_the_same_hours_to_target(tmp_path):
    # 2 ranks x 1,200 steps of 3 s; thinned to 100 points, the crossings stay exact.
    loss = _noisy(1200)
    run = write_run(str(tmp_path / "long"), RunSpec(
        size=2, epochs=150, train_samples=32, batch_size=2, step_time=3.0,
        loss=lambda k: float(loss[k])))
    spec = CurveSpec(targets=(-0.8, -0.85), smooth=10, points=100)
    thin = logs.load_run(run, spec=spec)
    full = logs.load_run(run, spec=CurveSpec(targets=spec.targets, smooth=10, points=10**9))
    assert (thin.curve_records, thin.curve_stride, len(thin.curve)) == (1200, 12, 101)
    assert len(full.curve) == 1200
    pd.testing.assert_frame_equal(thin.crossings, full.crossings)
    reached = thin.crossings[thin.crossings["reached"]]
    assert len(reached) == 4
    assert list(reached["wall_s"]) == [3.0 * (k + 1) for k in reached["global_step"]]
    kept = full.curve.set_index("global_step").loc[thin.curve["global_step"]]
    np.testing.assert_array_equal(kept["loss_smoothed"], thin.curve["loss_smoothed"])
    assert any("1 in every 12 of 1,200 step records" in n.message for n in thin.notes)
    assert not any("thinned" in n.message for n in full.notes)


def test_the_curve_of_a_resumed_run_is_smoothed_across_launches(tmp_path):
    # Rank 0: launch a (steps at t 1, 2), launch b (t 1): wall 1, 2, 3 (a lasted 2 s).
    run_dir = str(tmp_path / "r")
    write_log(run_dir, 0, [run_record(0, 1, start_time=100.0, run_id="a"),
                           step(0, 0, 0, 1.0, loss=-0.2), step(0, 0, 1, 2.0, loss=-0.4),
                           run_record(0, 1, start_time=200.0, run_id="b"),
                           step(0, 1, 0, 1.0, loss=-0.9)])
    run = logs.load_run(run_dir, spec=CurveSpec(targets=(-0.5,), smooth=2))
    assert list(run.curve["wall_s"]) == [1.0, 2.0, 3.0]
    assert list(run.curve["loss_smoothed"]) == pytest.approx([-0.2, -0.3, -0.65])
    smoothed = run.crossings.query("window == 2").iloc[0]
    assert (smoothed["segment"], smoothed["wall_s"]) == (1, 3.0)
    assert math.isclose(run.curve_loss_min, -0.9)
