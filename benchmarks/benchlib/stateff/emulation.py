"""Back-end ``sim``: N data-parallel ranks emulated step for step in one process.

Each rank's batch comes from the loop's own ``Schedule`` (parts of fixed global
batches, or ``distseg.data.sharding.shard_batches``), each rank has its own forward and
backward pass and its own BatchNorm moving statistics, the gradients are averaged,
the loop's Adam update applied (``steps.apply_adam``), the BatchNorm statistics
averaged over ranks at each epoch end, and the learning rate is the loop's
(``Schedule.lr``). It measures samples, not time, at a fraction of the cost of 8
oversubscribed processes.

A global batch grown past G can be emulated as fewer ranks of more slices each
(``study.Emulated``: with GroupNorm and the global loss the same training up to float
rounding), and under ``train.batch_policy`` goodput the per-rank batch is chosen at each
epoch's end as the loop chooses it (``policy_step``), from given step times.

A measuring copy is held to the real thing: ``tests/e2e/test_bench_stateff_parity.py``
runs ``distseg-train`` at 1 and 2 ranks and this emulation on the same config, seed
and data, and asserts the same per-step training losses (measured bit for bit the
same on one machine at 1 and 2 ranks).
"""

from __future__ import annotations

import math
import statistics
import time


class SimRanks:
    """N data-parallel ranks emulated in one process, step for step as distseg's loop:
    each rank its own batch, forward and backward pass and BatchNorm moving statistics;
    the global loss's sums added over the ranks (the forward allreduce: a first forward
    pass per rank), the gradients of each rank's surrogate averaged (the allreduce) and
    applied by the train step's own Adam update (``steps.apply_adam``); the statistics
    averaged over ranks at each epoch end (``steps.average_batchnorm``)."""

    def __init__(self, cfg, ranks: int):
        import keras
        import tensorflow as tf

        from distseg import losses
        from distseg.networks import unet as model_lib
        from distseg.training import steps
        keras.utils.set_random_seed(cfg.train.seed)  # rank 0's initial state, broadcast
        self.cfg, self.ranks = cfg, ranks
        self.model = model_lib.from_config(cfg.model)
        self.optimizer = keras.optimizers.Adam(learning_rate=cfg.train.lr)
        self.optimizer.build(self.model.trainable_variables)
        self.stats = list(self.model.non_trainable_weights)
        self.banks = [[v.numpy() for v in self.stats] for _ in range(ranks)]
        self.previous = steps.PreviousGradient(self.model.trainable_variables) if ranks == 1 else None
        shape = [None, cfg.model.image_size, cfg.model.image_size]
        spec = [tf.TensorSpec(shape + [1], tf.float32), tf.TensorSpec(shape, tf.uint8)]
        self.sums_step = tf.function(self._sums, input_signature=spec)
        width = losses.sums_width(cfg.model.num_classes)
        self.grad_step = tf.function(self._grads, input_signature=spec + [tf.TensorSpec([width], tf.float32)])
        self.eval_step = tf.function(self._eval, input_signature=spec)
        self.apply = tf.function(self._apply)
        self.norms_step = tf.function(self._norms)

    def _sums(self, images, masks):
        from distseg import losses
        probs = self.model(images, training=True)
        return losses.loss_sums(probs, masks, self.cfg.model.num_classes)

    def _grads(self, images, masks, total):
        import tensorflow as tf

        from distseg import losses
        with tf.GradientTape() as tape:
            probs = self.model(images, training=True)
            value, surrogate, _ = losses.global_loss(
                probs, masks, self.cfg.model.num_classes, self.cfg.train.loss,
                lambda local: total, self.ranks)
        return value, tape.gradient(surrogate, self.model.trainable_variables)

    def _apply(self, grads):
        from distseg.training import steps
        # The loop's fused update, not Keras' apply_gradients: the same Adam, rounded
        # as the real step rounds it (Keras' own differed in the 7th digit).
        steps.apply_adam(self.optimizer, grads, self.model.trainable_variables)

    def _eval(self, images, masks):
        from distseg import metrics
        probs = self.model(images, training=False)
        return metrics.dice_counts(probs, masks, self.cfg.model.num_classes)

    def _use_bank(self, rank: int) -> None:
        for v, value in zip(self.stats, self.banks[rank]):
            v.assign(value)

    def _norms(self, per_rank: list, mean: list):
        """The step's ``grad_sq`` as the train step makes it (``steps.StepResult``): [mean
        over ranks of |g_rank|^2, |g_mean|^2], then the same preconditioned by Adam
        (``steps.preconditioned_sq``, before the update). One rank: the previous step's
        gradient as the second (``steps.PreviousGradient``, NaN at the first step)."""
        import tensorflow as tf

        from distseg.training import steps
        variables, opt = self.model.trainable_variables, self.optimizer
        if self.previous is not None:
            return self.previous.norms(opt, mean, variables)
        small = tf.add_n([tf.stack([steps.squared_norm(g), steps.preconditioned_sq(opt, g, variables)])
                          for g in per_rank]) / self.ranks
        return tf.stack([small[0], steps.squared_norm(mean), small[1],
                         steps.preconditioned_sq(opt, mean, variables)])

    def step(self, batches: list, lr: float) -> tuple[float, list[float]]:
        """One synchronous step: ``batches[r]`` = rank r's (images, masks). Returns the
        mean loss and the gradient norms of the noise scale (``_norms``)."""
        losses, per_rank, sums = [], [], 0.0
        for r, (images, masks) in enumerate(batches):
            self._use_bank(r)
            sums = sums + self.sums_step(images, masks).numpy()
        for r, (images, masks) in enumerate(batches):
            self._use_bank(r)
            loss, grads = self.grad_step(images, masks, sums.astype("float32"))
            self.banks[r] = [v.numpy() for v in self.stats]
            losses.append(float(loss))
            per_rank.append(grads)
        mean = [sum(gs) / self.ranks for gs in zip(*per_rank)]
        norms = [float(x) for x in self.norms_step(per_rank, mean)]
        self.optimizer.learning_rate.assign(lr)
        self.apply(mean)
        return statistics.fmean(losses), norms

    def average_batchnorm(self) -> None:
        mean = [sum(vals) / self.ranks for vals in zip(*self.banks)]
        for v, value in zip(self.stats, mean):
            v.assign(value)
        self.banks = [list(mean) for _ in range(self.ranks)]

    def validate(self, images, masks) -> dict:
        """The validation Dice per class of the data file (``model.class_names``)."""
        import numpy as np

        from distseg import metrics
        counts = sum(self.eval_step(images[i:i + 64], masks[i:i + 64]).numpy()
                     for i in range(0, len(images), 64))
        dice = metrics.dice_from_counts(np.asarray(counts))
        return dict(zip(self.cfg.model.class_names, dice))


