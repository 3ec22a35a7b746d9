"""Sharding, the HDF5 format, lazy slice reading, prefetching and bad data files."""

import dataclasses
import io
import json
import os
import shutil
import threading

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from distseg.cli.data import data as data_cli
from distseg.core import batchplan, errors, schema
from distseg.data import h5format, prefetch, sharding, synth
from distseg.data import slices as data

# ---------------------------------------------------------------- sharding

SHAPES = [
    # (n, size, batch)
    (100, 2, 8), (101, 2, 8), (17, 2, 8), (33, 4, 8), (64, 4, 4), (7, 7, 1),
    (10, 3, 1), (1000, 16, 8), (96, 1, 8), (50, 3, 16),
]


@pytest.mark.parametrize("n,size,batch", SHAPES)
def test_shards_are_disjoint_cover_and_have_equal_steps(n, size, batch):
    ids = np.arange(1000, 1000 + n)  # ids need not start at 0
    for epoch in range(3):
        shards = [sharding.shard_batches(ids, r, size, batch, epoch, seed=7) for r in range(size)]
        steps = {len(s) for s in shards}
        assert steps == {schema.steps_per_epoch(n, size, batch)}
        flat = np.concatenate([np.concatenate(s) for s in shards])
        assert len(np.unique(flat)) == len(flat), "a sample went to two ranks"
        expected = n if (batch > 1 or n % size == 0) else n - n % size
        assert len(flat) == expected
        assert set(flat) <= set(ids)
        assert max(len(b) for s in shards for b in s) <= batch
        assert min(len(b) for s in shards for b in s) >= 1
        # the digests of the shards add up to the digest of what was seen
        total = schema.combine_digests(schema.sample_digest(np.concatenate(s)) for s in shards)
        assert total == schema.sample_digest(flat)
        if expected == n:
            assert total == schema.sample_digest(ids)


def test_shards_change_across_epochs_and_repeat_for_a_seed():
    ids = np.arange(200)
    a0 = sharding.shard_batches(ids, 0, 4, 8, epoch=0, seed=1)
    a1 = sharding.shard_batches(ids, 0, 4, 8, epoch=1, seed=1)
    again = sharding.shard_batches(ids, 0, 4, 8, epoch=0, seed=1)
    other_seed = sharding.shard_batches(ids, 0, 4, 8, epoch=0, seed=2)
    assert not np.array_equal(np.concatenate(a0), np.concatenate(a1))
    assert all(np.array_equal(x, y) for x, y in zip(a0, again))
    assert not np.array_equal(np.concatenate(a0), np.concatenate(other_seed))


@pytest.mark.parametrize("n, global_batch", [(96, 8), (100, 8), (37, 4)])
def test_a_global_batch_is_the_same_samples_at_any_number_of_ranks(n, global_batch):
    """Step k trains on the same global batch whether 1, 2, 4 or 8 ranks share it; rank
    r holds the r-th part; the last n mod G samples of each epoch's order are left out."""
    ids = np.arange(1000, 1000 + n)
    one = sharding.global_batches(ids, 0, 1, global_batch, epoch=3, seed=7)
    assert len(one) == schema.steps_per_epoch(n, 1, global_batch, global_batch) == n // global_batch
    for size in (2, 4, 8):
        if global_batch % size:
            continue
        parts = [sharding.global_batches(ids, r, size, global_batch, epoch=3, seed=7) for r in range(size)]
        assert all(len(p) == len(one) for p in parts)
        for k, step in enumerate(one):
            assert np.array_equal(np.concatenate([p[k] for p in parts]), step)
    seen = np.concatenate(one)
    assert len(seen) == len(set(seen)) == schema.epoch_samples(n, 1, global_batch, global_batch)
    with pytest.raises(ValueError, match="not a multiple of the 3 ranks"):
        sharding.global_batches(ids, 0, 3, global_batch, epoch=0, seed=0)


