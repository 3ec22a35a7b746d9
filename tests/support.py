"""Helpers shared by the serial test modules: ``from support import BIN, command_env``.

(Fixtures live in ``tests/conftest.py``; a plain module is what a test can import.)
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from distseg.core import rundir, schema

#: The installed console scripts (distseg-train, horovodrun, ...) of this interpreter.
BIN = os.path.dirname(sys.executable)
#: The repository root.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where a launcher tells a process its rank: Horovod's own launcher (Gloo), Open MPI,
#: PMI (MPICH, Intel MPI) and srun. A launched command inherits none of them, and a
#: test process started by a launcher reads its rank from them.
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
#: Prefixes of what a launcher or a batch system sets for the processes it starts.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMIX_", "HOROVOD_")
#: Slurm's commands, which a job script takes as the sign of a real Slurm job.
SLURM_COMMANDS = ("srun", "sbatch", "scontrol", "scancel", "squeue", "sinfo", "salloc")


#: ``--precision auto``'s decisions kept by this test session only (not the user's
#: ~/.cache/distseg: a decision kept by an earlier session or another checkout would
#: turn a test's trial into a cache hit).
SESSION_CACHE = tempfile.mkdtemp(prefix="distseg-test-cache-")
atexit.register(shutil.rmtree, SESSION_CACHE, True)


def command_env(**extra: str) -> dict:
    """The environment for a launched command: this venv first on PATH, TF quiet, the
    session's own precision cache, and no rank variables inherited from a parent
    launcher (which would confuse Horovod)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    env.setdefault("DISTSEG_CACHE_DIR", SESSION_CACHE)
    for name in RANK_VARIABLES:
        env.pop(name, None)
    env.update(extra)
    return env


def path_without(folder: str, *prefixes: str) -> str:
    """``folder``, made into a bin folder of symlinks to /usr/bin's programs but those
    whose names start with one of ``prefixes``: a PATH without, say, the MPI wrappers."""
    os.makedirs(folder)
    for name in os.listdir("/usr/bin"):
        if not name.startswith(prefixes):
            os.symlink(os.path.join("/usr/bin", name), os.path.join(folder, name))
    return folder


