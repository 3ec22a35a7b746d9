"""Peer: the same U-Net trained data-parallel with ``tf.distribute.MultiWorkerMirroredStrategy``.

One worker process per rank on localhost, the cluster described by ``TF_CONFIG``, a
custom training loop: each worker takes distseg's own shards of every epoch
(``distseg.data.sharding.shard_batches``, batch 8 per worker, so the same global batch), from
the training slices held in memory, and runs the usual MWMS step: forward and
backward in ``strategy.run``, the loss divided by the number of replicas, and the
Keras optimizer, which all-reduces the gradients (TensorFlow's collective ops, one
packed all-reduce) before applying them. The same model and optimizer (as
``distseg-train`` builds them from the preset and ``--config``:
``benchlib.model_variants.model_and_optimizer``), loss, learning rate scaling (the
config's batch plan), thread counts and precision (``--precision``: ``make bench``
gives the one its distseg run chose) as distseg.

``launch`` starts the workers and combines their results; a worker prints one JSON
line with its epochs' seconds.

    python -m peers.mwms --data data/liver117.h5 --workers 2 --epochs 4 --precision bfloat16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

from benchlib.args import add_config, add_precision, set_threads, workload_parser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports that were free a moment ago on localhost."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


class MwmsStep:
    """The MWMS train step, ``step(images, masks) -> loss summed over replicas`` (each
    replica's loss is divided by the number of replicas, as the optimizer sums)."""

    def __init__(self, strategy, model, optimizer, num_classes: int, loss: str):
        import tensorflow as tf
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.num_classes, self.loss = num_classes, loss
        self.step = tf.function(self._step)

    def _replica_step(self, images, masks):
        import tensorflow as tf

        from distseg import losses
        with tf.GradientTape() as tape:
            probs = self.model(images, training=True)
            local = losses.segmentation_loss(probs, masks, self.num_classes, self.loss)
            scaled = local / self.strategy.num_replicas_in_sync
        grads = tape.gradient(scaled, self.model.trainable_variables)
        # Under the strategy, the Keras optimizer all-reduces (sums) the gradients.
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return scaled

    def _step(self, images, masks):
        import tensorflow as tf
        per_replica = self.strategy.run(self._replica_step, args=(images, masks))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def worker(args) -> dict:
    """One MWMS worker (``TF_CONFIG`` set): trains and returns its epochs' seconds."""
    import tensorflow as tf
    set_threads(args.threads)
    from distseg.core import batchplan
    from distseg.core import config as config_lib
    from distseg.data import feeds, sharding
    from distseg.data import slices as data
    from distseg.training.step import steps

    from benchlib import model_variants
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    size = strategy.num_replicas_in_sync
    # Per-worker batches, as make bench runs distseg (--batch-size: no fixed global batch).
    cfg = config_lib.resolve(args.preset, args.config,
                             overrides={"data.path": args.data, "run_dir": "-",
                                        "train.global_batch": 0, "model.precision": args.precision})
    cfg = feeds.with_classes(cfg)  # the data file decides the class count
    # The lr of this many workers, as distseg's batch plan scales it.
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, lr=cfg.train.lr * batchplan.batch_plan(cfg.train, size).lr_factor))
    info = data.examine(args.data)
    with data.SliceReader(args.data, cfg.model.image_size) as reader:
        images, masks = reader.read(info.train_indices)
    row = {int(i): k for k, i in enumerate(info.train_indices)}
    with strategy.scope():
        model, optimizer = model_variants.model_and_optimizer(cfg, (cfg.model.image_size,) * 2, cfg.train.seed)
        step = MwmsStep(strategy, model, optimizer, cfg.model.num_classes, cfg.train.loss).step
    seconds, samples = [], []
    for epoch in range(args.epochs):
        batches = sharding.shard_batches(info.train_indices, index, size, args.batch_size,
                                     epoch, cfg.train.seed)
        batches = batches[:args.max_steps] if args.max_steps else batches
        start = time.perf_counter()
        for ids in batches:
            rows = [row[int(i)] for i in ids]
            loss = step(tf.constant(images[rows]), tf.constant(masks[rows]))
        float(loss)
        seconds.append(time.perf_counter() - start)
        samples.append(sum(len(b) for b in batches))
    return {"worker": index, "precision": args.precision, "epoch_seconds": seconds,
            "samples": samples, "last_loss": float(loss),
            "weight_checksum": steps.weight_checksum(model.trainable_weights)}


def combine(results: list[dict]) -> dict:
    """Global samples/s over the epochs after the first (an epoch lasts as long as its
    slowest worker), after checking that the workers hold the same weights."""
    sums = [r["weight_checksum"][0] for r in results]
    if max(sums) - min(sums) > 1e-4 * max(1.0, abs(sums[0])):
        raise SystemExit(f"mwms workers ended with different weights (checksums {sums})")
    epochs = range(1, len(results[0]["epoch_seconds"]))
    samples = sum(r["samples"][e] for r in results for e in epochs)
    seconds = sum(max(r["epoch_seconds"][e] for r in results) for e in epochs)
    return {"peer": "mwms", "workers": len(results), "samples_per_s": samples / seconds,
            "precision": results[0]["precision"], "per_worker": results}


def launch(args) -> dict:
    """Starts ``args.workers`` worker processes on localhost and combines them."""
    ports = free_ports(args.workers)
    cmd = [sys.executable, "-m", "peers.mwms", "--worker", "--data", args.data,
           "--preset", args.preset, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--threads", str(args.threads),
           "--precision", args.precision, *(["--config", args.config] if args.config else [])]
    procs = [subprocess.Popen(cmd, env=dict(os.environ, TF_CONFIG=tf_config(ports, i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(args.workers)]
    return collect(procs, args.timeout)


def collect(procs: list, timeout: float) -> dict:
    """The started workers' combined result (``combine``); a failed worker ends all."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode:
            for q in procs:
                q.kill()
            raise SystemExit(f"mwms worker failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return combine(sorted(results, key=lambda r: r["worker"]))


def main(argv=None):
    p = workload_parser(__doc__, epochs=4, batch_help="per worker")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (0: all)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = add_config(add_precision(p)).parse_args(argv)
    if args.epochs < 2:
        sys.exit("error: --epochs must be >= 2 (the first epoch is not timed)")
    print(json.dumps(worker(args) if args.worker else launch(args)), flush=True)


if __name__ == "__main__":
    main()
