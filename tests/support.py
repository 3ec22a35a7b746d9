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


def log_records(run_dir: str, rank: int) -> list[dict]:
    """Rank ``rank``'s log records, each checked against the schema."""
    recs, problems = schema.read_log(rundir.log_path(run_dir, rank))
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
