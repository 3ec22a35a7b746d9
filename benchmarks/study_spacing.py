"""One spacing on phantoms: what one real case cannot show. Phantoms of the same bodies
are written at the voxel spacings and fields of view a training set has and at others
(thicker or thinner slices, a wider field of view, as LiTS' scans vary), a model is
trained on the first, and ``distseg-predict`` scores held-out bodies at the training
spacings and at the others. Once with ``convert --spacing`` (every case resampled to
one spacing, predict resampling back) and once without (each slice's field of view
stretched to ``--size``, as before). Prints a Markdown table (docs/studies/) and writes
``bench/results/spacing-<date>-<time>.json``.

    python benchmarks/study_spacing.py --epochs 12
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib import launch, machine  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402

#: (name, spacings Z,Y,X in mm, field of view Z,Y,X in mm, seed): the training set, the
#: held-out bodies at the training spacings, the same bodies at other spacings.
SETS = (("train", ("2,0.8,0.8", "3,0.7,0.7"), "80,300,300", 0),
        ("same", ("2,0.8,0.8", "3,0.7,0.7"), "80,300,300", 100),
        ("other", ("5,1.0,1.0", "1,0.9,0.9"), "80,450,450", 100))


def tool(*args: str) -> None:
    """Runs a distseg console script; raises with its stderr's end."""
    out = subprocess.run([os.path.join(launch.BIN, args[0]), *args[1:]], env=launch.command_env(),
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{out.stderr[-3000:]}")


def phantoms(workdir: str, cases: int) -> dict[str, str]:
    """The three folders of ``SETS`` (NIfTI pairs), by name."""
    folders = {}
    for name, spacings, extent, seed in SETS:
        folder = os.path.join(workdir, name)
        n = cases if name == "train" else max(2, cases // 2)
        tool("distseg-data", "synth", "--out", folder, "--cases", str(n), "--seed", str(seed),
             "--extent", extent, *[a for s in spacings for a in ("--spacing", s)])
        folders[name] = folder
    return folders


def mean_liver_dice(out_dir: str) -> tuple[float, list[float]]:
    """The mean row's liver Dice of predict's metrics.csv, and each case's."""
    with open(os.path.join(out_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    cases = [float(r["dice_liver"]) for r in rows if r["case"] != "mean"]
    return sum(cases) / len(cases), cases


def arm(a, name: str, convert_flags: list[str], folders: dict, workdir: str) -> dict:
    """Convert, train and predict one way; the liver Dice at each validation set."""
    data = os.path.join(workdir, f"{name}.h5")
    tool("distseg-data", "convert", folders["train"], data, "--no-progress", "--val-fraction",
         "0.25", *convert_flags)
    run_dir = os.path.join(workdir, f"run-{name}")
    launch.run_train(launch.train_command(["--preset", "demo", "--data", data, "--epochs",
                                           str(a.epochs), "--no-tensorboard"], run_dir,
                                          threads=a.threads), name)
    row = {"arm": name, "convert": convert_flags}
    for which in ("same", "other"):
        out = os.path.join(workdir, f"pred-{name}-{which}")
        tool("distseg-predict", "--checkpoint", run_dir, folders[which], "--subset", "all",
             "--out", out, "--no-progress")
        row[which], row[f"{which}_cases"] = mean_liver_dice(out)
    print(row, flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| convert | liver Dice, training spacings | liver Dice, other spacings and field of view | other - training |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{' '.join(r['convert'])}` | {r['same']:.3f} | {r['other']:.3f} | "
                     f"{r['other'] - r['same']:+.3f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--cases", type=int, default=8, help="training phantoms")
    p.add_argument("--spacing", default="2.5,2.4,2.4", help="convert --spacing of the resampled arm")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    return add_results_dir(p).parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="spacing-study-")
    folders = phantoms(workdir, a.cases)
    started = launch.invocation()
    rows = [arm(a, "resampled", ["--spacing", a.spacing, "--size", "128"], folders, workdir),
            arm(a, "stretched", ["--size", "128"], folders, workdir)]
    print("\n" + table(rows))
    path = launch.write_result({"study": "spacing", **started, "commit": machine.revision(REPO, short=True),
                                "args": vars(a), "sets": SETS, "runs": rows}, a.results_dir, "spacing")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
