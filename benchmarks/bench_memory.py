"""Benchmark of ``distseg-memory``: the estimate against the measured peak, and what
``recompute`` and ``bfloat16`` save.

1. Estimate vs measured: the liver3d U-Net (16 base filters, depth 4, float32) at
   32^3, 64^3 and 96^3, batch 2; each measured by ``memprobe.measure`` (a fresh process,
   a few train steps, peak RSS above TensorFlow's own). Goal: within 15 %.
2. Large inputs without tiling, at the largest size: the plain model, ``recompute``,
   ``bfloat16`` and both, run round-robin (A B C D A B C ...) so the shared machine's
   load hits all alike; peak and median step time, as ratios to the plain model's
   medians. Step time is the process's CPU time per step (one intra-op thread), which
   the other users of a shared machine disturb far less than wall time; both are kept. Goals: recompute cuts the peak by >= 40 % for <= 35 % more step time;
   bfloat16 cuts it by >= 35 %.
3. Dice after a short run, float32 vs bfloat16: a seeded synthetic 3D task generated
   here (32^3 volumes: a noisy ellipsoid "organ" holding a smaller sphere "lesion"),
   the same U-Net trained from the same initial weights on the same 200 batches of 2
   under each precision, built and stepped as ``distseg-train`` builds and steps the
   liver3d preset (``benchlib.model_variants.model_and_optimizer`` and
   ``factory.train_step``: its optimizer, Adam at 1e-3, and its Dice + cross-entropy
   loss), hard Dice of the two foreground classes on 6 held-out volumes, for two seeds
   (a short run's Dice moves with the seed by more than 0.02, so one pair would compare
   noise). Goal: the mean foreground Dice within 0.02.

Prints one table, goal beside measured, and writes ``bench/results/memory-<date>.json``.

Usage::

    python benchmarks/bench_memory.py                 # about 15 minutes on 2 cores
    python benchmarks/bench_memory.py --quick         # 32^3/48^3/64^3, one round, fewer steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from distseg.networks import memory  # noqa: E402
from distseg.networks import spec as spec_lib  # noqa: E402
from distseg.training.step import memprobe  # noqa: E402

from benchlib.args import add_results_dir, preset_config, set_threads  # noqa: E402

MODES = {"plain": {}, "recompute": {"recompute": True}, "bfloat16": {"precision": "bfloat16"},
         "bfloat16+recompute": {"recompute": True, "precision": "bfloat16"}}


def run(size: int, batch: int, steps: int, **options) -> dict:
    """One measured run beside its estimate (MiB, seconds)."""
    spec = spec_lib.UNetSpec((size,) * 3, **options)
    got = memprobe.measure(spec, batch, steps=steps)
    est = memory.estimate(spec, batch)
    return {"size": size, "batch": batch, **options, "measured_mib": got.peak_rss / 2 ** 20,
            "estimate_mib": est.total / 2 ** 20, "tf_peak_mib": got.tf_peak / 2 ** 20,
            "error_pct": 100.0 * (est.total - got.peak_rss) / got.peak_rss,
            "step_s": statistics.median(got.step_seconds),
            "step_cpu_s": statistics.median(got.step_cpu_seconds)}


def accuracy(sizes, batch: int, steps: int) -> list[dict]:
    out = []
    for size in sizes:
        out.append(run(size, batch, steps))
        print(f"  {size}^3 x {batch}: measured {out[-1]['measured_mib']:.0f} MiB, estimate "
              f"{out[-1]['estimate_mib']:.0f} MiB ({out[-1]['error_pct']:+.1f} %)", flush=True)
    return out


def options_round_robin(size: int, batch: int, steps: int, rounds: int) -> dict:
    """Every mode ``rounds`` times, interleaved; lists of runs per mode."""
    runs = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode, options in MODES.items():
            runs[mode].append(run(size, batch, steps, **options))
            print(f"  round {r + 1} {mode}: {runs[mode][-1]['measured_mib']:.0f} MiB, "
                  f"{runs[mode][-1]['step_cpu_s']:.2f} CPU s/step ({runs[mode][-1]['step_s']:.2f} s wall)",
                  flush=True)
    return runs


def ratios(runs: dict) -> dict:
    """Per mode: median peak and step time, and their ratios to the plain model's."""
    plain_peak = statistics.median(r["measured_mib"] for r in runs["plain"])
    plain_step = statistics.median(r["step_s"] for r in runs["plain"])
    plain_cpu = statistics.median(r["step_cpu_s"] for r in runs["plain"])
    out = {}
    for mode, rs in runs.items():
        peak = statistics.median(r["measured_mib"] for r in rs)
        step = statistics.median(r["step_s"] for r in rs)
        cpu = statistics.median(r["step_cpu_s"] for r in rs)
        out[mode] = {"peak_mib": peak, "step_s": step, "step_cpu_s": cpu,
                     "peak_cut_pct": 100.0 * (1 - peak / plain_peak),
                     "step_time_ratio": cpu / plain_cpu, "step_wall_ratio": step / plain_step,
                     "estimate_error_pct": statistics.median(r["error_pct"] for r in rs)}
    return out


