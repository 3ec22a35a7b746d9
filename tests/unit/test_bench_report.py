"""benchmarks/bench_report.py on tiny generated logs: it writes a run, runs
``distseg-report`` on it and checks the report against what it wrote; and the check
finds a report that disagrees. Limits far above any machine's time and memory: the
test asserts the numbers, never a speed."""

from __future__ import annotations

import json
import os
import sys

from support import BENCHMARKS, run_benchmark

sys.path.insert(0, BENCHMARKS)

import bench_report  # noqa: E402

SCRIPT = os.path.join(BENCHMARKS, "bench_report.py")
RANKS, STEPS, PER_EPOCH = 2, 400, 100


def test_the_report_of_generated_logs_holds_what_was_written(tmp_path):
    out = run_benchmark(SCRIPT, "--ranks", str(RANKS), "--steps", str(STEPS), "--steps-per-epoch",
                        str(PER_EPOCH), "--gen-processes", "1", "--keep", str(tmp_path),
                        "--limit-s", "1e9", "--limit-gib", "1e3")
    assert "report check failed" not in out.stdout and "PASS" in out.stdout
    with open(tmp_path / "report" / "report.json") as f:
        epochs = json.load(f)["tables"]["time_per_epoch"][0]
    assert (epochs["ranks"], epochs["epochs"]) == (RANKS, STEPS // PER_EPOCH)

    report = str(tmp_path / "report")
    assert bench_report.check_report(report, RANKS, STEPS, PER_EPOCH) == []
    wrong = bench_report.check_report(report, RANKS + 1, STEPS, PER_EPOCH)
    assert any("time_per_epoch says 2 ranks" in p for p in wrong)
    assert any("rank_balance counted" in p for p in wrong)
