"""Writes synthetic run directories whose report numbers are known in advance.

A run is described by a ``RunSpec``; ``write_run`` produces ``config.json`` and one log
per rank in the format of ``distseg.core.schema`` (and of ``distseg.training.runlog``: compact JSON,
one record per line), by the names of its current version or of an older one
(``RunSpec.schema_version``). Time is exact: step ``k`` of a launch ends at
``t = (k + 1) * step_time + (epochs finished in the launch) * (val_time +
end_time)`` (with no ``warmup_step_time``), so tests can place a loss value at exactly 3.5 h.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from distseg.core import cvplan, link, rundir, schema

CLASSES = ("background", "liver", "lesion")


@dataclass
class Launch:
    """One launch of a run: epochs ``[start_epoch, end_epoch)``.

    ``killed_after`` > 0: after the last full epoch, run that many steps of the next
    epoch and die (no end record, truncated last line), as a killed job does.
    ``hosts``: each rank's host in this launch (default: the run's ``hosts``).
    """

    start_epoch: int
    end_epoch: int
    killed_after: int = 0
    status: str = "ok"
    hosts: Sequence[str] | None = None


@dataclass
class RunSpec:
    """A synthetic run; every default gives a small, finished, healthy 2-rank run."""

    size: int = 2
    hosts: Sequence[str] | None = None
    epochs: int = 3
    batch_size: int = 2
    train_samples: int = 16
    val_samples: int = 4
    step_time: float | Sequence[float] = 1.0
    """Seconds per step; one value per rank gives stragglers (step t uses the max)."""
    warmup_step_time: float | None = None
    """Seconds per step in the first epoch of each launch (default: ``step_time``)."""
    data_wait: float | Sequence[float] = 0.0
    val_time: float = 0.0
    end_time: float = 0.0
    """Seconds each epoch's end takes after its record (TensorBoard, checkpoint), before
    the next epoch's first step."""
    loss: Callable[[int], float] = lambda k: -0.1 - 0.01 * k
    """Training loss (mean over ranks) at global step k."""
    val_dice: Callable[[int, int, str], float | None] = (
        lambda epoch, rank, cls: 0.5 + 0.1 * epoch + 0.01 * rank)
    """Validation Dice of ``rank``'s shard at ``epoch`` for class ``cls``."""
    seed: int = 0
    params: int | None = 1000
    image_size: int = 32
    launches: Sequence[Launch] | None = None
    extra_step_fields: dict = field(default_factory=dict)
    extra_epoch_fields: dict = field(default_factory=dict)
    data_path: str = "/data/tiny.h5"
    start_time: float = 1.7e9
    run_id: str = "run0"
    threads: Callable[[int], dict] | None = None
    """Fields added to rank r's ``threads`` (``cores``, ``pinned``, ``affinity``)."""
    extra_run_fields: dict = field(default_factory=dict)
    """Fields added to every ``run`` record (``voxels_per_sample``, ``onednn``)."""
    extra_model_fields: dict = field(default_factory=dict)
    """Fields added to the run record's ``model`` (``name``, ``input_shape``)."""
    extra_dataset_fields: dict = field(default_factory=dict)
    """Fields added to the run record's ``dataset`` (a 3D run's ``slab``)."""
    noise_scale: Callable[[int], float | None] | None = None
    """B_simple at the end of each epoch (``None``: no ``noise_scale`` field, as older
    logs; a function returning ``None``: not estimable). With it, the run record gets
    ``batch_plan`` and ``loss_scope``, each epoch record a ``noise_scale`` (method
    ``none`` on 1 rank, with ``b_simple`` null) and each step record ``grad_sq``."""
    batch_plan: str = "per_rank"
    """The run record's ``batch_plan`` when ``noise_scale`` is given."""
    goodput: Callable[[int], dict] | None = None
    """The ``goodput`` field of epoch e's records (the goodput policy's measurements and
    choice, ``distseg.training.progress.batchpolicy``); ``None``: no such field (policy ``fixed``)."""
    consecutive: bool = False
    """With ``noise_scale``: a 1-rank run estimates it too, from consecutive gradients
    (method ``consecutive``, as logs since 2026-11-25), instead of logging ``none``."""
    train_fields: dict = field(default_factory=dict)
    """Fields added to ``config.json``'s ``train`` (``global_batch``, ``lr_scaling``,
    ``batch_policy``, ...): the batch and lr rule a projection reads."""
    link: dict | None = None
    """The run records' ``link`` (``measured_link``); ``None``: no such field, as in logs
    from before it (a 1-rank run logs ``null``: ``extra_run_fields={"link": None}``)."""
    schema_version: int = schema.SCHEMA_VERSION
    """The log schema the records are written in: the run records' ``schema_version``, and
    the names of the fields schema 3 renamed (``names``)."""
    fold: int | None = None
    """config.json's ``data.fold`` (``None``: not written, as runs before folds)."""
    spatial_dims: int | None = None
    """config.json's ``model.spatial_dims`` (3 also names the run record's model
    ``unet3d``); ``None``: not written."""
    val_cases: Callable[[int, int], dict | None] | None = None
    """``val_cases_local`` of rank r's epoch-e record, ``val_cases(epoch, rank)``:
    {case id: {class: Dice}}; ``None`` (or returning ``None``): no such field."""


