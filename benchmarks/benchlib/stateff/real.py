"""Back-end ``hvd``: ``distseg-train`` itself, as one process or as ``horovodrun -np N``
ranks on this machine (the only back-end that measures time)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from benchlib import launch, runlogs


def hvd_command(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[str]:
    """The command line of one real run: the demo preset, ``cfg_path``'s overrides
    (its threads among them: ``study.run_config``)."""
    return launch.train_command(["--preset", "demo", "--data", data_path, "--config", cfg_path],
                                run_dir, ranks=ranks)


def hvd_run(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[list[dict]]:
    """Runs ``distseg-train`` on ``ranks`` processes; returns every rank's records."""
    shutil.rmtree(run_dir, ignore_errors=True)
    proc = subprocess.run(hvd_command(ranks, data_path, run_dir, cfg_path), env=launch.command_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if proc.returncode:
        sys.exit(f"run {run_dir} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return runlogs.rank_records(run_dir, ranks)
