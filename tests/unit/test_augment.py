"""``data.augment``: draws keyed by (seed, epoch, sample id) only, masks that move with
their images, each transform at its probability, and the reader thread that applies it
(``Prefetcher``, ``PlannedBatches``). Real phantom anatomy, real readers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.data import augment, prefetch, synth
from distseg.data import slices as data
from distseg.training.progress import plan as plan_lib

from support import write_config

SHAPES = {2: (48, 48), 3: (12, 40, 40)}
#: Only the transforms that move voxels, each certain to fire.
SPATIAL = dataclasses.replace(augment.with_only(augment.DEFAULT, "rotation", "scaling", "elastic"),
                              p_rotation=1.0, p_scaling=1.0, p_elastic=1.0)


def phantom(dims: int, batch: int, channels: int = 1, seed: int = 0):
    """(images float32 (B, *spatial, C), masks uint8 (B, *spatial)) of phantom anatomy:
    2D slices of one phantom volume, or 3D crops of several."""
    rng = np.random.default_rng(seed)
    shape = SHAPES[dims]
    if dims == 2:
        hu, labels = synth.phantom_case(rng, shape[0], batch)
    else:
        cases = [synth.phantom_case(rng, shape[1], shape[0]) for _ in range(batch)]
        hu, labels = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    image = synth.window(hu).astype(np.float32)
    images = np.stack([image * (1.0 + 0.5 * c) for c in range(channels)], axis=-1)
    return images, labels


# ------------------------------------------------------------------------ identity


def test_none_is_the_identity_and_no_transform_at_all():
    images, masks = phantom(2, 3)
    out = augment.Augmenter("none", 0, 2)([0, 1, 2], 5, images, masks)
    assert out[0] is images and out[1] is masks
    assert augment.for_training("none", 0, 2) is None
    assert isinstance(augment.for_training("default", 0, 3), augment.Augmenter)
    assert set(augment.PRESETS) == set(config_lib.AUGMENTS)


def test_unknown_kinds_and_shapes_are_refused():
    with pytest.raises(ValueError, match="data.augment must be one of"):
        augment.Augmenter("heavy", 0, 2)
    with pytest.raises(ValueError, match="spatial_dims must be 2 or 3"):
        augment.Augmenter("default", 0, 4)
    images, masks = phantom(2, 2)
    with pytest.raises(ValueError, match=r"augment \(3D\)"):
        augment.Augmenter("default", 0, 3)([0, 1], 0, images, masks)
    with pytest.raises(ValueError, match="for 3 ids"):
        augment.Augmenter("default", 0, 2)([0, 1, 2], 0, images, masks)


# ------------------------------------------------------------------ shapes, classes


@pytest.mark.parametrize("kind", ["light", "default"])
@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("dims", [2, 3])
def test_shapes_dtypes_and_classes_are_kept(kind, channels, dims):
    images, masks = phantom(dims, 4, channels)
    before = images.copy()
    augmenter = augment.Augmenter(kind, 0, dims)
    changed = 0
    for epoch in range(3):
        out, labels = augmenter(np.arange(4), epoch, images, masks)
        assert out.shape == images.shape and out.dtype == np.float32
        assert labels.shape == masks.shape and labels.dtype == np.uint8
        assert set(np.unique(labels)) <= {0, 1, 2}
        assert np.isfinite(out).all()
        changed += int(not np.array_equal(out, images))
    assert np.array_equal(images, before)  # the inputs are left as they were
    assert changed == 3


def test_float16_images_come_out_float32():
    images, masks = phantom(2, 2)
    out, _ = augment.Augmenter("default", 1, 2)([0, 1], 0, images.astype(np.float16), masks)
    assert out.dtype == np.float32


# --------------------------------------------------------------------- determinism


@pytest.mark.parametrize("dims", [2, 3])
def test_a_sample_draws_the_same_in_any_batch_and_order(dims):
    images, masks = phantom(dims, 2)
    augmenter = augment.Augmenter("default", 11, dims)
    together = augmenter([3, 7], 4, images, masks)
    apart = [augmenter([3], 4, images[:1], masks[:1]), augmenter([7], 4, images[1:], masks[1:])]
    swapped = augment.Augmenter("default", 11, dims)([7, 3], 4, images[::-1], masks[::-1])
    for k in (0, 1):
        assert np.array_equal(together[k], np.concatenate([apart[0][k], apart[1][k]]))
        assert np.array_equal(together[k], swapped[k][::-1])
    assert not np.array_equal(together[0], images)


def test_epochs_ids_and_seeds_draw_differently():
    a, b = augment.Augmenter("default", 0, 2), augment.Augmenter("default", 1, 2)
    shape = SHAPES[2]
    draws = {(s, e, i): aug.draw(e, i, shape, 1) for s, aug in ((0, a), (1, b))
             for e in range(4) for i in range(50)}
    keys = [(d.field_seed, d.mirror, d.rotation) for d in draws.values()]
    assert len({k[0] for k in keys}) == len(keys)  # every (seed, epoch, id) its own stream
    # The same key, drawn again, draws the same.
    again = a.draw(2, 17, shape, 1)
    assert again.field_seed == draws[(0, 2, 17)].field_seed and again.mirror == draws[(0, 2, 17)].mirror
    # One sample over epochs sees different transforms.
    mirrors = {draws[(0, e, 5)].mirror for e in range(4)} | {a.draw(e, 5, shape, 1).mirror for e in range(4, 20)}
    assert len(mirrors) > 1


# -------------------------------------------------------------- masks follow images


@pytest.mark.parametrize("dims", [2, 3])
def test_masks_stay_aligned_with_their_images(dims):
    """An image whose intensity is its mask's label, moved by rotation, scaling and an
    elastic field together: where the new mask says k, the new image is near k."""
    _, masks = phantom(dims, 4)
    images = masks[..., None].astype(np.float32)
    out, labels = augment.Augmenter(SPATIAL, 3, dims)(np.arange(4), 0, images, masks)
    assert not np.array_equal(labels, masks)
    err = np.abs(out[..., 0] - labels)
    # Linear and nearest differ on the boundaries only, mostly by less than half a step.
    assert np.mean(err < 0.5) > 0.97 and np.mean(err < 1e-3) > 0.8, np.mean(err < 0.5)
    for k in (0, 1, 2):
        at = err[labels == k]
        assert at.size > 0 and np.median(at) < 0.5, (k, at.size)
        if at.size >= 200:  # a structure larger than its boundary
            assert np.median(at) < 1e-3, (k, np.median(at))


def test_masks_are_resampled_by_nearest_neighbour():
    """Class 2 beside class 0 and nothing between: no voxel may become the 1 a linear
    blend of 0 and 2 would make."""
    _, masks = phantom(2, 4)
    masks = np.where(masks > 0, 2, 0).astype(np.uint8)
    out, labels = augment.Augmenter(SPATIAL, 3, 2)(np.arange(4), 0, masks[..., None] * 1.0, masks)
    assert set(np.unique(labels)) == {0, 2}


def test_outside_the_volume_is_the_image_minimum_and_background():
    images, masks = phantom(2, 1)
    images = images + 0.25  # a minimum of 0.25, not 0
    shrink = dataclasses.replace(augment.with_only(augment.DEFAULT, "scaling"), p_scaling=1.0,
                                 scaling=(1.4, 1.4))  # samples 1.4x the image: a rim outside
    out, labels = augment.Augmenter(shrink, 0, 2)([0], 0, images, masks)
    corner = (slice(0, 3), slice(0, 3))
    assert np.allclose(out[0][corner], images[0].min()) and (labels[0][corner] == 0).all()


def test_mirroring_flips_image_and_mask_together():
    images, masks = phantom(3, 2, channels=2)
    mirror = dataclasses.replace(augment.with_only(augment.DEFAULT, "mirror"), p_mirror=1.0)
    out, labels = augment.Augmenter(mirror, 0, 3)([0, 1], 0, images, masks)
    assert np.array_equal(out, images[:, ::-1, ::-1, ::-1])
    assert np.array_equal(labels, masks[:, ::-1, ::-1, ::-1])


def test_a_flat_slab_turns_in_plane_only():
    """nnU-Net's dummy-2D rule: depth 8 of 40 (5x) keeps every voxel in its slice."""
    d = augment.Augmenter(SPATIAL, 0, 3).draw(0, 1, (8, 40, 40), 1)
    assert d.rotation[1:] == (0.0, 0.0) and d.scale[0] == 1.0 and not d.elastic[0].any()
    coords = augment.coordinates(d, (8, 40, 40))
    assert np.allclose(coords[0], np.arange(8)[:, None, None])
    cube = augment.Augmenter(SPATIAL, 0, 3).draw(0, 1, (24, 40, 40), 1)
    assert all(a != 0.0 for a in cube.rotation) and cube.elastic[0].any()


