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
        assert [s["loss"] for s in steps] == pytest.approx(want["step_losses"], rel=1e-6)
        assert [s["lr"] for s in steps] == pytest.approx(want["lrs"], rel=1e-12)
        assert epoch["weight_checksum"] == pytest.approx(want["weight_checksum"], rel=1e-6)
        # The resumed launch logs schema 3 (tr_sigma); the fixture's log, schema 2 (trace).
        for key, old in (("b_simple", "b_simple"), ("g2", "g2"), ("tr_sigma", "trace"),
                         ("b_simple_raw", "b_simple_raw")):
            assert epoch["noise_scale"][key] == pytest.approx(want["noise_scale"][old], rel=1e-5)
