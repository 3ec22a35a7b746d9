"""Checkpoints of a run: everything needed to continue it exactly, saved by rank 0
(``save`` gathers every rank's local state to it; ``write`` writes the files).

Layout under ``RUN/checkpoints/``, one stem per checkpoint (the names are
``distseg.core.rundir``'s)::

    epoch-0003.weights.h5           Keras weights after 3 finished epochs (rank 0's)
    epoch-0003.state.npz            optimizer variables; every rank's local variables
                                    (BatchNorm statistics, dropout seeds) and, for a
                                    checkpoint inside an epoch, the ids and losses each
                                    rank has seen in it so far
    epoch-0003.json                 the manifest: position (epoch, step, global step,
                                    ranks) and the SHA-256 of both files
    epoch-0003-step-000012.*        a checkpoint 12 steps into epoch index 3 (written
                                    when a signal stops the run)
    latest.json                     the newest manifest's name
    best.json                       the best checkpoint's stem, epochs, EMA of the
                                    validation Dice and raw Dice (``training.best``)

Every file is written to a temporary name and renamed (``distseg.core.partial``), the
manifest last, so a job killed mid-write leaves the previous checkpoint whole. A save
that fails (a full disk) removes what it wrote of its checkpoint and raises
``WriteError`` (exit 1) naming the directory and the file. ``find`` checks the
checksums and falls back to an older checkpoint when the newest is damaged. The last
``keep`` checkpoints are kept, and the one ``best.json`` names besides them.

``best.json`` is written with the checkpoint it names, after ``latest.json``, when the
checkpoint's position says it is the new best (the ``bestcheckpoint.BestDice`` part's state in
``Position.parts``). ``best`` reads it back for ``distseg-predict``: a run without one
(from before it was kept, or trained without validation) has no best, and a damaged
one, or one naming a damaged checkpoint, is a warning and no best.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import zipfile
from dataclasses import dataclass, field

import numpy as np

from distseg.core import partial, rundir
from distseg.core.errors import InputError, WriteError
from distseg.core.partial import PartialFile
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.epoch import modelparts
from distseg.training.progress import noise

#: A rank's arrays in the state file (``_state_arrays``).
RANK_ARRAY = re.compile(r"rank\d+_")
#: The trainable weights training goes on from, kept in the state file by a model part
#: that had swapped others into the model (and so into the weights file) when the
#: checkpoint was written: the average of the weights (``weightema``). ``load`` puts
#: them back when training goes on; prediction reads the weights file.
TRAINING_WEIGHTS = "live_weight_"


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_due(done: int, epochs: int, every: int) -> bool:
    """Whether a checkpoint is written after ``done`` finished epochs: the last epoch
    always, and every ``every`` epochs (0: the last only)."""
    return done == epochs or bool(every and done % every == 0)


@dataclass
class RankState:
    """What differs between ranks and must come back to the same rank on resume."""

    local: list = field(default_factory=list)
    """Values of the model's non-trainable variables (BatchNorm statistics, seeds)."""
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Sample ids trained on so far in the current epoch (empty at an epoch boundary)."""
    losses: list = field(default_factory=list)
    losses_local: list = field(default_factory=list)


@dataclass
class Position:
    """Where a checkpoint stands in training."""

    epoch: int
    """Epochs finished."""
    step: int = 0
    """Steps finished in epoch index ``epoch`` (0 at an epoch boundary)."""
    global_step: int = 0
    size: int = 1
    """Ranks that wrote it."""
    train_time: float = 0.0
    """Training seconds already spent in the unfinished epoch."""
    training: dict | None = None
    """The training state's ``state()`` (``state.TrainingState``): the noise scale's
    averages, the lr's clocks and the batch policy, so ``--resume`` continues them where
    they were (None in checkpoints from before it was kept: the averages start afresh).
    Manifests written before the state had its name hold it as ``scaling``."""
    parts: dict | None = None
    """Each part's ``state()`` by its key (``modelparts.saved``: the parts that change
    the model), so ``--resume`` continues them exactly; their arrays are in the state
    file. When the best checkpoint's (``bestcheckpoint.BestDice``) has its ``mark`` set, this
    checkpoint is the new best and ``write`` points ``best.json`` at it. None: no part
    kept a state (tests). Manifests written before the parts had one hook hold the best
    checkpoint's state as ``best``."""


