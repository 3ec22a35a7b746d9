"""``make bench-augment``: what on-the-fly augmentation (``data.augment``) costs a
training step, each kind measured side by side in one run.

* the demo (128 x 128 slices, batch 8, one thread) on one rank held to one core
  (``taskset -c CORE``: the reader thread that augments shares the core with the
  step), ``none``, ``light`` and ``default`` interleaved over ``--rounds``: the median
  step time and the median ``data_wait`` (what the step waited for the reader) over
  the epochs after the first, each against ``none``;
* the same on ``liver3d`` (32 x 128 x 128 slabs, one per step) on LiTS 117 as volumes;
* the augmenter alone in this process on the same core, on the real samples of each
  file: milliseconds per sample, against the budget of 10 % of a step (the ``none``
  run's median step over its batch).

Results go to ``bench/results/augment-<date>-<time>.json``.

    python benchmarks/bench_augment.py --data data/liver117.h5
    python benchmarks/bench_augment.py --rounds 1 --epochs 2 --steps 3 --skip 3d   # a quick check

``--preset`` and ``--kinds`` (which must hold ``none``, the baseline) shrink it further,
for its test on tiny data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from distseg.core import config as config_lib  # noqa: E402
from distseg.data import augment, feeds  # noqa: E402

from benchlib import launch, machine, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402

KINDS = ("none", "light", "default")
#: The cost the augmentation may add to a step (the task's goal).
BUDGET = 0.10


def train(args: list[str], core: int, workdir: str, name: str) -> str:
    """One rank of distseg-train pinned to ``core``; returns its run directory."""
    run_dir = os.path.join(workdir, name)
    cmd = launch.train_command([*args, "--no-validate", "--no-tensorboard"], run_dir,
                               threads=1, core=core)
    launch.run_train(cmd, name)
    return run_dir


def summary(run_dir: str) -> dict:
    """Median step time and data_wait over the epochs after the first, per sample too."""
    records = runlogs.rank_records(run_dir, 1)[0]
    steps = [r for r in records if r["type"] == "step" and r["epoch"] > 0]
    if not steps:
        raise RuntimeError(f"{run_dir}: no step after the first epoch (give --epochs 2 or more)")
    return {"median_step_s": statistics.median(s["step_time"] for s in steps),
            "median_data_wait_s": statistics.median(s["data_wait"] for s in steps),
            "mean_data_wait_s": statistics.fmean(s["data_wait"] for s in steps),
            "samples_per_step": statistics.median(s["samples"] for s in steps),
            "steps": len(steps), "samples_per_s": runlogs.run_throughput(run_dir, 1)}


def rounds(a, workload: str, args: list[str], workdir: str) -> list[dict]:
    """The kinds interleaved, ``a.rounds`` times (the order reversed every other round,
    so a drift in the machine's load hits every kind alike)."""
    rows = []
    for rnd in range(a.rounds):
        for kind in (a.kinds if rnd % 2 == 0 else a.kinds[::-1]):
            name = f"{workload}-r{rnd}-{kind}"
            run = train([*args, "--config", launch.augment_config(kind, workdir)], a.core, workdir, name)
            row = {"workload": workload, "round": rnd, "augment": kind, **summary(run)}
            print(json.dumps({k: row[k] for k in ("workload", "round", "augment", "median_step_s",
                                                  "median_data_wait_s")}), flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> dict:
    """Per kind run: medians over the rounds and the ratio of the step to ``none``'s."""
    kinds = [k for k in KINDS if any(r["augment"] == k for r in rows)]
    med = {kind: {k: statistics.median(r[k] for r in rows if r["augment"] == kind)
                  for k in ("median_step_s", "median_data_wait_s", "samples_per_step")}
           for kind in kinds}
    base = med["none"]["median_step_s"]
    return {kind: {**m, "step_ratio_vs_none": m["median_step_s"] / base,
                   "added_share_of_step": (m["median_step_s"] - base) / base}
            for kind, m in med.items()}


def augmenter_alone(path: str, preset: str, core: int, samples: int, workdir: str,
                    kinds=KINDS[1:]) -> dict:
    """Milliseconds per sample of each of ``kinds`` on ``samples`` real training samples
    of ``path`` read as the run reads them, this process pinned to ``core``."""
    cfg = config_lib.resolve(preset, overrides={"data.path": path, "run_dir": workdir})
    _, feed = feeds.open_feed(cfg, 1, check_labels=False)
    ids = np.asarray(feed.train_ids)[:samples]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        with feed.open_reader() as reader:
            images, masks = reader.read(ids, 0)
            out = {}
            for kind in kinds:
                aug = augment.Augmenter(kind, 0, cfg.model.spatial_dims)
                times = []
                for epoch in range(5):
                    t = time.perf_counter()
                    aug(ids, epoch, images, masks)
                    times.append((time.perf_counter() - t) / len(ids))
                out[kind] = {"ms_per_sample": 1e3 * statistics.median(times),
                             "sample_shape": list(images.shape[1:])}
    finally:
        os.sched_setaffinity(0, before)
    return out


def budget(alone: dict, runs: dict) -> dict:
    """Each kind's ms per sample against 10 % of the ``none`` run's step per sample."""
    per_sample = runs["none"]["median_step_s"] / runs["none"]["samples_per_step"]
    return {kind: {"ms_per_sample": v["ms_per_sample"],
                   "budget_ms_per_sample": 1e3 * BUDGET * per_sample,
                   "share_of_step": v["ms_per_sample"] / (1e3 * per_sample)}
            for kind, v in alone.items()}


def workload(a, name: str, preset: str, data: str, workdir: str) -> dict:
    args = ["--preset", preset, "--data", data, "--epochs", str(a.epochs),
            "--precision", a.precision]
    if a.steps:
        args += ["--max-steps-per-epoch", str(a.steps)]
    runs = rounds(a, name, args, workdir)
    summary_ = table(runs)
    alone = augmenter_alone(data, preset, a.core, a.samples, workdir,
                            [k for k in a.kinds if k != "none"])
    return {"runs": runs, "table": summary_, "augmenter": budget(alone, summary_)}


def print_table(result: dict) -> None:
    print(f"\n{'workload':10} {'augment':8} {'step s':>8} {'x none':>7} {'wait s':>8} "
          f"{'aug ms/sample':>14} {'of step':>8}")
    for name in ("2d", "3d"):
        if name not in result:
            continue
        t, alone = result[name]["table"], result[name]["augmenter"]
        for kind in t:
            a = alone.get(kind, {})
            cost = f"{a['ms_per_sample']:14.2f} {a['share_of_step']:8.1%}" if a else f"{'-':>14} {'-':>8}"
            print(f"{name:10} {kind:8} {t[kind]['median_step_s']:8.3f} "
                  f"{t[kind]['step_ratio_vs_none']:7.3f} {t[kind]['median_data_wait_s']:8.4f} {cost}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(REPO, "data", "liver117.h5"),
                   help="2D slices (distseg-data lits-sample)")
    p.add_argument("--preset", default="demo", help="the 2D workload's preset")
    p.add_argument("--data3d", default="", help="3D volumes (default: lits-sample --ndim 3, made here)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is not timed")
    p.add_argument("--epochs3d", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="cap steps per epoch (0: whole epochs)")
    p.add_argument("--steps3d", type=int, default=8)
    p.add_argument("--samples", type=int, default=32, help="samples the augmenter alone is timed on")
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--precision", default="float32", choices=config_lib.PRECISIONS,
                   help="one precision for every run (auto's trial would differ between runs)")
    p.add_argument("--skip", default="", help="leave out: 2d, 3d")
    p.add_argument("--kinds", default=",".join(KINDS), help="data.augment kinds, none among them")
    a = add_results_dir(p).parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    given = [k for k in a.kinds.split(",") if k]
    if "none" not in given or not set(given) <= set(KINDS):
        p.error(f"--kinds {a.kinds}: expected none (the baseline) and any of {', '.join(KINDS[1:])}")
    a.kinds = tuple(k for k in KINDS if k in given)
    result = {**launch.invocation(), "budget_share": BUDGET, "core": a.core,
              "load_average_start": machine.load_average(),
              "machine": machine.describe(REPO, {"intra_op": 1, "inter_op": 1})}
    with tempfile.TemporaryDirectory(prefix="bench-augment-") as workdir:
        if "2d" not in skip:
            result["2d"] = workload(a, "2d", a.preset, a.data, workdir)
        if "3d" not in skip:
            three = argparse.Namespace(**{**vars(a), "epochs": a.epochs3d, "steps": a.steps3d})
            volumes = a.data3d or launch.lits_sample(os.path.join(workdir, "liver117-3d.h5"), 3)
            result["3d"] = workload(three, "3d", "liver3d", volumes, workdir)
    result["load_average_end"] = machine.load_average()
    path = launch.write_result(result, a.results_dir, "augment")
    print_table(result)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
