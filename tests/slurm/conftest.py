"""A real one-node Slurm for the tests of this folder: ``scripts/slurm-cluster.sh``
starts munged, slurmctld and slurmd (installing slurm-wlm and munge with apt when
missing) for the test session, in a folder of its own and on free ports, and stops
them, by their own PID files, at the end. ``slurm2``: a second cluster of two nodes,
each slurmd in network, UTS and mount namespaces of its own (``--nodes 2``), for jobs
across nodes; its namespaces and bridge are removed at the end."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from support import REPO, launcher_free_env

SCRIPT = os.path.join(REPO, "scripts", "slurm-cluster.sh")
#: The two-node cluster's links (``--link-rate``): a 1 Gbit/s partition.
LINK_RATE = "1gbit"


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

    def __init__(self, folder: str, **env: str):
        self.folder = folder
        self.conf = os.path.join(folder, "slurm.conf")
        self.env = launcher_free_env(SLURM_CONF=self.conf, **env)

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

    def daemon_lines(self, job_id: str, most: int = 40) -> str:
        """The last ``most`` lines of slurmctld's and the slurmds' logs that name the job:
        why Slurm failed a launch that wrote nothing to the job's output. Either case
        (slurmd writes "Job N already killed"), and slurmstepd's "[N.batch]" lines."""
        names = re.compile(rf"(JobId={job_id}\b|job {job_id}\b|StepId={job_id}\.|\[{job_id}\.)",
                           re.IGNORECASE)
        lines = []
        for name in sorted(os.listdir(self.folder)):
            if name.startswith(("slurmctld", "slurmd")) and name.endswith(".log"):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    lines += [f"{name}: {line.rstrip()}" for line in f if names.search(line)]
        return "\n".join(lines[-most:])

    def describe(self, job_id: str, info: dict[str, str] | None = None, tail: int = 3000) -> str:
        """What a failed test shows of a job: its state, the end of its output and
        Slurm's own log lines on it (``daemon_lines``)."""
        info = self.job(job_id) if info is None else info
        path = info.get("StdOut", "")
        # errors="replace": a progress bar cut in the middle of a character
        out = open(path, errors="replace").read()[-tail:] if path and os.path.exists(path) else "(none)"
        return (f"job {job_id}: {info.get('JobState')} (reason {info.get('Reason')}, restarts "
                f"{info.get('Restarts')}, exit code {info.get('ExitCode')}, run time "
                f"{info.get('RunTime')})\n--- its output ({path}):\n{out}\n"
                f"--- Slurm's logs on job {job_id}:\n{self.daemon_lines(job_id)}")

    #: States of a job that has ended: the base states Slurm leaves a job in (unless it
    #: is requeued). Every other state is waited through: PENDING, RUNNING, SUSPENDED,
    #: and what scontrol shows instead while a flag is set (COMPLETING, SIGNALING,
    #: REQUEUED, REQUEUE_HOLD, CONFIGURING, RESIZING, STAGE_OUT, ...), which a poll can
    #: catch at any time.
    ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
             "PREEMPTED", "BOOT_FAIL", "DEADLINE")

    def wait_until(self, job_id: str, done, timeout: float = 180, poll: float = 1.0,
                   what: str = "done") -> dict[str, str]:
        """Waits until ``done(fields)``; the job's fields. When the job ends (``ENDED``)
        without ``done``, or on timeout (the job is cancelled then), the test fails with
        ``describe``. ``done`` says what the test waits for, not which states it expects:
        any state the job passes through is waited through."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if done(info):
                return info
            if info.get("JobState") in self.ENDED:
                pytest.fail(f"job {job_id} ended before it was {what}\n{self.describe(job_id, info)}")
            if time.monotonic() > deadline:
                break
            time.sleep(poll)
        self.run("scancel", job_id, check=False)
        pytest.fail(f"job {job_id} not {what} within {timeout} s\n{self.describe(job_id, info)}")

    def wait(self, job_id: str, states=ENDED, timeout: float = 180, poll: float = 1.0) -> dict[str, str]:
        """Waits until the job is in one of ``states``; its fields."""
        return self.wait_until(job_id, lambda i: i.get("JobState") in states, timeout, poll,
                               what=f"in {states}")

    def wait_running(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        return self.wait(job_id, ("RUNNING",), timeout=timeout, poll=0.3)


#: Attempts at starting a cluster whose daemons found their port taken: the ports are
#: free when chosen, but nothing holds them until slurmctld and slurmd bind them.
START_ATTEMPTS = 3
#: What a daemon logs when its port was taken in between.
PORT_TAKEN = "already in use"


def _port_was_taken(folder: str) -> bool:
    """Whether a daemon of the cluster in ``folder`` failed to bind its port."""
    for name in os.listdir(folder):
        if name.endswith(".log"):
            with open(os.path.join(folder, name), errors="replace") as f:
                if PORT_TAKEN in f.read():
                    return True
    return False


def _start(options, env_extra) -> tuple[str, int, dict]:
    """scripts/slurm-cluster.sh started in a new folder on a free port pair, again on
    new ports when a daemon's port was taken in between; (folder, port, env)."""
    for attempt in range(1, START_ATTEMPTS + 1):
        folder = tempfile.mkdtemp(prefix="distseg-slurm-")
        port = _free_port_pair()
        env = dict(os.environ, DISTSEG_SLURM_PORT=str(port), **env_extra)
        try:
            started = subprocess.run(["bash", SCRIPT, "start", folder, *options], env=env,
                                     capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            _stop(folder, env)
            pytest.fail("scripts/slurm-cluster.sh start did not finish in 600 s")
        if started.returncode == 0:
            return folder, port, env
        retry = attempt < START_ATTEMPTS and _port_was_taken(folder)
        _stop(folder, env)
        if not retry:
            pytest.fail(f"the test cluster did not start: {started.stdout[-2000:]}"
                        f"{started.stderr[-2000:]}")
    raise AssertionError("unreachable")


def _stop(folder: str, env: dict) -> None:
    subprocess.run(["bash", SCRIPT, "stop", folder], env=env, timeout=120)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _cluster(*options: str, **env: str):
    """Starts scripts/slurm-cluster.sh in a new folder with ``options`` and ``env``;
    yields (folder, port); stops it and removes the folder afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster runs its daemons as root (CI is root)")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("no slurmctld and no apt-get to install it")
    folder, port, full_env = _start(options, env)
    try:
        yield folder, port
    finally:
        _stop(folder, full_env)


@pytest.fixture(scope="session")
def slurm():
    """The test cluster, started once for the session and stopped at its end."""
    with _cluster() as (folder, _):
        yield Cluster(folder)


def _why_no_namespaces() -> str | None:
    """Why the two-node cluster cannot run here, or None (tried, not guessed)."""
    if os.geteuid() != 0:
        return "the two-node Slurm cluster needs root (network namespaces, a bridge, slurmd)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the two-node Slurm cluster needs {tool}, not found"
    probe = f"dsprobe{os.getpid() % 100000}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        return f"ip netns add is not permitted here: {out.stderr.strip()}"
    try:
        out = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "--mount", "true"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            return f"unshare --uts --mount is not permitted here: {out.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


@pytest.fixture(scope="session")
def slurm2():
    """A second cluster, of two nodes in network namespaces (one CPU each), on a
    bridge of its own: ``.nodes`` are their names (also their host names), ``.links``
    the veth ends on this side, one per node, each way shaped to ``LINK_RATE``. Its
    jobs' Open MPI is held to that link (TCP only, no shared memory between the ranks),
    as in tests/e2e/test_netns.py."""
    reason = _why_no_namespaces()
    if reason:
        pytest.skip(reason)
    net = f"10.78.{os.getpid() % 250}"
    subnet = f"{net}.0/24"
    with _cluster("--nodes", "2", "--link-rate", LINK_RATE, DISTSEG_SLURM_NET=net,
                  DISTSEG_SLURM_CPUS="1") as (folder, port):
        cluster = Cluster(folder, OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,tcp",
                          OMPI_MCA_btl_tcp_if_include=subnet, OMPI_MCA_oob_tcp_if_include=subnet)
        cluster.nodes = [f"dss{port}n1", f"dss{port}n2"]
        cluster.links = [f"dss{port}h1", f"dss{port}h2"]
        yield cluster
