"""``analysis.coverage``: expected counts, references and verdicts, each alone.

Runs are hand-built with ``tests/analysis_fixtures/runs.py``; digests are computed here
with ``distseg.core.schema.sample_digest`` from the ids each fixture epoch covers.
"""

import math
import os
import subprocess

import h5py
import numpy as np
import pytest

from analysis import coverage, logs
from analysis.coverage import Basis, EpochShards, Expected
from distseg.core import batchplan, config, rundir, schema
from distseg.core.errors import InputError
from distseg.data import h5format, sharding
from tests.analysis_fixtures.runs import RunSpec, epoch_record, run_record, write_log, write_run

from support import BIN, command_env

ALL16 = Expected(16.0, Basis.ALL, "all train samples")
CUT_8_OF_15 = ("global batch 8: 7 of 15 samples skipped per epoch by design (a new random "
               "few each epoch)")


def _run(tmp_path, size=2, **record):
    """A run whose only records are its ``run`` records (``record`` overrides fields)."""
    run_dir = str(tmp_path / "r")
    for rank in range(size):
        write_log(run_dir, rank, [run_record(rank, size, **record)])
    return logs.load_run(run_dir)


@pytest.mark.parametrize("record, expected", [
    (dict(dataset={"train_samples": 16}, batch_size=2, steps_per_epoch=4), ALL16),
    (dict(dataset={"train_samples": 16}, batch_size=2, steps_per_epoch=2),
     Expected(math.nan, Basis.CAPPED, "capped: 2 of 4 steps per epoch (max_steps_per_epoch)")),
    (dict(dataset={"train_samples": 15}, batch_size=1, steps_per_epoch=7),
     Expected(14.0, Basis.BATCH_ONE, "batch size 1: 1 of 15 samples skipped per epoch by "
              "design (a new random few each epoch)")),
    (dict(dataset={}, batch_size=2),
     Expected(math.nan, Basis.UNKNOWN, "unknown (no dataset.train_samples, train_slabs or size "
              "in the run record)")),
    # a 3D run counts its slabs
    (dict(dataset={"train_slabs": 16}, batch_size=2, steps_per_epoch=4), ALL16),
    # a fixed global batch, and a batch the goodput policy chose: whole global batches
    (dict(dataset={"train_samples": 15}, batch_size=4, global_batch_size=8,
          batch_plan="global", steps_per_epoch=1), Expected(8.0, Basis.BATCH_ONE, CUT_8_OF_15)),
    (dict(dataset={"train_samples": 15}, batch_size=4, global_batch_size=8,
          batch_plan="chosen", steps_per_epoch=1), Expected(8.0, Basis.BATCH_ONE, CUT_8_OF_15)),
    (dict(dataset={"train_samples": 16}, batch_size=4, global_batch_size=8,
          batch_plan="chosen", steps_per_epoch=2), ALL16),
])
def test_expected_samples(tmp_path, record, expected):
    got = coverage.expected_samples(_run(tmp_path, **record))
    assert (got.basis, got.why) == (expected.basis, expected.why)
    assert got.samples == expected.samples or (math.isnan(got.samples)
                                               and math.isnan(expected.samples))
    assert got.varying == (expected.basis in (Basis.CAPPED, Basis.BATCH_ONE))


def _shards(ranks=2, samples=16.0, combined="d"):
    return EpochShards(epoch=0, ranks_logged=ranks, samples=samples, combined=combined)


