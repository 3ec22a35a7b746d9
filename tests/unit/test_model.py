"""U-Net shapes and size, the Dice loss against hand-computed values, Dice counts."""

import numpy as np
import pytest
import tensorflow as tf

from distseg import losses
from distseg.networks import unet as model_lib  # noqa: E402


@pytest.mark.parametrize("size,depth,filters,classes", [
    (32, 2, 4, 3), (48, 4, 2, 3), (64, 3, 4, 2), (128, 4, 2, 3), (240, 4, 2, 3),
])
def test_output_shape(size, depth, filters, classes):
    m = model_lib.build_unet(size, depth=depth, base_filters=filters, num_classes=classes)
    out = m(np.zeros((2, size, size, 1), np.float32))
    assert out.shape == (2, size, size, classes)
    np.testing.assert_allclose(out.numpy().sum(-1), 1.0, rtol=1e-5)  # softmax


def test_3d_output_shape():
    m = model_lib.build_unet(16, spatial_dims=3, depth=2, base_filters=2)
    assert m(np.zeros((1, 16, 16, 16, 1), np.float32)).shape == (1, 16, 16, 16, 3)


def test_default_is_livermask_sized():
    m = model_lib.build_unet()  # 240x240, depth 4, 64 filters, batch norm
    trainable = sum(int(np.prod(v.shape)) for v in m.trainable_variables)
    assert m.input_shape == (None, 240, 240, 1)
    # Ronneberger's U-Net is 31.0M parameters; batch norm adds ~12k trainable.
    assert 30.9e6 < trainable < 31.2e6, trainable


@pytest.mark.parametrize("kwargs,message", [
    (dict(image_size=100, depth=4), "not divisible by 2\\*\\*depth = 16"),
    (dict(spatial_dims=4), "spatial_dims must be 2 or 3"),
    (dict(norm="layer"), "norm must be"),
    (dict(num_classes=1), "num_classes >= 2"),
])
def test_bad_hyper_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        model_lib.build_unet(**{"image_size": 64, **kwargs})


def test_batchnorm_statistics_follow_the_configured_momentum():
    # Validation uses BatchNorm's moving statistics; with too slow a momentum they stay
    # near their initial values through a short run and validation Dice collapses.
    import keras

    from distseg.core.config import ModelConfig
    model = model_lib.from_config(ModelConfig(image_size=16, depth=1, base_filters=2, bn_momentum=0.5, precision="float32",
                                              num_classes=3))
    bns = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert bns and all(layer.momentum == 0.5 for layer in bns)
    bn = model.get_layer("down0_bn1")
    conv_out = keras.Model(model.input, model.get_layer("down0_conv1").output)
    x = np.random.default_rng(0).normal(3.0, 1.0, (2, 16, 16, 1)).astype(np.float32)
    batch_mean = np.asarray(conv_out(x)).mean(axis=(0, 1, 2))
    before = np.array(bn.moving_mean)
    model(x, training=True)
    # One training call moves the moving mean halfway (momentum 0.5) to the batch mean.
    np.testing.assert_allclose(np.array(bn.moving_mean), 0.5 * before + 0.5 * batch_mean, rtol=1e-4, atol=1e-5)
    assert np.abs(batch_mean).max() > 0.1


def test_groupnorm_unet_has_no_moving_statistics_and_normalises_alike():
    # GroupNorm's output in training and in inference is the same function of the input:
    # nothing lags the weights, whatever the learning rate or number of ranks.
    m = model_lib.build_unet(32, depth=2, base_filters=4, norm="group")
    assert m.non_trainable_weights == []
    assert [l.groups for l in m.layers if "_gn" in l.name][:2] == [4, 4]
    assert model_lib.norm_groups(16) == 8 and model_lib.norm_groups(12) == 4
    x = np.random.default_rng(0).normal(3.0, 1.0, (2, 32, 32, 1)).astype(np.float32)
    np.testing.assert_allclose(m(x, training=True), m(x, training=False), atol=1e-6)


