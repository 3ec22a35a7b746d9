"""One rank's gradient noise scale against two ranks' on the same training: real
``distseg-train`` runs of a preset (``demo`` by default, whose ghost batches make 1 and 2
ranks train the same model) at each seed, three ways:

  ``halves``       one rank, the noise scale from the two halves of each batch (distseg's
                   one-rank estimator since 2026-11-26, ``steps.can_halve``);
  ``consecutive``  one rank, from this step's and the last step's gradients (before it;
                   the step variant of ``benchlib.step_variants``);
  ``ranks``        two ranks (the reference: each rank's own gradient and their mean).

Per epoch, the preconditioned B_simple each logged (moving averages up to the epoch's
end), and the ratio of each one-rank estimate to the two-rank one; the summary is the
median ratio over the epochs after the first (the first is dominated by the averages'
start). Prints a table and writes ``bench/results/noise-study-<date>-<time>.json``.
The one-rank runs go two at a time, each pinned to a core; a 2-rank run has the machine.

    python benchmarks/study_noise.py --data data/liver117.h5
    python benchmarks/study_noise.py --data data/liver117.h5 --seeds 0 --epochs 2   # smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib import launch, machine, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402

#: The one-rank estimators (the step variant each runs) and the reference.
ONE_RANK = {"halves": "distseg", "consecutive": "consecutive"}
REFERENCE = "ranks"


def command(a, arm: str, seed: int, core: int | None, workdir: str) -> tuple[list[str], str]:
    """(the command line, the run folder) of ``arm`` at ``seed``: the reference on 2
    ranks, a one-rank arm with its step variant pinned to ``core``."""
    run_dir = os.path.join(workdir, f"{arm}-s{seed}")
    flags = ["--preset", a.preset, "--data", a.data, "--epochs", str(a.epochs),
             "--seed", str(seed), "--no-tensorboard"]
    if arm == REFERENCE:
        return launch.train_command(flags, run_dir, ranks=2, threads=1), run_dir
    return launch.train_command(flags, run_dir, threads=1, core=core,
                                variant=["--step", ONE_RANK[arm]]), run_dir


def train(a, arm: str, seed: int, core: int | None, workdir: str) -> str:
    """One run of ``arm`` at ``seed``; its run folder."""
    cmd, run_dir = command(a, arm, seed, core, workdir)
    launch.run_train(cmd, run_dir, timeout=6 * 3600)
    return run_dir


def b_simple_by_epoch(run_dir: str) -> list[float | None]:
    """The preconditioned B_simple of each ``epoch`` record of rank 0."""
    records = runlogs.rank_records(run_dir, 1)[0]
    return [(r.get("noise_scale") or {}).get("b_simple") for r in records if r["type"] == "epoch"]


def methods(run_dir: str) -> list[str]:
    records = runlogs.rank_records(run_dir, 1)[0]
    return sorted({(r.get("noise_scale") or {}).get("method") for r in records
                   if r["type"] == "epoch"} - {None})


def seed_row(seed: int, dirs: dict) -> dict:
    """Per-epoch B_simple of each arm, and each one-rank arm's median ratio to the
    reference over the epochs after the first."""
    curves = {arm: b_simple_by_epoch(d) for arm, d in dirs.items()}
    ref = curves[REFERENCE]
    row = {"seed": seed, "b_simple": curves, "methods": {a: methods(d) for a, d in dirs.items()}}
    for arm in ONE_RANK:
        ratios = [x / r for x, r in zip(curves[arm][1:], ref[1:]) if x and r]
        row[f"{arm}_ratio"] = statistics.median(ratios) if ratios else None
    return row


def run_seed(a, seed: int, workdir: str) -> dict:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {arm: pool.submit(train, a, arm, seed, k, workdir)
                   for k, arm in enumerate(ONE_RANK)}
        dirs = {arm: f.result() for arm, f in futures.items()}
    dirs[REFERENCE] = train(a, REFERENCE, seed, None, workdir)
    return seed_row(seed, dirs)


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        print(f"\nseed {row['seed']}  methods {row['methods']}")
        print(f"{'epoch':>6}" + "".join(f"{arm:>13}" for arm in row["b_simple"]))
        for k, values in enumerate(zip(*row["b_simple"].values())):
            print(f"{k:>6}" + "".join(f"{v:>13.1f}" if v else f"{'-':>13}" for v in values))
        print("median ratio to 2 ranks (epochs after the first): "
              + ", ".join(f"{arm} {row[f'{arm}_ratio']:.2f}" for arm in ONE_RANK
                          if row[f"{arm}_ratio"] is not None))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="LiTS 117 as slices (distseg-data lits-sample)")
    p.add_argument("--preset", default="demo")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--epochs", type=int, default=8, help="the demo's 8 by default")
    p.add_argument("--workdir", default=None)
    return add_results_dir(p).parse_args(argv)


def median_ratio(rows: list[dict], arm: str) -> float | None:
    """The median of ``arm``'s ratios over the seeds that have one (a seed whose
    estimates never both existed after the first epoch has none); None if no seed has."""
    ratios = [r[f"{arm}_ratio"] for r in rows if r[f"{arm}_ratio"] is not None]
    return statistics.median(ratios) if ratios else None


def report(a, rows: list[dict]) -> str:
    """Prints the seeds' rows and the median ratio over them; writes the results file
    (``noise-study-<date>-<time>.json``) and returns its path."""
    print_rows(rows)
    commit = machine.revision(REPO, short=True)
    summary = {arm: median_ratio(rows, arm) for arm in ONE_RANK}
    print("\nmedian over seeds: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -"
                                             for k, v in summary.items()))
    path = launch.write_result({"study": "noise", "commit": commit, "args": vars(a),
                                "seeds": rows, "median_ratio": summary}, a.results_dir,
                                "noise-study")
    print(f"written: {path}")
    return path


def main(argv=None) -> None:
    a = parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="noise-study-")
    report(a, [run_seed(a, seed, workdir) for seed in a.seeds])


if __name__ == "__main__":
    main()
