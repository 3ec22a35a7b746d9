"""One run of the study, by either back-end, cached as JSON under
``data/bench/stateff-runs/`` (so the study can run in parts and the table be rebuilt
with ``--report``), scored under a target; and the grid of runs."""

from __future__ import annotations

import json
import os
import time

from distseg.core import schema

from benchlib import runlogs
from benchlib.stateff import curves, emulation, real
from benchlib.stateff.study import (
    BATCH,
    ROOT,
    SCALES,
    VARIANTS,
    Emulated,
    dataset_path,
    emulated_as,
    per_rank_speed,
    resolved,
    run_config,
    run_key,
    same_run,
    train_samples,
)
from benchlib.stateff.summary import fmt

CACHE = os.path.join(ROOT, "data", "bench", "stateff-runs")


def cache_key(backend: str, scale: str, ranks: int, cfg_over: dict,
              emulated: Emulated | None = None) -> str:
    """What makes two runs the same run. At 1 rank the scaling rule and the warm-up
    change nothing (the scaled lr is the base lr), so those variants share one run.
    ``emulated``: how the emulation stood in for ``ranks`` (``study.emulated_as``)."""
    train = dict(cfg_over["train"])
    if ranks == 1:
        train.update(lr_scaling="none", warmup_epochs=0.0)
    what = {"backend": backend, "scale": scale, "ranks": ranks, "model": cfg_over["model"],
            "train": train}
    if emulated is not None:
        what["emulated"] = emulated.key()
    return schema.config_hash(what)[:16]