def test_instance_norm_normalises_each_samples_channel_alone():
    # nnU-Net's InstanceNorm: per sample and channel over the positions, eps 1e-5, scale
    # and offset; a sample's output does not depend on the rest of its batch, so N ranks
    # of B/N samples normalise as one process of B does.
    m = model_lib.build_unet(32, depth=2, base_filters=4, norm="instance")
    norms = [l for l in m.layers if "_in" in l.name]
    assert norms and m.non_trainable_weights == []
    assert all(l.groups == l.gamma.shape[-1] and l.epsilon == 1e-5 for l in norms)
    layer = model_lib.NORM_LAYERS["instance"](6, epsilon=model_lib.INSTANCE_EPSILON)
    x = np.random.default_rng(1).normal(2.0, 3.0, (4, 5, 7, 6)).astype(np.float32)
    mean = x.mean(axis=(1, 2), keepdims=True)
    want = (x - mean) / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(layer(x), want, atol=1e-5)
    np.testing.assert_allclose(layer(x[2:3]), layer(x)[2:3], atol=1e-6)  # up to rounding
    batch = model_lib.build_unet(32, depth=2, base_filters=4, norm="instance")
    batch.set_weights(m.get_weights())
    images = np.random.default_rng(2).normal(size=(4, 32, 32, 1)).astype(np.float32)
    np.testing.assert_allclose(m(images[:2], training=True), batch(images, training=True)[:2],
                               atol=1e-6)


# --- 3D, non-cubic inputs, the reference size, recompute and bfloat16 -------------------


@pytest.mark.parametrize("shape,depth,filters", [
    ((16, 16, 16), 2, 2), ((16, 32, 48), 2, 2), ((32, 64, 16), 3, 2), ((16, 16, 32), 4, 1),
])
def test_3d_output_shapes(shape, depth, filters):
    m = model_lib.build_unet(input_shape=shape, spatial_dims=3, depth=depth, base_filters=filters)
    out = m(np.zeros((1, *shape, 1), np.float32))
    assert out.shape == (1, *shape, 3)
    np.testing.assert_allclose(out.numpy().sum(-1), 1.0, rtol=1e-5)
    # Level l of the encoder runs at shape / 2**l with base * 2**l filters.
    for level in range(depth):
        got = m.get_layer(f"down{level}_relu2").output.shape
        assert got == (None, *(s // 2 ** level for s in shape), filters * 2 ** level)


def test_non_square_2d_input_and_image_size_still_work():
    m = model_lib.build_unet(input_shape=(32, 64), depth=2, base_filters=2)
    assert m(np.zeros((2, 32, 64, 1), np.float32)).shape == (2, 32, 64, 3)
    assert model_lib.build_unet(48, depth=4, base_filters=2).input_shape == (None, 48, 48, 1)


@pytest.mark.parametrize("kwargs,message", [
    (dict(input_shape=(16, 24, 32), spatial_dims=3, depth=4), "extent 24 is not divisible by 2\\*\\*depth = 16"),
    (dict(input_shape=(16, 16), spatial_dims=3, depth=2), "must have 3 extents"),
    (dict(input_shape=(16, 16), precision="float16"), "precision must be one of"),
])
def test_bad_shapes_and_precision(kwargs, message):
    with pytest.raises(ValueError, match=message):
        model_lib.build_unet(**kwargs)


def test_3d_default_has_the_reference_parameter_count():
    # liver3d: 16 base filters, 4 poolings, 1 channel in, 3 classes, batch norm. The count
    # does not depend on the input size. 5,649,363 = 5,646,419 trainable + 2,944 BatchNorm
    # moving statistics (2 x 1,472 channels); the reference's is 5,650,801 (test_memory).
    m = model_lib.build_unet(input_shape=(16, 16, 16), spatial_dims=3, depth=4, base_filters=16)
    trainable = sum(int(np.prod(v.shape)) for v in m.trainable_variables)
    assert (m.count_params(), trainable) == (5_649_363, 5_646_419)


def _tiny_pair(**kwargs):
    """A plain and a recomputing 3D U-Net with the same weights."""
    shape = dict(input_shape=(8, 16, 16), spatial_dims=3, depth=2, base_filters=4, **kwargs)
    plain = model_lib.build_unet(**shape)
    recomputing = model_lib.build_unet(**shape, recompute=True)
    recomputing.set_weights(plain.get_weights())  # same variables in the same order
    return plain, recomputing


def _loss_and_grads(model, x, y):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = losses.segmentation_loss(model(x, training=True), y, 3)
        return loss, tape.gradient(loss, model.trainable_variables)
    return step(x, y)


@pytest.mark.parametrize("norm", ["batch", "group", "instance", "none"])
def test_recompute_gives_the_plain_models_gradients(norm):
    plain, recomputing = _tiny_pair(norm=norm)
    assert any(isinstance(l, model_lib.ConvUnit) for l in recomputing.layers)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 8, 16, 16, 1)).astype(np.float32)
    y = rng.integers(0, 3, size=(2, 8, 16, 16)).astype(np.uint8)
    loss_p, grads_p = _loss_and_grads(plain, x, y)
    loss_r, grads_r = _loss_and_grads(recomputing, x, y)
    assert float(loss_r) == pytest.approx(float(loss_p), rel=1e-5)
    assert len(grads_r) == len(grads_p) and all(g is not None for g in grads_r)
    for gp, gr in zip(grads_p, grads_r):
        scale = float(tf.reduce_max(tf.abs(gp))) + 1e-8
        np.testing.assert_allclose(gr.numpy() / scale, gp.numpy() / scale, atol=2e-4)
    # The recomputation does not move BatchNorm's statistics a second time.
    for vp, vr in zip(plain.non_trainable_weights, recomputing.non_trainable_weights):
        np.testing.assert_allclose(np.array(vr), np.array(vp), rtol=1e-5, atol=1e-6)
    if norm == "batch":
        assert np.abs(np.array(recomputing.non_trainable_weights[0])).max() > 1e-3  # they moved once


