"""Side-by-side scaling of 2 Horovod ranks under different settings, in one run.

Trains the same configuration (default: the demo, LiTS 117 at 128x128, U-Net with 16
base filters, batch 8 per rank, 1 intra-op thread per rank) as:

  1proc        one process: the baseline;
  indep        two independent single processes at once: the ceiling (no communication);
  hvd-default  2 Horovod ranks (MPI) with Horovod's own defaults and no pinning;
  mpi          2 Horovod ranks (MPI) with distseg's defaults;
  gloo         2 Horovod ranks (Gloo) with distseg's defaults;
  NAME+nopin   any of these without distseg's core pinning (DISTSEG_PIN=0);

and prints samples/s and the ratio to the baseline. Every run computes in one precision,
``--precision`` (float32 by default): ``auto``'s trial at each run's start could choose
differently at 1 and 2 ranks. The first epoch (tracing, warm-up) is excluded. The
machine is shared and noisy: compare ratios from the same run, and use ``--repeat`` to
interleave the variants several times.

    python benchmarks/bench_horovod.py --data data/liver117.h5 --epochs 4 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchlib import launch  # noqa: E402
from benchlib.args import add_precision  # noqa: E402
from benchlib.runlogs import run_throughput  # noqa: E402


def train_command(args, run_dir, ranks=1, options=()):
    flags = ["--preset", args.preset, "--data", args.data, "--epochs", str(args.epochs),
             "--batch-size", str(args.batch_size), "--no-validate", "--checkpoint-every", "0",
             "--precision", args.precision]
    return launch.train_command(flags, run_dir, ranks=ranks, threads=1,
                                 horovodrun_options=options)


def variant_plan(name: str, args, run_dir: str) -> tuple[list[list[str]], dict, list[str], int]:
    """What the variant ``name`` runs: (its commands, started together; the settings it
    adds to ``launch.command_env``; the run directories they write; ranks per run)."""
    env = {}
    if name.endswith("+nopin"):  # any variant without distseg's core pinning
        env["DISTSEG_PIN"] = "0"
        name = name[: -len("+nopin")]
    if name == "1proc":
        return [train_command(args, run_dir)], env, [run_dir], 1
    if name == "indep":
        dirs = [run_dir + "-a", run_dir + "-b"]
        return [train_command(args, d) for d in dirs], env, dirs, 1
    if name == "hvd-default":
        env.update(DISTSEG_HOROVOD_DEFAULTS="0", DISTSEG_PIN="0")
        return [train_command(args, run_dir, ranks=2)], env, [run_dir], 2
    if name in ("mpi", "gloo"):
        return [train_command(args, run_dir, ranks=2, options=[f"--{name}"])], env, [run_dir], 2
    raise ValueError(f"--variants: {name!r} is not one of {', '.join(VARIANTS)} (optionally +nopin)")


#: The variants, in their default order.
VARIANTS = ("1proc", "indep", "hvd-default", "mpi", "gloo")


def run_variant(name, args, workdir):
    """Runs the variant ``name``; its global samples/s (two independent processes: the
    sum of theirs)."""
    run_dir = tempfile.mkdtemp(dir=workdir, prefix=f"{name}-")
    os.rmdir(run_dir)
    procs, extra, dirs, ranks = variant_plan(name, args, run_dir)
    env = launch.command_env(**extra)
    running = [subprocess.Popen(p, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for p in procs]
    for p in running:
        out, _ = p.communicate(timeout=1200)
        if p.returncode:
            raise SystemExit(f"{name} failed:\n{out[-3000:]}")
    return sum(run_throughput(d, ranks) for d in dirs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/liver117.h5")
    p.add_argument("--preset", default="demo")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = add_precision(p).parse_args(argv)
    names = args.variants.split(",")
    for name in names:
        if name.removesuffix("+nopin") not in VARIANTS:
            p.error(f"--variants: {name!r} is not one of {', '.join(VARIANTS)} (optionally +nopin)")
    results: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="bench-hvd-") as workdir:
        for i in range(args.repeat):
            for name in names:
                results[name].append(run_variant(name, args, workdir))
                print(f"round {i + 1} {name:12s} {results[name][-1]:8.2f} samples/s", flush=True)
    base = statistics.median(results["1proc"]) if "1proc" in results else None
    print(f"\n{'variant':12s} {'samples/s':>10s} {'x 1proc':>8s}   (median of {args.repeat})")
    for name, vals in results.items():
        med = statistics.median(vals)
        ratio = f"{med / base:8.2f}" if base else ""
        print(f"{name:12s} {med:10.2f} {ratio}")


if __name__ == "__main__":
    main()
