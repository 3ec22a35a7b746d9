"""Real Horovod ranks: collectives, averaged training, and a full training run.

Each rank is given different values (seeds, data) and the tests assert that the ranks
agree after synchronisation, and that they would not without it.
"""

import glob
import json
import os

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.core import rundir, schema
from distseg.core.errors import RunError
from distseg.data import sharding, synth
from distseg.data import slices as data
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.step import steps

pytestmark = pytest.mark.timeout(300)


def test_collectives(ctx):
    # Every collective first, every assertion after: an assertion that failed on one
    # rank between two collectives would leave the other rank waiting in the second.
    got = (dist.allreduce([ctx.rank, 1.0], op="sum").tolist(),
           float(dist.allreduce([float(ctx.rank)], op="mean")[0]),
           dist.allgather_object(ctx.rank * 10),
           dist.broadcast_object("from root" if ctx.is_root() else None))
    assert got == ([sum(range(ctx.size)), ctx.size], pytest.approx((ctx.size - 1) / 2),
                   [r * 10 for r in range(ctx.size)], "from root")


def test_an_error_on_one_rank_is_the_same_error_on_all(ctx):
    last = ctx.size - 1
    mine = "data.h5: missing dataset 'masks'" if ctx.rank == last else None
    one = agreement.first_error(mine, code=2)
    none = agreement.first_error(None)
    # two ranks fail: the lowest rank's message, the highest exit code
    two = agreement.first_error(f"error on rank {ctx.rank}", code=1 + ctx.rank)
    everyone = dist.allgather_object((one, none, two))
    assert everyone == [(
        (f"data.h5: missing dataset 'masks' [rank {last}]", 2), None,
        (f"error on rank 0 [rank 0 (and {ctx.size - 1} other rank(s))]", ctx.size),
    )] * ctx.size


def _fails_on_last_rank(rank, size):
    if rank == size - 1:
        raise KeyError("spacing")
    return "fine"


def test_any_exception_on_one_rank_fails_every_rank(ctx):
    """Not only the expected error types: a KeyError on one rank must not leave the
    others waiting in the next collective."""
    try:
        agreement.agree(_fails_on_last_rank, ctx.rank, ctx.size)
        raised = None
    except RunError as e:
        raised = (str(e), e.exit_code)
    passed = agreement.agree(lambda: ctx.rank)
    everyone = dist.allgather_object((raised, passed))
    assert everyone == [((f"KeyError: 'spacing' [rank {ctx.size - 1}]", 1), r)
                        for r in range(ctx.size)]


def test_divergence_is_found_on_every_rank(ctx):
    same = agreement.find_divergence([1.0, 2.0])
    found = agreement.find_divergence([1.0, 2.0 + ctx.rank])
    everyone = dist.allgather_object((same, found[0] if found else None))
    assert everyone == [(None, 1)] * ctx.size


def _different_rank_data(ctx):
    rng = np.random.default_rng(ctx.rank)  # different data per rank
    return (rng.random((3, 16, 16, 1), dtype=np.float32),
            rng.integers(0, 3, (3, 16, 16)).astype(np.uint8))


def test_broadcast_and_averaged_gradients_keep_ranks_identical(ctx):
    """The trainer's own pieces (steps.make_train_step, steps.weight_checksum): each rank
    starts from different weights and trains on different data."""
    import keras

    from distseg.networks import unet as model_lib

    keras.utils.set_random_seed(100 + ctx.rank)  # different initial weights per rank
    model = model_lib.build_unet(16, depth=2, base_filters=2)
    opt = keras.optimizers.SGD(learning_rate=0.5)
    opt.build(model.trainable_variables)
    trained = model.trainable_variables  # BatchNorm statistics stay local until epoch end
    before = agreement.find_divergence(steps.weight_checksum(trained))

    dist.broadcast_variables(model.weights + opt.variables)
    after_broadcast = agreement.find_divergence(steps.weight_checksum(model.weights))

    images, masks = _different_rank_data(ctx)
    train_step = steps.make_train_step(model, opt, (16, 16), 3, "dice", ranks=ctx.size)
    results = [train_step(images, masks, np.zeros(2, np.float32)) for _ in range(4)]
    after_training = agreement.find_divergence(steps.weight_checksum(trained), rtol=1e-9)
    local_losses = dist.allgather_object(float(results[0].loss_local))
    global_losses = dist.allgather_object(float(results[0].loss))

    # Control: one step on the local gradients alone makes the ranks drift apart, so
    # the check above can fail.
    local_step(model, opt, images, masks)
    after_local = agreement.find_divergence(steps.weight_checksum(trained))

    assert before is not None, "ranks should start different"
    assert after_broadcast is None and after_training is None
    assert len(set(local_losses)) == ctx.size, "ranks saw the same batch"
    # The loss of the whole global batch: one value, the same on every rank.
    assert len(set(global_losses)) == 1 and global_losses[0] not in local_losses
    assert after_local is not None


