"""The learning rate on the real LiTS case: ``--lr auto`` with each schedule against a
fixed lr, real ``distseg-train`` runs of a preset (``demo`` by default), at each seed and
rank count asked. Per run: the lr used (and the range test's steps and seconds), the
final validation liver Dice, its peak, and the first epoch from which the Dice holds
the target (default 0.75) for two validations in a row. Prints a table and writes
``bench/results/lr-study-<date>-<time>.json``.

Runs go two at a time where each is one rank (each pinned to a core of its own with
``taskset``; 2 cores here); a 2-rank run has the machine alone.

    python benchmarks/study_lr.py --data data/liver117.h5
    python benchmarks/study_lr.py --data data/liver117.h5 --arms lr=1e-3,constant auto,cosine \\
        --seeds 0 1 --ranks 1 2 --epochs 16
    python benchmarks/study_lr.py --data data/liver117.h5 --epochs 1 --seeds 0 --arms auto,cosine  # smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib import launch, machine, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402


def held_from(dice: list, target: float, hold: int = 2) -> int | None:
    """The first epoch (1-based) from which ``hold`` validations in a row reach
    ``target``: the epoch of the first of them; None if never."""
    for k in range(len(dice) - hold + 1):
        if all(d is not None and d >= target for d in dice[k:k + hold]):
            return k + 1
    return None


def arm_args(arm: str) -> tuple[list[str], str]:
    """``lr=1e-3,constant`` or ``auto,cosine``: the flags, and a name."""
    lr, _, schedule = arm.partition(",")
    lr = lr.removeprefix("lr=")
    return ["--lr", lr, "--lr-schedule", schedule or "constant"], f"{lr}-{schedule or 'constant'}"


def train(a, arm: str, seed: int, ranks: int, core: int | None, workdir: str) -> dict:
    """One run of ``arm``; its row."""
    flags, name = arm_args(arm)
    run_dir = os.path.join(workdir, f"{name}-s{seed}-np{ranks}")
    cmd = launch.train_command(["--preset", a.preset, "--data", a.data, "--epochs", str(a.epochs),
                                "--seed", str(seed), *flags, "--no-tensorboard"], run_dir,
                               ranks=ranks, threads=1, core=core)
    start = time.monotonic()
    launch.run_train(cmd, run_dir, timeout=6 * 3600)
    return row(a, arm, seed, ranks, run_dir, time.monotonic() - start)


def row(a, arm: str, seed: int, ranks: int, run_dir: str, seconds: float) -> dict:
    records = runlogs.rank_records(run_dir, 1)[0]
    run = next(r for r in records if r["type"] == "run")
    epochs = [r for r in records if r["type"] == "epoch"]
    dice = [e["val_dice"].get("liver") for e in epochs]
    found = run.get("lr_find") or {}
    out = {"arm": arm, "seed": seed, "ranks": ranks, "lr": run["lr_base"],
           "schedule": run.get("lr_schedule"), "range_steps": found.get("steps"),
           "range_s": found.get("seconds"), "final": dice[-1], "peak": max(d for d in dice if d is not None),
           "held_from_epoch": held_from(dice, a.target), "liver_by_epoch": dice,
           "train_s": sum(e["train_time"] for e in epochs), "wall_s": seconds}
    print(json.dumps({k: out[k] for k in ("arm", "seed", "ranks", "lr", "range_steps", "range_s",
                                          "final", "peak", "held_from_epoch")}), flush=True)
    return out


def run_all(a, workdir: str) -> list[dict]:
    """The 1-rank runs two at a time (one core each), then the multi-rank ones alone."""
    jobs = [(arm, seed, ranks) for ranks in a.ranks for seed in a.seeds for arm in a.arms]
    single = [j for j in jobs if j[2] == 1]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.parallel) as pool:
        futures = [pool.submit(train, a, arm, seed, 1, k % a.parallel if a.parallel > 1 else None,
                               workdir) for k, (arm, seed, _) in enumerate(single)]
        rows += [f.result() for f in futures]
    for arm, seed, ranks in (j for j in jobs if j[2] > 1):
        rows.append(train(a, arm, seed, ranks, None, workdir))
    return rows


def print_table(rows: list[dict], target: float) -> None:
    print(f"\n{'arm':<22}{'seed':>5}{'ranks':>6}{'lr':>10}{'range s':>9}{'final':>8}"
          f"{'peak':>8}{f'>= {target} from':>14}")
    for r in rows:
        rs = "" if r["range_s"] is None else f"{r['range_s']:.1f}"
        print(f"{r['arm']:<22}{r['seed']:>5}{r['ranks']:>6}{r['lr']:>10.3g}{rs:>9}"
              f"{r['final']:>8.3f}{r['peak']:>8.3f}{str(r['held_from_epoch']):>14}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="LiTS 117 as slices (distseg-data lits-sample)")
    p.add_argument("--preset", default="demo")
    p.add_argument("--arms", nargs="+", default=["lr=1e-3,constant", "auto,constant",
                                                 "auto,cosine", "auto,poly"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--ranks", nargs="+", type=int, default=[1])
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--target", type=float, default=0.75, help="validation liver Dice target")
    p.add_argument("--parallel", type=int, default=2, help="1-rank runs at a time")
    p.add_argument("--workdir", default=None)
    return add_results_dir(p).parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="lr-study-")
    rows = run_all(a, workdir)
    print_table(rows, a.target)
    commit = machine.revision(REPO, short=True)
    path = launch.write_result({"study": "lr", "commit": commit, "args": vars(a), "runs": rows},
                               a.results_dir, "lr-study")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