def test_fused_batchnorm_follows_keras_rule():
    # Same weights, same input: the same output and the same moving statistics (biased
    # batch variance) as keras.layers.BatchNormalization, in 4-D and 5-D.
    import keras
    rng = np.random.default_rng(2)
    for shape in [(4, 6, 6, 3), (2, 4, 6, 6, 3)]:
        x = rng.normal(2.0, 3.0, shape).astype(np.float32)
        keras_bn = keras.layers.BatchNormalization(momentum=0.5)
        fused = model_lib.FusedBatchNorm(momentum=0.5)
        np.testing.assert_allclose(fused(x, training=True), keras_bn(x, training=True), atol=1e-4)
        np.testing.assert_allclose(fused.moving_mean, keras_bn.moving_mean, rtol=1e-5)
        np.testing.assert_allclose(fused.moving_variance, keras_bn.moving_variance, rtol=1e-4)
        before = np.array(fused.moving_mean)
        fused(x, training=True, update_stats=False)
        np.testing.assert_array_equal(np.array(fused.moving_mean), before)


@pytest.mark.parametrize("shape,groups,dtype,mean", [
    ((3, 5, 4, 16), 8, "float32", 1.0), ((3, 5, 4, 6), 2, "float32", 1.0),
    ((2, 3, 4, 5, 8), 4, "float32", 1.0), ((3, 5, 4, 8), 4, "mixed_bfloat16", 1.0),
    ((3, 5, 4, 8), 4, "float32", 50.0)])
def test_groupnorm_matches_keras_groupnorm_forward_and_backward(shape, groups, dtype, mean):
    # distseg's GroupNorm writes its gradient out; it must agree with Keras' layer (and
    # its automatic gradient) in 2D and 3D, in bfloat16, and far from zero mean.
    import keras
    rng = np.random.default_rng(shape[-1])
    x = tf.constant(rng.normal(mean, 3.0, shape).astype(np.float32))
    up = tf.constant(rng.normal(size=shape).astype(np.float32))
    outs = []
    for kind in (keras.layers.GroupNormalization, model_lib.GroupNorm):
        layer = kind(groups, dtype=dtype)
        layer.build(x.shape)
        layer.gamma.assign(np.linspace(0.5, 2.0, shape[-1]))
        layer.beta.assign(np.linspace(-1.0, 1.0, shape[-1]))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * up)
        grads = tape.gradient(loss, [x, layer.gamma, layer.beta])
        outs.append([tf.cast(v, tf.float32).numpy() for v in (y, *grads)])
    tol = {("float32", 1.0): 1e-5, ("float32", 50.0): 1e-3}.get((dtype, mean), 2e-2)
    for keras_value, ours in zip(*outs):
        np.testing.assert_allclose(ours, keras_value, rtol=tol, atol=tol)


@pytest.mark.parametrize("recompute", [False, True])
def test_bfloat16_computes_in_bfloat16_and_outputs_float32(recompute):
    m = model_lib.build_unet(input_shape=(8, 16, 16), spatial_dims=3, depth=2, base_filters=4,
                             precision="bfloat16", recompute=recompute)
    x = np.random.default_rng(3).normal(size=(1, 8, 16, 16, 1)).astype(np.float32)
    y = np.zeros((1, 8, 16, 16), np.uint8)
    with tf.GradientTape() as tape:
        probs = m(x, training=True)
        loss = losses.segmentation_loss(probs, y, 3)
    assert probs.dtype == tf.float32
    np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, rtol=1e-5)
    assert m.get_layer("logits").compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in m.weights)  # float32 master weights
    assert all(g.dtype == tf.float32 for g in tape.gradient(loss, m.trainable_variables))
    if not recompute:
        assert isinstance(m.get_layer("down0_bn1"), model_lib.FusedBatchNorm)
        assert m.get_layer("down0_conv1").output.dtype == "bfloat16"
        # The bottleneck is 2x4x4: it computes in float32 (memory.level_precision).
        assert m.get_layer("bottleneck_conv1").compute_dtype == "float32"
        assert m.get_layer("up1").compute_dtype == "float32"
        assert m.get_layer("down1_conv1").compute_dtype == "bfloat16"