# ---------------------------------------------------------------- the transforms


def test_intensity_transforms_do_what_they_say_per_channel():
    images, masks = phantom(2, 1, channels=4)
    x = images[0]
    base = augment.Augmenter("none", 0, 2).draw(0, 0, SHAPES[2], 4)  # nothing fired
    ones = np.array([0.8, 1.2, 0.9, 1.1], np.float32)

    bright, _ = augment.apply(base._replace(brightness=ones), x, masks[0])
    assert np.allclose(bright, x * ones)

    contrast, _ = augment.apply(base._replace(contrast=ones), x, masks[0])
    for c in range(4):
        assert contrast[..., c].min() >= x[..., c].min() and contrast[..., c].max() <= x[..., c].max()
        assert np.std(contrast[..., c]) / np.std(x[..., c]) == pytest.approx(ones[c], rel=0.1)

    for field in ("gamma", "gamma_inverted"):
        out, _ = augment.apply(base._replace(**{field: np.full(4, 1.5, np.float32)}), x, masks[0])
        assert np.allclose(out.mean(axis=(0, 1)), x.mean(axis=(0, 1)), atol=1e-4)
        assert np.allclose(out.std(axis=(0, 1)), x.std(axis=(0, 1)), rtol=1e-3)
        assert not np.allclose(out, x, atol=1e-2)
    gamma, _ = augment.apply(base._replace(gamma=np.full(4, 1.5, np.float32)), x, masks[0])
    inverted, _ = augment.apply(base._replace(gamma_inverted=np.full(4, 1.5, np.float32)), x, masks[0])
    assert not np.allclose(gamma, inverted, atol=1e-2)

    noisy, _ = augment.apply(base._replace(noise=0.1), x, masks[0])
    ratio = (noisy - x).std(axis=(0, 1)) / x.std(axis=(0, 1))
    assert np.allclose(ratio, 0.1, rtol=0.1)

    blur = (None, (1.0, 1.0), None, (0.5, 1.0))
    blurred, _ = augment.apply(base._replace(blur=blur), x, masks[0])
    assert np.array_equal(blurred[..., 0], x[..., 0]) and np.array_equal(blurred[..., 2], x[..., 2])
    for c in (1, 3):
        assert np.abs(np.diff(blurred[..., c])).mean() < np.abs(np.diff(x[..., c])).mean()


