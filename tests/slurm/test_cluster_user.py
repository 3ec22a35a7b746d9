"""distseg installed and run the way a cluster user does (docs/install.md): an account of
its own, without root or sudo, whose PATH has no ``dpkg``, ``apt`` or ``sudo``, whose MPI
and Python come from environment modules (Debian's Lmod), installing with the documented
command into a virtual environment in its home, then a 2-rank ``sbatch`` job rendered by
``distseg-jobs render --setup 'module load ...'`` on the test Slurm, and the report.

Three installs' worth of claims are checked on the way:
- the MPI the install builds Horovod and mpi4py against is the module's (the wrappers
  first on PATH), printed by the install and recorded in the environment;
- the build needs no hash headers from Debian's ``libhighwayhash-dev``/``libfarmhash-dev``:
  the first install runs with them hidden (a mount namespace: an empty folder over
  ``/usr/include/highwayhash``, a header that stops the compiler over ``farmhash.h``);
- a second environment installs from the first one's wheelhouse with no network at all
  (a network namespace of its own, ``OFFLINE=1``), and that is the one the job uses.

What this does not prove: the module's MPI prefix holds symlinks to Debian's Open MPI,
the only Open MPI here, so the test shows that the MPI first on PATH is the one picked,
not that another Open MPI build works; no RHEL machine and no Intel MPI were tried.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time

import pytest

from distseg.core import rundir

from support import REPO, path_without

pytestmark = pytest.mark.timeout(2400)

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"
MPI_MODULE, PYTHON_MODULE = "openmpi/4.1.4", "python/3.11"
#: Left out of the account's PATH: package tools, sudo, and every MPI wrapper and Python
#: (those come from the modules).
HIDDEN = ("dpkg", "apt", "sudo", "su", "mpi", "python", "pip")
#: The module's MPI prefix: each name, and the Debian Open MPI program it stands for.
MPI_PROGRAMS = {"mpicc": "mpicc.openmpi", "mpicxx": "mpicxx.openmpi", "mpic++": "mpic++.openmpi",
                "mpirun": "mpirun.openmpi", "mpiexec": "mpiexec.openmpi"}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "making a user account needs root (CI is root)"
    for tool in ("useradd", "userdel", "runuser", "unshare", "mpicc.openmpi", "python3.11"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/bin/{tool}"):
            return f"{tool} not found"
    if not os.path.exists(LMOD_INIT):
        return f"Lmod not installed ({LMOD_INIT}; scripts/slurm-cluster.sh install adds it)"
    return None


def _modules(site: str) -> str:
    """Lua modulefiles for the MPI and Python, each a prefix put first on PATH."""
    mpi_bin = os.path.join(site, "openmpi-4.1.4", "bin")
    py_bin = os.path.join(site, "python-3.11", "bin")
    os.makedirs(mpi_bin)
    os.makedirs(py_bin)
    for name, target in MPI_PROGRAMS.items():
        os.symlink(os.path.join("/usr/bin", target), os.path.join(mpi_bin, name))
    for name in ("python3", "python3.11"):
        os.symlink("/usr/bin/python3.11", os.path.join(py_bin, name))
    modules = os.path.join(site, "modulefiles")
    for module, prefix in ((MPI_MODULE, mpi_bin), (PYTHON_MODULE, py_bin)):
        path = os.path.join(modules, module + ".lua")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f'whatis("{module} for the distseg tests")\nprepend_path("PATH", "{prefix}")\n')
    return modules


def _copy_repo(dest: str) -> None:
    """The working tree's files (tracked and new), as a user's clone."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


class Account:
    """The unprivileged account: its name, home, PATH and module folder."""

    def __init__(self, base: str, slurm_conf: str):
        self.name = f"dsu{os.getpid() % 100000}"
        self.home = os.path.join(base, "home")
        self.path = path_without(os.path.join(base, "site", "bin"), *HIDDEN)
        self.modules = _modules(os.path.join(base, "site"))
        self.slurm_conf = slurm_conf
        subprocess.run(["useradd", "--create-home", "--home-dir", self.home, "--shell",
                        "/bin/bash", self.name], check=True, capture_output=True)
        _copy_repo(os.path.join(self.home, "distseg"))
        subprocess.run(["chown", "-R", f"{self.name}:", self.home], check=True)

    def shell(self, script: str, timeout: float, offline: bool = False,
              hide_hash_headers: bool = False) -> tuple[subprocess.CompletedProcess, float]:
        """Runs ``script`` in bash as the account, the modules loaded, in its home; (the
        result, seconds). ``offline``: in a network namespace with no network."""
        env = {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "PATH": self.path,
               "LANG": "C.UTF-8", "SLURM_CONF": self.slurm_conf, "TF_CPP_MIN_LOG_LEVEL": "2"}
        prelude = (f"set -euo pipefail; source {LMOD_INIT}; module use {self.modules}; "
                   f"module load {MPI_MODULE} {PYTHON_MODULE}; cd ~; ")
        cmd = ["runuser", "-u", self.name, "--", "env", "-i",
               *[f"{k}={v}" for k, v in env.items()], "bash", "-c", prelude + script]
        if offline or hide_hash_headers:
            cmd = ["unshare", "--mount", *(["--net"] if offline else []), "--", "bash", "-c",
                   _hide_hash_headers() + ' exec "$@"', "hide", *cmd]
        t0 = time.monotonic()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"as {self.name}: {script!r} did not finish in {timeout} s: {e.stdout}")
        return res, time.monotonic() - t0

    def remove(self) -> None:
        subprocess.run(["pkill", "-KILL", "-u", self.name], capture_output=True)
        subprocess.run(["userdel", self.name], capture_output=True)


