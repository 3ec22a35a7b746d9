"""Helpers shared by the serial test modules: ``from support import BIN, command_env``.

(Fixtures live in ``tests/conftest.py``; a plain module is what a test can import.)
"""

from __future__ import annotations

import os
import sys

from distseg import schema

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
    recs, problems = schema.read_log(os.path.join(run_dir, schema.LOG_DIR, schema.log_name(rank)))
    assert not problems, problems
    for r in recs:
        schema.validate_record(r)
    return recs