def test_two_sided_factors_fall_below_and_above_one_alike():
    f = augment.two_sided(np.random.default_rng(0), 0.7, 1.5, 20000)
    assert f.min() >= 0.7 and f.max() <= 1.5
    assert np.mean(f < 1.0) == pytest.approx(0.5, abs=0.02)


def _within(count: int, n: int, p: float) -> bool:
    """``count`` of ``n`` draws is within 5 binomial standard deviations of ``n p``."""
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("kind,dims", [("default", 2), ("default", 3), ("light", 2)])
def test_each_transform_fires_at_its_probability(kind, dims):
    p, n = augment.PRESETS[kind], 3000
    augmenter = augment.Augmenter(kind, 5, dims)
    shape = (24, 40, 40) if dims == 3 else SHAPES[2]
    draws = [augmenter.draw(e, i, shape, 2) for e in range(3) for i in range(n // 3)]
    for field in ("rotation", "scaling", "elastic", "noise", "blur", "brightness", "contrast",
                  "gamma_inverted", "gamma"):
        name = "scale" if field == "scaling" else field
        count = sum(getattr(d, name) is not None for d in draws)
        assert _within(count, n, getattr(p, f"p_{field}")), (field, count)
    for axis in range(dims):
        assert _within(sum(axis in d.mirror for d in draws), n, p.p_mirror)
    blurred = [c is not None for d in draws if d.blur is not None for c in d.blur]
    if blurred:
        assert _within(sum(blurred), len(blurred), p.p_blur_channel)
    # Within its range, and one factor per channel.
    scales = [d.scale[0] for d in draws if d.scale is not None]
    assert min(scales) >= p.scaling[0] and max(scales) <= p.scaling[1]
    limit = math.radians(p.rotation_deg if dims == 2 else p.rotation_deg_3d)
    assert max(abs(a) for d in draws if d.rotation is not None for a in d.rotation) <= limit
    assert all(len(d.brightness) == 2 for d in draws if d.brightness is not None)


def test_the_elastic_field_is_smooth_and_scaled_by_the_edge():
    rng = np.random.default_rng(0)
    coarse = rng.standard_normal((2, augment.ELASTIC_NODES, augment.ELASTIC_NODES)).astype(np.float32)
    field = augment.elastic_field(coarse * 3.0, (64, 96))
    assert field.shape == (2, 64, 96)
    assert np.abs(np.diff(field, axis=1)).max() < 0.5 and np.abs(np.diff(field, axis=2)).max() < 0.5
    assert 0.5 < field.std() < 3.0
    assert np.allclose(augment.elastic_field(coarse, (64, 96)) * 3.0, field, atol=1e-5)


# --------------------------------------------------------------- the reader thread


@pytest.fixture(scope="module")
def slices_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("aug") / "phantom.h5")
    synth.make_dataset(path, cases=4, size=32, seed=0, slices_per_case=8)
    return path


def test_the_prefetcher_augments_epoch_batches_and_passes_plain_ids(slices_file):
    augmenter = augment.Augmenter("default", 2, 2)
    items = [prefetch.EpochBatch(0, np.array([3, 0])), np.array([7]), prefetch.EpochBatch(5, np.array([3, 0]))]
    with data.SliceReader(slices_file) as reader:
        got = list(prefetch.Prefetcher(reader, iter(items), depth=1, transform=augmenter))
        want = [augmenter(np.array([3, 0]), e, *reader.read([3, 0])) for e in (0, 5)]
        plain = reader.read([7])
    assert np.array_equal(got[0][1], want[0][0]) and np.array_equal(got[0][2], want[0][1])
    assert np.array_equal(got[2][1], want[1][0]) and np.array_equal(got[2][2], want[1][1])
    assert np.array_equal(got[1][1], plain[0]) and np.array_equal(got[1][2], plain[1])
    assert not np.array_equal(got[0][1], got[2][1])  # epoch 0 and 5 drew differently


def test_planned_batches_hand_augmented_batches_that_ranks_share(slices_file, tmp_path):
    """A fixed global batch of 4 over 2 ranks: each rank's augmented part is the rows
    of the one-process batch, augmented alike."""
    cfg = config_lib.resolve("smoke", overrides={"train.global_batch": 4, "train.epochs": 2,
                                                 "data.path": slices_file, "run_dir": str(tmp_path)})
    ids = data.examine(slices_file).train_indices
    augmenter = augment.for_training("default", cfg.train.seed, 2)
    with data.SliceReader(slices_file) as reader:
        def batches(rank: int, size: int) -> list:
            plan = plan_lib.EpochPlan.of(cfg.train, len(ids), size)
            planned = plan_lib.PlannedBatches(reader, ids, rank, size, cfg.train.epochs,
                                              cfg.train.seed, 2, augmenter)
            planned.use(plan, (0, 0))
            try:
                return [planned.next() for _ in range(2 * plan.steps)]
            finally:
                planned.close()
        one, parts = batches(0, 1), [batches(r, 2) for r in (0, 1)]
        first = reader.read(one[0][0])
    assert not np.array_equal(one[0][1], first[0])  # augmented
    for whole, left, right in zip(one, *parts):
        assert np.array_equal(whole[0], np.concatenate([left[0], right[0]]))
        assert np.array_equal(whole[1], np.concatenate([left[1], right[1]]))
        assert np.array_equal(whole[2], np.concatenate([left[2], right[2]]))


def test_presets_and_a_run_from_before_augmentation_resumes_without_it(tmp_path):
    """No preset augments (liver2d stopped when it left GroupNorm: the real-CT study); a
    config.json written before ``data.augment`` existed resumes as it trained: none; one
    that augmented resumes augmenting."""
    made = {name: config_lib.resolve(name, None, {"data.path": "x.h5", "run_dir": "r"})
            for name in config_lib.PRESETS}
    assert {n: c.data.augment for n, c in made.items()} == {
        "liver2d": "none", "demo": "none", "smoke": "none", "liver3d": "none", "smoke3d": "none"}
    old = made["liver2d"].to_dict()
    del old["data"]["augment"]
    run = write_config(tmp_path / "run", old)
    assert config_lib.for_resume(run).data.augment == "none"
    old["data"]["augment"] = "default"
    write_config(run, old)
    assert config_lib.for_resume(run).data.augment == "default"