@pytest.mark.parametrize("size, shards, expected, reference, status, covered, matches", [
    (None, _shards(), ALL16, "d", "unknown: 2 of ? ranks logged this epoch", None, None),
    (2, _shards(ranks=1), ALL16, "d", "unknown: 1 of 2 ranks logged this epoch", None, None),
    (2, _shards(combined=None), ALL16, "d", "unknown: a rank logged no sample digest",
     None, None),
    (2, _shards(), Expected(math.nan, Basis.CAPPED, "capped: x"), "d",
     "partial by design (capped: x)", None, None),
    (2, _shards(), Expected(math.nan, Basis.UNKNOWN, "why"), "d",
     "unknown: expected count why", None, None),
    (2, _shards(samples=15.0), ALL16, "d",
     "NOT covered: 15 samples seen, 16 expected (all train samples)", False, None),
    (2, _shards(samples=14.0), Expected(14.0, Basis.BATCH_ONE, "b1"), "d",
     "covered (count only; b1)", True, None),
    (2, _shards(), ALL16, None, "count right, digest not checked: src", None, None),
    (2, _shards(combined="e"), ALL16, "d", "NOT covered: combined digest e differs from the "
     "reference d (shards overlap or leave a gap)", False, False),
    (2, _shards(), ALL16, "d", "covered", True, True),
])
def test_verdict_of_one_epoch(size, shards, expected, reference, status, covered, matches):
    v = coverage.verdict(size, shards, expected, reference, "src")
    assert (v.status, v.covered, v.digest_matches) == (status, covered, matches)


def test_epoch_shards_combine_the_ranks_digests(tmp_path):
    spec = RunSpec(size=2, epochs=2)
    shards = coverage.epoch_shards(logs.load_run(write_run(str(tmp_path / "np2"), spec)))
    full = schema.sample_digest(range(16))
    assert shards == [EpochShards(0, 2, 16.0, full, 2), EpochShards(1, 2, 16.0, full, 2)]


def test_votes_across_runs_of_one_dataset_give_the_reference(tmp_path):
    runs = [logs.load_run(write_run(str(tmp_path / f"np{n}"), RunSpec(size=n, epochs=1)))
            for n in (1, 2)]
    prepared = [(r, coverage.expected_samples(r), coverage.epoch_shards(r)) for r in runs]
    votes = coverage.digest_votes(prepared)
    full = schema.sample_digest(range(16))
    assert votes == {coverage.dataset_key(runs[0]): {full: 2}}
    reference, source = coverage.reference_digest(runs[0], votes)
    assert reference == full
    assert source == ("2 of 2 complete epochs of this dataset agree on one digest; data file "
                      "/data/tiny.h5 not found here")
    assert coverage.reference_digest(runs[0], {})[0] is None


def test_a_capped_run_is_partial_by_design(tmp_path):
    run_dir = write_run(str(tmp_path / "capped"), RunSpec(size=2, epochs=2))
    for rank in (0, 1):  # as if max_steps_per_epoch had cut 4 steps to 2
        path = rundir.log_path(run_dir, rank)
        with open(path) as f:
            text = f.read().replace('"steps_per_epoch":4', '"steps_per_epoch":2')
        with open(path, "w") as f:
            f.write(text)
    cov = coverage.coverage([logs.load_run(run_dir)])
    assert list(cov["status"]) == ["partial by design (capped: 2 of 4 steps per epoch "
                                   "(max_steps_per_epoch))"] * 2
    assert cov["covered"].isna().all() and math.isnan(cov["expected_samples"].iloc[0])


def test_a_launch_at_a_batch_the_policy_chose_is_checked_as_the_loop_cut_it(tmp_path):
    """A launch that resumes at a per-rank batch the ``goodput`` policy chose logs the
    plan ``batchplan.batch_plan`` gives it, ``chosen``, and cuts global batches of that
    batch x the ranks (``sharding.global_batches``): of 15 samples, 2 ranks x 4 train
    on 8 in one step and leave 7 out; not an epoch capped at 1 of 2 steps."""
    train = config.TrainConfig(batch_size=2, batch_policy="goodput", max_batch_per_rank=8)
    plan, n, size = batchplan.batch_plan(train, 2, per_rank=4), 15, 2
    assert (plan.per_rank, plan.global_batch) == (4, 8)
    rec = dict(dataset={"train_samples": n}, batch_size=plan.per_rank,
               global_batch_size=plan.global_batch, batch_plan="chosen",
               steps_per_epoch=schema.steps_per_epoch(n, size, plan.per_rank, plan.global_batch))
    run_dir = str(tmp_path / "chosen")
    for rank in range(size):
        seen = [int(i) for batch in sharding.global_batches(np.arange(n), rank, size,
                                                             plan.global_batch, 0, 0)
                for i in batch]
        write_log(run_dir, rank, [run_record(rank, size, **rec),
                                  epoch_record(rank, 0, 1.0, samples=len(seen),
                                               sample_digest=schema.sample_digest(seen))])
    cov = coverage.coverage([logs.load_run(run_dir)])
    assert list(cov["status"]) == [f"covered (count only; {CUT_8_OF_15})"]
    assert list(cov["covered"]) == [True]


