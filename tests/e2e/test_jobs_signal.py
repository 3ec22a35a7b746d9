"""A rendered job script at the time limit, for real: Slurm's USR1 (``#SBATCH
--signal=B:USR1@300``) reaches the ranks through the script and the launcher, the run
checkpoints and exits 130, and the same script submitted again continues it."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from distseg.core import rundir

from support import BIN, background, finish, log_records, wait_for_log
from support import jobs_cli as cli
from support import slurm_env as _slurm_env

pytestmark = pytest.mark.timeout(400)


def _records(run_dir, rank):
    return log_records(run_dir, rank, running=True)


def test_usr1_before_the_limit_checkpoints_and_the_job_resumes(tiny, tmp_path):
    # Slurm's own commands are hidden from the script (support.slurm_env), so it runs
    # with mpirun under the hand-made allocation where Slurm is installed too.
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (scripts/install.sh installs openmpi-bin)")
    runs = tmp_path / "runs"
    out = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2",
              "--data", tiny, "--runs-dir", str(runs), "--name", "sig", "--preset", "smoke",
              "--epochs", "40", "--venv", os.path.dirname(BIN))
    assert out.exit_code == 0, out.output
    assert "#SBATCH --signal=B:USR1@300" in out.stdout and "#SBATCH --requeue" in out.stdout
    script = tmp_path / "sig.sbatch"
    script.write_text(out.stdout)
    env = _slurm_env(nodes=1, tasks=2, per_node=2, cpus=2)
    run_dir = str(runs / "sig-n1")

    with background(["bash", str(script)], env=env) as proc:
        wait_for_log(run_dir, 1, '"global_step":20,', proc, 150)
        proc.send_signal(signal.SIGUSR1)  # what Slurm sends to the batch shell
        # 60 s guards against a hang, on any machine; how soon it stops is in steps below.
        log, _ = finish(proc, 60, "the job did not stop within 60 s of USR1")
    assert proc.returncode == 130, log[-3000:]
    assert "submit this script again to continue with --resume" in log
    ends = [_records(run_dir, r)[-1] for r in (0, 1)]
    assert [e["status"] for e in ends] == ["interrupted", "interrupted"], ends
    latest = json.load(open(rundir.latest_path(run_dir)))
    assert latest["epoch"] * 16 + latest["step"] >= 20
    # It stopped at its checkpoint after the signal, far from the 40 epochs' end, and
    # wrote no step past that checkpoint.
    logged = [r["global_step"] for r in _records(run_dir, 0) if r["type"] == "step"]
    assert max(logged) + 1 == latest["epoch"] * 16 + latest["step"] < 40 * 16 // 2

    # The requeued job: the same script continues the run from the checkpoint (stopped
    # again a few steps later; 40 epochs would take too long here).
    with background(["bash", str(script)], env=env) as again:
        wait_for_log(run_dir, 1, f'"global_step":{latest["epoch"] * 16 + latest["step"] + 5},', again, 150)
        again.send_signal(signal.SIGUSR1)
        log2, _ = finish(again, 60, "the resumed job did not stop within 60 s of USR1")
    assert again.returncode == 130, log2[-3000:]
    resumes = [r for r in _records(run_dir, 0) if r["type"] == "resume"]
    assert len(resumes) == 1
    assert (resumes[0]["from_epoch"], resumes[0]["from_step"]) == (latest["epoch"], latest["step"])
