"""``--precise-bn`` through ``distseg-train``: the statistics are recomputed after each
epoch without touching training (the same step losses as without it), validation then
reads other statistics, and 1 rank x 8 and 2 ranks x 4 of a fixed global batch with
ghost batches of 4 validate the same model."""

from __future__ import annotations

import pytest

import proc_group
from support import records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: 2 epochs of 3 steps of 8 samples, BatchNorm over ghost batches of 4.
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "batch",
       "--bn-ghost-batch", "4", "--max-steps-per-epoch", "3", "--epochs", "2", "--lr", "2e-3",
       "--no-tensorboard"]


def test_precise_statistics_change_validation_not_training_and_hold_across_ranks(tiny, tmp_path):
    plain, one, two = (str(tmp_path / n) for n in ("plain", "one", "two"))
    proc_group.train(*RUN, "--data", tiny, "--run-dir", plain)
    proc_group.train(*RUN, "--data", tiny, "--run-dir", one, "--precise-bn", "2")
    proc_group.train(*RUN, "--data", tiny, "--run-dir", two, "--precise-bn", "2", ranks=2)

    # Training never reads the moving statistics: the same losses, bit for bit.
    assert ([r["loss"] for r in records(one, "step")]
            == [r["loss"] for r in records(plain, "step")])
    epochs = records(one, "epoch")
    assert [e["precise_bn"]["steps"] for e in epochs] == [2, 2]
    assert "precise_bn" not in records(plain, "epoch")[0]
    assert [e["val_loss"] for e in epochs] != [e["val_loss"] for e in records(plain, "epoch")]

    # Two ranks average their halves of the same steps: the one-process statistics.
    for a, b in zip(epochs, records(two, "epoch")):
        assert b["precise_bn"]["steps"] == 2
        assert abs(a["val_loss"] - b["val_loss"]) <= 1e-4 * max(1.0, abs(a["val_loss"]))
        for name, dice in a["val_dice"].items():
            assert abs(dice - b["val_dice"][name]) <= 1e-4, (name, dice, b["val_dice"][name])


def test_an_epoch_shorter_than_k_steps_takes_the_earlier_epochs_steps(tiny, tmp_path):
    # K = 20 steps, more than an epoch's plan holds (its training slices / 8): the first
    # epoch has only its own, the next ones theirs and those of the epochs before; 2
    # ranks of the same global batch read the same ones.
    short = [*RUN, "--max-steps-per-epoch", "1", "--epochs", "3", "--precise-bn", "20"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    proc_group.train(*short, "--data", tiny, "--run-dir", one)
    proc_group.train(*short, "--data", tiny, "--run-dir", two, ranks=2)
    epochs = records(one, "epoch")
    taken = [e["precise_bn"]["steps"] for e in epochs]
    assert taken[0] < 20 and taken[1:] == [20, 20], taken
    for a, b in zip(epochs, records(two, "epoch")):
        assert b["precise_bn"]["steps"] == a["precise_bn"]["steps"]
        assert abs(a["val_loss"] - b["val_loss"]) <= 1e-4 * max(1.0, abs(a["val_loss"]))
