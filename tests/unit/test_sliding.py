"""Sliding-window inference, per-case Dice counts and the split of validation cases."""

import math

import numpy as np
import pytest

from distseg import metrics, sliding
from distseg.data import h5format, synth, volumes

#: (volume shape, window, overlap, batch): divisible, not divisible, shorter than the
#: window along some axes or all of them, overlaps from none to most.
CASES = [
    ((32, 64, 64), (16, 32, 32), 0.5, 1),
    ((37, 50, 23), (16, 32, 32), 0.5, 3),
    ((5, 70, 9), (8, 16, 16), 0.25, 2),
    ((4, 6, 7), (8, 16, 16), 0.5, 1),
    ((40, 40, 40), (16, 16, 16), 0.0, 4),
    ((21, 33, 47), (8, 12, 10), 0.75, 5),
]


def _volume(shape, seed=0):
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


class Counting:
    """A model that counts its calls and windows; ``fn`` maps a batch to probabilities."""

    def __init__(self, fn):
        self.fn, self.calls, self.windows = fn, 0, 0

    def __call__(self, x):
        assert x.dtype == np.float32 and x.ndim == 5 and x.shape[-1] == 1
        self.calls += 1
        self.windows += len(x)
        return self.fn(x)


@pytest.mark.parametrize("shape,window,overlap,batch", CASES)
def test_a_constant_model_comes_back_exactly(shape, window, overlap, batch):
    value = np.float32([0.1, 0.3, 0.6])  # none of them exact in binary
    model = Counting(lambda x: np.broadcast_to(value, x.shape[:4] + (3,)).copy())
    probs = sliding.sliding_window(model, _volume(shape), window, overlap, batch=batch)
    assert probs.shape == shape + (3,) and probs.dtype == np.float32
    for c in range(3):
        assert (probs[..., c] == value[c]).all()
    padded = [max(n, w) for n, w in zip(shape, window)]
    n_windows = math.prod(len(sliding.window_starts(n, w, overlap)) for n, w in zip(padded, window))
    assert model.windows == n_windows and model.calls == math.ceil(n_windows / batch)


@pytest.mark.parametrize("shape,window,overlap,batch", CASES)
def test_a_voxelwise_model_puts_every_window_back_in_place(shape, window, overlap, batch):
    # Each voxel's prediction depends on that voxel alone, so every window agrees on it:
    # the result is the model applied to the whole volume, bit for bit, only if every
    # window went back where it was cut from.
    volume = _volume(shape, seed=1)
    model = Counting(lambda x: np.concatenate([x, np.float32(1) - x, x * x], axis=-1))
    probs = sliding.sliding_window(model, volume, window, overlap, batch=batch)
    np.testing.assert_array_equal(probs[..., 0], volume)
    np.testing.assert_array_equal(probs[..., 1], np.float32(1) - volume)
    np.testing.assert_array_equal(probs[..., 2], volume * volume)
    # (D, H, W, 1) is accepted too
    again = sliding.sliding_window(model, volume[..., None], window, overlap, batch=batch)
    np.testing.assert_array_equal(again, probs)


def test_overlaps_are_blended_with_the_gaussian_of_each_window():
    # Windows along z only; each predicts its own origin. A voxel's result is the mean of
    # the origins of the windows covering it, weighted by their Gaussians at that voxel.
    window, n, sigma_scale = (16, 8, 8), 40, 0.125
    origins = sliding.window_starts(n, window[0], 0.5)
    assert origins.tolist() == [0, 8, 16, 24]
    volume = np.zeros((n, 8, 8), np.float32)
    volume[:, 0, 0] = np.arange(n)  # a window's first voxel holds its origin

    def model(x):
        return np.broadcast_to(x[:, :1, :1, :1, :], x.shape).astype(np.float32)

    probs = sliding.sliding_window(model, volume, window, 0.5, sigma_scale)
    sigma = sigma_scale * window[0]
    for z in range(n):
        covering = [o for o in origins if o <= z < o + window[0]]
        g = np.array([math.exp(-((z - o - (window[0] - 1) / 2) ** 2) / (2 * sigma ** 2))
                      for o in covering])
        expected = float((g * covering).sum() / g.sum())
        # weights are quantised to integers up to 2**22: close, not equal
        assert probs[z, 3, 3, 0] == pytest.approx(expected, abs=0.02), z
    # near a window's centre, that window decides; between two centres, both count
    assert probs[8 + 7, 3, 3, 0] == pytest.approx(8, abs=0.01)
    assert 8 < probs[20, 3, 3, 0] < 16
    # in a corner every window's weight is tiny, floored at 1 (still a blend, not a hole)
    assert 0 < probs[15, 0, 0, 0] < 8


