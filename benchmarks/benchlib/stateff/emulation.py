"""Back-end ``sim``: N data-parallel ranks emulated step for step in one process.

Each rank's batch comes from the loop's own epoch plan (``training.progress.plan``: parts of fixed global
batches, or ``distseg.data.sharding.shard_batches``), each rank has its own forward and
backward pass and its own BatchNorm moving statistics, the gradients are averaged,
the loop's Adam update applied (``steps.apply_adam``), the BatchNorm statistics
averaged over ranks at each epoch end, and the learning rate is the loop's
(``TrainingState.lr``). It measures samples, not time, at a fraction of the cost of 8
oversubscribed processes.

A global batch grown past G can be emulated as fewer ranks of more slices each
(``study.Emulated``: with GroupNorm and the global loss the same training up to float
rounding), and under ``train.batch_policy`` goodput the per-rank batch is chosen at each
epoch's end as the loop chooses it (``policy_step``), from given step times. The lr, the
noise scale and the policy are the loop's own object (``training.progress.state.TrainingState``).

A measuring copy is held to the real thing: ``tests/e2e/test_bench_stateff_parity.py``
runs ``distseg-train`` at 1 and 2 ranks and this emulation on the same config, seed
and data, and asserts the same per-step training losses (measured bit for bit the
same on one machine at 1 and 2 ranks).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time

from distseg.core import lr as lr_lib

from benchlib import args as bench_args


class SimRanks:
    """N data-parallel ranks emulated in one process, step for step as distseg's loop:
    each rank its own batch, forward and backward pass and BatchNorm moving statistics;
    the global loss's sums added over the ranks (the forward allreduce: a first forward
    pass per rank), the gradients of each rank's surrogate averaged (the allreduce) and
    applied by the train step's own Adam update (``steps.apply_adam``); the statistics
    averaged over ranks at each epoch end (``steps.average_batchnorm``). One rank whose
    step ``steps.can_halve`` (``halves``, set per plan by ``simulate``) takes its batch
    as two halves, as the loop's step does: two parts of the global loss, one set of
    statistics moved by the mean of the halves' moves."""

    def __init__(self, cfg, ranks: int):
        import tensorflow as tf

        from distseg import losses
        from distseg.training.step import factory, steps
        self.cfg, self.ranks = cfg, ranks
        # As the run builds them, from rank 0's seed (its initial state is broadcast).
        spatial = (cfg.model.image_size, cfg.model.image_size)
        self.model, self.optimizer = factory.model_and_optimizer(cfg, spatial, cfg.train.seed)
        self.stats = list(self.model.non_trainable_weights)
        self.banks = [[v.numpy() for v in self.stats] for _ in range(ranks)]
        self.previous = steps.PreviousGradient(self.model.trainable_variables) if ranks == 1 else None
        self.halves = False
        shape = [None, cfg.model.image_size, cfg.model.image_size]
        spec = [tf.TensorSpec(shape + [1], tf.float32), tf.TensorSpec(shape, tf.uint8)]
        self.sums_step = tf.function(self._sums, input_signature=spec)
        width = losses.sums_width(cfg.model.num_classes)
        grad_spec = spec + [tf.TensorSpec([width], tf.float32)]
        # The gradient of one part of the global loss, the batch in ``parts`` parts.
        self.grad_steps = {n: tf.function(functools.partial(self._grads, parts=n),
                                          input_signature=grad_spec) for n in {ranks, 2}}
        self.eval_step = tf.function(self._eval, input_signature=spec)
        self.apply = tf.function(self._apply)
        self.norms_step = tf.function(self._norms)

    def _sums(self, images, masks):
        from distseg import losses
        probs = self.model(images, training=True)
        return losses.loss_sums(probs, masks, self.cfg.model.num_classes)

    def _grads(self, images, masks, total, parts: int):
        import tensorflow as tf

        from distseg import losses
        with tf.GradientTape() as tape:
            probs = self.model(images, training=True)
            value, surrogate, _ = losses.global_loss(
                probs, masks, self.cfg.model.num_classes, self.cfg.train.loss,
                lambda local: total, parts)
        return value, tape.gradient(surrogate, self.model.trainable_variables)

    def _apply(self, grads):
        from distseg.training.step import steps
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

        from distseg.training.step import steps
        variables, opt = self.model.trainable_variables, self.optimizer
        if len(per_rank) == 1:
            return self.previous.norms(opt, mean, variables)
        small = tf.add_n([tf.stack([steps.squared_norm(g), steps.preconditioned_sq(opt, g, variables)])
                          for g in per_rank]) / len(per_rank)
        return tf.stack([small[0], steps.squared_norm(mean), small[1],
                         steps.preconditioned_sq(opt, mean, variables)])

    def step(self, batches: list, lr: float) -> tuple[float, list[float]]:
        """One synchronous step: ``batches[r]`` = rank r's (images, masks). Returns the
        mean loss and the gradient norms of the noise scale (``_norms``)."""
        if self.halves:
            (images, masks), = batches
            h = len(images) // 2
            batches = [(images[:h], masks[:h]), (images[h:], masks[h:])]
        bank = [0] * len(batches) if self.halves else list(range(len(batches)))
        losses, per_rank, sums, moved = [], [], 0.0, []
        for r, (images, masks) in enumerate(batches):
            self._use_bank(bank[r])
            sums = sums + self.sums_step(images, masks).numpy()
        for r, (images, masks) in enumerate(batches):
            self._use_bank(bank[r])
            loss, grads = self.grad_steps[len(batches)](images, masks, sums.astype("float32"))
            moved.append([v.numpy() for v in self.stats])
            losses.append(float(loss))
            per_rank.append(grads)
        self.banks = [[sum(v) / len(moved) for v in zip(*moved)]] if self.halves else moved
        mean = [sum(gs) / len(per_rank) for gs in zip(*per_rank)]
        norms = [float(x) for x in self.norms_step(per_rank, mean)]
        lr_lib.assign(self.optimizer, lr)
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


