"""Recipes judged on real CT: each recipe (a set of ``distseg-train`` flags on a preset)
trained on every fold of LiTS case 117 (``distseg-data lits-sample --folds K --fold I``)
at each rank count asked; per recipe and rank count, the mean and spread over the folds
of the final and the best validation liver Dice, and the largest fall between two
consecutive validations in the second half of a run. Prints the table as Markdown (for
docs/studies/) and writes ``bench/results/folds-<date>-<time>.json``.

The 1-rank runs go two at a time, each pinned to a core of its own; a 2-rank run has
the machine alone.

    python benchmarks/study_folds.py --recipes "demo=" "instance=--norm instance" \\
        --folds 4 --ranks 1
    python benchmarks/study_folds.py --recipes "instance=--norm instance" --ranks 2
    python benchmarks/study_folds.py --ndim 3 --preset liver3d --recipes "liver3d=" --epochs 1  # smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from distseg.data import lits  # noqa: E402

from benchlib import launch, machine, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402


def recipe(text: str) -> tuple[str, list[str]]:
    """``NAME=FLAGS`` (flags as a shell would split them; empty: the preset as it is)."""
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a recipe is NAME=FLAGS, got {text!r}")
    return name, shlex.split(flags)


def largest_fall(dice: list) -> float:
    """The largest fall of the Dice between two consecutive validations in the second
    half of a run (0: none)."""
    half = [d for d in dice[len(dice) // 2:] if d is not None]
    return max([0.0] + [a - b for a, b in zip(half, half[1:])])


def train(a, name: str, flags: list[str], fold: int, ranks: int, core: int | None,
          data: str, workdir: str) -> dict:
    """One run of a recipe on one fold; its row."""
    run_dir = os.path.join(workdir, f"{name}-f{fold}-np{ranks}")
    epochs = ["--epochs", str(a.epochs)] if a.epochs else []
    cmd = launch.train_command(["--preset", a.preset, "--data", data, "--seed", str(a.seed),
                                *epochs, *flags, "--no-tensorboard"], run_dir,
                               ranks=ranks, threads=1, core=core)
    start = time.monotonic()
    launch.run_train(cmd, run_dir, timeout=6 * 3600)
    records = runlogs.rank_records(run_dir, 1)[0]
    epochs_ = [r for r in records if r["type"] == "epoch"]
    dice = [e["val_dice"].get("liver") for e in epochs_]
    row = {"recipe": name, "flags": flags, "fold": fold, "ranks": ranks,
           "final": dice[-1], "best": max(d for d in dice if d is not None),
           "fall": largest_fall(dice), "liver_by_epoch": dice,
           "train_s": sum(e["train_time"] for e in epochs_), "wall_s": time.monotonic() - start}
    print(json.dumps({k: row[k] for k in ("recipe", "fold", "ranks", "final", "best", "fall")}),
          flush=True)
    return row


def run_all(a, files: dict[int, str], workdir: str) -> list[dict]:
    """The 1-rank runs ``a.parallel`` at a time (one core each), then the others alone."""
    jobs = [(name, flags, fold, ranks) for ranks in a.ranks for name, flags in a.recipes
            for fold in range(a.folds)]
    single = [j for j in jobs if j[3] == 1]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.parallel) as pool:
        futures = [pool.submit(train, a, name, flags, fold, 1,
                               k % a.parallel if a.parallel > 1 else None, files[fold], workdir)
                   for k, (name, flags, fold, _) in enumerate(single)]
        rows += [f.result() for f in futures]
    for name, flags, fold, ranks in (j for j in jobs if j[3] > 1):
        rows.append(train(a, name, flags, fold, ranks, None, files[fold], workdir))
    return rows


def spread(values: list[float]) -> str:
    """mean ± sample sd (min-max)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f} ({min(values):.3f}-{max(values):.3f})"


def table(rows: list[dict]) -> str:
    """Markdown: one line per recipe and rank count, over its folds."""
    lines = ["| recipe | flags | ranks | folds | final liver Dice | best liver Dice | largest fall, 2nd half |",
             "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["recipe"], r["ranks"]), []).append(r)
    for (name, ranks), rs in groups.items():
        flags = " ".join(rs[0]["flags"]) or "(the preset's)"
        lines.append(f"| {name} | `{flags}` | {ranks} | {len(rs)} | "
                     f"{spread([r['final'] for r in rs])} | {spread([r['best'] for r in rs])} | "
                     f"{max(r['fall'] for r in rs):.3f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", nargs="+", type=recipe, required=True, metavar="NAME=FLAGS")
    p.add_argument("--preset", default="demo")
    p.add_argument("--ndim", type=int, choices=(2, 3), default=2)
    p.add_argument("--folds", type=int, default=4, help="folds of the case's slabs (2, 4, 8)")
    p.add_argument("--ranks", nargs="+", type=int, default=[1])
    p.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ct-norm", default=lits.CT_NORM, choices=("window", "foreground"),
                   help="the fold files' CT normalisation (lits-sample --ct-norm; default: its default)")
    p.add_argument("--parallel", type=int, default=2, help="1-rank runs at a time")
    p.add_argument("--workdir", default=None)
    return add_results_dir(p).parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="folds-study-")
    files = {k: launch.lits_sample(os.path.join(workdir, f"lits117-{a.ndim}d-{a.ct_norm}-fold{k}.h5"),
                                   a.ndim, (a.folds, k), a.ct_norm) for k in range(a.folds)}
    started = launch.invocation()
    rows = run_all(a, files, workdir)
    print("\n" + table(rows))
    args = {**vars(a), "recipes": [[n, f] for n, f in a.recipes]}
    path = launch.write_result({"study": "folds", **started, "commit": machine.revision(REPO, short=True),
                                "args": args, "runs": rows}, a.results_dir, "folds")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
