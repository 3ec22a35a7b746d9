"""bf16 against fp32: train-step time of the same U-Net in different precisions.

Builds one model per mode in one process, with the config's optimizer as the run
builds it, and compiles the same bare train step for each (forward, backward, the
optimizer's update: ``benchlib.step_variants.make_bare_train_step``), then times them
round-robin on the same batches. Modes:

* ``float32``: distseg's model as ``make demo`` trains it;
* ``bfloat16``: distseg's ``model.precision = "bfloat16"`` (Keras ``mixed_bfloat16``
  on every layer, BatchNorm through the fused kernel, float32 softmax);
* ``keras_mixed``: the float32 model built under Keras' global ``mixed_bfloat16``
  policy, Keras' own (unfused) BatchNorm: what a Keras user gets by setting the policy;
* ``MODE:VARIANT``: any of these built as a model variant of ``benchlib.model_variants``
  (``kerasbn``, ``kerasgn``: with Keras' own normalisation layer).

Convolutions then run in bf16 with fp32 weights; on CPUs with AVX512_BF16 or AMX
oneDNN has bf16 kernels for them.

``--grappler-bf16`` instead turns on TensorFlow's graph rewrite
``auto_mixed_precision_onednn_bfloat16`` for the whole process, so every mode's graph
is rewritten to bf16 where oneDNN supports it; run it as a separate process and
compare its float32 time with a plain run's.

``--dice-epochs N`` also trains each mode's model for N epochs of the demo schedule
(``--dice-seeds``: once per seed) and reports its validation liver Dice (the mean over
seeds), to check that bf16 learns as well.

    python -m benchlib.precision --data data/liver117.h5 --rounds 6
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

from benchlib.args import add_config, set_threads, workload_parser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Mode name -> (distseg ``model.precision``, Keras global policy while building).
MODES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None),
         "keras_mixed": ("float32", "mixed_bfloat16")}


def build_mode(cfg, mode: str):
    """(model, optimizer) of the config's U-Net in ``mode`` (``NAME`` or
    ``NAME:VARIANT``), built as the run builds them (``model_variants.model_and_optimizer``:
    the config's optimizer, weight decay and clipping)."""
    import keras

    from benchlib import model_variants
    name, _, variant = mode.partition(":")
    precision, policy = MODES[name]
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=precision))
    keras.mixed_precision.set_global_policy(policy or "float32")
    try:
        return model_variants.model_and_optimizer(cfg, (cfg.model.image_size,) * 2, cfg.train.seed,
                                                  variant=variant or "keras")
    finally:
        keras.mixed_precision.set_global_policy("float32")


def build_mode_step(cfg, mode: str):
    """(model, step) of the config's U-Net in ``mode`` (``build_mode``) with the bare
    train step (forward, backward, the optimizer's update)."""
    from benchlib.step_variants import make_bare_train_step
    model, optimizer = build_mode(cfg, mode)
    shape = (cfg.model.image_size,) * 2
    return model, make_bare_train_step(model, optimizer, shape, cfg.model.num_classes,
                                       cfg.train.loss)