def _state_arrays(optimizer, ranks: list[RankState], extra: dict | None = None) -> dict:
    """The state file's arrays: the optimizer's (``opt_``), ``extra`` (the parts', named
    by them) and every rank's (``rank{r}_``)."""
    arrays = {f"opt_{i}": v.numpy() for i, v in enumerate(optimizer.variables)}
    arrays.update(extra or {})
    for r, state in enumerate(ranks):
        arrays.update({f"rank{r}_local_{j}": np.asarray(a) for j, a in enumerate(state.local)})
        arrays[f"rank{r}_seen"] = np.asarray(state.seen, np.int64)
        arrays[f"rank{r}_losses"] = np.asarray(state.losses, np.float64)
        arrays[f"rank{r}_losses_local"] = np.asarray(state.losses_local, np.float64)
    return arrays


def _write_npz(path: str, arrays: dict) -> None:
    """``np.savez``'s format, with the archive closed whatever happens: ``np.savez``
    leaves it open when a write fails, and its finaliser then prints a traceback
    ("Exception ignored in ZipFile.__del__") once the file is gone."""
    with open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED,
                                                 allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def weights_file(model) -> bytes:
    """The bytes of ``model.save_weights``' ``.weights.h5`` file, made in memory.

    HDF5 writing straight to a disk that fills up printed tracebacks from its
    finalisers, left the file open and crashed the process (a segmentation fault
    inside HDF5, at exit or during the save). Made in memory, the file reaches the
    disk through one plain write whose failure is an ordinary ``OSError``. Keras has
    no public call for this: these are the two that ``save_weights`` itself makes
    (``keras.src.saving.saving_lib.save_weights_only``), with a ``BytesIO`` for the
    path, which its store accepts.
    """
    from keras.src.saving import saving_lib

    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
    saving_lib._save_state(model, store, None, "", set())
    store.close()
    return buffer.getvalue()


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _whole_stems(ckdir: str) -> list[str]:
    """Stems with a manifest, oldest first (what ``find`` would try, unverified)."""
    return [s for s in stems(ckdir) if os.path.exists(os.path.join(ckdir, rundir.manifest_name(s)))]


def _save_failed(ckdir: str, position: Position, what: str, error: OSError) -> WriteError:
    """One line for a checkpoint that could not be written: the directory, why, the
    checkpoint and file, and the checkpoint a resume would start from."""
    label = f"epoch {position.epoch}" + (f" step {position.step}" if position.step else "")
    try:
        whole = _whole_stems(ckdir)
    except OSError:
        whole = []
    newest = f"{whole[-1]} is the newest whole checkpoint" if whole else "no whole checkpoint yet"
    return WriteError.of(ckdir, f"writing checkpoint {label} ({what}); {newest}", error)


def save(ctx, run_dir: str, position: Position, model, optimizer, mine: RankState,
         keep: int, extra: dict | None = None) -> None:
    """Collective: rank 0 writes a checkpoint holding every rank's ``RankState`` (this
    rank's: ``mine``) and ``extra`` arrays (the parts', ``modelparts.saved``; the same
    on every rank). One it cannot write (a full disk: ``write`` raises ``WriteError``)
    stops every rank with rank 0's line and exit 1."""
    everyone = dist.allgather_object(mine)
    if ctx.is_root():
        agreement.agree(write, run_dir, position, model, optimizer, everyone, keep, extra)
    else:
        agreement.agree(lambda: None)


def write(run_dir: str, position: Position, model, optimizer, ranks: list[RankState],
          keep: int, extra: dict | None = None) -> str:
    """Rank 0 only: writes a checkpoint at ``position``, points ``latest.json`` at it
    and removes all but the last ``keep``. ``ranks`` holds every rank's ``RankState``
    (gathered); ``extra``: the parts' named arrays for the state file
    (``modelparts.saved``). Returns the stem's path.

    A file that cannot be written (a full disk) raises ``WriteError`` (exit 1) naming
    the directory and the file; what was written of a checkpoint without its manifest
    is removed, and the previous checkpoints are untouched."""
    ckdir = rundir.checkpoint_dir(run_dir)
    name = rundir.checkpoint_stem(position.epoch, position.step)
    files = {kind: os.path.join(ckdir, rundir.checkpoint_file(name, kind))
             for kind in rundir.CHECKPOINT_FILES}
    temporary = {kind: os.path.join(ckdir, rundir.temporary_file(name, kind))
                 for kind in rundir.CHECKPOINT_FILES}
    manifest_path = os.path.join(ckdir, rundir.manifest_name(name))
    what = "creating the directory"
    try:
        os.makedirs(ckdir, exist_ok=True)
        what = os.path.basename(files["weights"])
        weights = weights_file(model)
        with PartialFile(files["weights"], temporary["weights"]) as part:
            _write_bytes(part.partial, weights)
        what = os.path.basename(files["state"])
        arrays = _state_arrays(optimizer, ranks, extra)
        with PartialFile(files["state"], temporary["state"]) as part:
            _write_npz(part.partial, arrays)
        what = os.path.basename(manifest_path)
        manifest = {**position.__dict__, "format": 1, "files": {
            kind: {"name": os.path.basename(path), "sha256": sha256(path)}
            for kind, path in files.items()}}
        # Last: a manifest means a whole checkpoint.
        partial.write_json(manifest_path, manifest)
        what = rundir.LATEST_CHECKPOINT
        partial.write_json(os.path.join(ckdir, rundir.LATEST_CHECKPOINT),
                          {"manifest": rundir.manifest_name(name), "epoch": position.epoch,
                           "step": position.step})
        best = (position.parts or {}).get(modelparts.BEST)
        if best and best.get("mark") and not position.step:
            what = rundir.BEST_CHECKPOINT
            write_best(ckdir, name, position.epoch, best)
        what = "removing older checkpoints"
        rotate(ckdir, keep, protect=best_stem(ckdir))
    except OSError as e:
        if not os.path.exists(manifest_path):  # files without their manifest: no checkpoint
            for path in files.values():
                with contextlib.suppress(OSError):
                    os.remove(path)
        raise _save_failed(ckdir, position, what, e) from e
    return os.path.join(ckdir, name)


