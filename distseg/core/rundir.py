"""The layout of a run directory: the one place that names its files.

Plain Python (no TensorFlow, no Horovod): ``analysis`` and ``distseg-jobs`` import it
too. Every module that reads or writes a run directory takes its paths from here::

    RUN/
      config.json                   the resolved config (rank 0, before any rank logs)
      logs/rank-00003.jsonl         rank 3's log (records: ``distseg.core.schema``)
      checkpoints/
        epoch-0003.weights.h5       Keras weights after 3 finished epochs
        epoch-0003.state.npz        optimizer state and every rank's local state
        epoch-0003.json             the manifest (position, SHA-256 of both files)
        epoch-0003-step-000012.*    a checkpoint 12 steps into epoch index 3
        latest.json                 the newest manifest's name
        best.json                   the best checkpoint by the EMA of validation Dice
      postprocessing.json           test-time mirroring and largest-component decisions
      job.txt                       a Slurm job's command line (``jobs/common.sh.in``)
      model_fn.py                   a --model-fn run's model source (``networks.userfn``)

What the checkpoint files hold is ``distseg.training.checkpoints.checkpoint``'s business; only
their names are here. The Slurm scripts (``jobs/*.sh.in``, ``jobs/report.sbatch``)
spell the same names in bash; ``tests/unit/test_jobs.py`` checks they agree.
"""

from __future__ import annotations

import os
import re

#: The resolved config of the run.
CONFIG_FILE = "config.json"
#: The folder of the per-rank logs.
LOG_DIR = "logs"
#: A rank's log file name, e.g. ``rank-00003.jsonl``.
LOG_PATTERN = re.compile(r"^rank-(\d+)\.jsonl$")
#: The shell pattern of every rank's log in ``LOG_DIR``.
LOG_GLOB = "rank-*.jsonl"
#: The folder of the checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: In ``CHECKPOINT_DIR``: the name of the newest checkpoint's manifest.
LATEST_CHECKPOINT = "latest.json"
#: In ``CHECKPOINT_DIR``: the best checkpoint's stem, epoch and EMA of validation Dice
#: (``training.epoch.bestcheckpoint``); rotation keeps the checkpoint it names.
BEST_CHECKPOINT = "best.json"
#: ``distseg-predict --decide``'s decisions on test-time mirroring and largest-component
#: post-processing, with the validation Dice behind them (``inference.postprocess``).
POSTPROCESSING_FILE = "postprocessing.json"
#: The files of one checkpoint besides its manifest, by kind: ``STEM.weights.h5``...
CHECKPOINT_FILES = {"weights": "weights.h5", "state": "state.npz"}
#: The start of every checkpoint file's name.
CHECKPOINT_PREFIX = "epoch-"
#: In a checkpoint file's name: written but not yet renamed into place.
TEMPORARY = ".tmp."
#: A Slurm job's command line and settings (written by ``jobs/common.sh.in``).
JOB_FILE = "job.txt"
#: ``RUN/tensorboard``: rank 0's live TensorBoard scalars (``training.epoch.board``).
TENSORBOARD_DIR = "tensorboard"
#: An epoch's Horovod timeline (``training.epoch.observers.Timeline``), by epoch.
TIMELINE_FILE = "comm-timeline-e{epoch}.json"
#: A ``--model-fn`` run's copy of its model's source file.
MODEL_FN_FILE = "model_fn.py"
#: What shows a directory already holds a run (``existing_run``).
RUN_MARKERS = (CONFIG_FILE, LOG_DIR)


def config_path(run_dir: str) -> str:
    """``RUN/config.json``."""
    return os.path.join(run_dir, CONFIG_FILE)


def model_fn_path(run_dir: str) -> str:
    """``RUN/model_fn.py``."""
    return os.path.join(run_dir, MODEL_FN_FILE)


def tensorboard_dir(run_dir: str) -> str:
    """``RUN/tensorboard``."""
    return os.path.join(run_dir, TENSORBOARD_DIR)