def _data_file(path, version):
    with h5py.File(path, "w") as f:
        f["split"] = np.r_[np.zeros(16), np.ones(4)].astype(np.uint8)
        f.attrs["format_version"] = version
    return str(path)


def test_a_data_file_of_a_newer_format_is_refused(tmp_path):
    path = _data_file(tmp_path / "d.h5", h5format.FORMAT_VERSION + 1)
    run = logs.load_run(write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=1,
                                                                 data_path=path)))
    with pytest.raises(InputError) as e:
        coverage.data_file_digest(run)
    assert str(e.value) == (f"{path}: format_version {h5format.FORMAT_VERSION + 1} is newer than "
                            f"this distseg reads ({h5format.FORMAT_VERSION}); upgrade distseg to "
                            "read it")
    _data_file(tmp_path / "d.h5", h5format.FORMAT_VERSION)  # the current version is read
    assert coverage.data_file_digest(run) == (schema.sample_digest(range(16)),
                                              "train split of the data file")


def test_the_command_refuses_a_newer_data_file_with_one_line_and_exit_2(tmp_path):
    path = _data_file(tmp_path / "d.h5", 99)
    run_dir = write_run(str(tmp_path / "np1"), RunSpec(size=1, epochs=1, data_path=path))
    proc = subprocess.run([os.path.join(BIN, "distseg-report"), run_dir, "--no-progress",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=120, env=command_env(), cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {path}: format_version 99 is newer than this distseg "
                           f"reads ({h5format.FORMAT_VERSION}); upgrade distseg to read it\n")
    assert not (tmp_path / "r").exists()


def _volume_file(path):
    """10 cases of 4x8x16 voxels: 2 slabs of 4x8x8 each, cases 0-7 train (slab ids
    0..15, the ids the fixture runs cover), 8-9 validate (ids 16..19)."""
    from distseg.data import volumes
    shape = (4, 8, 16)
    volumes.write_volumes(str(path), [np.zeros(shape, np.float32)] * 10,
                          [np.zeros(shape, np.uint8)] * 10, list(range(10)), [0] * 8 + [1] * 2,
                          source="coverage test", hu_window=h5format.HU_WINDOW)
    return str(path)


def _run3d(tmp_path, path, slab, name="np2"):
    dataset = {"layout": "volumes", "sample": "slab", "slab": slab, "train_slabs": 16,
               "val_slabs": 4}
    return logs.load_run(write_run(str(tmp_path / name), RunSpec(
        size=2, epochs=2, data_path=path, extra_dataset_fields=dataset,
        extra_model_fields={"name": "unet3d", "input_shape": slab})))


def test_a_3d_run_is_checked_against_the_slabs_of_its_data_file(tmp_path):
    path = _volume_file(tmp_path / "v.h5")
    run = _run3d(tmp_path, path, [4, 8, 8])
    assert coverage.data_file_digest(run) == (schema.sample_digest(range(16)),
                                              "train split of the data file")
    cov = coverage.coverage([run])
    assert list(cov["status"]) == ["covered", "covered"]
    assert list(cov["reference"]) == ["train split of the data file"] * 2
    # another slab cuts other ids from the same file: not a reference for this run
    other = _run3d(tmp_path, path, [4, 8, 16], name="other")
    assert coverage.data_file_digest(other) == (
        None, f"data file {path} now holds 10 samples, 8 train (the run logged 20, 16)")
    # a 3D run record without a slab cannot be cut
    bare = logs.load_run(write_run(str(tmp_path / "bare"), RunSpec(size=2, epochs=1,
                                                                   data_path=path)))
    assert coverage.data_file_digest(bare) == (None, f"data file {path} unreadable (ValueError)")
