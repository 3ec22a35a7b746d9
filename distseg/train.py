"""Data-parallel training of the 2D U-Net: one call, ``run(config)``, on every rank.

The Horovod recipe, with Keras 3 and the core ops of ``horovod.tensorflow``:
initialise and pin; scale the learning rate by the number of ranks with a warm-up;
average gradients with one grouped allreduce per step; broadcast rank 0's initial
state; checkpoint and print on rank 0 only; every rank logs its own measurements.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
import uuid

import numpy as np

from distseg import config as config_lib
from distseg import data, distributed as dist, schema
from distseg.runlog import RunLog


class RunError(RuntimeError):
    """A problem every rank agreed on; the message is one line for people."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(RuntimeError):
    pass


def scaled_lr(lr: float, size: int, scaling: str) -> float:
    """Learning rate for ``size`` ranks: lr*size (linear, Goyal et al. 2017),
    lr*sqrt(size) (sqrt) or lr (none)."""
    factor = {"linear": float(size), "sqrt": math.sqrt(size), "none": 1.0}[scaling]
    return lr * factor


def lr_at(step: int, base: float, target: float, warmup_steps: int) -> float:
    """Linear warm-up from the single-process ``base`` to the scaled ``target``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base + (target - base) * step / warmup_steps


def resolve_threads(train_cfg, cores: int) -> tuple[int, int]:
    """(intra_op, inter_op) threads: flags, else OMP_NUM_THREADS, else cores per rank."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    intra = train_cfg.intra_op_threads or (int(omp) if omp.isdigit() and int(omp) > 0 else cores)
    inter = train_cfg.inter_op_threads or config_lib.default_inter_op_threads(cores)
    return max(1, intra), max(1, inter)


def _check_inputs(cfg: config_lib.Config, ctx: dist.Context) -> data.DatasetInfo:
    """Everything that can be wrong before training starts, checked without side effects."""
    # Rank 0 reads every mask once to check the labels; the others trust its verdict.
    info = data.inspect(cfg.data.path, check_labels=ctx.is_root())
    data.check_fit(info, ranks=ctx.size, batch_size=cfg.train.batch_size,
                   image_size=cfg.model.image_size, resize=cfg.data.resize,
                   num_classes=cfg.model.num_classes)
    return info


def _refuse_existing_run(run_dir: str, ctx: dist.Context) -> None:
    """Refuses a directory that already holds a run (checked by rank 0 alone)."""
    found = schema.existing_run(run_dir) if ctx.is_root() else None
    if found:
        raise RunError(f"{run_dir}: already holds a run ({found} exists); "
                       "choose a new --run-dir", exit_code=2)


