"""``make bench-precision``: what ``--precision auto`` (distseg-train's default) buys and
costs on this machine, each ratio measured side by side in one run.

* the demo (``make demo``'s configuration: LiTS 117, 8 epochs, one thread per rank) at 1
  and 2 ranks, ``auto`` against ``--precision float32`` and ``--precision bfloat16``,
  interleaved over ``--rounds``: samples/s (epochs after the first), the whole training
  time, the final validation liver Dice, and the trial's cost (its seconds plus the
  first step, less the first step of a run told the chosen precision; a share of the
  ``auto`` run's training time);
* the same global batch of 8 split 1 x 8 and 2 x 4 (GroupNorm, 12 steps) under ``auto``:
  the largest relative difference of the step losses, and each run's choice;
* ``liver2d`` (240 x 240, 31 M parameters, 8 slices, one thread): the median step,
  ``auto`` against ``float32``;
* ``liver3d`` on LiTS 117 as volumes (``--epochs3d``): samples/s and final validation
  liver Dice, ``auto`` against ``float32``.

Results, with the CPU's bfloat16 flags, go to ``bench/results/precision-<date>-<time>.json``.

    python benchmarks/bench_precision_auto.py --data data/liver117.h5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from distseg.training.startup import precision  # noqa: E402

from benchlib import launch, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402


def train(args: list[str], ranks: int, workdir: str, name: str) -> str:
    """Runs distseg-train (under horovodrun on 2+ ranks); returns its run directory."""
    run_dir = os.path.join(workdir, name)
    # Every launch measures: a decision kept from an earlier launch would time nothing.
    launch.run_train(launch.train_command([*args, "--precision-trial", "always"], run_dir,
                                          ranks=ranks, threads=1), name)
    return run_dir


def summary(run_dir: str, ranks: int) -> dict:
    """samples/s after the first epoch, training time, final liver Dice, the decision."""
    records = runlogs.rank_records(run_dir, ranks)
    first = records[0]
    epochs = [r for r in first if r["type"] == "epoch"]
    steps = [r for r in first if r["type"] == "step"]
    train_time = sum(max(r["train_time"] for recs in records for r in recs
                         if r["type"] == "epoch" and r["epoch"] == e["epoch"]) for e in epochs)
    return {"samples_per_s": runlogs.throughput(records), "train_time_s": train_time,
            "final_liver_dice": epochs[-1]["val_dice"].get("liver"),
            "first_step_s": steps[0]["step_time"], "precision": first[0]["precision"],
            "median_step_s": statistics.median(s["step_time"] for s in steps[1:]) if len(steps) > 1
            else None, "losses": [s["loss"] for s in steps]}


def demo_rounds(a, workdir: str) -> list[dict]:
    rows = []
    for rnd in range(a.rounds):
        for ranks in (1, 2):
            for variant in ("auto", "float32", "bfloat16"):
                name = f"demo-r{rnd}-np{ranks}-{variant}"
                run = train(["--preset", "demo", "--data", a.data, "--epochs", str(a.epochs),
                             "--precision", variant], ranks, workdir, name)
                row = {"round": rnd, "ranks": ranks, "variant": variant, **summary(run, ranks)}
                row.pop("losses")
                print(json.dumps({k: row[k] for k in ("round", "ranks", "variant", "samples_per_s",
                                                      "final_liver_dice")}), flush=True)
                rows.append(row)
    return rows


def demo_table(rows: list[dict]) -> dict:
    """Per rank count: medians over the rounds and the ratios auto / float32, and the
    trial's cost against the run told the precision auto chose."""
    out = {}
    for ranks in (1, 2):
        pick = {v: [r for r in rows if r["ranks"] == ranks and r["variant"] == v]
                for v in ("auto", "float32", "bfloat16")}
        med = {v: {k: statistics.median(r[k] for r in rs) for k in
                   ("samples_per_s", "train_time_s", "final_liver_dice", "first_step_s")}
               for v, rs in pick.items()}
        choice = pick["auto"][0]["precision"]["choice"]
        trial = statistics.median(r["precision"]["trial_s"] for r in pick["auto"])
        cost = trial + med["auto"]["first_step_s"] - med[choice]["first_step_s"]
        out[ranks] = {"medians": med, "choice": choice, "trial_s": trial, "trial_cost_s": cost,
                      "trial_cost_share": cost / med["auto"]["train_time_s"],
                      "samples_ratio_auto_vs_float32": med["auto"]["samples_per_s"]
                      / med["float32"]["samples_per_s"],
                      "dice_auto_minus_float32": med["auto"]["final_liver_dice"]
                      - med["float32"]["final_liver_dice"]}
    return out