def names(version: int) -> dict[str, str]:
    """How log schema ``version`` names the fields schema 3 renamed: the run record's
    batch plan, the epoch record's goodput policy and ``noise_scale``'s tr(Sigma). Spelled
    out here as each trainer wrote them, so that a test of ``schema.upgrade`` checks it."""
    if version < 3:
        return {"batch_plan": "batch_policy", "goodput": "batch_policy", "tr_sigma": "trace"}
    return {"batch_plan": "batch_plan", "goodput": "goodput", "tr_sigma": "tr_sigma"}


def measured_link(ranks: int, bandwidth_gbps: float, latency_us: float, local: bool,
                  sizes: Sequence[int] = (4 << 10, 1 << 20, 16 << 20)) -> dict:
    """A run record's ``link`` as the trainer logs it (``distseg.core.link.fit`` of the
    timed allreduces, and ``local``): the ring model's seconds for ``sizes`` at exactly
    ``bandwidth_gbps`` and ``latency_us``, so the fit gives them back."""
    seconds = [link.sync_seconds(n, ranks, bandwidth_gbps, latency_us) for n in sizes]
    return {**link.fit(list(sizes), seconds, ranks), "local": local}


def shards(spec: RunSpec, epoch: int) -> list[list[np.ndarray]]:
    """Per rank, the batches of sample ids of ``epoch`` (as ``distseg.data`` cuts them)."""
    n = spec.train_samples
    order = np.random.default_rng([spec.seed, epoch]).permutation(n)
    if spec.batch_size == 1:
        order = order[: n - n % spec.size]
    steps = schema.steps_per_epoch(n, spec.size, spec.batch_size)
    return [np.array_split(s, steps) for s in np.array_split(order, spec.size)]


def _per_rank(value, rank: int) -> float:
    return float(value[rank]) if isinstance(value, (list, tuple)) else float(value)


def config(spec: RunSpec, run_dir: str) -> dict:
    data = {"path": spec.data_path, "resize": False, "prefetch": 2}
    model = {"image_size": spec.image_size, "depth": 2, "base_filters": 4,
             "dropout": 0.0, "norm": "batch", "num_classes": 3}
    if spec.fold is not None:
        data["fold"] = spec.fold
    if spec.spatial_dims is not None:
        model["spatial_dims"] = spec.spatial_dims
    return {"data": data, "model": model,
            "train": {"epochs": spec.epochs, "batch_size": spec.batch_size, "lr": 0.005,
                      "seed": spec.seed, "max_steps_per_epoch": 0, **spec.train_fields},
            "run_dir": run_dir}


def case_fields(spec: RunSpec, epoch: int, rank: int) -> dict:
    """An epoch record's ``val_cases_local`` (none without ``spec.val_cases``)."""
    cases = spec.val_cases(epoch, rank) if spec.val_cases is not None else None
    return {} if cases is None else {"val_cases_local": cases}