def test_window_starts_are_even_and_end_at_the_edge():
    for n in range(1, 120, 7):
        for w in (8, 16, 32):
            for overlap in (0.0, 0.25, 0.5, 0.75):
                starts = sliding.window_starts(n, w, overlap)
                if n <= w:
                    assert starts.tolist() == [0]
                    continue
                assert starts[0] == 0 and starts[-1] == n - w
                gaps = np.diff(starts)
                assert (gaps > 0).all() and gaps.max() <= w * (1 - overlap) + 0.5
                # as few windows as that allows
                assert len(starts) == math.ceil((n - w) / max(1.0, w * (1 - overlap))) + 1


def test_gaussian_weights_are_integers_peaking_in_the_centre():
    g = sliding.gaussian_weights((9, 16, 5), 0.125)
    assert g.shape == (9, 16, 5) and g.dtype == np.float64
    assert (g == np.round(g)).all() and g.min() >= 1 and g.max() <= sliding.WEIGHT_SCALE
    assert g[4, 7, 2] == g.max() == g[4, 8, 2]  # even edge: two centre voxels
    np.testing.assert_array_equal(g, g[::-1, ::-1, ::-1])
    assert g[0, 0, 0] == 1


def test_bad_arguments_and_a_model_of_the_wrong_shape():
    v = _volume((8, 8, 8))
    ok = lambda x: np.ones(x.shape[:4] + (2,), np.float32)  # noqa: E731
    for kwargs, words in [({"overlap": 1.0}, "overlap 1.0"), ({"batch": 0}, "batch 0"),
                          ({"window": (8, 8)}, "window (8, 8)")]:
        args = {"window": (4, 4, 4), **kwargs}
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            sliding.sliding_window(ok, v, **args)
    with pytest.raises(ValueError, match=r"volume has shape \(8, 8\)"):
        sliding.sliding_window(ok, v[0], (4, 4, 4))
    with pytest.raises(ValueError, match=r"predict returned shape \(1, 4, 4, 2\)"):
        sliding.sliding_window(lambda x: np.ones((1, 4, 4, 2)), v, (4, 4, 4))


def test_a_2d_model_runs_as_windows_of_one_slice_and_comes_back_exactly():
    # What distseg-predict does with a 2D run: one window per slice, each exactly once,
    # and the model's own output, bit for bit (a single window's weight divides out).
    volume = _volume((7, 12, 12), seed=2)
    seen = []

    def model2d(x):  # (B, H, W, 1) -> (B, H, W, 2), not voxelwise: a slice's mean
        seen.append(x.shape)
        m = x.mean(axis=(1, 2), keepdims=True)
        return np.concatenate([x * m, np.float32(1) - x * m], axis=-1).astype(np.float32)

    probs = sliding.sliding_window(sliding.slicewise(model2d), volume, (1, 12, 12), batch=3)
    assert seen == [(3, 12, 12, 1), (3, 12, 12, 1), (1, 12, 12, 1)]
    np.testing.assert_array_equal(probs, model2d(volume[..., None]))
    with pytest.raises(ValueError, match="windows of depth 1"):
        sliding.sliding_window(sliding.slicewise(model2d), volume, (2, 12, 12))


# ---------------------------------------------------------------- Dice


def test_volume_dice_counts_count_voxels_per_class():
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 3, size=(35, 9, 11)).astype(np.uint8)  # 35: blocks of 16 + 3
    pred = mask.copy()
    pred[:10] = 0  # 10 slices predicted all background
    probs = np.eye(3, dtype=np.float32)[pred] * 0.5 + 0.1
    counts = metrics.volume_dice_counts(probs, mask, 3)
    for c in range(3):
        assert counts[0, c] == ((pred == c) & (mask == c)).sum()
        assert counts[1, c] == (pred == c).sum() and counts[2, c] == (mask == c).sum()
    dice = metrics.dice_from_counts(counts)
    for c in range(3):
        assert dice[c] == pytest.approx(2 * counts[0, c] / (counts[1, c] + counts[2, c]))
    assert metrics.dice_from_counts(metrics.volume_dice_counts(np.eye(3)[mask], mask, 3)) == [1.0] * 3
    only_bg = metrics.volume_dice_counts(np.eye(3)[np.zeros_like(mask)], np.zeros_like(mask), 3)
    assert metrics.dice_from_counts(only_bg) == [1.0, None, None]
    with pytest.raises(ValueError, match="mask holds label 3"):
        metrics.volume_dice_counts(probs, np.full_like(mask, 3), 3)