def test_the_batch_plan_of_each_policy():
    from distseg.core import config as config_lib
    from distseg.core.errors import InputError
    t = config_lib.demo().train  # a fixed global batch of 8 that may grow
    assert batchplan.batch_plan(t, 2) == batchplan.BatchPlan(4, 8, "global", 1.0, "none", 8)
    grown = batchplan.batch_plan(t, 16)
    assert (grown.per_rank, grown.global_batch, grown.kind) == (1, 16, "grown")
    assert grown.base == 8  # the lr was set for G, whatever the ranks' global batch
    assert grown.lr_scaling == "sqrt" and grown.lr_factor == pytest.approx(2 ** 0.5)
    gain = batchplan.batch_plan(dataclasses.replace(t, grown_lr_scaling="gain"), 16)
    assert gain.lr_scaling == "gain" and gain.lr_factor == pytest.approx(2 ** 0.5)  # at most
    assert batchplan.batch_plan(t, 3).global_batch == 9  # ceil(8/3) per rank, never fewer than 8
    strict = config_lib.resolve("demo", overrides={"data.path": "d.h5", "run_dir": "r",
                                                   "train.global_batch": 8,
                                                   "train.global_batch_grows": False}).train
    with pytest.raises(InputError, match="--global-batch 8 cannot be shared by 3 ranks"):
        batchplan.batch_plan(strict, 3)
    per_rank = config_lib.smoke().train
    assert batchplan.batch_plan(per_rank, 4) == batchplan.BatchPlan(4, 16, "per_rank", 4.0, "linear", 4)


def test_too_few_samples_for_ranks_times_batch():
    with pytest.raises(ValueError, match="fewer than ranks x batch size = 4 x 8"):
        sharding.shard_batches(np.arange(31), 0, 4, 8, 0, 0)


def test_eval_shards_cover_every_sample_once():
    ids = np.arange(23)
    got = [np.concatenate(sharding.shard_eval(ids, r, 4, 5) or [np.array([], int)]) for r in range(4)]
    assert sorted(np.concatenate(got).tolist()) == ids.tolist()
    assert sharding.shard_eval(np.arange(2), 3, 4, 5) == []  # more ranks than samples


def test_digest_is_order_independent_and_sensitive():
    assert schema.sample_digest([3, 1, 2]) == schema.sample_digest([1, 2, 3])
    assert schema.sample_digest([1, 2, 3]) != schema.sample_digest([1, 2, 4])
    assert schema.sample_digest([1, 2]) != schema.sample_digest([1, 2, 2])


def _splitmix64(x: int) -> int:
    """The SplitMix64 finaliser written out with Python ints (the reference)."""
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_digest_is_the_wrapping_sum_of_splitmix64():
    ids = np.random.default_rng(0).integers(0, 2**40, size=1000)
    want = sum(_splitmix64(int(i)) for i in ids) % 2**64
    assert schema.sample_digest(ids) == f"{want:016x}"
    assert schema.sample_digest(i for i in ids.tolist()) == f"{want:016x}"  # any iterable
    assert schema.sample_digest([]) == "0" * 16


# ---------------------------------------------------------------- HDF5 format

@pytest.fixture(scope="module")
def phantom(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("d") / "phantom.h5")
    info = synth.make_dataset(path, cases=5, size=64, seed=3, slices_per_case=6)
    return path, info


def test_config_hash_ignores_run_dir_only():
    from distseg.core import config as config_lib
    a = config_lib.resolve("demo", None, {"data.path": "x.h5", "run_dir": "runs/np1"}).to_dict()
    b = config_lib.resolve("demo", None, {"data.path": "x.h5", "run_dir": "runs/np16"}).to_dict()
    c = config_lib.resolve("demo", None, {"data.path": "x.h5", "run_dir": "runs/np1",
                                          "train.seed": 7}).to_dict()
    assert schema.config_hash(a) == schema.config_hash(b) != schema.config_hash(c)


@pytest.mark.parametrize("field,value,expected", [
    ("validate", "false", "config field train.validate must be bool, got 'false'"),
    ("epochs", 2.5, "config field train.epochs must be int, got 2.5"),
    ("lr", True, "config field train.lr must be float, got True"),
    ("loss", 3, "config field train.loss must be str, got 3"),
])
def test_config_file_values_of_the_wrong_type_are_refused(tmp_path, field, value, expected):
    from distseg.core import config as config_lib
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"train": {field: value}}))
    with pytest.raises(ValueError) as err:
        config_lib.resolve("demo", str(path), {"data.path": "x.h5", "run_dir": "r"})
    assert str(err.value) == expected
    # an int where a float is expected is fine, and becomes a float
    path.write_text(json.dumps({"train": {"lr": 1}}))
    cfg = config_lib.resolve("demo", str(path), {"data.path": "x.h5", "run_dir": "r"})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