def _hide_hash_headers() -> str:
    """Shell lines (run in the new mount namespace) that hide Debian's hash headers."""
    lines = []
    if os.path.isdir("/usr/include/highwayhash"):
        lines.append("mount -t tmpfs none /usr/include/highwayhash;")
    if os.path.exists("/usr/include/farmhash.h"):
        lines.append("printf '#error \"Debian farmhash.h used\"\\n' > /tmp/.ds-farmhash.h;"
                     " mount --bind /tmp/.ds-farmhash.h /usr/include/farmhash.h;")
    return " ".join(lines)


@pytest.fixture(scope="module")
def account(slurm):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    base = tempfile.mkdtemp(prefix="distseg-user-")
    os.chmod(base, 0o755)
    acct = Account(base, slurm.conf)
    try:
        yield acct
    finally:
        acct.remove()
        shutil.rmtree(base, ignore_errors=True)


def _install(account: Account, venv: str, **kw) -> tuple[str, float]:
    env = " ".join(f"{k}={v}" for k, v in {"SKIP_APT": 1, "VENV": venv, "WHEELHOUSE": "~/wheels",
                                           **kw.pop("env", {})}.items())
    res, seconds = account.shell(f"cd distseg && {env} bash scripts/install.sh", timeout=1500, **kw)
    assert res.returncode == 0, f"install into {venv}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr, seconds


def test_a_cluster_user_installs_without_root_and_runs_a_two_rank_sbatch_job(account, slurm, tiny):
    assert pwd.getpwnam(account.name).pw_uid != 0
    no_root, _ = account.shell("command -v dpkg apt-get sudo || echo none; id -u", timeout=30)
    assert no_root.stdout.split() == ["none", str(pwd.getpwnam(account.name).pw_uid)], no_root.stdout

    cold, cold_s = _install(account, "~/venvs/online", hide_hash_headers=True)
    mpi_bin = os.path.join(os.path.dirname(account.modules), "openmpi-4.1.4", "bin")
    assert f"wrappers {mpi_bin}/mpicxx" in cold, cold
    assert "MPI: Open MPI" in cold and "building horovod" in cold, cold
    assert "[X] MPI" in cold and "[X] Gloo" in cold, cold
    # The online venv has said what it had to; removing it keeps the test's peak to one venv
    # and the wheelhouse (about 2 GB less), so a shared CI disk does not run out mid-install.
    gone, _ = account.shell("rm -rf ~/venvs/online ~/.cache/pip", timeout=120)
    assert gone.returncode == 0, gone.stdout + gone.stderr

    warm, warm_s = _install(account, "~/venvs/offline", offline=True, env={"OFFLINE": 1})
    assert "building horovod" not in warm and "filling the wheelhouse" not in warm, warm
    print(f"install as a cluster user: cold (online, empty wheelhouse) {cold_s:.0f} s, "
          f"warm (offline, from the wheelhouse) {warm_s:.0f} s")

    shutil.copy(tiny, os.path.join(account.home, "tiny.h5"))
    subprocess.run(["chown", account.name, os.path.join(account.home, "tiny.h5")], check=True)
    render = ("~/venvs/offline/bin/distseg-jobs render --partition generic --nodes 1 "
              "--ranks-per-node 2 --data ~/tiny.h5 --runs-dir ~/runs --name cu --preset smoke "
              f"--epochs 1 --no-validate --time 00:05:00 --setup 'module load {MPI_MODULE} "
              f"{PYTHON_MODULE}' > cu.sbatch && sbatch --parsable cu.sbatch")
    sub, _ = account.shell(render, timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job = sub.stdout.strip().split(";")[0]
    info = slurm.wait(job, timeout=600)
    assert info["JobState"] == "COMPLETED", slurm.describe(job, info)
    assert info["UserId"].startswith(account.name), info["UserId"]

    run_dir = os.path.join(account.home, "runs", "cu-n1")
    report, _ = account.shell(f"~/venvs/offline/bin/distseg-report {run_dir} --out ~/report",
                              timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    assert os.path.exists(os.path.join(account.home, "report", "report.json"))
    assert all(os.path.exists(rundir.log_path(run_dir, rank)) for rank in (0, 1)), run_dir
