"""``scripts/install.sh`` checks what the build needs by what it can do, before it makes
anything: each missing piece is one line saying what to load, exit 1, and the virtual
environment is not created. Run with PATHs that lack the MPI wrappers or CMake, a
compiler that does not exist, and real Pythons outside 3.10-3.12 (pyenv's, where this
machine has them). ``SKIP_APT=1`` throughout: as root, apt would otherwise fill the gap.
The whole install as a user without root is tests/slurm/test_cluster_user.py."""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

from support import REPO, path_without

SCRIPT = os.path.join(REPO, "scripts", "install.sh")
PYTHON_311 = "/usr/bin/python3.11"


def _install(tmp_path, path: str, **env: str) -> subprocess.CompletedProcess:
    venv = str(tmp_path / "venv")
    full = {"PATH": path, "HOME": str(tmp_path), "SKIP_APT": "1", "VENV": venv,
            "WHEELHOUSE": str(tmp_path / "wheels"), "PYTHON": PYTHON_311, **env}
    res = subprocess.run(["bash", SCRIPT], env=full, capture_output=True, text=True, timeout=120)
    assert not os.path.exists(venv), "the checks come before anything is made"
    return res


def _error_lines(res: subprocess.CompletedProcess) -> list[str]:
    assert res.returncode == 1, res.stdout + res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("[install] error:")]


@pytest.fixture(scope="module")
def no_mpi(tmp_path_factory):
    if not os.path.exists(PYTHON_311):
        pytest.skip(f"{PYTHON_311} not found")
    return path_without(str(tmp_path_factory.mktemp("bin") / "bin"), "mpi")


def test_no_mpi_on_path_is_one_line_naming_what_to_load(tmp_path, no_mpi):
    lines = _error_lines(_install(tmp_path, no_mpi))
    assert len(lines) == 1, lines
    assert "no MPI compiler wrappers (mpicc, mpicxx) on PATH" in lines[0]
    assert "module load openmpi" in lines[0]


def test_each_missing_piece_gets_its_own_line(tmp_path, tmp_path_factory, no_mpi):
    path = path_without(str(tmp_path_factory.mktemp("bin") / "bin"), "mpi", "cmake")
    lines = _error_lines(_install(tmp_path, path, CXX="/nonexistent/g++"))
    assert len(lines) == 3, lines
    assert "no C++17 compiler (/nonexistent/g++): load one" in lines[0]
    assert "no cmake on PATH: load one" in lines[1]
    assert "no MPI compiler wrappers" in lines[2]


def test_mpicc_given_by_the_environment_is_the_one_used(tmp_path, no_mpi):
    if not os.path.exists("/usr/bin/mpicc.openmpi"):
        pytest.skip("no Open MPI wrappers here")
    res = _install(tmp_path, no_mpi, MPICC="/nonexistent/mpicc", MPICXX="/usr/bin/mpicxx.openmpi")
    assert "no MPI compiler wrappers (/nonexistent/mpicc, /usr/bin/mpicxx.openmpi)" in res.stderr


@pytest.mark.parametrize("version", ["3.9", "3.13"])
def test_a_python_outside_3_10_to_3_12_is_refused(tmp_path, version):
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} on this machine")
    lines = _error_lines(_install(tmp_path, os.environ["PATH"], PYTHON=found[0]))
    assert len(lines) == 1, lines
    assert f"Python {version} ({found[0]}): distseg needs 3.10-3.12" in lines[0]
    assert "module load python" in lines[0]


def test_python_requires_says_the_same_range():
    with open(os.path.join(REPO, "setup.cfg")) as f:
        assert "python_requires = >=3.10,<3.13" in f.read()