def _probe_writable(run_dir: str, ctx: dist.Context) -> None:
    """Checks that every rank can create and write its log directory."""
    logs = os.path.join(run_dir, schema.LOG_DIR)
    probe = os.path.join(logs, f".probe-{ctx.rank}-{os.getpid()}")
    try:
        os.makedirs(logs, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise RunError(f"{run_dir}: run directory is not writable ({e.strerror})", exit_code=2)


def _failure(e: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) for an error raised on this rank: 2 for bad input
    (data file, config, run directory), 1 for anything else."""
    if isinstance(e, RunError):
        return str(e), e.exit_code
    if isinstance(e, (ValueError, OSError)) and str(e):
        return str(e).splitlines()[0], 2
    return f"{type(e).__name__}: {e}".splitlines()[0], 1


def _raise_agreed(failure: tuple[str, int] | None) -> None:
    """Collective: every rank raises the same ``RunError`` if any rank has a failure."""
    agreed = dist.first_error(*failure) if failure else dist.first_error(None)
    if agreed:
        raise RunError(*agreed)


def _agree(fn, *args, **kwargs):
    """Runs ``fn`` on every rank; if it fails on any rank, with any exception, every
    rank raises the same ``RunError`` (a rank must never fail alone: the others would
    hang in the next collective). One allgather."""
    result, failure = None, None
    try:
        result = fn(*args, **kwargs)
    except Interrupted:
        raise
    except Exception as e:  # noqa: BLE001 - every error is shared, then re-raised as RunError
        failure = _failure(e)
    _raise_agreed(failure)
    return result


def _write_json_atomic(path: str, obj) -> None:
    import json
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def run(cfg: config_lib.Config) -> int:
    """Trains on every rank; returns 0, or raises ``RunError`` / ``Interrupted``."""
    ctx = dist.init()
    intra, inter = resolve_threads(cfg.train, ctx.cores)
    os.environ.setdefault("OMP_NUM_THREADS", str(intra))
    import tensorflow as tf  # after dist.init(): threads must be set before first use
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # TF already running in this process (a second run in tests)
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
    import keras

    from distseg import model as model_lib

    info = _agree(_check_inputs, cfg, ctx)
    # Two agreed phases: no rank may create logs/ before rank 0 has looked for a
    # previous run there (a fast rank 1 once made rank 0 refuse a fresh directory).
    _agree(_refuse_existing_run, cfg.run_dir, ctx)
    _agree(_probe_writable, cfg.run_dir, ctx)

    cfg_dict = cfg.to_dict()
    cfg_hash = schema.config_hash(cfg_dict)

    def write_config():
        # Chief-only side effect: one config per run, written before any rank logs.
        if ctx.is_root():
            _write_json_atomic(os.path.join(cfg.run_dir, schema.CONFIG_FILE), cfg_dict)
            os.makedirs(os.path.join(cfg.run_dir, schema.CHECKPOINT_DIR), exist_ok=True)
    _agree(write_config)

    t = cfg.train
    keras.utils.set_random_seed(t.seed + ctx.rank)
    model = model_lib.from_config(cfg.model)
    optimizer = keras.optimizers.Adam(learning_rate=t.lr)
    optimizer.build(model.trainable_variables)
    # What every rank must hold identically: weights (BatchNorm statistics included)
    # and optimizer state. Not model.variables: that also holds the dropout layers'
    # seed-generator states, which must stay different per rank (seeded by rank above)
    # or every rank would drop the same units.
    synced = model.weights + optimizer.variables
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    dist.broadcast_variables(synced, root=0)

    n_train = len(info.train_indices)
    steps = schema.steps_per_epoch(n_train, ctx.size, t.batch_size)
    if t.max_steps_per_epoch:
        steps = min(steps, t.max_steps_per_epoch)
    lr_target = scaled_lr(t.lr, ctx.size, t.lr_scaling)
    warmup_steps = int(round(t.warmup_epochs * steps))
    run_id = dist.broadcast_object(uuid.uuid4().hex[:12] if ctx.is_root() else None)

    size = cfg.model.image_size
    num_classes = cfg.model.num_classes
    spec = [tf.TensorSpec([None, size, size, 1], tf.float32), tf.TensorSpec([None, size, size], tf.uint8)]

    @tf.function(input_signature=spec + [tf.TensorSpec([], tf.float32)])
    def train_step(images, masks, failed):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss = model_lib.segmentation_loss(probs, masks, num_classes, t.loss)
        grads = tape.gradient(loss, model.trainable_variables)
        # Horovod: average gradients, the loss (for logging) and the failure flag (so a
        # rank whose batch could not be read is known to all) in one allreduce.
        grads, (mean_loss, any_failed) = dist.average_gradients(grads, [loss, failed])
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, mean_loss, any_failed

    @tf.function(input_signature=spec)
    def eval_step(images, masks):
        probs = model(images, training=False)
        loss = model_lib.segmentation_loss(probs, masks, num_classes, t.loss)
        return loss, model_lib.dice_counts(probs, masks, num_classes)

    def checksum(variables) -> list[float]:
        """Sum and sum of squares of every value, in float64, one variable at a time
        (never a float64 copy of the whole model and optimizer state at once)."""
        sums = [tf.stack([tf.reduce_sum(x), tf.reduce_sum(x * x)])
                for x in (tf.cast(tf.convert_to_tensor(v), tf.float64) for v in variables)]
        return [float(x) for x in tf.add_n(sums)]

    def check_weights(where: str, variables) -> list[float]:
        """Aborts on every rank if any rank's weights differ from rank 0's."""
        mine = checksum(variables)
        diverged = dist.find_divergence(mine)
        if diverged:
            r, other, ref, rel = diverged
            raise RunError(f"ranks diverged {where}: rank {r}'s weight checksum {other} differs "
                           f"from rank 0's {ref} (relative {rel:.2e}); check that every rank "
                           "runs the same code, data file and config")
        return mine

    class_names = list(info.attrs.get("class_names", config_lib.CLASS_NAMES))[:num_classes]
    params = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    # Stands in for a batch this rank could not read, so that it still joins the
    # step's allreduce and every rank learns of the failure there.
    blank = (np.zeros((1, size, size, 1), np.float32), np.zeros((1, size, size), np.uint8))

    epochs_done, global_step, t0 = 0, 0, time.perf_counter()
    status, reason = "error", "unknown"
    log = None
    # Closed in reverse order on the way out, whatever happens.
    resources = contextlib.ExitStack()
    try:
        reader = resources.enter_context(
            _agree(data.SliceReader, cfg.data.path, image_size=size, resize=cfg.data.resize))
        log = resources.enter_context(_agree(RunLog, cfg.run_dir, ctx.rank))

        dist.barrier()  # the agreed start: every rank leaves this together
        t0 = time.perf_counter()
        start_time = dist.broadcast_object(time.time() if ctx.is_root() else None)

        def on_term(signum, frame):
            raise Interrupted(f"received signal {signum}")
        resources.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, on_term))

        bar = None
        if ctx.is_root():
            from tqdm import tqdm
            bar = tqdm(total=t.epochs * steps, unit="step", file=sys.stderr, dynamic_ncols=True,
                       mininterval=0.5, desc=f"train x{ctx.size}")
            resources.callback(bar.close)
        versions = dist.versions()
        _agree(lambda: log.write(
            "run", schema_version=schema.SCHEMA_VERSION, size=ctx.size, local_rank=ctx.local_rank,
            local_size=ctx.local_size, host=versions["host"], pid=os.getpid(), run_id=run_id,
            start_time=start_time, versions=versions, controller=ctx.controller,
            threads={"intra_op": intra, "inter_op": inter, "cores": ctx.cores, "pinned": ctx.pinned,
                     "affinity": sorted(os.sched_getaffinity(0))},
            horovod_env={k: v for k, v in os.environ.items()
                         if k.startswith("HOROVOD_") or k in dist.OMPI_DEFAULTS},
            config_hash=cfg_hash, model={"name": "unet2d", "params": params, **cfg.model.__dict__},
            dataset=info.summary(), global_seed=t.seed, steps_per_epoch=steps,
            batch_size=t.batch_size, global_batch_size=t.batch_size * ctx.size,
            lr_base=t.lr, lr_scaled=lr_target, warmup_steps=warmup_steps, epochs=t.epochs))

        def all_batches():
            for e in range(t.epochs):
                yield from data.shard_batches(info.train_indices, ctx.rank, ctx.size,
                                              t.batch_size, e, t.seed)[:steps]
        # One prefetcher for the whole run: it reads the next epoch's first batches
        # while this epoch ends, instead of refilling its queue at every epoch start.
        feed = data.Prefetcher(reader, all_batches(), depth=cfg.data.prefetch)
        resources.callback(feed.close)
        it = iter(feed)
        # This rank's first error inside the loop. It is not raised here, alone: it
        # rides on the next collective, where every rank raises it together.
        failure: tuple[str, int] | None = None
        lr_now = None
        for epoch in range(t.epochs):
            if ctx.size > 1:
                # Start every rank's epoch clock together: otherwise the ranks that do
                # not checkpoint would count rank 0's checkpoint writing (they wait for
                # it in their first allreduce) as training time, and one process
                # would not.
                dist.barrier()
            epoch_start = time.perf_counter()
            seen: list[np.ndarray] = []
            losses, losses_local = [], []
            for step in range(steps):
                step_start = time.perf_counter()
                try:
                    ids, images, masks = next(it)
                except Exception as e:  # noqa: BLE001 - shared in the allreduce below
                    failure = failure or _failure(e)
                    ids, (images, masks) = np.zeros(0, np.int64), blank
                data_wait = time.perf_counter() - step_start
                lr = lr_at(global_step, t.lr, lr_target, warmup_steps)
                if lr != lr_now:  # changes during warm-up only
                    optimizer.learning_rate.assign(lr)
                    lr_now = lr
                loss_local, loss, any_failed = train_step(images, masks, float(failure is not None))
                if float(any_failed) > 0:
                    _raise_agreed(failure)
                loss_local, loss = float(loss_local), float(loss)
                now = time.perf_counter()
                try:
                    log.write("step", epoch=epoch, step=step, global_step=global_step,
                              t=now - t0, step_time=now - step_start, data_wait=data_wait,
                              loss=loss, loss_local=loss_local, lr=lr, samples=len(ids))
                except OSError as e:  # shared in the next step's allreduce, or at epoch end
                    failure = failure or _failure(e)
                seen.append(ids)
                losses.append(loss)
                losses_local.append(loss_local)
                global_step += 1
                if not math.isfinite(loss):  # the averaged loss: the same on every rank
                    raise RunError(f"training loss is {loss} at epoch {epoch} step {step}; "
                                   "lower --lr or check the data")
                if global_step == 1:  # BatchNorm statistics are still local here
                    check_weights("after the first step",
                                  model.trainable_variables + optimizer.variables)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)

            # BatchNorm statistics are updated from local batches: average them so
            # every rank evaluates and checkpoints the same model.
            stats = list(model.non_trainable_weights)
            if stats and ctx.size > 1:
                for v, mean in zip(stats, dist.allreduce_many([v.numpy() for v in stats])):
                    v.assign(mean)
            weights = check_weights(f"after epoch {epoch}", synced)
            train_time = time.perf_counter() - epoch_start

            val = {"val_loss": None, "val_dice": {}, "val_dice_local": {}}
            if t.validate and len(info.val_indices):
                val = _validate(eval_step, reader, info.val_indices, ctx, t.batch_size,
                                num_classes, class_names)
            epoch_time = time.perf_counter() - epoch_start
            seen_ids = np.concatenate(seen)

            def finish_epoch():
                # Rank-local writes, agreed on: a full disk on one rank, or rank 0's
                # checkpoint failing, stops every rank with the same message.
                if failure:
                    raise RunError(*failure)
                log.write("epoch", epoch=epoch, t=time.perf_counter() - t0, epoch_time=epoch_time,
                          train_time=train_time, steps=steps, samples=len(seen_ids),
                          sample_digest=schema.sample_digest(seen_ids),
                          train_loss=float(np.mean(losses)),
                          train_loss_local=float(np.mean(losses_local)),
                          weight_checksum=weights, **val)
                done = epoch + 1
                if ctx.is_root() and (done == t.epochs or
                                      (t.checkpoint_every and done % t.checkpoint_every == 0)):
                    _save_checkpoint(cfg.run_dir, done, model, optimizer, t.keep_checkpoints)
            _agree(finish_epoch)
            epochs_done = epoch + 1
            if bar is not None:
                dice = ", ".join(f"{k} {v:.3f}" for k, v in val["val_dice"].items() if v is not None)
                vloss = "n/a" if val["val_loss"] is None else f"{val['val_loss']:.4f}"
                bar.write(f"epoch {epoch}: {epoch_time:.1f} s, train loss {np.mean(losses):.4f}, "
                          f"val loss {vloss}, val Dice {dice or 'n/a'}")
        status, reason = "ok", f"finished {epochs_done} epoch(s)"
        return 0
    except RunError as e:
        status, reason = "error", str(e)
        raise
    except (Interrupted, KeyboardInterrupt) as e:
        status, reason = "interrupted", str(e) or "interrupted"
        raise
    except Exception as e:
        status, reason = "error", f"{e.__class__.__name__}: {e}".splitlines()[0]
        raise
    finally:
        try:
            if log is not None:
                log.write("end", status=status, reason=reason, t=time.perf_counter() - t0,
                          epochs_done=epochs_done)
        except OSError:
            pass  # best effort: the disk that failed the run may refuse this line too
        finally:
            resources.close()


def _validate(eval_step, reader, indices, ctx, batch_size, num_classes, class_names) -> dict:
    """Sharded validation: each rank scores its own slices, one allreduce combines them
    (and tells every rank whether any rank failed to read its slices)."""
    from distseg import model as model_lib
    loss_sum, n = 0.0, 0
    counts = np.zeros((3, num_classes))
    failure = None
    try:
        for ids in data.shard_eval(indices, ctx.rank, ctx.size, batch_size):
            images, masks = reader.read(ids)
            loss, c = eval_step(images, masks)
            loss_sum += float(loss) * len(ids)
            n += len(ids)
            counts += c.numpy()
    except Exception as e:  # noqa: BLE001 - shared in the allreduce below
        failure = _failure(e)
    local = np.concatenate([[loss_sum, n, failure is not None], counts.ravel()])
    total = dist.allreduce(local, op="sum")
    if total[2] > 0:
        _raise_agreed(failure)
    g_counts = total[3:].reshape(3, num_classes)
    return {
        "val_loss": float(total[0] / max(total[1], 1)),
        "val_loss_local": loss_sum / n if n else None,
        "val_samples_local": n,
        "val_samples": int(total[1]),
        "val_dice": dict(zip(class_names, model_lib.dice_from_counts(g_counts))),
        "val_dice_local": dict(zip(class_names, model_lib.dice_from_counts(counts) if n else
                                   [None] * num_classes)),
    }


def _save_checkpoint(run_dir, epoch, model, optimizer, keep) -> None:
    """Rank 0 only: weights and optimizer state, written atomically, last ``keep`` kept."""
    ckdir = os.path.join(run_dir, schema.CHECKPOINT_DIR)
    stem = os.path.join(ckdir, f"epoch-{epoch:04d}")
    tmp_w = f"{stem}.tmp.weights.h5"
    model.save_weights(tmp_w)
    os.replace(tmp_w, f"{stem}.weights.h5")
    tmp_o = f"{stem}.tmp.optimizer.npz"
    with open(tmp_o, "wb") as f:
        np.savez(f, *[v.numpy() for v in optimizer.variables])
    os.replace(tmp_o, f"{stem}.optimizer.npz")
    _write_json_atomic(os.path.join(ckdir, "latest.json"),
                       {"epoch": epoch, "weights": os.path.basename(stem) + ".weights.h5",
                        "optimizer": os.path.basename(stem) + ".optimizer.npz"})
    stems = sorted({f.split(".")[0] for f in os.listdir(ckdir) if f.startswith("epoch-")})
    for old in stems[:-keep]:
        for suffix in (".weights.h5", ".optimizer.npz"):
            path = os.path.join(ckdir, old + suffix)
            if os.path.exists(path):
                os.remove(path)
