"""Data-parallel training of the U-Net: one call, ``run(config)``, on every rank.

The Horovod recipe, with Keras 3 and the core ops of ``horovod.tensorflow``:
initialise and pin; scale the learning rate by the number of ranks with a warm-up;
average gradients with one grouped allreduce per step; broadcast rank 0's initial
state; checkpoint and print on rank 0 only; every rank logs its own measurements.

The loop conducts; its parts keep their own state. ``run`` reads like its outline:
start-up (``startup``), ``open_session``, then per epoch ``train_epoch`` ->
``validate`` -> the ``epoch`` record (``records``) -> the observers (``observers``) ->
the batch policy's switch -> ``close_epoch``. The parts that change the model are
called at the moments ``modelparts`` names, in its ``ORDER``. What changes with
progress is ``Session.training`` (``state.TrainingState``); the batches come from the
epoch plan (``plan``); the model and its steps from ``factory``. Every piece that can
fail on one rank alone goes through ``agreement.agree`` (or rides in a step's
allreduce), so all ranks stop together with the same message.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import numpy as np

from distseg.core import config as config_lib
from distseg.core.errors import Interrupted
from distseg.core.stopflag import StopFlag
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.parallel import threads as threads_lib
from distseg.training import records, stopping
from distseg.training.checkpoints import checkpoint, resume
from distseg.training.epoch import bestcheckpoint, modelparts, precisebn, weightema
from distseg.training.epoch import board as board_lib
from distseg.training.epoch.observers import Console, Timeline
from distseg.training.progress import noise
from distseg.training.progress.plan import PlannedBatches
from distseg.training.progress.state import TrainingState
from distseg.training.runlog import RunLog
from distseg.training.session import EpochResult, Session
from distseg.training.startup import elastic as elastic_lib
from distseg.training.startup import prepare
from distseg.training.step import factory, steps, validation

# --- the session: what the epochs of one launch share ------------------------------


def open_parts(s: Session) -> tuple:
    """The parts that change the model (``modelparts``): the average of the weights,
    precise BatchNorm, the best checkpoint's choice; in ``modelparts.ORDER``, each
    continuing what a resumed checkpoint kept of it."""
    t = s.cfg.train
    parts = modelparts.ordered(
        weightema.WeightAverage.open(t, s.model),
        precisebn.PreciseBatchNorm.open(t, s.model, s.feed.input_shape, s.batches.images,
                                        dist.allreduce_many, s.ctx.size),
        bestcheckpoint.BestDice.open(t, s.console))
    agreement.agree(modelparts.restore, parts, s.resumed.parts if s.resumed else None)
    return parts


def open_observers(s: Session, resources: contextlib.ExitStack) -> tuple:
    """The observers, in the order every rank calls them: the timeline (it stops
    Horovod's timeline after a step), TensorBoard (its epoch end is a collective), the
    console."""
    board = board_lib.open_board(s.cfg.run_dir, s.ctx, s.global_step, s.start_time,
                                 s.cfg.train.tensorboard, resources)
    timeline = Timeline(s.cfg.run_dir, s.ctx, s.origin[0])
    return tuple(o for o in (timeline, board, s.console) if o is not None)


def open_session(prepared: prepare.Prepared, ctx: dist.Context, feed: feeds.Feed,
                 resources: contextlib.ExitStack) -> Session:
    """Opens the reader and the log, starts the clock on an agreed barrier, routes the
    stop signals to a flag and starts the prefetcher. Everything opened is closed by
    ``resources``."""
    cfg, resumed = prepared.cfg, prepared.resumed
    model, optimizer, synced = prepared.state
    origin = (resumed.position.epoch, resumed.position.step) if resumed else (0, 0)
    training, global_step = TrainingState.for_launch(cfg.train, len(feed.train_ids), ctx.size,
                                                     resumed, origin)
    reader = resources.enter_context(agreement.agree(feed.open_reader))
    log = resources.enter_context(agreement.agree(RunLog, cfg.run_dir, ctx.rank))
    # Measured by start-up, before the compression was decided; an elastic run's here.
    measured = prepared.link if prepared.link is not None else prepare.measure_link(ctx)
    dist.barrier()  # the agreed start: every rank leaves this together
    t0 = time.perf_counter()
    start_time = dist.broadcast_object(time.time() if ctx.is_root() else None)
    stop = StopFlag()
    stopping.install(stop, resources, stopping.stop_signals(dist.is_elastic()))
    left = (cfg.train.epochs - origin[0]) * training.plan.steps - origin[1]
    shape, t = feed.input_shape, cfg.train
    s = Session(
        cfg=cfg, ctx=ctx, feed=feed, model=model, optimizer=optimizer, synced=synced,
        reader=reader, log=log, t0=t0, start_time=start_time, stop=stop, training=training,
        batches=resources.enter_context(contextlib.closing(PlannedBatches(
            reader, feed.train_ids, ctx.rank, ctx.size, t.epochs, t.seed, cfg.data.prefetch,
            factory.transform(cfg)))),
        train_steps=prepared.train_steps,
        eval_step=factory.eval_step(cfg, model, shape),
        predict=factory.predict_step(model, shape),
        console=Console.open(ctx, global_step + left, global_step, resources),
        resumed=resumed, origin=origin, global_step=global_step, epochs_done=origin[0], link=measured,
        precision=prepared.precision, lr_find=prepared.lr_find, compression=prepared.compression)
    use_plan(s, origin)
    s.parts = open_parts(s)
    s.observers = open_observers(s, resources)
    s.watch = stopping.watch_collectives(log, cfg.run_dir, ctx, t0, functools.partial(
        getattr, s, "epochs_done"), t.hang_timeout, resources)
    return s


def use_plan(s: Session, origin: tuple[int, int]) -> None:
    """Trains from (epoch, step) ``origin`` on with the plan in force: its batches and
    the train step traced for its batch."""
    s.batches.use(s.plan, origin)
    s.train_step = s.train_steps.for_batch(s.cfg, s.plan.static_batch(len(s.feed.train_ids),
                                                                       s.ctx.size))
    s.training.noise.gradients_per_rank = s.train_step.gradients_per_rank
    s.fresh = True


# --- one step -----------------------------------------------------------------------


def _next_batch(s: Session, result: EpochResult):
    """This rank's next batch; on a read error, a blank stand-in (so the rank still
    joins the step's allreduce, where every rank learns of the failure)."""
    try:
        return s.batches.next()
    except Exception as e:  # noqa: BLE001 - shared in the step's allreduce
        result.failure = result.failure or agreement.failure_of(e)
        # the size the step was traced for
        return factory.stand_in(s.cfg, s.feed.input_shape, s.plan.batch.per_rank)


def _step(s: Session, result: EpochResult, step: int, images, masks) -> steps.StepResult:
    """The train step, watched; this rank's failure and stop request ride in its
    allreduce. The first step of a launch, or at a new batch, also traces it."""
    flags = np.array([result.failure is not None, s.stop.requested], np.float32)
    s.watch.arm(f"the allreduce of epoch {result.epoch} step {step}", 10.0 if s.fresh else 1.0)
    out = s.train_step(images, masks, flags)
    s.watch.disarm()
    return out


def log_step(s: Session, result: EpochResult, fields: dict) -> None:
    """The ``step`` record, then the parts and the observers see it. A failed write is
    shared in the next step's allreduce, or at the epoch's end."""
    try:
        record = s.log.write("step", **fields)
    except OSError as e:
        result.failure = result.failure or agreement.failure_of(e)
        record = {"type": "step", **fields}
    for each in (*s.parts, *s.observers):
        each.on_step(record)


def run_step(s: Session, result: EpochResult, step: int) -> bool:
    """One training step on this rank, logged; raises on every rank together.
    Returns whether some rank asked to stop (every rank gets the same answer)."""
    step_start = time.perf_counter()
    ids, images, masks = _next_batch(s, result)
    data_wait = time.perf_counter() - step_start
    step_lr = s.training.set_lr(s.optimizer, s.global_step)
    mode = s.training.cadence.mode(s.global_step)
    steps.tell_noise_mode(s.train_step, mode)
    first, out = s.fresh, _step(s, result, step, images, masks)
    s.fresh = False
    failed, stop, nonfinite = steps.Flags.of(out.flags)
    if failed:
        agreement.raise_agreed(result.failure)
    loss_local, loss = float(out.loss_local), float(out.loss)
    measured = ({"grad_sq": np.asarray(out.grad_sq, np.float64).tolist()}
                if mode == noise.MEASURE else {})
    now = time.perf_counter()
    s.training.observe(measured.get("grad_sq"), applied=not nonfinite,
                       seconds=None if first else now - step_start, mode=mode)
    log_step(s, result, dict(epoch=result.epoch, step=step, global_step=s.global_step,
                             t=now - s.t0, step_time=now - step_start, data_wait=data_wait,
                             loss=loss, loss_local=loss_local, lr=step_lr, samples=len(ids),
                             **measured, **({"skipped": True} if nonfinite else {})))
    result.seen.append(ids)
    result.losses.append(loss)
    result.losses_local.append(loss_local)
    s.global_step += 1
    if nonfinite:  # decided from the allreduced flag: the same on every rank
        result.nonfinite(step, loss, s.cfg.train.on_nonfinite)
    if s.global_step == 1:  # BatchNorm statistics are still local here
        steps.check_weights("after the first step",
                            s.model.trainable_variables + s.optimizer.variables)
    return stop


# --- one epoch ----------------------------------------------------------------------


def checkpoint_now(s: Session, result: EpochResult, step: int) -> None:
    """Collective: a checkpoint ``step`` steps into ``result.epoch`` (0: at its end,
    after the BatchNorm averaging), holding every rank's partial epoch."""
    kept = modelparts.saved(s.parts)
    position = checkpoint.Position(
        epoch=result.epoch + (0 if step else 1), step=step, global_step=s.global_step,
        size=s.ctx.size, train_time=result.elapsed_before + time.perf_counter() - result.start,
        training=s.training.state(), parts=kept.states)
    seen, losses, local = ((result.seen, result.losses, result.losses_local) if step
                           else ([], [], []))
    mine = resume.rank_state(s.model, seen, losses, local)
    checkpoint.save(s.ctx, s.cfg.run_dir, position, s.model, s.optimizer, mine,
                    s.cfg.train.keep_checkpoints, kept.arrays)


def _stop_inside_epoch(s: Session, result: EpochResult, step: int):
    """Every rank: checkpoint the finished steps, then raise ``Interrupted``."""
    checkpoint_now(s, result, step)
    raise Interrupted(f"{s.stop.reason or 'another rank was asked to stop'}; checkpoint at "
                      f"epoch {result.epoch} step {step}")


def train_epoch(s: Session, epoch: int) -> EpochResult:
    """Trains one epoch on this rank's shard; ends with identical weights on all ranks.
    A stop asked for on any rank ends it early, on every rank, after a checkpoint."""
    if s.ctx.size > 1:
        # Start every rank's epoch clock together: otherwise the ranks that do not
        # checkpoint would count rank 0's checkpoint writing (they wait for it in their
        # first allreduce) as training time, and one process would not.
        dist.barrier()
    result = EpochResult.begin(epoch, s.resumed, s.origin)
    first = s.origin[1] if epoch == s.origin[0] else 0
    for each in (*s.parts, *s.observers):
        each.on_epoch_start(epoch, s.plan.steps - first)
    for step in range(first, s.plan.steps):
        if run_step(s, result, step) and step + 1 < s.plan.steps:
            _stop_inside_epoch(s, result, step + 1)
    steps.average_batchnorm(s.model, s.ctx.size)
    result.weights = steps.check_weights(f"after epoch {epoch}", s.synced)
    result.train_time = result.elapsed_before + time.perf_counter() - result.start
    for part in s.parts:
        part.before_validation()
    for observer in s.observers:
        observer.on_epoch_trained()
    return result


def validate(s: Session) -> dict:
    """Collective: sharded validation, each rank scoring its own slices (or whole
    volumes) and one allreduce combining them (and telling every rank whether any rank
    failed)."""
    if not (s.cfg.train.validate and s.feed.val_count):
        return {"val_loss": None, "val_dice": {}, "val_dice_local": {}}
    mine, failure = validation.shard_scores(s.cfg, s.feed, s.reader, s.eval_step, s.predict,
                                            s.ctx.rank, s.ctx.size)
    total = dist.allreduce(mine.packed(failure is not None), op="sum")
    totals = validation.Totals.unpack(total, s.cfg.model.num_classes)
    if totals.failed:
        agreement.raise_agreed(failure)
    return validation.record(mine, totals, s.class_names, s.cfg.train.loss)


def decide_batch(s: Session):
    """Collective under the ``goodput`` policy: rank 0's choice of the next epoch's
    per-rank batch, the same on every rank (None without the policy)."""
    if s.training.policy is None:
        return None
    return dist.broadcast_object(s.training.decide() if s.ctx.is_root() else None)


def decide_cadence(s: Session) -> None:
    """Collective under ``--noise-every auto``, at the first epoch's end where both kinds
    of step have been timed (the same epoch on every rank: they time the same steps):
    the cadence of rank 0's medians, taken by every rank; says so on rank 0."""
    cadence = s.training.cadence
    if not cadence.ready:
        return
    medians = dist.broadcast_object(cadence.medians() if s.ctx.is_root() else None)
    cadence.decide(*medians, s.global_step)
    s.console.say(cadence.said())


def switch_batch(s: Session, epoch: int) -> None:
    """Trains from ``epoch`` on with the batch the policy took; says so on rank 0."""
    use_plan(s, (epoch, 0))
    batch = s.plan.batch
    s.console.set_left((s.cfg.train.epochs - epoch) * s.plan.steps)
    s.console.say(f"batch policy: {batch.per_rank} per rank from epoch {epoch} "
                  f"(global {batch.global_batch}; {s.training.policy.last.reason})")


def close_epoch(s: Session, result: EpochResult, epoch: int) -> None:
    """Collective: the epoch's checkpoint when due or when some rank was asked to stop,
    the parts' return to training, an elastic run's commit, then the stop."""
    t = s.cfg.train
    stop = any(dist.allgather_object(s.stop.requested))
    if stop or checkpoint.is_due(s.epochs_done, t.epochs, t.checkpoint_every):
        checkpoint_now(s, result, 0)
    for part in s.parts:
        part.after_checkpoint()
    for observer in s.observers:
        observer.on_epoch_closed()
    if s.elastic is not None and not stop:
        elastic_lib.commit(s.elastic, s.epochs_done, s.ctx.size)
    if stop:
        raise Interrupted(f"{s.stop.reason or 'another rank was asked to stop'}; "
                          f"checkpoint after epoch {epoch}")


def train_epochs(s: Session) -> int:
    """The epoch loop; returns the number of epochs finished. A stop asked for during
    validation or the epoch's end takes effect here, after the epoch's checkpoint."""
    epochs = s.cfg.train.epochs
    for epoch in range(s.origin[0], epochs):
        result = train_epoch(s, epoch)
        val = validate(s)
        result.epoch_time = result.elapsed_before + time.perf_counter() - result.start
        choice = decide_batch(s) if epoch + 1 < epochs else None
        decide_cadence(s)
        record = agreement.agree(records.epoch_record, s, result, val, choice)
        s.epochs_done = epoch + 1
        for observer in s.observers:  # TensorBoard's is a collective: every rank, in order
            observer.on_epoch_end(record)
        for part in s.parts:  # the best checkpoint's choice: its line follows the epoch's
            part.before_checkpoint(record)
        if s.training.take(choice, s.cfg.train):
            switch_batch(s, epoch + 1)
        close_epoch(s, result, epoch)
    return s.epochs_done


# --- the run ------------------------------------------------------------------------


def launch(prepared: prepare.Prepared, ctx: dist.Context, feed: feeds.Feed,
           threads: tuple[int, int], elastic: Any | None = None) -> int:
    """Trains from what start-up ``prepared`` (its checkpoint, or the beginning) with
    the ranks of ``ctx``; returns 0. Writes the run's records and, whatever happens, its
    ``end``."""
    session, error = None, None
    # Closed in reverse order on the way out, whatever happens.
    with contextlib.ExitStack() as resources:
        try:
            session = open_session(prepared, ctx, feed, resources)
            session.elastic = elastic
            if prepared.resumed:
                records.write_resume_record(session)
            records.write_run_record(session, threads)
            records.say_lr_found(session)
            train_epochs(session)
            return 0
        except BaseException as e:
            error = e
            raise
        finally:
            records.write_end(session, error)


def run(cfg: config_lib.Config, resuming: bool = False) -> int:
    """Trains on every rank (``resuming``: continues the run in ``cfg.run_dir`` from its
    newest whole checkpoint); returns 0, or raises ``RunError`` / ``Interrupted``."""
    ctx = dist.init()
    threads = threads_lib.configure_threads(cfg.train, ctx.cores)
    if dist.is_elastic():
        return elastic_lib.run(cfg, ctx, resuming, threads, launch)
    # With the data file's classes: what is built, trained and saved.
    cfg, feed = agreement.agree(prepare.check_inputs, cfg, ctx)
    return launch(prepare.prepare(cfg, ctx, feed, resuming), ctx, feed, threads)