def test_synth_round_trip(phantom, tmp_path):
    path, info = phantom
    assert info.samples == 30 and (info.height, info.width) == (64, 64)
    with h5py.File(path, "r") as f:
        images, masks = f["images"][:], f["masks"][:]
        case_id, split = f["case_id"][:], f["split"][:]
        assert f["images"].chunks == (1, 64, 64, 1)
        assert list(f.attrs["hu_window"]) == [-150.0, 250.0]
        assert "phantom" in f.attrs["source"]
        assert len(f.attrs["spacing"]) == 3
    assert images.dtype == np.float32 and 0.0 <= images.min() and images.max() <= 1.0
    assert set(np.unique(masks)) <= {0, 1, 2} and (masks == 1).any() and (masks == 2).any()
    # split by case: every case lies in exactly one split, and there is validation
    for c in np.unique(case_id):
        assert len(np.unique(split[case_id == c])) == 1
    assert len(info.val_indices) == 6 and len(info.train_indices) == 24
    # same seed, same bytes; other seed, other data
    again = str(tmp_path / "again.h5")
    synth.make_dataset(again, cases=5, size=64, seed=3, slices_per_case=6)
    with h5py.File(again, "r") as f:
        assert np.array_equal(f["images"][:], images)
    # the reader returns slices in the order asked, duplicates included
    with data.SliceReader(path, image_size=64) as reader:
        img, msk = reader.read([7, 2, 7, 29])
    assert np.array_equal(img, images[[7, 2, 7, 29]])
    assert np.array_equal(msk, masks[[7, 2, 7, 29]])
    # an index outside the file is refused in one line naming it, not read as garbage
    with data.SliceReader(path, image_size=64) as reader:
        for bad in ([3, 30], [-1]):
            with pytest.raises(h5format.DatasetError, match=rf"^{path}: slice {bad[-1]} asked for, "
                                                        r"the file holds slices 0\.\.29$"):
                reader.read(bad)


class CountingFile(io.RawIOBase):
    """A real file that counts the bytes h5py reads through it."""

    def __init__(self, path):
        self._f = open(path, "rb")
        self.bytes_read = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def readinto(self, buf):
        n = self._f.readinto(buf)
        self.bytes_read += n
        return n


def test_reading_one_slice_reads_only_that_slice(tmp_path):
    path = str(tmp_path / "big.h5")
    synth.make_dataset(path, cases=8, size=128, seed=0, slices_per_case=16)  # 128 slices
    file_size = os.path.getsize(path)
    slice_bytes = 128 * 128 * 4
    counting = CountingFile(path)
    with h5py.File(counting, "r") as f:
        opened = counting.bytes_read
        one = f["images"][77]
    assert one.shape == (128, 128, 1)
    read = counting.bytes_read - opened
    assert slice_bytes <= read < 3 * slice_bytes, (read, file_size)
    assert counting.bytes_read < file_size / 20


def test_resize_or_refuse(phantom):
    path, _ = phantom
    with pytest.raises(h5format.DatasetError, match="slices are 64x64 but --image-size is 32"):
        data.SliceReader(path, image_size=32)
    with data.SliceReader(path, image_size=32, resize=True) as reader:
        img, msk = reader.read([0, 1])
    assert img.shape == (2, 32, 32, 1) and msk.shape == (2, 32, 32)
    assert set(np.unique(msk)) <= {0, 1, 2}


# ---------------------------------------------------------------- bad files

