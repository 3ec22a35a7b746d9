"""U-Net shapes and size, the Dice loss against hand-computed values, Dice counts."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from distseg import model as model_lib  # noqa: E402


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


def test_soft_dice_loss_matches_hand_computation():
    # One 1x2x2 image, two classes. Truth: class 1 on the top row.
    masks = np.array([[[1, 1], [0, 0]]], np.uint8)
    p1 = np.array([[[0.9, 0.6], [0.2, 0.1]]], np.float32)
    probs = np.stack([1 - p1, p1], axis=-1)
    # class 1: inter = 0.9 + 0.6 = 1.5; sum p = 1.8; sum g = 2 -> dice = 3.0 / 3.8
    # class 0: inter = 0.8 + 0.9 = 1.7; sum p = 2.2; sum g = 2 -> dice = 3.4 / 4.2
    s = 1e-5
    d1 = (3.0 + s) / (3.8 + s)
    d0 = (3.4 + s) / (4.2 + s)
    loss = model_lib.segmentation_loss(tf.constant(probs), tf.constant(masks), 2, "dice")
    assert float(loss) == pytest.approx(-(d0 + d1) / 2, rel=1e-6)
    ce = -np.mean(np.log([0.9, 0.6, 0.8, 0.9]))
    loss_ce = model_lib.segmentation_loss(tf.constant(probs), tf.constant(masks), 2, "dice_ce")
    assert float(loss_ce) == pytest.approx(-(d0 + d1) / 2 + ce, rel=1e-5)


def test_perfect_prediction_scores_minus_one():
    masks = np.random.default_rng(0).integers(0, 3, size=(2, 8, 8)).astype(np.uint8)
    probs = tf.one_hot(masks, 3)
    assert float(model_lib.segmentation_loss(probs, tf.constant(masks), 3)) == pytest.approx(-1.0)


def test_dice_counts_combine_like_one_batch():
    rng = np.random.default_rng(1)
    masks = rng.integers(0, 3, size=(4, 8, 8)).astype(np.uint8)
    probs = tf.nn.softmax(rng.normal(size=(4, 8, 8, 3)).astype(np.float32))
    whole = model_lib.dice_counts(probs, tf.constant(masks), 3).numpy()
    parts = sum(model_lib.dice_counts(probs[i:i + 1], tf.constant(masks[i:i + 1]), 3).numpy()
                for i in range(4))
    np.testing.assert_allclose(whole, parts)
    pred = np.argmax(probs.numpy(), -1)
    for c, d in enumerate(model_lib.dice_from_counts(whole)):
        inter = np.sum((pred == c) & (masks == c))
        assert d == pytest.approx(2 * inter / (np.sum(pred == c) + np.sum(masks == c)))
    assert model_lib.dice_from_counts(np.zeros((3, 2))) == [None, None]


def test_batchnorm_statistics_follow_the_configured_momentum():
    # Validation uses BatchNorm's moving statistics; with too slow a momentum they stay
    # near their initial values through a short run and validation Dice collapses.
    import keras
    from distseg.config import ModelConfig
    model = model_lib.from_config(ModelConfig(image_size=16, depth=1, base_filters=2, bn_momentum=0.5))
    bns = [layer for layer in model.layers if layer.__class__.__name__ == "BatchNormalization"]
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
