"""``--weight-ema`` through ``distseg-train``: training is unchanged (the same step
losses as without it) while validation reads the average; 1 rank x 8 and 2 ranks x 4
of a fixed global batch validate the same average; a run stopped after an epoch and
resumed validates and saves what the uninterrupted run does; the checkpoint's weights
file holds the average, its state the live weights beside it."""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np
import pytest

import proc_group
from proc_group import run_group
from support import BIN, command_env, records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(5 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: Epochs of 3 steps of 8 samples, BatchNorm over ghost batches of 4, precise statistics.
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "batch",
       "--bn-ghost-batch", "4", "--max-steps-per-epoch", "3", "--lr", "2e-3",
       "--precise-bn", "2", "--no-tensorboard"]


def _close(a: float, b: float, tol: float = 1e-4) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a))


@pytest.fixture(scope="module")
def averaged(tiny, tmp_path_factory) -> str:
    """One rank, 2 epochs with ``--weight-ema 0.9``: read by the first test, and copied
    by the second as the run it stops after 2 epochs and resumes (the copy, so this one
    stays as trained)."""
    run_dir = str(tmp_path_factory.mktemp("ema") / "one")
    proc_group.train(*RUN, "--data", tiny, "--run-dir", run_dir, "--epochs", "2",
                     "--weight-ema", "0.9")
    return run_dir


def test_validation_reads_the_average_training_does_not_and_two_ranks_agree(
        tiny, averaged, tmp_path):
    plain, two = (str(tmp_path / n) for n in ("plain", "two"))
    one = averaged
    proc_group.train(*RUN, "--data", tiny, "--run-dir", plain, "--epochs", "2")
    proc_group.train(*RUN, "--data", tiny, "--run-dir", two, "--epochs", "2", "--weight-ema", "0.9",
           ranks=2)

    # The optimizer steps the live weights: the same losses, bit for bit.
    assert ([r["loss"] for r in records(one, "step")]
            == [r["loss"] for r in records(plain, "step")])
    epochs = records(one, "epoch")
    assert [e["weight_ema"] for e in epochs] == [{"decay": 0.9}] * 2
    assert "weight_ema" not in records(plain, "epoch")[0]
    assert not any(_close(a["val_loss"], b["val_loss"], 1e-6)
                   for a, b in zip(epochs, records(plain, "epoch")))
    # Every rank averages the same weights: the one-process average, validated alike.
    for a, b in zip(epochs, records(two, "epoch")):
        assert _close(a["val_loss"], b["val_loss"]), (a["val_loss"], b["val_loss"])
        for name, dice in a["val_dice"].items():
            assert _close(dice, b["val_dice"][name]), (name, dice, b["val_dice"][name])


def _newest_state(run_dir: str) -> dict:
    path = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.state.npz")))[-1]
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def test_a_resumed_run_validates_and_saves_what_the_uninterrupted_run_does(tiny, averaged, tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    proc_group.train(*RUN, "--data", tiny, "--run-dir", whole, "--epochs", "3", "--weight-ema", "0.9")
    shutil.copytree(averaged, parts)  # the same 2 epochs, stopped there
    proc_group.train("--run-dir", parts, "--resume", "--epochs", "3")

    def fields(run_dir):
        return [(e["val_loss"], e["val_dice"], e["weight_checksum"])
                for e in records(run_dir, "epoch")]

    assert fields(parts) == fields(whole)
    assert [r["loss"] for r in records(parts, "step")] == [r["loss"] for r in records(whole, "step")]
    a, b = _newest_state(whole), _newest_state(parts)
    average = sorted(k for k in a if k.startswith("weight_ema_"))
    live = sorted(k for k in a if k.startswith("live_weight_"))
    assert average and len(live) == len(average)
    assert sorted(a) == sorted(b)
    for k in average + live:
        np.testing.assert_array_equal(a[k], b[k])
    # The average is not the live weights (a test of something that moved).
    assert any(not np.array_equal(a[x], a[y]) for x, y in zip(average, live))
    # What distseg-predict loads (the best checkpoint, else the newest) is the average.
    from distseg.core import config as config_lib
    from distseg.inference import predict
    chosen = predict.choose_checkpoint(whole)
    net = predict.build_model(config_lib.for_resume(whole), whole, chosen=chosen)
    with np.load(chosen.entry["state"]) as saved:
        kept = [saved[f"weight_ema_{i}"] for i in range(len(average))]
    assert len(net.trainable_variables) == len(kept)
    for v, value in zip(net.trainable_variables, kept):
        np.testing.assert_array_equal(v.numpy(), value)


def test_a_decay_of_one_or_more_is_refused_in_one_line(tiny, tmp_path):
    out = run_group([f"{BIN}/distseg-train", *RUN, "--data", tiny, "--run-dir",
                     str(tmp_path / "bad"), "--weight-ema", "1"], env=command_env(), timeout=TIMEOUT)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--weight-ema" in out.stderr and "1" in out.stderr
    assert not os.path.exists(tmp_path / "bad")