def _write(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
        f.attrs["num_classes"] = 3


def _good(n=4, s=16):
    return dict(images=np.zeros((n, s, s, 1), np.float32), masks=np.zeros((n, s, s), np.uint8),
                case_id=np.arange(n, dtype=np.int32), split=np.zeros(n, np.uint8))


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("images"), "missing dataset 'images'"),
    (lambda d: d.pop("masks"), "missing dataset 'masks'"),
    (lambda d: d.update(masks=np.zeros((4, 16, 15), np.uint8)), r"'masks' has shape \(4, 16, 15\), expected \(4, 16, 16\)"),
    (lambda d: d.update(images=np.zeros((4, 16, 16), np.float32)), r"expected \(N, H, W, C\) with C >= 1"),
    (lambda d: d.update(images=np.zeros((4, 16, 16, 1), np.int16)), "expected float32 or float16"),
    (lambda d: d["masks"].__setitem__((2, 3, 3), 7), "'masks' slice 2 has label 7, expected 0..2"),
    (lambda d: d.update(split=np.array([0, 1, 0, 0], np.uint8), case_id=np.zeros(4, np.int32)),
     "case 0 has slices in more than one split"),
    (lambda d: d.update(masks=np.zeros((4, 16, 16), np.int16)), "'masks' has dtype int16, expected uint8"),
    (lambda d: d.update(case_id=np.arange(3, dtype=np.int32)), r"'case_id' has shape \(3,\), expected \(4,\)"),
    (lambda d: d.update(split=np.array([0, 0, 3, 0], np.uint8)),
     r"'split' holds values other than 0 \(train\), 1 \(val\), 2 \(test\)"),
    (lambda d: d.update(_good(n=0)), "'images' holds no slices"),
])
def test_bad_files_get_one_clear_line(tmp_path, change, message):
    arrays = _good()
    change(arrays)
    path = str(tmp_path / "bad.h5")
    _write(path, **arrays)
    with pytest.raises(h5format.DatasetError, match=message) as err:
        data.examine(path)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(h5format.DatasetError, match="no such data file"):
        data.examine(str(tmp_path / "nope.h5"))
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"this is not HDF5" * 10)
    with pytest.raises(h5format.DatasetError, match="not a readable HDF5 file"):
        data.examine(str(junk))


def test_dataset_errors_are_input_errors_that_exit_2():
    # `except ValueError` callers keep working, and every CLI maps the class to exit 2.
    assert issubclass(h5format.DatasetError, errors.InputError)
    assert issubclass(h5format.DatasetError, ValueError)
    assert h5format.DatasetError("x").exit_code == 2


def test_write_refuses_masks_of_another_shape_and_leaves_no_file(tmp_path):
    path = str(tmp_path / "bad.h5")
    with pytest.raises(h5format.DatasetError) as err:
        data.write_dataset(path, np.zeros((2, 4, 4), np.float32), np.zeros((2, 4, 5), np.uint8),
                           np.zeros(2), np.zeros(2), source="test", hu_window=h5format.HU_WINDOW)
    assert str(err.value) == f"{path}: masks shape (2, 4, 5) != images (2, 4, 4)"
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- format versions

def _with_version(src, dst, version):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["format_version"] = version
    return str(dst)


def test_a_newer_format_version_is_refused_by_every_reader(tiny, tmp_path):
    path = _with_version(tiny, tmp_path / "newer.h5", h5format.FORMAT_VERSION + 1)
    want = (f"{path}: format_version {h5format.FORMAT_VERSION + 1} is newer than this distseg reads "
            f"({h5format.FORMAT_VERSION}); upgrade distseg to read it")
    with pytest.raises(h5format.DatasetError) as err:
        data.examine(path)
    assert str(err.value) == want
    with pytest.raises(h5format.DatasetError) as err:
        data.SliceReader(path)
    assert str(err.value) == want
    # The refusing reader closed the file: it can be opened for writing again.
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = h5format.FORMAT_VERSION
    assert data.examine(path).samples == 160


def test_a_format_version_that_is_not_a_number_is_refused(tiny, tmp_path):
    path = _with_version(tiny, tmp_path / "odd.h5", "one")
    with pytest.raises(h5format.DatasetError) as err:
        data.examine(path)
    assert str(err.value) == f"{path}: format_version is 'one', expected an integer <= {h5format.FORMAT_VERSION}"


def test_files_without_a_format_version_read_as_version_1(tmp_path):
    path = str(tmp_path / "old.h5")
    _write(path, **_good())  # no format_version attribute, as hand-made files have
    assert data.examine(path).samples == 4


# ---------------------------------------------------------------- distseg-data exits 2 on bad input

def _data_cli(*args):
    return CliRunner().invoke(data_cli, list(args), catch_exceptions=False)