def sim_epoch(sim: SimRanks, schedule, loaded, epoch: int, clock: dict,
              noise) -> list[dict]:
    """One benchmark epoch of ``sim``, its gradient norms fed to ``noise`` (a
    ``training.noise.NoiseScale``, as the loop feeds its own); ``clock`` holds the
    global step and the gain-weighted progress, advanced as the loop advances its own
    (the ``gain`` lr rule reads both); returns its ``step`` records, shaped like the
    loop's."""
    t = sim.cfg.train
    images, masks, train_ids = loaded
    # The loop's own batches: parts of fixed global batches, or per-rank shards.
    shards = [schedule.batches(train_ids, r, sim.ranks, epoch, t.seed) for r in range(sim.ranks)]
    records = []
    for k in range(schedule.steps):
        batches = [(images[shards[r][k]], masks[shards[r][k]]) for r in range(sim.ranks)]
        big = schedule.plan.global_batch
        lr = schedule.lr(clock["global_step"], noise.gain(big), clock["progress"])
        loss, norms = sim.step(batches, lr)
        noise.update(*norms)
        if math.isfinite(loss):  # as the loop: an applied step adds its gain
            clock["progress"] += noise.gain(big)
        records.append({"type": "step", "epoch": epoch, "step": k,
                        "global_step": clock["global_step"], "loss": loss, "lr": lr,
                        "grad_sq": norms})
        clock["global_step"] += 1
    sim.average_batchnorm()
    return records


def first_schedule(cfg, train_samples: int, ranks: int, emulated):
    """The schedule the run starts with: the batch the config plans at ``emulated.ranks``
    ranks (``study.Emulated``), each of the ``ranks`` sim ranks taking ``emulated.fold``
    ranks' share (``Schedule.of``'s ``per_rank``, as the loop's goodput policy takes its
    own; the config's own schedule where the fold is 1)."""
    from distseg.core import config as config_lib
    from distseg.training.loop import Schedule
    per_rank = config_lib.batch_plan(cfg.train, emulated.ranks).per_rank * emulated.fold
    return Schedule.of(cfg.train, train_samples, ranks, per_rank=per_rank)


