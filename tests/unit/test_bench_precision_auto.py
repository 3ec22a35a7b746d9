"""benchmarks/bench_precision_auto.py (``make bench-precision``): the one-rank step
comparison on tiny data (``--precision auto`` against float32, two real
``distseg-train`` runs of the smoke model), whose results file holds each run's
decision and the ratio of their steps; and the demo table's arithmetic on hand-built
rows (medians over rounds, the ratios, the trial's cost against the run told the
precision auto chose). The runs read a CPU without bfloat16 (``DISTSEG_CPUINFO``), so
auto decides the same on every machine, from the flags, without a timed trial."""

from __future__ import annotations

import math
import os
import sys

import pytest

from support import BENCHMARKS, benchmark_results, run_benchmark

sys.path.insert(0, BENCHMARKS)

import bench_precision_auto  # noqa: E402

from distseg.training.startup import precision  # noqa: E402

SCRIPT = os.path.join(BENCHMARKS, "bench_precision_auto.py")


def test_the_step_comparison_on_tiny_data_records_both_runs_and_their_ratio(tiny, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    run_benchmark(SCRIPT, "--data", tiny, "--skip", "demo,split,liver3d", "--preset2d", "smoke",
                  "--liver2d-steps", "2", "--results-dir", str(tmp_path),
                  env={precision.CPUINFO_ENV: str(cpuinfo)})
    result = benchmark_results(tmp_path, "precision")
    assert set(result) >= {"date", "command", "liver2d"} and result["bf16_flags"] == []
    assert not {"demo", "split", "liver3d"} & set(result)
    steps = result["liver2d"]
    auto, fixed = steps["auto"]["precision"], steps["float32"]["precision"]
    assert (auto["requested"], auto["choice"], auto["source"]) == ("auto", "float32", "flags")
    assert fixed == {"requested": "float32", "choice": "float32"}
    assert math.isfinite(steps["step_ratio_float32_vs_auto"]) and steps["step_ratio_float32_vs_auto"] > 0


def row(rnd, ranks, variant, samples, dice, first, trial=0.0, choice="bfloat16"):
    return {"round": rnd, "ranks": ranks, "variant": variant, "samples_per_s": samples,
            "train_time_s": 100.0 / samples, "final_liver_dice": dice, "first_step_s": first,
            "precision": {"choice": choice if variant == "auto" else variant, "trial_s": trial}}


def test_the_demo_table_takes_medians_and_the_trials_cost():
    rows = []
    for ranks in (1, 2):
        for rnd, (auto, f32, bf16) in enumerate([(40.0, 30.0, 42.0), (50.0, 25.0, 48.0), (45.0, 35.0, 44.0)]):
            rows += [row(rnd, ranks, "auto", auto * ranks, 0.80, 3.0, trial=2.0 + rnd),
                     row(rnd, ranks, "float32", f32 * ranks, 0.78, 2.0),
                     row(rnd, ranks, "bfloat16", bf16 * ranks, 0.79, 2.5)]
    table = bench_precision_auto.demo_table(rows)
    for ranks in (1, 2):
        t = table[ranks]
        assert t["choice"] == "bfloat16" and t["trial_s"] == 3.0
        assert t["samples_ratio_auto_vs_float32"] == pytest.approx(45.0 / 30.0)
        assert t["dice_auto_minus_float32"] == pytest.approx(0.02)
        # the trial plus auto's first step, less the first step of the run told bfloat16
        assert t["trial_cost_s"] == pytest.approx(3.0 + 3.0 - 2.5)
        assert t["trial_cost_share"] == pytest.approx(3.5 / (100.0 / (45.0 * ranks)))