def sim_epoch(sim: SimRanks, scaling, loaded, epoch: int, clock: dict) -> list[dict]:
    """One benchmark epoch of ``sim`` under ``scaling`` (the loop's own
    ``training.progress.state.TrainingState``: its plan's batches, its lr, fed each step's gradient
    norms as the loop feeds it); ``clock`` holds the global step; returns its ``step``
    records, shaped like the loop's."""
    t = sim.cfg.train
    images, masks, train_ids = loaded
    plan = scaling.plan
    # The loop's own batches: parts of fixed global batches, or per-rank shards.
    shards = [plan.batches(train_ids, r, sim.ranks, epoch, t.seed) for r in range(sim.ranks)]
    records = []
    for k in range(plan.steps):
        batches = [(images[shards[r][k]], masks[shards[r][k]]) for r in range(sim.ranks)]
        lr = scaling.lr(clock["global_step"])
        loss, norms = sim.step(batches, lr)
        scaling.observe(norms, applied=math.isfinite(loss))  # as the loop: an applied step
        records.append({"type": "step", "epoch": epoch, "step": k,
                        "global_step": clock["global_step"], "loss": loss, "lr": lr,
                        "grad_sq": norms})
        clock["global_step"] += 1
    sim.average_batchnorm()
    return records


def find_lr(sim: SimRanks, plan, loaded, seed: int, configured: float) -> dict:
    """``--lr auto``'s range test on ``sim``, as ``distseg.training.startup.lrfind.find`` runs it:
    its lrs, its batches (epochs ``lrfind.FIND_EPOCH`` on, of ``plan``), its stop once
    the smoothed loss diverges and its choice (``lrfind.decide``); the model, optimizer
    and BatchNorm statistics put back. Returns ``decide``'s dict with the curve
    (``losses``) and its length (``steps``)."""
    from distseg.training.startup import lrfind
    from distseg.training.step import steps as steps_lib
    images, masks, train_ids = loaded
    variables = steps_lib.trial_variables(sim.model, sim.optimizer)
    kept, banks = [v.numpy() for v in variables], [list(b) for b in sim.banks]
    shards = [lrfind.batch_ids(plan, train_ids, r, sim.ranks, seed) for r in range(sim.ranks)]
    lrs, losses = lrfind.sweep_lrs(), []
    for k in range(lrfind.STEPS):
        batches = [(images[shards[r][k]], masks[shards[r][k]]) for r in range(sim.ranks)]
        loss, _ = sim.step(batches, lrs[k] * plan.lr_target / plan.lr_base)
        losses.append(loss)
        if not math.isfinite(loss) or lrfind.diverged(lrfind.smooth(losses)):
            break
    for v, value in zip(variables, kept):
        v.assign(value)
    sim.banks = banks
    if sim.previous is not None:
        sim.previous.forget()
    return {**lrfind.decide(lrs, losses, configured), "steps": len(losses), "losses": losses}