def policy_step(cfg, schedule, noise, emulated, step_seconds: dict, train_samples: int):
    """The goodput policy at an epoch's end, as ``loop.decide_batch`` / ``switch_batch``
    take it at ``emulated.ranks`` ranks: ``goodput.choose`` over
    ``goodput.candidates``, the seconds of a step at each per-rank batch from
    ``step_seconds`` (measured throughput, not this process's clock), the noise scale's
    preconditioned averages; on a switch the schedule of the new batch and the noise
    scale resized to it. Returns (schedule, the choice). The warm-up is still counted
    in steps, where the loop counts samples / B under the policy: right only for a
    variant without warm-up, as ``gbatch-gn-goodput`` is."""
    from distseg.core import goodput
    from distseg.training.loop import Schedule
    fold, plan = emulated.fold, schedule.plan
    current = plan.per_rank // fold
    avg = noise.averages["preconditioned"]
    options = goodput.candidates(emulated.ranks, plan.base, cfg.train.max_batch_per_rank)
    choice = goodput.choose(current, options, emulated.ranks, plan.base, step_seconds.get,
                            avg.g2, avg.trace)
    if choice.per_rank != current:
        schedule = Schedule.of(cfg.train, train_samples, schedule_ranks(schedule),
                               per_rank=choice.per_rank * fold)
        noise.resize(schedule.plan.per_rank, schedule.plan.global_batch)
    return schedule, choice


def schedule_ranks(schedule) -> int:
    """The sim ranks a schedule was made for (its global batch over its per-rank one)."""
    return schedule.plan.global_batch // schedule.plan.per_rank


def epoch_record(schedule, epoch: int, t: float, steps: list[dict], val_dice: dict, noise,
                 fold: int) -> dict:
    """The ``epoch`` record of one emulated epoch, shaped like the loop's, with the
    per-rank batch of the ranks emulated (``per_rank``)."""
    import numpy as np
    return {"type": "epoch", "epoch": epoch, "t": t,
            "samples": schedule.steps * schedule.plan.per_rank,
            "train_loss": float(np.mean([s["loss"] for s in steps])), "val_dice": val_dice,
            "noise_scale": noise.record(), "per_rank": schedule.plan.per_rank // fold}


def simulate(cfg, ranks: int, emulated=None, step_seconds: dict | None = None) -> list[list[dict]]:
    """Trains ``cfg`` as ``ranks`` emulated ranks; returns ``step`` and ``epoch``
    records shaped like ``distseg-train``'s (one list per rank, the global numbers on
    each). ``emulated`` (``study.Emulated``): the ``ranks`` sim ranks stand for
    ``emulated.ranks`` ranks, and the run ends at the validation that reaches
    ``emulated.stop_at``. Under ``train.batch_policy`` goodput, ``step_seconds`` (per-rank
    batch -> seconds of a step) is what the policy believes a step costs."""
    import numpy as np

    from distseg.data import slices as data
    from distseg.training.noise import NoiseScale

    from benchlib.stateff import curves
    from benchlib.stateff.study import Emulated
    emulated = emulated or Emulated(ranks, ranks)
    info = data.examine(cfg.data.path)
    with data.SliceReader(cfg.data.path, cfg.model.image_size) as reader:
        images, masks = reader.read(np.arange(info.samples))
    n_train, fold = len(info.train_indices), emulated.fold
    schedule = first_schedule(cfg, n_train, ranks, emulated)
    sim, records, t0 = SimRanks(cfg, ranks), [], time.perf_counter()
    clock = {"global_step": 0, "progress": 0.0}
    val = (images[info.val_indices], masks[info.val_indices])
    noise = NoiseScale(schedule.plan.per_rank, schedule.plan.global_batch, schedule.plan.base)
    for epoch in range(cfg.train.epochs):
        steps = sim_epoch(sim, schedule, (images, masks, info.train_indices), epoch, clock,
                          noise)
        record = epoch_record(schedule, epoch, time.perf_counter() - t0, steps,
                              sim.validate(*val), noise, fold)
        if cfg.train.batch_policy == "goodput" and epoch + 1 < cfg.train.epochs:
            schedule, choice = policy_step(cfg, schedule, noise, emulated, step_seconds, n_train)
            record["batch_policy"] = {"next_per_rank": choice.per_rank, "reason": choice.reason,
                                      "goodput": {str(b): v for b, v in choice.goodput.items()}}
        records += steps + [record]
        if emulated.stop_at is not None and curves.dice_of(record["val_dice"]) >= emulated.stop_at:
            break
    return [records] * ranks


def set_threads(n: int) -> None:
    """One TensorFlow thread for the emulation, like each real rank (before any op)."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)