def _read_cached(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return _upgraded(json.load(f))


def _upgraded(rec: dict) -> dict:
    """A cached run by log schema 3's names: one cached from older logs holds its epochs'
    ``noise_scale`` and the policy's ``goodput`` (then ``batch_policy``) by the old ones
    (``schema.upgrade``)."""
    if "batch_policy" in rec and "goodput" not in rec:
        rec["goodput"] = rec.pop("batch_policy")
    if rec.get("noise"):
        rec["noise"] = [schema.upgrade_noise_scale(n) if isinstance(n, dict) else n
                        for n in rec["noise"]]
    return rec


def _noise_series(records: list[dict]) -> tuple[list, list]:
    """(raw B_simple, Adam-preconditioned B_simple) of every ``epoch`` record (None where
    not estimated): ``noise_scale``'s ``b_simple_raw`` and ``b_simple``; in logs from
    before distseg logged the preconditioned one, ``noise_scale`` (raw) and the
    emulation's ``noise_scale_adam``."""
    raw, adam = [], []
    for r in records:
        if r.get("type") != "epoch":
            continue
        noise = r.get("noise_scale") or {}
        if "b_simple_raw" in noise:
            raw.append(noise["b_simple_raw"])
            adam.append(noise.get("b_simple"))
        else:
            raw.append(noise.get("b_simple"))
            adam.append((r.get("noise_scale_adam") or {}).get("b_simple"))
    return raw, adam


def run_record(records: list[list[dict]], **fields) -> dict:
    """The cached record of one finished run from its per-rank ``records``: per
    validation the points, the Dice, B_simple, the whole ``noise_scale`` record (|G|^2
    and tr(Sigma)), the per-rank batch and the goodput policy's choice (emulation)."""
    raw, adam = _noise_series(records[0])
    epochs = [r for r in records[0] if r.get("type") == "epoch"]
    return {**fields, "points": curves.eval_points(records, "liver"),
            "val_dice": [r["val_dice"] for r in epochs],
            "b_simple": raw, "b_simple_adam": adam,
            "noise": [r.get("noise_scale") for r in epochs],
            "per_rank": [r.get("per_rank") for r in epochs],
            "goodput": [r.get("goodput") for r in epochs],
            "throughput": runlogs.throughput(records) if fields["backend"] == "hvd" else None}


def run_spec(backend: str, scale: str, variant: str, ranks: int, seed: int, epochs: int,
             stop_at: float | None) -> tuple[dict, Emulated | None, str]:
    """(the ``--config`` overrides, how the emulation stands in for the ranks, the cache
    key) of one run; a run another variant makes (``study.same_run``) is that one's. An
    emulated grown batch runs the config of its ``sim_ranks``, whose steps per epoch
    cover the same ``SAMPLES_PER_EVAL`` samples."""
    variant = same_run(variant, ranks)
    emulated = emulated_as(variant, ranks, stop_at) if backend == "sim" else None
    n_train = train_samples(dataset_path(SCALES[scale]["data"]))
    cfg_over = run_config(scale, variant, emulated.sim_ranks if emulated else ranks, seed, epochs,
                          n_train)
    return cfg_over, emulated, cache_key(backend, scale, ranks, cfg_over, emulated)


def run_one(backend: str, scale: str, variant: str, ranks: int, seed: int, epochs: int,
            workdir: str, stop_at: float | None = None) -> dict:
    """Runs (or finds in the cache) one run; returns its cached record."""
    data_path = dataset_path(SCALES[scale]["data"])
    cfg_over, emulated, key = run_spec(backend, scale, variant, ranks, seed, epochs, stop_at)
    path = os.path.join(CACHE, f"{key}.json")
    rec = _read_cached(path)
    if rec is not None:
        return rec
    variant = same_run(variant, ranks)
    run_dir = os.path.join(workdir, run_key(scale, variant, ranks, seed, epochs, backend))
    cfg, cfg_path = resolved(cfg_over, data_path, run_dir)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    sim_ranks = emulated.sim_ranks if emulated else ranks
    records = real.hvd_run(ranks, data_path, run_dir, cfg_path) if backend == "hvd" else \
        emulation.simulate(cfg, sim_ranks, emulated, step_seconds())
    rec = run_record(records, key=key, backend=backend, scale=scale, variant=variant, ranks=ranks,
                     sim_ranks=sim_ranks, stop_at=stop_at, seed=seed, epochs=epochs,
                     config=cfg_over, data=data_path, n_train=train_samples(data_path))
    rec.update(wall_s=time.perf_counter() - start, load=[load_before, os.getloadavg()[0]])
    os.makedirs(CACHE, exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f)
    return rec


def scored(rec: dict, target: float, measure: str, warmup_passes: float) -> dict:
    """A cached run's summary under ``target`` and ``measure`` (re-read from its
    stored per-epoch Dice, so the target can change without rerunning). Drops count
    after ``warmup_passes`` passes over the training set at every rank count (1 rank
    has no warm-up, but its first passes are as young)."""
    points = [dict(p, dice=curves.dice_of(d, measure)) for p, d in zip(rec["points"], rec["val_dice"])]
    cfg = rec["config"]["train"]
    per_eval = cfg["max_steps_per_epoch"] * cfg["batch_size"] * rec.get("sim_ranks", rec["ranks"])
    per_pass = max(1, round(rec["n_train"] / per_eval))
    warmup = warmup_passes * rec["n_train"]
    out = curves.summarise(points, target, warmup, per_pass)
    if rec["backend"] == "sim":
        out["time_to_target"] = None  # the emulation's clock measures nothing of Horovod
    return {**out, "throughput": rec["throughput"], "load": rec["load"], "wall_s": rec["wall_s"]}


# --- the grid -----------------------------------------------------------------------------


def grid(args) -> list[tuple]:
    return [(b, sc, v, n, s) for sc in args.scale for b in args.backend for v in args.variants
            for n in args.ranks for s in args.seeds]


def step_seconds() -> dict[int, float]:
    """Seconds of a step at each per-rank batch, from the measured per-rank throughput
    (``study.per_rank_speed``): what the emulated goodput policy believes and what the
    projected times add up."""
    return {b: b / speed for b, speed in per_rank_speed().items()}


def epochs_of(args, backend: str, ranks: int = 1) -> int:
    """Validations per run: real runs stop sooner (they cost more on a shared machine);
    an emulated global batch grown past ``BATCH`` gets ``--grown-epochs`` (it needs more
    samples)."""
    if backend == "hvd":
        return args.hvd_epochs
    return args.grown_epochs if ranks > BATCH else args.epochs[0]


def stop_of(args) -> float | None:
    return args.target if args.stop_at_target else None


def cached(backend: str, scale: str, variant: str, ranks: int, seed: int, args) -> dict | None:
    """The cached run of one grid cell, trying each run length in ``--epochs`` for the
    emulation (the first is the one new runs use); whole, or stopped at the target
    where ``--stop-at-target`` or ``--report`` accepts that; None if it was never run."""
    lengths = [epochs_of(args, backend, ranks)] + (args.epochs if backend == "sim" else [])
    stops = [None, args.target] if args.stop_at_target or args.report else [None]
    for epochs in dict.fromkeys(lengths):
        for stop_at in stops:
            key = run_spec(backend, scale, variant, ranks, seed, epochs, stop_at)[2]
            rec = _read_cached(os.path.join(CACHE, f"{key}.json"))
            if rec is not None:
                return rec
    return None


def run_grid(args) -> None:
    """Runs every (backend, variant, ranks, seed) not yet in the cache, printing each."""
    workdir = os.path.join(args.workdir, "stateff")
    os.makedirs(workdir, exist_ok=True)
    for backend, scale, variant, ranks, seed in grid(args):
        rec = cached(backend, scale, variant, ranks, seed, args) or \
            run_one(backend, scale, variant, ranks, seed, epochs_of(args, backend, ranks), workdir,
                    stop_of(args) if backend == "sim" else None)
        s = scored(rec, args.target, args.measure, VARIANTS[variant][1]["warmup_passes"])
        print(f"{backend} {scale} {variant:17s} np{ranks} seed {seed}: samples to target "
              f"{s['samples_to_target']}, time {fmt(s['time_to_target'])}, max drop "
              f"{s['max_drop']:.2f}, final {fmt(s['final_dice'])} ({rec['wall_s']:.0f} s)",
              flush=True)


def collect(args) -> list[dict]:
    """Every cached run of the grid, scored: one dict per run (missing runs skipped)."""
    rows = []
    for backend, scale, variant, ranks, seed in grid(args):
        rec = cached(backend, scale, variant, ranks, seed, args)
        if rec is None:
            continue
        rows.append({"backend": backend, "scale": scale, "variant": variant, "ranks": ranks,
                     "seed": seed, "run": rec["key"],
                     **scored(rec, args.target, args.measure,
                              VARIANTS[variant][1]["warmup_passes"]),
                     "val_dice": [curves.dice_of(d, args.measure) for d in rec["val_dice"]],
                     "cum_samples": [p["samples"] for p in rec["points"]],
                     "b_simple": rec.get("b_simple"),
                     "b_simple_adam": rec.get("b_simple_adam"), "noise": rec.get("noise"),
                     "per_rank": rec.get("per_rank"), "sim_ranks": rec.get("sim_ranks", ranks),
                     "stopped_at_target": rec.get("stop_at") is not None})
    return rows


def check_sim(args) -> None:
    """The emulation against a real run of the same config: per-epoch train loss and
    Dice side by side (they agree closely early, then drift apart as float sums do)."""
    workdir = os.path.join(args.workdir, "stateff")
    os.makedirs(workdir, exist_ok=True)
    for backend in ("sim", "hvd"):
        for variant in args.variants:
            for ranks in args.ranks:
                rec = run_one(backend, args.scale[0], variant, ranks, args.seeds[0],
                              epochs_of(args, backend, ranks), workdir)
                print(f"{backend} {variant} np{ranks}: loss " +
                      " ".join(f"{p['train_loss']:.3f}" for p in rec["points"]) +
                      "\n    liver " + " ".join(f"{p['dice']:.2f}" for p in rec["points"]))