def stems(ckdir: str) -> list[str]:
    """Checkpoint stems present in ``ckdir``, oldest first (temporary files ignored)."""
    if not os.path.isdir(ckdir):
        return []
    return sorted({rundir.stem_of(f) for f in os.listdir(ckdir)
                   if rundir.stem_of(f) and not rundir.is_temporary(f)})


def rotate(ckdir: str, keep: int, protect: str | None = None) -> list[str]:
    """Removes the files of all but the newest ``keep`` checkpoints and ``protect`` (the
    best checkpoint's stem); returns the stems removed."""
    removed = [s for s in (stems(ckdir)[:-keep] if keep > 0 else []) if s != protect]
    for old in removed:
        for f in os.listdir(ckdir):
            if rundir.stem_of(f) == old:
                os.remove(os.path.join(ckdir, f))
    return removed


def write_best(ckdir: str, name: str, epoch: int, part: dict) -> None:
    """``best.json``: checkpoint ``name``, after ``epoch`` epochs, is the new best; the
    EMA of the mean foreground validation Dice and the epoch's raw Dice (``part``: the
    best checkpoint's ``state()``)."""
    best = part["best"]
    partial.write_json(os.path.join(ckdir, rundir.BEST_CHECKPOINT), {
        "stem": name, "manifest": rundir.manifest_name(name), "epoch": epoch,
        "ema_dice": best["ema"], "dice": best["dice"], "val_dice": best.get("val_dice", {}),
        "ema_weight": part.get("weight")})


