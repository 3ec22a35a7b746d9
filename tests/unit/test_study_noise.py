"""benchmarks/study_noise.py (part of ``make bench-stateff``) in pieces: the command
line of each arm (the 2-rank reference under horovodrun, each one-rank arm its step
variant on its own core), then one real one-rank arm on tiny data (the ``consecutive``
step through ``benchlib.train_variant``) read back as the study reads a run, and the
results file written from it. The 2-rank reference is not launched here: its command
is the one checked above, and 2-rank distseg-train runs are tests/e2e's."""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys

from support import BENCHMARKS

sys.path.insert(0, BENCHMARKS)

import study_noise  # noqa: E402

from benchlib import launch  # noqa: E402


def settings(data: str, results_dir: str = "") -> argparse.Namespace:
    return argparse.Namespace(data=data, preset="smoke", seeds=[0], epochs=2, workdir=None,
                              results_dir=results_dir)


def test_each_arm_runs_its_step_on_its_core_and_the_reference_on_two_ranks():
    a = settings("d.h5")
    flags = ["--preset", "smoke", "--data", "d.h5", "--epochs", "2", "--seed", "3", "--no-tensorboard"]
    for core, (arm, step) in enumerate(study_noise.ONE_RANK.items()):
        cmd, run_dir = study_noise.command(a, arm, 3, core, "/w")
        assert run_dir == f"/w/{arm}-s3"
        assert cmd == launch.train_command(flags, run_dir, threads=1, core=core, variant=["--step", step])
    cmd, run_dir = study_noise.command(a, study_noise.REFERENCE, 3, None, "/w")
    assert cmd == launch.train_command(flags, run_dir, ranks=2, threads=1)
    assert cmd[:5] == launch.horovodrun(2)


def test_a_one_rank_arm_on_tiny_data_is_read_and_written_as_the_study_does(tiny, tmp_path):
    a = settings(tiny, str(tmp_path / "results"))
    run_dir = study_noise.train(a, "consecutive", 0, None, str(tmp_path))
    assert study_noise.methods(run_dir) == ["consecutive"]
    curve = study_noise.b_simple_by_epoch(run_dir)
    # None where the estimate is not defined yet (|G|^2 not above 0), which depends on
    # which steps the cadence measured: either is the study's to read.
    assert len(curve) == 2 and all(b is None or math.isfinite(b) for b in curve)
    # The run stands for every arm: each one-rank estimate is its own reference.
    row = study_noise.seed_row(0, {arm: run_dir for arm in [*study_noise.ONE_RANK, study_noise.REFERENCE]})
    want = None if curve[1] is None else 1.0
    assert row["halves_ratio"] == row["consecutive_ratio"] == want
    path = study_noise.report(a, [row, {**row, "seed": 1, "halves_ratio": 3.0, "consecutive_ratio": None}])
    (written,) = glob.glob(str(tmp_path / "results" / "noise-study-*.json"))
    assert written == path
    with open(path) as f:
        result = json.load(f)
    assert result["median_ratio"] == {"halves": 3.0 if want is None else 2.0, "consecutive": want}
    assert result["seeds"][0]["b_simple"]["consecutive"] == curve
