"""What on-the-fly augmentation (``data.augment``) buys in validation Dice: real
``distseg-train`` runs of ``default`` against ``none``, the same samples each, one rank,
three seeds by default. Each subcommand prints a table (final validation liver Dice per
seed, the difference and its median) and writes
``bench/results/augment-study-<name>-<date>-<time>.json``.

* ``phantom``: the demo model on a phantom file made as ``distseg-data synth`` makes
  one (training cases of ``--data-seed``), validated on phantoms of other seeds shifted
  as another scanner and patient would be: contrast x0.7 about soft tissue (40 HU),
  +50 HU, rotated up to +-15 degrees and scaled 0.85-1.15 in-plane (``--contrast``,
  ``--offset``, ``--rotation``, ``--scale`` 1 1 give the unshifted control);
* ``lits``: the demo preset on LiTS case 117 (``distseg-data lits-sample``), 16 epochs;
* ``lits3d``: the liver3d preset on LiTS 117 as volumes (``lits-sample --ndim 3``), 30
  epochs.

    python benchmarks/study_augment.py phantom
    python benchmarks/study_augment.py lits --data data/liver117.h5
    python benchmarks/study_augment.py lits3d
    python benchmarks/study_augment.py phantom --seeds 0 --epochs 1 --steps 2 --cases 3   # a smoke check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np
from scipy import ndimage

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from distseg.data import h5format, synth  # noqa: E402
from distseg.data import slices as data  # noqa: E402

from benchlib import launch, runlogs  # noqa: E402
from benchlib.args import add_results_dir  # noqa: E402

KINDS = ("none", "default")
#: The soft-tissue level the phantom's contrast is scaled about (HU).
SOFT_TISSUE_HU = 40.0
#: Where the phantom's shifted validation cases take their seeds from.
SHIFTED_SEED_BASE = 1000


# --- the phantom with a shifted validation set --------------------------------------


def shift_case(hu: np.ndarray, labels: np.ndarray, rng: np.random.Generator, a) -> tuple:
    """One phantom volume (D, H, W) as another scanner and patient would show it:
    contrast ``a.contrast`` about soft tissue, ``a.offset`` HU added, then one in-plane
    rotation (up to ``a.rotation`` degrees) and scaling (``a.scale``) for all its slices
    (outside: air and background)."""
    hu = (hu - SOFT_TISSUE_HU) * a.contrast + SOFT_TISSUE_HU + a.offset
    angle = np.radians(rng.uniform(-a.rotation, a.rotation))
    s = rng.uniform(*a.scale)
    c, si = np.cos(angle), np.sin(angle)
    matrix = np.array([[1.0, 0.0, 0.0], [0.0, c * s, -si * s], [0.0, si * s, c * s]])
    centre = (np.array(hu.shape) - 1) / 2
    offset = centre - matrix @ centre
    hu = ndimage.affine_transform(hu, matrix, offset, order=1, mode="constant", cval=-1000.0)
    labels = ndimage.affine_transform(labels, matrix, offset, order=0, mode="constant", cval=0)
    return hu.astype(np.float32), labels


def phantom_file(path: str, a) -> str:
    """``a.cases`` training phantoms of ``a.data_seed`` (as ``distseg-data synth``
    draws them) and ``a.val_cases`` shifted phantoms of other seeds, as slices."""
    images, masks, case_ids, splits = [], [], [], []

    def add(hu, labels, case, split):
        images.append(h5format.window(hu))
        masks.append(labels)
        case_ids.append(np.full(len(hu), case, np.int32))
        splits.append(np.full(len(hu), h5format.SPLITS[split], np.uint8))

    rng = np.random.default_rng(a.data_seed)
    for case in range(a.cases):
        add(*synth.phantom_case(rng, a.size, a.slices), case, "train")
    for k in range(a.val_cases):
        rng = np.random.default_rng(SHIFTED_SEED_BASE + k)
        hu, labels = synth.phantom_case(rng, a.size, a.slices)
        add(*shift_case(hu, labels, rng, a), a.cases + k, "val")
    mm = synth.FIELD_OF_VIEW_MM / a.size
    data.write_dataset(path, np.concatenate(images)[..., None], np.concatenate(masks),
                       np.concatenate(case_ids), np.concatenate(splits),
                       source=f"study_augment phantom (train seed {a.data_seed}, {a.val_cases} shifted "
                              f"val cases: contrast x{a.contrast}, {a.offset:+g} HU, rotation "
                              f"+-{a.rotation} deg, scale {a.scale[0]}-{a.scale[1]})",
                       hu_window=h5format.HU_WINDOW, spacing=(synth.SLICE_MM, mm, mm))
    return path


# --- runs ----------------------------------------------------------------------------


def train(args: list[str], workdir: str, name: str, kind: str, threads: int) -> str:
    """One rank of distseg-train with ``data.augment`` ``kind``; its run directory."""
    run_dir = os.path.join(workdir, name)
    cmd = launch.train_command([*args, "--config", launch.augment_config(kind, workdir),
                                "--no-tensorboard"], run_dir, threads=threads)
    launch.run_train(cmd, name, timeout=6 * 3600)
    return run_dir


def final_dice(run_dir: str) -> dict:
    """The last epoch's validation Dice per class, its samples and the run's samples."""
    epochs = [r for r in runlogs.rank_records(run_dir, 1)[0] if r["type"] == "epoch"]
    return {"val_dice": epochs[-1]["val_dice"], "liver": epochs[-1]["val_dice"].get("liver"),
            "epochs": len(epochs), "train_samples": sum(e["samples"] for e in epochs),
            "liver_by_epoch": [e["val_dice"].get("liver") for e in epochs]}


def compare(name: str, args: list[str], a, workdir: str) -> dict:
    """``default`` against ``none`` for each seed (the kinds alternate first per seed)."""
    rows, args = [], [*args, *a.train_arg]
    for i, seed in enumerate(a.seeds):
        kinds = tuple(a.kinds)
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            run = train([*args, "--seed", str(seed)], workdir, f"{name}-s{seed}-{kind}", kind, a.threads)
            row = {"seed": seed, "augment": kind, **final_dice(run)}
            print(json.dumps({k: row[k] for k in ("seed", "augment", "liver", "train_samples")}), flush=True)
            rows.append(row)
    by = {(r["seed"], r["augment"]): r for r in rows}
    diffs = [by[(s, a.kinds[1])]["liver"] - by[(s, a.kinds[0])]["liver"] for s in a.seeds]
    return {"study": name, "args": args, "runs": rows, "kinds": list(a.kinds),
            f"liver_{a.kinds[1]}_minus_{a.kinds[0]}": diffs,
            "median_difference": statistics.median(diffs)}


def print_table(result: dict) -> None:
    by = {(r["seed"], r["augment"]): r for r in result["runs"]}
    seeds = sorted({r["seed"] for r in result["runs"]})
    base, kind = result["kinds"]
    diffs = result[f"liver_{kind}_minus_{base}"]
    print(f"\n{result['study']}: final validation liver Dice")
    print(f"{'seed':>5} {base:>8} {kind:>8} {kind + '-' + base:>13}")
    for s, d in zip(seeds, diffs):
        print(f"{s:5d} {by[(s, base)]['liver']:8.4f} {by[(s, kind)]['liver']:8.4f} {d:+13.4f}")
    print(f"median difference: {result['median_difference']:+.4f}")


# --- subcommands ---------------------------------------------------------------------


def study_phantom(a, workdir: str) -> dict:
    path = phantom_file(os.path.join(workdir, "phantom-shifted.h5"), a)
    args = ["--preset", "demo", "--data", path, "--image-size", str(a.size), "--epochs", str(a.epochs),
            "--precision", a.precision]
    if a.steps:
        args += ["--max-steps-per-epoch", str(a.steps)]
    out = compare("phantom", args, a, workdir)
    out["shift"] = {"contrast": a.contrast, "offset_hu": a.offset, "rotation_deg": a.rotation,
                    "scale": list(a.scale), "cases": a.cases, "val_cases": a.val_cases,
                    "size": a.size, "slices": a.slices, "data_seed": a.data_seed}
    return out


def lits_data(a, workdir: str, ndim: int) -> str:
    """``--data``, else ``make demo``'s data/liver117.h5 (2D), else a new lits-sample."""
    bundled = os.path.join(REPO, "data", "liver117.h5")
    if a.data or (ndim == 2 and os.path.exists(bundled)):
        return a.data or bundled
    return launch.lits_sample(os.path.join(workdir, f"liver117-{ndim}d.h5"), ndim)