def time_steps(step, batches, n: int, start: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step over ``n`` steps."""
    import numpy as np
    flags = np.zeros(2, np.float32)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        images, masks = batches[(start + i) % len(batches)]
        float(step(images, masks, flags).loss_local)
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


def val_liver_dice(model, cfg, reader, info) -> float:
    """Hard liver Dice of ``model`` on the validation split."""
    import numpy as np

    from distseg import metrics
    from distseg.data import sharding
    counts = 0
    for ids in sharding.shard_eval(info.val_indices, 0, 1, cfg.train.batch_size):
        images, masks = reader.read(ids)
        probs = model(images, training=False)
        counts = counts + metrics.dice_counts(probs, masks, cfg.model.num_classes).numpy()
    return metrics.dice_from_counts(np.asarray(counts))[1]


def seeded(cfg, seed: int):
    """``cfg`` with the global seed (initial weights, data order) set to ``seed``."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))


def train_for_dice(cfg, mode: str, reader, info, epochs: int) -> float:
    """Trains a fresh model in ``mode`` for ``epochs`` (one rank, the preset's batch
    and learning rate, shards as distseg's); returns validation liver Dice."""
    from distseg.data import sharding
    model, step = build_mode_step(cfg, mode)
    for epoch in range(epochs):
        for ids in sharding.shard_batches(info.train_indices, 0, 1, cfg.train.batch_size,
                                      epoch, cfg.train.seed):
            time_steps(step, [reader.read(ids)], 1, 0)
    return val_liver_dice(model, cfg, reader, info)


def run(args) -> dict:
    """Times every mode (``POLICY`` or ``POLICY:MODEL_VARIANT``) round-robin; with
    ``--dice-epochs``, also trains each and scores it."""
    import tensorflow as tf
    set_threads(args.threads)
    if args.grappler_bf16:
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    from distseg.core import config as config_lib
    from distseg.data import feeds, sharding
    from distseg.data import slices as data
    overrides = {"data.path": args.data, "run_dir": "-", **({"model.norm": args.norm} if args.norm else {})}
    cfg = config_lib.resolve(args.preset, args.config, overrides=overrides)
    cfg = feeds.with_classes(cfg)  # the data file decides the class count
    info = data.examine(args.data)
    modes = args.modes.split(",")
    for m in modes:
        if m.partition(":")[0] not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {', '.join(MODES)} (optionally :kerasbn or :kerasgn)")
    with data.SliceReader(args.data, cfg.model.image_size) as reader:
        batches = [reader.read(ids) for ids in sharding.shard_batches(
            info.train_indices, 0, 1, cfg.train.batch_size, 0, cfg.train.seed)]
        steps = {m: build_mode_step(cfg, m)[1] for m in modes}
        for step in steps.values():
            time_steps(step, batches, 2, 0)  # trace and warm up
        wall = {m: [] for m in modes}
        cpu = {m: [] for m in modes}
        for r in range(args.rounds):
            for m, step in steps.items():
                w, c = time_steps(step, batches, args.steps, r * args.steps)
                wall[m].append(w)
                cpu[m].append(c)
        dice_modes = args.dice_modes.split(",") if args.dice_modes else modes
        seeds = [int(x) for x in args.dice_seeds.split(",")]
        per_seed = ({m: [train_for_dice(seeded(cfg, seed), m, reader, info, args.dice_epochs)
                         for seed in seeds] for m in dice_modes} if args.dice_epochs else {})
    return {"modes": modes, "norm": cfg.model.norm, "grappler_bf16": args.grappler_bf16, "threads": args.threads,
            "step_seconds": {m: statistics.median(s) for m, s in wall.items()},
            "step_cpu_seconds": {m: statistics.median(s) for m, s in cpu.items()},
            "val_liver_dice": {m: statistics.mean(d) for m, d in per_seed.items()},
            "val_liver_dice_per_seed": per_seed, "dice_seeds": seeds, "dice_epochs": args.dice_epochs}


def main(argv=None):
    p = workload_parser(__doc__, batch_size=False)
    p.add_argument("--modes", default="float32,bfloat16,keras_mixed",
                   help="comma-separated modes: float32, bfloat16, keras_mixed, each optionally :kerasbn or :kerasgn")
    p.add_argument("--norm", default="", help="the preset's model.norm replaced: batch, group, none")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=3, help="steps per mode per round")
    p.add_argument("--grappler-bf16", action="store_true")
    p.add_argument("--dice-epochs", type=int, default=0)
    p.add_argument("--dice-modes", default="", help="modes to train for Dice (default: all)")
    p.add_argument("--dice-seeds", default="0", help="seeds (init and data order) to train each with")
    print(json.dumps(run(add_config(p).parse_args(argv))), flush=True)


if __name__ == "__main__":
    main()
