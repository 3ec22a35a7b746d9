"""What the large-batch study runs: the scales, the variants of the optimisation
settings, the benchmark data, and the ``--config`` of one run."""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass

from distseg.core import config as config_lib
from distseg.core import lr

from benchlib.launch import BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
"""The repository root."""

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
FOLD = 8
"""Sim ranks that emulate a global batch grown past ``BATCH`` (``emulated_as``)."""
PRECISION = "float32"
"""What every run computes in, real and emulated, unless its variant names one
(``resolved``). Not the demo preset's ``auto``: a timed trial decides that at each real
run's start, which the emulation has no counterpart of, and the emulation's per-step
losses are held bit for bit to ``distseg-train``'s
(tests/e2e/test_bench_stateff_parity.py). The runs cached before ``auto`` existed trained
in float32 too, and keep their cache keys (the precision is not in ``run_config``)."""
MULTIPLIERS = {f"x{math.sqrt(2 ** k):.2g}": math.sqrt(2 ** k) for k in range(5)}
"""The sweep's fixed lr multipliers past the base batch, name -> factor: x1, x1.4, x2,
x2.8, x4, each sqrt(2) apart, computed as ``lr.batch_factor("sqrt", B / 8)`` computes
sqrt's (so at B = 16, 32, 64 the sqrt rule's factor is bit for bit one of them)."""
PER_RANK_SPEED = os.path.join(ROOT, "bench", "results", "bench-2026-11-25-1527.json")
"""The ``make bench`` result whose 1-rank runs at per-rank batch 1, 2, 4 and 8
(``distseg-1+b1`` ... ``distseg-1``, demo U-Net) give the throughput the goodput policy
and the projected times use (docs/performance.md, "The results here")."""

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
    "gbatch-gn-goodput": ("as gbatch-gn, the per-rank batch chosen by the goodput policy "
                          "at each validation (train.batch_policy goodput)",
                          {"train": {"lr_scaling": "none", "grown_lr_scaling": "sqrt",
                                     "batch_policy": "goodput"},
                           "model": {"norm": "group"}, "global_batch": BATCH,
                           "warmup_passes": 0.0}),
    **{f"gbatch-gn-{name}": (f"as gbatch-gn, past 8 ranks the lr {name} (fixed, not "
                             "scaled: grown_lr_scaling none, train.lr x the multiplier)",
                             {"train": {"lr_scaling": "none", "grown_lr_scaling": "none"},
                              "model": {"norm": "group"}, "global_batch": BATCH,
                              "warmup_passes": 0.0, "lr_multiplier": m})
       for name, m in MULTIPLIERS.items()},
    "demo-now": ("the demo preset since the fixed-global-batch study: global batch 8, global loss, BatchNorm "
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
    # A fixed global batch (batchplan.batch_plan) where the variant keeps one; else
    # per-rank batches, as the study ran before the demo preset kept one.
    fixed = {"global_batch": over.get("global_batch", 0), "global_batch_grows": "global_batch" in over}
    train = {"epochs": epochs, "batch_size": batch, "seed": seed, "max_steps_per_epoch": steps,
             "warmup_epochs": over["warmup_passes"] * evals_per_pass, "intra_op_threads": 1,
             "inter_op_threads": 1, "checkpoint_every": 0,
             # The noise scale of every step, as the emulation measures it.
             "noise_every": 1, **fixed, **over.get("train", {})}
    if "lr_multiplier" in over:
        train["lr"] = config_lib.demo().train.lr * over["lr_multiplier"]
    model = {"bn_ghost_batch": 0, **SCALES[scale]["model"], **over.get("model", {})}
    return {"model": model, "train": train}


def same_run(variant: str, ranks: int) -> str:
    """The variant whose run is this one's: a sweep multiplier equal to the sqrt rule's
    factor at ``ranks`` (no warm-up in either) is ``gbatch-gn``'s run, not a second one."""
    m = VARIANTS[variant][1].get("lr_multiplier")
    if m is not None and ranks > BATCH and m == lr.batch_factor("sqrt", ranks / BATCH):
        return "gbatch-gn"
    return variant


@dataclass(frozen=True)
class Emulated:
    """How the emulation stands in for ``ranks`` ranks of a fixed global batch grown past
    ``BATCH`` (one slice per rank, or the goodput policy's per-rank batches): ``sim_ranks``
    ranks of ``ranks / sim_ranks`` times the per-rank batch. With GroupNorm and the
    global loss the averaged gradient of a global batch does not depend on how its
    samples are split over ranks, and ``sharding.global_batches`` cuts the same global
    batches at any number of ranks, so this is the same training up to float rounding,
    at a fraction of the cost (batched passes); only the noise scale's estimator counts
    ``sim_ranks`` gradients per step instead of ``ranks`` (still unbiased)."""

    ranks: int
    """The ranks emulated (what the results call the run's ranks)."""
    sim_ranks: int
    stop_at: float | None = None
    """End the run at the first validation whose Dice (``MEASURE``) reaches this."""
    hold: int = 1
    """... the ``hold``-th validation in a row that reaches it."""

    @property
    def fold(self) -> int:
        return self.ranks // self.sim_ranks

    def key(self) -> dict:
        key = asdict(self)
        if self.hold == 1:  # the runs cached before ``hold`` existed keep their keys
            del key["hold"]
        return key


def emulated_as(variant: str, ranks: int, stop_at: float | None) -> Emulated | None:
    """``Emulated`` for a sim run of ``variant`` past ``BATCH`` ranks (a grown global batch
    or the goodput policy), or for ``stop_at``; None: the plain emulation, N ranks."""
    over = VARIANTS[variant][1]
    grows = "global_batch" in over and ranks > over["global_batch"] and ranks % FOLD == 0
    if not grows and stop_at is None:
        return None
    return Emulated(ranks, FOLD if grows else ranks, stop_at)


def per_rank_speed(path: str = PER_RANK_SPEED) -> dict[int, float]:
    """Samples/s of one rank at per-rank batch 1, 2, 4, 8: the median over rounds of the
    ``make bench`` result ``path``."""
    import statistics
    with open(path) as f:
        runs = json.load(f)["training"]["runs"]
    names = {1: "distseg-1+b1", 2: "distseg-1+b2", 4: "distseg-1+b4", 8: "distseg-1"}
    return {b: statistics.median(r["samples_per_s"] for r in runs[name])
            for b, name in names.items()}


def resolved(cfg_over: dict, data_path: str, run_dir: str):
    """(the full ``distseg.core.config.Config`` that ``distseg-train --preset demo
    --config FILE`` would use, FILE): ``cfg_over`` written beside ``run_dir``, with
    ``model.precision`` ``PRECISION`` where it names none."""
    from distseg.data import feeds
    path = os.path.join(os.path.dirname(run_dir), os.path.basename(run_dir) + ".json")
    model = {"precision": PRECISION, **cfg_over.get("model", {})}
    with open(path, "w") as f:
        json.dump({**cfg_over, "model": model}, f)
    # the data file decides the class count, as distseg-train's start-up does
    cfg = config_lib.resolve("demo", path, {"data.path": data_path, "run_dir": run_dir})
    return feeds.with_classes(cfg), path