def test_fp16_compression_rounds_the_gradients_and_keeps_the_extras_exact(ctx):
    """``--compression fp16``: the averaged gradients are the mean to float16's precision
    (not the exact float32 mean), the same on every rank; the flags and squared norms
    that ride along stay exact (a norm of 1e6 would overflow float16)."""
    import tensorflow as tf

    rng = np.random.default_rng(ctx.rank)
    grads = [tf.constant(rng.normal(size=(64, 3)).astype(np.float32) / 7),
             tf.constant(rng.normal(size=(5,)).astype(np.float32) / 3)]
    extra = [tf.constant([0.0, float(ctx.rank), 1e6 + ctx.rank], tf.float32)]

    @tf.function(autograph=False)
    def average(compression):  # graph tensors, as in the train step
        return dist.average_gradients([tf.identity(g) for g in grads],
                                      [tf.identity(e) for e in extra], compression)

    exact, exact_extra = average("none")
    rounded, rounded_extra = average("fp16")
    want = dist.allreduce(np.concatenate([g.numpy().ravel() for g in grads]))
    got = np.concatenate([g.numpy().ravel() for g in rounded])
    assert np.allclose(got, want, rtol=2e-3, atol=1e-4) and not np.array_equal(got, want)
    assert np.array_equal(np.concatenate([g.numpy().ravel() for g in exact]).astype(np.float32),
                          want.astype(np.float32))
    assert np.array_equal(rounded_extra[0].numpy(), exact_extra[0].numpy())
    assert exact_extra[0].numpy()[2] == np.float32(1e6 + (ctx.size - 1) / 2)
    assert agreement.find_divergence([float(np.sum(got)), float(np.sum(got ** 2))], rtol=0) is None


def test_flags_and_a_non_finite_gradient_reach_every_rank(ctx):
    """The last rank asks to stop and has a NaN pixel: every rank sees both flags at
    the same step, and no rank applies that step's update."""
    import keras

    from distseg.networks import unet as model_lib

    keras.utils.set_random_seed(7)
    model = model_lib.build_unet(16, depth=1, base_filters=2)
    opt = keras.optimizers.SGD(learning_rate=0.5)
    opt.build(model.trainable_variables)
    dist.broadcast_variables(model.weights + opt.variables)
    images, masks = _different_rank_data(ctx)
    last = ctx.rank == ctx.size - 1
    if last:
        images[0, 3, 3, 0] = np.nan
    train_step = steps.make_train_step(model, opt, (16, 16), 3, "dice", ranks=ctx.size)
    before = steps.weight_checksum(model.trainable_variables)
    out = train_step(images, masks, np.array([0.0, float(last)], np.float32))
    after = steps.weight_checksum(model.trainable_variables)
    everyone = dist.allgather_object((list(steps.Flags.of(out.flags)), after == before,
                                      np.isnan(float(out.loss))))
    # [failed, stop, non-finite]: stop and non-finite raised by one rank, seen by all
    assert everyone == [([False, True, True], True, True)] * ctx.size


def local_step(model, opt, images, masks):
    """One optimizer step on this rank's gradients, without Horovod (the control):
    the trainer's own forward and backward, then the update."""
    _, _, grads = steps.loss_and_grads(model, images, masks, 3, "dice")
    opt.apply_gradients(zip(grads, model.trainable_variables))


