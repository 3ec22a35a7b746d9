"""2D validation's per-case Dice (``distseg.training.step.validation.score_slices``): each
validation case scored whole by the one rank that holds its first slice, the totals
unchanged, and the eval step's per-sample counts held to the numpy form."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from distseg import metrics
from distseg.core import config as config_lib
from distseg.data import feeds, synth
from distseg.training.step import factory, validation


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A smoke model (untrained) on 5 phantom cases of 6 slices, 2 of them validation."""
    path = str(tmp_path_factory.mktemp("cases") / "tiny.h5")
    synth.make_dataset(path, cases=5, size=32, seed=3, slices_per_case=6, val_fraction=0.4)
    cfg = config_lib.resolve("smoke", overrides={"data.path": path,
                                                 "run_dir": str(tmp_path_factory.mktemp("run"))})
    cfg, feed = feeds.open_feed(cfg, ranks=1, check_labels=False)
    model, _ = factory.model_and_optimizer(cfg, feed.input_shape, seed=0)
    step = factory.eval_step(cfg, model, feed.input_shape)
    reader = feed.open_reader()
    yield cfg, feed, reader, step, model
    reader.close()


def _expected_case_dice(feed, reader, model, num_classes: int) -> dict[str, list]:
    """Each validation case's Dice from all its slices at once, in numpy."""
    info = feed.info
    out = {}
    for case in np.unique(info.case_ids[info.val_indices]):
        ids = info.val_indices[info.case_ids[info.val_indices] == case]
        images, masks = reader.read(ids)
        probs = model(images, training=False).numpy()
        out[str(int(case))] = metrics.dice_from_counts(
            metrics.volume_dice_counts(probs, masks, num_classes))
    return out


@pytest.mark.parametrize("size", [1, 2, 5])
def test_each_case_is_scored_whole_by_one_rank_and_the_totals_do_not_change(scored, size):
    cfg, feed, reader, step, model = scored
    n = cfg.model.num_classes
    assert len(feed.info.val_indices) == 12  # cases of 6 slices: 5 ranks split both
    one = validation.score_slices(cfg, feed, reader, step, 0, 1)
    parts = [validation.score_slices(cfg, feed, reader, step, r, size) for r in range(size)]
    np.testing.assert_array_equal(sum(p.counts for p in parts), one.counts)
    # float32 loss sums of other batches: equal to rounding; the counts are exact.
    np.testing.assert_allclose(sum(p.sums for p in parts), one.sums, rtol=1e-5)
    assert sum(p.samples for p in parts) == one.samples == 12
    logged = [case for p in parts for case in p.cases]
    assert sorted(logged) == sorted(set(logged)) == sorted(one.cases)  # each case once
    expected = _expected_case_dice(feed, reader, model, n)
    assert len(expected) == 2
    merged = {case: dice for p in parts for case, dice in p.cases.items()}
    assert merged.keys() == expected.keys()
    for case, dice in expected.items():
        assert merged[case] == pytest.approx(dice, abs=1e-12)
        assert any(d is not None for d in dice)
    # The cases are in the epoch record as the report reads them.
    rec = validation.record(parts[0], validation.Totals(12, False, one.counts, one.sums),
                            feed.info.class_names, cfg.train.loss)
    assert set(rec["val_cases_local"]) == set(parts[0].cases)


def test_five_ranks_own_the_cases_of_their_first_slices(scored):
    cfg, feed, reader, step, _ = scored
    info = feed.info
    cases = [sorted(validation.score_slices(cfg, feed, reader, step, r, 5).cases)
             for r in range(5)]
    # 12 slices over 5 ranks: 3, 3, 2, 2, 2; case A is slices 0-5, case B 6-11.
    a, b = (str(int(c)) for c in np.unique(info.case_ids[info.val_indices]))
    assert cases == [[a], [], [b], [], []]


def test_varying_batches_do_not_retrace_the_eval_step(scored):
    cfg, feed, reader, step, _ = scored
    for size in (1, 3, 5):
        for r in range(size):
            validation.score_slices(cfg, feed, reader, step, r, size)
    assert step.experimental_get_tracing_count() == 1


def test_per_sample_counts_match_numpy_and_add_up_to_the_batch():
    rng = np.random.default_rng(2)
    masks = rng.integers(0, 3, size=(4, 8, 8)).astype(np.uint8)
    probs = rng.random((4, 8, 8, 3)).astype(np.float32)
    each = metrics.sample_dice_counts(tf.constant(probs), tf.constant(masks), 3).numpy()
    assert each.shape == (4, 3, 3)
    for i in range(4):
        np.testing.assert_array_equal(each[i], metrics.volume_dice_counts(probs[i], masks[i], 3))
    np.testing.assert_array_equal(
        metrics.dice_counts(tf.constant(probs), tf.constant(masks), 3).numpy(), each.sum(0))