def test_distseg_data_refuses_bad_input_with_exit_2_and_one_line(tiny, tmp_path):
    newer = _with_version(tiny, tmp_path / "newer.h5", h5format.FORMAT_VERSION + 1)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "empty").mkdir()
    cases = [
        (["info", newer], f"{newer}: format_version 2 is newer than this distseg reads (1)"),
        (["info", str(tmp_path / "nope.h5")], f"{tmp_path / 'nope.h5'}: no such data file"),
        (["synth", "--out", str(tmp_path / "a-file" / "x.h5"), "--cases", "1", "--size", "8"],
         f"{tmp_path / 'a-file' / 'x.h5'}: cannot be written"),
        (["lits-sample", "--out", str(tmp_path / "l.h5"), "--source-dir", str(tmp_path / "empty")],
         f"{tmp_path / 'empty' / 'img_117.mrc'}: cannot be read as MRC"),
    ]
    for args, message in cases:
        out = _data_cli(*args)
        assert out.exit_code == 2, (args, out.output)
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), (args, out.stderr)


# ---------------------------------------------------------------- checks, resizing, windowing

def test_check_fit_names_what_does_not_fit(phantom):
    path, info = phantom  # 24 training slices of 64x64, 3 classes
    data.check_fit(info, ranks=3, batch_size=8, image_size=64, resize=False, num_classes=3)  # exactly fits
    data.check_fit(info, ranks=1, batch_size=1, image_size=32, resize=True)
    data.check_fit(info, ranks=1, batch_size=1, image_size=0, resize=False)  # 0: any size
    for kwargs, want in [
        (dict(ranks=4, batch_size=8, image_size=64, resize=False),
         f"{path}: 24 training slices, fewer than ranks x batch size = 4 x 8 = 32"),
        (dict(ranks=1, batch_size=1, image_size=64, resize=False, num_classes=2),
         f"{path}: attribute num_classes=3, but the model predicts 2 classes"),
        (dict(ranks=1, batch_size=1, image_size=48, resize=False),
         f"{path}: slices are 64x64 but --image-size is 48; pass --resize or --image-size 64"),
    ]:
        with pytest.raises(h5format.DatasetError) as err:
            data.check_fit(info, **kwargs)
        assert str(err.value) == want


def test_resize_values():
    a = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)  # value = 4 * row + col
    assert data.resize_nearest(a[..., 0], 2)[0].tolist() == [[0, 2], [8, 10]]
    # Half-pixel centres: each output pixel averages a 2x2 block of the input.
    assert data.resize_bilinear(a, 2)[0, ..., 0].tolist() == [[2.5, 4.5], [10.5, 12.5]]
    up = data.resize_bilinear(np.full((2, 3, 5, 1), 0.25, np.float32), 7)
    assert up.shape == (2, 7, 7, 1) and np.allclose(up, 0.25)
    labels = np.array([[[0, 1], [2, 1]]], np.uint8)
    assert data.resize_nearest(labels, 4)[0].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1],
                                                          [2, 2, 1, 1], [2, 2, 1, 1]]


def test_window_clips_and_scales_hounsfield_units():
    hu = np.array([-1000.0, -150.0, 50.0, 250.0, 3000.0])
    assert h5format.window(hu).tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert h5format.window(hu).dtype == np.float32


def test_float16_files_read_as_float32(tmp_path):
    path = str(tmp_path / "half.h5")
    info = synth.make_dataset(path, cases=2, size=16, seed=0, slices_per_case=2, dtype="float16")
    assert info.dtype == "float16"
    with data.SliceReader(path) as reader:
        images, _ = reader.read([3, 0])
    with h5py.File(path, "r") as f:
        want = f["images"][[0, 3]][::-1].astype(np.float32)
    assert images.dtype == np.float32 and np.array_equal(images, want)


# ---------------------------------------------------------------- the prefetcher

@pytest.fixture()
def damaged(tmp_path):
    """A 16-slice phantom file whose 'images' chunk of slice 5 fails to read.

    The distseg writer stores no checksums, so a flipped byte would read back as wrong
    pixels; a Fletcher-32 checksummed copy of 'images' (same chunks, same values) turns
    the flipped byte into the read error that failing storage gives.
    """
    path = str(tmp_path / "damaged.h5")
    synth.make_dataset(path, cases=2, size=16, seed=0, slices_per_case=8)
    with h5py.File(path, "r+") as f:
        images = f["images"][:]
        del f["images"]
        dset = f.create_dataset("images", data=images, chunks=(1, 16, 16, 1), fletcher32=True)
        chunk = dset.id.get_chunk_info_by_coord((5, 0, 0, 0))
    with open(path, "r+b") as fh:
        fh.seek(chunk.byte_offset + 100)
        byte = fh.read(1)[0]
        fh.seek(chunk.byte_offset + 100)
        fh.write(bytes([byte ^ 0xFF]))
    return path, images