def split_exactness(a, workdir: str) -> dict:
    """1 x 8 against 2 x 4 under auto, GroupNorm, 12 steps: the largest relative
    difference of the step losses."""
    args = ["--preset", "demo", "--data", a.data, "--norm", "group", "--epochs", "1",
            "--max-steps-per-epoch", "12", "--no-validate"]
    one = summary(train(args, 1, workdir, "split-1x8"), 1)
    two = summary(train(args, 2, workdir, "split-2x4"), 2)
    rel = max(abs(x - y) / abs(x) for x, y in zip(one["losses"], two["losses"]))
    return {"max_rel_diff": rel, "choice_1x8": one["precision"]["choice"],
            "choice_2x4": two["precision"]["choice"], "steps": len(one["losses"])}


def liver2d_steps(a, workdir: str) -> dict:
    """The median step of ``--preset2d`` (liver2d) under ``auto`` and ``float32``."""
    out = {}
    for variant in ("auto", "float32"):
        args = ["--preset", a.preset2d, "--data", a.data, "--resize", "--epochs", "1",
                "--max-steps-per-epoch", str(a.liver2d_steps), "--no-validate",
                "--precision", variant]
        s = summary(train(args, 1, workdir, f"liver2d-{variant}"), 1)
        out[variant] = {"median_step_s": s["median_step_s"], "precision": s["precision"]}
    out["step_ratio_float32_vs_auto"] = out["float32"]["median_step_s"] / out["auto"]["median_step_s"]
    return out


def liver3d_runs(a, workdir: str) -> dict:
    volumes = launch.lits_sample(os.path.join(workdir, "liver117-3d.h5"), 3)
    out = {}
    for variant in ("auto", "float32"):
        args = ["--preset", "liver3d", "--data", volumes, "--epochs", str(a.epochs3d),
                "--precision", variant]
        s = summary(train(args, 1, workdir, f"liver3d-{variant}"), 1)
        s.pop("losses")
        out[variant] = s
    out["samples_ratio_auto_vs_float32"] = (out["auto"]["samples_per_s"]
                                            / out["float32"]["samples_per_s"])
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(REPO, "data", "liver117.h5"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8, help="demo epochs (make demo's 8)")
    p.add_argument("--liver2d-steps", type=int, default=5)
    p.add_argument("--preset2d", default="liver2d",
                   help="the preset of the liver2d step comparison (a smaller one for a quick check)")
    p.add_argument("--epochs3d", type=int, default=30)
    p.add_argument("--skip", default="", help="leave out: demo, split, liver2d, liver3d")
    a = add_results_dir(p).parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    result = {**launch.invocation(), "bf16_flags": precision.read_bf16_flags()}
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as workdir:
        if "demo" not in skip:
            result["demo_runs"] = demo_rounds(a, workdir)
            result["demo"] = demo_table(result["demo_runs"])
        if "split" not in skip:
            result["split"] = split_exactness(a, workdir)
        if "liver2d" not in skip:
            result["liver2d"] = liver2d_steps(a, workdir)
        if "liver3d" not in skip:
            result["liver3d"] = liver3d_runs(a, workdir)
    path = launch.write_result(result, a.results_dir, "precision")
    print(json.dumps({k: v for k, v in result.items() if k != "demo_runs"}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
