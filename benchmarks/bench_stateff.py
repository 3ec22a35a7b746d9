"""Statistical efficiency of large-batch training: samples and time to a validation Dice.

Throughput is not the goal of data-parallel training; a good model sooner is. This
benchmark measures, for each variant of the optimisation settings (learning-rate
scaling rule, warm-up length, normalisation, base learning rate), at 1, 2, 4 and 8
ranks and over several seeds:

  samples to target   global training samples until the validation Dice first
                      reaches the target (does not depend on speed, so 4 and 8 ranks
                      may run oversubscribed on a small machine);
  time to target      seconds from the agreed start (real Horovod runs only);
  largest drop        the largest fall of the validation Dice between two consecutive
                      validations after the warm-up (and between whole passes);
  final Dice          at the end of the run.

Validation runs every ``SAMPLES_PER_EVAL`` (512) training samples, whatever the
number of ranks: each benchmark "epoch" is ``train.max_steps_per_epoch`` =
512 / (batch x ranks) steps of a fresh seeded permutation, so samples to target are
resolved to 512 samples (a quarter of a pass over the benchmark phantom) and compare
across rank counts. Warm-up lengths are given in passes over the training set and
converted to these short epochs.

Two back-ends run the same algorithm on the same batches:

  hvd   ``distseg-train`` itself, as one process or under ``horovodrun -np N`` (the
        only one that measures time);
  sim   an exact in-process emulation of N data-parallel ranks (``simulate``): each
        rank's batch from ``distseg.data.slices.shard_batches``, its own forward/backward
        pass and its own BatchNorm moving statistics, gradients averaged, Adam
        applied, BatchNorm statistics averaged over ranks at each epoch end, the
        learning rate from ``distseg.training.steps``. It measures samples, not time, at a
        fraction of the cost of 8 oversubscribed processes; ``--check-sim`` compares
        it with a real run.

The benchmark phantom (2,560 slices from 160 cases, 2,048 for training) is made once
and cached under ``data/bench/``; every finished run is cached as JSON under
``data/bench/stateff-runs/``, so the study can be run in parts and the table rebuilt
with ``--report``. Results go to ``bench/results/stateff-<date>.json``.

    python benchmarks/bench_stateff.py --backend sim --variants base,sqrt --ranks 1,8 --seeds 0,1
    python benchmarks/bench_stateff.py --backend hvd --variants sqrt-gn --ranks 1,2 --seeds 0,1
    python benchmarks/bench_stateff.py --report
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)
from distseg.core import rundir, schema  # noqa: E402

SAMPLES_PER_EVAL = 512
"""Training samples between two validations, at every rank count."""
BATCH = 8
"""Samples per rank per step (the demo preset's)."""
TARGET = 0.85
"""Validation liver Dice to reach (see ``--target``)."""
MEASURE = "liver"
"""Which validation Dice the target applies to: a class name or ``foreground`` (the
mean of liver and lesion)."""
DROP_LIMIT = 0.1
"""The goal: no fall of the validation Dice larger than this after the warm-up."""

PHANTOMS = {
    # name: (size, cases, slices per case, seed); 20% of the cases validate.
    "phantom64": (64, 160, 16, 14),
    "phantom128": (128, 160, 16, 14),
}
DATASETS = {"lits117": os.path.join(ROOT, "data", "liver117.h5")}

SCALES = {
    # The screening model: the demo U-Net made small enough for a shared 2-core machine.
    "small": {"data": "phantom64", "model": {"image_size": 64, "depth": 3, "base_filters": 8}},
    # The demo preset itself (128x128, depth 4, 16 filters).
    "demo": {"data": "phantom128", "model": {}},
    "lits": {"data": "lits117", "model": {}},
}

VARIANTS = {
    # name: (what it tests, train/model overrides; warmup in passes over the train set)
    "base": ("the old defaults: linear scaling, 1-pass warm-up, BatchNorm",
             {"train": {"lr_scaling": "linear"}, "warmup_passes": 1.0}),
    "sqrt": ("sqrt scaling, 1-pass warm-up, BatchNorm",
             {"train": {"lr_scaling": "sqrt"}, "warmup_passes": 1.0}),
    "warm2": ("linear scaling, 2-pass warm-up, BatchNorm",
              {"train": {"lr_scaling": "linear"}, "warmup_passes": 2.0}),
    "gn": ("linear scaling, 1-pass warm-up, GroupNorm",
           {"train": {"lr_scaling": "linear"}, "model": {"norm": "group"}, "warmup_passes": 1.0}),
    "sqrt-gn": ("sqrt scaling, 1-pass warm-up, GroupNorm",
                {"train": {"lr_scaling": "sqrt"}, "model": {"norm": "group"}, "warmup_passes": 1.0}),
    "sqrt-bnm.5": ("sqrt scaling, 1-pass warm-up, BatchNorm with momentum 0.5",
                   {"train": {"lr_scaling": "sqrt"}, "model": {"bn_momentum": 0.5},
                    "warmup_passes": 1.0}),
    "gbatch-gn": ("global batch kept at 8 (8/N per rank), no lr scaling, GroupNorm",
                  {"train": {"lr_scaling": "none"}, "model": {"norm": "group"},
                   "global_batch": BATCH, "warmup_passes": 0.0}),
    "demo-now": ("the demo preset since issue 21: global batch 8, global loss, BatchNorm "
                 "ghost batches of 2", {"model": {"bn_ghost_batch": 2},
                                        "global_batch": BATCH, "warmup_passes": 1.0}),
}


# --- the arithmetic: logs to samples, time and drops --------------------------------


def dice_of(val_dice: dict, measure: str = MEASURE) -> float:
    """The Dice the target applies to, from an epoch record's ``val_dice``; an
    undefined class Dice (None: absent from prediction and truth) counts as 0 here."""
    if measure == "foreground":
        return statistics.fmean(float(val_dice.get(c) or 0.0) for c in ("liver", "lesion"))
    return float(val_dice.get(measure) or 0.0)


def eval_points(rank_records: list[list[dict]], measure: str = MEASURE) -> list[dict]:
    """One point per validated epoch: global samples so far (summed over every rank's
    ``epoch`` records), time from the agreed start (the slowest rank's), the Dice and
    the training loss (rank 0's, a global mean)."""
    by_epoch: dict[int, list[dict]] = {}
    for records in rank_records:
        for r in records:
            if r.get("type") == "epoch" and r.get("val_dice"):
                by_epoch.setdefault(r["epoch"], []).append(r)
    points, samples = [], 0
    for epoch in sorted(by_epoch):
        recs = by_epoch[epoch]
        if len(recs) != len(rank_records):
            break  # an epoch some rank did not log is not complete
        samples += sum(int(r["samples"]) for r in recs)
        points.append({"epoch": epoch, "samples": samples, "t": max(float(r["t"]) for r in recs),
                       "dice": dice_of(recs[0]["val_dice"], measure),
                       "train_loss": float(recs[0]["train_loss"])})
    return points


def first_reach(points: list[dict], target: float) -> dict | None:
    """The first point whose Dice is at least ``target``, or None."""
    return next((p for p in points if p["dice"] >= target), None)


def largest_drop(points: list[dict], after_samples: float, every: int = 1) -> float:
    """The largest fall of the Dice from one point to the next (taking every
    ``every``-th point: 4 compares whole passes when a pass is 4 evaluations), among
    the points at or after ``after_samples`` (the end of the warm-up); 0 if none."""
    kept = [p for p in points if p["samples"] >= after_samples][::every]
    return max([a["dice"] - b["dice"] for a, b in zip(kept, kept[1:])] + [0.0])


def summarise(points: list[dict], target: float, warmup_samples: float, per_pass: int) -> dict:
    """A run's numbers: samples/steps-free measures from its validation points."""
    hit = first_reach(points, target)
    return {
        "samples_to_target": hit["samples"] if hit else None,
        "time_to_target": hit["t"] if hit else None,
        "max_drop": largest_drop(points, warmup_samples),
        "max_drop_per_pass": largest_drop(points, warmup_samples, every=per_pass),
        "final_dice": points[-1]["dice"] if points else None,
        "best_dice": max((p["dice"] for p in points), default=None),
        "final_train_loss": points[-1]["train_loss"] if points else None,
        "evals": len(points),
        "samples": points[-1]["samples"] if points else 0,
    }


def mean_spread(values: list) -> dict:
    """Mean, min and max of the values that are not None, and how many were None
    (runs that never reached the target)."""
    got = [v for v in values if v is not None]
    return {"mean": statistics.fmean(got) if got else None, "min": min(got, default=None),
            "max": max(got, default=None), "n": len(got), "missing": len(values) - len(got)}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# --- the benchmark data ---------------------------------------------------------------


def dataset_path(name: str) -> str:
    """The dataset file of ``name``, making (and caching) a phantom the first time."""
    if name in DATASETS:
        return DATASETS[name]
    size, cases, per_case, seed = PHANTOMS[name]
    path = os.path.join(ROOT, "data", "bench", f"phantom-{cases * per_case}x{size}.h5")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([f"{BIN}/distseg-data", "synth", "--out", path, "--cases", str(cases),
                        "--slices-per-case", str(per_case), "--size", str(size),
                        "--seed", str(seed)], check=True)
    return path


def train_samples(path: str) -> int:
    from distseg.data import slices as data
    return len(data.examine(path).train_indices)


# --- one run's config -------------------------------------------------------------------


def run_key(scale: str, variant: str, ranks: int, seed: int, epochs: int, backend: str) -> str:
    return f"{backend}-{scale}-{variant}-np{ranks}-s{seed}-e{epochs}"


def run_config(scale: str, variant: str, ranks: int, seed: int, epochs: int, n_train: int) -> dict:
    """The ``--config`` overrides of one run (demo preset underneath)."""
    over = VARIANTS[variant][1]
    batch = max(1, over["global_batch"] // ranks) if "global_batch" in over else BATCH
    steps = max(1, SAMPLES_PER_EVAL // (batch * ranks))
    evals_per_pass = n_train / (steps * batch * ranks)
    # A fixed global batch (config.batch_plan) where the variant keeps one; else
    # per-rank batches, as the study ran before the demo preset kept one.
    fixed = {"global_batch": over.get("global_batch", 0), "global_batch_grows": "global_batch" in over}
    train = {"epochs": epochs, "batch_size": batch, "seed": seed, "max_steps_per_epoch": steps,
             "warmup_epochs": over["warmup_passes"] * evals_per_pass, "intra_op_threads": 1,
             "inter_op_threads": 1, "checkpoint_every": 0, **fixed, **over.get("train", {})}
    model = {"bn_ghost_batch": 0, **SCALES[scale]["model"], **over.get("model", {})}
    return {"model": model, "train": train}


def resolved(cfg_over: dict, data_path: str, run_dir: str):
    """The full ``distseg.core.config.Config`` that ``distseg-train --preset demo`` would use."""
    from distseg.core import config as config_lib
    path = os.path.join(os.path.dirname(run_dir), os.path.basename(run_dir) + ".json")
    with open(path, "w") as f:
        json.dump(cfg_over, f)
    from distseg.data import feeds
    # the data file decides the class count, as distseg-train's start-up does
    cfg = config_lib.resolve("demo", path, {"data.path": data_path, "run_dir": run_dir})
    return feeds.with_classes(cfg), path


# --- back-end 1: real Horovod runs ----------------------------------------------------


def hvd_command(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[str]:
    train = [f"{BIN}/distseg-train", "--preset", "demo", "--data", data_path, "--run-dir", run_dir,
             "--config", cfg_path]
    if ranks == 1:
        return train
    return [f"{BIN}/horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}"] + train


def hvd_run(ranks: int, data_path: str, run_dir: str, cfg_path: str) -> list[list[dict]]:
    """Runs ``distseg-train`` on ``ranks`` processes; returns every rank's records."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{BIN}:{os.environ['PATH']}")
    shutil.rmtree(run_dir, ignore_errors=True)
    proc = subprocess.run(hvd_command(ranks, data_path, run_dir, cfg_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if proc.returncode:
        sys.exit(f"run {run_dir} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return [schema.read_log(rundir.log_path(run_dir, r))[0]
            for r in range(ranks)]


def throughput(rank_records: list[list[dict]]) -> float | None:
    """Global training samples/s over epochs after the first (tracing excluded)."""
    per_epoch: dict[int, list] = {}
    for records in rank_records:
        for r in records:
            if r.get("type") == "epoch" and r["epoch"] > 0:
                per_epoch.setdefault(r["epoch"], []).append((r["samples"], r["train_time"]))
    seconds = sum(max(t for _, t in e) for e in per_epoch.values())
    return sum(s for e in per_epoch.values() for s, _ in e) / seconds if seconds else None


# --- back-end 2: the in-process emulation of N ranks ---------------------------------


class SimRanks:
    """N data-parallel ranks emulated in one process, step for step as distseg's loop:
    each rank its own batch, forward and backward pass and BatchNorm moving statistics;
    the global loss's sums added over the ranks (the forward allreduce: a first forward
    pass per rank), the gradients of each rank's surrogate averaged (the allreduce) and
    applied by one Adam; the statistics averaged over ranks at each epoch end
    (``steps.average_batchnorm``)."""

    def __init__(self, cfg, ranks: int):
        import keras
        import tensorflow as tf

        from distseg.networks import unet as model_lib
        keras.utils.set_random_seed(cfg.train.seed)  # rank 0's initial state, broadcast
        self.cfg, self.ranks = cfg, ranks
        self.model = model_lib.from_config(cfg.model)
        self.optimizer = keras.optimizers.Adam(learning_rate=cfg.train.lr)
        self.optimizer.build(self.model.trainable_variables)
        self.stats = list(self.model.non_trainable_weights)
        self.banks = [[v.numpy() for v in self.stats] for _ in range(ranks)]
        shape = [None, cfg.model.image_size, cfg.model.image_size]
        spec = [tf.TensorSpec(shape + [1], tf.float32), tf.TensorSpec(shape, tf.uint8)]
        self.sums_step = tf.function(self._sums, input_signature=spec)
        total = 2 * cfg.model.num_classes + 2
        self.grad_step = tf.function(self._grads, input_signature=spec + [tf.TensorSpec([total], tf.float32)])
        self.eval_step = tf.function(self._eval, input_signature=spec)
        self.apply = tf.function(self._apply)

    def _sums(self, images, masks):
        from distseg import losses
        probs = self.model(images, training=True)
        return losses.loss_sums(probs, masks, self.cfg.model.num_classes)

    def _grads(self, images, masks, total):
        import tensorflow as tf

        from distseg import losses
        with tf.GradientTape() as tape:
            probs = self.model(images, training=True)
            value, surrogate, _ = losses.global_loss(
                probs, masks, self.cfg.model.num_classes, self.cfg.train.loss,
                lambda local: total, self.ranks)
        return value, tape.gradient(surrogate, self.model.trainable_variables)

    def _apply(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def _eval(self, images, masks):
        from distseg import metrics
        probs = self.model(images, training=False)
        return metrics.dice_counts(probs, masks, self.cfg.model.num_classes)

    def preconditioner(self) -> list | None:
        """1 / (sqrt(v_hat) + eps) per variable from Adam's second moments before this
        step (AdaptDL's ``AdamGradientNoiseScale``); None before the first step."""
        import tensorflow as tf
        t = int(self.optimizer.iterations.numpy())
        if t == 0:
            return None
        opt = self.optimizer
        correction = 1.0 - opt.beta_2 ** t
        return [1.0 / (tf.sqrt(v.value / correction) + opt.epsilon) for v in opt._velocities]

    def step(self, batches: list, lr: float) -> tuple[float, list[float], list[float] | None]:
        """One synchronous step: ``batches[r]`` = rank r's (images, masks). Returns the
        mean loss and the noise scale's two squared norms, as the train step does
        ([mean over ranks of |g_rank|^2, |g_averaged|^2]), raw and preconditioned by
        Adam's second moments (None at the first step)."""
        losses, total, sums, small_sq, small_pre = [], None, 0.0, 0.0, 0.0
        pre = self.preconditioner()
        for r, (images, masks) in enumerate(batches):
            for v, value in zip(self.stats, self.banks[r]):
                v.assign(value)
            sums = sums + self.sums_step(images, masks).numpy()
        for r, (images, masks) in enumerate(batches):
            for v, value in zip(self.stats, self.banks[r]):
                v.assign(value)
            loss, grads = self.grad_step(images, masks, sums.astype("float32"))
            self.banks[r] = [v.numpy() for v in self.stats]
            losses.append(float(loss))
            small_sq += float(squared_norm(grads)) / self.ranks
            if pre is not None:
                small_pre += float(squared_norm([g * p for g, p in zip(grads, pre)])) / self.ranks
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        self.optimizer.learning_rate.assign(lr)
        mean = [g / self.ranks for g in total]
        self.apply(mean)
        adam = None if pre is None else \
            [small_pre, float(squared_norm([g * p for g, p in zip(mean, pre)]))]
        return statistics.fmean(losses), [small_sq, float(squared_norm(mean))], adam

    def average_batchnorm(self) -> None:
        mean = [sum(vals) / self.ranks for vals in zip(*self.banks)]
        for v, value in zip(self.stats, mean):
            v.assign(value)
        self.banks = [list(mean) for _ in range(self.ranks)]

    def validate(self, images, masks) -> dict:
        import numpy as np

        from distseg import metrics
        from distseg.core import config as config_lib
        counts = sum(self.eval_step(images[i:i + 64], masks[i:i + 64]).numpy()
                     for i in range(0, len(images), 64))
        dice = metrics.dice_from_counts(np.asarray(counts))
        return dict(zip(config_lib.CLASS_NAMES, dice))


def squared_norm(tensors) -> float:
    from distseg.training import steps
    return steps.squared_norm(tensors)


def sim_epoch(sim: SimRanks, schedule, loaded, epoch: int, global_step: int,
              noise: dict) -> tuple[list, int]:
    """One benchmark epoch of ``sim``, its gradient norms fed to ``noise["raw"]`` (a
    ``training.noise.NoiseScale``, as the loop feeds its own) and the preconditioned
    ones to ``noise["adam"]``; returns (step losses, global step after it)."""
    t = sim.cfg.train
    images, masks, train_ids = loaded
    # The loop's own batches: parts of fixed global batches, or per-rank shards.
    shards = [schedule.batches(train_ids, r, sim.ranks, epoch, t.seed) for r in range(sim.ranks)]
    losses = []
    for k in range(schedule.steps):
        batches = [(images[shards[r][k]], masks[shards[r][k]]) for r in range(sim.ranks)]
        loss, norms, adam = sim.step(batches, schedule.lr(global_step))
        noise["raw"].update(*norms)
        if adam is not None:
            noise["adam"].update(*adam)
        losses.append(loss)
        global_step += 1
    sim.average_batchnorm()
    return losses, global_step


def simulate(cfg, ranks: int) -> list[list[dict]]:
    """Trains ``cfg`` as ``ranks`` emulated ranks; returns epoch records shaped like
    ``distseg-train``'s (one list per rank, the global numbers on each)."""
    import numpy as np

    from distseg.data import slices as data
    from distseg.training.loop import Schedule
    from distseg.training.noise import NoiseScale
    info = data.examine(cfg.data.path)
    with data.SliceReader(cfg.data.path, cfg.model.image_size) as reader:
        everything = np.arange(info.samples)
        images, masks = reader.read(everything)
    schedule = Schedule.of(cfg.train, len(info.train_indices), ranks)
    sim, records, global_step, t0 = SimRanks(cfg, ranks), [], 0, time.perf_counter()
    val = (images[info.val_indices], masks[info.val_indices])
    noise = {k: NoiseScale(schedule.plan.per_rank, schedule.plan.global_batch)
             for k in ("raw", "adam")}
    for epoch in range(cfg.train.epochs):
        losses, global_step = sim_epoch(sim, schedule, (images, masks, info.train_indices),
                                        epoch, global_step, noise)
        records.append({"type": "epoch", "epoch": epoch, "t": time.perf_counter() - t0,
                        "samples": schedule.steps * schedule.plan.per_rank,
                        "train_loss": float(np.mean(losses)), "val_dice": sim.validate(*val),
                        "noise_scale": noise["raw"].record(),
                        "noise_scale_adam": noise["adam"].record()})
    return [records] * ranks


# --- one run, cached ---------------------------------------------------------------------


CACHE = os.path.join(ROOT, "data", "bench", "stateff-runs")


def cache_key(backend: str, scale: str, ranks: int, cfg_over: dict) -> str:
    """What makes two runs the same run. At 1 rank the scaling rule and the warm-up
    change nothing (the scaled lr is the base lr), so those variants share one run."""
    train = dict(cfg_over["train"])
    if ranks == 1:
        train.update(lr_scaling="none", warmup_epochs=0.0)
    return schema.config_hash({"backend": backend, "scale": scale, "ranks": ranks,
                               "model": cfg_over["model"], "train": train})[:16]


def run_one(backend: str, scale: str, variant: str, ranks: int, seed: int, epochs: int,
            target: float, measure: str, workdir: str) -> dict:
    """Runs (or finds in the cache) one run; returns its cached record."""
    data_path = dataset_path(SCALES[scale]["data"])
    n_train = train_samples(data_path)
    cfg_over = run_config(scale, variant, ranks, seed, epochs, n_train)
    key = cache_key(backend, scale, ranks, cfg_over)
    path = os.path.join(CACHE, f"{key}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    run_dir = os.path.join(workdir, run_key(scale, variant, ranks, seed, epochs, backend))
    cfg, cfg_path = resolved(cfg_over, data_path, run_dir)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    records = hvd_run(ranks, data_path, run_dir, cfg_path) if backend == "hvd" else \
        simulate(cfg, ranks)
    rec = {"key": key, "backend": backend, "scale": scale, "variant": variant, "ranks": ranks,
           "seed": seed, "epochs": epochs, "config": cfg_over, "data": data_path,
           "n_train": n_train, "points": eval_points(records, "liver"),
           "val_dice": [r["val_dice"] for r in records[0] if r.get("type") == "epoch"],
           "b_simple": [(r.get("noise_scale") or {}).get("b_simple")
                        for r in records[0] if r.get("type") == "epoch"],
           "b_simple_adam": [(r.get("noise_scale_adam") or {}).get("b_simple")
                             for r in records[0] if r.get("type") == "epoch"],
           "throughput": throughput(records) if backend == "hvd" else None,
           "wall_s": time.perf_counter() - start,
           "load": [load_before, os.getloadavg()[0]]}
    os.makedirs(CACHE, exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f)
    return rec


def scored(rec: dict, target: float, measure: str, warmup_passes: float) -> dict:
    """A cached run's summary under ``target`` and ``measure`` (re-read from its
    stored per-epoch Dice, so the target can change without rerunning). Drops count
    after ``warmup_passes`` passes over the training set at every rank count (1 rank
    has no warm-up, but its first passes are as young)."""
    points = [dict(p, dice=dice_of(d, measure)) for p, d in zip(rec["points"], rec["val_dice"])]
    cfg = rec["config"]["train"]
    per_eval = cfg["max_steps_per_epoch"] * cfg["batch_size"] * rec["ranks"]
    per_pass = max(1, round(rec["n_train"] / per_eval))
    warmup = warmup_passes * rec["n_train"]
    out = summarise(points, target, warmup, per_pass)
    if rec["backend"] == "sim":
        out["time_to_target"] = None  # the emulation's clock measures nothing of Horovod
    return {**out, "throughput": rec["throughput"], "load": rec["load"], "wall_s": rec["wall_s"]}


# --- the study: grid, table, goals ---------------------------------------------------


def grid(args) -> list[tuple]:
    return [(b, sc, v, n, s) for sc in args.scale for b in args.backend for v in args.variants
            for n in args.ranks for s in args.seeds]


def epochs_of(args, backend: str) -> int:
    """Validations per run: real runs stop sooner (they cost more on a shared machine)."""
    return args.hvd_epochs if backend == "hvd" else args.epochs[0]


def cached(backend: str, scale: str, variant: str, ranks: int, seed: int, args) -> dict | None:
    """The cached run of one grid cell, trying each run length in ``--epochs`` for the
    emulation (the first is the one new runs use); None if it was never run."""
    data_path = dataset_path(SCALES[scale]["data"])
    lengths = [epochs_of(args, backend)] + (args.epochs[1:] if backend == "sim" else [])
    for epochs in lengths:
        cfg_over = run_config(scale, variant, ranks, seed, epochs, train_samples(data_path))
        path = os.path.join(CACHE, f"{cache_key(backend, scale, ranks, cfg_over)}.json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
    return None


def run_grid(args) -> None:
    """Runs every (backend, variant, ranks, seed) not yet in the cache, printing each."""
    workdir = os.path.join(args.workdir, "stateff")
    os.makedirs(workdir, exist_ok=True)
    for backend, scale, variant, ranks, seed in grid(args):
        rec = run_one(backend, scale, variant, ranks, seed, epochs_of(args, backend),
                      args.target, args.measure, workdir)
        s = scored(rec, args.target, args.measure, VARIANTS[variant][1]["warmup_passes"])
        print(f"{backend} {scale} {variant:14s} np{ranks} seed {seed}: samples to target "
              f"{s['samples_to_target']}, time {fmt(s['time_to_target'])}, max drop "
              f"{s['max_drop']:.2f}, final {fmt(s['final_dice'])} ({rec['wall_s']:.0f} s)",
              flush=True)


def fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


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
                     "val_dice": [dice_of(d, args.measure) for d in rec["val_dice"]],
                     "b_simple": rec.get("b_simple"),
                     "b_simple_adam": rec.get("b_simple_adam")})
    return rows


def table(runs: list[dict]) -> list[dict]:
    """Mean and spread over seeds per (backend, scale, variant, ranks), with the
    samples to target as a multiple of the same variant's at 1 rank (1.0: no samples
    lost to the larger batch) and the speed-up of the time to target (1 rank's / N's)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["backend"], r["scale"], r["variant"], r["ranks"]), []).append(r)
    out = []
    for (backend, scale, variant, ranks), rs in groups.items():
        row = {"backend": backend, "scale": scale, "variant": variant, "ranks": ranks,
               "seeds": [r["seed"] for r in rs]}
        for k in ("samples_to_target", "time_to_target", "max_drop", "max_drop_per_pass",
                  "final_dice", "throughput"):
            row[k] = mean_spread([r[k] for r in rs])
        one = groups.get((backend, scale, variant, 1))
        if one:
            row["samples_vs_1"] = ratio(row["samples_to_target"]["mean"],
                                        mean_spread([r["samples_to_target"] for r in one])["mean"])
            row["time_speedup"] = ratio(mean_spread([r["time_to_target"] for r in one])["mean"],
                                        row["time_to_target"]["mean"])
        out.append(row)
    return out


def spread_text(m: dict, digits: int = 0) -> str:
    if m["mean"] is None:
        return f"not reached ({m['missing']})"
    text = f"{m['mean']:.{digits}f} [{m['min']:.{digits}f}-{m['max']:.{digits}f}]"
    return text + (f" +{m['missing']} not reached" if m["missing"] else "")


def print_table(rows: list[dict]) -> None:
    print(f"{'backend':7s} {'scale':5s} {'variant':14s} {'np':>2s}  {'samples to target':28s} "
          f"{'x 1np':>6s}  {'time to target s':22s} {'speedup':>7s}  {'max drop':17s} "
          f"{'final Dice':17s}")
    for r in sorted(rows, key=lambda r: (r["backend"], r["scale"], r["variant"], r["ranks"])):
        time_text = "-" if r["backend"] == "sim" else spread_text(r["time_to_target"], 1)
        print(f"{r['backend']:7s} {r['scale']:5s} {r['variant']:14s} {r['ranks']:2d}  "
              f"{spread_text(r['samples_to_target']):28s} {fmt(r.get('samples_vs_1')):>6s}  "
              f"{time_text:22s} {fmt(r.get('time_speedup')):>7s}  "
              f"{spread_text(r['max_drop'], 2):17s} {spread_text(r['final_dice'], 3):17s}")


def markdown_table(rows: list[dict]) -> str:
    """The table as Markdown, for docs/statistical-efficiency.md."""
    lines = ["| variant | back-end | ranks | seeds | samples to target | x 1 rank | time to target s "
             "| speed-up | largest drop | final Dice |", "|---" * 10 + "|"]
    for r in sorted(rows, key=lambda r: (r["scale"], r["variant"], r["backend"], r["ranks"])):
        time_text = "-" if r["backend"] == "sim" else spread_text(r["time_to_target"], 1)
        lines.append(
            f"| {r['variant']} | {r['backend']} | {r['ranks']} | {len(r['seeds'])} | "
            f"{spread_text(r['samples_to_target'])} | {fmt(r.get('samples_vs_1'))} | {time_text} | "
            f"{fmt(r.get('time_speedup'))} | {fmt(r['max_drop']['max'])} | "
            f"{spread_text(r['final_dice'], 2)} |")
    return "\n".join(lines)


def find(rows: list[dict], variant: str, ranks: int, backends=("hvd", "sim"),
         scale: str = "small") -> dict | None:
    """The table row of ``variant`` at ``ranks``, from the first back-end that has it."""
    for b in backends:
        for r in rows:
            if (r["backend"], r["scale"], r["variant"], r["ranks"]) == (b, scale, variant, ranks):
                return r
    return None


def time_speedups(runs: list[dict], variant: str, scale: str) -> list[tuple[int, float, float]]:
    """(seed, time to target at 1 rank, at 2) of every seed with both real runs."""
    real = {(r["ranks"], r["seed"]): r["time_to_target"] for r in runs
            if (r["backend"], r["scale"], r["variant"]) == ("hvd", scale, variant)}
    return [(s, real[1, s], real[2, s]) for (n, s) in sorted(real)
            if n == 1 and real[1, s] and real.get((2, s))]


def samples_ratios(rows: list[dict], variant: str, scale: str) -> dict[int, float | None]:
    """Samples to target at each rank count > 1 as a multiple of 1 rank's (means over
    seeds, the emulation's where it ran)."""
    ranks = sorted({r["ranks"] for r in rows if r["variant"] == variant and r["ranks"] > 1})
    out = {}
    for n in ranks:
        many = find(rows, variant, n, ("sim", "hvd"), scale)
        one = find(rows, variant, 1, (many["backend"],), scale)
        out[n] = ratio(many["samples_to_target"]["mean"],
                       one["samples_to_target"]["mean"]) if one else None
    return out


def noise_at_target(run: dict, field: str = "b_simple") -> float | None:
    """B_simple (``field``: ``b_simple``, or ``b_simple_adam`` preconditioned) logged
    at the validation where ``run`` first reached the target, else at the latest
    earlier one that has it (``analysis.noise.measured_near``'s rule)."""
    if run["samples_to_target"] is None:
        return None
    upto = int(run["samples_to_target"] // SAMPLES_PER_EVAL)
    found = [b for b in (run.get(field) or [])[:upto] if b is not None]
    return found[-1] if found else None


def noise_predictions(runs: list[dict], base: str, grown: str, scale: str,
                      ranks: int = 8, field: str = "b_simple") -> list[dict]:
    """Per seed: samples to target at ``grown``'s global batch (``ranks`` x BATCH)
    predicted from the run of ``base`` (global batch BATCH, the 1-rank computation) at
    ``ranks`` emulated ranks, which measures B_noise (``field``) from each rank's
    one-slice gradient; beside the samples ``grown`` measured."""
    from analysis.noise import NoisePrior
    pick = {(r["variant"], r["seed"]): r for r in runs
            if r["scale"] == scale and r["ranks"] == ranks and r["backend"] == "sim"}
    out = []
    for (variant, seed), b in sorted(pick.items()):
        g = pick.get((grown, seed))
        b_noise = noise_at_target(b, field)
        if variant != base or g is None or b_noise is None:
            continue
        prior = NoisePrior(b_noise=b_noise, run=f"{base} seed {seed}", epoch=0,
                           base_batch=BATCH, base_samples=b["samples_to_target"])
        out.append({"seed": seed, "b_noise": b_noise, "base_samples": b["samples_to_target"],
                    "predicted": prior.samples(ranks * BATCH), "measured": g["samples_to_target"]})
    return out


def _predicted_over_measured(preds: list[dict]) -> tuple[float | None, list[dict]]:
    both = [p for p in preds if p["measured"] is not None]
    measured = statistics.fmean(p["measured"] for p in both) if both else None
    predicted = statistics.fmean(p["predicted"] for p in both) if both else None
    return ratio(predicted, measured), both


def _prediction_goal(preds: list[dict], base: str, grown: str, adam: list[dict]) -> dict:
    """The goal row of the prediction from the raw B_noise (what distseg-train logs),
    with the Adam-preconditioned one's beside it."""
    off, both = _predicted_over_measured(preds)
    off_adam, with_adam = _predicted_over_measured(adam)
    measured = statistics.fmean(p["measured"] for p in both) if both else None
    predicted = statistics.fmean(p["predicted"] for p in both) if both else None
    also = "" if off_adam is None else (
        "; from the Adam-preconditioned B_noise (" + ", ".join(f"{p['b_noise']:.1f}" for p in with_adam)
        + f"): {off_adam:.2f}x the measured samples")
    return {"measure": "predicted vs measured samples to target, 8 ranks x 8 slices",
            "goal": "within 25 %", "measured": None if off is None else round(off, 2),
            "met": None if off is None else abs(off - 1) <= 0.25,
            "detail": "" if off is None else
            f"predicted from {base} at 8 emulated ranks x 1 slice (B_noise "
            + ", ".join(f"{p['b_noise']:.1f}" for p in both) + f" at the target), mean of "
            f"{len(both)} seeds: {predicted:.0f} predicted, {measured:.0f} measured ({grown})"
            + also}


def goal_rows(rows: list[dict], runs: list[dict], variant: str,
              scale: str = "small", grown: str = "gn", timed: tuple[str, str] | None = None) -> list[dict]:
    """Issue 21's goals, measured for ``variant`` (the recommended default, a fixed
    global batch) at ``scale``, each with the numbers behind it (``detail``); ``grown``:
    the variant whose 8-rank runs (8 slices per rank) the noise scale predicts;
    ``timed``: the (variant, scale) of the real runs timed to the target (default:
    ``variant`` at ``scale``)."""
    timed_variant, timed_scale = timed or (variant, scale)
    seeds = time_speedups(runs, timed_variant, timed_scale)
    loads = [x for r in runs if (r["backend"], r["scale"], r["variant"])
             == ("hvd", timed_scale, timed_variant) for x in r["load"]]
    rows = [r for r in rows if r["scale"] == scale]
    mine = [r for r in runs if r["scale"] == scale and r["variant"] == variant]
    speedup = statistics.median(t1 / t2 for _, t1, t2 in seeds) if seeds else None
    every = samples_ratios(rows, variant, scale)
    samples = {n: x for n, x in every.items() if n <= BATCH}
    worst = max((x for x in samples.values() if x is not None), default=None)
    drops = [r["max_drop"] for r in mine]
    return [
        {"measure": "time to validation Dice target, 2 vs 1 ranks", "goal": ">= 1.6",
         "measured": None if speedup is None else round(speedup, 2),
         "met": None if speedup is None else speedup >= 1.6,
         "detail": "" if speedup is None else
         f"{timed_variant} ({timed_scale}), real runs, median of {len(seeds)} seeds: "
         + ", ".join(f"{t1:.1f} s vs {t2:.1f} s" for _, t1, t2 in seeds)
         + f"; load average {min(loads):.0f}-{max(loads):.0f} on {os.cpu_count()} cores"},
        {"measure": "validation Dice never falls > 0.1 between epochs",
         "goal": f"<= {DROP_LIMIT}", "measured": round(max(drops), 3) if drops else None,
         "met": (max(drops) <= DROP_LIMIT) if drops else None,
         "detail": f"largest fall after warm-up between validations every {SAMPLES_PER_EVAL} "
                   f"samples, {variant}, {len(drops)} runs at ranks "
                   f"{','.join(map(str, sorted({r['ranks'] for r in mine})))}"},
        {"measure": "samples to target at 2, 4 and 8 ranks vs 1", "goal": "<= 1.05",
         "measured": None if worst is None else round(worst, 2),
         "met": None if worst is None else worst <= 1.05,
         "detail": f"{variant}, the largest of " + ", ".join(
             f"{n} ranks {fmt(x)}x" for n, x in samples.items()) + " (means of seeds)"},
        _prediction_goal(noise_predictions(runs, variant, grown, scale), variant, grown,
                         noise_predictions(runs, variant, grown, scale, field="b_simple_adam")),
        *[past_g_row(runs, variant, scale, n, x) for n, x in every.items() if n > BATCH],
    ]


def past_g_row(runs: list[dict], variant: str, scale: str, ranks: int, measured: float | None) -> dict:
    """Samples to target at ``ranks`` > BATCH (one slice per rank: the global batch
    grows to ``ranks``, with its learning-rate rule) vs 1 rank, beside McCandlish's
    (B_noise + ranks) / (B_noise + BATCH) from the B_noise the 8-rank runs measured near
    the target (raw, and Adam-preconditioned)."""
    at8 = [r for r in runs if (r["backend"], r["scale"], r["variant"], r["ranks"])
           == ("sim", scale, variant, BATCH)]
    predicted = {}
    for field in ("b_simple", "b_simple_adam"):
        b = [x for x in (noise_at_target(r, field) for r in at8) if x is not None]
        predicted[field] = [(x + ranks) / (x + BATCH) for x in b]
    text = ", ".join(f"{name} {statistics.fmean(v):.2f}x (B_noise {len(v)} seeds)"
                     for name, v in (("raw", predicted["b_simple"]),
                                     ("Adam-preconditioned", predicted["b_simple_adam"])) if v)
    return {"measure": f"samples to target at {ranks} ranks x 1 slice (global batch grows "
                       f"from {BATCH} to {ranks}) vs 1 rank",
            "goal": "reported", "measured": None if measured is None else round(measured, 2),
            "met": None, "detail": f"{variant}, means of seeds; predicted from the "
                                  f"{BATCH}-rank runs' noise scale: {text or 'none'}"}


def machine() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_now": os.getloadavg()}


def write_results(args, runs: list[dict], rows: list[dict]) -> str:
    today = datetime.date.today().isoformat()
    out = args.out or os.path.join(ROOT, "bench", "results", f"stateff-{today}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    doc = {
        "benchmark": "bench_stateff", "date": today, "machine": machine(),
        "target": {"measure": args.measure, "dice": args.target,
                   "samples_per_eval": SAMPLES_PER_EVAL, "batch_per_rank": BATCH},
        "variants": {v: {"what": VARIANTS[v][0], "overrides": VARIANTS[v][1]}
                     for v in args.variants},
        "scales": {sc: SCALES[sc] for sc in args.scale},
        # The goal rows, read by `make bench` (benchmarks/benchlib/table.py).
        "rows": goal_rows(rows, runs, args.recommended, args.scale[0], args.grown,
                           tuple(args.timed.split("@")) if args.timed else None),
        "summary": {"recommended": args.recommended, "scale": args.scale[0]},
        "table": rows, "runs": runs,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return out


def check_sim(args) -> None:
    """The emulation against a real run of the same config: per-epoch train loss and
    Dice side by side (they agree closely early, then drift apart as float sums do)."""
    workdir = os.path.join(args.workdir, "stateff")
    os.makedirs(workdir, exist_ok=True)
    for backend in ("sim", "hvd"):
        for variant in args.variants:
            for ranks in args.ranks:
                rec = run_one(backend, args.scale[0], variant, ranks, args.seeds[0],
                              epochs_of(args, backend), args.target, args.measure, workdir)
                print(f"{backend} {variant} np{ranks}: loss " +
                      " ".join(f"{p['train_loss']:.3f}" for p in rec["points"]) +
                      "\n    liver " + " ".join(f"{p['dice']:.2f}" for p in rec["points"]))


def set_threads(n: int) -> None:
    """One TensorFlow thread for the emulation, like each real rank (before any op)."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)


def str_list(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def int_list(text: str) -> list[int]:
    return [int(x) for x in str_list(text)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", type=str_list, default=["sim"], help="sim,hvd")
    ap.add_argument("--scale", type=str_list, default=["small"],
                    help=f"one or more of {', '.join(SCALES)}; the goal rows use the first")
    ap.add_argument("--variants", type=str_list, default=list(VARIANTS))
    ap.add_argument("--ranks", type=int_list, default=[1, 2, 4, 8])
    ap.add_argument("--seeds", type=int_list, default=[0, 1])
    ap.add_argument("--epochs", type=int_list, default=[12, 8],
                    help=f"validations per sim run (each after {SAMPLES_PER_EVAL} samples); "
                         "new runs use the first, the table also reads runs of the others")
    ap.add_argument("--hvd-epochs", type=int, default=10, help="validations per hvd run")
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--measure", default=MEASURE, help="liver, lesion or foreground")
    ap.add_argument("--recommended", default="gbatch-gn",
                    help="variant of the goal rows (a fixed global batch of 8)")
    ap.add_argument("--timed", default=None, metavar="VARIANT@SCALE",
                    help="the real runs of the time row (default: --recommended at the "
                    "first --scale), e.g. demo-now@demo")
    ap.add_argument("--grown", default="gn", help="variant whose 8 ranks x 8 slices the "
                    "noise scale of --recommended's 8 ranks x 1 slice predicts")
    ap.add_argument("--report", action="store_true", help="no runs: table from the cache")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--check-sim", action="store_true", help="sim vs hvd on the same config")
    ap.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not set(args.backend) <= {"sim", "hvd"} or not set(args.scale) <= set(SCALES):
        ap.error(f"unknown variant(s) {unknown} (known: {', '.join(VARIANTS)}), back-end "
                 "or scale")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "sim" in args.backend or args.check_sim:
        set_threads(1)
    if args.check_sim:
        check_sim(args)
        return 0
    if not args.report:
        run_grid(args)
    runs = collect(args)
    rows = table(runs)
    print(markdown_table(rows) if args.markdown else "", end="\n" if args.markdown else "")
    print_table(rows)
    out = write_results(args, runs, rows)
    for g in goal_rows(rows, runs, args.recommended, args.scale[0], args.grown,
                           tuple(args.timed.split("@")) if args.timed else None):
        print(f"goal: {g['measure']}: {g['goal']}, measured {g['measured']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
