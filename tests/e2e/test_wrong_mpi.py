"""A job launched by another MPI than the one Horovod was built with stops at once, every
rank with one line naming both, instead of running N separate one-rank trainings (what
an Open MPI Horovod does under MPICH's Hydra, tried below without the check) or hanging
in ``MPI_Init``. The second MPI is Debian's MPICH (``make test`` installs it beside Open
MPI); Horovod here is built against Open MPI."""

from __future__ import annotations

import os
import shutil

import pytest

from proc_group import run_group
from support import BIN, command_env, launcher_free_env

HYDRA = shutil.which("mpiexec.mpich") or shutil.which("mpiexec.hydra")

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(HYDRA is None, reason="MPICH's mpiexec not installed "
                                 "(WITH_TEST_TOOLS=1 scripts/install.sh installs it)")]


def _horovod_mpi() -> str:
    res = run_group([f"{BIN}/python", "-c", "import horovod.tensorflow; "
                     "from distseg.parallel import mpilib; print(mpilib.loaded().name)"],
                    env=command_env(), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def test_a_hydra_launch_of_an_open_mpi_horovod_stops_every_rank_with_one_line(tiny, tmp_path):
    horovod_mpi = _horovod_mpi()
    if "Open MPI" not in horovod_mpi:
        pytest.skip(f"Horovod here is built against {horovod_mpi}, not Open MPI")
    run_dir = tmp_path / "run"
    res = run_group([HYDRA, "-n", "2", f"{BIN}/distseg-train", "--preset", "smoke", "--data",
                     tiny, "--run-dir", str(run_dir), "--epochs", "1"],
                    env=launcher_free_env(), timeout=180)
    err = res.stderr
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert res.returncode != 0, err[-2000:]
    assert len(lines) == 2, err[-3000:]  # one per rank, the same
    assert lines[0] == lines[1]
    assert "started by a Hydra mpiexec of MPICH, Intel MPI or MVAPICH (PMI_SIZE=2)" in lines[0]
    assert horovod_mpi in lines[0]
    assert not os.path.exists(run_dir), "nothing written"


def test_without_the_check_each_rank_would_train_alone(tiny):
    """Why the check exists: under Hydra, Horovod's Open MPI makes each process rank 0 of 1."""
    if "Open MPI" not in _horovod_mpi():
        pytest.skip("Horovod here is not built against Open MPI")
    res = run_group([HYDRA, "-n", "2", f"{BIN}/python", "-c",
                     "import horovod.tensorflow as hvd; hvd.init(); print(hvd.rank(), hvd.size())"],
                    env=launcher_free_env(), timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["0", "1", "0", "1"]
