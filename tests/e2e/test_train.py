"""The trainer's behaviour as a user meets it: the learning-rate schedule in the logs,
checkpoint rotation, core pinning, SIGTERM, a non-finite loss stopping the run or its
step skipped.

Every launch goes through ``run_group`` with a timeout, so a hang fails fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import h5py
import numpy as np
import pytest

from distseg.core import schema
from distseg.data import synth
from distseg.parallel.distributed import physical_cores

import proc_group
from proc_group import run_group
from support import BIN, background, command_env, finish, wait_for_log
from support import log_records as records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)


def horovodrun(*args, np_=2, launcher="mpirun"):
    return proc_group.horovodrun("distseg-train", *args, ranks=np_, timeout=TIMEOUT,
                                 launcher=launcher)


def test_learning_rate_is_scaled_and_warmed_up_in_the_logs(tiny, tmp_path):
    """2 ranks, lr 0.001, linear scaling, warm-up over 1.5 epochs of 8 steps: the
    logged lr climbs from 0.001 by 0.001/12 a step and holds 0.002 from step 12."""
    run_dir = str(tmp_path / "lr")
    out = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", run_dir, "--epochs", "2",
                     "--lr", "0.001", "--warmup-epochs", "1.5", "--max-steps-per-epoch", "8",
                     "--no-validate")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    expected = [0.001 + 0.001 * min(step, 12) / 12 for step in range(16)]
    for rank in (0, 1):
        recs = records(run_dir, rank)
        run = recs[0]
        assert (run["lr_base"], run["lr_scaled"], run["warmup_steps"]) == (0.001, 0.002, 12)
        lrs = [r["lr"] for r in recs if r["type"] == "step"]
        np.testing.assert_allclose(lrs, expected, rtol=1e-9)


@pytest.fixture(scope="module")
def sqrt_run(tiny, tmp_path_factory):
    """2 ranks, sqrt lr scaling, no warm-up, 2 steps: read by the scaling and the
    pinning tests (one launch for both)."""
    run_dir = str(tmp_path_factory.mktemp("sqrt") / "run")
    out = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", run_dir,
                     "--lr", "0.001", "--lr-scaling", "sqrt", "--warmup-epochs", "0",
                     "--max-steps-per-epoch", "2", "--no-validate",
                     launcher="horovodrun")  # what horovodrun leaves unbound is pinned
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return run_dir


def test_sqrt_scaling_without_warm_up(sqrt_run):
    lrs = [r["lr"] for r in records(sqrt_run, 1) if r["type"] == "step"]
    assert lrs == [pytest.approx(0.001 * np.sqrt(2), rel=1e-12)] * 2


def test_checkpoints_rotate_and_latest_points_at_the_last(tiny, tmp_path):
    config = tmp_path / "keep2.json"
    config.write_text(json.dumps({"train": {"keep_checkpoints": 2}}))
    run_dir = tmp_path / "ck"
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke", "--config", str(config),
                     "--data", tiny, "--run-dir", str(run_dir), "--epochs", "4",
                     "--max-steps-per-epoch", "2", "--no-validate"],
                    timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(os.listdir(run_dir / "checkpoints")) == sorted(
        [f"epoch-000{e}.{kind}" for e in (3, 4) for kind in ("json", "state.npz", "weights.h5")]
        + ["latest.json"])
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest == {"manifest": "epoch-0004.json", "epoch": 4, "step": 0}
    manifest = json.loads((run_dir / "checkpoints" / "epoch-0004.json").read_text())
    assert (manifest["epoch"], manifest["step"], manifest["global_step"], manifest["size"]) \
        == (4, 0, 8, 1)


def test_ranks_are_pinned_to_disjoint_cores_when_unbound(sqrt_run):
    """horovodrun leaves ranks unbound: each rank pins itself to its share of the
    physical cores, or, with fewer cores than ranks, leaves placement to the OS."""
    threads = [records(sqrt_run, r)[0]["threads"] for r in (0, 1)]
    cores = physical_cores(os.sched_getaffinity(0))
    if len(cores) >= 2:
        per = len(cores) // 2
        want = [sorted(c for core in cores[r * per:(r + 1) * per] for c in core) for r in (0, 1)]
        assert [t["affinity"] for t in threads] == want
        assert [(t["pinned"], t["cores"]) for t in threads] == [(True, per)] * 2
    else:
        assert [t["pinned"] for t in threads] == [False, False]


def test_sigterm_ends_the_run_as_interrupted_with_exit_130(tiny, tmp_path):
    """What Slurm does at the time limit: SIGTERM to the rank. The run writes an
    ``end`` record with status ``interrupted``, exits 130 and keeps its checkpoint."""
    run_dir = tmp_path / "term"
    cmd = [f"{BIN}/distseg-train", "--preset", "smoke", "--data", tiny, "--run-dir", str(run_dir),
           "--epochs", "1000", "--no-validate"]
    with background(cmd, env=command_env(), stderr=subprocess.PIPE) as proc:
        wait_for_log(str(run_dir), 0, '"type":"step"', proc)
        proc.send_signal(signal.SIGTERM)
        _, err = finish(proc, 60, "SIGTERM did not stop the run within 60 s")
    assert proc.returncode == 130, err[-3000:]
    assert "error: interrupted: received signal 15" in err
    end = records(str(run_dir), 0)[-1]
    assert (end["type"], end["status"]) == ("end", "interrupted")
    assert not [f for f in os.listdir(run_dir / "checkpoints") if ".tmp." in f]


def test_a_non_finite_loss_stops_every_rank(tiny, tmp_path):
    """A NaN pixel in one training slice makes the averaged loss NaN at that step:
    both ranks stop there with the same line, exit 1, and say so in their logs."""
    path = str(tmp_path / "nan.h5")
    synth.make_dataset(path, cases=10, size=32, seed=0, slices_per_case=16)
    with h5py.File(path, "r+") as f:
        train = np.flatnonzero(f["split"][()] == schema.SPLITS["train"])
        for i in train:  # every training slice, so whichever step comes first hits one
            f["images"][i, 0, 0, 0] = np.nan
    run_dir = str(tmp_path / "run")
    out = horovodrun("--preset", "smoke", "--data", path, "--run-dir", run_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    lines = [ln.split("error: ", 1)[1] for ln in text.splitlines() if "error: " in ln]
    assert len(lines) == 2 and len(set(lines)) == 1, text[-3000:]
    assert lines[0].startswith("training loss is nan at epoch 0 step 0")
    for rank in (0, 1):
        end = records(run_dir, rank)[-1]
        assert (end["status"], end["reason"], end["epochs_done"]) == ("error", lines[0], 0)


def test_a_non_finite_step_is_skipped_on_every_rank(tmp_path):
    """--on-nonfinite skip: a NaN pixel in one training slice skips that step's update
    on both ranks (counted); the run finishes with finite weights."""
    path = str(tmp_path / "one-nan.h5")
    synth.make_dataset(path, cases=10, size=32, seed=0, slices_per_case=16)
    with h5py.File(path, "r+") as f:
        first_train = int(np.flatnonzero(f["split"][()] == schema.SPLITS["train"])[0])
        f["images"][first_train, 0, 0, 0] = np.nan
    run_dir = str(tmp_path / "run")
    out = horovodrun("--preset", "smoke", "--intra-op-threads", "1", "--inter-op-threads", "1",
                     "--data", path, "--run-dir", run_dir, "--epochs", "2",
                     "--on-nonfinite", "skip", "--no-validate")
    assert out.returncode == 0, out.stdout[-3000:]
    per_rank = []
    for rank in (0, 1):
        epochs = [r for r in records(run_dir, rank) if r["type"] == "epoch"]
        per_rank.append([e["skipped_steps"] for e in epochs])
        assert all(np.isfinite(e["weight_checksum"]).all() for e in epochs)
    assert per_rank[0] == per_rank[1] == [1, 1]  # the slice comes up once per epoch
