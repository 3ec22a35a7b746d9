"""A cross-validation through the real Slurm (the ``slurm`` fixture): ``distseg-jobs cv``
writes one job per fold, ``submit.sh`` submits them side by side and the report after
all of them; one fold's job gets the time-limit signal mid-run (USR1 to the batch
shell, as ``#SBATCH --signal=B:USR1@...`` sends it), checkpoints, requeues itself and
resumes, and the report counts that fold once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from distseg.core import cvplan, rundir

from support import BIN, log_records, wait_for
from support import jobs_cli as cli

pytestmark = pytest.mark.timeout(900)

EPOCHS = 30


def _epochs(run_dir: str) -> list[int]:
    """The epochs rank 0 logged so far (none before its job starts)."""
    if not os.path.exists(rundir.log_path(run_dir, 0)):
        return []
    return [r["epoch"] for r in log_records(run_dir, 0, running=True) if r["type"] == "epoch"]


def test_cv_folds_as_jobs_one_killed_at_its_limit_resumes_and_counts_once(slurm, tiny, tmp_path):
    data = str(tmp_path / "folded.h5")
    shutil.copy(tiny, data)
    res = subprocess.run([f"{BIN}/distseg-data", "folds", data, "--folds", "2"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "cv"
    res = cli("cv", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "1",
              "--data", data, "--out", str(out), "--epochs", str(EPOCHS), "--time", "00:10:00",
              "--venv", os.path.dirname(BIN),
              "--recipe", "smoke=--preset smoke --max-steps-per-epoch 4", "--target-dice", "0.3")
    assert res.exit_code == 0, res.output
    plan = cvplan.read(str(out))
    sub = slurm.run("bash", str(out / "submit.sh"), cwd=str(out))
    ids = re.findall(r"as job (\d+)", sub.stdout)
    assert len(ids) == 3, sub.stdout
    fold_jobs, report_job = ids[:2], ids[2]
    # Side by side: no fold waits for another; the report waits for both.
    assert all(slurm.job(j)["Dependency"] == "(null)" for j in fold_jobs)
    # Slurm shows it as afterany:A(unfulfilled),afterany:B(unfulfilled) (or afterany:A:B).
    assert sorted(re.findall(r"(\d+)", slurm.job(report_job)["Dependency"])) == sorted(fold_jobs)
    assert "afterany" in slurm.job(report_job)["Dependency"]

    first = plan.run_path(str(out), plan.runs[0])
    wait_for(lambda: len(_epochs(first)) >= 2, 300, "fold 0's second epoch")
    # The time limit's signal, sent now rather than waited for.
    slurm.run("scancel", "--signal=USR1", "--batch", fold_jobs[0])
    slurm.wait_until(fold_jobs[0], lambda i: i["Restarts"] != "0", timeout=180, what="requeued")
    slurm.wait_until(fold_jobs[0], lambda i: i["JobState"] == "PENDING", timeout=60, poll=0.5,
                     what="pending again")
    time.sleep(2)  # slurmd refuses a launch in the second it killed the last one
    slurm.run("scontrol", "update", f"JobId={fold_jobs[0]}", "StartTime=now")
    report = slurm.wait(report_job, timeout=600)
    assert (report["JobState"], report["ExitCode"]) == ("COMPLETED", "0:0"), slurm.describe(report_job, report)

    ends = [r["status"] for r in log_records(first, 0) if r["type"] == "end"]
    assert ends == ["interrupted", "ok"]
    assert [r["type"] for r in log_records(first, 0)].count("resume") == 1
    for run in plan.runs:
        assert _epochs(plan.run_path(str(out), run)) == list(range(EPOCHS))
        assert json.load(open(rundir.config_path(plan.run_path(str(out), run))))["data"]["fold"] == run.fold
    with open(out / "report" / "report.json") as f:
        tables = json.load(f)["tables"]
    # The resumed fold is one run of the CV, counted once.
    assert sorted((r["fold"], r["status"], r["counted"]) for r in tables["cv_runs"]) == [
        (0, "ok", True), (1, "ok", True)]
    assert [(r["recipe"], r["folds"]) for r in tables["cv_hours"]] == [("smoke", 2)]