def _exactness_runs(ctx, norm: str, steps_: int = 30, global_batch: int = 4):
    """Step losses and final weight checksum of (a) ``ctx.size`` ranks each taking
    global_batch / size of every global batch, (b) one model taking the whole global
    batch (every rank runs the same copy; the averaging allreduce leaves it as it is)."""
    import keras

    from distseg.networks import unet as model_lib

    rng = np.random.default_rng(5)  # the same data on every rank
    images = rng.random((steps_, global_batch, 16, 16, 1), dtype=np.float32)
    masks = (images[..., 0] > 0.5).astype(np.uint8) + (images[..., 0] > 0.8).astype(np.uint8)
    part = global_batch // ctx.size
    mine = slice(ctx.rank * part, (ctx.rank + 1) * part)
    out = {}
    for name, ranks, rows in (("split", ctx.size, mine), ("whole", 1, slice(None))):
        keras.utils.set_random_seed(3)  # the same initial weights on every rank, both runs
        # BatchNorm: ghost batches of G/N samples, so one process normalises as the ranks do.
        ghost = part if norm == "batch" else 0
        model = model_lib.build_unet(16, depth=2, base_filters=4, norm=norm, bn_ghost_batch=ghost)
        opt = keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
        step = steps.make_train_step(model, opt, (16, 16), 3, "dice_ce", ranks=ranks)
        losses = [float(step(images[k, rows], masks[k, rows], np.zeros(2, np.float32))[1])
                  for k in range(steps_)]
        out[name] = (losses, steps.weight_checksum(model.trainable_variables))
        keras.backend.clear_session()
    return out


@pytest.mark.parametrize("norm", ["group", "instance", "batch"])
def test_n_ranks_with_global_batch_parts_make_the_one_process_update(ctx, norm):
    """The fixed global batch's exactness: GroupNorm, InstanceNorm (or BatchNorm with
    ghost batches of G/N), no
    dropout, the global Dice(+CE) loss: N ranks x G/N samples give the step losses and
    the weights of 1 process x G, for 30 steps of Adam (to float32 summation order)."""
    out = _exactness_runs(ctx, norm)
    everyone = dist.allgather_object(out)
    split, whole = everyone[0]["split"], everyone[0]["whole"]
    assert all(o == everyone[0] for o in everyone), "ranks disagree"
    np.testing.assert_allclose(split[0], whole[0], rtol=1e-5)
    np.testing.assert_allclose(split[1], whole[1], rtol=1e-5)
    assert whole[0][-1] < whole[0][0]  # it trained


def test_batchnorm_statistics_are_averaged(ctx):
    import keras

    from distseg.networks import unet as model_lib

    model = model_lib.build_unet(16, depth=1, base_filters=2)
    stats = list(model.non_trainable_weights)
    for v in stats:
        v.assign(np.full(v.shape, float(ctx.rank), np.float32))
    steps.average_batchnorm(model, ctx.size)
    got = [float(np.unique(v.numpy())[0]) for v in stats]
    everyone = dist.allgather_object((len(stats) > 0, got))
    keras.backend.clear_session()
    assert everyone == [(True, [pytest.approx((ctx.size - 1) / 2)] * len(stats))] * ctx.size


def _train_in_own_cwd(ctx, shared_dir, path):
    """Runs the trainer with each rank in its own working directory and a relative
    --run-dir, so the files each rank wrote can be told apart."""
    from distseg.training import loop as train

    own = os.path.join(shared_dir, f"cwd-rank{ctx.rank}")
    os.makedirs(own)
    here = os.getcwd()
    os.chdir(own)
    try:
        cfg = config_lib.resolve("smoke", overrides={"data.path": path, "run_dir": "run",
                                                       "train.epochs": 2})
        code = train.run(cfg)
    finally:
        os.chdir(here)
    return cfg, code, os.path.join(own, "run")


def _what_this_rank_wrote(run_dir):
    logs = sorted(os.listdir(rundir.log_dir(run_dir)))
    config = None
    if os.path.exists(rundir.config_path(run_dir)):
        with open(rundir.config_path(run_dir)) as f:
            config = json.load(f)["train"]["epochs"]
    checkpoints = len(glob.glob(os.path.join(run_dir, "checkpoints", "*.weights.h5")))
    return logs, config, checkpoints


