"""Checkpoints of a run: weights and optimizer state, saved by rank 0, read by anyone.

Layout under ``RUN/checkpoints/``::

    epoch-0003.weights.h5     Keras weights after 3 finished epochs
    epoch-0003.optimizer.npz  the optimizer's variables, in ``optimizer.variables`` order
    latest.json               {"epoch": 3, "weights": ..., "optimizer": ...}

Every file is written to a temporary name and renamed, so a job killed mid-write
leaves the previous checkpoint and ``latest.json`` whole. The last ``keep`` epochs
are kept.
"""

from __future__ import annotations

import json
import os

import numpy as np

from distseg import schema
from distseg.errors import InputError

LATEST = "latest.json"


def directory(run_dir: str) -> str:
    return os.path.join(run_dir, schema.CHECKPOINT_DIR)


def write_json_atomic(path: str, obj) -> None:
    """Writes ``obj`` as JSON to ``path`` through a temporary file and a rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def is_due(done: int, epochs: int, every: int) -> bool:
    """Whether a checkpoint is written after ``done`` finished epochs: the last epoch
    always, and every ``every`` epochs (0: the last only)."""
    return done == epochs or bool(every and done % every == 0)


def save(run_dir: str, epoch: int, model, optimizer, keep: int) -> str:
    """Rank 0 only: writes the checkpoint of ``epoch`` finished epochs, points
    ``latest.json`` at it, and removes all but the last ``keep``. Returns its stem."""
    ckdir = directory(run_dir)
    os.makedirs(ckdir, exist_ok=True)
    stem = os.path.join(ckdir, f"epoch-{epoch:04d}")
    tmp_w = f"{stem}.tmp.weights.h5"
    model.save_weights(tmp_w)
    os.replace(tmp_w, f"{stem}.weights.h5")
    tmp_o = f"{stem}.tmp.optimizer.npz"
    with open(tmp_o, "wb") as f:
        np.savez(f, *[v.numpy() for v in optimizer.variables])
    os.replace(tmp_o, f"{stem}.optimizer.npz")
    name = os.path.basename(stem)
    write_json_atomic(os.path.join(ckdir, LATEST), {
        "epoch": epoch, "weights": f"{name}.weights.h5", "optimizer": f"{name}.optimizer.npz"})
    rotate(ckdir, keep)
    return stem


def rotate(ckdir: str, keep: int) -> list[str]:
    """Removes the files of all but the newest ``keep`` epoch checkpoints; returns the
    stems removed."""
    stems = sorted({f.split(".")[0] for f in os.listdir(ckdir)
                    if f.startswith("epoch-") and ".tmp." not in f})
    removed = stems[:-keep] if keep > 0 else []
    for old in removed:
        for suffix in (".weights.h5", ".optimizer.npz"):
            path = os.path.join(ckdir, old + suffix)
            if os.path.exists(path):
                os.remove(path)
    return removed


def latest(run_dir: str) -> dict | None:
    """``latest.json`` of a run (with absolute paths), or None when it has none."""
    path = os.path.join(directory(run_dir), LATEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        epoch = int(entry["epoch"])
        names = entry["weights"], entry["optimizer"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a checkpoint index ({type(e).__name__}: {e})") from e
    ckdir = directory(run_dir)
    return {"epoch": epoch, "weights": os.path.join(ckdir, names[0]),
            "optimizer": os.path.join(ckdir, names[1])}


def load(entry: dict, model, optimizer=None) -> int:
    """Restores the weights (and, given an optimizer built for the same model, its
    state) of checkpoint ``entry`` (from ``latest``); returns its epoch."""
    try:
        model.load_weights(entry["weights"])
    except (OSError, ValueError) as e:
        raise InputError(f"{entry['weights']}: cannot be loaded into this model "
                         f"({str(e).splitlines()[0]})") from e
    if optimizer is not None:
        _load_optimizer(entry["optimizer"], optimizer)
    return int(entry["epoch"])


def _load_optimizer(path: str, optimizer) -> None:
    try:
        with np.load(path) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read ({str(e).splitlines()[0]})") from e
    variables = optimizer.variables
    if len(arrays) != len(variables):
        raise InputError(f"{path}: holds {len(arrays)} optimizer variables, "
                         f"the optimizer has {len(variables)}")
    for v, a in zip(variables, arrays):
        if tuple(v.shape) != a.shape:
            raise InputError(f"{path}: optimizer variable {v.path} has shape {tuple(v.shape)}, "
                             f"the checkpoint {a.shape}")
        v.assign(a)