def held(records: list[dict], stop_at: float, hold: int) -> bool:
    """Whether the last ``hold`` epoch records' validation Dice all reach ``stop_at``."""
    from benchlib.stateff import curves
    dice = [curves.dice_of(r["val_dice"]) for r in records if r.get("type") == "epoch"]
    return len(dice) >= hold and all(d >= stop_at for d in dice[-hold:])


def policy_step(scaling, step_seconds: dict, train_cfg):
    """The goodput policy at an epoch's end, as the loop takes it (``TrainingState.decide`` and
    ``take``, by the run's ``train_cfg``) at the emulated ranks, the seconds of a step at each
    per-rank batch from ``step_seconds`` (measured throughput, not this process's clock).
    Returns the choice; on a switch ``scaling`` holds the new batch's plan and noise-scale
    sizes."""
    choice = scaling.decide(step_seconds.get)
    scaling.take(choice, train_cfg)
    return choice


def epoch_record(scaling, epoch: int, t: float, steps: list[dict], val_dice: dict,
                 plan) -> dict:
    """The ``epoch`` record of one emulated epoch of ``plan``, shaped like the loop's,
    with the per-rank batch of the ranks emulated (``per_rank``)."""
    import numpy as np
    return {"type": "epoch", "epoch": epoch, "t": t,
            "samples": plan.steps * plan.batch.per_rank,
            "train_loss": float(np.mean([s["loss"] for s in steps])), "val_dice": val_dice,
            "noise_scale": scaling.noise.record(), "per_rank": plan.batch.per_rank // scaling.fold}


def simulate(cfg, ranks: int, emulated=None, step_seconds: dict | None = None) -> list[list[dict]]:
    """Trains ``cfg`` as ``ranks`` emulated ranks; returns ``step`` and ``epoch``
    records shaped like ``distseg-train``'s (one list per rank, the global numbers on
    each). ``emulated`` (``study.Emulated``): the ``ranks`` sim ranks stand for
    ``emulated.ranks`` ranks, and the run ends at the validation that reaches
    ``emulated.stop_at``. Under ``train.batch_policy`` goodput, ``step_seconds`` (per-rank
    batch -> seconds of a step) is what the policy believes a step costs."""
    import numpy as np

    from distseg.data import slices as data
    from distseg.training.progress.state import TrainingState
    from distseg.training.step import steps as steps_lib

    from benchlib.stateff.study import Emulated
    emulated = emulated or Emulated(ranks, ranks)
    info = data.examine(cfg.data.path)
    with data.SliceReader(cfg.data.path, cfg.model.image_size) as reader:
        images, masks = reader.read(np.arange(info.samples))
    sim, records, t0 = SimRanks(cfg, ranks), [], time.perf_counter()
    found = None
    if cfg.train.lr_auto:
        plan = TrainingState.initial(cfg.train, len(info.train_indices), ranks, fold=emulated.fold).plan
        found = find_lr(sim, plan, (images, masks, info.train_indices), cfg.train.seed,
                        cfg.train.lr)
        if "error" in found:
            raise RuntimeError(found["error"])
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=found["lr"]))
        records.append({"type": "lr_find", **found})
    scaling = TrainingState.initial(cfg.train, len(info.train_indices), ranks, fold=emulated.fold)
    clock = {"global_step": 0}
    val = (images[info.val_indices], masks[info.val_indices])
    for epoch in range(cfg.train.epochs):
        plan = scaling.plan
        sim.halves = ranks == 1 and steps_lib.can_halve(
            sim.model, plan.static_batch(len(info.train_indices), ranks))
        scaling.noise.gradients_per_rank = 2 if sim.halves else 1  # as the loop's ``use_plan``
        steps = sim_epoch(sim, scaling, (images, masks, info.train_indices), epoch, clock)
        record = epoch_record(scaling, epoch, time.perf_counter() - t0, steps,
                              sim.validate(*val), plan)
        if scaling.policy is not None and epoch + 1 < cfg.train.epochs:
            choice = policy_step(scaling, step_seconds, cfg.train)
            record["goodput"] = {"next_per_rank": choice.per_rank, "reason": choice.reason,
                                 "goodput": {str(b): v for b, v in choice.goodput.items()}}
        records += steps + [record]
        if emulated.stop_at is not None and held(records, emulated.stop_at, emulated.hold):
            break
    return [records] * ranks


def set_threads(n: int) -> None:
    """``n`` TensorFlow threads, intra- and inter-op, for the emulation (1: like each
    real rank; before any op)."""
    bench_args.set_threads(n, n)
