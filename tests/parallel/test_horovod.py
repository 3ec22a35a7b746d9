"""Real Horovod ranks: collectives, averaged training, and a full training run.

Each rank is given different values (seeds, data) and the tests assert that the ranks
agree after synchronisation, and that they would not without it.
"""

import glob
import json
import os

import numpy as np
import pytest

from distseg import config as config_lib
from distseg import data, distributed as dist, schema, synth

pytestmark = pytest.mark.timeout(300)


def test_collectives(ctx):
    got = dist.allreduce([ctx.rank, 1.0], op="sum")
    assert got.tolist() == [sum(range(ctx.size)), ctx.size]
    assert dist.allreduce([float(ctx.rank)], op="mean")[0] == pytest.approx((ctx.size - 1) / 2)
    assert dist.allgather_object(ctx.rank * 10) == [r * 10 for r in range(ctx.size)]
    assert dist.broadcast_object("from root" if ctx.is_root() else None) == "from root"


def test_an_error_on_one_rank_is_the_same_error_on_all(ctx):
    last = ctx.size - 1
    mine = "data.h5: missing dataset 'masks'" if ctx.rank == last else None
    agreed = dist.first_error(mine, code=2)
    assert agreed == (f"data.h5: missing dataset 'masks' [rank {last}]", 2)
    assert dist.allgather_object(agreed) == [agreed] * ctx.size
    assert dist.first_error(None) is None
    # two ranks fail: the lowest rank's message, the highest exit code
    agreed = dist.first_error(f"error on rank {ctx.rank}", code=1 + ctx.rank)
    assert agreed == (f"error on rank 0 [rank 0 (and {ctx.size - 1} other rank(s))]", ctx.size)


def test_any_exception_on_one_rank_fails_every_rank(ctx):
    """Not only the expected error types: a KeyError on one rank must not leave the
    others waiting in the next collective."""
    from distseg import train

    def fails_on_last_rank():
        if ctx.rank == ctx.size - 1:
            raise KeyError("spacing")
        return "fine"

    with pytest.raises(train.RunError) as err:
        train._agree(fails_on_last_rank)
    assert str(err.value) == f"KeyError: 'spacing' [rank {ctx.size - 1}]"
    assert err.value.exit_code == 1
    assert dist.allgather_object(str(err.value)) == [str(err.value)] * ctx.size
    assert train._agree(lambda: ctx.rank) == ctx.rank


def test_divergence_is_found_on_every_rank(ctx):
    assert dist.find_divergence([1.0, 2.0]) is None
    found = dist.find_divergence([1.0, 2.0 + ctx.rank])
    assert found is not None and found[0] == 1
    assert dist.allgather_object(found[0]) == [1] * ctx.size


def _checksum(model):
    return [float(sum(np.sum(v.numpy().astype(np.float64)) for v in model.trainable_variables))]


def test_broadcast_and_averaged_gradients_keep_ranks_identical(ctx):
    import keras
    import tensorflow as tf

    from distseg import model as model_lib

    keras.utils.set_random_seed(100 + ctx.rank)  # different initial weights per rank
    model = model_lib.build_unet(16, depth=2, base_filters=2)
    opt = keras.optimizers.SGD(learning_rate=0.5)
    opt.build(model.trainable_variables)
    assert dist.find_divergence(_checksum(model)) is not None, "ranks should start different"

    dist.broadcast_variables(model.variables + opt.variables)
    assert dist.find_divergence(_checksum(model)) is None

    rng = np.random.default_rng(ctx.rank)  # different data per rank
    images = rng.random((3, 16, 16, 1), dtype=np.float32)
    masks = rng.integers(0, 3, (3, 16, 16)).astype(np.uint8)

    @tf.function
    def step(average):
        with tf.GradientTape() as tape:
            loss = model_lib.segmentation_loss(model(images, training=True), masks, 3)
        grads = tape.gradient(loss, model.trainable_variables)
        if average:
            grads, _ = dist.average_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step(True)) for _ in range(4)]
    assert dist.find_divergence(_checksum(model), rtol=1e-9) is None
    assert len(set(dist.allgather_object(losses[0]))) == ctx.size, "ranks saw the same batch"
    # Control: without the allreduce the same training makes the ranks drift apart,
    # so the assertion above can fail.
    step(False)
    assert dist.find_divergence(_checksum(model)) is not None


