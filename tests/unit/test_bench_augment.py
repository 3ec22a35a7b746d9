"""benchmarks/bench_augment.py (``make bench-augment``) on tiny data: one round of
``none`` and ``light`` on the smoke model, each a real pinned ``distseg-train`` run of
one step per epoch, and the augmenter alone; its results file holds every run, the
ratio to ``none`` and the augmenter's share of a step. Nothing is asserted about a
speed, only that each figure is there and finite."""

from __future__ import annotations

import math
import os

from support import BENCHMARKS, benchmark_results, run_benchmark

SCRIPT = os.path.join(BENCHMARKS, "bench_augment.py")


def test_one_round_on_tiny_data_writes_each_kinds_ratio_and_cost(tiny, tmp_path):
    run_benchmark(SCRIPT, "--data", tiny, "--preset", "smoke", "--kinds", "none,light", "--rounds", "1",
                  "--epochs", "2", "--steps", "1", "--skip", "3d", "--samples", "4",
                  "--results-dir", str(tmp_path))
    result = benchmark_results(tmp_path, "augment")
    assert "3d" not in result
    runs, table, alone = result["2d"]["runs"], result["2d"]["table"], result["2d"]["augmenter"]
    assert [(r["augment"], r["round"], r["steps"]) for r in runs] == [("none", 0, 1), ("light", 0, 1)]
    assert set(table) == {"none", "light"} and table["none"]["step_ratio_vs_none"] == 1.0
    assert math.isfinite(table["light"]["step_ratio_vs_none"]) and table["light"]["step_ratio_vs_none"] > 0
    assert set(alone) == {"light"}
    assert alone["light"]["ms_per_sample"] > 0 and math.isfinite(alone["light"]["share_of_step"])


def test_kinds_without_the_baseline_are_refused_before_any_run(tmp_path):
    out = run_benchmark(SCRIPT, "--kinds", "light,default", "--results-dir", str(tmp_path),
                        timeout=60, check=False)
    assert out.returncode == 2 and "--kinds light,default: expected none" in out.stderr
    assert os.listdir(tmp_path) == []
