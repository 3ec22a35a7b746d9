"""A real one-node Slurm for the tests of this folder: ``scripts/slurm-cluster.sh``
starts munged, slurmctld and slurmd (installing slurm-wlm and munge with apt when
missing) for the test session, in a folder of its own and on free ports, and stops
them, by their own PID files, at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from support import REPO, command_env

SCRIPT = os.path.join(REPO, "scripts", "slurm-cluster.sh")


def _free_port_pair() -> int:
    """A port p with p and p + 1 free (slurmctld and slurmd)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports found")


class Cluster:
    """The running test cluster: its environment and the Slurm commands the tests use."""

    def __init__(self, folder: str):
        self.folder = folder
        self.conf = os.path.join(folder, "slurm.conf")
        self.env = {k: v for k, v in command_env().items()
                    if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_"))}
        self.env["SLURM_CONF"] = self.conf

    def run(self, *cmd: str, cwd: str | None = None, timeout: float = 30,
            check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm (or any) command against this cluster, failing the test on a hang."""
        try:
            res = subprocess.run(list(cmd), env=self.env, cwd=cwd, capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s")
        if check and res.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {res.returncode}: {res.stdout[-2000:]}{res.stderr[-2000:]}")
        return res

    def sbatch(self, script: str, *args: str, cwd: str) -> str:
        """Submits ``script``; its job id."""
        return self.run("sbatch", "--parsable", *args, script, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = {}
        for item in out.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    #: States of a job that has ended.
    ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

    def wait_until(self, job_id: str, done, timeout: float = 180, poll: float = 1.0,
                   what: str = "done") -> dict[str, str]:
        """Waits until ``done(fields)``; the job's fields. On timeout the job is
        cancelled and the test fails with its state and output."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if done(info):
                return info
            if time.monotonic() > deadline:
                break
            time.sleep(poll)
        self.run("scancel", job_id, check=False)
        out = info.get("StdOut", "")
        tail = open(out).read()[-3000:] if out and os.path.exists(out) else ""
        pytest.fail(f"job {job_id} not {what} within {timeout} s: {info.get('JobState')} "
                    f"(restarts {info.get('Restarts')})\n{tail}")

    def wait(self, job_id: str, states=ENDED, timeout: float = 180, poll: float = 1.0) -> dict[str, str]:
        """Waits until the job is in one of ``states``; its fields."""
        return self.wait_until(job_id, lambda i: i.get("JobState") in states, timeout, poll,
                               what=f"in {states}")

    def wait_running(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        return self.wait(job_id, ("RUNNING",), timeout=timeout, poll=0.3)


@pytest.fixture(scope="session")
def slurm():
    """The test cluster, started once for the session and stopped at its end."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster runs its daemons as root (CI is root)")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("no slurmctld and no apt-get to install it")
    folder = tempfile.mkdtemp(prefix="distseg-slurm-")
    env = dict(os.environ, DISTSEG_SLURM_PORT=str(_free_port_pair()))
    try:
        started = subprocess.run(["bash", SCRIPT, "start", folder], env=env, capture_output=True,
                                 text=True, timeout=600)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", SCRIPT, "stop", folder], env=env, timeout=120)
        pytest.fail("scripts/slurm-cluster.sh start did not finish in 600 s")
    if started.returncode != 0:
        subprocess.run(["bash", SCRIPT, "stop", folder], env=env, timeout=120)
        pytest.fail(f"the test cluster did not start: {started.stdout[-2000:]}{started.stderr[-2000:]}")
    try:
        yield Cluster(folder)
    finally:
        subprocess.run(["bash", SCRIPT, "stop", folder], env=env, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