def test_volume_dice_counts_match_the_training_metric():
    import tensorflow as tf

    rng = np.random.default_rng(1)
    mask = rng.integers(0, 3, size=(6, 8, 8)).astype(np.uint8)
    probs = rng.random((6, 8, 8, 3)).astype(np.float32)
    ours = metrics.volume_dice_counts(probs, mask, 3)
    theirs = metrics.dice_counts(tf.constant(probs[None]), tf.constant(mask[None]), 3).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert metrics.dice_from_counts(ours) == metrics.dice_from_counts(theirs)


def test_sliding_window_on_a_file_gives_per_case_counts(tmp_path):
    # The validation path end to end: whole cases from the reader, a model that calls
    # everything above the intensity of soft tissue liver, counts per case.
    path = str(tmp_path / "v.h5")
    info = synth.make_volumes(path, cases=3, size=24, seed=0, slices_per_case=12)
    threshold = float(h5format.window(np.float32(50.0)))

    def model(x):
        liver = (x[..., 0] > threshold).astype(np.float32)
        return np.stack([1 - liver, liver, np.zeros_like(liver)], axis=-1)

    with volumes.SlabReader(path, (8, 16, 16)) as reader:
        for k in range(info.cases):
            image, mask = reader.read_case(k)
            probs = sliding.sliding_window(model, image, reader.slab, batch=2)
            counts = metrics.volume_dice_counts(probs, mask, 3)
            assert counts[2].sum() == mask.size == counts[1].sum()
            assert counts[1, 1] == (image > threshold).sum()
            assert counts[0, 2] == 0  # lesions never predicted


# ---------------------------------------------------------------- sharding cases


@pytest.mark.parametrize("n,size", [(1, 1), (5, 2), (7, 3), (2, 4), (16, 8), (0, 2)])
def test_validation_cases_go_to_exactly_one_rank(n, size):
    cases = np.arange(100, 100 + n)
    voxels = np.random.default_rng(n).integers(1000, 100000, size=n)
    for weights in (None, voxels):
        got = [sliding.shard_cases(cases, r, size, weights) for r in range(size)]
        assert sorted(np.concatenate(got).tolist()) == cases.tolist()
        assert all((np.diff(g) > 0).all() for g in got)
    if n >= size:
        load = [voxels[np.isin(cases, sliding.shard_cases(cases, r, size, voxels))].sum()
                for r in range(size)]
        # largest-first greedy: no rank exceeds the mean by more than the largest case
        assert max(load) <= voxels.sum() / size + voxels.max()


def test_shard_cases_balances_by_voxels():
    cases, voxels = np.arange(4), np.array([100, 10, 10, 80])
    assert sliding.shard_cases(cases, 0, 2, voxels).tolist() == [0]
    assert sliding.shard_cases(cases, 1, 2, voxels).tolist() == [1, 2, 3]
    assert sliding.shard_cases(cases, 0, 2).tolist() == [0, 1]
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        sliding.shard_cases(cases, 2, 2)


def test_the_inference_function_is_traced_once_for_every_batch_size():
    """A scan's last batch of windows is shorter than the others: predict's function
    must not trace again for it (it did, per batch size, with TensorFlow's retracing
    warning), and it gives each window what the model gives it alone."""
    from distseg.core.config import ModelConfig
    from distseg.inference import predict
    from distseg.networks import models

    cfg = ModelConfig(depth=2, base_filters=2, spatial_dims=3, num_classes=3, precision="float32")
    net = models.build(cfg, (8, 16, 16))
    fn = predict.inference(net)
    x = np.random.default_rng(0).normal(size=(3, 8, 16, 16, 1)).astype(np.float32)
    outs = [fn(x[:n]).numpy() for n in (1, 3, 2)]
    assert fn.experimental_get_tracing_count() == 1
    np.testing.assert_allclose(outs[1][:2], outs[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1][:1], net(x[:1], training=False).numpy(), rtol=1e-5, atol=1e-6)