def noise_record(spec: RunSpec, epoch: int) -> dict:
    """The ``noise_scale`` field of an epoch record (``distseg.training.progress.noise``'s
    ``record()``): ``b_simple`` from ``spec.noise_scale``, |G|^2 = 1 and tr(Sigma) =
    b_simple, its interval from b_simple / 2 to 2 b_simple (no upper bound in epoch
    0) over 4 effective steps an epoch; nothing estimated on 1 rank unless
    ``spec.consecutive``."""
    alone = spec.size == 1
    b = spec.noise_scale(epoch) if not alone or spec.consecutive else None
    method = "ranks" if not alone else "consecutive" if spec.consecutive else "none"
    tr_sigma = names(spec.schema_version)["tr_sigma"]
    interval = ({"b_simple_low": b / 2, "b_simple_high": None if epoch == 0 else 2 * b,
                 "effective_steps": 4.0 * (epoch + 1)} if b is not None else {})
    return {"b_simple": b, **interval, "g2": None if b is None else 1.0, tr_sigma: b,
            "small_batch": spec.batch_size, "big_batch": spec.batch_size * spec.size,
            "method": method, "ema": 0.95, "preconditioned": False}


def noise_fields(spec: RunSpec, kind: str, epoch: int = 0) -> dict:
    """What a run with ``spec.noise_scale`` adds to its ``kind`` records (none without),
    and each epoch record's ``spec.goodput``."""
    named = names(spec.schema_version)
    policy = ({named["goodput"]: spec.goodput(epoch)}
              if kind == "epoch" and spec.goodput is not None else {})
    if spec.noise_scale is None:
        return policy
    if kind == "run":
        return {named["batch_plan"]: spec.batch_plan, "loss_scope": "global_batch"}
    if kind == "step":
        return {"grad_sq": [2.0, 1.0]}
    return {"noise_scale": noise_record(spec, epoch), **policy}