def _close_within(prefetcher, seconds):
    """Calls ``close()`` in a thread: a hang fails this test instead of the suite."""
    closer = threading.Thread(target=prefetcher.close, daemon=True)
    closer.start()
    closer.join(seconds)
    assert not closer.is_alive(), f"Prefetcher.close() still running after {seconds} s"


def test_prefetcher_yields_every_batch_in_order(damaged):
    path, images = damaged
    batches = [np.array([3, 0]), np.array([7]), np.array([15, 8, 8])]  # slice 5 never read
    with data.SliceReader(path) as reader:
        feed = prefetch.Prefetcher(reader, iter(batches), depth=1)
        got = list(feed)
        _close_within(feed, 10)
    assert [ids.tolist() for ids, _, _ in got] == [[3, 0], [7], [15, 8, 8]]
    for (ids, imgs, masks), want in zip(got, batches):
        assert np.array_equal(imgs, images[want]) and masks.shape == (len(want), 16, 16)


def test_a_damaged_chunk_reaches_the_consumer_with_its_message(damaged):
    path, images = damaged
    with data.SliceReader(path) as reader:
        with pytest.raises(h5format.DatasetError) as direct:
            reader.read([5, 6])
    assert str(direct.value).startswith(f"{path}: slices 5, 6 of 'images'/'masks' cannot be read (")
    assert "\n" not in str(direct.value)

    with data.SliceReader(path) as reader:
        feed = prefetch.Prefetcher(reader, [np.array([0, 1]), np.array([2, 3]), np.array([5, 6]),
                                        np.array([7])], depth=1)
        it = iter(feed)
        first, second = next(it), next(it)
        assert first[0].tolist() == [0, 1] and np.array_equal(first[1], images[[0, 1]])
        assert second[0].tolist() == [2, 3]
        with pytest.raises(h5format.DatasetError) as err:
            next(it)
        _close_within(feed, 10)
    # The reader's own error, raised in the consumer: same class, same one line.
    assert str(err.value) == str(direct.value)


def test_close_returns_when_the_reader_failed_and_nobody_reads(damaged):
    path, _ = damaged
    asked = threading.Event()

    def batches():
        yield np.array([0])  # fills the one-slot queue
        asked.set()
        yield np.array([5])  # fails; the worker then waits to hand over the error
        yield np.array([6])

    with data.SliceReader(path) as reader:
        feed = prefetch.Prefetcher(reader, batches(), depth=1)
        assert asked.wait(10)
        _close_within(feed, 10)


def test_prefetcher_reads_epoch_batches_and_slices_ignore_the_epoch(damaged):
    path, images = damaged
    batches = [prefetch.EpochBatch(0, np.array([3, 0])), np.array([7]), prefetch.EpochBatch(9, np.array([3, 0]))]
    with data.SliceReader(path) as reader:
        feed = prefetch.Prefetcher(reader, iter(batches), depth=1)
        got = list(feed)
        _close_within(feed, 10)
    assert [ids.tolist() for ids, _, _ in got] == [[3, 0], [7], [3, 0]]
    np.testing.assert_array_equal(got[0][1], images[[3, 0]])
    np.testing.assert_array_equal(got[2][1], got[0][1])


def test_slice_files_say_their_layout(phantom, tmp_path):
    path, _ = phantom
    with h5py.File(path, "r") as f:
        assert f.attrs["layout"] == "slices"
    assert h5format.file_layout(path) == "slices"
    with pytest.raises(h5format.DatasetError, match="no such data file"):
        h5format.file_layout(str(tmp_path / "absent.h5"))
    odd = str(tmp_path / "odd.h5")
    shutil.copy(path, odd)
    with h5py.File(odd, "r+") as f:
        f.attrs["layout"] = np.array([1, 2])
    with pytest.raises(h5format.DatasetError) as err:
        data.examine(odd)
    assert str(err.value) == (f"{odd}: attribute layout is an array of shape (2,), "
                              "expected 'slices' or 'volumes'")


