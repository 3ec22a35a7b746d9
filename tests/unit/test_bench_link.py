"""The arithmetic of benchmarks/bench_link.py: the step breakdown (from the timeline
medians ``distseg.core.timeline`` reads, tests/unit/test_timeline.py) and the CPU
steal read from ``/proc/stat`` (``benchlib.machine``)."""

from __future__ import annotations

import os
import sys

import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_link  # noqa: E402

from benchlib import machine  # noqa: E402


def test_the_breakdown_splits_a_step_into_allreduce_waits_and_the_rest():
    link = {"bandwidth_gbps": 1.0, "latency_us": 0.0}
    rows = [{"rate": "1gbit", "model": "demo", "variant": "distseg", "step_s": s,
             "gradient_s": 0.07, "gradient_wait_s": 0.01, "small_s": 0.0, "small_wait_s": 0.02,
             "link": link, "grad_bytes": 8e6} for s in (0.6, 0.7, 0.9)]
    rows.append({"rate": "1gbit", "model": "demo", "variant": "1proc", "step_s": 0.5,
                 "link": None})
    (part,) = bench_link.step_breakdown(rows)
    assert part["step_s"] == 0.7 and part["one_process_step_s"] == 0.5
    assert part["gradient_predicted_s"] == pytest.approx(8e6 * 8 / 1e9)  # 2 ranks: 1 x G
    assert part["wait_s"] == pytest.approx(0.03)
    assert part["rest_s"] == pytest.approx(0.7 - 0.07 - 0.03)


def test_cpu_steal_is_the_stolen_share_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    before = machine.cpu_counters(str(stat))
    assert before == (35, 1000)
    stat.write_text("cpu  200 0 60 900 10 0 5 85 0 0\n")
    after = machine.cpu_counters(str(stat))
    assert machine.steal_fraction(before, after) == pytest.approx(50 / 260)
    assert machine.steal_fraction(None, after) is None
    assert machine.cpu_counters(str(tmp_path / "missing")) is None


def test_the_projection_check_predicts_each_left_out_rate_through_the_reports_model(tmp_path):
    """2-rank runs whose steps are 1 s of compute plus the allreduce of 4 MB on the link
    each measured (1, 10, 100 Gbit/s): fitted on two rates, the report's model gives the
    third's step back."""
    from tests.analysis_fixtures.runs import RunSpec, measured_link, write_run
    params, rows = 1_000_000, []
    for rate, gbps in (("1gbit", 1.0), ("10gbit", 10.0), ("none", 100.0)):
        found = measured_link(2, gbps, 0.0, local=False)
        step = 1.0 + 4 * params * 8 / (gbps * 1e9)
        run_dir = write_run(str(tmp_path / rate), RunSpec(size=2, hosts=["a", "b"], params=params,
                                                          step_time=step, link=found))
        rows.append({"rate": rate, "model": "demo", "variant": "distseg", "run_dir": run_dir,
                     "link": found, "grad_bytes": 4 * params})
    checks = bench_link.validate_projection(rows, ["demo"])
    assert [c["left_out"] for c in checks] == ["10gbit", "1gbit", "none"]
    for c in checks:
        assert c["gamma"] == 1.0 and c["ratio"] == pytest.approx(1.0, rel=1e-6), c
    assert bench_link.validate_projection(rows[:2], ["demo"]) == []  # two rates: nothing to leave out