def rank_from_env() -> int:
    """This process's rank as its launcher set it (0 when no launcher did)."""
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def launcher_free_env(**extra: str) -> dict:
    """``command_env`` without any variable of a launcher or a batch system
    (``LAUNCHER_PREFIXES``): a command that must place its ranks itself, or a job
    whose Slurm variables the test sets by hand."""
    env = {k: v for k, v in command_env().items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


def log_records(run_dir: str, rank: int, running: bool = False) -> list[dict]:
    """Rank ``rank``'s log records by the schema's current names (``schema.upgrade``),
    each checked against the schema: the one log reader of the tests. ``running``: the
    run may still be writing (or was killed), so only whole lines count (a last line
    without its newline is not a record yet)."""
    path = rundir.log_path(run_dir, rank)
    if running:
        import json
        with open(path, encoding="utf-8") as f:
            return [schema.upgrade(json.loads(line)) for line in f
                    if line.endswith("\n") and line.strip()]
    recs, problems = schema.read_log(path)
    assert not problems, problems
    for r in recs:
        schema.validate_record(r)
    return recs


@contextlib.contextmanager
def background(cmd, *, env=None, cwd=None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT):
    """Starts ``cmd`` in a session (process group) of its own and yields its ``Popen``:
    the one way a test runs a command in the background (a launch it signals, a run
    it watches). Output is text; by default stderr joins stdout.

    On the way out of the block the whole group is killed, however the block ended:
    the ranks that ``horovodrun``, ``mpirun`` or a job script started die with their
    launcher, and a failed assertion never leaves them running on CI's cores
    (``subprocess``'s own timeout kills only the direct child). Wait for the end with
    ``finish``, for an event with ``wait_for``.
    """
    proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=stdout,
                            stderr=stderr, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


def kill_group(proc) -> None:
    """SIGKILL to the process group of ``proc`` (started in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def fail_group(proc, message: str):
    """Kills the group of ``proc`` and fails the test with ``message`` and the tail of
    what the command wrote."""
    kill_group(proc)
    out, err = proc.communicate()
    pytest.fail(f"{message} (exit {proc.returncode}):\n{(out or '')[-3000:]}\n{(err or '')[-3000:]}")


def finish(proc, timeout: float, what: str | None = None) -> tuple[str, str]:
    """Waits for ``proc`` to end; its stdout and stderr ("" for one not piped). After
    ``timeout`` seconds its group is killed and the test fails, saying ``what`` (by
    default: the command did not finish)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        fail_group(proc, what or f"{' '.join(map(str, proc.args))} did not finish in {timeout} s")
    return out or "", err or ""


def wait_for(predicate, timeout: float, what: str, *, poll: float = 0.2, proc=None):
    """Waits for an event: calls ``predicate()`` every ``poll`` seconds until it returns
    something true, and returns that. A test orders its steps by such events (a log
    line, a file, a process state), never by a guessed ``sleep``.

    Fails the test after ``timeout`` seconds, saying that ``what`` did not happen. With
    ``proc`` (from ``background``), the command ending first fails it too, and either
    failure kills the command's group and shows its output.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = predicate()  # the event may have come just before the end
            if value:
                return value
            fail_group(proc, f"{what}: the command ended first")
        if time.monotonic() > deadline:
            break
        time.sleep(poll)
    if proc is not None:
        fail_group(proc, f"{what}: not within {timeout} s")
    pytest.fail(f"{what}: not within {timeout} s")


def wait_for_log(run_dir: str, rank: int, needle: str, proc, timeout: float = 120.0,
                 poll: float = 0.2) -> None:
    """Waits until rank ``rank``'s log holds ``needle`` (e.g. ``'"global_step":3,'``),
    looking every ``poll`` seconds: ``wait_for`` on the log of the run that ``proc``
    (from ``background``) is doing."""
    path = rundir.log_path(run_dir, rank)

    def logged() -> bool:
        if not os.path.exists(path):
            return False
        with open(path, encoding="utf-8") as f:
            return needle in f.read()

    wait_for(logged, timeout, f"{needle} in {path}", poll=poll, proc=proc)


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
    """What Slurm would set in a batch job on one node called localhost, for a job that
    runs without a real Slurm: PATH hides Slurm's commands where they are installed
    (``path_without_slurm``), so a job script sees no ``srun`` and takes the hand-made
    allocation for what it is."""
    env = launcher_free_env(PATH=path_without_slurm())
    env.update(SLURM_JOB_ID="4242", SLURM_JOBID="4242", SLURM_JOB_NAME="distseg-local",
               SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(tasks),
               SLURM_NPROCS=str(tasks), SLURM_NTASKS_PER_NODE=str(per_node),
               SLURM_TASKS_PER_NODE=str(per_node), SLURM_JOB_NODELIST="localhost",
               SLURM_NODELIST="localhost", SLURMD_NODENAME="localhost", SLURM_CPUS_ON_NODE=str(cpus),
               SLURM_SUBMIT_DIR=os.getcwd(), TF_CPP_MIN_LOG_LEVEL="2")
    return env


@functools.cache
def path_without_slurm() -> str:
    """``command_env()``'s PATH with Slurm's commands (``SLURM_COMMANDS``) left out.

    Unchanged where Slurm is not installed. Where it is (``make test`` installs it
    before the tiers), every other command of the PATH's system folders is linked into
    one folder of this session, which stands in for them: a job script under
    ``slurm_env`` then runs as on a machine without Slurm (mpirun on localhost), as
    it would before Slurm was installed. This venv's folder stays itself, ahead of it
    (a link to its python would lose the venv).
    """
    folders = command_env()["PATH"].split(os.pathsep)
    if not any(os.path.exists(os.path.join(d, c)) for d in folders for c in SLURM_COMMANDS):
        return os.pathsep.join(folders)
    links = tempfile.mkdtemp(prefix="distseg-no-slurm-")
    atexit.register(shutil.rmtree, links, True)
    for folder in folders:
        if folder == BIN or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = os.path.join(links, name)
            if name not in SLURM_COMMANDS and not os.path.lexists(target):
                os.symlink(os.path.join(folder, name), target)
    return os.pathsep.join([BIN, links])


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


#: Loads an exported model where distseg cannot be imported and predicts a batch.
LOAD_WITHOUT_DISTSEG = import_blocker("distseg") + r"""
import keras
import numpy as np

model = keras.models.load_model(sys.argv[1])
np.save(sys.argv[3], model.predict_on_batch(np.load(sys.argv[2])))
print("LAYERS=" + ",".join(sorted({type(l).__module__.split(".")[0] for l in model.layers})))
"""


def predict_exported(export_dir, x, timeout: float):
    """``distseg-predict --export``'s ``model.keras`` in ``export_dir`` loaded and run on
    ``x`` in a process where distseg cannot be imported: (that process, its output)."""
    np.save(os.path.join(export_dir, "x.npy"), x)
    loaded = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_DISTSEG,
                             os.path.join(export_dir, "model.keras"),
                             os.path.join(export_dir, "x.npy"), os.path.join(export_dir, "y.npy")],
                            capture_output=True, text=True, timeout=timeout, env=command_env())
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return loaded, np.load(os.path.join(export_dir, "y.npy"))


def one_line_error(out, *words):
    """A click command's result failed as bad input: exit 2, one ``error:`` line on
    stderr holding each of ``words``."""
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def write_config(run_dir, config: dict) -> str:
    """Writes ``config`` (a ``Config.to_dict()``, perhaps from before a field existed)
    as ``run_dir``'s config.json, the folder made if missing; returns ``run_dir``."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, rundir.CONFIG_FILE), "w") as f:
        json.dump({**config, "run_dir": str(run_dir)}, f)
    return str(run_dir)


def records(run_dir: str, kind: str, rank: int = 0) -> list[dict]:
    """The records of type ``kind`` (``step``, ``epoch``, ``run``...) in a rank's log."""
    return [r for r in log_records(run_dir, rank) if r["type"] == kind]


#: The benchmark scripts, and the folder ``benchlib``'s tools run from.
BENCHMARKS = os.path.join(REPO, "benchmarks")


def run_benchmark(*argv: str, timeout: float = 300, cwd: str | None = None, check: bool = True,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """A benchmark as its user runs it: ``python ARGV`` (``benchmarks/SCRIPT.py ...``, or
    ``-m benchlib.TOOL ...``) from ``benchmarks/`` unless ``cwd``, in ``command_env``
    with ``env`` set, its process group killed after ``timeout`` s; with ``check``, the
    test fails unless it exits 0."""
    from proc_group import run_group
    out = run_group([sys.executable, *argv], env=command_env(**(env or {})), cwd=cwd or BENCHMARKS,
                    timeout=timeout)
    if check:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def benchmark_results(folder, stem: str) -> dict:
    """The one results file, ``STEM-<date>-<time>.json``, that a benchmark wrote to ``folder``."""
    import glob
    (path,) = glob.glob(os.path.join(str(folder), f"{stem}-*.json"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)