def test_from_config_reads_the_3d_fields():
    from distseg.core.config import ModelConfig
    cfg = ModelConfig(depth=2, base_filters=2, spatial_dims=3, recompute=True, precision="bfloat16",
                      num_classes=3)
    m = model_lib.from_config(cfg, (8, 16, 32))
    assert m.input_shape == (None, 8, 16, 32, 1)
    assert any(isinstance(l, model_lib.ConvUnit) for l in m.layers)
    assert m.get_layer("logits").compute_dtype == "bfloat16"
    assert model_lib.from_config(ModelConfig(image_size=16, depth=1, base_filters=2, num_classes=2, precision="float32")
                                 ).input_shape == (None, 16, 16, 1)
    # A config whose classes were not read from a data file yet builds nothing.
    with pytest.raises(ValueError, match="from the data file"):
        model_lib.from_config(ModelConfig(image_size=16, depth=1, base_filters=2))


@pytest.mark.parametrize("static", [True, False])
def test_ghost_batches_normalise_each_run_of_samples_as_its_own_batch(static):
    """A batch of 6 with ghost batches of 2 is three batches of 2 normalised apart (what
    3 ranks of 2 samples compute), and the moving statistics move by their mean (what
    averaging the 3 ranks' statistics gives), whether the batch size is known when
    traced or not."""
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(6, 4, 4, 3)).astype(np.float32)
    ghost = model_lib.FusedBatchNorm(momentum=0.5, ghost_batch=2)
    parts = [model_lib.FusedBatchNorm(momentum=0.5) for _ in range(3)]
    for layer in (ghost, *parts):
        layer.build(x.shape)
    spec = tf.TensorSpec(x.shape if static else (None, 4, 4, 3), tf.float32)
    call = tf.function(lambda t: ghost(t, training=True), input_signature=[spec])
    got = call(tf.constant(x)).numpy()
    want = np.concatenate([p(x[2 * i:2 * i + 2], training=True).numpy() for i, p in enumerate(parts)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for name in ("moving_mean", "moving_variance"):
        mean_of_parts = np.mean([getattr(p, name).numpy() for p in parts], axis=0)
        np.testing.assert_allclose(getattr(ghost, name).numpy(), mean_of_parts, rtol=1e-5)
    # A batch no larger than the ghost batch (or not a multiple of it) is one batch.
    single = model_lib.FusedBatchNorm(momentum=0.5, ghost_batch=4)
    single.build(x.shape)
    np.testing.assert_allclose(single(x[:3], training=True).numpy(), parts[0].__class__(
        momentum=0.5)(x[:3], training=True).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 4, 4, 3), (4, 2, 3, 3, 2)])
def test_ghost_batches_of_a_batch_size_known_only_at_run_time_have_the_parts_gradients(shape):
    """The run-time path (the runs as channels of one fused call, 2D and 3D): the
    gradients with respect to the input, scale and offset are those of the runs
    normalised apart."""
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(1.0, 2.0, size=shape).astype(np.float32))
    w = tf.constant(rng.normal(size=shape).astype(np.float32))
    runs = shape[0] // 2
    ghost = model_lib.FusedBatchNorm(ghost_batch=2)
    parts = [model_lib.FusedBatchNorm() for _ in range(runs)]
    for layer in (ghost, *parts):
        layer.build(shape)
        layer.gamma.assign(rng.normal(1.0, 0.1, size=shape[-1]).astype(np.float32))
    for p in parts:
        p.gamma.assign(ghost.gamma)
    spec = tf.TensorSpec((None, *shape[1:]), tf.float32)

    @tf.function(input_signature=[spec, spec])
    def ghost_grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(ghost(x, training=True) * w)
        return tape.gradient(loss, [x, ghost.gamma, ghost.beta])

    got = ghost_grads(x, w)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.concat([p(x[2 * i:2 * i + 2], training=True) for i, p in enumerate(parts)], 0)
        loss = tf.reduce_sum(y * w)
    want = tape.gradient(loss, [x] + [p.gamma for p in parts] + [p.beta for p in parts])
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1].numpy(), np.sum([g.numpy() for g in want[1:1 + runs]], 0),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2].numpy(), np.sum([g.numpy() for g in want[1 + runs:]], 0),
                               rtol=1e-4, atol=1e-5)
