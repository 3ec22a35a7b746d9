"""The ``goodput`` batch policy on 2 real Horovod ranks: every rank takes rank 0's choice
at each epoch's end, an epoch runs the batch chosen before it (its shards, steps and
lr), and a run resumed from a checkpoint taken after a switch continues exactly as the
uninterrupted run did (the checkpoint carries the policy's batch and step times, the
noise scale and the samples trained).

One slice per rank and a base batch of 1: the first measured batch's prior (half its
step time fixed) predicts 4/3 the throughput at twice the batch, so the policy first
switches once the noise scale passes about 6 samples (a function of the training
numerics, not of the timing). On this 64x64 phantom it measured 0.6, 1.7, 1.9, 6.3 and
17.7 after epochs 0-4 (2026-11-25), and switched after epoch 3.
"""

from __future__ import annotations

import os
import shutil

import pytest

from distseg.data import synth

import proc_group
from support import log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(3 * TIMEOUT + 60)
EPOCHS = 6
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
RUN = ["--preset", "smoke", "--image-size", "64", "--batch-size", "1", "--batch-policy", "goodput",
       "--max-steps-per-epoch", "8", "--no-validate"]


def _train(*args):
    out = proc_group.horovodrun("distseg-train", *THREADS, *args, timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:]


def _epochs(run_dir: str, rank: int) -> list[dict]:
    return [r for r in log_records(run_dir, rank) if r["type"] == "epoch"]


def _steps(run_dir: str, rank: int, epoch: int, resumed: bool = False) -> list[tuple]:
    """(global step, loss, lr, samples) of ``epoch``'s steps (``resumed``: those logged
    after the log's last ``resume`` record)."""
    records = log_records(run_dir, rank)
    if resumed:
        last = max(i for i, r in enumerate(records) if r["type"] == "resume")
        records = records[last:]
    return [(r["global_step"], r["loss"], r["lr"], r["samples"])
            for r in records if r["type"] == "step" and r["epoch"] == epoch]


def _cut_after(full: str, cut: str, epoch: int) -> None:
    """``cut``: a copy of run ``full`` as it stood at the checkpoint after ``epoch``
    epochs (the newer checkpoints removed, as if it had been stopped there)."""
    shutil.copytree(full, cut)
    ckdir = os.path.join(cut, "checkpoints")
    for name in os.listdir(ckdir):
        if name.startswith("epoch-") and int(name[6:10]) > epoch:
            os.remove(os.path.join(ckdir, name))


@pytest.fixture(scope="module")
def phantom64(tmp_path_factory):
    """160 slices of 64x64 (10 phantom cases x 16 slices)."""
    path = str(tmp_path_factory.mktemp("data") / "phantom64.h5")
    synth.make_dataset(path, cases=10, size=64, seed=0, slices_per_case=16)
    return path


def test_the_policy_switches_together_and_resumes_exactly(phantom64, tmp_path):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    _train(*RUN, "--data", phantom64, "--run-dir", full, "--epochs", str(EPOCHS))
    records = [_epochs(full, rank) for rank in (0, 1)]
    policies = [[r["goodput"] for r in recs] for recs in records]
    # Rank 0's choice, taken by every rank (each logs its own step times beside it).
    choice = ("per_rank", "next_per_rank", "goodput", "switched", "reason")
    assert [[{k: p[k] for k in choice} for p in ps] for ps in policies] == \
        [[{k: p[k] for k in choice} for p in policies[0]]] * 2
    chosen = [p["per_rank"] for p in policies[0]]
    assert chosen[0] == 1 and len(set(chosen)) > 1, policies[0]  # it switched
    for before, after in zip(policies[0], policies[0][1:]):
        assert after["per_rank"] == before["next_per_rank"]
        assert before["switched"] == (after["per_rank"] != before["per_rank"])
    assert policies[0][-1]["next_per_rank"] is None  # no choice after the last epoch
    for epoch, per_rank in enumerate(chosen):
        rows = _steps(full, 0, epoch)
        # every step at the chosen batch; 8 steps of 2 samples per epoch, in samples
        assert {samples for *_, samples in rows} == {per_rank}
        assert len(rows) == max(1, 16 // (2 * per_rank))
        assert records[0][epoch]["lr_rule"]["global_batch"] == 2 * per_rank
        lr = 5e-3 * 2 * per_rank  # the smoke preset's lr, linear in the batch (base 1)
        assert [r[2] for r in rows] == pytest.approx([lr] * len(rows))
    # Resume from the checkpoint after EPOCHS - 1 epochs: the last epoch runs the batch
    # the full run chose for it, bit for bit.
    _cut_after(full, cut, EPOCHS - 1)
    _train("--run-dir", cut, "--resume", "--epochs", str(EPOCHS))
    for rank in (0, 1):
        assert _steps(cut, rank, EPOCHS - 1, resumed=True) == _steps(full, rank, EPOCHS - 1)
        assert _epochs(cut, rank)[-1]["goodput"]["per_rank"] == chosen[-1]