# --- Dice after a short run ---------------------------------------------------------


def phantom(n: int, size: int, seed: int):
    """``n`` volumes: noise, a bright ellipsoid (class 1) holding a brighter sphere
    (class 2) at random places and sizes; images (n, s, s, s, 1), masks (n, s, s, s)."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(size)] * 3, indexing="ij"), -1).astype(np.float32)
    images = rng.normal(0.0, 0.35, (n, size, size, size)).astype(np.float32)
    masks = np.zeros((n, size, size, size), np.uint8)
    for i in range(n):
        centre = rng.uniform(0.35, 0.65, 3) * size
        radii = rng.uniform(0.2, 0.32, 3) * size
        organ = (((grid - centre) / radii) ** 2).sum(-1) <= 1.0
        lesion_at = centre + rng.uniform(-0.3, 0.3, 3) * radii
        lesion = (((grid - lesion_at) / (rng.uniform(0.45, 0.6) * radii.min())) ** 2).sum(-1) <= 1.0
        masks[i][organ] = 1
        masks[i][organ & lesion] = 2
        images[i] += 0.8 * (masks[i] >= 1) + 0.9 * (masks[i] == 2)
    return images[..., None], masks


def dice_config(precision: str, depth: int = 4, base_filters: int = 16):
    """The liver3d preset's config (its optimizer, lr and Dice + cross-entropy loss, whose
    cross-entropy term makes the small lesion class learn within a short run) with the
    U-Net of ``depth`` poolings and ``base_filters`` filters in ``precision``."""
    import dataclasses
    cfg = preset_config("liver3d", precision=precision)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, depth=depth,
                                                              base_filters=base_filters))


def train_and_score(cfg, data, steps: int, batch: int, seed: int = 0) -> dict:
    """Trains ``cfg``'s 3D U-Net, built and stepped as ``distseg-train`` builds and steps
    it, on ``steps`` seeded batches of ``data``'s training volumes and returns the hard
    Dice per foreground class on its held-out volumes."""
    import tensorflow as tf

    from distseg import metrics
    from distseg.training.step import factory

    from benchlib import model_variants
    (train_x, train_y), (val_x, val_y) = data
    shape = train_x.shape[1:4]
    model, optimizer = model_variants.model_and_optimizer(cfg, shape, seed)
    step = factory.train_step(cfg, (model, optimizer), shape, ranks=1, batch=batch)
    flags = np.zeros(2, np.float32)
    order = np.random.default_rng(seed).integers(0, len(train_x), size=(steps, batch))
    started = time.perf_counter()
    for ids in order:
        float(step(train_x[ids], train_y[ids], flags).loss)
    seconds = time.perf_counter() - started
    counts = sum(metrics.dice_counts(model(val_x[i:i + 1], training=False), tf.constant(val_y[i:i + 1]), 3).numpy()
                 for i in range(len(val_x)))
    dice = metrics.dice_from_counts(counts)
    return {"precision": cfg.model.precision, "dice_organ": dice[1], "dice_lesion": dice[2],
            "dice_mean": (dice[1] + dice[2]) / 2, "train_seconds": seconds}


def dice_check(steps: int, batch: int, seeds=(0, 1), data=None, **model) -> dict:
    """Each precision trained from each seed (same initial weights and batches for both
    precisions of a seed) on ``data`` (default: 24 training and 6 held-out phantoms of
    32^3), the U-Net of ``dice_config`` (``model``: its depth and filters): Dice per
    run and the mean over seeds."""
    data = data or (phantom(24, 32, seed=1), phantom(6, 32, seed=2))
    runs = []
    for seed in seeds:
        for precision in ("float32", "bfloat16"):
            cfg = dice_config(precision, **model)
            runs.append({"seed": seed, **train_and_score(cfg, data, steps, batch, seed)})
            r = runs[-1]
            print(f"  seed {seed} {precision}: organ Dice {r['dice_organ']:.3f}, lesion "
                  f"{r['dice_lesion']:.3f} ({r['train_seconds']:.0f} s)", flush=True)
    mean = {p: statistics.mean(r["dice_mean"] for r in runs if r["precision"] == p)
            for p in ("float32", "bfloat16")}
    return {"runs": runs, "mean": mean, "steps": steps, "batch": batch}


# --- table and results --------------------------------------------------------------


def table(acc: list[dict], opts: dict, size: int, dice: dict) -> list[tuple[str, str, str, bool]]:
    rows = [(f"estimate vs measured peak, {r['size']}^3 x {r['batch']}", "within 15 %",
             f"{r['error_pct']:+.1f} % ({r['estimate_mib']:.0f} vs {r['measured_mib']:.0f} MiB)",
             abs(r["error_pct"]) <= 15) for r in acc]
    rec, bf = opts["recompute"], opts["bfloat16"]
    rows += [
        (f"recompute: peak cut, {size}^3", ">= 40 %", f"{rec['peak_cut_pct']:.1f} %", rec["peak_cut_pct"] >= 40),
        (f"recompute: step CPU time, {size}^3", "<= 1.35x",
         f"{rec['step_time_ratio']:.2f}x (wall {rec['step_wall_ratio']:.2f}x)", rec["step_time_ratio"] <= 1.35),
        (f"bfloat16: peak cut, {size}^3", ">= 35 %", f"{bf['peak_cut_pct']:.1f} %", bf["peak_cut_pct"] >= 35),
        (f"bfloat16: step CPU time, {size}^3", "(measured)",
         f"{bf['step_time_ratio']:.2f}x (wall {bf['step_wall_ratio']:.2f}x)", True),
        (f"bfloat16+recompute: peak cut, {size}^3", "(measured)",
         f"{opts['bfloat16+recompute']['peak_cut_pct']:.1f} %", True),
    ]
    rows += [(f"estimate vs measured, {m}, {size}^3", "within 15 %", f"{opts[m]['estimate_error_pct']:+.1f} %",
              abs(opts[m]["estimate_error_pct"]) <= 15) for m in ("recompute", "bfloat16", "bfloat16+recompute")]
    gap = abs(dice["mean"]["bfloat16"] - dice["mean"]["float32"])
    per_seed = [b["dice_mean"] - f["dice_mean"] for f, b in zip(dice["runs"][::2], dice["runs"][1::2])]
    rows.append((f"Dice after {dice['steps']} steps, bfloat16 vs float32 (mean of {len(dice['runs']) // 2} seeds)",
                 "within 0.02", f"{gap:.3f} ({dice['mean']['bfloat16']:.3f} vs {dice['mean']['float32']:.3f}; "
                 f"per seed {', '.join(f'{g:+.3f}' for g in per_seed)})",
                 gap <= 0.02))
    return rows


def print_table(rows) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"\n| {'measure':<{width}} | goal | measured | met |\n|{'-' * (width + 2)}|---|---|---|")
    for measure, goal, measured, met in rows:
        print(f"| {measure:<{width}} | {goal} | {measured} | {'yes' if met else 'no'} |")


def machine() -> dict:
    import importlib.metadata
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    return {"cpu_model": model, "cpus": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags,
            "python": platform.python_version(), "tensorflow": importlib.metadata.version("tensorflow-cpu"),
            "keras": importlib.metadata.version("keras"), "load_average": os.getloadavg(),
            "intra_op_threads": 1}


def write_results(results_dir: str, started: float, rows, **parts) -> str:
    """``bench/results/memory-<date>.json``: the table's rows, the machine and every
    measured ``parts`` (accuracy, options, runs, dice); returns its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"memory-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"date": stamp, "machine": machine(), "wall_seconds": time.time() - started,
                   "rows": [{"measure": m, "goal": g, "measured": v, "met": ok} for m, g, v, ok in rows],
                   **parts}, f, indent=2)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round, short Dice run")
    ap.add_argument("--rounds", type=int, default=2, help="round-robin rounds of the options")
    args = add_results_dir(ap).parse_args(argv)
    sizes, size, rounds = ([32, 48, 64], 64, 1) if args.quick else ([32, 64, 96], 96, args.rounds)
    started = time.time()
    print("1. estimate vs measured (float32, batch 2)", flush=True)
    acc = accuracy(sizes, 2, 3)
    print(f"2. recompute and bfloat16 at {size}^3 x 2, {rounds} round(s)", flush=True)
    runs = options_round_robin(size, 2, 5, rounds)
    opts = ratios(runs)
    print("3. Dice after a short run, float32 vs bfloat16", flush=True)
    set_threads(1)
    dice = dice_check(40 if args.quick else 200, 2)
    rows = table(acc, opts, size, dice)
    print_table(rows)
    path = write_results(args.results_dir, started, rows, accuracy=acc, options=opts, runs=runs,
                         dice=dice)
    print(f"\nwrote {path} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
