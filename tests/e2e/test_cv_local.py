"""A cross-validation as a user runs it without Slurm: ``distseg-data folds``, then
``distseg-jobs cv`` and ``distseg-jobs cv-run``, real trainings on a data file the test
writes. Every fold validates its own cases and trains on the others'; a CV stopped in
the middle of a fold continues from that fold's checkpoint, every epoch logged once."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from distseg.core import cvplan, rundir
from distseg.data import folds, synth

from support import BIN, background, command_env, finish, log_records, wait_for, wait_for_log
from support import jobs_cli as cli

pytestmark = pytest.mark.timeout(600)

#: Epochs of the stopped CV's runs: short ones (2 steps), so many that the first fold is
#: still early on when the test holds it, on any machine.
EPOCHS = 20


@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    """Tiny phantom slices (8 cases x 16) with 2 folds over the cases."""
    path = str(tmp_path_factory.mktemp("cvdata") / "folded.h5")
    synth.make_dataset(path, cases=8, size=32, seed=0, slices_per_case=16)
    res = subprocess.run([f"{BIN}/distseg-data", "folds", path, "--folds", "2", "--seed", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return path


def _plan(data, out, ranks_per_node, epochs, *recipes):
    res = cli("cv", "--partition", "generic", "--cores-per-node", "2", "--ranks-per-node",
              str(ranks_per_node), "--data", data, "--out", str(out), "--epochs", str(epochs),
              *[a for r in recipes for a in ("--recipe", r)])
    assert res.exit_code == 0, res.output
    return cvplan.read(str(out))


def _cv_run(out, *extra, timeout=420):
    return subprocess.run([f"{BIN}/distseg-jobs", "cv-run", str(out), *extra], capture_output=True,
                          text=True, timeout=timeout, env=command_env())


def _epochs(run_dir) -> list[int]:
    return [r["epoch"] for r in log_records(run_dir, 0, running=True) if r["type"] == "epoch"]


def test_each_fold_validates_its_own_cases_at_two_ranks(folded, tmp_path):
    out = tmp_path / "cv"
    plan = _plan(folded, out, 2, 1, "ce=--preset smoke --loss dice_ce --max-steps-per-epoch 3")
    res = _cv_run(out, "--no-report")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "trained 2, already done 0, failed 0" in res.stdout
    table = folds.read_table(folded)
    for run in plan.runs:
        path = plan.run_path(str(out), run)
        with open(rundir.config_path(path)) as f:
            cfg = json.load(f)
        assert cfg["data"]["fold"] == run.fold
        assert cfg["train"]["loss"] == "dice_ce"
        record = next(r for r in log_records(path, 0) if r["type"] == "run")
        assert record["size"] == 2
        val_cases = int((table.roles[run.fold] == folds.VAL).sum())
        assert record["dataset"]["val_samples"] == 16 * val_cases
        assert record["dataset"]["train_samples"] == 16 * (8 - val_cases)
    # Called again, the plan is done: nothing trains.
    again = _cv_run(out, "--no-report")
    assert again.returncode == 0 and "trained 0, already done 2, failed 0" in again.stdout


def test_a_cv_stopped_mid_fold_resumes_that_fold_and_loses_no_epoch(folded, tmp_path):
    out = tmp_path / "cv"
    plan = _plan(folded, out, 1, EPOCHS, "base=--preset smoke --max-steps-per-epoch 2")
    first = plan.run_path(str(out), plan.runs[0])
    said = tmp_path / "cv-run.out"
    with open(said, "w") as sink, background(
            [f"{BIN}/distseg-jobs", "cv-run", str(out), "--no-report"], env=command_env(),
            stdout=sink, stderr=subprocess.STDOUT) as proc:
        # The first fold trains: hold it (SIGSTOP), so the stop finds it training however
        # fast it trains (its epochs are many and short), and stop the CV as `kill`
        # would: the runner passes SIGTERM on to the run, which checkpoints at its next
        # step.
        wait_for_log(first, 0, '"type":"step"', proc, timeout=300)
        pid = log_records(first, 0, running=True)[0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            os.kill(proc.pid, signal.SIGTERM)
            wait_for(lambda: "SIGTERM passed on to the run" in said.read_text(), 30,
                     "the runner passing SIGTERM on", proc=proc)
        finally:
            os.kill(pid, signal.SIGCONT)
        finish(proc, 120)
    output = said.read_text()
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted; distseg-jobs cv-run" in output
    assert not os.path.exists(rundir.config_path(plan.run_path(str(out), plan.runs[1])))
    res = _cv_run(out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"{plan.runs[0].label}: " in res.stdout and "--resume" in res.stdout
    for run in plan.runs:
        assert _epochs(plan.run_path(str(out), run)) == list(range(EPOCHS))
    ends = [r["status"] for r in log_records(first, 0) if r["type"] == "end"]
    assert ends == ["interrupted", "ok"]
    with open(out / "report" / "report.json") as f:
        runs = json.load(f)["tables"]["cv_runs"]
    assert sorted((r["fold"], r["status"], r["counted"]) for r in runs) == [
        (0, "ok", True), (1, "ok", True)]


def test_a_fold_that_fails_is_listed_and_the_next_one_trains(folded, tmp_path):
    out = tmp_path / "cv"
    plan = _plan(folded, out, 1, 1, "base=--preset smoke --max-steps-per-epoch 2 --no-validate")
    # The first fold's run directory cannot be made (a file stands in its way).
    blocked = dict(json.load(open(out / "cv.json")))
    blocked["runs"][0]["run_dir"] = "in-the-way/fold-0"
    (out / "cv.json").write_text(json.dumps(blocked))
    (out / "in-the-way").write_text("a file, not a folder")
    res = _cv_run(out, "--no-report")
    assert res.returncode == 1, res.stdout[-3000:]
    assert f"{plan.runs[0].label}: failed (exit 2)" in res.stdout
    assert "trained 1, already done 0, failed 1" in res.stdout
    assert _epochs(plan.run_path(str(out), plan.runs[1])) == [0]