def test_training_run(ctx, shared_dir):
    """A real run: each rank in its own working directory with a relative --run-dir,
    so the files each rank wrote can be told apart."""
    from distseg import train

    path = os.path.join(shared_dir, "tiny.h5")
    if ctx.is_root():
        synth.make_dataset(path, cases=6, size=32, seed=1, slices_per_case=8)
    dist.barrier()
    info = data.inspect(path)
    own = os.path.join(shared_dir, f"cwd-rank{ctx.rank}")
    os.makedirs(own)
    here = os.getcwd()
    os.chdir(own)
    try:
        cfg = config_lib.resolve("smoke", overrides={"data.path": path, "run_dir": "run",
                                                       "train.epochs": 2})
        assert train.run(cfg) == 0
    finally:
        os.chdir(here)
    run_dir = os.path.join(own, "run")

    # Only rank 0 wrote the config and checkpoints; every rank wrote its own log only.
    logs = sorted(os.listdir(os.path.join(run_dir, "logs")))
    assert logs == [schema.log_name(ctx.rank)]
    has_config = os.path.exists(os.path.join(run_dir, "config.json"))
    checkpoints = glob.glob(os.path.join(run_dir, "checkpoints", "*.weights.h5"))
    if ctx.is_root():
        assert has_config and len(checkpoints) == 2
        with open(os.path.join(run_dir, "config.json")) as f:
            assert json.load(f)["train"]["epochs"] == 2
    else:
        assert not has_config and not checkpoints

    records, problems = schema.read_log(os.path.join(run_dir, "logs", logs[0]))
    assert not problems
    for r in records:
        schema.validate_record(r)
    kinds = [r["type"] for r in records]
    assert kinds[0] == "run" and kinds[-1] == "end" and kinds.count("epoch") == 2
    run = records[0]
    assert (run["rank"], run["size"]) == (ctx.rank, ctx.size)
    assert records[-1]["status"] == "ok"
    # every rank agrees on the run id and the start time
    assert len(set(dist.allgather_object((run["run_id"], run["start_time"])))) == 1

    epochs = [r for r in records if r["type"] == "epoch"]
    batch = cfg.train.batch_size
    for e in epochs:
        # the ids this rank trained on are exactly its shard, and shards differ
        shard = np.concatenate(data.shard_batches(info.train_indices, ctx.rank, ctx.size, batch,
                                                  e["epoch"], cfg.train.seed))
        assert e["sample_digest"] == schema.sample_digest(shard)
        shards = dist.allgather_object(shard.tolist())
        assert not set(shards[0]) & set(shards[1])
        digests = dist.allgather_object(e["sample_digest"])
        assert schema.combine_digests(digests) == schema.sample_digest(info.train_indices)
        # identical weights on every rank after each epoch
        assert dist.find_divergence(e["weight_checksum"], rtol=1e-9) is None
        # global validation Dice is the same number on every rank
        assert len(set(json.dumps(x) for x in dist.allgather_object(e["val_dice"]))) == 1
    steps = [r for r in records if r["type"] == "step"]
    assert {s["samples"] for s in steps} <= {batch, batch - 1}
    # the averaged loss is the mean of the ranks' local losses
    local = dist.allgather_object([s["loss_local"] for s in steps])
    np.testing.assert_allclose([s["loss"] for s in steps], np.mean(local, axis=0), rtol=1e-5)


def test_bad_input_same_decision_on_every_rank(ctx, shared_dir):
    from distseg import train

    path = os.path.join(shared_dir, "few.h5")
    if ctx.is_root():
        synth.make_dataset(path, cases=2, size=32, seed=1, slices_per_case=4)  # 4 train slices
    dist.barrier()
    run_dir = os.path.join(shared_dir, "run")
    cfg = config_lib.resolve("smoke", overrides={"data.path": path, "run_dir": run_dir,
                                                   "train.batch_size": 4})
    with pytest.raises(train.RunError) as err:
        train.run(cfg)
    assert "fewer than ranks x batch size" in str(err.value)
    assert err.value.exit_code == 2
    assert dist.allgather_object(str(err.value)) == [str(err.value)] * ctx.size
    assert not os.path.exists(run_dir), "a failed start must not leave a run directory"


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
    from distseg import train

    good = os.path.join(shared_dir, "tiny.h5")
    if ctx.is_root():
        synth.make_dataset(good, cases=6, size=32, seed=1, slices_per_case=8)
    dist.barrier()
    info = data.inspect(good)
    cfg = config_lib.resolve("smoke", overrides={"data.path": good, "train.epochs": 2,
                                                   "run_dir": os.path.join(shared_dir, "run")})
    last = ctx.size - 1
    path = good
    if ctx.rank == last:
        if where == "train":  # the slice this rank trains on at epoch 1, step 1
            batches = data.shard_batches(info.train_indices, last, ctx.size,
                                         cfg.train.batch_size, 1, cfg.train.seed)
            index = int(batches[1][0])
        else:  # a slice of this rank's validation shard
            index = int(data.shard_eval(info.val_indices, last, ctx.size, cfg.train.batch_size)[0][0])
        path = os.path.join(shared_dir, f"copy-rank{last}.h5")
        _damaged_copy(good, path, index)
    cfg = config_lib.resolve("smoke", overrides={"data.path": path, "train.epochs": 2,
                                                   "run_dir": cfg.run_dir})

    with pytest.raises(train.RunError) as err:
        train.run(cfg)
    message = str(err.value)
    assert dist.allgather_object(message) == [message] * ctx.size
    assert message.startswith(f"{os.path.join(shared_dir, f'copy-rank{last}.h5')}: slices ")
    assert "cannot be read" in message and message.endswith(f"[rank {last}]")
    assert "\n" not in message and err.value.exit_code == 2

    records, problems = schema.read_log(os.path.join(cfg.run_dir, "logs", schema.log_name(ctx.rank)))
    assert not problems
    end = records[-1]
    assert (end["type"], end["status"], end["reason"]) == ("end", "error", message)
    epochs = [r["epoch"] for r in records if r["type"] == "epoch"]
    assert epochs == ([0] if where == "train" else [])
    if ctx.is_root() and where == "train":
        import h5py
        with h5py.File(os.path.join(cfg.run_dir, "checkpoints", "epoch-0001.weights.h5"), "r"):
            pass  # the checkpoint written before the failure is whole
