"""Data-parallel training of the U-Net: one call, ``run(config)``, on every rank.

The Horovod recipe, with Keras 3 and the core ops of ``horovod.tensorflow``:
initialise and pin; scale the learning rate by the number of ranks with a warm-up;
average gradients with one grouped allreduce per step; broadcast rank 0's initial
state; checkpoint and print on rank 0 only; every rank logs its own measurements.

``run`` reads like its outline: start-up checks (``check_inputs``,
``prepare_run_dir``), ``build_state``, ``open_session``, then per epoch
``train_epoch`` -> ``validate`` -> ``finish_epoch``. Every piece that can fail on one
rank alone goes through ``distributed.agree`` (or rides in a step's allreduce), so
all ranks stop together with the same message.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from distseg.core import commtrace, goodput, link, rundir, schema
from distseg.core import config as config_lib
from distseg.core.errors import Interrupted, RunError
from distseg.core.stopflag import StopFlag
from distseg.data import feeds, prefetch, sharding
from distseg.parallel import distributed as dist
from distseg.parallel import threads as threads_lib
from distseg.training import batchpolicy, checkpoint, resume, steps, stopping, validation
from distseg.training import board as board_lib
from distseg.training.batchpolicy import BatchPolicy
from distseg.training.noise import NoiseScale
from distseg.training.runlog import RunLog

Failure = tuple[str, int]


# --- start-up: checks without side effects, then the run directory -----------------


def check_inputs(cfg: config_lib.Config, ctx: dist.Context) -> feeds.Feed:
    """Everything that can be wrong with the data before training starts; the feed
    (slices or slabs) the run reads."""
    # Rank 0 reads every mask once to check the labels; the others trust its verdict.
    return feeds.open_feed(cfg, ctx.size, check_labels=ctx.is_root())


def _refuse_existing_run(run_dir: str, ctx: dist.Context) -> None:
    found = rundir.existing_run(run_dir) if ctx.is_root() else None
    if found:
        raise RunError(f"{run_dir}: already holds a run ({found} exists); "
                       "choose a new --run-dir", exit_code=2)


def _probe_writable(run_dir: str, ctx: dist.Context) -> None:
    logs = rundir.log_dir(run_dir)
    probe = os.path.join(logs, f".probe-{ctx.rank}-{os.getpid()}")
    try:
        os.makedirs(logs, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise RunError(f"{run_dir}: run directory is not writable ({e.strerror})", exit_code=2)


def _write_config(cfg: config_lib.Config, ctx: dist.Context) -> None:
    # Chief-only side effect: one config per run, written before any rank logs.
    if ctx.is_root():
        checkpoint.write_json_atomic(rundir.config_path(cfg.run_dir), cfg.to_dict())
        os.makedirs(rundir.checkpoint_dir(cfg.run_dir), exist_ok=True)


def prepare_run_dir(cfg: config_lib.Config, ctx: dist.Context, resuming: bool) -> None:
    """Refuses a directory that holds a run (unless ``resuming`` it), checks every
    rank can write its log directory, then writes the config. Three agreed phases: no
    rank may create logs/ before rank 0 has looked for a previous run there (a fast
    rank 1 once made rank 0 refuse a fresh directory)."""
    if not resuming:
        dist.agree(_refuse_existing_run, cfg.run_dir, ctx)
    dist.agree(_probe_writable, cfg.run_dir, ctx)
    dist.agree(_write_config, cfg, ctx)


# --- model, optimizer and schedule -------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """The batches (``config.batch_plan``), steps per epoch and the learning rate of
    every step."""

    steps: int
    lr_base: float
    lr_target: float
    """The lr after the warm-up (with the ``gain`` rule: the most it can reach)."""
    warmup_steps: int
    plan: config_lib.BatchPlan
    warmup_progress: float = 0.0
    """The ``gain`` rule's warm-up: steps of the base batch (``plan.base``)."""

    @classmethod
    def of(cls, train_cfg, train_samples: int, size: int,
           per_rank: int | None = None) -> "Schedule":
        """The schedule of the config's batch, or of the ``goodput`` policy's
        ``per_rank`` batch (``train.max_steps_per_epoch`` then caps the samples of an
        epoch as it caps them at the config's batch)."""
        plan = config_lib.batch_plan(train_cfg, size, per_rank)
        n = schema.steps_per_epoch(train_samples, size, plan.per_rank, plan.fixed)
        if train_cfg.max_steps_per_epoch:
            samples = train_cfg.max_steps_per_epoch * config_lib.batch_plan(train_cfg, size).global_batch
            n = min(n, max(1, samples // plan.global_batch))
        return cls(steps=n, lr_base=train_cfg.lr, lr_target=train_cfg.lr * plan.lr_factor,
                   warmup_steps=int(round(train_cfg.warmup_epochs * n)), plan=plan,
                   warmup_progress=train_cfg.warmup_epochs * n * plan.global_batch / plan.base)

    def batches(self, ids, rank: int, size: int, epoch: int, seed: int) -> list:
        """This rank's batches of ``ids`` for ``epoch``: parts of fixed global batches,
        or per-rank shards."""
        if self.plan.fixed:
            return sharding.global_batches(ids, rank, size, self.plan.fixed, epoch, seed)
        return sharding.shard_batches(ids, rank, size, self.plan.per_rank, epoch, seed)

    def lr(self, global_step: int, gain: float = 1.0, progress: float = 0.0) -> float:
        """The lr of ``global_step``; the ``gain`` rule reads the measured ``gain`` and
        the gain-weighted ``progress`` instead (``steps.gain_lr``)."""
        if self.plan.lr_scaling == "gain" and self.plan.global_batch > self.plan.base:
            return steps.gain_lr(self.lr_base, gain, progress, self.warmup_progress)
        return steps.lr_at(global_step, self.lr_base, self.lr_target, self.warmup_steps)

    def static_batch(self, train_samples: int, size: int) -> int | None:
        """The one size of every batch of every rank, when there is one (the step is
        then traced for it: BatchNorm's ghost batches split statically, 7 % faster than
        at a size known only at run time); None where per-rank shards of a split that
        does not divide hold some batches one sample short."""
        per_rank = self.plan.per_rank
        if self.plan.fixed or per_rank == 1 or train_samples % (size * per_rank) == 0:
            return per_rank
        return None


def build_state(cfg: config_lib.Config, ctx: dist.Context, input_shape, broadcast: bool = True):
    """(model, optimizer, synced variables), identical on every rank (``broadcast``
    False: each rank's own initial values, for an elastic run's state to sync)."""
    import keras

    from distseg.networks import unet as model_lib

    keras.utils.set_random_seed(cfg.train.seed + ctx.rank)
    model = model_lib.from_config(cfg.model, input_shape)
    optimizer = keras.optimizers.Adam(learning_rate=cfg.train.lr)
    optimizer.build(model.trainable_variables)
    # What every rank must hold identically: weights (BatchNorm statistics included)
    # and optimizer state. Not model.variables: that also holds the dropout layers'
    # seed-generator states, which must stay different per rank (seeded by rank above)
    # or every rank would drop the same units.
    synced = model.weights + optimizer.variables
    if broadcast:
        # Horovod: every rank starts from rank 0's weights and optimizer state.
        dist.broadcast_variables(synced, root=0)
    return model, optimizer, synced


def start_state(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed, resuming: bool):
    """(model, optimizer, synced) and, when ``resuming``, the ``resume.Resumed`` they
    were restored from. A new run checks its directory before building anything; a
    resumed one rewrites its config only once its checkpoint has loaded."""
    if not resuming:
        prepare_run_dir(cfg, ctx, resuming=False)
        return build_state(cfg, ctx, feed.input_shape), None
    state = build_state(cfg, ctx, feed.input_shape)
    resumed = resume.restore(ctx, cfg.run_dir, *state)
    resume.check_extends(resumed, cfg.train.epochs)
    prepare_run_dir(cfg, ctx, resuming=True)
    return state, resumed


# --- the session: what the epochs of one run share ---------------------------------


@dataclass
class Session:
    """The state the epochs of one run share (built by ``open_session``)."""

    cfg: config_lib.Config
    ctx: dist.Context
    feed: feeds.Feed
    schedule: Schedule
    model: Any
    optimizer: Any
    synced: list
    train_step: Any
    eval_step: Any
    reader: Any
    """The feed's reader (``data.SliceReader`` or ``volumes.SlabReader``)."""
    predict: Any
    """The compiled forward pass (sliding-window validation of volumes)."""
    log: RunLog
    batches: Iterator
    t0: float
    """``perf_counter`` at the agreed start; log times count from here."""
    start_time: float
    """Unix time of the agreed start on rank 0's clock, the same on every rank."""
    stop: StopFlag
    resumed: resume.Resumed | None = None
    start: tuple[int, int] = (0, 0)
    """(epoch, step) where this launch starts: after a resumed checkpoint's position."""
    bar: Any = None
    watch: stopping.HangWatch | None = None
    """Times this rank's collectives (set by ``open_session``)."""
    global_step: int = 0
    epochs_done: int = 0
    lr_now: float | None = None
    noise: NoiseScale | None = None
    """The gradient noise scale's moving averages (set by ``open_session``)."""
    progress: float = 0.0
    """Steps of the base batch trained, each step weighted by its gain: the ``gain``
    rule's clock (AdaScale's scale-invariant iterations)."""
    elastic: Any | None = None
    """An elastic run's state, committed after each epoch's checkpoint."""
    samples: int = 0
    """Samples trained, all ranks: the warm-up's clock under the ``goodput`` policy."""
    policy: BatchPolicy | None = None
    """The ``goodput`` batch policy (None: ``fixed``)."""
    prefetcher: Any = None
    train_steps: dict = field(default_factory=dict)
    """Per-rank batch -> the train step traced for it (the policy may come back)."""
    fresh: bool = True
    """The next step traces the train step (not timed for the policy; longer watch)."""
    link: dict | None = None
    """The link between the ranks as measured at the start (``measure_link``)."""
    board: board_lib.Board | None = None
    """The live TensorBoard scalars (rank 0 writes them; None: ``--no-tensorboard``)."""

    @property
    def class_names(self) -> list[str]:
        """The run's class names: the config's, which start-up filled from the data file
        (``feeds.open_feed``), so the logs name the classes as config.json does."""
        return list(self.cfg.model.class_names)


@dataclass
class EpochResult:
    """What one epoch of training measured on this rank."""

    epoch: int
    start: float
    seen: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    losses_local: list = field(default_factory=list)
    failure: Failure | None = None
    """This rank's first error, not yet raised: it rides on the next collective."""
    skipped: int = 0
    """Steps whose update every rank skipped (non-finite loss or gradient)."""
    elapsed_before: float = 0.0
    """Training seconds of this epoch spent by an earlier launch (resumed inside it)."""
    weights: list = field(default_factory=list)
    train_time: float = 0.0
    epoch_time: float = 0.0
    comm: dict | None = None
    """Rank 0, in a traced epoch: where its steps' time went (``commtrace.record``)."""


def _progress_bar(ctx: dist.Context, total: int, done: int, resources: contextlib.ExitStack):
    if not ctx.is_root():
        return None  # rank 0 alone prints progress
    from tqdm import tqdm
    bar = tqdm(total=total, initial=done, unit="step", file=sys.stderr, dynamic_ncols=True,
               mininterval=0.5, desc=f"train x{ctx.size}")
    resources.callback(bar.close)
    return bar


def _all_batches(feed: feeds.Feed, ctx: dist.Context, train_cfg, schedule: Schedule,
                 start: tuple[int, int]):
    """This rank's batches from (epoch, step) ``start`` to the end of training."""
    for e in range(start[0], train_cfg.epochs):
        first = start[1] if e == start[0] else 0
        for ids in schedule.batches(feed.train_ids, ctx.rank, ctx.size, e,
                                    train_cfg.seed)[first:schedule.steps]:
            yield prefetch.EpochBatch(e, ids)


def open_session(cfg, ctx, feed, state, resumed, resources: contextlib.ExitStack) -> Session:
    """Opens the reader and the log, starts the clock on an agreed barrier, routes the
    stop signals to a flag and starts the prefetcher. Everything opened is closed by
    ``resources``."""
    model, optimizer, synced = state
    kept = resumed.position.scaling if resumed else None
    schedule = Schedule.of(cfg.train, len(feed.train_ids), ctx.size,
                           batchpolicy.kept_per_rank(kept, ctx.size))
    shape = feed.input_shape
    reader = resources.enter_context(dist.agree(feed.open_reader))
    log = resources.enter_context(dist.agree(RunLog, cfg.run_dir, ctx.rank))
    measured = measure_link(ctx)
    dist.barrier()  # the agreed start: every rank leaves this together
    t0 = time.perf_counter()
    start_time = dist.broadcast_object(time.time() if ctx.is_root() else None)
    stop = StopFlag()
    stopping.install(stop, resources, stopping.stop_signals(dist.is_elastic()))
    start = (resumed.position.epoch, resumed.position.step) if resumed else (0, 0)
    done = _start_step(resumed, schedule, start)
    left = (cfg.train.epochs - start[0]) * schedule.steps - start[1]
    session = Session(
        cfg=cfg, ctx=ctx, feed=feed, schedule=schedule, model=model, optimizer=optimizer,
        synced=synced, reader=reader, log=log, batches=iter(()), t0=t0,
        start_time=start_time, stop=stop, resumed=resumed, start=start,
        global_step=done, epochs_done=start[0],
        train_step=None, eval_step=steps.make_eval_step(model, shape, cfg.model.num_classes),
        predict=steps.make_predict_step(model, shape),
        bar=_progress_bar(ctx, done + left, done, resources))
    session.link = measured
    _use_schedule(session, schedule, start)
    resources.callback(_close_prefetcher, session)
    session.noise = NoiseScale(schedule.plan.per_rank, schedule.plan.global_batch,
                               schedule.plan.base)
    if cfg.train.batch_policy == "goodput":
        session.policy = BatchPolicy(ctx.size, schedule.plan.base, cfg.train.max_batch_per_rank,
                                     schedule.plan.per_rank)
    _restore_scaling(session)
    session.board = board_lib.open_board(cfg.run_dir, ctx, session.global_step, start_time,
                                         cfg.train.tensorboard, resources)
    session.watch = stopping.HangWatch(cfg.train.hang_timeout, functools.partial(_on_hang, session))
    resources.callback(session.watch.close)
    dist.watch_collectives(session.watch)
    resources.callback(dist.watch_collectives, None)
    return session


def measure_link(ctx: dist.Context) -> dict | None:
    """Collective on 2 or more ranks: bandwidth and latency of the link between them as
    they see it (``distseg.core.link``), from timed allreduces before the agreed start
    (0.3 s here between two local ranks, about 0.9 s over a 1 Gbit/s link), and whether every rank is on one host (then
    it is the host's own path, not a network). None on one rank."""
    if ctx.size < 2:
        return None
    sizes, seconds = dist.time_allreduces(link.PROBE_BYTES, link.PROBE_REPEATS,
                                          link.PROBE_ALWAYS, link.PROBE_BUDGET_S)
    return {**(link.fit(sizes, seconds, ctx.size) or {}), "local": ctx.local_size == ctx.size}


def _start_step(resumed: resume.Resumed | None, schedule: Schedule, start: tuple[int, int]) -> int:
    """The global step this launch starts at: the checkpoint's own count where it kept
    one (epochs of several batch sizes under the ``goodput`` policy), else counted from
    the position at this schedule."""
    kept = resumed.position.global_step if resumed else 0
    return kept or start[0] * schedule.steps + start[1]


def _use_schedule(s: Session, schedule: Schedule, start: tuple[int, int]) -> None:
    """Trains from (epoch, step) ``start`` on with ``schedule``: its batches (one
    prefetcher, which reads the next epoch's first batches while an epoch ends) and the
    train step traced for its batch."""
    _close_prefetcher(s)
    s.schedule = schedule
    s.prefetcher = prefetch.Prefetcher(s.reader, _all_batches(s.feed, s.ctx, s.cfg.train,
                                                              schedule, start),
                                       depth=s.cfg.data.prefetch)
    s.batches = iter(s.prefetcher)
    batch = schedule.static_batch(len(s.feed.train_ids), s.ctx.size)
    if batch not in s.train_steps:
        s.train_steps[batch] = steps.make_train_step(
            s.model, s.optimizer, s.feed.input_shape, s.cfg.model.num_classes,
            s.cfg.train.loss, ranks=s.ctx.size, batch=batch, compression=s.cfg.train.compression)
    s.train_step = s.train_steps[batch]
    s.fresh = True


def _close_prefetcher(s: Session) -> None:
    if s.prefetcher is not None:
        s.prefetcher.close()
        s.prefetcher = None


def _restore_scaling(s: Session) -> None:
    """A resumed launch continues the noise scale's averages, the gain-weighted
    progress and the batch policy its checkpoint kept (a run of other ranks or batches:
    afresh)."""
    kept = s.resumed.position.scaling if s.resumed else None
    if kept and kept.get("global_batch") == s.schedule.plan.global_batch:
        s.noise.restore(kept.get("noise"))
        s.progress = float(kept.get("progress", 0.0))
        s.samples = int(kept.get("samples", s.global_step * s.schedule.plan.global_batch))
    if kept and s.policy is not None:
        s.policy.restore(kept.get("policy"))


def scaling_state(s: Session) -> dict:
    """What a checkpoint keeps of the lr rule and the batch policy (``_restore_scaling``
    reads it back)."""
    return {"noise": s.noise.state(), "progress": s.progress, "samples": s.samples,
            "global_batch": s.schedule.plan.global_batch,
            "policy": None if s.policy is None else s.policy.state()}


def _on_hang(s: Session, where: str, waited: float) -> None:
    """The watch thread, when this rank waited ``waited`` s in a collective: say so in
    the log, give the other waiting ranks a moment to say so too, then name the ranks
    that did not (they stopped answering), write the ``end`` record and exit."""
    t = time.perf_counter() - s.t0
    paths = rundir.log_paths(s.cfg.run_dir, s.ctx.size)
    try:
        s.log.write("stalled", t=t, waited=waited, where=where)
        time.sleep(min(15.0, max(3.0, waited / 10)))
        silent = stopping.silent_ranks(paths, s.ctx.rank)
        who = (f"rank(s) {', '.join(map(str, silent))} stopped answering" if silent
               else "no other rank's log shows which stopped")
        reason = f"waited {waited:.0f} s in {where}: {who} (--hang-timeout)"
        s.log.write("end", status="error", reason=reason, t=time.perf_counter() - s.t0,
                    epochs_done=s.epochs_done)
    except OSError as e:
        reason = f"waited {waited:.0f} s in {where} ({e})"
    sys.stderr.write(f"error: {reason}\n")
    sys.stderr.flush()
    os._exit(1)  # the main thread is blocked inside Horovod; only the launcher can end it


def write_run_record(s: Session, threads: tuple[int, int]) -> None:
    """Collective: the ``run`` record on every rank (run id and start time agreed)."""
    ctx, cfg, t = s.ctx, s.cfg, s.cfg.train
    run_id = dist.broadcast_object(uuid.uuid4().hex[:12] if ctx.is_root() else None)
    versions = dist.versions()
    params = int(sum(int(np.prod(v.shape)) for v in s.model.trainable_variables))
    dist.agree(
        s.log.write, "run", schema_version=schema.SCHEMA_VERSION, size=ctx.size,
        local_rank=ctx.local_rank, local_size=ctx.local_size, host=versions["host"],
        pid=os.getpid(), run_id=run_id, start_time=s.start_time, versions=versions,
        controller=ctx.controller,
        threads={"intra_op": threads[0], "inter_op": threads[1], "cores": ctx.cores,
                 "pinned": ctx.pinned, "affinity": sorted(os.sched_getaffinity(0))},
        horovod_env={k: v for k, v in os.environ.items()
                     if k.startswith("HOROVOD_") or k in dist.OMPI_DEFAULTS},
        config_hash=schema.config_hash(cfg.to_dict()),
        model={"name": f"unet{cfg.model.spatial_dims}d", "params": params,
               "input_shape": list(s.feed.input_shape), **cfg.model.__dict__},
        voxels_per_sample=int(np.prod(s.feed.input_shape)), onednn=steps.onednn_enabled(),
        dataset=s.feed.summary(), global_seed=t.seed, steps_per_epoch=s.schedule.steps,
        batch_size=s.schedule.plan.per_rank, global_batch_size=s.schedule.plan.global_batch,
        batch_policy=s.schedule.plan.policy, loss_scope="global_batch",
        lr_scaling=s.schedule.plan.lr_scaling,
        lr_base=t.lr, lr_scaled=s.schedule.lr_target, warmup_steps=s.schedule.warmup_steps,
        epochs=t.epochs, link=s.link)


def write_resume_record(s: Session) -> None:
    """Collective: the ``resume`` record that opens a resumed launch's lines."""
    r = s.resumed
    dist.agree(s.log.write, "resume", from_epoch=s.start[0], from_step=s.start[1],
               global_step=s.global_step, checkpoint=r.manifest, size_before=r.position.size,
               size=s.ctx.size, warnings=r.warnings,
               **({"elastic": r.elastic} if r.elastic else {}))
    if s.bar is not None:
        for w in r.warnings:
            s.bar.write(f"warning: {w}")
        where = r.manifest or f"the elastic state ({r.elastic})"
        s.bar.write(f"resuming from {where}: epoch {s.start[0]}, step {s.start[1]}, "
                    f"{r.position.size} -> {s.ctx.size} rank(s)")


# --- one epoch ----------------------------------------------------------------------


def _next_batch(s: Session, result: EpochResult):
    """This rank's next batch; on a read error, a blank stand-in (so the rank still
    joins the step's allreduce, where every rank learns of the failure)."""
    try:
        return next(s.batches)
    except Exception as e:  # noqa: BLE001 - shared in the step's allreduce
        result.failure = result.failure or dist.failure_of(e)
        shape = tuple(s.feed.input_shape)
        n = s.schedule.plan.per_rank  # the size the step was traced for
        return (np.zeros(0, np.int64), np.zeros((n, *shape, 1), np.float32),
                np.zeros((n, *shape), np.uint8))


def _set_lr(s: Session) -> float:
    # The warm-up's clock: steps of this batch, or, under the batch policy, samples in
    # steps of this batch (the same warm-up in samples whatever batches came before).
    clock = s.global_step if s.policy is None else s.samples / s.schedule.plan.global_batch
    lr = s.schedule.lr(clock, s.noise.gain(s.schedule.plan.global_batch), s.progress)
    if lr != s.lr_now:  # changes during the warm-up, and every step with the gain rule
        s.optimizer.learning_rate.assign(lr)
        s.lr_now = lr
    return lr


def _check_nonfinite(s: Session, result: EpochResult, step: int, loss: float) -> None:
    """Some rank's loss or gradient was not finite, so no rank applied this step's
    update: stop every rank (the same message), or count the skipped step."""
    if s.cfg.train.on_nonfinite == "skip":
        result.skipped += 1
        return
    what = f"training loss is {loss}" if not math.isfinite(loss) else "a gradient is not finite"
    raise RunError(f"{what} at epoch {result.epoch} step {step}; lower --lr, check the data, "
                   "or pass --on-nonfinite skip")


def run_step(s: Session, result: EpochResult, step: int) -> bool:
    """One training step on this rank, logged; raises on every rank together.
    Returns whether some rank asked to stop (every rank gets the same answer)."""
    step_start = time.perf_counter()
    ids, images, masks = _next_batch(s, result)
    data_wait = time.perf_counter() - step_start
    lr = _set_lr(s)
    flags = np.array([result.failure is not None, s.stop.requested], np.float32)
    # The first step of a launch, or at a new batch, also traces the step function.
    first, s.fresh = s.fresh, False
    s.watch.arm(f"the allreduce of epoch {result.epoch} step {step}", 10.0 if first else 1.0)
    out = s.train_step(images, masks, flags)
    s.watch.disarm()
    failed, stop, nonfinite = steps.Flags.of(out.flags)
    if failed:
        dist.raise_agreed(result.failure)
    loss_local, loss, grad_sq = float(out.loss_local), float(out.loss), [float(g) for g in out.grad_sq]
    if not nonfinite:
        s.noise.update(*grad_sq)
        s.progress += s.noise.gain(s.schedule.plan.global_batch)
    now = time.perf_counter()
    s.samples += s.schedule.plan.global_batch
    if s.policy is not None and not first:
        s.policy.observe(now - step_start)
    try:
        record = s.log.write("step", epoch=result.epoch, step=step, global_step=s.global_step,
                             t=now - s.t0, step_time=now - step_start, data_wait=data_wait,
                             loss=loss, loss_local=loss_local, lr=lr, samples=len(ids),
                             grad_sq=grad_sq, **({"skipped": True} if nonfinite else {}))
        if s.board is not None:
            s.board.step(record)
    except OSError as e:  # shared in the next step's allreduce, or at epoch end
        result.failure = result.failure or dist.failure_of(e)
    result.seen.append(ids)
    result.losses.append(loss)
    result.losses_local.append(loss_local)
    s.global_step += 1
    if nonfinite:  # decided from the allreduced flag: the same on every rank
        _check_nonfinite(s, result, step, loss)
    if s.global_step == 1:  # BatchNorm statistics are still local here
        steps.check_weights("after the first step",
                            s.model.trainable_variables + s.optimizer.variables)
    if s.bar is not None:
        s.bar.update(1)
        s.bar.set_postfix(epoch=result.epoch, loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
    return stop


def _carry_over(s: Session, epoch: int, result: EpochResult) -> None:
    """A launch resumed inside ``epoch`` starts from what its checkpoint had seen."""
    carried = s.resumed.carried if s.resumed else None
    if carried is None or epoch != s.start[0] or not s.start[1]:
        return
    result.seen.append(np.asarray(carried.seen, np.int64))
    result.losses.extend(carried.losses)
    result.losses_local.extend(carried.losses_local)
    result.elapsed_before = s.resumed.position.train_time


def checkpoint_now(s: Session, result: EpochResult, step: int) -> None:
    """Collective: a checkpoint ``step`` steps into ``result.epoch`` (0: at its end,
    after the BatchNorm averaging), holding every rank's partial epoch."""
    t = s.cfg.train
    position = checkpoint.Position(
        epoch=result.epoch + (0 if step else 1), step=step, global_step=s.global_step,
        size=s.ctx.size, train_time=result.elapsed_before + time.perf_counter() - result.start,
        scaling=scaling_state(s))
    seen, losses, local = ((result.seen, result.losses, result.losses_local) if step
                           else ([], [], []))
    mine = resume.rank_state(s.model, seen, losses, local)
    resume.save(s.ctx, s.cfg.run_dir, position, s.model, s.optimizer, mine, t.keep_checkpoints)


def _stop_inside_epoch(s: Session, result: EpochResult, step: int):
    """Every rank: checkpoint the finished steps, then raise ``Interrupted``."""
    checkpoint_now(s, result, step)
    raise Interrupted(f"{s.stop.reason or 'another rank was asked to stop'}; checkpoint at "
                      f"epoch {result.epoch} step {step}")


def start_trace(s: Session, epoch: int) -> str | None:
    """Starts Horovod's timeline for this epoch where it is traced: each launch's second
    epoch (the first traces the step) on 2 or more ranks, with a dynamic timeline
    (``dist.start_timeline``); returns its path, else None. The same answer on every
    rank (no collective depends on it)."""
    if s.ctx.size < 2 or epoch != s.start[0] + 1:
        return None
    path = os.path.join(s.cfg.run_dir, f"comm-timeline-e{epoch}.json")
    return path if dist.start_timeline(path) else None


def read_trace(s: Session, result: EpochResult, path: str, steps_traced: int) -> None:
    """Rank 0 reads the stopped timeline into ``result.comm`` (after the epoch's training
    time is taken: parsing it is not training)."""
    if s.ctx.is_root():
        result.comm = commtrace.record(path, steps_traced)


def train_epoch(s: Session, epoch: int) -> EpochResult:
    """Trains one epoch on this rank's shard; ends with identical weights on all ranks.
    A stop asked for on any rank ends it early, on every rank, after a checkpoint."""
    if s.ctx.size > 1:
        # Start every rank's epoch clock together: otherwise the ranks that do not
        # checkpoint would count rank 0's checkpoint writing (they wait for it in their
        # first allreduce) as training time, and one process would not.
        dist.barrier()
    result = EpochResult(epoch=epoch, start=time.perf_counter())
    _carry_over(s, epoch, result)
    first = s.start[1] if epoch == s.start[0] else 0
    traced = min(commtrace.TRACE_STEPS, s.schedule.steps - first)
    trace = start_trace(s, epoch) if traced > 0 else None
    for step in range(first, s.schedule.steps):
        if run_step(s, result, step) and step + 1 < s.schedule.steps:
            _stop_inside_epoch(s, result, step + 1)
        if trace and step + 1 - first == traced:
            dist.stop_timeline()
    steps.average_batchnorm(s.model, s.ctx.size)
    result.weights = steps.check_weights(f"after epoch {epoch}", s.synced)
    result.train_time = result.elapsed_before + time.perf_counter() - result.start
    if trace:
        read_trace(s, result, trace, traced)
    return result


def _shard_scores(s: Session) -> tuple[validation.Scores, Failure | None]:
    """This rank's validation scores, and its failure (shared by the caller)."""
    try:
        return validation.score(s.feed, s.reader, s.eval_step, s.predict, s.ctx.rank,
                                s.ctx.size), None
    except Exception as e:  # noqa: BLE001 - shared in the allreduce of ``validate``
        return validation.Scores.empty(s.cfg.model.num_classes), dist.failure_of(e)


def validate(s: Session) -> dict:
    """Collective: sharded validation, each rank scoring its own slices (or whole
    volumes) and one allreduce combining them (and telling every rank whether any rank
    failed)."""
    if not (s.cfg.train.validate and s.feed.val_count):
        return {"val_loss": None, "val_dice": {}, "val_dice_local": {}}
    mine, failure = _shard_scores(s)
    total = dist.allreduce(mine.packed(failure is not None), op="sum")
    totals = validation.Totals.unpack(total, s.cfg.model.num_classes)
    if totals.failed:
        dist.raise_agreed(failure)
    return validation.record(mine, totals, s.class_names, s.cfg.train.loss)


def finish_epoch(s: Session, result: EpochResult, val: dict,
                 choice: goodput.Choice | None = None) -> dict:
    """This rank's ``epoch`` record (with the batch policy's ``choice`` for the next
    epoch), returned as written; run under ``dist.agree``: a full disk on one rank stops
    every rank with the same message."""
    if result.failure:
        raise RunError(*result.failure)
    seen = np.concatenate(result.seen)
    return s.log.write("epoch", epoch=result.epoch, t=time.perf_counter() - s.t0,
                       epoch_time=result.epoch_time, train_time=result.train_time,
                       steps=s.schedule.steps, samples=len(seen),
                       sample_digest=schema.sample_digest(seen),
                       train_loss=float(np.mean(result.losses)),
                       train_loss_local=float(np.mean(result.losses_local)),
                       weight_checksum=result.weights, skipped_steps=result.skipped,
                       noise_scale=s.noise.record(), lr_rule=lr_rule_record(s),
                       **({} if s.policy is None else
                          {"batch_policy": s.policy.record(s.schedule.plan.per_rank, choice)}),
                       **({} if result.comm is None else {"comm": result.comm}),
                       **val)


def decide_batch(s: Session) -> goodput.Choice | None:
    """Collective under the ``goodput`` policy: rank 0's choice of the next epoch's
    per-rank batch, the same on every rank (None without the policy)."""
    if s.policy is None:
        return None
    avg = s.noise.averages["preconditioned"]
    mine = s.policy.decide(avg.g2, avg.trace) if s.ctx.is_root() else None
    return dist.broadcast_object(mine)


def switch_batch(s: Session, epoch: int) -> None:
    """Trains from ``epoch`` on with the policy's per-rank batch: its schedule, shards,
    traced step and noise-scale batch sizes; says so on rank 0."""
    schedule = Schedule.of(s.cfg.train, len(s.feed.train_ids), s.ctx.size, s.policy.per_rank)
    _use_schedule(s, schedule, (epoch, 0))
    s.noise.resize(schedule.plan.per_rank, schedule.plan.global_batch)
    if s.bar is not None:
        s.bar.total = s.bar.n + (s.cfg.train.epochs - epoch) * schedule.steps
        s.bar.write(f"batch policy: {schedule.plan.per_rank} per rank from epoch {epoch} "
                    f"(global {schedule.plan.global_batch}; {s.policy.last.reason})")


def lr_rule_record(s: Session) -> dict:
    """The ``lr_rule`` field of an ``epoch`` record: the rule, the lr in force, the gain of
    this run's global batch over the base batch, and the gain-weighted progress."""
    plan = s.schedule.plan
    return {"rule": plan.lr_scaling, "lr": s.lr_now, "gain": s.noise.gain(plan.global_batch),
            "progress": s.progress, "global_batch": plan.global_batch, "base_batch": plan.base}


def print_epoch(s: Session, result: EpochResult, val: dict) -> None:
    if s.bar is None:
        return
    dice = ", ".join(f"{k} {v:.3f}" for k, v in val["val_dice"].items() if v is not None)
    vloss = "n/a" if val["val_loss"] is None else f"{val['val_loss']:.4f}"
    s.bar.write(f"epoch {result.epoch}: {result.epoch_time:.1f} s, train loss "
                f"{np.mean(result.losses):.4f}, val loss {vloss}, val Dice {dice or 'n/a'}")


# --- the run ------------------------------------------------------------------------


def end_status(e: BaseException | None, epochs_done: int) -> tuple[str, str]:
    """(status, reason) of the ``end`` record for how the run stopped."""
    if e is None:
        return "ok", f"finished {epochs_done} epoch(s)"
    if isinstance(e, (Interrupted, KeyboardInterrupt)):
        return "interrupted", str(e) or "interrupted"
    if isinstance(e, RunError):
        return "error", str(e)
    return "error", f"{e.__class__.__name__}: {e}".splitlines()[0]


def _lost_ranks(s: Session, error: BaseException) -> str:
    """For a collective that failed because Horovod shut down (a rank was killed or
    exited): which ranks' logs stopped without an ending, in words."""
    if not dist.lost_peer(error):
        return ""
    time.sleep(0.5)  # let the surviving ranks write their own ending first
    paths = rundir.log_paths(s.cfg.run_dir, s.ctx.size)
    lost = stopping.silent_ranks(paths, s.ctx.rank)
    return (f"lost rank(s) {', '.join(map(str, lost))}: killed or exited without an end record; "
            if lost else "lost another rank: ")


def _write_end(s: Session | None, error: BaseException | None) -> None:
    """The ``end`` record, whatever happened (no log yet: nothing to write)."""
    if s is None or (s.elastic is not None and error is not None and dist.recoverable(error)):
        return  # an elastic run carries on with the ranks left (a `resume` record follows)
    status, reason = end_status(error, s.epochs_done)
    if error is not None and not isinstance(error, (RunError, Interrupted)):
        reason = _lost_ranks(s, error) + reason
    try:
        s.log.write("end", status=status, reason=reason, t=time.perf_counter() - s.t0,
                    epochs_done=s.epochs_done)
    except OSError:
        pass  # best effort: the disk that failed the run may refuse this line too


def train_epochs(s: Session) -> int:
    """The epoch loop; returns the number of epochs finished. A stop asked for during
    validation or the epoch's end takes effect here, after the epoch's checkpoint."""
    t = s.cfg.train
    for epoch in range(s.start[0], t.epochs):
        result = train_epoch(s, epoch)
        val = validate(s)
        result.epoch_time = result.elapsed_before + time.perf_counter() - result.start
        choice = decide_batch(s) if epoch + 1 < t.epochs else None
        record = dist.agree(finish_epoch, s, result, val, choice)
        s.epochs_done = epoch + 1
        if s.board is not None:
            s.board.epoch(record)  # collective: every rank's step times to rank 0
        print_epoch(s, result, val)
        if choice is not None and s.policy.take(choice):
            switch_batch(s, epoch + 1)
        stop = any(dist.allgather_object(s.stop.requested))
        if stop or checkpoint.is_due(s.epochs_done, t.epochs, t.checkpoint_every):
            checkpoint_now(s, result, 0)
        if s.elastic is not None and not stop:
            commit_elastic(s)
        if stop:
            raise Interrupted(f"{s.stop.reason or 'another rank was asked to stop'}; "
                              f"checkpoint after epoch {epoch}")
    return s.epochs_done


def commit_elastic(s: Session) -> None:
    """Collective: an elastic run's state after an epoch; raises Horovod's
    ``HostsUpdatedInterrupt`` on every rank when hosts were added or removed."""
    s.elastic.epoch = s.epochs_done
    s.elastic.size = s.ctx.size
    s.elastic.commit()


def launch(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed, state,
           resumed: resume.Resumed | None, threads: tuple[int, int],
           elastic: Any | None = None) -> int:
    """Trains from ``resumed`` (None: from the start) with the ranks of ``ctx``;
    returns 0. Writes the run's records and, whatever happens, its ``end``."""
    session, error = None, None
    # Closed in reverse order on the way out, whatever happens.
    with contextlib.ExitStack() as resources:
        try:
            session = open_session(cfg, ctx, feed, state, resumed, resources)
            session.elastic = elastic
            if resumed:
                write_resume_record(session)
            write_run_record(session, threads)
            train_epochs(session)
            return 0
        except BaseException as e:
            error = e
            raise
        finally:
            _write_end(session, error)


def run(cfg: config_lib.Config, resuming: bool = False) -> int:
    """Trains on every rank (``resuming``: continues the run in ``cfg.run_dir`` from its
    newest whole checkpoint); returns 0, or raises ``RunError`` / ``Interrupted``."""
    ctx = dist.init()
    threads = threads_lib.configure_threads(cfg.train, ctx.cores)
    if dist.is_elastic():
        # No collective before the elastic loop: a rank that joins later runs this alone.
        cfg = feeds.with_classes(cfg)  # the data file's classes, as check_inputs gives them
        state = build_state(cfg, ctx, feeds.input_shape(cfg), broadcast=False)
        elastic = dist.elastic_state(state[2], epoch=0, size=ctx.size, started=False)
        return dist.run_elastic(elastic_launch, elastic, cfg, resuming, state, threads)
    feed = dist.agree(check_inputs, cfg, ctx)
    cfg = feed.cfg  # with the data file's classes: what is built, trained and saved
    state, resumed = start_state(cfg, ctx, feed, resuming)
    return launch(cfg, ctx, feed, state, resumed, threads)


# --- elastic runs -------------------------------------------------------------------


def elastic_start(elastic: Any, cfg: config_lib.Config, ctx: dist.Context,
                  resuming: bool, state) -> resume.Resumed | None:
    """Collective: where this incarnation of an elastic run starts. The first one
    prepares the run directory (and loads a checkpoint when ``resuming``) exactly like
    a plain run; a later one, after a rank was lost or hosts changed, continues from
    the state committed after the last epoch, at the new size."""
    if not elastic.started:
        if resuming:
            resumed = resume.restore(ctx, cfg.run_dir, *state)
            resume.check_extends(resumed, cfg.train.epochs)
        else:
            resumed = None
        prepare_run_dir(cfg, ctx, resuming=resuming)
        elastic.started = True
        elastic.epoch = resumed.position.epoch if resumed else 0
        elastic.commit()  # a rank lost in the first epoch must not set up the run again
        return resumed
    position = checkpoint.Position(epoch=elastic.epoch, size=elastic.size)
    why = ("hosts changed" if elastic.size == ctx.size else
           f"{'lost' if ctx.size < elastic.size else 'gained'} "
           f"{abs(elastic.size - ctx.size)} rank(s)")
    return resume.Resumed(position=position, manifest=None, elastic=why)


def elastic_launch(elastic: Any, cfg: config_lib.Config, resuming: bool,
                   state, threads: tuple[int, int]) -> int:
    """One incarnation of an elastic run (``distributed.run_elastic`` calls it again
    after every membership change): the same checks and loop as a plain run, with the
    learning rate and shards of the current number of ranks."""
    ctx = dist.context()
    feed = dist.agree(check_inputs, cfg, ctx)
    resumed = elastic_start(elastic, cfg, ctx, resuming, state)
    return launch(cfg, ctx, feed, state, resumed, threads, elastic=elastic)