def best_stem(ckdir: str) -> str | None:
    """The stem ``best.json`` names (None: no file, or one that cannot be read): the
    checkpoint rotation keeps."""
    try:
        with open(os.path.join(ckdir, rundir.BEST_CHECKPOINT), encoding="utf-8") as f:
            stem = json.load(f)["stem"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stem if isinstance(stem, str) else None


def read_best(run_dir: str) -> dict | None:
    """``best.json`` of a run (None: the run has none).

    Raises:
      InputError: a file that is not JSON, or lacks ``stem``, ``epoch`` or ``ema_dice``.
    """
    path = rundir.best_path(run_dir)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        for key, kind in (("stem", str), ("epoch", int), ("ema_dice", (int, float))):
            if not isinstance(info[key], kind):
                raise TypeError(f"field {key} is {info[key]!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a best-checkpoint file ({type(e).__name__}: {e}); "
                         "expected stem, epoch and ema_dice") from e
    return info


def best(run_dir: str) -> tuple[dict | None, dict | None, str | None]:
    """(the best checkpoint's entry, ``best.json``'s content, a warning). A run without
    ``best.json`` gives (None, None, None); a damaged file, or one naming a missing or
    damaged checkpoint, gives (None, None, the warning): the caller takes the newest."""
    try:
        info = read_best(run_dir)
        if info is None:
            return None, None, None
        entry = manifest_entry(rundir.checkpoint_dir(run_dir), rundir.manifest_name(info["stem"]),
                               verify=True)
    except InputError as e:
        return None, None, str(e)
    return entry, info, None


def manifest_entry(ckdir: str, manifest_name: str, verify: bool) -> dict:
    """A checkpoint's manifest with absolute paths; raises ``InputError`` if it cannot
    be read or (``verify``) a file's checksum does not match."""
    path = os.path.join(ckdir, manifest_name)
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        files = {k: os.path.join(ckdir, v["name"]) for k, v in m["files"].items()}
        m.setdefault("training", m.get("scaling"))  # a manifest from before the rename
        if "parts" not in m and m.get("best"):  # from before the parts had one hook
            m["parts"] = {modelparts.BEST: m["best"]}
        position = Position(**{k: m[k] for k in Position.__dataclass_fields__ if k in m})
        noise.NoiseScale.averages_of((position.training or {}).get("noise"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not a checkpoint manifest ({type(e).__name__}: {e})") from e
    for kind, file in files.items():
        if verify and (not os.path.exists(file) or sha256(file) != m["files"][kind]["sha256"]):
            raise InputError(f"{file}: missing or damaged (checksum differs from {path})")
    return {"manifest": path, "position": position, "epoch": position.epoch, **files}


def find(run_dir: str, verify: bool = True) -> tuple[dict | None, list[str]]:
    """The newest whole checkpoint of a run, and a warning for each newer one that was
    damaged and skipped. ``(None, warnings)`` when the run has none."""
    ckdir = rundir.checkpoint_dir(run_dir)
    warnings = []
    for stem in reversed(stems(ckdir)):
        if not os.path.exists(os.path.join(ckdir, rundir.manifest_name(stem))):
            continue  # an older layout, or a save cut short before its manifest
        try:
            return manifest_entry(ckdir, rundir.manifest_name(stem), verify), warnings
        except InputError as e:
            warnings.append(f"skipped checkpoint {stem}: {e}")
    return None, warnings


def latest(run_dir: str) -> dict | None:
    """The newest whole checkpoint of a run (``find`` without the warnings)."""
    return find(run_dir)[0]


def load(entry: dict, model, optimizer=None) -> int:
    """Restores the weights of checkpoint ``entry`` (from ``find``) and, given an
    optimizer built for the same model (training goes on), its state and the weights
    training goes on from where the state file keeps them beside the weights file
    (``TRAINING_WEIGHTS``); returns its finished epochs."""
    try:
        model.load_weights(entry["weights"])
    except (OSError, ValueError) as e:
        raise InputError(f"{entry['weights']}: cannot be loaded into this model "
                         f"({str(e).splitlines()[0]})") from e
    if optimizer is not None:
        arrays = read_state(entry)
        _assign(entry["state"], optimizer.variables,
                [arrays[f"opt_{i}"] for i in range(sum(k.startswith("opt_") for k in arrays))],
                "optimizer")
        training = numbered(arrays, TRAINING_WEIGHTS)
        if training:
            _assign(entry["state"], model.trainable_variables, training, "trainable")
    return int(entry["epoch"])


def read_state(entry: dict) -> dict:
    try:
        with np.load(entry["state"]) as saved:
            return {k: saved[k] for k in saved.files}
    except (OSError, ValueError) as e:
        raise InputError(f"{entry['state']}: cannot be read ({str(e).splitlines()[0]})") from e


def numbered(arrays: dict, prefix: str) -> list[np.ndarray]:
    """The arrays ``prefix0``, ``prefix1``, ... of ``read_state``'s arrays, in order
    (empty where there are none)."""
    n = sum(k.startswith(prefix) for k in arrays)
    return [arrays[f"{prefix}{i}"] for i in range(n)]


def part_arrays(arrays: dict) -> dict:
    """The parts' arrays of ``read_state``'s arrays: neither the optimizer's, a rank's
    (``_state_arrays``) nor the weights training goes on from (``load``'s)."""
    return {k: v for k, v in arrays.items() if not k.startswith(("opt_", TRAINING_WEIGHTS))
            and not RANK_ARRAY.match(k)}


def rank_states(arrays: dict, size: int) -> list[RankState]:
    """Every saved rank's ``RankState`` from ``read_state``'s arrays."""
    out = []
    for r in range(size):
        out.append(RankState(local=numbered(arrays, f"rank{r}_local_"),
                             seen=arrays[f"rank{r}_seen"],
                             losses=arrays[f"rank{r}_losses"].tolist(),
                             losses_local=arrays[f"rank{r}_losses_local"].tolist()))
    return out


def _assign(where: str, variables, arrays, what: str) -> None:
    if len(arrays) != len(variables):
        raise InputError(f"{where}: holds {len(arrays)} {what} variables, "
                         f"the model has {len(variables)}")
    for v, a in zip(variables, arrays):
        if tuple(v.shape) != a.shape:
            raise InputError(f"{where}: {what} variable {v.path} has shape {tuple(v.shape)}, "
                             f"the checkpoint {a.shape}")
    for v, a in zip(variables, arrays):
        v.assign(a)


def assign_local(where: str, variables, arrays) -> None:
    """Restores a rank's local (non-trainable) variables from its ``RankState``."""
    _assign(where, variables, arrays, "local")