def test_training_run(ctx, shared_dir):
    """A real run; every observation is gathered, then asserted on every rank."""
    path = os.path.join(shared_dir, "tiny.h5")
    if ctx.is_root():
        synth.make_dataset(path, cases=6, size=32, seed=1, slices_per_case=8)
    dist.barrier()
    info = data.examine(path)
    cfg, code, run_dir = _train_in_own_cwd(ctx, shared_dir, path)

    # Only rank 0 wrote the config and checkpoints; every rank wrote its own log only.
    wrote = dist.allgather_object(_what_this_rank_wrote(run_dir))
    assert wrote == [([rundir.log_name(0)], 2, 2)] + [
        ([rundir.log_name(r)], None, 0) for r in range(1, ctx.size)]

    records, problems = schema.read_log(rundir.log_path(run_dir, ctx.rank))
    for r in records:
        schema.validate_record(r)  # the same file layout on every rank: fails on all or none
    run, kinds = records[0], [r["type"] for r in records]
    epochs = [r for r in records if r["type"] == "epoch"]
    steps_ = [r for r in records if r["type"] == "step"]
    batch = cfg.train.batch_size
    shards = [np.concatenate(sharding.shard_batches(info.train_indices, ctx.rank, ctx.size, batch,
                                                e["epoch"], cfg.train.seed)) for e in epochs]
    mine = {
        "code": code, "problems": problems, "kinds": (kinds[0], kinds[-1], kinds.count("epoch")),
        "who": (run["rank"], run["size"]), "status": records[-1]["status"],
        "run": (run["run_id"], run["start_time"]),
        # the ids this rank trained on are exactly its shard
        "digest_is_shard": [e["sample_digest"] == schema.sample_digest(s)
                            for e, s in zip(epochs, shards)],
        "shards": [s.tolist() for s in shards], "digests": [e["sample_digest"] for e in epochs],
        "checksums": [e["weight_checksum"] for e in epochs],
        "val_dice": json.dumps([e["val_dice"] for e in epochs]),
        "batch_sizes_ok": {s["samples"] for s in steps_} <= {batch, batch - 1},
        "loss": [s["loss"] for s in steps_], "loss_local": [s["loss_local"] for s in steps_],
    }
    everyone = dist.allgather_object(mine)
    for r, theirs in enumerate(everyone):
        assert (theirs["code"], theirs["problems"], theirs["kinds"], theirs["who"],
                theirs["status"]) == (0, [], ("run", "end", 2), (r, ctx.size), "ok")
        assert theirs["digest_is_shard"] == [True, True] and theirs["batch_sizes_ok"]
        # every rank agrees on the run id, the start time and the global validation Dice
        assert (theirs["run"], theirs["val_dice"]) == (everyone[0]["run"], everyone[0]["val_dice"])
        # identical weights on every rank after each epoch
        np.testing.assert_allclose(theirs["checksums"], everyone[0]["checksums"], rtol=1e-9)
    for e in range(2):
        # shards are disjoint and together cover the train split exactly once
        assert not set(everyone[0]["shards"][e]) & set(everyone[1]["shards"][e])
        digests = [theirs["digests"][e] for theirs in everyone]
        assert schema.combine_digests(digests) == schema.sample_digest(info.train_indices)
    # the logged loss is the global batch's (its exactness: the test above): the same
    # value on every rank, and not the ranks' own
    assert all(t["loss"] == mine["loss"] for t in everyone)
    assert mine["loss"] != everyone[0]["loss_local"] and np.all(np.isfinite(mine["loss"]))


def _agreed_error(fn, *args):
    """(message, exit code) of the RunError ``fn`` raised, or None."""
    try:
        fn(*args)
    except RunError as e:
        return str(e), e.exit_code
    return None


def test_bad_input_same_decision_on_every_rank(ctx, shared_dir):
    from distseg.training import loop as train

    path = os.path.join(shared_dir, "few.h5")
    if ctx.is_root():
        synth.make_dataset(path, cases=2, size=32, seed=1, slices_per_case=4)  # 4 train slices
    dist.barrier()
    run_dir = os.path.join(shared_dir, "run")
    cfg = config_lib.resolve("smoke", overrides={"data.path": path, "run_dir": run_dir,
                                                   "train.batch_size": 4})
    error = _agreed_error(train.run, cfg)
    everyone = dist.allgather_object((error, os.path.exists(run_dir)))
    assert error is not None and "fewer than ranks x batch size" in error[0] and error[1] == 2
    # the same decision everywhere, and a failed start leaves no run directory
    assert everyone == [(error, False)] * ctx.size