# ---------------------------------------------------------------- classes: the file decides


def _two_classes(path, names=("background", "lesion")):
    masks = np.zeros((8, 16, 16), np.uint8)
    masks[:, 4:8, 4:8] = 1
    data.write_dataset(str(path), np.zeros((8, 16, 16), np.float32), masks, np.arange(8) // 2,
                       np.r_[np.zeros(6), np.ones(2)].astype(np.uint8), source="test",
                       hu_window=h5format.HU_WINDOW, class_names=names)
    return str(path)


def _smoke(path, **overrides):
    from distseg.core import config as config_lib
    return config_lib.resolve("smoke", None, {"data.path": path, "run_dir": "r",
                                              "model.image_size": 16, "train.batch_size": 2,
                                              **overrides})


@pytest.mark.parametrize("preset", ["liver2d", "demo", "smoke", "liver3d", "smoke3d"])
def test_presets_leave_the_classes_to_the_data_file(preset):
    from distseg.core import config as config_lib
    model = config_lib.PRESETS[preset]().model
    assert (model.num_classes, model.class_names) == (0, ())


def test_the_feed_fills_the_classes_from_the_file_and_refuses_a_contradiction(tmp_path):
    from distseg.data import feeds
    path = _two_classes(tmp_path / "two.h5")
    info = data.examine(path)
    assert (info.num_classes, info.class_names) == (2, ("background", "lesion"))
    cfg, _ = feeds.open_feed(_smoke(path), ranks=1, check_labels=True)
    assert (cfg.model.num_classes, cfg.model.class_names) == (2, ("background", "lesion"))
    assert feeds.with_classes(_smoke(path)) == cfg  # the elastic path's, alike
    # the same values given explicitly agree with the file
    agreed = _smoke(path, **{"model.num_classes": 2, "model.class_names": ["background", "lesion"]})
    assert feeds.open_feed(agreed, ranks=1, check_labels=False).cfg == cfg
    for overrides, said in [
        ({"model.num_classes": 3}, f"{path}: holds 2 classes (attribute num_classes), but "
                                   "config field model.num_classes is 3; leave the field out"),
        ({"model.class_names": ["bg", "tumour"]},
         f"{path}: names its classes ['background', 'lesion'] (attribute class_names), but "
         "config field model.class_names is ['bg', 'tumour']; leave the field out"),
    ]:
        with pytest.raises(h5format.DatasetError) as e:
            feeds.open_feed(_smoke(path, **overrides), ranks=1, check_labels=False)
        assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_class_names_absent_default_and_bad_ones_are_refused(tmp_path):
    path = _two_classes(tmp_path / "two.h5")
    with h5py.File(path, "a") as f:
        del f.attrs["class_names"]
    assert data.examine(path).class_names == ("background", "class1")
    with h5py.File(path, "a") as f:
        f.attrs["num_classes"] = 3
    assert data.examine(path).class_names == ("background", "liver", "lesion")
    for bad in (["background", "background", "x"], ["a", "b"], [""] * 3, 7):
        with h5py.File(path, "a") as f:
            f.attrs["class_names"] = bad
        with pytest.raises(h5format.DatasetError, match=r"attribute class_names is .*, expected 3 "
                                                    r"distinct names \(attribute num_classes=3\)"):
            data.examine(path)


def test_config_class_fields_are_checked(tmp_path):
    from distseg.core import config as config_lib
    from distseg.core.errors import InputError
    for overrides, said in [
        ({"model.num_classes": 1}, "config field model.num_classes must be >= 2 (or 0: from "
                                   "the data file), got 1"),
        ({"model.class_names": "ab"}, "config field model.class_names must be a list of "
                                      "strings, got 'ab'"),
        ({"model.class_names": ["a", "b"], "model.num_classes": 3},
         "config field model.class_names must be 3 distinct non-empty names"),
    ]:
        with pytest.raises(InputError) as e:
            _smoke("x.h5", **overrides)
        assert str(e.value).startswith(said)
    saved = tmp_path / "config.json"  # a resolved config round-trips through JSON
    cfg = _smoke("x.h5", **{"model.num_classes": 2, "model.class_names": ["a", "b"]})
    saved.write_text(json.dumps(cfg.to_dict()))
    assert config_lib.resolve("liver2d", str(saved)) == cfg