def records(spec: RunSpec, rank: int, run_dir: str) -> list[dict | str]:
    """All records of ``rank`` in file order; a ``str`` is a raw (truncated) line."""
    size = spec.size
    steps = schema.steps_per_epoch(spec.train_samples, size, spec.batch_size)
    launches = spec.launches or [Launch(0, spec.epochs)]
    cfg = config(spec, run_dir)
    slowest = max(_per_rank(spec.step_time, r) for r in range(size))
    out: list[dict | str] = []
    for li, launch in enumerate(launches):
        start = spec.start_time + 1000.0 * li
        hosts = list(launch.hosts or spec.hosts or ["node0"] * size)
        threads = {"intra_op": 1, "inter_op": 1, **(spec.threads(rank) if spec.threads else {})}
        model = {"name": "unet3d" if spec.spatial_dims == 3 else "unet2d",
                 "image_size": spec.image_size, "depth": 2, "base_filters": 4,
                 **spec.extra_model_fields}
        if spec.params is not None:
            model["params"] = spec.params
        out.append({"type": "run", "rank": rank, "time": start,
                    "schema_version": spec.schema_version,
                    "size": size, "local_rank": hosts[:rank].count(hosts[rank]),
                    "local_size": hosts.count(hosts[rank]), "host": hosts[rank],
                    "pid": 100 + rank, "run_id": f"{spec.run_id}-{li}", "start_time": start,
                    "versions": {"python": "3.11"}, "controller": "gloo",
                    "threads": threads,
                    "config_hash": schema.config_hash(cfg), "model": model,
                    "dataset": {"path": spec.data_path,
                                "samples": spec.train_samples + spec.val_samples,
                                "train_samples": spec.train_samples,
                                "val_samples": spec.val_samples, "image_size": spec.image_size,
                                **spec.extra_dataset_fields},
                    "global_seed": spec.seed, "steps_per_epoch": steps,
                    "batch_size": spec.batch_size, "global_batch_size": spec.batch_size * size,
                    "lr_base": 0.005, "lr_scaled": 0.005 * size, **noise_fields(spec, "run"),
                    **({"link": spec.link} if spec.link is not None else {}),
                    **spec.extra_run_fields})
        t = 0.0
        epochs_here = list(range(launch.start_epoch, launch.end_epoch))
        partial = [launch.end_epoch] if launch.killed_after else []
        for epoch in epochs_here + partial:
            batches = shards(spec, epoch)[rank]
            n_steps = launch.killed_after if epoch in partial else steps
            warm = epoch == launch.start_epoch and spec.warmup_step_time is not None
            # Synchronous steps: every rank's step ends when the slowest rank's does.
            step_time = spec.warmup_step_time if warm else slowest
            own_step_time = spec.warmup_step_time if warm else _per_rank(spec.step_time, rank)
            seen, losses = [], []
            for step in range(n_steps):
                k = epoch * steps + step
                t += step_time
                loss = spec.loss(k)
                out.append({"type": "step", "rank": rank, "time": start + t, "epoch": epoch,
                            "step": step, "global_step": k, "t": t,
                            "step_time": own_step_time,
                            "data_wait": _per_rank(spec.data_wait, rank), "loss": loss,
                            "loss_local": loss + 0.001 * rank, "lr": 0.005,
                            "samples": len(batches[step]), **noise_fields(spec, "step"),
                            **spec.extra_step_fields})
                seen.extend(int(i) for i in batches[step])
                losses.append(loss)
            if epoch in partial:
                out.append('{"type":"step","rank":%d,"time":1.7e9,"epoch":%d,"st' % (rank, epoch))
                break
            t += spec.val_time
            dice_local = {c: spec.val_dice(epoch, rank, c) for c in CLASSES}
            dice = {c: float(np.mean([spec.val_dice(epoch, r, c) for r in range(size)]))
                    for c in CLASSES}
            out.append({"type": "epoch", "rank": rank, "time": start + t, "epoch": epoch,
                        "t": t, "epoch_time": steps * step_time + spec.val_time,
                        "train_time": steps * step_time, "steps": steps, "samples": len(seen),
                        "sample_digest": schema.sample_digest(seen),
                        "train_loss": float(np.mean(losses)), "train_loss_local": 0.0,
                        "val_loss": -float(np.mean(list(dice.values()))),
                        "val_loss_local": 0.0, "val_dice": dice, "val_dice_local": dice_local,
                        "val_samples_local": 2, "weight_checksum": [1.0, 2.0],
                        **case_fields(spec, epoch, rank),
                        **noise_fields(spec, "epoch", epoch), **spec.extra_epoch_fields})
            t += spec.end_time
        if not launch.killed_after:
            out.append({"type": "end", "rank": rank, "time": start + t, "status": launch.status,
                        "reason": "finished" if launch.status == "ok" else "boom", "t": t,
                        "epochs_done": launch.end_epoch})
    return out


def write_run(run_dir: str, spec: RunSpec | None = None, **changes) -> str:
    """Writes a run directory for ``spec`` (with ``changes`` applied); returns it."""
    spec = dataclasses.replace(spec or RunSpec(), **changes)
    os.makedirs(rundir.log_dir(run_dir), exist_ok=True)
    os.makedirs(rundir.checkpoint_dir(run_dir), exist_ok=True)
    with open(rundir.config_path(run_dir), "w") as f:
        json.dump(config(spec, run_dir), f)
    for rank in range(spec.size):
        path = rundir.log_path(run_dir, rank)
        with open(path, "w") as f:
            for rec in records(spec, rank, run_dir):
                if isinstance(rec, str):
                    f.write(rec)
                else:
                    f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return run_dir


