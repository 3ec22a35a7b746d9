"""What machine and software a benchmark ran on, for its JSON results.

Read without importing TensorFlow or Horovod (versions come from the installed
packages' metadata), so the driver stays light: the CPU model, cores, the CPU flags
that decide which kernels oneDNN can use (AVX-512, bf16, AMX), memory, the library
versions, oneDNN's setting, the git commit and the load average.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess

#: CPU flags that decide the fp32 and bf16 kernels oneDNN picks.
FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                     "avx512_fp16", "amx_tile", "amx_bf16")


def cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """CPU model, logical CPUs, physical cores and flags of interest from ``path``."""
    model, flags, cores, logical = "unknown", set(), set(), 0
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        text = ""
    physical = "0"
    for line in text.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key == "model name":
            model = value
        elif key == "physical id":
            physical = value
        elif key == "core id":
            cores.add((physical, value))
        elif key == "flags":
            flags = set(value.split())
    return {"cpu_model": model, "logical_cpus": logical or os.cpu_count(),
            "physical_cores": len(cores) or os.cpu_count(),
            "cpu_flags": {f: f in flags for f in FLAGS_OF_INTEREST}}


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        return round(kib / 2 ** 20, 1)
    except (OSError, StopIteration, ValueError):
        return None


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("tensorflow-cpu", "tensorflow", "keras", "horovod", "numpy", "h5py"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def command_output(cmd: list[str], cwd: str | None = None) -> str | None:
    """First line of ``cmd``'s output, or None when it cannot run."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if done.returncode == 0 and text else None


def revision(repo: str, short: bool = False) -> str | None:
    """The commit checked out in ``repo`` (abbreviated with ``short``), or None where
    git cannot say (no git, not a checkout)."""
    return command_output(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=repo)


def git_state(repo: str) -> dict:
    """Commit and whether the working tree differs from it (read-only git calls)."""
    commit = revision(repo)
    status = command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": commit, "modified_files": status is not None}


def describe(repo: str, threads: dict) -> dict:
    """The machine description written with every result."""
    return {
        **cpuinfo(),
        "memory_gib": memory_gib(),
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "versions": package_versions(),
        "mpi": command_output(["mpirun", "--version"]),
        "onednn": {"TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS",
                                                           "unset (TensorFlow's default: on for x86)")},
        "threads": threads,
        "git": git_state(repo),
    }


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_counters(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from ``/proc/stat``'s ``cpu`` line;
    None where there is no such file. Steal is time the hypervisor gave this VM's
    virtual CPUs to someone else while they had work: on a shared 2-vCPU VM a run that
    keeps both vCPUs busy loses part of one, which a one-process run does not."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Share of the CPU time between two ``cpu_counters`` readings that was stolen."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])
