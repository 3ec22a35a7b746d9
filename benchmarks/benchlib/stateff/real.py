"""Back-end ``hvd``: ``distseg-train`` itself, as one process or as ``horovodrun -np N``
ranks on this machine (the only back-end that measures time)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from benchlib import runlogs
from benchlib.stateff.study import BIN


def hvd_command(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[str]:
    """The command line of one real run: the demo preset, ``cfg_path``'s overrides."""
    train = [f"{BIN}/distseg-train", "--preset", "demo", "--data", data_path, "--run-dir", run_dir,
             "--config", cfg_path]
    if ranks == 1:
        return train
    return [f"{BIN}/horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}"] + train


def hvd_env() -> dict:
    """The environment of a real run: TensorFlow quiet, this venv first on PATH."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{BIN}:{os.environ['PATH']}")


def hvd_run(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[list[dict]]:
    """Runs ``distseg-train`` on ``ranks`` processes; returns every rank's records."""
    shutil.rmtree(run_dir, ignore_errors=True)
    proc = subprocess.run(hvd_command(ranks, data_path, run_dir, cfg_path), env=hvd_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if proc.returncode:
        sys.exit(f"run {run_dir} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return runlogs.rank_records(run_dir, ranks)
