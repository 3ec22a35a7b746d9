"""The records a launch writes to this rank's log (schema in ``distseg.core.schema``):
``run`` and ``resume`` at its start, ``epoch`` after each epoch, ``end`` whatever
happens. ``epoch_record`` is the one place that gathers an epoch's fields: what the
epoch measured, the validation, the training state's (``TrainingState.epoch_fields``),
the model parts' and the observers' (``epoch_fields`` of each)."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np

from distseg.core import rundir, schema
from distseg.core.errors import Interrupted, RunError
from distseg.networks import models
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training import stopping
from distseg.training.session import EpochResult, Session
from distseg.training.startup import compression
from distseg.training.step import steps


def write_run_record(s: Session, threads: tuple[int, int]) -> None:
    """Collective: the ``run`` record on every rank (run id and start time agreed)."""
    ctx, cfg, t, batch = s.ctx, s.cfg, s.cfg.train, s.plan.batch
    run_id = dist.broadcast_object(uuid.uuid4().hex[:12] if ctx.is_root() else None)
    versions = dist.versions()
    params = compression.params_of(s.model)
    record = agreement.agree(
        s.log.write, "run", schema_version=schema.SCHEMA_VERSION, size=ctx.size,
        local_rank=ctx.local_rank, local_size=ctx.local_size, host=versions["host"],
        pid=os.getpid(), run_id=run_id, start_time=s.start_time, versions=versions,
        controller=ctx.controller,
        threads={"intra_op": threads[0], "inter_op": threads[1], "cores": ctx.cores,
                 "pinned": ctx.pinned, "affinity": sorted(os.sched_getaffinity(0))},
        horovod_env={k: v for k, v in os.environ.items()
                     if k.startswith("HOROVOD_") or k in dist.OMPI_DEFAULTS},
        config_hash=schema.config_hash(cfg.to_dict()),
        model={"name": models.describe(cfg.model), "params": params,
               "input_shape": list(s.feed.input_shape), **cfg.model.__dict__},
        voxels_per_sample=int(np.prod(s.feed.input_shape)), onednn=steps.onednn_enabled(),
        dataset=s.feed.summary(), global_seed=t.seed, steps_per_epoch=s.plan.steps,
        batch_size=batch.per_rank, global_batch_size=batch.global_batch,
        batch_plan=batch.kind, loss_scope="global_batch", lr_scaling=batch.lr_scaling,
        lr_base=t.lr, lr_scaled=s.plan.lr_target, warmup_steps=s.plan.warmup_steps,
        lr_schedule=t.lr_schedule, **({'lr_find': s.lr_find} if s.lr_find else {}),
        epochs=t.epochs, link=s.link, augment=cfg.data.augment,
        precision=s.precision or {"requested": cfg.model.precision, "choice": cfg.model.precision},
        compression_decision=s.compression or compression.given(cfg))
    for observer in s.observers:
        observer.on_run(record)


def say_lr_found(s: Session) -> None:
    """Rank 0's console line on ``--lr auto``'s range test."""
    f = s.lr_find
    if f:
        s.console.say(f"lr auto: {f['lr']:.3g} from a range test of {f['steps']} steps "
                      f"({f['seconds']:.1f} s): {f['why']}")


def write_resume_record(s: Session) -> None:
    """Collective: the ``resume`` record that opens a resumed launch's lines; rank 0 says
    where it resumes from."""
    r = s.resumed
    agreement.agree(s.log.write, "resume", from_epoch=s.origin[0], from_step=s.origin[1],
                    global_step=s.global_step, checkpoint=r.manifest,
                    size_before=r.position.size, size=s.ctx.size, warnings=r.warnings,
                    **({"elastic": r.elastic} if r.elastic else {}))
    for w in r.warnings:
        s.console.say(f"warning: {w}")
    where = r.manifest or f"the elastic state ({r.elastic})"
    s.console.say(f"resuming from {where}: epoch {s.origin[0]}, step {s.origin[1]}, "
                  f"{r.position.size} -> {s.ctx.size} rank(s)")


def epoch_record(s: Session, result: EpochResult, val: dict, choice=None) -> dict:
    """This rank's ``epoch`` record (with the batch policy's ``choice`` for the next
    epoch), returned as written; run under ``agreement.agree``: a full disk on one rank
    stops every rank with the same message."""
    if result.failure:
        raise RunError(*result.failure)
    seen = np.concatenate(result.seen)
    observed = {k: v for o in (*s.parts, *s.observers) for k, v in o.epoch_fields().items()}
    return s.log.write("epoch", epoch=result.epoch, t=time.perf_counter() - s.t0,
                       epoch_time=result.epoch_time, train_time=result.train_time,
                       steps=s.plan.steps, samples=len(seen),
                       sample_digest=schema.sample_digest(seen),
                       train_loss=float(np.mean(result.losses)),
                       train_loss_local=float(np.mean(result.losses_local)),
                       weight_checksum=result.weights, skipped_steps=result.skipped,
                       **s.training.epoch_fields(s.plan.batch.per_rank, choice), **observed, **val)


def end_status(e: BaseException | None, epochs_done: int) -> tuple[str, str]:
    """(status, reason) of the ``end`` record for how the run stopped."""
    if e is None:
        return "ok", f"finished {epochs_done} epoch(s)"
    if isinstance(e, (Interrupted, KeyboardInterrupt)):
        return "interrupted", str(e) or "interrupted"
    if isinstance(e, RunError):
        return "error", str(e)
    return "error", f"{e.__class__.__name__}: {e}".splitlines()[0]


def lost_ranks(s: Session, error: BaseException) -> str:
    """For a collective that failed because Horovod shut down (a rank was killed or
    exited): which ranks' logs stopped without an ending, in words."""
    if not dist.lost_peer(error):
        return ""
    time.sleep(0.5)  # let the surviving ranks write their own ending first
    paths = rundir.log_paths(s.cfg.run_dir, s.ctx.size)
    lost = stopping.silent_ranks(paths, s.ctx.rank)
    return (f"lost rank(s) {', '.join(map(str, lost))}: killed or exited without an end record; "
            if lost else "lost another rank: ")


def write_end(s: Session | None, error: BaseException | None) -> None:
    """The ``end`` record, whatever happened (no log yet: nothing to write)."""
    if s is None or (s.elastic is not None and error is not None and dist.recoverable(error)):
        return  # an elastic run carries on with the ranks left (a `resume` record follows)
    status, reason = end_status(error, s.epochs_done)
    if error is not None and not isinstance(error, (RunError, Interrupted)):
        reason = lost_ranks(s, error) + reason
    try:
        s.log.write("end", status=status, reason=reason, t=time.perf_counter() - s.t0,
                    epochs_done=s.epochs_done)
    except OSError:
        pass  # best effort: the disk that failed the run may refuse this line too
