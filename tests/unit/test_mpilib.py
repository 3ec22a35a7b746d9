"""``distseg.parallel.mpilib``: which MPI a rank loaded and whether its launcher belongs
to it. The decisions are pure functions of the library's name, the record the install
wrote and the launcher's variables; ``loaded`` reads a real maps file and asks the real
Open MPI library its name. The launch itself: tests/e2e/test_wrong_mpi.py."""

from __future__ import annotations

import glob

import pytest

from distseg.parallel import mpilib

OPEN_MPI = mpilib.Library("Open MPI v4.1.4, package: Debian OpenMPI", "/usr/lib/libmpi.so.40")
MPICH = mpilib.Library("MPICH Version:      4.0.2", "/usr/lib/libmpich.so.12")
HYDRA_ENV = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1"}
OMPI_ENV = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}


@pytest.mark.parametrize("name, family", [
    ("Open MPI v5.0.3, package: Open MPI builder", "Open MPI"),
    ("MPICH Version:      4.0.2", "MPICH"),
    ("Intel(R) MPI Library 2018 Update 2 for Linux* OS", "MPICH"),
    ("MVAPICH2 Version      :	2.3.7", "MPICH"),
    ("Spectrum MPI 10.4", None),
])
def test_family_of_a_library_name(name, family):
    assert mpilib.family(name) == family


def test_launchers_are_told_by_their_variables():
    assert mpilib.launcher(OMPI_ENV) == mpilib.Launcher(
        "Open MPI", 4, "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE=4)")
    assert mpilib.launcher(HYDRA_ENV).family == "MPICH"
    assert mpilib.launcher({"PMI_SIZE": "8", "PMI_FD": "5"}).family is None  # srun --mpi=pmi2
    assert mpilib.launcher({"HOROVOD_RANK": "0"}) is None


def test_a_launcher_of_the_other_family_stops_the_rank_before_mpi_init():
    why = mpilib.before_init(OPEN_MPI, None, HYDRA_ENV)
    assert "started by a Hydra mpiexec" in why and OPEN_MPI.name in why and OPEN_MPI.path in why
    why = mpilib.before_init(MPICH, None, OMPI_ENV)
    assert "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE=4)" in why and MPICH.name in why


def test_the_same_family_an_unknown_launcher_or_none_pass():
    assert mpilib.before_init(OPEN_MPI, None, OMPI_ENV) is None
    assert mpilib.before_init(MPICH, None, HYDRA_ENV) is None
    assert mpilib.before_init(OPEN_MPI, None, {"PMI_SIZE": "2"}) is None
    assert mpilib.before_init(OPEN_MPI, None, {}) is None
    assert mpilib.before_init(None, None, HYDRA_ENV) is None  # Gloo-only Horovod


def test_a_library_other_than_the_recorded_build_stops_the_rank():
    built = {"name": "Open MPI v4.0.7, package: site build", "path": "/opt/ompi-4.0.7/lib/libmpi.so.40"}
    why = mpilib.before_init(OPEN_MPI, built, OMPI_ENV)
    assert OPEN_MPI.name in why and built["name"] in why and built["path"] in why
    assert mpilib.before_init(OPEN_MPI, {"name": OPEN_MPI.name, "path": "/elsewhere"}, OMPI_ENV) is None


def test_the_check_can_be_turned_off_for_an_abi_compatible_swap():
    env = dict(HYDRA_ENV, **{mpilib.SKIP_VAR: "0"})
    assert mpilib.before_init(OPEN_MPI, None, env) is None
    assert mpilib.after_init(1, OPEN_MPI, env) is None


def test_a_size_other_than_the_launchers_stops_the_rank_after_mpi_init():
    why = mpilib.after_init(1, OPEN_MPI, {"PMI_SIZE": "2", "PMI_FD": "5"})
    assert "started 2 processes" in why and "sees 1" in why and OPEN_MPI.name in why
    assert mpilib.after_init(4, OPEN_MPI, OMPI_ENV) is None
    assert mpilib.after_init(1, OPEN_MPI, {}) is None


def test_the_record_round_trips(tmp_path):
    path = tmp_path / mpilib.RECORD
    mpilib.write_record(str(path), OPEN_MPI)
    assert mpilib.read_record(str(tmp_path)) == {"name": OPEN_MPI.name, "path": OPEN_MPI.path}
    assert mpilib.read_record(str(tmp_path / "none")) is None


def test_loaded_finds_the_mpi_library_in_a_maps_file_and_asks_it_its_name(tmp_path):
    libs = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40*")) or \
        sorted(glob.glob("/usr/lib/*/libmpi.so.40*"))
    if not libs:
        pytest.skip("no Open MPI library here")
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 00:00 0 \n"
        "7f01-7f02 r-xp 00000000 fd:00 12 /usr/lib/x86_64-linux-gnu/libmpi_cxx.so.40.30.1\n"
        f"7f02-7f03 r-xp 00000000 fd:00 13 {libs[0]}\n")
    found = mpilib.loaded(str(maps))
    assert found.path == libs[0]
    assert found.name.startswith("Open MPI v")
    assert mpilib.loaded(str(tmp_path / "absent")) is None
