"""A rendered job script run for real on this machine: a 1-node, 2-rank job under a
hand-made Slurm environment (``support.slurm_env``, which hides a real Slurm's commands,
so the launcher resolves to mpirun on localhost), whose run directory then goes through
distseg-report, directly and through a sweep's report script. The rendering itself is
tests/unit/test_jobs.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from distseg.cluster import jobs as jobs_lib
from distseg.core import rundir, schema
from distseg.parallel import distributed

from proc_group import run_group
from support import BIN, slurm_env
from support import jobs_cli as cli

RUN_TIMEOUT = 300


def _run_script(script, env, timeout=RUN_TIMEOUT):
    """bash SCRIPT in its own process group, killed whole on timeout."""
    res = run_group(["bash", script], env=env, timeout=timeout, merge_stderr=True)
    return res.returncode, res.stdout


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_rendered_generic_script_runs_for_real_and_reports(tiny, tmp_path):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (scripts/install.sh installs openmpi-bin)")
    runs = tmp_path / "runs"
    out = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2",
              "--data", tiny, "--runs-dir", str(runs), "--name", "local", "--preset", "smoke",
              "--epochs", "1", "--seed", "3", "--venv", os.path.dirname(BIN))
    assert out.exit_code == 0, out.output
    script = tmp_path / "local-n1.sbatch"
    script.write_text(out.stdout)

    code, log = _run_script(script, slurm_env(nodes=1, tasks=2, per_node=2, cpus=2))
    assert code == 0, log[-5000:]
    run_dir = runs / "local-n1"
    job_txt = (run_dir / rundir.JOB_FILE).read_text().splitlines()
    assert "launcher: mpirun" in job_txt
    # The job printed the settings in force: distseg's own values, as exported.
    assert {f"{k}={v}" for k, v in jobs_lib.job_environment().items()} <= set(job_txt)
    assert sorted(os.listdir(rundir.log_dir(run_dir))) == ["rank-00000.jsonl", "rank-00001.jsonl"]
    with open(rundir.config_path(run_dir)) as f:
        config = json.load(f)
    assert config["train"]["seed"] == 3 and config["data"]["path"] == tiny
    for rank in (0, 1):
        records, problems = schema.read_log(rundir.log_path(run_dir, rank))
        assert not problems
        run, end = records[0], records[-1]
        assert run["size"] == 2 and run["local_size"] == 2
        # The script's thread numbers reached the ranks: 2 CPUs / 2 ranks = 1 each.
        assert run["threads"]["intra_op"] == 1 and run["threads"]["inter_op"] == 1
        assert {k: run["horovod_env"].get(k) for k in distributed.HOROVOD_DEFAULTS} == distributed.HOROVOD_DEFAULTS
        assert end["status"] == "ok"
        assert [r for r in records if r["type"] == "epoch"]

    # The run is read by distseg-report, directly and through a sweep's report script.
    report_dir = tmp_path / "report"
    rep = subprocess.run([f"{BIN}/distseg-report", str(run_dir), "--out", str(report_dir)],
                         capture_output=True, text=True, timeout=120, env=slurm_env(1, 2, 2, 2))
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    assert (report_dir / "report.md").is_file()

    job = jobs_lib.resolve(jobs_lib.JobSpec(partition="generic", nodes=1, data=tiny, ranks_per_node=2,
                                            runs_dir=str(runs), name="other", venv=os.path.dirname(BIN)))
    report_script = tmp_path / "report.sbatch"
    report_script.write_text(jobs_lib.render_report(job, [str(run_dir), str(runs / "never-ran")],
                                                    str(tmp_path / "report2")))
    code, log = _run_script(report_script, slurm_env(1, 1, 1, 2), timeout=120)
    assert code == 0, log[-3000:]
    assert "skipping" in log and "never-ran" in log
    assert (tmp_path / "report2" / "report.md").is_file()
