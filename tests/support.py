"""Helpers shared by the serial test modules: ``from support import BIN, command_env``.

(Fixtures live in ``tests/conftest.py``; a plain module is what a test can import.)
"""

from __future__ import annotations

import os
import sys

from distseg.core import rundir, schema

#: The installed console scripts (distseg-train, horovodrun, ...) of this interpreter.
BIN = os.path.dirname(sys.executable)
#: The repository root.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_env(**extra: str) -> dict:
    """The environment for a launched command: this venv first on PATH, TF quiet, and
    no rank variables inherited from a parent launcher (which would confuse Horovod)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK"):
        env.pop(name, None)
    env.update(extra)
    return env


def log_records(run_dir: str, rank: int, running: bool = False) -> list[dict]:
    """Rank ``rank``'s log records, each checked against the schema: the one log reader
    of the tests. ``running``: the run may still be writing (or was killed), so only
    whole lines count (a last line without its newline is not a record yet)."""
    path = rundir.log_path(run_dir, rank)
    if running:
        import json
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
    recs, problems = schema.read_log(path)
    assert not problems, problems
    for r in recs:
        schema.validate_record(r)
    return recs


def wait_for_log(run_dir: str, rank: int, needle: str, proc, timeout: float = 120.0,
                 poll: float = 0.2) -> None:
    """Waits until rank ``rank``'s log holds ``needle`` (e.g. ``'"global_step":3,'``),
    looking every ``poll`` seconds.

    If ``proc`` (a ``Popen`` started with ``start_new_session=True``) ends first or the
    time runs out, its process group is killed and the test fails with the tail of its
    output: a hung launch never outlives the test.
    """
    import signal
    import time

    import pytest

    path = rundir.log_path(run_dir, rank)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                if needle in f.read():
                    return
        time.sleep(poll)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out = proc.communicate()[0] if proc.stdout is not None else ""
    pytest.fail(f"{needle} not in {path} within {timeout} s (exit {proc.returncode}): "
                f"{(out or '')[-3000:]}")


def jobs_cli(*args: str, cwd: str | None = None):
    """distseg-jobs in this process (the real click command), from ``cwd``."""
    from click.testing import CliRunner

    from distseg.cli.jobs import jobs

    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(jobs, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def slurm_env(nodes: int, tasks: int, per_node: int, cpus: int) -> dict[str, str]:
    """What Slurm would set in a batch job on one node called localhost."""
    env = {k: v for k, v in command_env().items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_"))}
    env.update(SLURM_JOB_ID="4242", SLURM_JOBID="4242", SLURM_JOB_NAME="distseg-local",
               SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(tasks),
               SLURM_NPROCS=str(tasks), SLURM_NTASKS_PER_NODE=str(per_node),
               SLURM_TASKS_PER_NODE=str(per_node), SLURM_JOB_NODELIST="localhost",
               SLURM_NODELIST="localhost", SLURMD_NODENAME="localhost", SLURM_CPUS_ON_NODE=str(cpus),
               SLURM_SUBMIT_DIR=os.getcwd(), TF_CPP_MIN_LOG_LEVEL="2")
    return env


def tree_bytes(root: str) -> dict:
    """Every file below ``root`` and its bytes: what a refusal must leave unchanged."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                out[os.path.relpath(os.path.join(folder, name), root)] = f.read()
    return out


def import_blocker(*blocked: str) -> str:
    """Python source that makes ``import NAME`` fail for each top-level package in
    ``blocked``, and checks that it does: the head of a script a test runs to prove
    that some code runs without them (``python -c``)."""
    first = blocked[0]
    return f"""
import importlib.abc, sys

BLOCKED = {tuple(blocked)!r}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked in this test")
        return None


sys.meta_path.insert(0, Blocker())
try:
    import {first}  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker does not work")
"""
