"""In-process A/B of train-step variants: the same model, batches and threads.

Builds the demo U-Net once, compiles every variant of ``benchlib.step_variants`` (and
Keras' own ``train_on_batch`` as ``keras``) on it, then times them round-robin, a few
steps each per round, so the load of a shared machine hits all of them alike. Prints
wall and CPU milliseconds per step (median over rounds) and the ratio to distseg's
step; CPU time is the steadier figure on a busy machine (with one intra-op thread,
CPU time per step barely moves with other processes' load).

    python -m benchlib.step_ab --data data/liver117.h5 --rounds 8 --precision bfloat16
    horovodrun -np 2 -H localhost:2 python -m benchlib.step_ab --variants distseg,nocheck
"""

from __future__ import annotations

import json
import os
import statistics
import time

from benchlib.args import add_config, add_precision, set_threads, workload_parser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    p = workload_parser(__doc__)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    p.add_argument("--variants", default="distseg,nocheck,sumcheck,bare,keras")
    p.add_argument("--json", default=None, help="also write the results here (rank 0)")
    return add_config(add_precision(p)).parse_args(argv)


def keras_step(model, optimizer, num_classes: int, loss: str):
    """Keras' own compiled train step on ``model`` with ``optimizer``
    (``train_on_batch``), as a callable with the variants' arguments."""
    from peers.keras_fit import keras_loss
    model.compile(optimizer=optimizer, loss=keras_loss(num_classes, loss))

    def step(images, masks, flags):
        return model.train_on_batch(images, masks[..., None])
    return step


def build(args, ctx):
    """(batches, steps by name, flags) on this rank. A name is a step variant of
    ``benchlib.step_variants`` (or ``keras``), optionally ``+MODEL`` for a model variant
    of ``benchlib.model_variants``; each model variant is built once with its own
    optimizer, as the run builds them (``model_variants.model_and_optimizer``: the
    config's optimizer, weight decay and clipping), and its steps share it."""
    import numpy as np

    from distseg.core import config as config_lib
    from distseg.data import feeds, sharding
    from distseg.data import slices as data

    from benchlib import model_variants
    from benchlib.step_variants import MANY_RANKS_ONLY, ONE_RANK_ONLY, VARIANTS
    cfg = config_lib.resolve(args.preset, args.config,
                             overrides={"data.path": args.data, "run_dir": "-",
                                        "model.precision": args.precision})
    cfg = feeds.with_classes(cfg)  # the data file decides the class count
    info = data.examine(args.data)
    with data.SliceReader(args.data, cfg.model.image_size) as reader:
        batches = [reader.read(ids) for ids in sharding.shard_batches(
            info.train_indices, ctx.rank, ctx.size, args.batch_size, 0, 0)]
    shape = (cfg.model.image_size,) * 2
    only_here = MANY_RANKS_ONLY if ctx.size == 1 else ONE_RANK_ONLY + ("keras",)
    names = [n for n in args.variants.split(",") if n.split("+")[0] not in only_here]
    built, fns = {}, {}
    for name in names:
        step, _, variant = name.partition("+")
        if step == "keras":  # a model of its own: Keras' compile takes it over
            fns[name] = keras_step(*model_variants.model_and_optimizer(
                cfg, shape, 0, variant=variant or "keras"), cfg.model.num_classes, cfg.train.loss)
            continue
        if variant not in built:
            built[variant] = model_variants.model_and_optimizer(cfg, shape, 0,
                                                                variant=variant or "keras")
        # As the loop builds it: the ranks sharing the loss, traced for the fixed batch.
        fns[name] = VARIANTS[step](*built[variant], shape, cfg.model.num_classes, cfg.train.loss,
                                   ranks=ctx.size, batch=args.batch_size)
    return batches, fns, np.zeros(2, np.float32)


def time_round(fn, batches, flags, steps: int, start: int) -> tuple[float, float]:
    """(wall s, CPU s) per step over ``steps`` steps of ``fn``."""
    import numpy as np
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        images, masks = batches[(start + i) % len(batches)]
        out = fn(images, masks, flags)
        np.asarray(out[0] if isinstance(out, (tuple, list)) else out)  # wait for the step
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def run(args) -> dict:
    """Times every variant round-robin; returns {name: {"wall_ms", "cpu_ms"}} medians."""
    from distseg.parallel import distributed as dist
    ctx = dist.init()
    set_threads(args.threads)
    batches, fns, flags = build(args, ctx)
    for fn in fns.values():  # trace and warm up
        time_round(fn, batches, flags, 2, 0)
    walls = {n: [] for n in fns}
    cpus = {n: [] for n in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            w, c = time_round(fn, batches, flags, args.steps, r * args.steps)
            walls[name].append(w)
            cpus[name].append(c)
    return {n: {"wall_ms": 1e3 * statistics.median(walls[n]),
                "cpu_ms": 1e3 * statistics.median(cpus[n])} for n in fns}


def main(argv=None):
    args = parse_args(argv)
    results = run(args)
    from distseg.parallel import distributed as dist
    if dist.context().is_root():
        base = results.get("distseg")
        print(f"{'variant':10s} {'wall ms':>8s} {'CPU ms':>8s} {'wall x':>7s} {'CPU x':>7s}")
        for name, r in results.items():
            wx = base["wall_ms"] / r["wall_ms"] if base else float("nan")
            cx = base["cpu_ms"] / r["cpu_ms"] if base else float("nan")
            print(f"{name:10s} {r['wall_ms']:8.1f} {r['cpu_ms']:8.1f} {wx:7.3f} {cx:7.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    dist.shutdown()


if __name__ == "__main__":
    main()