def study_lits(a, workdir: str, preset: str, ndim: int) -> dict:
    args = ["--preset", preset, "--data", lits_data(a, workdir, ndim), "--epochs", str(a.epochs),
            "--precision", a.precision]
    if a.steps:
        args += ["--max-steps-per-epoch", str(a.steps)]
    return compare("lits" if ndim == 2 else "lits3d", args, a, workdir)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="study", required=True)
    epochs = {"phantom": 8, "lits": 16, "lits3d": 30}
    for name in epochs:
        s = sub.add_parser(name)
        s.add_argument("--seeds", default="0,1,2", type=lambda v: [int(x) for x in v.split(",")])
        s.add_argument("--epochs", type=int, default=epochs[name])
        s.add_argument("--train-arg", action="append", default=[],
                       help="a distseg-train argument added to every run (repeat it: "
                            "--train-arg=--norm --train-arg=group)")
        s.add_argument("--kinds", default=",".join(KINDS), type=lambda v: v.split(","),
                       help="the baseline and the augmentation compared with it")
        s.add_argument("--steps", type=int, default=0, help="cap steps per epoch (0: whole epochs)")
        s.add_argument("--threads", type=int, default=1, help="intra-op threads of the one rank")
        s.add_argument("--precision", default="float32", choices=("float32", "bfloat16"))
        add_results_dir(s)
        if name == "phantom":
            s.add_argument("--cases", type=int, default=16, help="training phantoms")
            s.add_argument("--val-cases", type=int, default=4, help="shifted validation phantoms")
            s.add_argument("--size", type=int, default=128)
            s.add_argument("--slices", type=int, default=16, help="slices per phantom")
            s.add_argument("--data-seed", type=int, default=0)
            s.add_argument("--contrast", type=float, default=0.7)
            s.add_argument("--offset", type=float, default=50.0, help="HU, before windowing")
            s.add_argument("--rotation", type=float, default=15.0, help="degrees, at most")
            s.add_argument("--scale", type=float, nargs=2, default=(0.85, 1.15))
        else:
            s.add_argument("--data", default="", help="the lits-sample file (default: data/liver117.h5 "
                           "for lits where it exists, else made here)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix=f"study-augment-{a.study}-") as workdir:
        if a.study == "phantom":
            result = study_phantom(a, workdir)
        else:
            result = study_lits(a, workdir, "demo" if a.study == "lits" else "liver3d",
                                2 if a.study == "lits" else 3)
    result.update(**launch.invocation(), seeds=a.seeds, epochs=a.epochs, precision=a.precision)
    path = launch.write_result(result, a.results_dir, f"augment-study-{a.study}")
    print_table(result)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
