"""2D foreground oversampling (``data.foreground_fraction`` on a slice file): the share
of training slices replaced by a slice holding foreground, the same draws for any
split of the ids over ranks, validation reads untouched, and only training slices
with foreground drawn."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.data import feeds, slices

N = 200


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """200 slices of 8x8 whose image value is the slice id; foreground only in the
    training slices 10, 11 and 12 and the validation slice 150."""
    path = str(tmp_path_factory.mktemp("fg") / "sparse.h5")
    images = np.broadcast_to(np.arange(N, dtype=np.float32)[:, None, None], (N, 8, 8)).copy()
    masks = np.zeros((N, 8, 8), np.uint8)
    masks[[10, 11, 12, 150], 3:5, 3:5] = 1
    split = np.where(np.arange(N) < 140, 0, 1).astype(np.uint8)
    slices.write_dataset(path, images, masks, case_id=np.arange(N) // 10, split=split,
                         source="test", hu_window=(0, 1))
    return path


def _feed(path: str, fraction: float) -> feeds.SliceFeed:
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=path,
                                                            foreground_fraction=fraction),
                              model=dataclasses.replace(cfg.model, image_size=8))
    return feeds.SliceFeed(cfg, slices.examine(path))


def _read_ids(reader, ids, epoch=None) -> list[int]:
    images, _ = reader.read(ids, epoch) if epoch is not None else reader.read(ids)
    return [int(v) for v in images[:, 0, 0, 0]]


def test_only_training_slices_holding_foreground_are_candidates(sparse):
    feed = _feed(sparse, 0.33)
    assert slices.foreground_slices(sparse, feed.train_ids).tolist() == [10, 11, 12]


def test_a_third_of_the_slices_read_are_replaced_by_foreground_ones(sparse):
    feed = _feed(sparse, 1 / 3)
    ids = np.asarray(feed.train_ids)
    with feed.open_reader() as reader:
        got = np.array(_read_ids(reader, ids, epoch=4))
    replaced = got != ids
    assert set(got[replaced]) <= {10, 11, 12}
    n, f = len(ids), 1 / 3
    # Among the ids that are not foreground slices themselves, replacement is binomial.
    plain = ~np.isin(ids, [10, 11, 12])
    assert abs(replaced[plain].sum() - plain.sum() * f) < 4 * np.sqrt(n * f * (1 - f))
    with _feed(sparse, 0.0).open_reader() as reader:
        assert _read_ids(reader, ids, epoch=4) == ids.tolist()


def test_the_draws_do_not_depend_on_how_the_ids_are_split(sparse):
    feed = _feed(sparse, 0.5)
    ids = np.asarray(feed.train_ids)[:64]
    with feed.open_reader() as reader:
        whole = _read_ids(reader, ids, epoch=2)
        halves = _read_ids(reader, ids[32:], epoch=2) + _read_ids(reader, ids[:32], epoch=2)
        other_epoch = _read_ids(reader, ids, epoch=3)
    assert whole == halves[32:] + halves[:32]
    assert whole != other_epoch


def test_validation_reads_are_never_replaced(sparse):
    feed = _feed(sparse, 1.0)
    val = slices.examine(sparse).val_indices
    with feed.open_reader() as reader:
        assert _read_ids(reader, val) == val.tolist()


def test_the_lr_range_test_reads_foreground_at_the_configured_share(sparse):
    """The range test reads its batches as training does (``prefetch.read_as_training``):
    with the same share of slices made to hold foreground, not the plain slices."""
    from distseg.training.progress.plan import EpochPlan
    from distseg.training.startup import lrfind

    feed = _feed(sparse, 1 / 3)
    cfg = config_lib.smoke()
    plan = EpochPlan.of(cfg.train, len(feed.train_ids), 1)
    ids = np.asarray(feed.train_ids)
    with feed.open_reader() as reader:
        images, masks, failure = lrfind._read(reader, ids, 0, plan, None, cfg, feed)
    assert failure is None
    got = images[:, 0, 0, 0].astype(int)
    replaced = got != ids
    plain = ~np.isin(ids, [10, 11, 12])
    n, f = int(plain.sum()), 1 / 3
    assert abs(replaced[plain].sum() - n * f) < 4 * np.sqrt(n * f * (1 - f))
    # Every replaced slice holds foreground, as training's do.
    assert (masks[replaced].reshape(int(replaced.sum()), -1).max(axis=1) > 0).all()
