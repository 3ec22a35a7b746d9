"""Which MPI library a rank has loaded, and whether it can serve the launcher that
started the rank.

Horovod is compiled against one MPI. A job that loads another MPI module, or launches
with another MPI's ``mpirun``/``mpiexec``/``ibrun``, gets ranks that each start alone as
rank 0 of 1 (an Open MPI library under MPICH's Hydra, tried here) or hang in
``MPI_Init``, after the queue wait. ``distributed.init`` asks this module before and
after ``MPI_Init`` and stops every rank with one line instead: each rank decides from
its own process, so all of them decide the same without a collective.

Stdlib only: ``MPI_Get_library_version`` is called through ctypes, which the MPI
standard allows before ``MPI_Init``. ``scripts/install.sh`` records the library Horovod
loaded when it was built (``write_record``) in the virtual environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from dataclasses import asdict, dataclass

#: Where the install keeps the MPI Horovod was built with, under the environment's prefix.
RECORD = os.path.join("share", "distseg", "horovod-mpi.json")
#: Set to 0 to skip the checks (an ABI-compatible MPI swapped in on purpose).
SKIP_VAR = "DISTSEG_MPI_CHECK"
_LIBRARY_FILE = re.compile(r"^lib(mpi|mpich)\.so(\.|$)")
#: MPI_MAX_LIBRARY_VERSION_STRING is 256 (Open MPI) to 8192 (MPICH); room for either.
_NAME_BYTES = 8192


@dataclass(frozen=True)
class Library:
    name: str
    """The first line of ``MPI_Get_library_version``, e.g. 'Open MPI v4.1.4, ...'."""
    path: str


@dataclass(frozen=True)
class Launcher:
    family: str | None
    """'Open MPI', 'MPICH' (MPICH, Intel MPI, MVAPICH: one ABI), or None if unknown."""
    size: int
    what: str


def library_name(path: str) -> str:
    """``MPI_Get_library_version``'s first non-empty line, from the library at ``path``."""
    lib = ctypes.CDLL(path)
    buf = ctypes.create_string_buffer(_NAME_BYTES)
    length = ctypes.c_int(0)
    lib.MPI_Get_library_version(buf, ctypes.byref(length))
    text = buf.value.decode(errors="replace")
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def loaded(maps: str = "/proc/self/maps") -> Library | None:
    """The MPI library mapped into this process (after Horovod's import), or None."""
    try:
        with open(maps) as f:
            fields = [line.split(maxsplit=5) for line in f]
    except OSError:
        return None
    paths = [f[5].strip() for f in fields if len(f) == 6]
    for path in dict.fromkeys(paths):
        if _LIBRARY_FILE.match(os.path.basename(path)):
            return Library(library_name(path), path)
    return None


def family(name: str) -> str | None:
    if "Open MPI" in name:
        return "Open MPI"
    if re.search(r"MPICH|Intel\(R\) MPI|MVAPICH", name):
        return "MPICH"
    return None


def launcher(env) -> Launcher | None:
    """The launcher that started this process, from the variables it sets, or None
    (a plain process, ``horovodrun --gloo``, or one this does not know)."""
    if "OMPI_COMM_WORLD_SIZE" in env:
        n = int(env["OMPI_COMM_WORLD_SIZE"])
        return Launcher("Open MPI", n, f"Open MPI's mpirun (OMPI_COMM_WORLD_SIZE={n})")
    if "PMI_SIZE" in env and "MPI_LOCALRANKID" in env:
        n = int(env["PMI_SIZE"])
        return Launcher("MPICH", n, f"a Hydra mpiexec of MPICH, Intel MPI or MVAPICH (PMI_SIZE={n})")
    if "PMI_SIZE" in env:
        n = int(env["PMI_SIZE"])
        return Launcher(None, n, f"a PMI launcher such as srun --mpi=pmi2 (PMI_SIZE={n})")
    return None


def read_record(prefix: str = sys.prefix) -> dict | None:
    try:
        with open(os.path.join(prefix, RECORD)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_record(path: str, lib: Library | None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(asdict(lib) if lib else {"name": None, "path": None}, f, indent=1)
        f.write("\n")


_REBUILD = "docs/install.md#the-sites-mpi"


def before_init(lib: Library | None, built: dict | None, env) -> str | None:
    """Why this rank must not call ``MPI_Init``, in one line, or None."""
    if lib is None or env.get(SKIP_VAR) == "0":
        return None
    if built and built.get("name") and built["name"] != lib.name:
        return (f"this rank loaded the MPI library {lib.name} ({lib.path}), but Horovod was "
                f"built against {built['name']} ({built['path']}): load the MPI module of the "
                f"build, or rebuild Horovod against this one ({_REBUILD})")
    start = launcher(env)
    ours = family(lib.name)
    if start and start.family and ours and start.family != ours:
        return (f"this rank was started by {start.what}, but Horovod's MPI library is "
                f"{lib.name} ({lib.path}): launch with the mpirun of Horovod's MPI, or "
                f"rebuild Horovod against the launcher's MPI ({_REBUILD})")
    return None


def after_init(size: int, lib: Library | None, env) -> str | None:
    """Why this rank must stop now that ``MPI_Init`` gave it ``size`` ranks, or None."""
    start = launcher(env)
    if lib is None or start is None or start.size == size or env.get(SKIP_VAR) == "0":
        return None
    return (f"{start.what} started {start.size} processes, but Horovod's MPI library "
            f"{lib.name} ({lib.path}) sees {size}: the launcher belongs to another MPI "
            f"({_REBUILD})")
