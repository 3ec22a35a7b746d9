"""The volume layout, its slab grid, slab sharding and the slab reader (real HDF5 files)."""

import math
import os
import re
import threading

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from distseg.cli.data import data as data_cli
from distseg.core import schema
from distseg.core.errors import InputError
from distseg.data import folds, h5format, lits, prefetch, sharding, synth, volumes
from distseg.data import slices as data

SLAB = (8, 16, 16)
#: Shapes of the hand-made file: one case shorter than SLAB on every axis, one on one
#: axis, one that tiles exactly, and two that need the last tile shifted inward.
SHAPES = [(5, 10, 12), (20, 12, 40), (16, 32, 32), (11, 23, 17), (9, 33, 16)]
SPLITS = [0, 0, 1, 0, 0]


def _phantom(seed: int, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    d, h, w = shape
    hu, labels = synth.phantom_case(np.random.default_rng(seed), h, d, width=w)
    return h5format.window(hu), labels


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Five phantom volumes of the shapes ``SHAPES``, case ids 100..104."""
    path = str(tmp_path_factory.mktemp("v") / "mixed.h5")
    cases = [_phantom(k, s) for k, s in enumerate(SHAPES)]
    info = volumes.write_volumes(path, [c[0] for c in cases], [c[1] for c in cases],
                                 [100 + k for k in range(5)], SPLITS, source="test",
                                 hu_window=h5format.HU_WINDOW)
    return path, info, cases


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("s") / "synth.h5")
    return path, synth.make_volumes(path, cases=6, size=32, seed=2, slices_per_case=24)


# ---------------------------------------------------------------- the grid


@pytest.mark.parametrize("n,s", [(1, 8), (8, 8), (9, 8), (16, 8), (17, 8), (100, 32), (31, 32), (33, 32)])
def test_tiles_cover_the_axis_with_the_last_one_shifted_inward(n, s):
    starts = volumes.tile_starts(n, s)
    assert starts[0] == 0 and len(starts) == max(1, math.ceil(n / s))
    if n <= s:
        assert starts.tolist() == [0]
        return
    assert starts[-1] == n - s  # ends at the edge, never past it
    assert (np.diff(starts) <= s).all() and (np.diff(starts) > 0).all()  # no gap, no repeat
    covered = np.zeros(n, bool)
    for a in starts:
        covered[a:a + s] = True
    assert covered.all()


def test_slab_ids_are_unique_and_locate_their_case_and_origin(mixed):
    _, info, _ = mixed
    grid = volumes.SlabGrid.of(info.shapes, SLAB)
    # 1 + (3*1*3) + (2*2*2) + (2*2*2) + (2*3*1)
    assert grid.total == 1 + 9 + 8 + 8 + 6
    assert grid.offsets.tolist() == [0, 1, 10, 18, 26, 32]
    cases, starts = grid.locate(np.arange(grid.total))
    assert cases.tolist() == [0] + [1] * 9 + [2] * 8 + [3] * 8 + [4] * 6
    for k, shape in enumerate(SHAPES):
        covered = np.zeros(shape, bool)
        mine = starts[cases == k]
        assert len({tuple(s) for s in mine}) == len(mine)  # no tile twice
        for z, y, x in mine:
            covered[z:z + SLAB[0], y:y + SLAB[1], x:x + SLAB[2]] = True
        assert covered.all(), f"case {k} not covered"
    assert grid.padded().tolist() == [0, 1]  # shorter than the slab on some axis
    assert volumes.slab_ids(info, SLAB, "train").tolist() == list(range(0, 10)) + list(range(18, 32))
    assert volumes.slab_ids(info, SLAB, "val").tolist() == list(range(10, 18))  # case 2
    with pytest.raises(ValueError, match="slab ids must be in 0..31"):
        grid.locate([32])


@pytest.mark.parametrize("ranks,batch", [(1, 4), (2, 1), (2, 3), (3, 2), (4, 1), (5, 2), (8, 1)])
def test_slab_shards_are_disjoint_and_cover_every_slab_once(synthetic, ranks, batch):
    _, info = synthetic
    ids = volumes.slab_ids(info, SLAB, "train")
    assert len(ids) >= 40
    for epoch in range(3):
        shards = [sharding.shard_batches(ids, r, ranks, batch, epoch, seed=5) for r in range(ranks)]
        assert len({len(s) for s in shards}) == 1  # the same number of steps everywhere
        flat = np.concatenate([np.concatenate(s) for s in shards])
        assert len(np.unique(flat)) == len(flat), "a slab went to two ranks"
        expected = len(ids) if batch > 1 or len(ids) % ranks == 0 else len(ids) - len(ids) % ranks
        assert len(flat) == expected and set(flat.tolist()) <= set(ids.tolist())
        digests = [schema.sample_digest(np.concatenate(s)) for s in shards]
        if expected == len(ids):
            assert schema.combine_digests(digests) == schema.sample_digest(ids)


# ---------------------------------------------------------------- reading


def test_grid_slabs_read_exactly_and_short_volumes_are_zero_padded(mixed):
    path, info, cases = mixed
    grid = volumes.SlabGrid.of(info.shapes, SLAB)
    ids = np.array([0, 3, 17, 9, 31, 26])
    with volumes.SlabReader(path, SLAB) as reader:
        images, masks = reader.read(ids, epoch=4)
    assert images.shape == (6,) + SLAB + (1,) and images.dtype == np.float32
    assert masks.shape == (6,) + SLAB and masks.dtype == np.uint8
    for b, (k, start) in enumerate(zip(*grid.locate(ids))):
        image, mask = cases[k]
        want_i = np.zeros(SLAB, np.float32)
        want_m = np.zeros(SLAB, np.uint8)
        region = tuple(slice(a, a + s) for a, s in zip(start, SLAB))
        part_i, part_m = image[region], mask[region]
        inside = tuple(slice(0, n) for n in part_i.shape)
        want_i[inside], want_m[inside] = part_i, part_m
        np.testing.assert_array_equal(images[b, ..., 0], want_i)
        np.testing.assert_array_equal(masks[b], want_m)
    # case 0 (5x10x12) sits at the slab's origin, zeros beyond it
    assert (images[0, 5:] == 0).all() and (images[0, :, 10:] == 0).all() and (masks[0, :, :, 12:] == 0).all()
    assert images[0, :5, :10, :12].max() > 0


def test_whole_cases_read_back_as_written(mixed):
    path, info, cases = mixed
    with volumes.SlabReader(path, SLAB) as reader:
        for k in range(info.cases):
            image, mask = reader.read_case(k)
            assert image.dtype == np.float32 and image.shape == cases[k][0].shape + (1,)
            np.testing.assert_array_equal(image[..., 0], cases[k][0])  # channels last
            np.testing.assert_array_equal(mask, cases[k][1])


def test_foreground_share_is_binomial_and_the_slabs_hold_foreground(synthetic):
    path, info = synthetic
    ids = volumes.slab_ids(info, SLAB, "train")
    f = 0.3
    with volumes.SlabReader(path, SLAB, foreground_fraction=f, seed=11) as reader:
        draws = [reader.plan(ids, epoch)[2] for epoch in range(40)]
        n, hits = sum(len(d) for d in draws), int(sum(d.sum() for d in draws))
        sigma = math.sqrt(n * f * (1 - f))
        assert abs(hits - n * f) < 4 * sigma, (hits, n)  # every case here has foreground
        cases, starts, biased = reader.plan(ids, 3)
        _, masks = reader.read(ids, 3)
    assert biased.any() and not biased.all()
    assert all(masks[b].any() for b in np.flatnonzero(biased))
    # re-centred slabs moved off the grid (most of them), the others did not
    grid_starts = volumes.SlabGrid.of(info.shapes, SLAB).locate(ids)[1]
    assert (starts[~biased] == grid_starts[~biased]).all()
    assert (starts[biased] != grid_starts[biased]).any(axis=1).mean() > 0.5
    with volumes.SlabReader(path, SLAB, foreground_fraction=0.0, seed=11) as none, \
            volumes.SlabReader(path, SLAB, foreground_fraction=1.0, seed=11) as every:
        assert not none.plan(ids, 0)[2].any()
        assert every.plan(ids, 0)[2].all()
        share = {name: np.mean([m.any() for m in r.read(ids, 0)[1]]) for name, r in
                 (("grid", none), ("foreground", every))}
    assert share["foreground"] == 1.0 > share["grid"]


def test_foreground_decisions_depend_on_seed_epoch_and_id_only(synthetic):
    path, info = synthetic
    ids = volumes.slab_ids(info, SLAB, "train")
    with volumes.SlabReader(path, SLAB, 0.5, seed=3) as rank0, \
            volumes.SlabReader(path, SLAB, 0.5, seed=3) as rank1:  # another rank, or a resume
        a = rank0.plan(ids, 7)
        order = np.random.default_rng(0).permutation(len(ids))
        b = rank1.plan(ids[order], 7)  # another batch order
        assert (a[1][order] == b[1]).all() and (a[2][order] == b[2]).all()
        np.testing.assert_array_equal(rank0.read(ids[:3], 7)[0], rank1.read(ids[:3], 7)[0])
        assert not np.array_equal(a[1], rank0.plan(ids, 8)[1])  # the next epoch differs
    with volumes.SlabReader(path, SLAB, 0.5, seed=4) as other:
        assert not np.array_equal(a[1], other.plan(ids, 7)[1])


def test_a_case_without_foreground_keeps_its_grid_slabs(tmp_path):
    path = str(tmp_path / "empty.h5")
    image = np.linspace(0, 1, 8 * 16 * 32, dtype=np.float32).reshape(8, 16, 32)
    volumes.write_volumes(path, [image], [np.zeros(image.shape, np.uint8)], [1], [0],
                          source="t", hu_window=h5format.HU_WINDOW)
    with volumes.SlabReader(path, SLAB, foreground_fraction=1.0) as reader:
        cases, starts, biased = reader.plan([0, 1], 0)
        assert not biased.any() and starts.tolist() == [[0, 0, 0], [0, 0, 16]]


def test_full_slabs_are_whole_volumes_of_one_shape(tmp_path, synthetic):
    path = str(tmp_path / "same.h5")
    info = synth.make_volumes(path, cases=3, size=16, seed=1, slices_per_case=8, jitter=0)
    assert (info.shapes == [8, 16, 16]).all()
    # one sample per case: its row
    assert volumes.slab_ids(info, "full", "train").tolist() == info.train_cases.tolist()
    assert len(info.train_cases) == 2
    with volumes.SlabReader(path, "full", foreground_fraction=1.0) as reader:
        assert reader.slab == (8, 16, 16)
        images, masks = reader.read([1, 0], epoch=2)  # nowhere to move: the whole volume
        np.testing.assert_array_equal(images[0], reader.read_case(1)[0])
    varied, _ = synthetic
    with pytest.raises(h5format.DatasetError) as err:
        volumes.SlabReader(varied, "full")
    assert str(err.value).startswith(f"{varied}: --slab full needs volumes of one shape, but "
                                     "they range from ")
    assert "pass --slab D,H,W" in str(err.value)


def test_volumes_of_no_jitter_are_the_slices_of_the_same_seed(tmp_path):
    flat, vols = str(tmp_path / "s.h5"), str(tmp_path / "v.h5")
    synth.make_dataset(flat, cases=4, size=16, seed=5, slices_per_case=6)
    info = synth.make_volumes(vols, cases=4, size=16, seed=5, slices_per_case=6, jitter=0)
    flat_info = data.examine(flat)
    assert info.case_ids.tolist() == np.unique(flat_info.case_ids).tolist()
    assert [int(c) for c in info.case_ids[info.val_cases]] == sorted(
        {int(c) for c in flat_info.case_ids[flat_info.val_indices]})
    slices = data.SliceReader(flat)
    with volumes.SlabReader(vols, (6, 16, 16)) as reader:
        for k in range(4):
            image, mask = reader.read_case(k)
            flat_image, flat_mask = slices.read(list(range(6 * k, 6 * k + 6)))
            np.testing.assert_array_equal(image, flat_image)
            np.testing.assert_array_equal(mask, flat_mask)


def test_prefetcher_passes_the_epoch_and_shares_the_reader_with_validation(synthetic):
    path, info = synthetic
    ids = volumes.slab_ids(info, SLAB, "train")
    batches = [prefetch.EpochBatch(e, ids[i:i + 3]) for e in range(3) for i in range(0, 12, 3)]
    with volumes.SlabReader(path, SLAB, 0.5, seed=1) as reader:
        want = [reader.read(b.ids, b.epoch) for b in batches]
        whole = [reader.read_case(k) for k in info.val_cases]
        feed = prefetch.Prefetcher(reader, iter(batches), depth=2)
        got, again = [], []
        reading = threading.Thread(target=lambda: got.extend(feed))
        reading.start()
        for _ in range(5):  # validation reads whole cases while the prefetcher reads slabs
            again += [reader.read_case(k) for k in info.val_cases]
        reading.join(60)
        assert not reading.is_alive()
        feed.close()
    assert len(got) == len(batches)
    for (ids_b, images, masks), b, (w_i, w_m) in zip(got, batches, want):
        assert ids_b is b.ids
        np.testing.assert_array_equal(images, w_i)
        np.testing.assert_array_equal(masks, w_m)
    for (a_i, a_m), (w_i, w_m) in zip(again, whole * 5):
        np.testing.assert_array_equal(a_i, w_i)
        np.testing.assert_array_equal(a_m, w_m)


# ---------------------------------------------------------------- writers and CLI


def test_synth_volumes_vary_in_shape_and_split_by_case(synthetic, tmp_path):
    path, info = synthetic
    assert info.cases == 6 and len(np.unique(info.shapes, axis=0)) == 6
    assert (info.shapes.min(axis=0) >= [18, 24, 24]).all() and (info.shapes.max(axis=0) <= [30, 40, 40]).all()
    assert info.val_cases.tolist() == [k for k in range(6) if info.splits[k] == 1] and len(info.val_cases) == 1
    with h5py.File(path) as f:
        assert f.attrs["layout"] == "volumes" and f.attrs["format_version"] == 1
        image, mask = f["volumes/0/image"], f["volumes/0/mask"][()]
        assert image.chunks == volumes.chunks_for(image.shape) and image.dtype == np.float32
        assert set(np.unique(mask)) == {0, 1, 2}
        fg = f["volumes/0/foreground"][()]
        assert len(fg) == min((mask > 0).sum(), volumes.FOREGROUND_SAMPLES)
        assert (mask[tuple(fg.T)] > 0).all()
        assert f["spacing"][0, 0] == synth.SLICE_MM
    again = str(tmp_path / "again.h5")
    synth.make_volumes(again, cases=6, size=32, seed=2, slices_per_case=24)
    with h5py.File(path) as a, h5py.File(again) as b:
        np.testing.assert_array_equal(a["volumes/3/image"][()], b["volumes/3/image"][()])


def test_foreground_sample_is_capped_and_spread():
    mask = np.zeros((40, 40, 40), np.uint8)
    mask[5:35, 5:35, 5:35] = 1  # 27,000 voxels
    fg = volumes.foreground_sample(mask, limit=1000)
    assert fg.shape == (1000, 3) and (mask[tuple(fg.T)] == 1).all()
    assert fg[:, 0].min() == 5 and fg[:, 0].max() == 34  # from the first slice to the last
    assert volumes.foreground_sample(np.zeros((3, 3, 3), np.uint8)).shape == (0, 3)


def test_lits_volumes_keep_the_buffer_and_match_the_slices(tmp_path):
    import mrcfile  # noqa: F401 - a dependency of distseg: a missing one fails
    try:
        lits.package_data_dir()
    except h5format.DatasetError:
        pytest.skip("liver-ct-segmentation-package is not installed")
    # The HU window: the same numbers whichever slabs train (the default foreground
    # normalisation takes its statistics from each file's own training slabs).
    info = lits.convert_volumes(str(tmp_path / "l3.h5"), ct_norm="window")
    slices = lits.convert(str(tmp_path / "l2.h5"), ct_norm="window")
    assert info.case_ids.tolist() == [11700, 11705, 11706]
    assert info.splits.tolist() == [0, 2, 1]
    assert info.shapes.tolist() == [[80, 128, 128], [16, 128, 128], [32, 128, 128]]
    with h5py.File(tmp_path / "l2.h5") as two, volumes.SlabReader(str(tmp_path / "l3.h5"), (32, 128, 128)) as r:
        val, mask = r.read_case(2)
        np.testing.assert_array_equal(val, two["images"][96:128])
        np.testing.assert_array_equal(mask, two["masks"][96:128])
        assert (mask == 2).sum() > 10_000  # tumour to validate on
        assert r.grid.ids(info.train_cases).tolist() == [0, 1, 2]
    assert set(slices.val_indices.tolist()) <= set(range(96, 128))


@pytest.mark.parametrize("folds", lits.FOLD_COUNTS)
def test_every_fold_validates_its_slabs_behind_a_buffer_and_the_folds_cover_the_case(folds):
    seen = []
    for fold in range(folds):
        splits = lits.fold_splits(folds, fold)
        val = [s for s, v in enumerate(splits) if v == "val"]
        assert len(val) == lits.SLABS // folds and val == list(range(val[0], val[-1] + 1))
        seen += val
        for s, v in enumerate(splits):  # no training slab next to a validation slab
            if v == "train":
                assert all(abs(s - t) > 1 for t in val), (folds, fold, splits)
        assert "train" in splits
        parts = lits.volume_parts(splits)
        assert [p[0] for p in parts] == [0] + [p[1] for p in parts[:-1]] and parts[-1][1] == lits.SLABS
        assert all(splits[a:b] == [k] * (b - a) for a, b, k in parts)
    assert sorted(seen) == list(range(lits.SLABS))  # every slab validates once


def test_the_default_files_are_the_documented_folds():
    assert lits.fold_splits(*lits.DEFAULT_FOLD[2]) == ["train"] * 6 + ["test", "val"]
    assert lits.volume_parts(lits.fold_splits(*lits.DEFAULT_FOLD[3])) == [
        (0, 5, "train"), (5, 6, "test"), (6, 8, "val")]


@pytest.mark.parametrize("folds, fold, said", [
    (3, 0, "--folds must be one of (2, 4, 8)"), (4, 4, "--fold must be 0 to 3 for --folds 4, got 4"),
    (4, -1, "--fold must be 0 to 3")])
def test_a_fold_the_slabs_do_not_allow_is_one_line(folds, fold, said):
    with pytest.raises(InputError, match=re.escape(said)):
        lits.fold_splits(folds, fold)


def test_lits_sample_writes_the_fold_asked_for_in_2d_and_3d(tmp_path):
    try:
        lits.package_data_dir()
    except h5format.DatasetError:
        pytest.skip("liver-ct-segmentation-package is not installed")
    runner = CliRunner()
    two, three = str(tmp_path / "f2.h5"), str(tmp_path / "f3.h5")
    for out, ndim in ((two, "2"), (three, "3")):
        res = runner.invoke(data_cli, ["lits-sample", "--out", out, "--ndim", ndim,
                                       "--folds", "4", "--fold", "1"])
        assert res.exit_code == 0, res.output
    vols = volumes.examine(three)
    assert vols.case_ids.tolist() == [11700, 11701, 11702, 11704, 11705]
    names = {code: name for name, code in h5format.SPLITS.items()}
    assert [names[c] for c in vols.splits.tolist()] == ["train", "test", "val", "test", "train"]
    info = data.examine(two)
    assert sorted(set(info.val_indices.tolist())) == list(range(32, 64))
    train = set(info.train_indices.tolist())
    assert train == set(range(0, 16)) | set(range(80, 128))
    # --fold needs --folds: refused, nothing written.
    res = runner.invoke(data_cli, ["lits-sample", "--out", str(tmp_path / "x.h5"), "--fold", "1"])
    assert res.exit_code == 2 and "--fold needs --folds" in res.output, res.output
    assert not os.path.exists(tmp_path / "x.h5")
    # --folds alone: one file of every fold, its table fold by fold as fold_splits cuts;
    # in 3D each slab a case volume holding the 2D file's slices of that slab.
    every, every3 = str(tmp_path / "every.h5"), str(tmp_path / "every3.h5")
    assert runner.invoke(data_cli, ["lits-sample", "--out", every, "--folds", "4"]).exit_code == 0
    res = runner.invoke(data_cli, ["lits-sample", "--out", every3, "--ndim", "3", "--folds", "4"])
    assert res.exit_code == 0, res.output
    table = folds.read_table(every)
    roles = {code: name for name, code in h5format.SPLITS.items()}
    assert [[roles[r] for r in row] for row in table.roles.tolist()] == [
        lits.fold_splits(4, k) for k in range(4)]
    table3 = folds.read_table(every3)
    assert np.array_equal(table3.roles, table.roles) and np.array_equal(table3.case_ids, table.case_ids)
    assert folds.file_cases(every3).names == folds.file_cases(every).names
    slices = data.SliceReader(every, image_size=128)
    with volumes.SlabReader(every3, (16, 128, 128)) as reader:
        for k in (0, 5):
            image, mask = reader.read_case(k)
            flat, flat_mask = slices.read(list(range(16 * k, 16 * k + 16)))
            assert image.shape == flat.shape and np.array_equal(mask, flat_mask)
            assert np.allclose(image, flat, atol=1e-6)


def test_cli_synth_info_and_lits_sample_in_3d(tmp_path):
    out = str(tmp_path / "c.h5")
    runner = CliRunner()
    res = runner.invoke(data_cli, ["synth", "--out", out, "--ndim", "3", "--cases", "4",
                                   "--size", "16", "--slices-per-case", "10", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"wrote {out}: 4 volumes of ") and "train, 1 val cases)" in res.output
    res = runner.invoke(data_cli, ["info", out, "--slab", "8,16,16"])
    assert res.exit_code == 0, res.output
    import json
    shown = json.loads(res.output)
    info = volumes.examine(out)
    assert shown["layout"] == "volumes" and shown["cases"] == 4
    assert shown["train_slabs"] == len(volumes.slab_ids(info, SLAB, "train"))
    assert shown["padded_cases"] == [int(info.case_ids[k]) for k in
                                     volumes.SlabGrid.of(info.shapes, SLAB).padded()]
    for args, words in [
        (["info", out, "--slab", "full"], ["--slab full needs volumes of one shape"]),
        (["info", out, "--slab", "8,16"], ["--slab '8,16': expected D,H,W"]),
        (["synth", "--out", out, "--jitter", "0.1"], ["--jitter", "--ndim 3"]),
    ]:
        res = runner.invoke(data_cli, args)
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and all(w in lines[0] for w in words), res.stderr


# ---------------------------------------------------------------- layouts and bad files


def test_each_reader_refuses_the_other_layout_with_what_to_use(mixed, tmp_path):
    path, _, _ = mixed
    slices = str(tmp_path / "slices.h5")
    synth.make_dataset(slices, cases=2, size=16, seed=0, slices_per_case=4)
    assert h5format.file_layout(path) == "volumes" and h5format.file_layout(slices) == "slices"
    for call in (lambda: data.examine(path), lambda: data.SliceReader(path)):
        with pytest.raises(h5format.DatasetError) as err:
            call()
        assert str(err.value).startswith(f"{path}: holds 3D volumes (attribute layout='volumes'), "
                                         "not 2D slices; use the 3D path (distseg-train --model unet3d")
    with h5py.File(slices, "r+") as f:
        del f.attrs["layout"]  # as files written before volumes existed
    assert data.examine(slices).samples == 8  # read as before
    for call in (lambda: volumes.examine(slices), lambda: volumes.SlabReader(slices, SLAB)):
        with pytest.raises(h5format.DatasetError) as err:
            call()
        assert str(err.value).startswith(f"{slices}: holds 2D slices (no attribute layout), not "
                                         "3D volumes; use a 2D model")
    with h5py.File(slices, "r+") as f:
        f.attrs["layout"] = "cubes"
    with pytest.raises(h5format.DatasetError, match="attribute layout is 'cubes', expected 'slices' or 'volumes'"):
        data.examine(slices)


def _copy(src: str, dst: str) -> str:
    import shutil
    shutil.copy(src, dst)
    return dst


BAD = {
    "no shape table": (lambda f: f.__delitem__("shape"), "missing dataset 'shape'"),
    "shape table of 2 columns": (
        lambda f: (f.__delitem__("shape"), f.create_dataset("shape", data=np.ones((5, 2), int))),
        "'shape' is (5, 2) int64, expected (K, 3) integers with K = 5 cases"),
    "split 5": (lambda f: f["split"].__setitem__(0, 5), "'split' holds values other than 0"),
    "a case twice": (lambda f: f["case_id"].__setitem__(1, 100), "'case_id' repeats a case"),
    "image of another shape": (
        lambda f: (f["volumes/2"].__delitem__("image"),
                   f["volumes/2"].create_dataset("image", data=np.zeros((16, 32, 31), np.float32))),
        "case 102 (volumes/2): 'image' has shape (16, 32, 31), expected (16, 32, 32)"),
    "float mask": (
        lambda f: (f["volumes/1"].__delitem__("mask"),
                   f["volumes/1"].create_dataset("mask", data=np.zeros((20, 12, 40), np.float32))),
        "case 101 (volumes/1): 'mask' has dtype float32, expected uint8"),
    "no foreground": (lambda f: f["volumes/4"].__delitem__("foreground"),
                      "case 104 (volumes/4): 'foreground' must be an (M, 3) integer dataset"),
    "a missing case": (lambda f: f["volumes"].__delitem__("3"),
                       "case 103 (volumes/3): missing group"),
    "label 3": (lambda f: f["volumes/3/mask"].__setitem__((10, 0, 0), 3),
                "case 103 (volumes/3/mask) has label 3 near slice 0, expected 0..2"),
    "num_classes 1": (lambda f: f.attrs.__setitem__("num_classes", 1),
                      "attribute num_classes is 1, expected an integer >= 2"),
    "version 9": (lambda f: f.attrs.__setitem__("format_version", 9),
                  "format_version 9 is newer than this distseg reads (1)"),
}


@pytest.mark.parametrize("problem", sorted(BAD))
def test_bad_volume_files_are_one_line_naming_file_and_field(mixed, tmp_path, problem):
    path = _copy(mixed[0], str(tmp_path / "bad.h5"))
    damage, expected = BAD[problem]
    with h5py.File(path, "r+") as f:
        damage(f)
    calls = [volumes.examine]
    if problem != "label 3":  # labels are checked by examine (rank 0, at start-up) alone
        calls.append(lambda p: volumes.SlabReader(p, SLAB))
    for call in calls:
        with pytest.raises(h5format.DatasetError) as err:
            call(path)
        assert str(err.value).startswith(f"{path}: ") and expected in str(err.value), str(err.value)
        assert "\n" not in str(err.value)


def test_check_fit_names_the_file_and_the_fix(synthetic):
    path, info = synthetic
    n = len(volumes.slab_ids(info, SLAB, "train"))
    assert volumes.check_fit(info, ranks=2, batch_size=2, slab=SLAB, num_classes=3) == SLAB
    with pytest.raises(h5format.DatasetError) as err:
        volumes.check_fit(info, ranks=n, batch_size=2, slab=SLAB)
    assert str(err.value) == (f"{path}: {n} training slabs of 8x16x16, fewer than ranks x batch "
                              f"size = {n} x 2 = {2 * n}; pass a smaller --slab")
    with pytest.raises(h5format.DatasetError, match="num_classes=3, but the model predicts 2 classes"):
        volumes.check_fit(info, ranks=1, batch_size=1, slab=SLAB, num_classes=2)


@pytest.mark.parametrize("text,expected", [("32,128,128", (32, 128, 128)), ("full", "full"),
                                           (" FULL ", "full"), ("1,1,1", (1, 1, 1))])
def test_parse_slab(text, expected):
    assert volumes.parse_slab(text) == expected


@pytest.mark.parametrize("text", ["32,128", "0,8,8", "a,b,c", "", "8,8,8,8", "-1,8,8"])
def test_parse_slab_refuses(text):
    with pytest.raises(ValueError, match="expected D,H,W"):
        volumes.parse_slab(text)


def test_a_bad_foreground_fraction_is_refused(mixed):
    with pytest.raises(ValueError, match="--foreground-fraction 1.5: expected 0..1"):
        volumes.SlabReader(mixed[0], SLAB, foreground_fraction=1.5)


#: The facts every data summary names alike, whatever the layout (``h5format.summary_of``).
SHARED_KEYS = {"path", "layout", "format_version", "source", "dtype", "num_classes",
               "class_names", "channels", "channel_names", "sample", "samples", "train_samples", "val_samples",
               "test_samples", "cases", "train_cases", "val_cases", "test_cases"}


def test_both_layouts_summarise_the_same_facts_under_the_same_keys(mixed, tmp_path):
    path, info, _ = mixed
    flat = synth.make_dataset(str(tmp_path / "s.h5"), cases=5, size=16, seed=0,
                              slices_per_case=4).summary()
    cut, whole = info.summary(SLAB), info.summary()
    assert SHARED_KEYS <= set(cut) and SHARED_KEYS <= set(whole)
    assert set(flat) == SHARED_KEYS | {"image_size"}
    assert set(cut) - SHARED_KEYS == {"shape_min", "shape_max", "voxels", "slab", "train_slabs",
                                      "val_slabs", "padded_cases"}
    grid = volumes.SlabGrid.of(info.shapes, SLAB)
    assert (flat["layout"], flat["sample"], cut["layout"], cut["sample"], whole["sample"]) == (
        "slices", "slice", "volumes", "slab", "volume")
    assert (flat["samples"], flat["train_samples"] + flat["val_samples"], flat["cases"]) == (20, 20, 5)
    # a 3D sample is a slab of the grid (a whole volume without a slab, as --slab full)
    assert cut["samples"] == grid.total and cut["train_samples"] == cut["train_slabs"] == len(
        grid.ids(info.train_cases))
    assert cut["val_samples"] == cut["val_slabs"] == len(grid.ids(info.val_cases))
    assert (whole["samples"], whole["train_samples"], whole["val_samples"]) == (5, 4, 1)
    for s in (cut, whole):
        assert (s["cases"], s["train_cases"], s["val_cases"], s["test_cases"]) == (5, 4, 1, 0)
        assert (s["format_version"], s["num_classes"], s["class_names"]) == (
            1, 3, ["background", "liver", "lesion"])
