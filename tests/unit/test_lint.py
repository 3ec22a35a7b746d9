"""Every shell script distseg ships or renders passes `bash -n` and shellcheck.

Linting lives here, apart from the tests of what the scripts hold (tests/test_jobs.py,
tests/test_scripts.py), so that a machine without shellcheck skips only the shellcheck
tests below, never a content test. `bash -n` runs everywhere. scripts/install.sh
installs shellcheck, so on a set-up machine nothing here skips.

Job templates hold ``@{name}`` placeholders, which shellcheck reads as odd command
names: the raw templates get `bash -n` only, and shellcheck checks them rendered, in
every partition and with the options that change their text.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from distseg.cli.jobs import jobs as jobs_cli
from distseg.cluster import jobs as jobs_lib

from support import REPO

#: Scripts kept in the repository and run as they are.
STATIC = ["scripts/install.sh", "scripts/demo.sh", ".ci/run", "docker/run-local.sh",
          "scripts/test-docker.sh"]
#: Templates that distseg-jobs fills, besides each partition's own.
SHARED_TEMPLATES = {"common.sh.in", "report.sbatch", "submit.sh"}

#: ``distseg-jobs render`` options, one rendered script each: every partition, every
#: launcher, and the options that add or drop lines (timeline, setup, account, venv).
RENDERS = {
    "knl-n1": ["--partition", "knl", "--nodes", "1"],
    "knl-n16-timeline": ["--partition", "knl", "--nodes", "16", "--ranks-per-node", "4", "--timeline"],
    "knl-flat-account": ["--partition", "knl", "--nodes", "4", "--queue", "flat-quadrant",
                         "--hw-threads", "2", "--account", "TG-ABC123"],
    "knl-setup": ["--partition", "knl", "--nodes", "2", "--queue", "development",
                  "--ranks-per-node", "3", "--setup", "module load impi"],
    "skx-n1": ["--partition", "skx", "--nodes", "1"],
    "skx-srun": ["--partition", "skx", "--nodes", "32", "--ranks-per-node", "4", "--launcher", "srun"],
    "skx-ibrun": ["--partition", "skx", "--nodes", "2", "--queue", "skx-dev", "--launcher", "ibrun",
                  "--cores-per-node", "56"],
    "generic-n1": ["--partition", "generic", "--nodes", "1", "--ranks-per-node", "2"],
    "generic-mpirun": ["--partition", "generic", "--nodes", "8", "--cores-per-node", "32",
                       "--ranks-per-node", "4", "--launcher", "mpirun", "--srun-mpi", "pmi2",
                       "--no-validate"],
    "generic-no-venv": ["--partition", "generic", "--nodes", "3", "--queue", "gpu-cpu", "--venv", "",
                        "--timeline"],
}
#: What ``distseg-jobs sweep`` writes for two node counts.
SWEEP = ["lint-n1.sbatch", "lint-n2.sbatch", "report.sbatch", "submit.sh"]


def _cli(*args: str):
    return CliRunner().invoke(jobs_cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    """Path of every rendered script, by name (``RENDERS`` keys, ``sweep/`` + ``SWEEP``).

    The data file is not opened (``--no-check-data``): linting needs the text only.
    """
    root = tmp_path_factory.mktemp("rendered")
    common = ["--data", str(root / "data.h5"), "--no-check-data", "--preset", "smoke",
              "--runs-dir", str(root / "runs"), "--epochs", "3", "--batch-size", "2"]
    paths = {}
    for name, args in RENDERS.items():
        out = _cli("render", *args, *common)
        assert out.exit_code == 0, (name, out.output)
        paths[name] = root / f"{name}.sbatch"
        paths[name].write_text(out.stdout)
    out = _cli("sweep", "--partition", "skx", "--nodes", "1,2", "--name", "lint", "--out",
               str(root / "sweep"), "--target-loss", "-0.75", *common)
    assert out.exit_code == 0, out.output
    assert sorted(os.listdir(root / "sweep")) == sorted(SWEEP)
    paths.update({f"sweep/{name}": root / "sweep" / name for name in SWEEP})
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def shellcheck() -> str:
    path = shutil.which("shellcheck")
    if path is None:
        pytest.skip("shellcheck not installed (scripts/install.sh installs it)")
    return path


def _bash_n(path: str) -> None:
    out = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def _shellcheck(shellcheck: str, path: str) -> None:
    """shellcheck at every severity, following sourced files, must be silent."""
    out = subprocess.run([shellcheck, "-s", "bash", "-x", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _templates() -> list[str]:
    return sorted(os.listdir(os.path.join(REPO, "jobs")))


def test_every_template_is_rendered_here():
    # A new template must join RENDERS, or shellcheck would never see it.
    used = {jobs_lib.PARTITIONS[args[1]].template for args in RENDERS.values()} | SHARED_TEMPLATES
    assert set(_templates()) == used
    assert {args[1] for args in RENDERS.values()} == set(jobs_lib.PARTITIONS)


@pytest.mark.parametrize("script", STATIC + [f"jobs/{t}" for t in _templates()])
def test_shipped_scripts_and_templates_pass_bash_n(script):
    _bash_n(os.path.join(REPO, script))


@pytest.mark.parametrize("script", STATIC)
def test_shipped_scripts_pass_shellcheck(shellcheck, script):
    _shellcheck(shellcheck, os.path.join(REPO, script))


@pytest.mark.parametrize("name", [*RENDERS, *(f"sweep/{n}" for n in SWEEP)])
def test_rendered_scripts_pass_bash_n(rendered, name):
    _bash_n(rendered[name])


@pytest.mark.parametrize("name", [*RENDERS, *(f"sweep/{n}" for n in SWEEP)])
def test_rendered_scripts_pass_shellcheck(rendered, shellcheck, name):
    _shellcheck(shellcheck, rendered[name])
