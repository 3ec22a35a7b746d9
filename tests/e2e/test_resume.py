"""Resume as a user does it, nothing timed: a run resumed at another rank count keeps
every epoch's coverage exact and its lr at the new size, and a resume that would change
what is trained is refused with one line and touches nothing. (Resume after a fault,
bit for bit, is in test_faults.py, which bounds how fast a fault ends the run.)"""

from __future__ import annotations

import pytest

from distseg.core import schema
from distseg.data import slices as data

import proc_group
from proc_group import run_group
from support import BIN, command_env, tree_bytes
from support import log_records as records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]


def horovodrun(*args):
    return proc_group.horovodrun("distseg-train", *THREADS, *args, timeout=TIMEOUT)


def test_resume_at_another_size_keeps_coverage_exact(tiny, tmp_path):
    """2 ranks for 1 epoch, 1 rank for the 2nd, 2 ranks again for the 3rd: each epoch's
    digests still add up to the train split, and the lr follows the size."""
    run_dir = str(tmp_path / "run")
    first = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", run_dir,
                       "--epochs", "1", "--lr", "0.004")
    assert first.returncode == 0, first.stdout[-3000:]
    one = run_group([f"{BIN}/distseg-train", "--run-dir", run_dir, "--resume", "--epochs", "2"],
                    timeout=TIMEOUT, env=command_env())
    assert one.returncode == 0, one.stderr[-3000:]
    again = horovodrun("--run-dir", run_dir, "--resume", "--epochs", "3")
    assert again.returncode == 0, again.stdout[-3000:]
    train_ids = data.examine(tiny).train_indices
    by_epoch: dict[int, list] = {}
    for rank in (0, 1):
        for r in records(run_dir, rank):
            if r["type"] == "epoch":
                by_epoch.setdefault(r["epoch"], []).append(r["sample_digest"])
    assert sorted(by_epoch) == [0, 1, 2] and [len(v) for v in by_epoch.values()] == [2, 1, 2]
    for digests in by_epoch.values():
        assert schema.combine_digests(digests) == schema.sample_digest(train_ids)
    runs = [r for r in records(run_dir, 0) if r["type"] == "run"]
    assert [(r["size"], r["lr_scaled"]) for r in runs] == [(2, 0.008), (1, 0.004), (2, 0.008)]
    resumes = [r for r in records(run_dir, 0) if r["type"] == "resume"]
    assert [(r["from_epoch"], r["size_before"], r["size"]) for r in resumes] == [(1, 2, 1), (2, 1, 2)]


@pytest.mark.parametrize("args, message", [
    (["--lr", "0.5"], "config field train.lr: the run was trained with 0.005; --resume cannot change it to 0.5"),
    (["--batch-size", "2"], "config field train.batch_size: the run was trained with 4"),
    (["--preset", "demo"], "--preset cannot be combined with --resume"),
    (["--epochs", "1"], "the run has finished 1 epoch(s) already; pass --epochs N with N > 1"),
])
def test_resume_refuses_what_would_change_the_result(finished_run, args, message):
    before = tree_bytes(finished_run)
    out = run_group([f"{BIN}/distseg-train", "--run-dir", finished_run, "--resume", *args],
                    timeout=TIMEOUT, env=command_env())
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0], out.stderr[-2000:]
    assert tree_bytes(finished_run) == before