def timeline_path(run_dir: str, epoch: int) -> str:
    """``RUN/comm-timeline-e<epoch>.json``."""
    return os.path.join(run_dir, TIMELINE_FILE.format(epoch=epoch))


def log_dir(run_dir: str) -> str:
    """``RUN/logs``."""
    return os.path.join(run_dir, LOG_DIR)


def log_name(rank: int) -> str:
    """The file name of ``rank``'s log, e.g. ``rank-00003.jsonl``."""
    return f"rank-{rank:05d}.jsonl"


def log_path(run_dir: str, rank: int) -> str:
    """``RUN/logs/rank-NNNNN.jsonl`` of ``rank``."""
    return os.path.join(run_dir, LOG_DIR, log_name(rank))


def log_paths(run_dir: str, size: int) -> dict[int, str]:
    """Rank -> log path for ranks 0 to ``size - 1`` (whether or not they exist)."""
    return {r: log_path(run_dir, r) for r in range(size)}


def rank_of(file_name: str) -> int | None:
    """The rank a log file's name says (``rank-00003.jsonl`` -> 3), or None."""
    m = LOG_PATTERN.match(file_name)
    return int(m.group(1)) if m else None


def checkpoint_dir(run_dir: str) -> str:
    """``RUN/checkpoints``."""
    return os.path.join(run_dir, CHECKPOINT_DIR)


def latest_path(run_dir: str) -> str:
    """``RUN/checkpoints/latest.json``."""
    return os.path.join(run_dir, CHECKPOINT_DIR, LATEST_CHECKPOINT)


def best_path(run_dir: str) -> str:
    """``RUN/checkpoints/best.json``."""
    return os.path.join(run_dir, CHECKPOINT_DIR, BEST_CHECKPOINT)


def postprocessing_path(run_dir: str) -> str:
    """``RUN/postprocessing.json``."""
    return os.path.join(run_dir, POSTPROCESSING_FILE)


def checkpoint_stem(epoch: int, step: int = 0) -> str:
    """``epoch-0003`` (3 epochs done) or ``epoch-0003-step-000012`` (12 steps into
    epoch index 3); names sort in training order."""
    return f"{CHECKPOINT_PREFIX}{epoch:04d}" + (f"-step-{step:06d}" if step else "")


def is_inside_epoch(stem: str) -> bool:
    """Whether checkpoint ``stem`` was written inside an epoch (``-step-`` in it)."""
    return "-step-" in stem


def checkpoint_file(stem: str, kind: str) -> str:
    """The name of one file of a checkpoint: ``STEM.weights.h5`` or ``STEM.state.npz``."""
    return f"{stem}.{CHECKPOINT_FILES[kind]}"


def manifest_name(stem: str) -> str:
    """The name of a checkpoint's manifest: ``STEM.json``."""
    return f"{stem}.json"


def temporary_file(stem: str, kind: str) -> str:
    """Where a checkpoint file is written before the rename that puts it in place:
    ``STEM.tmp.weights.h5``."""
    return f"{stem}{TEMPORARY}{CHECKPOINT_FILES[kind]}"


def is_temporary(file_name: str) -> bool:
    """Whether a file of ``CHECKPOINT_DIR`` is one still being written."""
    return TEMPORARY in file_name


def stem_of(file_name: str) -> str | None:
    """The checkpoint a file of ``CHECKPOINT_DIR`` belongs to (``epoch-0003.json`` and
    ``epoch-0003.tmp.state.npz`` -> ``epoch-0003``), or None (``latest.json``)."""
    if not file_name.startswith(CHECKPOINT_PREFIX):
        return None
    return file_name.split(".")[0]


def existing_run(run_dir: str) -> str | None:
    """The file that shows ``run_dir`` already holds a run (config or logs), or None."""
    for name in RUN_MARKERS:
        if os.path.exists(os.path.join(run_dir, name)):
            return name
    return None
