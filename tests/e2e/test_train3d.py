"""The 3D U-Net through the same ``distseg-train``: tiny phantom volumes of varying
shape, 2 real Horovod ranks, unique slabs per rank and sliding-window validation of
whole volumes."""

from __future__ import annotations

import pytest

from analysis.coverage import coverage
from analysis.logs import load_run
from distseg.core import schema
from distseg.data import synth, volumes

import proc_group
from proc_group import run_group
from support import BIN, command_env
from support import log_records as records

TIMEOUT = 400
pytestmark = pytest.mark.timeout(TIMEOUT + 60)
SLAB = (16, 32, 32)


@pytest.fixture(scope="module")
def tiny3d(tmp_path_factory):
    """8 phantom volumes of about 24x40x40 (each its own shape), 2 validating."""
    path = str(tmp_path_factory.mktemp("vol") / "tiny3d.h5")
    synth.make_volumes(path, cases=8, size=40, seed=0, slices_per_case=24)
    return path


def test_two_ranks_train_unique_slabs_and_validate_whole_volumes(tiny3d, tmp_path):
    run_dir = str(tmp_path / "run")
    out = proc_group.horovodrun(
        "distseg-train", "--preset", "smoke3d", "--data", tiny3d, "--run-dir", run_dir,
        "--epochs", "2", "--foreground-fraction", "0.5", "--intra-op-threads", "1",
        "--inter-op-threads", "1", controller="gloo", timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:]
    info = volumes.examine(tiny3d)
    train_ids = volumes.slab_ids(info, SLAB, "train")
    val_ids = {str(int(info.case_ids[k])) for k in info.val_cases}
    by_epoch: dict[int, list] = {}
    validated: dict[int, set] = {}
    for rank in (0, 1):
        recs = records(run_dir, rank)
        run = next(r for r in recs if r["type"] == "run")
        assert run["model"]["name"] == "unet3d" and run["model"]["input_shape"] == list(SLAB)
        assert run["voxels_per_sample"] == 16 * 32 * 32 and isinstance(run["onednn"], bool)
        for r in recs:
            if r["type"] == "epoch":
                by_epoch.setdefault(r["epoch"], []).append(r["sample_digest"])
                validated.setdefault(r["epoch"], set()).update(r.get("val_cases_local", {}))
                assert r["val_samples"] == len(val_ids)
                assert set(r["val_dice"]) == {"background", "liver", "lesion"}
    # Each epoch's slabs: disjoint over the ranks and every training slab once.
    assert sorted(by_epoch) == [0, 1]
    for digests in by_epoch.values():
        assert schema.combine_digests(digests) == schema.sample_digest(train_ids)
    # Every validation volume scored whole, by exactly one rank per epoch.
    assert all(cases == val_ids for cases in validated.values()), validated
    cov = coverage([load_run(run_dir)])
    assert cov["covered"].all(), cov[["epoch", "status"]]


def test_a_slice_file_given_to_the_3d_model_is_refused_in_one_line(tiny, tmp_path):
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke3d", "--data", tiny,
                     "--run-dir", str(tmp_path / "r")], timeout=120, env=command_env())
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and tiny in errors[0] and "2D slices" in errors[0], out.stderr


def test_a_slab_not_divisible_by_the_poolings_is_refused(tiny3d, tmp_path):
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke3d", "--data", tiny3d,
                     "--slab", "10,32,32", "--run-dir", str(tmp_path / "r")],
                    timeout=120, env=command_env())
    assert out.returncode == 2, out.stderr[-2000:]
    assert "not divisible by 2**depth = 4" in out.stderr, out.stderr[-2000:]
