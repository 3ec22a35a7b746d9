"""``--precise-bn`` through ``distseg-train``: the statistics are recomputed after each
epoch without touching training (the same step losses as without it), validation then
reads other statistics, and 1 rank x 8 and 2 ranks x 4 of a fixed global batch with
ghost batches of 4 validate the same model."""

from __future__ import annotations

import pytest

import proc_group
from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: 2 epochs of 3 steps of 8 samples, BatchNorm over ghost batches of 4.
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "batch",
       "--bn-ghost-batch", "4", "--max-steps-per-epoch", "3", "--epochs", "2", "--lr", "2e-3",
       "--no-tensorboard"]


def _train(*args, ranks: int = 1) -> None:
    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=TIMEOUT)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]


def _records(run_dir: str, kind: str) -> list[dict]:
    return [r for r in log_records(run_dir, 0) if r["type"] == kind]


def test_precise_statistics_change_validation_not_training_and_hold_across_ranks(tiny, tmp_path):
    plain, one, two = (str(tmp_path / n) for n in ("plain", "one", "two"))
    _train(*RUN, "--data", tiny, "--run-dir", plain)
    _train(*RUN, "--data", tiny, "--run-dir", one, "--precise-bn", "2")
    _train(*RUN, "--data", tiny, "--run-dir", two, "--precise-bn", "2", ranks=2)

    # Training never reads the moving statistics: the same losses, bit for bit.
    assert ([r["loss"] for r in _records(one, "step")]
            == [r["loss"] for r in _records(plain, "step")])
    epochs = _records(one, "epoch")
    assert [e["precise_bn"]["steps"] for e in epochs] == [2, 2]
    assert "precise_bn" not in _records(plain, "epoch")[0]
    assert [e["val_loss"] for e in epochs] != [e["val_loss"] for e in _records(plain, "epoch")]

    # Two ranks average their halves of the same steps: the one-process statistics.
    for a, b in zip(epochs, _records(two, "epoch")):
        assert b["precise_bn"]["steps"] == 2
        assert abs(a["val_loss"] - b["val_loss"]) <= 1e-4 * max(1.0, abs(a["val_loss"]))
        for name, dice in a["val_dice"].items():
            assert abs(dice - b["val_dice"][name]) <= 1e-4, (name, dice, b["val_dice"][name])
