"""What the large-batch study runs: the scales, the variants of the optimisation
settings, the benchmark data, and the ``--config`` of one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
"""The repository root."""
BIN = os.path.dirname(sys.executable)
"""This interpreter's console scripts (``distseg-train``, ``horovodrun``, ...)."""

SAMPLES_PER_EVAL = 512
"""Training samples between two validations, at every rank count."""
BATCH = 8
"""Samples per rank per step (the demo preset's)."""
TARGET = 0.85
"""Validation liver Dice to reach (see ``--target``)."""
MEASURE = "liver"
"""Which validation Dice the target applies to: a class name or ``foreground`` (the
mean of the data file's foreground classes)."""
DROP_LIMIT = 0.1
"""The goal: no fall of the validation Dice larger than this after the warm-up."""

PHANTOMS = {
    # name: (size, cases, slices per case, seed); 20% of the cases validate.
    "phantom64": (64, 160, 16, 14),
    "phantom128": (128, 160, 16, 14),
}
DATASETS = {"lits117": os.path.join(ROOT, "data", "liver117.h5")}

SCALES = {
    # The screening model: the demo U-Net made small enough for a shared 2-core machine.
    "small": {"data": "phantom64", "model": {"image_size": 64, "depth": 3, "base_filters": 8}},
    # The demo preset itself (128x128, depth 4, 16 filters).
    "demo": {"data": "phantom128", "model": {}},
    "lits": {"data": "lits117", "model": {}},
}

VARIANTS = {
    # name: (what it tests, train/model overrides; warmup in passes over the train set)
    "base": ("the old defaults: linear scaling, 1-pass warm-up, BatchNorm",
             {"train": {"lr_scaling": "linear"}, "warmup_passes": 1.0}),
    "sqrt": ("sqrt scaling, 1-pass warm-up, BatchNorm",
             {"train": {"lr_scaling": "sqrt"}, "warmup_passes": 1.0}),
    "warm2": ("linear scaling, 2-pass warm-up, BatchNorm",
              {"train": {"lr_scaling": "linear"}, "warmup_passes": 2.0}),
    "gn": ("linear scaling, 1-pass warm-up, GroupNorm",
           {"train": {"lr_scaling": "linear"}, "model": {"norm": "group"}, "warmup_passes": 1.0}),
    "sqrt-gn": ("sqrt scaling, 1-pass warm-up, GroupNorm",
                {"train": {"lr_scaling": "sqrt"}, "model": {"norm": "group"}, "warmup_passes": 1.0}),
    "sqrt-bnm.5": ("sqrt scaling, 1-pass warm-up, BatchNorm with momentum 0.5",
                   {"train": {"lr_scaling": "sqrt"}, "model": {"bn_momentum": 0.5},
                    "warmup_passes": 1.0}),
    "gbatch-gn": ("global batch kept at 8 (8/N per rank), no lr scaling, GroupNorm; past 8 "
                  "ranks one slice each and the lr x sqrt(N/8)",
                  {"train": {"lr_scaling": "none", "grown_lr_scaling": "sqrt"},
                   "model": {"norm": "group"}, "global_batch": BATCH, "warmup_passes": 0.0}),
    "gbatch-gn-gain": ("as gbatch-gn, but past 8 ranks the lr x sqrt(measured gain)",
                       {"train": {"lr_scaling": "none", "grown_lr_scaling": "gain"},
                        "model": {"norm": "group"}, "global_batch": BATCH,
                        "warmup_passes": 0.0}),
    "demo-now": ("the demo preset since issue 21: global batch 8, global loss, BatchNorm "
                 "ghost batches of 2", {"model": {"bn_ghost_batch": 2},
                                        "global_batch": BATCH, "warmup_passes": 1.0}),
}


# --- the benchmark data ---------------------------------------------------------------


def dataset_path(name: str) -> str:
    """The dataset file of ``name``, making (and caching) a phantom the first time."""
    if name in DATASETS:
        return DATASETS[name]
    size, cases, per_case, seed = PHANTOMS[name]
    path = os.path.join(ROOT, "data", "bench", f"phantom-{cases * per_case}x{size}.h5")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([f"{BIN}/distseg-data", "synth", "--out", path, "--cases", str(cases),
                        "--slices-per-case", str(per_case), "--size", str(size),
                        "--seed", str(seed)], check=True)
    return path


def train_samples(path: str) -> int:
    from distseg.data import slices as data
    return len(data.examine(path).train_indices)


# --- one run's config -------------------------------------------------------------------


def run_key(scale: str, variant: str, ranks: int, seed: int, epochs: int, backend: str) -> str:
    return f"{backend}-{scale}-{variant}-np{ranks}-s{seed}-e{epochs}"


def run_config(scale: str, variant: str, ranks: int, seed: int, epochs: int, n_train: int) -> dict:
    """The ``--config`` overrides of one run (demo preset underneath)."""
    over = VARIANTS[variant][1]
    batch = max(1, over["global_batch"] // ranks) if "global_batch" in over else BATCH
    steps = max(1, SAMPLES_PER_EVAL // (batch * ranks))
    evals_per_pass = n_train / (steps * batch * ranks)
    # A fixed global batch (config.batch_plan) where the variant keeps one; else
    # per-rank batches, as the study ran before the demo preset kept one.
    fixed = {"global_batch": over.get("global_batch", 0), "global_batch_grows": "global_batch" in over}
    train = {"epochs": epochs, "batch_size": batch, "seed": seed, "max_steps_per_epoch": steps,
             "warmup_epochs": over["warmup_passes"] * evals_per_pass, "intra_op_threads": 1,
             "inter_op_threads": 1, "checkpoint_every": 0, **fixed, **over.get("train", {})}
    model = {"bn_ghost_batch": 0, **SCALES[scale]["model"], **over.get("model", {})}
    return {"model": model, "train": train}


def resolved(cfg_over: dict, data_path: str, run_dir: str):
    """(the full ``distseg.core.config.Config`` that ``distseg-train --preset demo
    --config FILE`` would use, FILE): ``cfg_over`` written beside ``run_dir``."""
    from distseg.core import config as config_lib
    from distseg.data import feeds
    path = os.path.join(os.path.dirname(run_dir), os.path.basename(run_dir) + ".json")
    with open(path, "w") as f:
        json.dump(cfg_over, f)
    # the data file decides the class count, as distseg-train's start-up does
    cfg = config_lib.resolve("demo", path, {"data.path": data_path, "run_dir": run_dir})
    return feeds.with_classes(cfg), path
