"""A checkpoint written before the training state became one object (``TrainingState``)
still resumes exactly: ``tests/fixtures/checkpoint-v2`` is a 2-rank ``goodput`` run of
the smoke U-Net (log schema 2), killed after the checkpoint of epoch 2, whose policy had
switched to 8 slices per rank. Resumed on 2 real Horovod ranks, epoch 2 must train as
the uninterrupted run did then: the same per-rank batch, step losses, lrs, noise scale
and weights (``expected-epoch2.json``, from that run's own log)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from distseg.data import synth

import proc_group
from support import REPO, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)
FIXTURE = os.path.join(REPO, "tests", "fixtures", "checkpoint-v2")
#: A loss sums 8 slices x 32 x 32 pixels per class in float32 (unit roundoff 2**-24): a
#: sum of n terms is within n * 2**-24 of itself in any order (8192 * 6e-8 = 5e-4), and
#: each step after the first also carries the previous update's rounding: twice that.
LOSS_REL = 2 * 8 * 32 * 32 * 2.0 ** -24
#: The noise scale's averages subtract squared gradient norms of similar size (the big
#: and the small batch's), which magnifies their rounding by the ratio of the norms to
#: their difference; 1e-2 leaves room for a ratio of 10 over LOSS_REL. What the estimate
#: decides (the batch, the lr) is checked exactly.
NOISE_REL = 1e-2


def _copy_fixture(tmp_path) -> str:
    """The fixture's run in ``tmp_path``, its config pointed at the same phantom made
    again (the synthetic data is seeded: the same file)."""
    data = str(tmp_path / "synth.h5")
    synth.make_dataset(data, cases=6, size=32, seed=0, slices_per_case=8)
    run_dir = str(tmp_path / "run")
    shutil.copytree(FIXTURE, run_dir, ignore=shutil.ignore_patterns("expected-*"))
    path = os.path.join(run_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["data"]["path"], cfg["run_dir"] = data, run_dir
    with open(path, "w") as f:
        json.dump(cfg, f)
    return run_dir


def test_a_schema_2_checkpoint_resumes_exactly(tmp_path):
    run_dir = _copy_fixture(tmp_path)
    with open(os.path.join(FIXTURE, "expected-epoch2.json")) as f:
        want = json.load(f)
    out = proc_group.horovodrun("distseg-train", "--intra-op-threads", "1", "--inter-op-threads",
                                "1", "--run-dir", run_dir, "--resume", timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:]
    for rank in (0, 1):
        records = log_records(run_dir, rank)
        resumed = [r for r in records if r["type"] == "resume"]
        assert [(r["from_epoch"], r["from_step"]) for r in resumed] == [(2, 0)]
        steps = [r for r in records if r["type"] == "step" and r["epoch"] == 2]
        epoch = next(r for r in records if r["type"] == "epoch" and r["epoch"] == 2)
        # What the checkpoint decides is exact: the per-rank batch, the step count and
        # the lr of every step (plain float64 arithmetic on counts).
        assert len(steps) == len(want["step_losses"])
        assert [s["samples"] for s in steps] == [want["per_rank"]] * len(steps)
        assert [s["lr"] for s in steps] == want["lrs"]
        # What the CPU computes is not: the golden numbers come from another machine's
        # float32 kernels. LOSS_REL bounds a float32 sum's rounding over its terms.
        assert [s["loss"] for s in steps] == pytest.approx(want["step_losses"], rel=LOSS_REL)
        assert epoch["weight_checksum"] == pytest.approx(want["weight_checksum"], rel=LOSS_REL)
        # The resumed launch logs schema 3 (tr_sigma); the fixture's log, schema 2 (trace).
        for key, old in (("b_simple", "b_simple"), ("g2", "g2"), ("tr_sigma", "trace"),
                         ("b_simple_raw", "b_simple_raw")):
            assert epoch["noise_scale"][key] == pytest.approx(want["noise_scale"][old], rel=NOISE_REL)
