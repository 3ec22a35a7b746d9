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
  sim   an exact in-process emulation of N data-parallel ranks
        (``benchlib.stateff.emulation``): each rank's batch from the loop's
        ``Schedule``, its own forward/backward pass and its own BatchNorm moving
        statistics, gradients averaged, Adam applied, BatchNorm statistics averaged
        over ranks at each epoch end, the learning rate from
        ``distseg.training.step.steps``. It measures samples, not time, at a fraction of
        the cost of 8 oversubscribed processes; ``--check-sim`` compares it with a
        real run, and ``tests/e2e/test_bench_stateff_parity.py`` holds its per-step
        losses to ``distseg-train``'s at 1 and 2 ranks.

The benchmark phantom (2,560 slices from 160 cases, 2,048 for training) is made once
and cached under ``data/bench/``; every finished run is cached as JSON under
``data/bench/stateff-runs/``, so the study can be run in parts and the table rebuilt
with ``--report``. Results go to ``bench/results/stateff-<date>.json`` (``--results-dir``
and ``--out`` say where else). This file is the command line; the study's pieces are in
``benchmarks/benchlib/stateff/``.

    python benchmarks/bench_stateff.py --backend sim --variants base,sqrt --ranks 1,8 --seeds 0,1
    python benchmarks/bench_stateff.py --backend hvd --variants sqrt-gn --ranks 1,2 --seeds 0,1
    python benchmarks/bench_stateff.py --report

The large-batch study (docs/statistical-efficiency.md): global batches past 8 under the sqrt and gain
rules and fixed lr multipliers (``gbatch-gn-x1`` ... ``-x4``), emulated as 8 ranks of
B/8 slices, runs that end at the target (``--stop-at-target``), the goodput policy at
32 ranks (``gbatch-gn-goodput``); their rows come from ``benchlib.stateff.largebatch``:

    python benchmarks/bench_stateff.py --backend sim --stop-at-target \
        --variants gbatch-gn,gbatch-gn-gain,gbatch-gn-x2 --ranks 16,32,64 --seeds 0
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from distseg.core.config import LIVER_CLASSES  # noqa: E402

from benchlib.args import add_results_dir  # noqa: E402
from benchlib.stateff import emulation, goals, largebatch, results, runs, summary  # noqa: E402
from benchlib.stateff.study import MEASURE, SAMPLES_PER_EVAL, SCALES, TARGET, VARIANTS  # noqa: E402


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
    ap.add_argument("--grown-epochs", type=int, default=24,
                    help="validations per sim run past 8 ranks (a grown global batch needs "
                         "more samples)")
    ap.add_argument("--stop-at-target", action="store_true",
                    help="end each new sim run at the validation that reaches --target")
    ap.add_argument("--hvd-epochs", type=int, default=10, help="validations per hvd run")
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--measure", default=MEASURE,
                    help=f"{', '.join(LIVER_CLASSES[1:])} or foreground")
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
    ap.add_argument("--out", default=None,
                    help="the results file (default: stateff-<date>.json in --results-dir)")
    args = add_results_dir(ap).parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not set(args.backend) <= {"sim", "hvd"} or not set(args.scale) <= set(SCALES):
        ap.error(f"unknown variant(s) {unknown} (known: {', '.join(VARIANTS)}), back-end "
                 "or scale")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "sim" in args.backend or args.check_sim:
        emulation.set_threads(1)
    if args.check_sim:
        runs.check_sim(args)
        return 0
    if not args.report:
        runs.run_grid(args)
    done = runs.collect(args)
    rows = summary.table(done)
    print(summary.markdown_table(rows) if args.markdown else "", end="\n" if args.markdown else "")
    summary.print_table(rows)
    rows_of_goals = goals.goal_rows(rows, done, args.recommended, args.scale[0], args.grown,
                                    tuple(args.timed.split("@")) if args.timed else None)
    batch_rows, large = largebatch.rows(done, args.seeds, runs.step_seconds())
    largebatch.print_sweep(large["sweep"])
    if args.markdown:
        print(largebatch.markdown(large))
    rows_of_goals += batch_rows
    out = results.write_results(args, done, rows, rows_of_goals, large)
    for g in rows_of_goals:
        print(f"goal: {g['measure']}: {g['goal']}, measured {g['measured']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