def _damaged_copy(src: str, dst: str, index: int) -> None:
    """Copies a dataset with Fletcher-32 checksums on its chunks, then changes bytes in
    the chunk of image slice ``index``: reading that slice fails, the rest reads.
    (Not by flipping bits: Fletcher-32 cannot tell 0x0000 from 0xFFFF words.)"""
    import h5py
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for name, d in f.items():
            g.create_dataset(name, data=d[()], chunks=d.chunks, fletcher32=d.chunks is not None)
        g.attrs.update(f.attrs)
    with h5py.File(dst, "r") as g:
        offset = g["images"].id.get_chunk_info_by_coord((index, 0, 0, 0)).byte_offset
    with open(dst, "r+b") as f:
        f.seek(offset)
        good = f.read(8)
        f.seek(offset)
        f.write(bytes((b + 0x5A) % 256 for b in good))


@pytest.mark.parametrize("where", ["train", "val"])
def test_a_slice_one_rank_cannot_read_stops_every_rank(ctx, shared_dir, where):
    """Each node staged its own copy of the data and the last rank's copy is damaged.

    The read fails on that rank alone, inside the step loop (epoch 1) or in the
    validation (epoch 0): every rank must stop with the same one-line error naming the
    file, instead of the others waiting forever in the next allreduce; logs and the
    epoch-0 checkpoint stay intact.
    """
    from distseg.training import loop as train

    good = os.path.join(shared_dir, "tiny.h5")
    if ctx.is_root():
        synth.make_dataset(good, cases=6, size=32, seed=1, slices_per_case=8)
    dist.barrier()
    info = data.examine(good)
    cfg = config_lib.resolve("smoke", overrides={"data.path": good, "train.epochs": 2,
                                                   "run_dir": os.path.join(shared_dir, "run")})
    last = ctx.size - 1
    path = good
    if ctx.rank == last:
        if where == "train":  # the slice this rank trains on at epoch 1, step 1
            batches = sharding.shard_batches(info.train_indices, last, ctx.size,
                                         cfg.train.batch_size, 1, cfg.train.seed)
            index = int(batches[1][0])
        else:  # a slice of this rank's validation shard
            index = int(sharding.shard_eval(info.val_indices, last, ctx.size, cfg.train.batch_size)[0][0])
        path = os.path.join(shared_dir, f"copy-rank{last}.h5")
        _damaged_copy(good, path, index)
    cfg = config_lib.resolve("smoke", overrides={"data.path": path, "train.epochs": 2,
                                                   "run_dir": cfg.run_dir})

    error = _agreed_error(train.run, cfg)
    records, problems = schema.read_log(rundir.log_path(cfg.run_dir, ctx.rank))
    end = records[-1] if records else {}  # never fail before the gather below
    epochs = [r["epoch"] for r in records if r["type"] == "epoch"]
    everyone = dist.allgather_object((error, problems, (end.get("type"), end.get("status"),
                                                        end.get("reason")), epochs))
    assert error is not None
    message, code = error
    assert everyone == [(error, [], ("end", "error", message),
                         [0] if where == "train" else [])] * ctx.size
    assert message.startswith(f"{os.path.join(shared_dir, f'copy-rank{last}.h5')}: slices ")
    assert "cannot be read" in message and message.endswith(f"[rank {last}]")
    assert "\n" not in message and code == 2
    if ctx.is_root() and where == "train":
        import h5py
        with h5py.File(os.path.join(cfg.run_dir, "checkpoints", "epoch-0001.weights.h5"), "r"):
            pass  # the checkpoint written before the failure is whole


def test_ranks_that_timed_the_precisions_differently_take_one_decision(ctx):
    """``--precision auto``: each rank times its own steps; the slowest rank's seconds
    of each precision decide, the same on every rank. Rank 0 finds bfloat16 2x faster,
    the last rank barely faster: the last rank's numbers (1.05x) keep float32 for all."""
    from distseg.training.startup import precision
    last = ctx.size - 1
    mine = ({"float32": 0.4, "bfloat16": 0.2} if ctx.rank == 0 else
            {"float32": 0.63, "bfloat16": 0.6} if ctx.rank == last else
            {"float32": 0.3, "bfloat16": 0.25})
    slowest = precision.slowest_rank(mine)
    choices = dist.allgather_object((slowest, precision.choose(slowest)))
    assert choices == [({"float32": 0.63, "bfloat16": 0.6}, "float32")] * ctx.size