def write_cv(cv_dir: str, recipes: Sequence[str], folds: Sequence[int], nodes: Sequence[int],
             spec_of: Callable[[str, int, int], RunSpec | None], ranks_per_node: int = 1,
             target_dice: float | None = None) -> cvplan.CvPlan:
    """Writes a cross-validation: ``cv.json`` (``distseg.core.cvplan.make``) and the run
    of each recipe, node count and fold that ``spec_of(recipe, nodes, fold)`` gives (its
    ranks, hosts, ``data.fold`` and run id set here; ``None``: the run is missing)."""
    plan = cvplan.make(os.path.join(cv_dir, "data.h5"), len(folds), folds,
                       [cvplan.Recipe(r) for r in recipes], nodes, ranks_per_node, target_dice)
    os.makedirs(cv_dir, exist_ok=True)
    plan.write(cv_dir)
    for run in plan.runs:
        spec = spec_of(run.recipe, run.nodes, run.fold)
        if spec is not None:
            write_run(plan.run_path(cv_dir, run), spec, size=run.ranks, fold=run.fold,
                      hosts=[f"node{r // ranks_per_node}" for r in range(run.ranks)],
                      run_id=run.label)
    return plan


def run_record(rank: int, size: int, start_time: float = 1.7e9, run_id: str = "run0",
               **changes) -> dict:
    """A minimal valid ``run`` record, for logs written by hand (``changes`` override)."""
    rec = {"type": "run", "rank": rank, "time": start_time,
           "schema_version": schema.SCHEMA_VERSION,
           "size": size, "local_rank": rank, "local_size": size, "host": "node0",
           "run_id": run_id, "start_time": start_time, "versions": {}, "controller": "gloo",
           "threads": {}, "config_hash": "c0", "dataset": {"train_samples": 16},
           "global_seed": 0, "steps_per_epoch": 4, "batch_size": 2,
           "global_batch_size": 2 * size, "lr_base": 0.005, "lr_scaled": 0.005 * size}
    rec.update(changes)
    return rec


def step(rank: int, epoch: int, step: int, t: float, **changes) -> dict:
    """A ``step`` record (one step of 1 s, loss -0.1 x global step), ``changes`` applied."""
    rec = {"type": "step", "rank": rank, "time": 1.7e9 + t, "epoch": epoch, "step": step,
           "global_step": 4 * epoch + step, "t": t, "step_time": 1.0, "data_wait": 0.0,
           "loss": -0.1 * (4 * epoch + step), "loss_local": 0.0, "lr": 0.005, "samples": 2}
    rec.update(changes)
    return rec


def epoch_record(rank: int, epoch: int, t: float, **changes) -> dict:
    """An ``epoch`` record, liver Dice 0.5 (``changes`` add or override fields)."""
    rec = {"type": "epoch", "rank": rank, "time": 1.7e9 + t, "epoch": epoch, "t": t,
           "epoch_time": 4.0, "train_time": 4.0, "steps": 4, "samples": 8,
           "sample_digest": "0" * 16, "train_loss": -0.1, "val_loss": -0.5,
           "val_dice": {"liver": 0.5}, "val_dice_local": {"liver": 0.5}}
    rec.update(changes)
    return rec


def end_record(rank: int, t: float, status: str = "ok", reason: str = "finished") -> dict:
    return {"type": "end", "rank": rank, "time": 1.7e9 + t, "status": status,
            "reason": reason, "t": t, "epochs_done": 1}


def write_log(run_dir: str, rank: int, lines: Sequence[dict | str]) -> str:
    """Writes ``rank``'s log of hand-built records (a ``str`` is written as it is)."""
    os.makedirs(rundir.log_dir(run_dir), exist_ok=True)
    path = rundir.log_path(run_dir, rank)
    with open(path, "w") as f:
        for rec in lines:
            f.write(rec if isinstance(rec, str) else json.dumps(rec, separators=(",", ":")) + "\n")
    return path


def one_row(frame, **where):
    """The one row of a report table (a pandas frame) whose columns equal ``where``."""
    mask = np.ones(len(frame), bool)
    for key, value in where.items():
        mask &= (frame[key] == value).to_numpy()
    rows = frame[mask]
    assert len(rows) == 1, (where, frame)
    return rows.iloc[0]


def note_lines(report, level=None) -> list[str]:
    """The report's notes as printed lines, optionally of one level only."""
    return [n.line() for n in report.notes if level is None or n.level == level]
